"""The client's side of secure recombination (FedMR, appendix B, Algorithm 2).

Per repetition a client

1. **sends** n in [n_l, n_u] of its layers, each to a random other client
   (:func:`choose_sends`), and keeps its model as it is until step 3;
2. **answers** every layer it received: it pools its own layers (those it did
   not send) with the received ones, and for every received layer returns one
   pooled layer of the same index to its sender (:func:`plan_returns`);
3. **commits**: every index gets the one pooled layer that was not returned,
   or, for a sent layer, what its receiver returned (:func:`rebuild`).

Per index, a client gives away exactly as many layers as it takes in, so
every layer of the cohort ends up in exactly one model.

Until the commit the client's model stays as it was: the server aborts an
exchange whose peer dropped out by telling the sender to keep its layer
(``aborted``) and by asking the receiver to answer again without it, so both
sides keep their own layers and nothing is lost or duplicated.

The randomness must stay secret from the server, or it could tell which
layer came from whom: in production it comes from the operating system's
CSPRNG (:class:`random.SystemRandom`); tests pass a seeded
:class:`random.Random`.
"""

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedx.ops import Model, find_problem, layer_groups
from fedx.secure import crypto
from fedx.secure.codec import decode_layer, encode_layer
from fedx.secure.wire import RETURN_STAGE, SEND_STAGE, Envelope

#: Source of a returned layer that is the client's own layer of that index.
OWN = -1

# Names of the records the client keeps in its node state (``context.state``).
_KEY_RECORD = "fedx-secure.key"
_MODEL_RECORD = "fedx-secure.model"
_METRICS_RECORD = "fedx-secure.metrics"
_JOB_RECORD = "fedx-secure.job"
_INBOX_RECORD = "fedx-secure.inbox"
_RECORDS = (_MODEL_RECORD, _METRICS_RECORD, _JOB_RECORD, _INBOX_RECORD)


class ProtocolError(ValueError):
    """A message does not fit the client's state or the protocol."""


# ----------------------------------------------------------------------
# The random choices and the rebuild, as pure functions
# ----------------------------------------------------------------------


def choose_sends(
    num_layers: int,
    peers: Sequence[int],
    min_layers: int,
    max_layers: int,
    rng: random.Random,
) -> dict[int, int]:
    """Pick the layers to send and a receiver for each (Algorithm 2, lines 2-8).

    Parameters
    ----------
    num_layers : int
        len(w): how many layers the model has.
    peers : Sequence[int]
        The other active clients.
    min_layers, max_layers : int
        n_l and n_u; n is drawn uniformly from [n_l, n_u] and capped at
        ``num_layers``.
    rng : random.Random
        Secret randomness.

    Returns
    -------
    dict[int, int]
        Layer index to receiving peer; each layer goes to one peer only.
    """
    if not peers:
        return {}
    count = min(rng.randint(min_layers, max_layers), num_layers)
    layers = sorted(rng.sample(range(num_layers), count))
    return {layer: rng.choice(list(peers)) for layer in layers}


def plan_returns(
    num_layers: int,
    sent: Sequence[int],
    received: Sequence[int],
    rng: random.Random,
) -> list[int]:
    """Choose, for every received layer, which pooled layer goes back (lines 15-18).

    The pool of index j holds the client's own layer j (unless it sent it)
    and every received layer of index j. As in Algorithm 2, each return is
    drawn uniformly from what is left in the pool, the sender's own layer
    included: a sender gets its own layer back as often as any other. That
    coin flip is what keeps the relaying server, which sees who sent which
    index to whom, from knowing where a layer ended up. (Never returning the
    sender's own layer would change more models, but makes a swap with a
    pool of two deterministic, and traceable.)

    Parameters
    ----------
    num_layers : int
        len(w).
    sent : Sequence[int]
        Indices of the layers this client sent away in this repetition.
    received : Sequence[int]
        Layer index of each received layer, in arrival order.
    rng : random.Random
        Secret randomness.

    Returns
    -------
    list[int]
        For each received layer, the source of its return: :data:`OWN` or the
        position of a received layer (possibly itself) in ``received``.
    """
    sources = [OWN] * len(received)
    sent_set = set(sent)
    for layer in range(num_layers):
        items = [k for k, index in enumerate(received) if index == layer]
        if not items:
            continue
        pool = items if layer in sent_set else [OWN, *items]
        for item, source in zip(items, rng.sample(pool, len(items)), strict=True):
            sources[item] = source
    return sources


