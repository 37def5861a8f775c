"""More small `transformers` vision architectures for the pruning checks, built from configs
(nothing downloaded), seeded, in eval mode, one ``(2, 3, 32, 32)`` image batch.

- RegNetY: grouped 3 × 3 convs (``groups_width``) and squeeze-and-excitation;
- EfficientNet: depthwise convs, squeeze-and-excitation, swish, TF-style padding;
- ResNet with bottleneck blocks (ResNet-50's shape): 1 × 1 → 3 × 3 → 1 × 1 and projection
  shortcuts.
"""

from __future__ import annotations

import transformers

from tests.models.hf_build import BATCH, Built, floats, instantiate


def build_regnet() -> Built:
    config = transformers.RegNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 2],
        groups_width=8, layer_type="y", num_labels=10,
    )
    model = instantiate(transformers.RegNetForImageClassification, config, attention=None)
    return model, {"pixel_values": floats(BATCH, 3, 32, 32)}


def build_efficientnet() -> Built:
    config = transformers.EfficientNetConfig(
        num_channels=3, image_size=32, width_coefficient=0.25, depth_coefficient=0.5,
        hidden_dim=320, num_labels=10, dropout_rate=0.0, drop_connect_rate=0.0,
    )
    model = instantiate(transformers.EfficientNetForImageClassification, config,
                        attention=None)
    return model, {"pixel_values": floats(BATCH, 3, 32, 32)}


def build_resnet_bottleneck() -> Built:
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[32, 64], depths=[2, 1],
        layer_type="bottleneck", num_labels=10,
    )
    model = instantiate(transformers.ResNetForImageClassification, config, attention=None)
    return model, {"pixel_values": floats(BATCH, 3, 32, 32)}


ZOO = {"regnet": build_regnet, "efficientnet": build_efficientnet,
       "resnet_bottleneck": build_resnet_bottleneck}
