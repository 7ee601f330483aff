"""fedx's ServerApp and ClientApp with FedBlend registered: for running this folder as a Flower app.

``flwr run examples/fedblend`` uses this app's ``[tool.flwr.app.config]``
(only the keys it changes: fedx fills in its defaults for the others), so
FedBlend's own key can be set with ``--run-config``. Installed with pip, the
package's entry point makes ``strategy = "fedblend"`` work in fedx's own app
as well, without this module.
"""

from fedx.client_app import app as client_app
from fedx.registry import register
from fedx.server_app import app as server_app
from fedx_fedblend import METHOD

register(METHOD)

__all__ = ["client_app", "server_app"]
