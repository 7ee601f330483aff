"""What the secure-recombination messages carry: names, keys and envelopes.

Shared by the server-side relay and the clients; numpy and Flower only, no
cryptography. An :class:`Envelope` is one encrypted layer on its way from one
client to another: the routing fields travel in clear (the relay needs them),
the layer itself only inside ``payload``.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from flwr.app import ConfigRecord

#: Message actions (Flower message type ``"train.<action>"``) of the protocol.
SEND_ACTION = "fedx_secure_send"
RETURN_ACTION = "fedx_secure_return"
UPLOAD_ACTION = "fedx_secure_upload"
SEND_TYPE = f"train.{SEND_ACTION}"
RETURN_TYPE = f"train.{RETURN_ACTION}"
UPLOAD_TYPE = f"train.{UPLOAD_ACTION}"

#: Name of the ConfigRecord that carries the protocol in every message.
RECORD = "fedx-secure"

#: Keys the server adds to the training ConfigRecord to switch the protocol on.
FLAG_KEY = "secure-recombination"
MIN_LAYERS_KEY = "secure-min-layers"
MAX_LAYERS_KEY = "secure-max-layers"
GROUPING_KEY = "secure-grouping"

#: Stage names, part of every ciphertext's associated data.
SEND_STAGE = "send"
RETURN_STAGE = "return"


@dataclass(frozen=True)
class Envelope:
    """One encrypted layer in transit.

    Attributes
    ----------
    sender, receiver : int
        Flower node ids of the client that sealed it and the one that can
        open it.
    layer : int
        Index of the layer (in the model's layer order) inside the payload.
    attempt : int
        0, or how many times the receiver of a send had to redo its returns
        because one of its senders dropped out (return envelopes only).
    payload : bytes
        AES-GCM nonce, ciphertext and tag.
    """

    sender: int
    receiver: int
    layer: int
    attempt: int
    payload: bytes


def put_envelopes(record: ConfigRecord, prefix: str, envelopes: Iterable[Envelope]) -> None:
    """Store envelopes in ``record`` as parallel lists under ``<prefix>-*`` keys.

    Parallel lists keep one record per message however many layers move;
    empty lists are valid in a ConfigRecord.
    """
    envelopes = list(envelopes)
    record[f"{prefix}-senders"] = [e.sender for e in envelopes]
    record[f"{prefix}-receivers"] = [e.receiver for e in envelopes]
    record[f"{prefix}-layers"] = [e.layer for e in envelopes]
    record[f"{prefix}-attempts"] = [e.attempt for e in envelopes]
    record[f"{prefix}-payloads"] = [e.payload for e in envelopes]


def get_envelopes(record: ConfigRecord, prefix: str) -> list[Envelope]:
    """Read the envelopes :func:`put_envelopes` stored.

    Raises
    ------
    ValueError
        When a list is missing, the lists differ in length or hold values of
        the wrong type.
    """
    try:
        columns = [
            list(record[f"{prefix}-{column}"])  # type: ignore[arg-type, unused-ignore]
            for column in ("senders", "receivers", "layers", "attempts", "payloads")
        ]
    except KeyError as err:
        raise ValueError(f"message lacks {err}") from None
    if len({len(column) for column in columns}) > 1:
        raise ValueError(f"'{prefix}-*' lists differ in length")
    envelopes = []
    for sender, receiver, layer, attempt, payload in zip(*columns, strict=True):
        if not all(isinstance(v, int) for v in (sender, receiver, layer, attempt)):
            raise ValueError(f"'{prefix}-*' routing fields must be integers")
        if not isinstance(payload, bytes):
            raise ValueError(f"'{prefix}-payloads' must hold bytes")
        envelopes.append(Envelope(sender, receiver, layer, attempt, payload))
    return envelopes


def payload_bytes(envelopes: Iterable[Envelope]) -> int:
    """Total size of the envelopes' encrypted payloads."""
    return sum(len(e.payload) for e in envelopes)
