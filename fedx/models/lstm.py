"""LEAF's next-character LSTM for Shakespeare (Caldas et al., 2018; after McMahan et al., 2017)."""

import torch
from torch import nn


class CharLSTM(nn.Module):
    """Embedding, a stack of LSTM layers, and a linear layer on the last hidden state.

    The network of LEAF's ``models/shakespeare/stacked_lstm.py``: every
    character of a line becomes an 8-dimensional embedding, two LSTM layers
    of 256 units read the line, and a linear layer maps the top layer's
    output after the last character to one logit per character of the
    vocabulary, predicting the character that follows.

    Parameters
    ----------
    input_shape : tuple[int]
        ``(sequence_length,)`` of one input (80 for LEAF's Shakespeare). The
        network accepts any length; the argument is there so that
        :func:`fedx.models.build_model` can build every model alike, and is
        checked to be one positive length.
    num_classes : int
        Number of output logits. It is also the vocabulary of the input
        tokens, as in LEAF, where inputs and labels are characters of one
        alphabet.
    embedding_dim : int, optional
        Size of a character's embedding (8 in LEAF).
    hidden_size : int, optional
        Units of every LSTM layer (256 in LEAF).
    num_layers : int, optional
        Stacked LSTM layers (2 in LEAF).

    Notes
    -----
    PyTorch's ``nn.LSTM`` keeps two bias vectors per layer where TensorFlow's
    ``BasicLSTMCell`` has one and a forget-gate bias of 1; the functions the
    two can represent are the same. Weights start from PyTorch's default
    initialisation. State-dict names are ``embedding.weight``,
    ``lstm.{weight,bias}_{ih,hh}_l<k>`` and ``classifier.{weight,bias}``.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        embedding_dim: int = 8,
        hidden_size: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1 or input_shape[0] < 1:
            raise ValueError(
                f"CharLSTM reads token sequences: input_shape must be (length,), got {input_shape}"
            )
        self.embedding = nn.Embedding(num_classes, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.classifier = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of token ids ``(N, L)`` to next-character logits ``(N, num_classes)``."""
        outputs, _ = self.lstm(self.embedding(x))
        return self.classifier(outputs[:, -1])
