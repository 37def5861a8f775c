"""`analyze --device`, `analyze validate` and `analyze calibrate` end to end on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxlens.cli.main import main
from fxlens.rules.device_files import load_profile
from fxlens.rules.hardware import DTYPE_KEYS

ROOT = Path(__file__).resolve().parents[1]
MLP = str(ROOT / "tests/models/mlp.py")


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No calibrated profile of this machine leaks into the tests (nor out of them)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def test_analyze_with_a_device_adds_the_roofline(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.json"
    assert main([MLP, "--device", "h100", "--json", str(out), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out            # the first screen: the roofline's summary
    assert "roofline · h100" in printed and "--show roofline for the rest" in printed
    assert main([MLP, "--device", "h100", "--out", str(tmp_path), "--show", "roofline"]) == 0
    assert "top 10 ops by predicted time" in capsys.readouterr().out
    roofline = json.loads(out.read_text())["roofline"]
    assert {"nodes", "modules", "totals", "throughput", "mfu", "hotspots"} <= set(roofline)
    assert set(roofline["nodes"][0]) == {"id", "time_s", "bound", "intensity", "dtype"}


def test_unknown_device_is_one_line_and_exit_2(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    assert main([MLP, "--device", "h1000", "--quiet", "--out", str(tmp_path)]) == 2
    assert "unknown device 'h1000'" in capsys.readouterr().err


def test_user_devices_file(tmp_path: Path) -> None:
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps({"devices": {"mygpu": {
        "memory_bytes": 2**34, "bandwidth_bytes_per_s": 1e12, "peak_flops": {"fp32": 1e14},
        "source": "my lab's measurements"}}}))
    out = tmp_path / "r.json"
    assert main([MLP, "--device", "mygpu", "--devices", str(devices), "--json", str(out),
                 "--quiet", "--out", str(tmp_path)]) == 0
    assert json.loads(out.read_text())["roofline"]["device"]["source"] == "my lab's measurements"


def test_validate_mlp_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "v.json"
    assert main(["validate", MLP, "--on", "cpu", "--repeat", "2", "--warmup", "1",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "predicted" in printed and "measured" in printed and "aten.linear" in printed
    report = json.loads(out.read_text())
    validation = report["validation"]
    assert validation["timed_nodes"] == len(report["nodes"]) == 5
    assert {"predicted_s", "measured_s", "error"} <= set(validation["total"])
    assert all({"predicted_s", "measured_s"} <= set(n) for n in validation["nodes"])
    assert validation["profile"]["name"] == "cpu"


def test_validate_cuda_without_a_gpu_is_a_clear_error(capsys: pytest.CaptureFixture) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the error path does not apply")
    assert main(["validate", MLP, "--on", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_calibrate_cpu_writes_a_profile_that_analyze_uses(
    tmp_path: Path, empty_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    profile = tmp_path / "cpu.json"
    assert main(["calibrate", "--device", "cpu", "--out", str(profile)]) == 0
    spec = load_profile(profile)
    assert spec.calibrated and spec.name == "cpu" and spec.kind == "cpu"
    assert set(spec.peak_flops) == set(DTYPE_KEYS)
    assert spec.peak_flops["fp32"] > 0 and spec.bandwidth_bytes_per_s > 0 and spec.launch_s > 0
    assert spec.compute_efficiency == spec.bandwidth_efficiency == 1.0
    assert 0 < spec.kernel_efficiency["gemm-misaligned"] <= 1     # measured, a share of peak
    assert "fp32 FLOP/s" in capsys.readouterr().out
    out = tmp_path / "r.json"
    assert main([MLP, "--device", "cpu", "--profile", str(profile), "--json", str(out),
                 "--quiet", "--out", str(tmp_path)]) == 0
    assert json.loads(out.read_text())["roofline"]["device"]["calibrated"] is True
    # a profile in the cache is picked up for --device cpu without --profile
    cached = empty_cache / "fxlens" / "profiles" / "cpu.json"
    cached.parent.mkdir(parents=True)
    cached.write_text(profile.read_text())
    assert main([MLP, "--device", "cpu", "--json", str(out), "--quiet",
                 "--out", str(tmp_path)]) == 0
    assert json.loads(out.read_text())["roofline"]["device"]["calibrated"] is True
