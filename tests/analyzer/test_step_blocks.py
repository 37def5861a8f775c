"""Repeated blocks of the training step recorded once (`fxlens.analyzer.capture.step_blocks`):
the step recorded with stand-ins is the full recording, node for node, saved tensor for saved
tensor and gradient for gradient; blocks that differ, share an input that needs grad, are
recomputed or hand their outputs to more than the next block are recorded as usual."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from fxlens.analyzer.capture.training import TrainingGraph, capture_training
from fxlens.rules import load_rules
from tests.analyzer.test_blocks import BEYOND_THE_ZOO
from tests.models import OWN_ZOO
from tests.models.diffusers_zoo import ZOO as DIFFUSERS_ZOO
from tests.models.hf_zoo import ZOO as HF_ZOO

ZOO = {**OWN_ZOO, **{f"hf-{k}": v for k, v in HF_ZOO.items()},
       **{f"diffusers-{k}": v for k, v in DIFFUSERS_ZOO.items()},
       **{f"beyond-{k}": v for k, v in BEYOND_THE_ZOO.items()}}
COPIED = "the step's backward of"


def _both(module: nn.Module, inputs, caplog) -> tuple[TrainingGraph, TrainingGraph, int]:
    """The step with stand-ins, without, and how many blocks were copied."""
    registry = load_rules()
    with caplog.at_level(logging.INFO, logger="fxlens.analyzer.capture"):
        caplog.clear()
        ours = capture_training(module, inputs, registry)
        copied = [r.args[0] for r in caplog.records if r.getMessage().startswith(COPIED)]
    return ours, capture_training(module, inputs, registry, stand_ins=False), sum(copied)


def _assert_identical(ours: TrainingGraph, full: TrainingGraph) -> None:
    assert len(ours.graph.nodes) == len(full.graph.nodes)
    for mine, theirs in zip(ours.graph.nodes, full.graph.nodes, strict=True):
        assert mine == theirs, f"first difference at node {theirs.id}: {mine} != {theirs}"
    assert ours.saved == full.saved
    assert list(ours.graph.roles.items()) == list(full.graph.roles.items())


class Block(nn.Module):
    """A residual MLP block; `sliding` masks with a band, `width` changes its weights."""

    def __init__(self, dim: int, width: int, sliding: bool = False) -> None:
        super().__init__()
        self.norm, self.sliding = nn.LayerNorm(dim), sliding
        self.up, self.down = nn.Linear(dim, width), nn.Linear(width, dim)

    def forward(self, x: torch.Tensor, band: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        h = self.norm(x) * (band if self.sliding else full)
        return x + self.down(F.gelu(self.up(h)))


class Stack(nn.Module):
    """Blocks after a stem (without it the first block's input needs no grad), then a head;
    `keep` returns every block's output too, `recompute` checkpoints each block, `write`
    adds into each block's output in place."""

    def __init__(self, blocks: list[nn.Module], keep: bool = False, recompute: bool = False,
                 stem: bool = True, write: bool = False) -> None:
        super().__init__()
        self.blocks, self.keep, self.recompute = nn.ModuleList(blocks), keep, recompute
        self.write = write
        self.stem = nn.Linear(8, 8) if stem else nn.Identity()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        band, full = torch.tril(torch.ones(8, 8)), torch.ones(8, 8)
        x = self.stem(x)
        kept = []
        for block in self.blocks:
            x = (checkpoint(block, x, band, full, use_reentrant=False) if self.recompute
                 else block(x, band, full))
            if self.write:
                x += 1
            kept.append(x)
        return (self.head(x), *kept) if self.keep else (self.head(x),)


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(4, 8, 8),)


def test_identical_blocks_are_recorded_once_and_copied_as_the_full_recording(caplog):
    ours, full, copied = _both(Stack([Block(8, 16) for _ in range(4)]), _inputs(), caplog)
    assert copied == 2            # blocks.2 and blocks.3, of blocks.1; blocks.0 runs as it is
    _assert_identical(ours, full)
    gradients = {ours.graph.nodes[r.node].module for r in ours.graph.roles}
    assert {f"blocks.{i}.up" for i in range(4)} <= gradients