# pylint: disable=too-many-arguments
def rebuild(
    model: Model,
    groups: list[list[str]],
    sent: dict[int, int],
    received: Sequence[tuple[int, Model]],
    sources: Sequence[int],
    returned: dict[int, Model],
    aborted: set[int],
) -> Model:
    """Commit a repetition: one layer per index (lines 20-26).

    Parameters
    ----------
    model : Model
        The model before this repetition.
    groups : list[list[str]]
        Tensor names of each layer.
    sent : dict[int, int]
        Layers sent away (index to receiver).
    received : Sequence[tuple[int, Model]]
        (index, tensors) of each layer received and kept for answering.
    sources : Sequence[int]
        What went back for each received layer (see :func:`plan_returns`).
    returned : dict[int, Model]
        The layers the receivers of ``sent`` returned, by index.
    aborted : set[int]
        Indices in ``sent`` whose exchange the server aborted: the client
        keeps its own layer.

    Returns
    -------
    Model
        The new model, in the state-dict order of ``model``.

    Raises
    ------
    ProtocolError
        When a sent layer has neither a return nor an abort, or both, or an
        index does not end with exactly one layer.
    """
    unexpected = (set(returned) | aborted) - set(sent)
    if unexpected:
        raise ProtocolError(f"returns or aborts for layers {sorted(unexpected)} that were not sent")
    new: Model = dict(model)
    for layer, names in enumerate(groups):
        if layer in sent:
            if (layer in returned) == (layer in aborted):
                raise ProtocolError(
                    f"layer {layer} was sent: expected either its return or an abort"
                )
            tensors = returned.get(layer) or {name: model[name] for name in names}
            chosen_sources: set[int] = set()
        else:
            tensors = None
            chosen_sources = {OWN}
        items = [k for k, (index, _) in enumerate(received) if index == layer]
        kept = (chosen_sources | set(items)) - {sources[k] for k in items}
        if layer in sent and kept:
            raise ProtocolError(f"layer {layer}: received layers left over after the returns")
        if layer not in sent:
            if len(kept) != 1:
                raise ProtocolError(f"layer {layer}: {len(kept)} layers left instead of one")
            (source,) = kept
            tensors = (
                {name: model[name] for name in names} if source == OWN else received[source][1]
            )
        for name in names:
            new[name] = tensors[name]
    return {name: new[name] for name in model}


# ----------------------------------------------------------------------
# The client's state between messages
# ----------------------------------------------------------------------


