"""Per-op ground truth for the peer benchmark, from fxlens's captured graph of each zoo model.

    .venv/bin/python bench/peers/truth.py hf-gpt2      # one JSON line

The basis every tool is compared on ("GEMM + conv + dense attention", 2 FLOPs per
multiply-add, biases, softmax and elementwise work excluded):
- GEMMs (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``, ``mv``…): fxlens's
  per-op count, ``2·M·K·N`` (bias adds not counted, as FlopCounterMode);
- grouped GEMMs (``_grouped_mm``, transformers' ``grouped_mm_fallback``: MoE experts): fxlens's
  count, i.e. only the tokens routed to each expert;
- convolutions: fxlens's count, ``2·N·C_out·H_out·W_out·(C_in/groups)·k``;
- recurrent layers kept whole (``aten.lstm``/``gru``/``rnn_*``): their GEMMs only,
  ``2·tokens·Σ numel(weight matrices)``;
- attention (every SDPA variant): the two GEMMs over the **dense** ``T_q × T_k`` square,
  ``2·BH·T_q·T_k·(d_qk + d_v)``, even when causal (what the peers that count it count; fxlens's
  own figure counts only the causal triangle and adds softmax).
Each basis FLOP is labelled by category and the innermost module's type ("GEMM in Linear",
"GEMM in Conv1D", "SDPA", "grouped GEMM"…), so the harness can say which ops a tool missed.
``fxlens_total`` is fxlens's own total (elementwise, norms, softmax, causal attention).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.peers.zoo import load_case  # noqa: E402
from fxlens.analyzer.capture.chain import capture  # noqa: E402
from fxlens.analyzer.core.costs import OpCall  # noqa: E402
from fxlens.analyzer.core.graph import Node  # noqa: E402
from fxlens.analyzer.cost.engine import analyze  # noqa: E402
from fxlens.rules import load_rules  # noqa: E402

GEMM = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "dot", "vdot", "mv", "linear",
        "addmv", "_scaled_mm"}
GROUPED = {"_grouped_mm", "grouped_mm_fallback"}
CONV = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d"}
RNN = {"lstm", "gru", "rnn_tanh", "rnn_relu"}
ATTENTION = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_attention_math"}


def op_name(target: str) -> str:
    """``aten.addmm.default`` → ``addmm``; ``transformers.grouped_mm_fallback.default`` too."""
    parts = target.split(".")
    return parts[1] if len(parts) > 1 else target


def dense_attention_flops(call: OpCall) -> int:
    q, k, v = call.shape("query"), call.shape("key"), call.shape("value")
    bh = 1
    for size in q[:-2]:
        bh *= size
    return 2 * bh * q[-2] * k[-2] * (q[-1] + v[-1])


def basis(node: Node, call: OpCall, fxlens_flops: int) -> tuple[str, int] | None:
    """(category, basis FLOPs) of a node on the basis, or None for everything else."""
    name, owner = op_name(node.target), node.module_type.rsplit(".", 1)[-1] or "model"
    if name in GEMM:
        return f"GEMM in {owner}", fxlens_flops
    if name in GROUPED:
        return "grouped GEMM", fxlens_flops
    if name in CONV:
        return "conv", fxlens_flops
    if name in ATTENTION:
        return "SDPA", dense_attention_flops(call)
    if name in RNN:
        x = call.tensor("input") if call.has("input") else call.tensor("data")
        tokens = 1
        for size in x.shape[:-1]:
            tokens *= size
        matrices = sum(p.numel for p in call.tensors("params") if len(p.shape) == 2)
        return f"RNN ({name})", 2 * tokens * matrices
    return None


def truth(case: str) -> dict[str, Any]:
    module, args, kwargs = load_case(case)
    registry = load_rules()
    graph = capture(module, kwargs or args, registry)
    report = analyze(graph, registry, case, case)
    flops = {n.id: n.flops for n in report.nodes}
    categories: dict[str, int] = {}
    fxlens_basis = 0
    for node in graph.nodes:
        if node.id not in flops:
            continue
        found = basis(node, OpCall(node, graph), flops[node.id])
        if found is not None:
            categories[found[0]] = categories.get(found[0], 0) + found[1]
            fxlens_basis += flops[node.id]
    return {"case": case, "basis": sum(categories.values()), "categories": categories,
            "fxlens_total": report.totals.flops, "fxlens_basis_ops": fxlens_basis,
            "other_ops": report.totals.flops - fxlens_basis,
            "capture_method": graph.capture_method, "coverage": report.coverage.ratio}


if __name__ == "__main__":
    print(json.dumps(truth(sys.argv[1])))
