"""The test zoo itself: every build() runs eagerly and deterministically, and the models meant
to defeat tracers really do."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.flop_counter import FlopCounterMode

from tests.models import OWN_ZOO, branchy, tiny_gpt

try:
    from tests.models.hf_zoo import ZOO as HF_ZOO
except ImportError:  # transformers is an optional extra: our own zoo is tested without it
    HF_ZOO = {}
try:
    from tests.models.diffusers_zoo import ZOO as DIFFUSERS_ZOO
except ImportError:  # so is diffusers
    DIFFUSERS_ZOO = {}


def run(build: Callable[[], tuple[Any, Any]]) -> Any:
    module, inputs = build()
    with torch.no_grad():
        return module(*inputs) if isinstance(inputs, tuple) else module(**inputs)


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nested output (tensors, tuples, lists, dicts, ModelOutputs)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (tuple, list)):
            stack.extend(item)


ALL_BUILDS = {**OWN_ZOO, **{f"hf_{name}": build for name, build in HF_ZOO.items()},
              **{f"diffusers_{name}": build for name, build in DIFFUSERS_ZOO.items()}}


@pytest.mark.parametrize("name", sorted(ALL_BUILDS))
def test_build_runs_eagerly_with_finite_outputs(name: str) -> None:
    outputs = list(tensors(run(ALL_BUILDS[name])))
    assert outputs, f"{name} returned no tensors"
    for out in outputs:
        if out.is_floating_point():
            assert torch.isfinite(out).all(), f"{name}: non-finite output {tuple(out.shape)}"


@pytest.mark.parametrize("name", sorted(ALL_BUILDS))
def test_build_is_deterministic(name: str) -> None:
    first, second = list(tensors(run(ALL_BUILDS[name]))), list(tensors(run(ALL_BUILDS[name])))
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b), f"{name}: two builds gave different outputs"


def test_own_builds_take_dict_and_tuple_inputs() -> None:
    kinds = {name: type(build()[1]) for name, build in OWN_ZOO.items()}
    assert kinds.pop("dict_io") is dict
    assert set(kinds.values()) == {tuple}
    assert isinstance(run(OWN_ZOO["dict_io"]), dict)


def test_branchy_defeats_torch_export() -> None:
    module, inputs = branchy.build()
    with pytest.raises(RuntimeError, match="data-dependent"):
        torch.export.export(module, inputs, strict=False)


def test_branchy_defeats_make_fx_on_fake_tensors() -> None:
    module, inputs = branchy.build()
    params = dict(module.named_parameters())

    def forward(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, params, (x,))

    with pytest.raises(RuntimeError, match="data-dependent"):
        make_fx(forward, tracing_mode="fake")(params, *inputs)


def test_branchy_routes_tokens_to_every_expert() -> None:
    module, inputs = branchy.build()
    seen: list[torch.Tensor] = []
    module.moe.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    with torch.no_grad():
        module(*inputs)
        _, chosen = module.moe.router(seen[0]).topk(module.moe.top_k, dim=-1)
    assert set(chosen.flatten().tolist()) == set(range(len(module.moe.experts)))


def test_tiny_gpt_closed_form_matches_flop_counter_on_matmuls() -> None:
    """FlopCounterMode counts the GEMMs exactly (it counts 0 for the CPU flash SDPA kernel)."""
    cfg = {"batch": 3, "n_layer": 3, "n_head": 2, "d_model": 32, "seq_len": 8, "vocab": 100}
    module, inputs = tiny_gpt.build(**cfg)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(*inputs)
    counts = counter.get_flop_counts()["Global"]
    gemm = sum(v for op, v in counts.items() if str(op) in {"aten.mm", "aten.addmm"})
    assert gemm == tiny_gpt.closed_form_flops(**cfg).linear_flops


@pytest.mark.skipif(not HF_ZOO or not DIFFUSERS_ZOO, reason="needs transformers and diffusers")
def test_zoo_of_architectures_by_others_spans_thirty() -> None:
    """Issue 19: at least 30 architectures written by others, each with a distinct build."""
    builds = [*HF_ZOO.values(), *DIFFUSERS_ZOO.values()]
    assert len(set(builds)) == len(builds) >= 30
