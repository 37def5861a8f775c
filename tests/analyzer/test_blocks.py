"""Repeated blocks traced once (`fxlens.analyzer.capture.blocks`): the spliced graph is the full
export's, node for node; blocks that differ in any way are never merged; the model is left
as it was; the eager memory simulated alongside is the standalone one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxlens.analyzer.capture import chain
from fxlens.analyzer.capture.blocks import Group, Repeats, SpliceError, find_repeats
from fxlens.analyzer.capture.blocks_splice import splice
from fxlens.analyzer.core.graph import Node, NodeKind, TensorRef
from fxlens.analyzer.memory.measure import EagerAlongside, simulate_eager_memory
from tests.models import OWN_ZOO, tiny_gpt
from tests.models.diffusers_zoo import ZOO as DIFFUSERS_ZOO
from tests.models.hf_zoo import ZOO as HF_ZOO

ZOO = {**OWN_ZOO, **{f"hf-{k}": v for k, v in HF_ZOO.items()},
       **{f"diffusers-{k}": v for k, v in DIFFUSERS_ZOO.items()}}


def _split(inputs):
    return (tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else ((), dict(inputs))


def _both(module: nn.Module, inputs) -> tuple[Repeats, chain.Captured, chain.Captured]:
    args, kwargs = _split(inputs)
    repeats = find_repeats(module, args, kwargs)
    return (repeats, chain._export(module, args, kwargs, repeats),
            chain._export(module, args, kwargs, Repeats()))


def _assert_identical(spliced: chain.Captured, full: chain.Captured) -> None:
    assert len(spliced[0]) == len(full[0])
    for ours, theirs in zip(spliced[0], full[0], strict=True):
        assert ours == theirs, f"first difference at node {theirs.id}: {ours} != {theirs}"
    assert spliced[1] == full[1]


class Block(nn.Module):
    """A residual MLP block; `sliding` masks the hidden state with a band (an extra op on an
    outside tensor), `width` changes its weights' shapes."""

    def __init__(self, dim: int, width: int, sliding: bool = False) -> None:
        super().__init__()
        self.up, self.down, self.sliding = nn.Linear(dim, width), nn.Linear(width, dim), sliding

    def forward(self, x: torch.Tensor, band: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        h = x * (band if self.sliding else full)
        return x + self.down(F.gelu(self.up(h)))


class Stack(nn.Module):
    def __init__(self, blocks: list[Block]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        band, full = torch.tril(torch.ones_like(x)), torch.ones_like(x)
        for block in self.blocks:
            x = block(x, band, full)
        return x


def _groups(repeats: Repeats) -> list[tuple[str, ...]]:
    return [g.members for g in repeats.groups]


def test_identical_blocks_are_traced_once_and_spliced_as_a_full_export_would():
    model = Stack([Block(8, 16) for _ in range(4)])
    repeats, spliced, full = _both(model, (torch.randn(8, 8),))
    assert _groups(repeats) == [("blocks.0", "blocks.1", "blocks.2", "blocks.3")]
    _assert_identical(spliced, full)
    assert {n.module for n in spliced[0] if n.kind is NodeKind.CALL} >= {
        f"blocks.{i}.up" for i in range(4)}


def test_blocks_of_one_class_that_differ_are_never_merged():
    """A sliding-window flag (same weights, another mask read) and another width (other
    weight shapes) each make a block its own: only equal neighbours group."""
    model = Stack([Block(8, 16), Block(8, 16, sliding=True), Block(8, 32), Block(8, 16),
                   Block(8, 16, sliding=True)])
    repeats, spliced, full = _both(model, (torch.randn(8, 8),))
    assert _groups(repeats) == [("blocks.0", "blocks.3"), ("blocks.1", "blocks.4")]
    _assert_identical(spliced, full)


class StackByArgument(Stack):
    """Gemma's pattern: every block has the same code, and the caller hands alternate blocks
    another mask as an argument."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        band, full = torch.tril(torch.ones_like(x)), torch.ones_like(x)
        for i, block in enumerate(self.blocks):
            x = block(x, band, band) if i % 2 else block(x, full, full)
        return x


def test_blocks_given_other_inputs_are_one_group_and_each_copy_reads_its_own():
    repeats, spliced, full = _both(StackByArgument([Block(8, 16) for _ in range(4)]),
                                   (torch.randn(8, 8),))
    assert len(repeats.groups) == 1
    _assert_identical(spliced, full)
    muls = [n for n in spliced[0] if n.target == "aten.mul.Tensor"]
    assert [m.module for m in muls] == [f"blocks.{i}" for i in range(4)]
    assert muls[0].args["other"] != muls[1].args["other"]      # full, then band
    assert muls[0].args["other"] == muls[2].args["other"]


class Cache:
    """Not a pytree: blocks share it as one object and append to it, a Python side effect."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class Caching(Block):
    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        cache.keys.append(self.up(x))
        return x + self.down(F.gelu(cache.keys[-1]))


class CachingStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Caching(8, 8) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = Cache()
        for block in self.blocks:
            x = block(x, cache)
        return (x, *cache.keys)


def test_a_side_effect_reaching_the_outputs_sends_the_capture_to_a_full_export():
    """The blocks are alike, so they group; stood in for, they append nothing, the outputs
    come out short, and the capture exports every block instead."""
    model, x = CachingStack(), torch.randn(4, 8)
    repeats = find_repeats(model, (x,), {})
    assert len(repeats.groups) == 1
    with pytest.raises(SpliceError, match="returns 2 tensors"):
        chain._export(model, (x,), {}, repeats)
    full = chain._export(model, (x,), {}, Repeats())
    assert len(full[1]) == 4
    _assert_identical(chain._by_export(model, (x,), {}, registry=None), full)


class ReturnsItself(Block):
    """XLNet's pattern: every block gets the same position tensor and calls a ``to`` that
    changes nothing, so it returns the tensor itself."""

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x * r.to(self.up.weight.dtype))))


