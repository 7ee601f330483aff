"""FedMe's clients as its server sees them: their state, the messages it sends them, and how it reads their replies.

The keys of the messages are :mod:`fedx.protocol.fedme`'s; the ClientApp's
side is :mod:`fedx.client.fedme`. The strategy (:mod:`fedx.strategies.fedme.strategy`)
decides who gets what; this module says how that travels.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fedx.ops import Model
from fedx.protocol import fedme as protocol
from fedx.protocol.common import CLIENT_ID, CONFIG, METRICS, SERVER_ROUND
from fedx.protocol.personalized import FINETUNE_EPOCHS
from fedx.strategy_core.base import read_model, read_weight, to_arrayrecord


@dataclass
class ClientState:
    """What the server keeps for one client between rounds.

    Attributes
    ----------
    node_id : int
        The Flower node the client was last seen on.
    architecture : str
        Architecture name of the personalized model.
    model : Model
        The personalized model.
    """

    node_id: int
    architecture: str
    model: Model


@dataclass(frozen=True)
class Choice:
    """A client's valid answer to the architecture choice."""

    architecture: str
    accuracies: dict[str, float]  # validation accuracy by candidate, as reported


@dataclass(frozen=True)
class TrainReply:
    """A valid training reply: both trained models and the client's choice."""

    personalized: Model
    exchanged: Model
    chose_exchanged: bool
    content: RecordDict


def choice_message(
    server_round: int,
    config: ConfigRecord,
    node_id: int,
    client_id: int,
    candidates: list[str],
    choice_epochs: int,
) -> Message:
    """The message that asks a new client to choose its architecture among ``candidates``."""
    return Message(
        content=RecordDict(
            {
                CONFIG: ConfigRecord(
                    {
                        **dict(config.items()),
                        SERVER_ROUND: server_round,
                        CLIENT_ID: client_id,
                        protocol.CANDIDATE_ARCHITECTURES: candidates,
                        protocol.CHOICE_EPOCHS: choice_epochs,
                    }
                )
            }
        ),
        message_type=MessageType.TRAIN,
        dst_node_id=node_id,
    )


def train_message(
    server_round: int,
    config: ConfigRecord,
    client_id: int,
    partner_id: int,
    clients: Mapping[int, ClientState],
    *,
    model_tuning: bool,
    mutual_learning: bool,
) -> Message:
    """A training message: the client's personalized model and its partner's, to train both."""
    client, partner = clients[client_id], clients[partner_id]
    content = ConfigRecord(
        {
            **dict(config.items()),
            SERVER_ROUND: server_round,
            CLIENT_ID: client_id,
            protocol.PERSONALIZED_ARCHITECTURE: client.architecture,
            protocol.EXCHANGED_ARCHITECTURE: partner.architecture,
            protocol.EXCHANGED_FROM: partner_id,
            protocol.MODEL_TUNING: model_tuning,
            protocol.MUTUAL_LEARNING: mutual_learning,
        }
    )
    records = RecordDict(
        {
            protocol.PERSONALIZED: to_arrayrecord(client.model),
            protocol.EXCHANGED: to_arrayrecord(partner.model),
            CONFIG: content,
        }
    )
    return Message(content=records, message_type=MessageType.TRAIN, dst_node_id=client.node_id)


def evaluate_message(
    server_round: int,
    config: ConfigRecord,
    client_id: int,
    client: ClientState,
    finetune_epochs: int,
) -> Message:
    """An evaluation message: the client's personalized model, to test on its own test split."""
    content = ConfigRecord(
        {
            **dict(config.items()),
            SERVER_ROUND: server_round,
            CLIENT_ID: client_id,
            protocol.PERSONALIZED_ARCHITECTURE: client.architecture,
            FINETUNE_EPOCHS: finetune_epochs,
        }
    )
    records = RecordDict({protocol.PERSONALIZED: to_arrayrecord(client.model), CONFIG: content})
    return Message(content=records, message_type=MessageType.EVALUATE, dst_node_id=client.node_id)


def parse_choice(message: Message, candidates: list[str]) -> Choice | str:
    """A client's architecture choice, or why it cannot be used."""
    if message.has_error():
        return f"the node reported an error: {message.error.reason}"
    record = message.content.config_records.get(protocol.CHOICE)
    chosen = record.get(protocol.CHOSEN_ARCHITECTURE) if record is not None else None
    if not isinstance(chosen, str) or chosen not in candidates:
        return f"expected a ConfigRecord '{protocol.CHOICE}' with '{protocol.CHOSEN_ARCHITECTURE}' one of {candidates}, got {chosen!r}"
    metrics = message.content.metric_records.get(METRICS)
    reported = metrics.get(protocol.VALIDATION_ACCURACY_CANDIDATES) if metrics is not None else None
    accuracies = (
        dict(zip(candidates, (float(a) for a in reported), strict=True))
        if isinstance(reported, list) and len(reported) == len(candidates)
        else {}
    )
    return Choice(chosen, accuracies)


def parse_train_reply(
    message: Message,
    personalized: Model,
    exchanged: Model,
    *,
    weighted_by_key: str,
    model_tuning: bool,
) -> TrainReply | str:
    """Both trained models and the choice of a reply, or why they cannot be used."""
    if message.has_error():
        return f"the node reported an error: {message.error.reason}"
    content = message.content
    missing = [
        k for k in (protocol.PERSONALIZED, protocol.EXCHANGED) if k not in content.array_records
    ]
    metric_records = list(content.metric_records.values())
    if missing or len(metric_records) != 1:
        return (
            f"expected ArrayRecords '{protocol.PERSONALIZED}' and '{protocol.EXCHANGED}' and one "
            f"MetricRecord, got {list(content.array_records)} and {len(metric_records)}"
        )
    weight = read_weight(content, weighted_by_key)
    if isinstance(weight, str):
        return weight
    choice = metric_records[0].get(protocol.CHOSE_EXCHANGED)
    if choice not in (0, 1) or isinstance(choice, bool):
        return f"expected '{protocol.CHOSE_EXCHANGED}' 0 or 1, got {choice!r}"
    if choice == 1 and not model_tuning:
        return f"'{protocol.CHOSE_EXCHANGED}' is 1 but model tuning is off"
    trained = {}
    for key, sent in ((protocol.PERSONALIZED, personalized), (protocol.EXCHANGED, exchanged)):
        model = read_model(content.array_records[key], sent)
        if isinstance(model, str):
            return f"{key} model: {model}"
        trained[key] = model
    return TrainReply(
        trained[protocol.PERSONALIZED], trained[protocol.EXCHANGED], choice == 1, content
    )
