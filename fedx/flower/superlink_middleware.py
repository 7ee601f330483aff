"""Change: the SuperLink's HTTP middleware runs only on the requests it acts on (``fedx-superlink``).

What it changes
    In ``fedx-superlink``'s process only (:func:`apply`, through
    :func:`fedx.flower.install`): ``flwr.superlink.main._get_middleware``,
    which lists the middleware Flower's SuperLink app wraps around every
    request (nine in 1.41, eight in 1.42), is replaced by a function that
    returns Flower's list with seven of them (six in 1.42) scoped
    (:class:`ScopedMiddleware`): each runs, as Flower wrote it, on the
    requests it acts on, and the others go straight to the next layer. The
    Control API's four (sensitive responses, authentication, licence, event
    log) act on ``/v1/control/`` only; SuperNode authentication on
    ``/v1/fleet/`` only; the Fleet API's event log on ``/v1/fleet/`` when the
    SuperLink was started with an event-log plugin; in 1.41, task tracing
    when ``FLWR_TRACING_ENABLED=1`` (1.42 has dropped that middleware). The
    error translation and the protobuf translation, which every API route
    needs, run on every request as before. Flower's installed files are not
    touched.

Why
    Each of them (nine on 1.41, where this was measured) is a Starlette
    ``BaseHTTPMiddleware``: even when its ``dispatch`` only passes the
    request on, it wraps the request and streams the response through a
    task group and memory streams of its own, on the SuperLink's single
    event-loop thread. A model is one
    request per object (a trained ResNet-20: about 260 a message, an array
    and its chunk each), and every request of every SuperNode and of the
    ServerApp passes all nine, each costing the SuperLink CPU, and a round
    of ``benchmarks/links.py`` with a ResNet-20-sized model (about 1,400
    requests) was bound by it. Scoped, the SuperLink's CPU per round about
    halved and the round got shorter; in process, a request that only
    passes through (``/health``) costs a fraction of the CPU through the
    scoped stack that it costs through Flower's (docs/results.md, "What
    each part of the fast setup gives"; docs/results-record.md, "Real
    deployments as typed, and slow links").

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`). Ported to
    1.42, whose list has lost ``RuntimeTracingMiddleware`` (its scoping is
    dropped there: nothing left to scope); the other seven are the same
    code. Flower's seams were looked for: the SuperLink's extension hooks
    (``flwr.superlink.extensions``) add middleware of Flower's enterprise
    package in front of the list, and can neither scope nor remove one.

Under another Flower
    When ``_get_middleware`` or a scoped middleware is not the code checked,
    :func:`fedx.flower.install` scopes nothing: one warning says so and the
    SuperLink runs Flower's stack as shipped. A list that holds other
    middleware than a checked release's (an extension inserted among them)
    is served as shipped too.
"""

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fedx.flower import replace
from fedx.flower._fingerprints import flower_code

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
#: Each scoped middleware's ``dispatch`` only passes the request on outside
#: its scope (:data:`SCOPES`).
FLOWER_CODE = flower_code(
    "flwr.superlink.main:_get_middleware",
    "flwr.superlink.routers.control.middlewares:ControlSensitiveResponseMiddleware",
    "flwr.superlink.routers.control.middlewares:ControlAuthenticationMiddleware",
    "flwr.superlink.routers.control.middlewares:ControlLicenseMiddleware",
    "flwr.superlink.routers.control.middlewares:ControlEventLogMiddleware",
    "flwr.superlink.routers.control.middlewares:_is_control_path",
    "flwr.superlink.routers.fleet.node_auth:NodeAuthMiddleware",
    "flwr.superlink.routers.fleet.middlewares:FleetEventLogMiddleware",
    "flwr.supercore.routers.runtime.tracing:RuntimeTracingMiddleware",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that _get_middleware still lists the middleware FLOWER_MIDDLEWARE names for its release "
    "(a new release: add its list), and that each scoped one's "
    "dispatch does nothing but `return await call_next(request)` on the requests outside "
    "its scope in SCOPES (a path prefix, the app's fleet_event_log_plugin, "
    "FLWR_TRACING_ENABLED)"
)

CONTROL, FLEET = "/v1/control/", "/v1/fleet/"

#: Whether a middleware acts on an HTTP request, given the request's ASGI scope.
ActsOn = Callable[[dict], bool]


def _control(scope: dict) -> bool:
    return scope["path"].startswith(CONTROL)


def _fleet(scope: dict) -> bool:
    return scope["path"].startswith(FLEET)


