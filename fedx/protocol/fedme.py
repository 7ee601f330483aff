"""FedMe's training messages: two models in, two trained models and a choice out.

The server sends each client one message: its personalized model
(ArrayRecord ``"personalized"``, architecture ``personalized-architecture``)
and an exchanged model (``"exchanged"``, ``exchanged-architecture``, from
client ``exchanged-from``), with ``model-tuning`` and ``mutual-learning``
switches and the usual training settings in its ConfigRecord. The client
trains both by deep mutual learning and replies with both trained models
under the same names and a MetricRecord holding ``num-examples``,
``chose-exchanged`` (1: adopt the exchanged model, it had the lower
validation loss) and its losses. Evaluation is per client
(:mod:`fedx.protocol.personalized`), with the personalized model.

With ``local-best`` initial architectures, a client seen for the first time
gets one training message before its first round that holds no model: its
ConfigRecord lists ``candidate-architectures`` (which makes it the choice)
and ``choice-epochs``, with the usual training settings. The client trains
each candidate from its first model for that many epochs on its train split
and replies with a ConfigRecord ``choice`` holding ``chosen-architecture``
(the best validation accuracy) and a MetricRecord holding ``num-examples``
and each candidate's ``val-acc-candidates`` and ``val-loss-candidates``, in
candidate order.
"""

from fedx.protocol.personalized import ARCHITECTURE as PERSONALIZED_ARCHITECTURE

#: ArrayRecord names of the training messages and replies.
PERSONALIZED = "personalized"
EXCHANGED = "exchanged"

#: Config keys of a training message.
EXCHANGED_ARCHITECTURE = "exchanged-architecture"
EXCHANGED_FROM = "exchanged-from"
MODEL_TUNING = "model-tuning"
MUTUAL_LEARNING = "mutual-learning"

#: The architecture choice before a client's first round: its config keys
#: (a training message with candidates is a choice) and its reply.
CANDIDATE_ARCHITECTURES = "candidate-architectures"
CHOICE_EPOCHS = "choice-epochs"
CHOICE = "choice"
CHOSEN_ARCHITECTURE = "chosen-architecture"
VALIDATION_ACCURACY_CANDIDATES = "val-acc-candidates"
VALIDATION_LOSS_CANDIDATES = "val-loss-candidates"

#: Metric keys of a reply: the choice (1 = adopt the exchanged model) and the losses.
CHOSE_EXCHANGED = "chose-exchanged"
TRAIN_LOSS_PERSONALIZED = "train-loss-personalized"
TRAIN_LOSS_EXCHANGED = "train-loss-exchanged"
VALIDATION_LOSS_PERSONALIZED = "val-loss-personalized"
VALIDATION_LOSS_EXCHANGED = "val-loss-exchanged"

__all__ = [
    "CANDIDATE_ARCHITECTURES",
    "CHOICE",
    "CHOICE_EPOCHS",
    "CHOSEN_ARCHITECTURE",
    "CHOSE_EXCHANGED",
    "EXCHANGED",
    "EXCHANGED_ARCHITECTURE",
    "EXCHANGED_FROM",
    "MODEL_TUNING",
    "MUTUAL_LEARNING",
    "PERSONALIZED",
    "PERSONALIZED_ARCHITECTURE",
    "TRAIN_LOSS_EXCHANGED",
    "TRAIN_LOSS_PERSONALIZED",
    "VALIDATION_ACCURACY_CANDIDATES",
    "VALIDATION_LOSS_CANDIDATES",
    "VALIDATION_LOSS_EXCHANGED",
    "VALIDATION_LOSS_PERSONALIZED",
]