def test_a_first_block_whose_input_needs_no_grad_is_not_the_one_copied(caplog):
    ours, full, copied = _both(Stack([Block(8, 16) for _ in range(4)], stem=False),
                               _inputs(), caplog)
    assert copied == 2            # blocks.2 and blocks.3, of blocks.1 (whose input does)
    _assert_identical(ours, full)


def test_blocks_that_differ_are_never_copied_from_each_other(caplog):
    """A sliding-window flag (another op on another outside tensor) and another width; the
    sliding block is recorded in full, and so is the next plain one, which it does not match."""
    blocks = [Block(8, 16), Block(8, 16, sliding=True), Block(8, 16), Block(8, 32),
              Block(8, 16, sliding=True), Block(8, 16)]
    ours, full, copied = _both(Stack(blocks), _inputs(), caplog)
    assert copied == 2            # blocks.4 of blocks.1, blocks.5 of blocks.2
    _assert_identical(ours, full)


class Normed(nn.Module):
    """BatchNorm in train mode writes its statistics, the block's own buffers, in place."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = nn.BatchNorm1d(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, band: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


def test_blocks_writing_their_own_batchnorm_statistics_are_copied(caplog):
    ours, full, copied = _both(Stack([Normed() for _ in range(4)]), _inputs(), caplog)
    assert copied == 2
    _assert_identical(ours, full)
    written = [n for n in ours.graph.nodes if n.target == "aten.add_.Tensor"
               and n.module.endswith(".norm")]
    assert {n.module for n in written} == {f"blocks.{i}.norm" for i in range(4)}


def test_a_caller_writing_into_a_blocks_output_keeps_the_copies(caplog):
    """ResNet's ``hidden_state += residual`` on what a block returned."""
    ours, full, copied = _both(Stack([Block(8, 16) for _ in range(4)], write=True),
                               _inputs(), caplog)
    assert copied == 2
    _assert_identical(ours, full)


class Assembled(nn.Module):
    """DeepSeek-V3's MLA keys: a new tensor filled through two views of it, in place; with
    grad on, autograd replays each view after its write (ops a block run with grad off
    never records)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, band: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        keys = x.new_empty(*x.shape[:-1], 8)
        keys[..., :4].copy_(self.a(x))
        keys[..., 4:].copy_(self.b(x))
        return x + keys


def test_blocks_writing_into_views_of_their_own_tensors_are_copied(caplog):
    ours, full, copied = _both(Stack([Assembled() for _ in range(4)]), _inputs(), caplog)
    assert copied == 2
    _assert_identical(ours, full)


class Heads(nn.Module):
    """Blocks side by side on the input itself, which needs no grad: only their weights do."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(8, 16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        band, full = torch.tril(torch.ones(8, 8)), torch.ones(8, 8)
        return sum(block(x, band, full) for block in self.blocks)


@pytest.mark.slow
def test_blocks_whose_inputs_need_no_grad_are_recorded_in_full(caplog):
    ours, full, copied = _both(Heads(), _inputs(), caplog)
    assert copied == 0
    _assert_identical(ours, full)