class SharedPosition(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([ReturnsItself(8, 8) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = torch.ones_like(x)
        for block in self.blocks:
            x = block(x, r)
        return x


def test_a_shared_input_a_block_returns_unchanged_sends_the_capture_to_a_full_export():
    """A full export maps the shared tensor to the first block's ``to`` node, so the next
    blocks read that node: not what a copy of the first block would read."""
    model, x = SharedPosition(), torch.randn(4, 8)
    repeats = find_repeats(model, (x,), {})
    assert len(repeats.groups) == 1
    with pytest.raises(SpliceError, match="read after the block"):
        chain._export(model, (x,), {}, repeats)
    _assert_identical(chain._by_export(model, (x,), {}, registry=None),
                      chain._export(model, (x,), {}, Repeats()))


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)                         # writes to its input: a caller-visible effect
        return self.proj(x)


class Reused(nn.Module):
    """One block called twice, and blocks that write to their input: neither is one
    block's trace to copy."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.ModuleList([Block(8, 8), Block(8, 8)])
        self.writers = nn.ModuleList([InPlace(), InPlace()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        one = torch.ones_like(x)
        x = self.shared[0](self.shared[0](x, one, one), one, one)
        x = self.shared[1](x, one, one)
        for block in self.writers:
            x = block(x.clone())
        return x


def test_blocks_called_twice_or_writing_to_their_inputs_are_traced_as_usual():
    repeats, spliced, full = _both(Reused(), (torch.randn(4, 8),))
    assert repeats.groups == ()
    _assert_identical(spliced, full)


def test_the_model_is_left_as_it_was():
    model, inputs = tiny_gpt.build()
    before = {p: dict(m.__dict__) for p, m in model.named_modules()}
    repeats, spliced, full = _both(model, inputs)
    assert len(repeats.groups) == 1
    _assert_identical(spliced, full)
    after = {p: dict(m.__dict__) for p, m in model.named_modules()}
    assert after.keys() == before.keys()
    for path in before:
        assert after[path].keys() == before[path].keys(), path
        assert "forward" not in after[path]


def test_the_eager_peak_simulated_alongside_is_the_standalone_one():
    model, inputs = tiny_gpt.build()
    ride = EagerAlongside()
    args, kwargs = _split(inputs)
    assert find_repeats(model, args, kwargs, ride).groups
    alone = simulate_eager_memory(model, inputs)
    assert ride.result is not None
    assert (ride.result.peak_bytes, ride.result.timeline) == (alone.peak_bytes, alone.timeline)


def test_a_lifted_constant_inside_the_representative_is_refused():
    """The splice cannot invent a placeholder a full export would lift per block."""
    nodes = [
        Node(0, NodeKind.BUFFER, "lifted_tensor_0", {}, ()),
        Node(1, NodeKind.INPUT, "x", {}, ()),
        Node(2, NodeKind.CALL, "fxlens_blocks.enter.default",
             {"xs": [TensorRef(1)], "block": 0}, ()),
        Node(3, NodeKind.CALL, "aten.mul.Tensor",
             {"self": TensorRef(2), "other": TensorRef(0)}, (), module="blocks.0"),
        Node(4, NodeKind.CALL, "fxlens_blocks.exit.default",
             {"xs": [TensorRef(3)], "block": 0}, ()),
        Node(5, NodeKind.CALL, "fxlens_blocks.stand_in.default",
             {"xs": [TensorRef(4)], "block": 0, "member": 1}, ()),
    ]
    repeats = Repeats((Group(("blocks.0", "blocks.1"), None, ()),))
    with pytest.raises(SpliceError, match="lifted_tensor_0"):
        splice(nodes, [TensorRef(5)], repeats, weights=set())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_zoo_architecture_splices_to_its_full_export(name):
    """Where export refuses the model (value-dependent control flow), it refuses the spliced
    trace too, and the capture chain moves on as before."""
    model, inputs = ZOO[name]()
    args, kwargs = _split(inputs)
    try:
        full = chain._export(model, args, kwargs, Repeats())
    except Exception as refused:
        with pytest.raises(type(refused)):
            chain._export(model, args, kwargs, find_repeats(model, args, kwargs))
        return
    spliced = chain._export(model, args, kwargs, find_repeats(model, args, kwargs))
    _assert_identical(spliced, full)


# Architectures beyond the zoo, tiny configs with random weights: where the splice met what
# the zoo did not (XLNet hands every layer one position tensor that each returns unchanged).
def _text(config: str, model: str, **sizes):
    import transformers

    base = dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                intermediate_size=64, use_cache=False)
    built = getattr(transformers, model)(getattr(transformers, config)(**{**base, **sizes}))
    return built.eval(), {"input_ids": torch.randint(0, 100, (2, 16), generator=_generator())}


def _vision(config: str, model: str, **sizes):
    import transformers

    built = getattr(transformers, model)(getattr(transformers, config)(**sizes))
    return built.eval(), {"pixel_values": torch.randn(2, 3, 32, 32, generator=_generator())}


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


BEYOND_THE_ZOO = {
    "xlnet": lambda: _text("XLNetConfig", "XLNetModel", d_model=32, n_layer=3, n_head=4,
                           d_inner=64),
    "gptj": lambda: _text("GPTJConfig", "GPTJModel", n_embd=32, n_layer=3, n_head=4,
                          rotary_dim=4),
    "bloom": lambda: _text("BloomConfig", "BloomModel", n_layer=3, n_head=4),
    "roberta": lambda: _text("RobertaConfig", "RobertaModel"),
    "electra": lambda: _text("ElectraConfig", "ElectraModel", embedding_size=32),
    "albert": lambda: _text("AlbertConfig", "AlbertModel", embedding_size=16),
    "clip_text": lambda: _text("CLIPTextConfig", "CLIPTextModel"),
    "mpt": lambda: _text("MptConfig", "MptModel", d_model=32, n_layers=3, n_heads=4),
    "gemma2": lambda: _text("Gemma2Config", "Gemma2Model", num_key_value_heads=2, head_dim=8,
                            sliding_window=4, num_hidden_layers=4),
    "olmo": lambda: _text("OlmoConfig", "OlmoModel"),
    "granite": lambda: _text("GraniteConfig", "GraniteModel"),
    "codegen": lambda: _text("CodeGenConfig", "CodeGenModel", n_embd=32, n_layer=3, n_head=4,
                             rotary_dim=4),
    "biogpt": lambda: _text("BioGptConfig", "BioGptModel"),
    "qwen2_moe": lambda: _text("Qwen2MoeConfig", "Qwen2MoeModel", num_key_value_heads=2,
                               moe_intermediate_size=16, shared_expert_intermediate_size=32,
                               num_experts=4, num_experts_per_tok=2),
    "phi": lambda: _text("PhiConfig", "PhiModel"),
    "starcoder2": lambda: _text("Starcoder2Config", "Starcoder2Model", num_key_value_heads=2),
    "cohere": lambda: _text("CohereConfig", "CohereModel", num_key_value_heads=2),
    "mobilebert": lambda: _text("MobileBertConfig", "MobileBertModel", embedding_size=16,
                                intra_bottleneck_size=16, true_hidden_size=16,
                                num_feedforward_networks=2),
    "swin": lambda: _vision("SwinConfig", "SwinModel", image_size=32, patch_size=2,
                            embed_dim=16, depths=[2, 4], num_heads=[2, 4], window_size=4),
    "dinov2": lambda: _vision("Dinov2Config", "Dinov2Model", image_size=32, patch_size=8,
                              hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                              intermediate_size=64),
    "beit": lambda: _vision("BeitConfig", "BeitModel", image_size=32, patch_size=8,
                            hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                            intermediate_size=64, use_relative_position_bias=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BEYOND_THE_ZOO))
def test_architectures_beyond_the_zoo_capture_as_their_full_export(name):
    model, inputs = BEYOND_THE_ZOO[name]()
    full = chain._export(model, (), inputs, Repeats())
    _assert_identical(chain._by_export(model, (), inputs, registry=None), full)
