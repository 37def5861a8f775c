"""A small conv net covering the conv family. Legend: ``N, C, H, W``.

Conv2d + BatchNorm2d + ReLU stem, MaxPool, a grouped conv (groups=4), a depthwise conv
(groups=channels), a strided ConvTranspose2d, AdaptiveAvgPool2d and a Linear head. Built in
eval mode, so BatchNorm uses its running statistics (set to non-trivial values here).
"""

from __future__ import annotations

import torch
from torch import nn

SEED = 0


class ConvNet(nn.Module):
    def __init__(self, in_channels: int = 3, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.grouped = nn.Conv2d(width, 2 * width, kernel_size=3, padding=1, groups=4)
        self.depthwise = nn.Conv2d(2 * width, 2 * width, kernel_size=3, padding=1,
                                   groups=2 * width)
        self.bn = nn.BatchNorm2d(2 * width)
        self.up = nn.ConvTranspose2d(2 * width, width, kernel_size=2, stride=2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, C, H, W)
        x = self.pool(self.stem(x))                          # (N, w, H/2, W/2)
        x = torch.relu(self.grouped(x))                      # (N, 2w, H/2, W/2)
        x = torch.relu(self.bn(self.depthwise(x)))           # (N, 2w, H/2, W/2)
        x = torch.relu(self.up(x))                           # (N, w, H, W)
        return self.head(torch.flatten(self.gap(x), 1))      # (N, classes)


def build(
    batch: int = 2, image_size: int = 32, width: int = 16
) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The conv net with seeded weights and BatchNorm statistics, one (batch, 3, S, S) input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = ConvNet(width=width)
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.1, 0.1)
            bn.running_var.uniform_(0.5, 1.5)
        x = torch.randn(batch, 3, image_size, image_size)
    return model.eval(), (x,)
