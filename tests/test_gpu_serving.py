"""`bench/gpu/serving.py` on the CPU at shrunk sizes: every case builds, is timed, is predicted
by fxlens on fake tensors (kernels only, no host launches) and lands in the Markdown table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.gpu import serving

KEEP = ("experts", "heads", "kv_heads", "qk_dim", "v_dim")


def small(case: serving.ServingCase) -> serving.ServingCase:
    return replace(case, sizes={k: v if k in KEEP else max(4, v // 32)
                                for k, v in case.sizes.items()})


@pytest.mark.slow
def test_every_case_measures_predicts_and_tabulates(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(serving, "CASES", tuple(small(c) for c in serving.CASES))
    rows = serving.measure(torch.device("cpu"), inner=1, repeat=1)
    assert [r["name"] for r in rows] == [c.name for c in serving.CASES]
    for row in rows:
        assert "error" not in row, row
        assert row["seconds"] > 0 and row["bytes_per_s"] > 0
        row["predicted"] = serving.predict(serving.ServingCase(row["name"], row["kind"],
                                                               row["sizes"]), "h100")
        assert row["predicted"] > 0
    (tmp_path / "serving.json").write_text(json.dumps({"device": "cpu", "rows": rows}))
    table = serving.table(json.loads((tmp_path / "serving.json").read_text()))
    assert table.count("\n") == len(rows) + 1 and "| linear 70b tp4 qkv, M 1 |" in table


def test_a_memory_bound_kernel_is_predicted_at_its_bytes_over_the_bandwidth() -> None:
    """No host launch in the prediction, one kernel boundary: a decode-sized GEMM (M = 1) and
    the MLA decode read what the closed form says, at the device's achievable bandwidth;
    the latent read once."""
    from fxlens.rules.hardware import device

    h100 = device("h100")
    bandwidth, gap = h100.achievable_bandwidth, h100.graph_launch_s
    gemv = next(c for c in serving.CASES if c.kind == "linear" and c.sizes["m"] == 1)
    assert serving.predict(gemv, "h100") == pytest.approx(
        serving.moved_and_flops(gemv)[0] / bandwidth + gap, rel=1e-3)
    mla = next(c for c in serving.CASES if "MLA" in c.name)
    moved, _ = serving.moved_and_flops(mla)
    s = mla.sizes
    assert moved == 2 * s["batch"] * s["context"] * 576          # the latent, once
    assert serving.predict(mla, "h100") >= moved / bandwidth


def test_a_chain_of_small_kernels_is_predicted_at_the_devices_gap_per_kernel() -> None:
    """256 kernels with next to no work: the prediction is the device's kernel-boundary gap
    256 times (plus their few bytes), what the case measures on a GPU."""
    from fxlens.rules.hardware import device

    h100 = device("h100")
    chain = next(c for c in serving.CASES if c.kind == "chain")
    moved, _ = serving.moved_and_flops(chain)
    assert serving.predict(chain, "h100") == pytest.approx(
        chain.sizes["kernels"] * h100.graph_launch_s + moved / h100.achievable_bandwidth,
        rel=1e-3)


def test_one_cache_head_is_attended_as_rows_of_one_head_with_the_same_values() -> None:
    """MQA / MLA's latent: the query heads as rows of one head read the cache once, and give
    what GQA's expansion (a copy of the cache per head) gives."""
    import torch.nn.functional as F

    from bench.gpu.serving import Decode

    q, latent = torch.randn(2, 8, 1, 16), torch.randn(2, 1, 5, 16)
    expanded = F.scaled_dot_product_attention(q, latent, latent, enable_gqa=True)
    assert Decode(8, 1).rows and not Decode(16, 2).rows
    assert torch.allclose(Decode(8, 1)(q, latent), expanded, atol=1e-6)


def test_the_sweeps_time_predict_and_tabulate_every_shape(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """`bench/gpu/sweeps.py` runs serving's timing and prediction over its own shapes (here
    a few, shrunk): every one measured, predicted and in the table."""
    from bench.gpu import sweeps

    assert len(sweeps.CASES) == len(sweeps.TOKENS) * len(sweeps.WIDTHS) \
        + len(sweeps.EXPERTS) * len(sweeps.ROWS)
    monkeypatch.setattr(sweeps, "CASES", tuple(small(c) for c in sweeps.CASES[::8]))
    rows = sweeps.measure(torch.device("cpu"))
    assert [r["name"] for r in rows] == [c.name for c in sweeps.CASES]
    for row in rows:
        assert "error" not in row and row["seconds"] > 0, row
        row["predicted"] = serving.predict(serving.ServingCase(row["name"], row["kind"],
                                                               row["sizes"]), "h200")
    assert serving.table({"device": "cpu", "rows": rows}).count("\n") == len(rows) + 1