def _logged_fleet(scope: dict) -> bool:
    # The app sets this from --enable-event-log; Starlette puts the app in the scope.
    plugin = getattr(scope["app"].state, "fleet_event_log_plugin", None)
    return plugin is not None and _fleet(scope)


def _traced(scope: dict) -> bool:  # pylint: disable=unused-argument
    return os.getenv("FLWR_TRACING_ENABLED") == "1"  # read per request, as Flower does


#: Each scoped middleware (by class name) and the requests it acts on.
SCOPES: dict[str, ActsOn] = {
    "ControlSensitiveResponseMiddleware": _control,
    "ControlAuthenticationMiddleware": _control,
    "ControlLicenseMiddleware": _control,
    "ControlEventLogMiddleware": _control,
    "NodeAuthMiddleware": _fleet,
    "FleetEventLogMiddleware": _logged_fleet,
    "RuntimeTracingMiddleware": _traced,
}
#: Flower's middleware in each checked release, in its order (outermost first); the two not
#: in SCOPES run on every request.
FLOWER_MIDDLEWARE = {
    "1.41.0": (
        "ControlSensitiveResponseMiddleware",
        "BaseHTTPMiddleware",  # with dispatch=http_error_translator
        "ControlAuthenticationMiddleware",
        "ControlLicenseMiddleware",
        "ProtobufTranslationMiddleware",
        "RuntimeTracingMiddleware",
        "ControlEventLogMiddleware",
        "NodeAuthMiddleware",
        "FleetEventLogMiddleware",
    ),
    "1.42.0": (
        "ControlSensitiveResponseMiddleware",
        "BaseHTTPMiddleware",
        "ControlAuthenticationMiddleware",
        "ControlLicenseMiddleware",
        "ProtobufTranslationMiddleware",
        "ControlEventLogMiddleware",
        "NodeAuthMiddleware",
        "FleetEventLogMiddleware",
    ),
}
#: Flower's SuperLink app, whose ``_get_middleware`` this replaces.
SUPERLINK_APP = "flwr.superlink.main"


class ScopedMiddleware:
    """An ASGI middleware that runs ``middleware`` on the HTTP requests it ``acts_on``, the app on the rest.

    ``middleware`` is built as Starlette builds it, ``middleware(app,
    *args, **kwargs)``, once.
    """

    def __init__(
        self, app: Any, middleware: type, acts_on: ActsOn, *args: Any, **kwargs: Any
    ) -> None:
        self.app = app
        self.acts_on = acts_on
        self.middleware = middleware(app, *args, **kwargs)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.acts_on(scope):
            await self.app(scope, receive, send)
        else:
            await self.middleware(scope, receive, send)


def scoped(middleware: Sequence[Any]) -> list[Any] | None:
    """Flower's middleware list with the middleware in :data:`SCOPES` scoped; None if it is not a checked release's."""
    from starlette.middleware import Middleware  # pylint: disable=import-outside-toplevel

    names = tuple(getattr(entry.cls, "__name__", None) for entry in middleware)
    for flowers in FLOWER_MIDDLEWARE.values():
        # Extensions (Flower's enterprise hooks) come first; fedx scopes none of them.
        extensions = len(names) - len(flowers)
        if extensions >= 0 and names[extensions:] == flowers:
            break
    else:
        return None
    return [
        Middleware(ScopedMiddleware, entry.cls, SCOPES[name], *entry.args, **entry.kwargs)
        if name in SCOPES and index >= extensions
        else entry
        for index, (name, entry) in enumerate(zip(names, middleware, strict=True))
    ]


def apply():
    """In this process, make Flower's SuperLink app scope its middleware (:func:`scoped`).

    Made by :func:`fedx.flower.install`; returns what undoes it. A list
    that is not a checked release's (:func:`scoped` is None) is served as
    Flower builds it.
    """
    superlink_app = importlib.import_module(SUPERLINK_APP)
    current = superlink_app._get_middleware  # pylint: disable=protected-access
    flowers = getattr(current, "flowers", current)

    def get_middleware() -> list[Any]:
        return scoped(flowers()) or flowers()

    get_middleware.flowers = flowers  # type: ignore[attr-defined]
    get_middleware.__doc__ = flowers.__doc__
    return replace(superlink_app, "_get_middleware", get_middleware)


def run_flower_superlink(arguments: Sequence[str]) -> None:
    """Run Flower's ``flower-superlink`` command in this process with ``arguments``."""
    from flwr.superlink.cli import flower_superlink  # pylint: disable=import-outside-toplevel

    sys.argv = [sys.argv[0], *arguments]
    flower_superlink()
