"""Not a change: Flower's serialization of a message's content, as fedx's loopback grid uses it.

What it uses
    ``recorddict_to_proto`` and ``recorddict_from_proto`` of
    ``flwr.common.serde``, Flower's conversion of a ``RecordDict`` to and
    from its protobuf message, which is what crosses the wire between
    Flower's processes. Nothing of Flower's is replaced.

Why
    The in-process grid of fedx's tests and benchmarks
    (:class:`fedx.secure.loopback.LoopbackGrid`) sends every message's
    content through it both ways, so that whatever does not survive the wire
    does not survive there either, and it counts the bytes that would
    cross it.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.

Under another Flower
    :func:`over_the_wire` fails where Flower has no such functions; the
    loopback grid is not part of a run, and nothing is installed.
"""

from flwr.app import RecordDict

from fedx.flower._fingerprints import flower_code

#: The Flower code this module relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.common.serde:recorddict_to_proto",
    "flwr.common.serde:recorddict_from_proto",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that the two functions still convert a RecordDict to and from the protobuf message "
    "Flower's processes exchange, so that a copy made through them is what a receiver gets"
)


def over_the_wire(content: RecordDict) -> tuple[RecordDict, int]:
    """A copy of ``content`` that went through Flower's serialization, and its size in bytes."""
    # pylint: disable=import-outside-toplevel
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

    proto = recorddict_to_proto(content)
    return recorddict_from_proto(proto), proto.ByteSize()
