"""Control API authentication for the route-guard test (tests/system/test_superlink_route_guards.py).

Flower's SuperLink takes its Control API authentication plugins from its
Enterprise package, ``flwr.ee``, which this distribution lacks: with
``FLWR_OIDC_ENABLED=1`` it then refuses to start. A SuperLink started with
this folder on ``PYTHONPATH`` finds, in place of that package, a module with
the four functions Flower's ``config_loader`` imports from it and the one
``flwr.superlink.main`` does: the ones it does not need do what Flower's
fallbacks do, and the plugins are one, under the OIDC name, that accepts the
bearer token :data:`TOKEN` and refuses any other (and none). Every other name
Flower asks of ``flwr.ee`` is missing, as without the package. Nothing else
of Flower changes.
"""

import os
import sys
import types

#: The one access token the plugin accepts.
TOKEN = "route-guard-token"


def get_control_authn_ee_plugins() -> dict:
    # pylint: disable=import-outside-toplevel  (Flower is imported later than this module)
    from flwr.common.constant import ACCESS_TOKEN_KEY, AuthnType
    from flwr.supercore.auth.typing import AccountInfo
    from flwr.superlink.auth_plugin import ControlAuthnPlugin

    class OneTokenPlugin(ControlAuthnPlugin):
        """Accepts :data:`TOKEN`, refuses everything else."""

        def __init__(self) -> None:
            pass

        def get_login_details(self):
            return None

        def validate_tokens_in_metadata(self, metadata):
            valid = dict(metadata).get(ACCESS_TOKEN_KEY) == TOKEN
            return valid, AccountInfo(flwr_aid="tester", account_name="tester") if valid else None

        def get_auth_tokens(self, device_code):
            return None

        def refresh_tokens(self, metadata):
            return None, None

    return {AuthnType.OIDC: OneTokenPlugin}


def _unsupported(*args, **kwargs):
    raise NotImplementedError("not supported by the route-guard test's stand-in")


def get_ee_linkstate_db() -> str:
    """Flower's fallback (``flwr.superlink.main``): its own database setting."""
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME  # pylint: disable=C0415

    return os.getenv("FLWR_DATABASE", FLWR_IN_MEMORY_DB_NAME)


_module = types.ModuleType("flwr.ee", __doc__)
_module.get_ee_linkstate_db = get_ee_linkstate_db
_module.get_control_authn_ee_plugins = get_control_authn_ee_plugins
_module.get_ee_federation_manager = _unsupported
_module.get_ee_objectstore_factory = _unsupported
_module.get_ee_linkstate_factory = _unsupported
sys.modules["flwr.ee"] = _module
