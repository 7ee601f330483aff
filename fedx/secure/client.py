"""ClientApp side of secure recombination: Flower message handlers.

Add the protocol to any ClientApp in two steps:

1. in the train handler, when :func:`is_secure_round` says so, reply with
   :func:`secure_train_reply` instead of the trained arrays (the model then
   stays on the node, in ``context.state``);
2. call :func:`register_secure_handlers` once on the ``ClientApp``.

The handlers use numpy, Flower and ``cryptography`` only, so a ClientApp that
trains with any framework can use them.
"""

import functools
import random
from collections.abc import Callable

from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedx.secure import crypto
from fedx.secure.exchange import ExchangeState, ProtocolError, clear, run_private_key
from fedx.secure.wire import (
    FLAG_KEY,
    GROUPING_KEY,
    MAX_LAYERS_KEY,
    MIN_LAYERS_KEY,
    RECORD,
    RETURN_ACTION,
    SEND_ACTION,
    UPLOAD_ACTION,
    get_envelopes,
    put_envelopes,
)

#: A Flower message handler.
Handler = Callable[[Message, Context], Message]


def _system_rng() -> random.Random:
    # The OS's CSPRNG: the server must not be able to predict which layers a
    # client sends or returns, so no seed from the run config.
    return random.SystemRandom()


def _protocol(msg: Message) -> ConfigRecord:
    record = msg.content.config_records.get(RECORD)
    if record is None:
        raise ProtocolError(f"message lacks the '{RECORD}' ConfigRecord")
    return record


def is_secure_round(msg: Message, config_key: str = "config") -> bool:
    """Whether a training message asks for secure recombination.

    ``config_key`` names the message's ConfigRecord (the strategy's
    ``configrecord_key``).
    """
    config = msg.content.config_records.get(config_key, {})
    return bool(config.get(FLAG_KEY, False))


def secure_train_reply(
    msg: Message,
    context: Context,
    arrays: ArrayRecord,
    metrics: MetricRecord,
    config_key: str = "config",
) -> Message:
    """Keep the trained model on the node and reply with the public key only.

    Parameters
    ----------
    msg : Message
        The training message (its config carries the protocol's settings).
    context : Context
        The node's context; the model goes into ``context.state``.
    arrays : ArrayRecord
        The trained model.
    metrics : MetricRecord
        The metrics the upload will carry (``num-examples`` among them).
    config_key : str (default: "config")
        Name of the message's ConfigRecord (the strategy's
        ``configrecord_key``).
    """
    config = msg.content.config_records.get(config_key, {})
    state = context.state
    clear(state)
    private_key = run_private_key(state, context.run_id)
    exchange = ExchangeState(
        node_id=msg.metadata.dst_node_id,
        private_key=private_key,
        server_round=int(config.get("server-round", 0)),
        grouping=str(config.get(GROUPING_KEY, "tensor")),
        min_layers=int(config[MIN_LAYERS_KEY]),
        max_layers=int(config[MAX_LAYERS_KEY]),
        model={name: array.numpy() for name, array in arrays.items()},
        metrics=metrics,
    )
    exchange.trained_digests = exchange.layer_digests()
    exchange.save(state)
    reply = ConfigRecord({"public-key": crypto.public_key(private_key)})
    return Message(content=RecordDict({RECORD: reply}), reply_to=msg)


def _commit_from(record: ConfigRecord, exchange: ExchangeState) -> None:
    """Apply the commit of the previous repetition that a message carries."""
    repeat = int(record.get("commit-repeat", 0))  # type: ignore[arg-type]
    if repeat == 0:
        return
    aborted = [int(layer) for layer in record.get("aborted-layers", [])]  # type: ignore[union-attr]
    exchange.commit(repeat, get_envelopes(record, "returns"), aborted)


