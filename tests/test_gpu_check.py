"""`bench/gpu_check.py` on the CPU: the same script a lent GPU runs, at small sizes, so CI
proves every part works end to end and writes its JSON and tables; `--predict` fills a saved
run's predictions in again with the same figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import gpu_check

pytestmark = pytest.mark.slow
PARTS = ("calibrate", "kernels", "forward", "train", "decode", "validate")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("gpu_check")
    assert gpu_check.main(["--device", "cpu", "--out-dir", str(out), "--warmup", "0",
                           "--repeat", "1", "--parts", *PARTS]) == 0
    return out, json.loads((out / "gpu_check-cpu.json").read_text())


def test_every_part_measures_and_predicts_without_error(run: tuple[Path, dict[str, Any]]
                                                         ) -> None:
    _, data = run
    assert "value" in data["calibrate"] and "value" in data["kernels"]
    assert set(data["specs"]) == {"datasheet", "calibrated"}
    for part in ("forward", "train", "decode"):
        assert data[part], part
        for row in data[part]:
            assert "value" in row["measured"], (part, row["measured"].get("error"))
            for spec, predicted in row["predicted"].items():
                assert "value" in predicted, (part, spec, predicted.get("error"))
    for row in data["validate"]:
        assert set(row["value"]) == {"datasheet", "calibrated"}, row.get("error")


def test_predictions_agree_with_what_was_built(run: tuple[Path, dict[str, Any]]) -> None:
    """Exact where nothing is estimated: the weights the model holds and the KV cache's tensors."""
    _, data = run
    for part in ("forward", "decode"):
        for row in data[part]:
            measured = row["measured"]["value"]
            for predicted in row["predicted"].values():
                assert predicted["value"]["weights_bytes"] == measured["weights_bytes"], part
                if part == "decode":
                    assert predicted["value"]["kv_cache_bytes"] == measured["kv_cache_bytes"]
    # The model's own loss upcasts the logits and keeps the log-softmax: more memory, unless
    # the optimizer step decides the peak (the tiny Llama's).
    pairs = [(p["value"]["labels"]["step_peak_bytes"], p["value"]["ones"]["step_peak_bytes"])
             for row in data["train"] for p in row["predicted"].values()]
    assert all(labels >= ones > 0 for labels, ones in pairs)
    assert any(labels > ones for labels, ones in pairs)


def test_tables_name_every_part(run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = run
    text = (out / "gpu_check-cpu.md").read_text()
    for heading in ("### Calibration", "### Kernels", "### `analyze validate`",
                    "### Inference forward", "### AdamW step", "### Decode step"):
        assert heading in text, heading


def test_predict_fills_in_a_saved_run_again(run: tuple[Path, dict[str, Any]],
                                            tmp_path: Path) -> None:
    out, data = run
    assert gpu_check.main(["--predict", str(out / "gpu_check-cpu.json"),
                           "--out-dir", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "gpu_check-cpu.json").read_text())
    for part in ("forward", "decode"):
        for before, after in zip(data[part], again[part], strict=True):
            assert after["predicted"] == before["predicted"], part
