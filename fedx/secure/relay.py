"""Server side of secure recombination: relay encrypted layers between clients.

Clients cannot reach each other, so the ServerApp carries their layers, as
ciphertext it cannot open (it has no private key and imports no
cryptography). One round with r_s repetitions is this sequence of message
exchanges, each a :func:`~fedx.messaging.send_and_collect` bounded by the round timeout::

    train               clients train, keep the model, reply with a public key
    send (t = 1..r_s)   commit repetition t-1; each client seals n in
                        [n_l, n_u] of its layers for random peers
    return (t)          each client gets the layers sealed for it and seals
                        one return per layer
    upload              commit repetition r_s; clients upload their models

so ``2 + 2 r_s`` exchanges instead of one. The commit of repetition t
travels with the send of t+1 (or the upload), so it costs no extra exchange.

Drop-outs. A client that does not answer an exchange within the timeout (or
answers with an error or a malformed reply) leaves the round:

* at a send: its layers never left; layers other clients sealed for it are
  not delivered, and their senders are told to keep them (``aborted``);
* at a return: layers sealed for it are aborted the same way; clients that
  received its layers answer again (a new *attempt*) from a pool without
  them, so no one keeps or passes on a layer whose exchange did not finish.
  This repeats until an attempt loses nobody (no extra exchange without
  drop-outs);
* at a commit (the next send, or the upload): every exchange it took part
  in is already complete on the other side; what it holds is lost with it,
  as with any client that fails before uploading, and its slot keeps the
  model it was sent.

Either way every remaining client ends the round with exactly one layer per
index and no layer is in two models.
"""

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from fedx.messaging import send_and_collect
from fedx.secure.wire import (
    RECORD,
    RETURN_TYPE,
    SEND_TYPE,
    UPLOAD_TYPE,
    Envelope,
    get_envelopes,
    payload_bytes,
    put_envelopes,
)

#: Length of an X25519 public key.
PUBLIC_KEY_BYTES = 32


@dataclass
class Commit:
    """What a client needs to finish a repetition: its returns and its aborts."""

    repeat: int = 0
    returns: list[Envelope] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)

    def put(self, record: ConfigRecord) -> None:
        """Add this commit to an outgoing protocol record."""
        record["commit-repeat"] = self.repeat
        record["aborted-layers"] = list(self.aborted)
        put_envelopes(record, "returns", self.returns)


@dataclass
class RelayStats:
    """What one round of secure recombination cost, as the relay saw it.

    Attributes
    ----------
    exchanges : int
        Exchanges after training (redo attempts included).
    layers_sent, layers_returned : int
        Envelopes delivered in send and return stages.
    layer_bytes : int
        Ciphertext bytes of the delivered envelopes: the client-to-client
        traffic, what the paper's estimate counts (plus 28 bytes of nonce
        and tag and a small header per layer).
    bytes_in, bytes_out : int
        Ciphertext bytes the server received and sent (each delivered layer
        crosses the server twice; undelivered ones only once).
    aborted : int
        Exchanges aborted because a client dropped out.
    dropped : list[int]
        Nodes that left the exchange, in order.
    seconds : float
        Wall time from the first send to the last upload reply.
    """

    exchanges: int = 0
    layers_sent: int = 0
    layers_returned: int = 0
    layer_bytes: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    aborted: int = 0
    dropped: list[int] = field(default_factory=list)
    seconds: float = 0.0