def handle_send(msg: Message, context: Context, rng: random.Random | None = None) -> Message:
    """Commit the previous repetition, then seal the layers chosen for this one."""
    record = _protocol(msg)
    exchange = ExchangeState.load(context.state)
    _check_round(record, exchange)
    _commit_from(record, exchange)
    peers = dict(zip(record["peer-ids"], record["peer-keys"], strict=True))  # type: ignore[arg-type]
    envelopes = exchange.send(int(record["repeat"]), peers, rng or _system_rng())  # type: ignore[arg-type]
    exchange.save(context.state)
    reply = ConfigRecord()
    put_envelopes(reply, "sends", envelopes)
    return Message(content=RecordDict({RECORD: reply}), reply_to=msg)


def handle_return(msg: Message, context: Context, rng: random.Random | None = None) -> Message:
    """Open the received layers and seal one return for each."""
    record = _protocol(msg)
    exchange = ExchangeState.load(context.state)
    _check_round(record, exchange)
    envelopes = exchange.answer(
        int(record["repeat"]),  # type: ignore[arg-type]
        int(record["attempt"]),  # type: ignore[arg-type]
        get_envelopes(record, "incoming"),
        rng or _system_rng(),
    )
    exchange.save(context.state)
    reply = ConfigRecord()
    put_envelopes(reply, "returns", envelopes)
    return Message(content=RecordDict({RECORD: reply}), reply_to=msg)


def handle_upload(msg: Message, context: Context) -> Message:
    """Commit the last repetition and upload the rebuilt model as a training reply."""
    record = _protocol(msg)
    exchange = ExchangeState.load(context.state)
    _check_round(record, exchange)
    _commit_from(record, exchange)
    if exchange.repeat != exchange.committed:
        raise ProtocolError(f"upload asked while repetition {exchange.repeat} is unfinished")
    if exchange.holds_trained_model():
        exchange.save(context.state)  # the committed model stays here, never uploaded
        # The promise of the protocol: the server never gets a client's own
        # trained model. This happens when every exchange was aborted or
        # every layer that left came back.
        raise ProtocolError(
            "no layer of this node's trained model was exchanged; it does not upload its own model"
        )
    reply = RecordDict(
        {
            "arrays": ArrayRecord({name: Array(array) for name, array in exchange.model.items()}),
            "metrics": exchange.metrics,
        }
    )
    clear(context.state)  # the round is over for this node
    return Message(content=reply, reply_to=msg)


def _check_round(record: ConfigRecord, exchange: ExchangeState) -> None:
    server_round = int(record.get("round", -1))  # type: ignore[arg-type]
    if server_round != exchange.server_round:
        raise ProtocolError(
            f"message for round {server_round}, but this node trained for round {exchange.server_round}"
        )


def replying_errors(handler: Handler) -> Handler:
    """Turn a protocol violation into an error reply naming it.

    The server then logs the reason with the node id and drops the node from
    the exchange, instead of the ClientApp crashing with a traceback.
    """

    def answer(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except (
            ValueError,
            KeyError,
            TypeError,
        ) as err:  # ProtocolError, malformed records or layers
            reason = f"secure recombination: {err}"
            return Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg
            )

    return functools.wraps(handler)(answer)


def make_handlers(rng: Callable[[], random.Random] = _system_rng) -> dict[str, Handler]:
    """The protocol's handlers by message action, drawing randomness from ``rng()``.

    Only tests should pass ``rng``: seeded randomness lets the server
    reproduce every choice a client makes.
    """
    return {
        SEND_ACTION: replying_errors(
            functools.wraps(handle_send)(lambda m, c: handle_send(m, c, rng()))
        ),
        RETURN_ACTION: replying_errors(
            functools.wraps(handle_return)(lambda m, c: handle_return(m, c, rng()))
        ),
        UPLOAD_ACTION: replying_errors(handle_upload),
    }


#: The handlers a ClientApp registers, by message action.
HANDLERS: dict[str, Handler] = make_handlers()


def register_secure_handlers(app: ClientApp) -> None:
    """Register the send, return and upload handlers on ``app``."""
    for action, handler in HANDLERS.items():
        app.train(action)(handler)
