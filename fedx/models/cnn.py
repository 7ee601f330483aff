"""The convolutional network of the FedAvg paper (McMahan et al., AISTATS 2017)."""

from collections.abc import Sequence

import torch
from torch import nn

# Each conv block halves the height and width with a 2x2 max pooling.
_POOL = 2


class CNN(nn.Module):
    """FedAvg's CNN: two 5x5 conv blocks, a 512-unit hidden layer, a linear output.

    Each conv block is ``Conv2d(5x5, padding=2) -> ReLU -> MaxPool2d(2)``; the
    padding keeps the spatial size, the pooling halves it. The input to the
    first fully connected layer is computed from ``input_shape``, so one class
    serves 1x8x8 digits, 1x28x28 MNIST/FEMNIST (1,663,370 parameters with 10
    classes, the figure of the paper) and 3x32x32 CIFAR images alike.

    Parameters
    ----------
    input_shape : tuple[int, int, int]
        ``(channels, height, width)`` of one input image. Height and width
        must be at least ``2 ** len(conv_channels)`` so that every pooling
        leaves at least one pixel.
    num_classes : int
        Number of output logits.
    conv_channels : Sequence[int], optional
        Output channels of the conv blocks, in order. The default ``(32, 64)``
        is the paper's network; other lengths give the shallower or deeper
        CNNs of heterogeneous-architecture settings (Matsuda et al.).
    hidden_units : int, optional
        Width of the hidden fully connected layer (512 in the paper).
    pool_to_fit : bool, optional
        When true, a conv block pools only while the feature map is at least
        2x2, so deep variants accept small inputs (four blocks on 8x8 digits
        give 4x4, 2x2, 1x1, 1x1). When false (default), every block pools
        and inputs smaller than ``2 ** len(conv_channels)`` are rejected.

    Notes
    -----
    State-dict names are ``features.<i>.*`` for the conv layers and
    ``classifier.<i>.*`` for the linear layers, as in torchvision's AlexNet
    and VGG.
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        conv_channels: Sequence[int] = (32, 64),
        hidden_units: int = 512,
        pool_to_fit: bool = False,
    ) -> None:
        super().__init__()
        in_channels, height, width = input_shape
        if not conv_channels:
            raise ValueError("CNN needs at least one conv block, got conv_channels=()")
        min_side = _POOL ** len(conv_channels)
        if not pool_to_fit and (height < min_side or width < min_side):
            raise ValueError(
                f"CNN with {len(conv_channels)} conv blocks needs inputs of at least "
                f"{min_side}x{min_side}, got {height}x{width}"
            )

        layers: list[nn.Module] = []
        for out_channels in conv_channels:
            layers += [
                nn.Conv2d(in_channels, out_channels, kernel_size=5, padding=2),
                nn.ReLU(inplace=True),
            ]
            in_channels = out_channels
            if min(height, width) >= _POOL or not pool_to_fit:
                layers.append(nn.MaxPool2d(_POOL))
                # MaxPool2d floors odd sizes, exactly like this integer division.
                height, width = height // _POOL, width // _POOL
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(in_channels * height * width, hidden_units),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_units, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch ``(N, C, H, W)`` to logits ``(N, num_classes)``."""
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)