class SecureRelay:
    """Drive the exchange of one round over a Flower ``Grid``.

    Parameters
    ----------
    grid : Grid
        Where messages go.
    timeout : float
        Seconds every exchange waits for replies (the round timeout).
    repeats : int
        r_s, repetitions of the exchange per round.
    """

    def __init__(self, grid: Grid, *, timeout: float, repeats: int) -> None:
        self.grid = grid
        self.timeout = timeout
        self.repeats = repeats
        self.stats = RelayStats()
        self.active: list[int] = []
        self._keys: dict[int, bytes] = {}
        self._server_round = 0
        self._stage = ""

    # ------------------------------------------------------------------
    # The round
    # ------------------------------------------------------------------

    def run(self, server_round: int, train_replies: Iterable[Message]) -> list[Message]:
        """Exchange layers among the clients that trained, then collect uploads.

        Parameters
        ----------
        server_round : int
            The round, from 1 (part of every ciphertext's associated data).
        train_replies : Iterable[Message]
            Replies to the training messages: a public key each.

        Returns
        -------
        list[Message]
            The upload replies (``"arrays"`` + ``"metrics"``, like ordinary
            training replies) and the training replies that were errors, for
            the strategy's usual validation. Nodes that dropped out have no
            reply in it. Nothing is uploaded when fewer than two clients
            trained: one client alone would hand the server its own model.
        """
        self.stats = RelayStats()
        self._server_round = server_round
        start = time.perf_counter()
        errors = self._collect_keys(train_replies)
        if len(self.active) < 2:
            log(
                WARNING,
                "Round %s: secure recombination needs at least two clients, %d trained; "
                "nothing is uploaded this round, so no client's own model reaches the server",
                server_round,
                len(self.active),
            )
            return errors
        commits = {node: Commit() for node in self.active}
        for repeat in range(1, self.repeats + 1):
            if len(self.active) < 2:
                log(
                    WARNING,
                    "Round %s: fewer than two clients left; no repetition %d",
                    server_round,
                    repeat,
                )
                break
            sends = self._send_stage(repeat, commits)
            commits = self._return_stage(repeat, sends)
        uploads = self._upload_stage(commits)
        self.stats.seconds = time.perf_counter() - start
        log(
            INFO,
            "Round %s: secure recombination relayed %d+%d layers (%d ciphertext bytes) in %d exchanges, "
            "%d aborted, %.2fs",
            server_round,
            self.stats.layers_sent,
            self.stats.layers_returned,
            self.stats.layer_bytes,
            self.stats.exchanges,
            self.stats.aborted,
            self.stats.seconds,
        )
        return errors + uploads

    def _collect_keys(self, replies: Iterable[Message]) -> list[Message]:
        """Keep the public key of every client that trained; return error replies."""
        self._keys, self.active, errors = {}, [], []
        for message in replies:
            node = message.metadata.src_node_id
            if message.has_error():
                errors.append(message)
                continue
            record = message.content.config_records.get(RECORD, {})
            key = record.get("public-key")
            if not isinstance(key, bytes) or len(key) != PUBLIC_KEY_BYTES:
                log(
                    WARNING,
                    "Round %s: node %s replied to training without a public key (does its ClientApp "
                    "register fedx.secure.client handlers?); it takes no part in this round",
                    self._server_round,
                    node,
                )
                continue
            self._keys[node] = key
            self.active.append(node)
        return errors

    # ------------------------------------------------------------------
    # Stages
    # ------------------------------------------------------------------

    def _send_stage(self, repeat: int, commits: dict[int, Commit]) -> list[Envelope]:
        """Commit repetition ``repeat - 1`` and collect the layers sealed for ``repeat``."""
        self._stage = f"send of repetition {repeat}"
        peers = list(self.active)
        contents = {}
        for node in peers:
            record = ConfigRecord(
                {
                    "round": self._server_round,
                    "repeat": repeat,
                    "peer-ids": [p for p in peers if p != node],
                    "peer-keys": [self._keys[p] for p in peers if p != node],
                }
            )
            commits[node].put(record)
            contents[node] = record
        sends = []
        for node, record in self._round_trip(SEND_TYPE, contents).items():
            try:
                envelopes = get_envelopes(record, "sends")
                self._check_sends(node, envelopes, set(peers) - {node})
            except ValueError as err:
                self._drop(node, f"malformed reply: {err}")
                continue
            sends.extend(envelopes)
        return sends

    def _return_stage(self, repeat: int, sends: list[Envelope]) -> dict[int, Commit]:
        """Deliver the sent layers, collect one return each, redo after drop-outs."""
        answers: dict[int, list[Envelope]] = {}
        to_ask, attempt = set(self.active), 0
        while to_ask:
            self._stage = f"return of repetition {repeat}" + (
                f" (attempt {attempt})" if attempt else ""
            )
            live = [e for e in sends if e.sender in self.active and e.receiver in self.active]
            contents = {}
            for node in to_ask:
                record = ConfigRecord(
                    {"round": self._server_round, "repeat": repeat, "attempt": attempt}
                )
                put_envelopes(record, "incoming", [e for e in live if e.receiver == node])
                contents[node] = record
            asked = set(contents)
            replies = self._round_trip(RETURN_TYPE, contents)
            for node, record in replies.items():
                incoming = [e for e in live if e.receiver == node]
                try:
                    returns = get_envelopes(record, "returns")
                    self._check_returns(node, returns, incoming, attempt)
                except ValueError as err:
                    self._drop(node, f"malformed reply: {err}")
                    continue
                answers[node] = returns
            dropped = asked - set(self.active)
            for node in dropped:
                answers.pop(node, None)
            # Whoever still holds a layer of a client that just dropped out
            # must answer again without it: its returns may pass that layer on.
            to_ask = {e.receiver for e in live if e.sender in dropped and e.receiver in self.active}
            attempt += 1
        return self._commits(repeat, sends, answers)

    def _commits(
        self, repeat: int, sends: list[Envelope], answers: dict[int, list[Envelope]]
    ) -> dict[int, Commit]:
        """Route the returns to their receivers; abort exchanges with dropped clients."""
        commits = {node: Commit(repeat) for node in self.active}
        returns = {(e.sender, e.receiver, e.layer): e for node in answers for e in answers[node]}
        partners: dict[int, list[int]] = {}
        for send in sends:
            if send.sender not in self.active:
                partners.setdefault(send.sender, []).append(send.receiver)
                continue
            if send.receiver in self.active:
                commits[send.sender].returns.append(
                    returns[(send.receiver, send.sender, send.layer)]
                )
                self.stats.layers_sent += 1
            else:
                commits[send.sender].aborted.append(send.layer)
                partners.setdefault(send.receiver, []).append(send.sender)
        for node, others in partners.items():
            self.stats.aborted += len(others)
            log(
                WARNING,
                "Round %s, repetition %d: node %s dropped out; its %d layer exchange(s) with node(s) %s "
                "are aborted and both sides keep their own layers",
                self._server_round,
                repeat,
                node,
                len(others),
                sorted(set(others)),
            )
        delivered = [e for c in commits.values() for e in c.returns]
        self.stats.layers_returned += len(delivered)
        self.stats.layer_bytes += payload_bytes(delivered) + payload_bytes(
            s for s in sends if s.sender in self.active and s.receiver in self.active
        )
        return commits

    def _upload_stage(self, commits: dict[int, Commit]) -> list[Message]:
        """Send every client its last commit; the replies are the uploads."""
        self._stage = "upload"
        contents = {}
        for node in self.active:
            record = ConfigRecord({"round": self._server_round})
            commits[node].put(record)
            contents[node] = record
        return list(self._round_trip(UPLOAD_TYPE, contents, raw=True).values())

    # ------------------------------------------------------------------
    # Messaging and checks
    # ------------------------------------------------------------------

    def _round_trip(
        self, message_type: str, contents: dict[int, ConfigRecord], raw: bool = False
    ) -> dict:
        """One exchange (``send_and_collect``); nodes without a usable reply are dropped.

        Returns the protocol record of every reply (the whole reply message
        with ``raw``, where errors are passed on for the strategy to log).
        """
        messages = [
            Message(
                content=RecordDict({RECORD: record}), message_type=message_type, dst_node_id=node
            )
            for node, record in contents.items()
        ]
        self.stats.exchanges += 1
        self.stats.bytes_out += sum(_payload_size(r) for r in contents.values())
        replies: dict[int, object] = {}
        for reply in send_and_collect(self.grid, messages, self.timeout):
            node = reply.metadata.src_node_id
            if node not in contents or node in replies:
                continue
            if raw:
                replies[node] = reply
            elif reply.has_error():
                self._drop(node, f"error: {reply.error.reason}")
            elif RECORD not in reply.content.config_records:
                self._drop(node, f"reply lacks the '{RECORD}' record")
            else:
                record = reply.content.config_records[RECORD]
                self.stats.bytes_in += _payload_size(record)
                replies[node] = record
        for node in contents:
            if node not in replies and node in self.active:
                self._drop(node, f"no reply within {self.timeout:g}s")
        return replies

    def _drop(self, node: int, reason: str) -> None:
        log(
            WARNING,
            "Round %s: node %s dropped out of secure recombination at the %s (%s)",
            self._server_round,
            node,
            self._stage,
            reason,
        )
        if node in self.active:
            self.active.remove(node)
            self.stats.dropped.append(node)

    @staticmethod
    def _check_sends(node: int, envelopes: list[Envelope], peers: set[int]) -> None:
        layers = [e.layer for e in envelopes]
        if len(set(layers)) != len(layers):
            raise ValueError("a layer was sent twice")
        for envelope in envelopes:
            if envelope.sender != node or envelope.receiver not in peers or envelope.attempt != 0:
                raise ValueError(
                    f"envelope from {envelope.sender} to {envelope.receiver} is misaddressed"
                )

    @staticmethod
    def _check_returns(
        node: int, returns: list[Envelope], incoming: list[Envelope], attempt: int
    ) -> None:
        expected = sorted((e.sender, e.layer) for e in incoming)
        if sorted((e.receiver, e.layer) for e in returns) != expected:
            raise ValueError("returns do not answer the delivered layers one to one")
        if any(e.sender != node or e.attempt != attempt for e in returns):
            raise ValueError("returns carry the wrong sender or attempt")


def _payload_size(record: ConfigRecord) -> int:
    """Bytes of encrypted payload in a protocol record."""
    return sum(
        len(value)
        for key, values in record.items()
        if key.endswith("-payloads") and isinstance(values, list)
        for value in values
        if isinstance(value, bytes)
    )