@dataclass
class ExchangeState:
    """What a client holds between the messages of one round.

    Kept in Flower's node state (``context.state``), which persists across
    the messages of a run on this node and never leaves it.
    """

    node_id: int
    private_key: bytes
    server_round: int
    grouping: str
    min_layers: int
    max_layers: int
    model: Model
    metrics: MetricRecord
    #: SHA-256 of each trained layer, to recognise the trained model at upload.
    trained_digests: list[bytes] = field(default_factory=list)
    #: Last repetition committed (0 right after training).
    committed: int = 0
    #: Repetition in progress (equal to ``committed`` when none is).
    repeat: int = 0
    peers: dict[int, bytes] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)
    received: list[tuple[int, int, Model]] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    _keys: dict[int, bytes] = field(default_factory=dict, repr=False)

    @property
    def groups(self) -> list[list[str]]:
        """Tensor names of each layer, in model order."""
        return layer_groups(list(self.model), self.grouping)  # type: ignore[arg-type]

    def layer_digests(self) -> list[bytes]:
        """SHA-256 of every layer of the current model, in layer order."""
        return [
            hashlib.sha256(encode_layer(k, {n: self.model[n] for n in names})).digest()
            for k, names in enumerate(self.groups)
        ]

    def holds_trained_model(self) -> bool:
        """Whether no layer changed since training (the exchange moved nothing)."""
        return self.layer_digests() == self.trained_digests

    # -- cryptography ---------------------------------------------------

    def _key(self, peer: int) -> bytes:
        if peer not in self.peers:
            raise ProtocolError(f"no public key for node {peer}")
        if peer not in self._keys:
            self._keys[peer] = crypto.pair_key(self.private_key, self.peers[peer])
        return self._keys[peer]

    # pylint: disable=too-many-arguments
    def _seal(self, peer: int, stage: str, attempt: int, layer: int, tensors: Model) -> Envelope:
        sender, receiver = self.node_id, peer
        data = crypto.associated_data(
            server_round=self.server_round,
            repeat=self.repeat,
            stage=stage,
            attempt=attempt,
            sender=sender,
            receiver=receiver,
            layer=layer,
        )
        payload = crypto.seal(self._key(peer), encode_layer(layer, tensors), data)
        return Envelope(sender, receiver, layer, attempt, payload)

    def _open(self, envelope: Envelope, stage: str) -> Model:
        """Decrypt a layer sealed for this client and check it fits the model."""
        if envelope.receiver != self.node_id:
            raise ProtocolError(
                f"an envelope for node {envelope.receiver} reached node {self.node_id}"
            )
        if not 0 <= envelope.layer < len(self.groups):
            raise ProtocolError(f"layer index {envelope.layer} out of range")
        data = crypto.associated_data(
            server_round=self.server_round,
            repeat=self.repeat,
            stage=stage,
            attempt=envelope.attempt,
            sender=envelope.sender,
            receiver=self.node_id,
            layer=envelope.layer,
        )
        try:
            plaintext = crypto.open_sealed(self._key(envelope.sender), envelope.payload, data)
        except Exception as err:  # InvalidTag carries no message
            raise ProtocolError(
                f"layer {envelope.layer} from node {envelope.sender} failed authentication "
                f"({type(err).__name__})"
            ) from None
        layer, tensors = decode_layer(plaintext)
        expected = {name: self.model[name] for name in self.groups[envelope.layer]}
        problem = find_problem(expected, tensors) if layer == envelope.layer else "wrong index"
        if problem is not None:
            raise ProtocolError(f"layer {envelope.layer} from node {envelope.sender}: {problem}")
        return tensors

    # -- the three steps ------------------------------------------------

    def send(self, repeat: int, peers: dict[int, bytes], rng: random.Random) -> list[Envelope]:
        """Step 1: seal the chosen layers for their receivers.

        The model is not changed until :meth:`commit`.
        """
        if repeat != self.committed + 1 or self.repeat != self.committed:
            raise ProtocolError(
                f"send for repetition {repeat}, but repetition {self.committed} is the last committed"
            )
        self.repeat = repeat
        self.peers = {node: key for node, key in peers.items() if node != self.node_id}
        self._keys = {}
        self.sent = choose_sends(
            len(self.groups), sorted(self.peers), self.min_layers, self.max_layers, rng
        )
        groups = self.groups
        return [
            self._seal(peer, SEND_STAGE, 0, layer, {n: self.model[n] for n in groups[layer]})
            for layer, peer in self.sent.items()
        ]

    def answer(
        self, repeat: int, attempt: int, incoming: list[Envelope], rng: random.Random
    ) -> list[Envelope]:
        """Step 2: take in the received layers and seal one return for each.

        Called again with ``attempt`` + 1 and fewer envelopes when a sender
        dropped out; the new answer replaces the previous one.
        """
        if repeat != self.repeat or repeat == self.committed:
            raise ProtocolError(
                f"answer for repetition {repeat}, but repetition {self.repeat} is in progress"
            )
        if len({(e.sender, e.layer) for e in incoming}) != len(incoming):
            raise ProtocolError("the same layer arrived twice from one sender")
        self.received = [(e.sender, e.layer, self._open(e, SEND_STAGE)) for e in incoming]
        self.sources = plan_returns(
            len(self.groups), list(self.sent), [layer for _, layer, _ in self.received], rng
        )
        groups = self.groups
        returns = []
        for (sender, layer, _), source in zip(self.received, self.sources, strict=True):
            tensors = (
                {n: self.model[n] for n in groups[layer]}
                if source == OWN
                else self.received[source][2]
            )
            returns.append(self._seal(sender, RETURN_STAGE, attempt, layer, tensors))
        return returns

    def commit(self, repeat: int, returns: list[Envelope], aborted: list[int]) -> None:
        """Step 3: rebuild the model from the pool and the returned layers."""
        if repeat != self.repeat or repeat != self.committed + 1:
            raise ProtocolError(
                f"commit for repetition {repeat}, but repetition {self.repeat} is in progress"
            )
        returned: dict[int, Model] = {}
        for envelope in returns:
            if self.sent.get(envelope.layer) != envelope.sender or envelope.layer in returned:
                raise ProtocolError(
                    f"unexpected return of layer {envelope.layer} from node {envelope.sender}"
                )
            returned[envelope.layer] = self._open(envelope, RETURN_STAGE)
        self.model = rebuild(
            self.model,
            self.groups,
            self.sent,
            [(layer, tensors) for _, layer, tensors in self.received],
            self.sources,
            returned,
            set(aborted),
        )
        self.committed = repeat
        self.sent, self.received, self.sources = {}, [], []

    # -- persistence in context.state ----------------------------------

    def save(self, state: RecordDict) -> None:
        """Store the state in a node's ``context.state``."""
        state[_MODEL_RECORD] = ArrayRecord({n: Array(np.asarray(a)) for n, a in self.model.items()})
        state[_METRICS_RECORD] = self.metrics
        state[_JOB_RECORD] = ConfigRecord(
            {
                "node-id": self.node_id,
                "round": self.server_round,
                "grouping": self.grouping,
                "min-layers": self.min_layers,
                "max-layers": self.max_layers,
                "trained-digests": list(self.trained_digests),
                "committed": self.committed,
                "repeat": self.repeat,
                "peer-ids": list(self.peers),
                "peer-keys": list(self.peers.values()),
                "sent-layers": list(self.sent),
                "sent-to": list(self.sent.values()),
                "received-from": [sender for sender, _, _ in self.received],
                "received-layers": [layer for _, layer, _ in self.received],
                "return-sources": list(self.sources),
            }
        )
        state[_INBOX_RECORD] = ArrayRecord(
            {
                f"{k}|{n}": Array(np.asarray(a))
                for k, (_, _, t) in enumerate(self.received)
                for n, a in t.items()
            }
        )

    @classmethod
    def load(cls, state: RecordDict) -> "ExchangeState":
        """Read the state :meth:`save` stored.

        Raises
        ------
        ProtocolError
            When the node holds no trained model for secure recombination.
        """
        if any(name not in state for name in _RECORDS) or _KEY_RECORD not in state:
            raise ProtocolError("this node holds no model trained for secure recombination")
        job = state.config_records[_JOB_RECORD]
        inbox = state.array_records[_INBOX_RECORD]
        received = []
        for k, (sender, layer) in enumerate(
            zip(job["received-from"], job["received-layers"], strict=True)
        ):
            prefix = f"{k}|"
            tensors = {
                n[len(prefix) :]: a.numpy() for n, a in inbox.items() if n.startswith(prefix)
            }
            received.append((int(sender), int(layer), tensors))
        return cls(
            node_id=int(job["node-id"]),
            private_key=bytes(state.config_records[_KEY_RECORD]["private-key"]),
            server_round=int(job["round"]),
            grouping=str(job["grouping"]),
            min_layers=int(job["min-layers"]),
            max_layers=int(job["max-layers"]),
            model={n: a.numpy() for n, a in state.array_records[_MODEL_RECORD].items()},
            metrics=state.metric_records[_METRICS_RECORD],
            trained_digests=[bytes(d) for d in job["trained-digests"]],
            committed=int(job["committed"]),
            repeat=int(job["repeat"]),
            peers=dict(zip(job["peer-ids"], job["peer-keys"], strict=True)),
            sent=dict(zip(job["sent-layers"], job["sent-to"], strict=True)),
            received=received,
            sources=[int(s) for s in job["return-sources"]],
        )


def run_private_key(state: RecordDict, run_id: int) -> bytes:
    """This node's private key for run ``run_id``, generated on first use.

    One key pair per client per run: node state can outlive a run (it is
    shared by a run series), so a key stored for another run id is replaced.
    """
    record = state.config_records.get(_KEY_RECORD)
    if record is None or record.get("run-id") != run_id:
        record = ConfigRecord({"run-id": run_id, "private-key": crypto.new_private_key()})
        state[_KEY_RECORD] = record
    return bytes(record["private-key"])


def clear(state: RecordDict) -> None:
    """Forget the model and any unfinished exchange (the key pair stays)."""
    for name in _RECORDS:
        if name in state:
            del state[name]
