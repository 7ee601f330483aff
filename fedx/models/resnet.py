"""ResNet-20 for small images (He et al., CVPR 2016, Sec. 4.2)."""

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock

# The CIFAR ResNets have three stages whose widths double while the feature
# map halves; ResNet-(6n+2) has n basic blocks per stage, n=3 for ResNet-20.
_STAGE_WIDTHS: tuple[int, ...] = (16, 32, 64)
_BLOCKS_PER_STAGE = 3


class ResNet20(nn.Module):
    """The CIFAR ResNet-20: a 3x3 stem, three stages of three basic blocks, a linear head.

    Weighted layers: 1 stem conv + 3 stages x 3 blocks x 2 convs + 1 linear
    layer = 20. Where a block changes the width or the resolution, the
    shortcut is a 1x1 convolution followed by BatchNorm (projection shortcut,
    option B of the paper); these two extra convs are not counted in the
    depth. Global average pooling before the head makes the network accept
    any input size (8x8 digits become 2x2 feature maps in the last stage).

    Parameters
    ----------
    input_shape : tuple[int, int, int]
        ``(channels, height, width)`` of one input image; only the channel
        count shapes the network.
    num_classes : int
        Number of output logits.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        in_channels = input_shape[0]
        self.inplanes = _STAGE_WIDTHS[0]
        self.conv1 = nn.Conv2d(in_channels, self.inplanes, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_stage(_STAGE_WIDTHS[0], stride=1)
        self.layer2 = self._make_stage(_STAGE_WIDTHS[1], stride=2)
        self.layer3 = self._make_stage(_STAGE_WIDTHS[2], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(_STAGE_WIDTHS[-1], num_classes)

        # The initialisation of torchvision's ResNet (He et al.'s "MSRA" init).
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)

    def _make_stage(self, planes: int, stride: int) -> nn.Sequential:
        """Build one stage; its first block downsamples by ``stride``."""
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        blocks = [BasicBlock(self.inplanes, planes, stride=stride, downsample=downsample)]
        self.inplanes = planes
        blocks += [BasicBlock(planes, planes) for _ in range(_BLOCKS_PER_STAGE - 1)]
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch ``(N, C, H, W)`` to logits ``(N, num_classes)``."""
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)
