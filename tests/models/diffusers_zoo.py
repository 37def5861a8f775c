"""Small `diffusers` architectures built from tiny configs, with real seeded weights on CPU.

Each ``build_<name>()`` returns ``(module, example_inputs)`` with keyword inputs, like
`tests.models.hf_zoo`: two resolution levels of 16–64 channels, 8 × 8 latents (32 × 32
pixels for the VAE), so each runs eagerly in well under a second. Attention goes through
diffusers' default processor (``F.scaled_dot_product_attention``); eval mode. `ZOO` lists them.

The families: a latent-diffusion UNet with cross-attention to text states (Stable Diffusion's
``UNet2DConditionModel``), a diffusion transformer with adaLN-zero conditioning on the
timestep and class (``DiTTransformer2DModel``) and a VAE (``AutoencoderKL``: encoder, the
posterior's mode, decoder; one attention block in each mid block).

Nothing is downloaded. Importing this module imports diffusers (a few seconds), so
`tests.models` does not import it.

Known limitation: these are the published architectures' shapes, not their sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import diffusers
import torch

SEED = 0
BATCH = 2
LATENT = 8        # latent side (pixels / 8 for Stable Diffusion's VAE)
TEXT_TOKENS = 6   # encoder states the UNet cross-attends to

Built = tuple[torch.nn.Module, dict[str, torch.Tensor]]


def _seeded(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = build()
    return model.eval()


def _floats(*shape: int, seed: int = SEED + 2) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _timesteps() -> torch.Tensor:
    return torch.tensor([10, 500][:BATCH], dtype=torch.int64)


def build_unet() -> Built:
    """Stable Diffusion's UNet shape: a cross-attention down block, a plain one, a mid block
    with cross-attention, mirrored up blocks; group norm over 8 groups."""
    model = _seeded(lambda: diffusers.UNet2DConditionModel(
        sample_size=LATENT, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
        attention_head_dim=8, norm_num_groups=8,
    ))
    return model, {"sample": _floats(BATCH, 4, LATENT, LATENT), "timestep": _timesteps(),
                   "encoder_hidden_states": _floats(BATCH, TEXT_TOKENS, 32, seed=SEED + 3)}


def build_dit() -> Built:
    """DiT: 2 × 2 patches of an 8 × 8 latent (16 tokens), two blocks with adaLN-zero from the
    timestep and class embeddings, a learned-sigma output (8 channels)."""
    model = _seeded(lambda: diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
        num_layers=2, sample_size=LATENT, patch_size=2, num_embeds_ada_norm=10,
        norm_num_groups=8,
    ))
    labels = torch.tensor([3, 7][:BATCH], dtype=torch.int64)
    return model, {"hidden_states": _floats(BATCH, 4, LATENT, LATENT), "timestep": _timesteps(),
                   "class_labels": labels}


def build_vae() -> Built:
    """AutoencoderKL: a two-level encoder to 4 latent channels, the posterior's mode, the
    decoder back to 32 × 32 RGB."""
    model = _seeded(lambda: diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
        block_out_channels=(16, 32), norm_num_groups=8, sample_size=32,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
    ))
    return model, {"sample": _floats(BATCH, 3, 32, 32)}


ZOO: dict[str, Callable[[], Built]] = {
    "unet": build_unet,
    "dit": build_dit,
    "vae": build_vae,
}
