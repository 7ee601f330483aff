"""VGG-11/13/16/19 with a classifier head for 32x32 images (Simonyan & Zisserman, ICLR 2015)."""

import torch
from torch import nn
from torchvision.models.vgg import cfgs, make_layers

# Five 2x2 max poolings halve the input five times: 32x32 becomes 1x1.
MIN_INPUT_SIDE = 32
# Width of the last conv stage, and of the hidden layers of the small head.
_WIDTH = 512
# torchvision's names for the conv stacks of the four depths (the paper's
# configurations A, B, D and E).
VGG_CONFIGS: dict[int, str] = {11: "A", 13: "B", 16: "D", 19: "E"}


class VGG(nn.Module):
    """A VGG conv stack (no BatchNorm) from torchvision with a small-input head.

    The feature extractor is the one of ``torchvision.models.vgg11/13/16/19``
    (built with torchvision's own ``make_layers``, never with downloaded
    weights). The ImageNet head (7x7 pooling, two 4096-unit layers) is
    replaced by the head commonly used on CIFAR: average pooling to 1x1, then
    ``Linear(512, 512) -> ReLU -> Dropout`` twice and a
    ``Linear(512, num_classes)``. VGG-16 has about 15.2M parameters in all.

    Parameters
    ----------
    input_shape : tuple[int, int, int]
        ``(channels, height, width)`` of one input image. Height and width
        must be at least 32. With other than three channels the first conv
        layer takes that many input channels.
    num_classes : int
        Number of output logits.
    depth : {11, 13, 16, 19}, optional
        Number of weighted layers: 8, 10, 13 or 16 conv layers plus the three
        linear layers of the head.
    dropout : float, optional
        Dropout probability of the two hidden layers.
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        depth: int = 16,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        if depth not in VGG_CONFIGS:
            raise ValueError(f"VGG depth must be one of {sorted(VGG_CONFIGS)}, got {depth}")
        in_channels, height, width = input_shape
        if height < MIN_INPUT_SIDE or width < MIN_INPUT_SIDE:
            raise ValueError(
                f"vgg{depth} needs inputs of at least {MIN_INPUT_SIDE}x{MIN_INPUT_SIDE} "
                f"(five 2x2 poolings), got {height}x{width}; use a cnn or resnet20 instead"
            )
        self.features = make_layers(cfgs[VGG_CONFIGS[depth]], batch_norm=False)
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


class VGG16(VGG):
    """VGG-16's 13 conv layers (configuration "D") with the small-input head of :class:`VGG`."""

    def __init__(
        self, input_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.5
    ) -> None:
        super().__init__(input_shape, num_classes, depth=16, dropout=dropout)
