"""Secure recombination (FedMR, appendix B) as a part any pool strategy can use.

Before uploading, the clients of a round swap random layers among
themselves, end-to-end encrypted, through the server (:mod:`fedx.secure`), so
the server only ever receives recombined models. A pool strategy given a
:class:`SecureRecombination` asks for it in its training messages and runs
the exchange (:class:`fedx.secure.relay.SecureRelay`) on the training
replies before its usual validation; the uploads are ordinary training
replies. The ClientApp must speak the protocol (:mod:`fedx.secure.client`).
"""

from collections.abc import Iterable
from dataclasses import dataclass

from flwr.app import ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from fedx.checks import Flag, Integer, OneOf, check
from fedx.method import Key
from fedx.ops import GROUPINGS
from fedx.secure.relay import RelayStats, SecureRelay
from fedx.secure.wire import FLAG_KEY, GROUPING_KEY, MAX_LAYERS_KEY, MIN_LAYERS_KEY

AT_LEAST_ONE = Integer(1)


@dataclass(frozen=True)
class SecureRecombination:
    """The clients exchange layers before they upload.

    Parameters
    ----------
    repeats : int (default: 3)
        r_s, repetitions of the exchange per round (at least 1).
    min_layers : int (default: 2)
        n_l, the fewest layers a client sends its peers per repetition (at
        least 1): each client sends n in [n_l, n_u] of its layers. A client
        whose exchanges leave its trained model unchanged does not upload
        it; more repetitions and layers make that rarer (under 1% of uploads
        with the defaults and K >= 4).
    max_layers : int (default: 4)
        n_u, the most layers a client sends per repetition (at least n_l;
        capped at the number of layers).
    grouping : {"tensor", "module"} (default: "tensor")
        What one layer is (as FedMR's ``grouping``).
    """

    repeats: int = 3
    min_layers: int = 2
    max_layers: int = 4
    grouping: str = "tensor"

    def __post_init__(self) -> None:
        check("repeats", self.repeats, AT_LEAST_ONE)
        check("min_layers", self.min_layers, AT_LEAST_ONE)
        check("max_layers", self.max_layers, Integer(self.min_layers))
        check("grouping", self.grouping, OneOf(GROUPINGS))

    def ask(self, config: ConfigRecord) -> None:
        """Add the protocol's switch and settings to a training message's config."""
        config[FLAG_KEY] = True
        config[MIN_LAYERS_KEY] = self.min_layers
        config[MAX_LAYERS_KEY] = self.max_layers
        config[GROUPING_KEY] = self.grouping

    def exchange(
        self, grid: Grid, server_round: int, replies: Iterable[Message], timeout: float
    ) -> tuple[list[Message], RelayStats]:
        """Run the round's exchange on the training replies (public keys); return the uploads.

        Every exchange waits at most ``timeout`` seconds.
        """
        relay = SecureRelay(grid, timeout=timeout, repeats=self.repeats)
        uploads = relay.run(server_round, replies)
        return uploads, relay.stats

    @staticmethod
    def add_metrics(metrics: MetricRecord, stats: RelayStats) -> None:
        """Add what the exchange cost to a round's training metrics."""
        metrics["secure-exchanges"] = stats.exchanges
        metrics["secure-layer-bytes"] = stats.layer_bytes
        metrics["secure-seconds"] = stats.seconds
        metrics["secure-aborted"] = stats.aborted


#: The run-config keys of secure recombination, fed to FedMR's ``secure_*`` arguments
#: (what each does: their description in FedMR's docstring).
KEYS = (
    Key("secure-recombination", False, Flag(), argument="secure_recombination", exclusive=True),
    Key("secure-repeats", 3, AT_LEAST_ONE, argument="secure_repeats"),
    Key("secure-min-layers", 2, AT_LEAST_ONE, argument="secure_min_layers"),
    Key("secure-max-layers", 4, Integer(1), argument="secure_max_layers"),
)
