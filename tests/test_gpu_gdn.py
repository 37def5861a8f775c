"""`bench/gpu/gdn.py`: flash-linear-attention's delta-rule kernels timed on a GPU, kernel by
kernel. On the CPU (no Triton, no FLA) every case says why it was not measured; FLA's own
kernels are told from PyTorch's in a kernel table; and the committed H200 run stays within
what fxlens's rule (roofline plus the state kernels' serial steps) says of it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.gpu import gdn

RUN = Path(__file__).resolve().parent.parent / "bench/gpu/runs/gdn-h200-2026-11-29.json"


def test_without_the_library_every_case_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gdn, "CASES", tuple(replace(c, tokens=64, sequences=1)
                                            for c in gdn.CASES[:2]))
    rows = gdn.measure(torch.device("cpu"), warmup=0, repeat=1)
    assert [r["name"] for r in rows] == [c.name for c in gdn.CASES]
    assert all("error" in r and "forward_s" not in r for r in rows)


def test_inputs_pack_several_sequences_into_one_row_as_vllm_did() -> None:
    case = gdn.GDNCase("x", "gdn", 4, 128, 2, 8, varlen=True, backward=True)
    tensors = gdn.inputs(case, torch.device("cpu"))
    assert tensors["v"].shape == (1, 512, 8, gdn.HEAD_DIM)
    assert tensors["cu_seqlens"].tolist() == [0, 128, 256, 384, 512]
    assert (tensors["g"] < 0).all() and tensors["q"].requires_grad
    per_channel = gdn.inputs(replace(case, kind="kda", varlen=False), torch.device("cpu"))
    assert per_channel["g"].shape == (4, 128, 8, gdn.HEAD_DIM)


def test_fla_kernels_are_told_from_pytorchs() -> None:
    row = {"forward_kernels": [{"kernel": "chunk_fwd_kernel_o", "us_per_step": 30.0},
                               {"kernel": "void at::native::FillFunctor<>", "us_per_step": 5.0}],
           "step_kernels": [{"kernel": "chunk_fwd_kernel_o", "us_per_step": 30.0},
                            {"kernel": "chunk_bwd_kernel_dqkwg", "us_per_step": 50.0},
                            {"kernel": "Memcpy DtoD (Device -> Device)", "us_per_step": 9.0}]}
    assert gdn.kernel_seconds(row) == pytest.approx({"forward_s": 30e-6, "backward_s": 50e-6})
    assert math.isnan(gdn.kernel_seconds({})["forward_s"])


def test_the_h200_run_is_within_what_fxlens_says_of_it(tmp_path: Path) -> None:
    """FLA's kernels on an H200 against the rule on the ``h200`` entry: forward within
    0.9–1.35× from 2,048 tokens a sequence (at 1,024 a fixed ~18 µs kernel dominates),
    backward 1.2–1.45× (the gradient kernels' work runs below the roofline)."""
    result = json.loads(RUN.read_text())
    measured = [row for row in result["rows"] if "error" not in row]
    assert len(measured) == 11
    for row in measured:
        row["predicted"] = gdn.predict(row, "h200")
        kernels = gdn.kernel_seconds(row)
        if row["tokens"] >= 2048:
            assert 0.9 < kernels["forward_s"] / row["predicted"]["forward_s"] < 1.35, row["name"]
        if row["backward"]:
            assert 1.2 < kernels["backward_s"] / row["predicted"]["backward_s"] < 1.45
    table = gdn.table(result)
    assert table.count("\n") == len(result["rows"]) + 1
    assert "| qwen3-next rank 4×4096 |" in table and "not measured" in table


def test_the_harness_times_forward_and_backward_with_a_stand_in_library(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The timing path as the GPU runs it, on the CPU, with a stand-in for FLA's modules (the
    call's keywords as FLA takes them, a differentiable output of v's shape): a forward time
    for every case and a backward one for the trained cases; FLA's Hopper guard lifted."""
    import sys
    import types

    def rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor, use_qk_l2norm_in_kernel: bool = False,
             cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        assert use_qk_l2norm_in_kernel
        groups = v.shape[2] // k.shape[2]
        scores = (q * k).sum(-1).repeat_interleave(groups, dim=2)
        decay = g if g.dim() == 3 else g.mean(-1)
        return v * (scores * beta.float() * decay.exp()).unsqueeze(-1).to(v.dtype), None

    chunk_o = types.ModuleType("fla.ops.common.chunk_o")
    chunk_o.TRITON_ABOVE_3_7_1 = False  # type: ignore[attr-defined]
    modules = {"fla": types.ModuleType("fla"), "fla.ops": types.ModuleType("fla.ops"),
               "fla.ops.common": types.ModuleType("fla.ops.common"),
               "fla.ops.common.chunk_o": chunk_o,
               "fla.ops.gated_delta_rule": types.ModuleType("fla.ops.gated_delta_rule"),
               "fla.ops.kda": types.ModuleType("fla.ops.kda")}
    modules["fla.ops.gated_delta_rule"].chunk_gated_delta_rule = rule  # type: ignore[attr-defined]
    modules["fla.ops.kda"].chunk_kda = rule  # type: ignore[attr-defined]
    modules["fla.ops.common"].chunk_o = chunk_o  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    cases = (gdn.GDNCase("packed", "gdn", 2, 64, 2, 4, "float32", varlen=True),
             gdn.GDNCase("trained", "gdn", 2, 64, 2, 4, "float32", backward=True),
             gdn.GDNCase("per channel", "kda", 1, 64, 2, 2, "float32", backward=True))
    monkeypatch.setattr(gdn, "CASES", cases)
    rows = gdn.measure(torch.device("cpu"), warmup=0, repeat=2)
    assert all("error" not in r and r["forward_s"] > 0 for r in rows), rows
    assert ["backward_s" in r for r in rows] == [False, True, True]
    assert chunk_o.TRITON_ABOVE_3_7_1


def test_the_hopper_step_and_the_backward_steps_are_the_h200_runs() -> None:
    """From the committed H200 run: FLA's forward state kernel (``fwd_h``) took 1.17–1.27 µs
    per chunk per wave of programs (sequences × value heads × 4 over 132 SMs) in every
    single-sequence row from 2k tokens and both Qwen3-Next rows; ``bwd_dhu`` 1.85 of those.
    The Hopper entries' `recurrence_step_s` and the rule's backward steps are those."""
    from fxlens.rules import gdn as rule
    from fxlens.rules.hardware import DEVICES

    rows = [r for r in json.loads(RUN.read_text())["rows"]
            if "forward_kernels" in r and not r["varlen"] and r["tokens"] >= 2048]
    per_step, ratios = [], []
    for row in rows:
        chunks = math.ceil(row["tokens"] / 64)
        waves = math.ceil(row["sequences"] * row["heads"] * 4 / 132)
        forward = {k["kernel"]: k["us_per_step"] for k in row["forward_kernels"]}
        per_step.append(forward["chunk_gated_delta_rule_fwd_kernel_h_blockdim64"]
                        / chunks / waves)
        if row["backward"]:
            step = {k["kernel"]: k["us_per_step"] for k in row["step_kernels"]}
            ratios.append(step["chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64"]
                          / forward["chunk_gated_delta_rule_fwd_kernel_h_blockdim64"])
    assert len(per_step) == 8 and len(ratios) == 2
    assert min(per_step) > 1.15 and max(per_step) < 1.3
    for name in ("h100", "h200"):
        assert min(per_step) <= DEVICES[name].recurrence_step_s * 1e6 <= max(per_step)
    backward = rule.BACKWARD_STEPS - 1
    assert backward == pytest.approx(sum(ratios) / len(ratios), rel=0.03)