class Routed(nn.Module):
    """Each block takes a path chosen on data: every member differs from the first."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, band: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        return x + self.up(self.norm(x))[..., : int(x.sum().item()) % 4 + 1].sum(-1, True)


def test_blocks_on_paths_chosen_on_data_are_recorded_as_usual(caplog):
    ours, full, copied = _both(Stack([Routed() for _ in range(6)]), _inputs(), caplog)
    assert copied == 0
    _assert_identical(ours, full)


def test_frozen_blocks_are_another_group(caplog):
    blocks = [Block(8, 16) for _ in range(4)]
    for p in blocks[2].parameters():
        p.requires_grad_(False)
    ours, full, copied = _both(Stack(blocks), _inputs(), caplog)
    assert copied == 1            # blocks.3 of blocks.1
    _assert_identical(ours, full)
    assert not any(ours.graph.nodes[r.node].module.startswith("blocks.2")
                   for r in ours.graph.roles)


class Shared(nn.Module):
    """Each block reads a bias the model computes once from a weight (T5's position bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(8))
        self.blocks = nn.ModuleList(Block(8, 16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.bias * 2
        for block in self.blocks:
            x = block(x, shared, shared)
        return x


def test_blocks_sharing_an_input_needing_grad_run_as_they_are(caplog):
    ours, full, copied = _both(Shared(), _inputs(), caplog)
    assert copied == 0 and "failed" not in caplog.text
    _assert_identical(ours, full)


class EncoderDecoder(nn.Module):
    """Every decoder block reads the encoder's output (its memory); the encoder's blocks
    share nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.embed = nn.Linear(8, 8), nn.Linear(8, 8)
        self.encoder = nn.ModuleList(Block(8, 16) for _ in range(4))
        self.decoder = nn.ModuleList(Block(8, 16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        band = torch.tril(torch.ones(8, 8))
        memory = self.stem(x)
        for block in self.encoder:
            memory = block(memory, band, torch.ones(8, 8))
        y = self.embed(x)
        for block in self.decoder:
            y = block(y, band, memory)
        return y


def test_an_encoder_is_copied_beside_a_decoder_reading_its_memory(caplog):
    ours, full, copied = _both(EncoderDecoder(), _inputs(), caplog)
    assert copied == 2 and "failed" not in caplog.text    # encoder.2 and encoder.3
    _assert_identical(ours, full)


@pytest.mark.parametrize("stack", [Stack([Block(8, 16) for _ in range(3)], keep=True),
                                   Stack([Block(8, 16) for _ in range(3)], recompute=True)],
                         ids=["outputs-kept", "checkpointed"])
def test_steps_the_stand_ins_cannot_give_are_recorded_in_full(caplog, stack):
    """Every block's output is also a model output (gradients summed where a stand-in's
    arrive), or activation checkpointing runs each block again in the backward."""
    ours, full, _ = _both(stack, _inputs(), caplog)
    _assert_identical(ours, full)


def test_a_module_backward_hook_turns_the_stand_ins_off(caplog):
    seen: list[tuple[int, ...]] = []
    model = Stack([Block(8, 16) for _ in range(3)])
    model.blocks[1].register_full_backward_hook(
        lambda module, grad_in, grad_out: seen.append(tuple(grad_out[0].shape)))
    ours, full, copied = _both(model, _inputs(), caplog)
    assert copied == 0 and seen == [(4, 8, 8)] * 2
    _assert_identical(ours, full)


def test_the_model_is_left_as_it_was():
    model = Stack([Block(8, 16) for _ in range(3)])
    before = {n: dict(vars(m)) for n, m in model.named_modules()}
    capture_training(model, _inputs(), load_rules())
    assert {n: dict(vars(m)) for n, m in model.named_modules()} == before
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_zoo_architecture_records_its_full_step(name, caplog):
    """After one recording to warm fake tensors' dispatch cache: the first call of LSTM's
    fused backward hands one tensor back as both bias gradients, a cached call two."""
    module, inputs = ZOO[name]()
    capture_training(module, inputs, load_rules(), stand_ins=False)
    ours, full, _ = _both(module, inputs, caplog)
    _assert_identical(ours, full)


@pytest.mark.parametrize(("model", "stand_ins"), [
    ("tiny_gpt", True), ("tiny_gpt", False),
    pytest.param("hf-rwkv", True, marks=pytest.mark.slow)])   # its tensors keep the pack hook
def test_a_recorded_step_is_freed_once_dropped(model: str, stand_ins: bool) -> None:
    """Nothing of a recording outlives it: its hooks and autograd contexts hold the recorder
    weakly (held strongly, a cycle through autograd's C++ kept every step a process recorded)."""
    import gc

    from fxlens.analyzer.capture.load import load
    from fxlens.analyzer.core.graph import Node

    def nodes() -> int:
        gc.collect()
        return sum(type(o) is Node for o in gc.get_objects())

    if model in ZOO:
        module, inputs = ZOO[model]()
    else:
        loaded = load(str(Path(__file__).parents[1] / "models" / f"{model}.py"))
        module, inputs = loaded.module, loaded.inputs
    before = nodes()
    step = capture_training(module, inputs, load_rules(), stand_ins=stand_ins)
    assert len(step.graph.nodes) > 100
    del step
    assert nodes() == before
