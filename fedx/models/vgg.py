"""VGG-16 with a classifier head for 32x32 images (Simonyan & Zisserman, ICLR 2015)."""

import torch
from torch import nn
from torchvision.models.vgg import cfgs, make_layers

# Five 2x2 max poolings halve the input five times: 32x32 becomes 1x1.
MIN_INPUT_SIDE = 32
# Width of the last conv stage, and of the hidden layers of the small head.
_WIDTH = 512


class VGG16(nn.Module):
    """VGG-16's 13 conv layers (configuration "D", no BatchNorm) with a small-input head.

    The feature extractor is the one of ``torchvision.models.vgg16`` (built
    with torchvision's own ``make_layers``, never with downloaded weights).
    The ImageNet head (7x7 pooling, two 4096-unit layers, about 120M
    parameters) is replaced by the head commonly used on CIFAR: average
    pooling to 1x1, then ``Linear(512, 512) -> ReLU -> Dropout`` twice and a
    ``Linear(512, num_classes)``; about 15.2M parameters in all.

    Parameters
    ----------
    input_shape : tuple[int, int, int]
        ``(channels, height, width)`` of one input image. Height and width
        must be at least 32. With other than three channels the first conv
        layer takes that many input channels.
    num_classes : int
        Number of output logits.
    dropout : float, optional
        Dropout probability of the two hidden layers.
    """

    def __init__(
        self, input_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.5
    ) -> None:
        super().__init__()
        in_channels, height, width = input_shape
        if height < MIN_INPUT_SIDE or width < MIN_INPUT_SIDE:
            raise ValueError(
                f"vgg16 needs inputs of at least {MIN_INPUT_SIDE}x{MIN_INPUT_SIDE} "
                f"(five 2x2 poolings), got {height}x{width}; use cnn or resnet20 instead"
            )
        self.features = make_layers(cfgs["D"], batch_norm=False)
        if in_channels != 3:
            first = self.features[0]
            self.features[0] = nn.Conv2d(
                in_channels,
                first.out_channels,
                kernel_size=first.kernel_size,
                padding=first.padding,
            )
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(
            nn.Linear(_WIDTH, _WIDTH),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(_WIDTH, _WIDTH),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(_WIDTH, num_classes),
        )

        # The initialisation of torchvision's VGG.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.constant_(module.bias, 0)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.01)
                nn.init.constant_(module.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch ``(N, C, H, W)`` to logits ``(N, num_classes)``."""
        x = self.features(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.classifier(x)
