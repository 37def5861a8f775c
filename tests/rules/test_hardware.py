"""The device registry (fxlens/rules/hardware.py): every device complete and sourced, dense
peaks, fallbacks for missing paths, user files and calibrated profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxlens.rules.device_files import (
    cached_profile,
    load_devices,
    load_profile,
    profile_dir,
    registry_name,
    spec_from_json,
)
from fxlens.rules.hardware import (
    BANDWIDTH_EFFICIENCY,
    DEVICES,
    DTYPE_KEYS,
    GEMM_EFFICIENCY,
    GPU_LAUNCH_S,
    HOST_FREE_S,
    HOST_MODULE_S,
    DeviceSpec,
    device,
    host_cpu,
)

REQUIRED = ("h100", "h100-pcie", "h200", "b200", "gb200", "b300", "gb300", "a100-40gb",
            "a100-80gb", "l4", "a10g", "t4", "rtx4090", "mi300x", "cpu")
T = 1e12


@pytest.mark.parametrize("name", REQUIRED)
def test_every_device_has_every_field_and_a_source(name: str) -> None:
    spec = device(name)
    assert spec.name == name
    assert spec.memory_bytes > 0 and spec.bandwidth_bytes_per_s > 0
    assert set(spec.peak_flops) == set(DTYPE_KEYS)
    assert all(v >= 0 for v in spec.peak_flops.values())
    assert spec.peak_flops["fp32"] > 0          # every path falls back to fp32 in the end
    cited = spec.source.lower().replace(" ", "")
    assert "datasheet" in cited or "specifications" in cited or name == "cpu"
    assert 0 < spec.compute_efficiency <= 1 and 0 < spec.bandwidth_efficiency <= 1
    assert spec.launch_s > 0
    for key in DTYPE_KEYS:
        assert spec.peak(key)[0] > 0


def test_gpu_peaks_are_dense_datasheet_figures() -> None:
    h100 = DEVICES["h100"]
    # H100 SXM datasheet: BF16 1,979 TFLOPS and FP8 3,958 "with sparsity" → halved.
    assert h100.peak_flops["bf16"] == 1979 / 2 * T
    assert h100.peak_flops["fp8"] == 3958 / 2 * T
    assert h100.bandwidth_bytes_per_s == 3.35 * T
    assert DEVICES["a100-80gb"].peak_flops["bf16"] == 312 * T
    assert DEVICES["h200"].bandwidth_bytes_per_s > h100.bandwidth_bytes_per_s
    # fp16/bf16 tensor paths are faster than fp32 on every accelerator that has them
    for spec in DEVICES.values():
        assert spec.peak("bf16")[0] >= spec.peak_flops["fp32"]


def test_blackwell_figures_are_the_datasheets_per_gpu_and_dense() -> None:
    """HGX B200: BF16 4.5 and FP8 9 PFLOPS with sparsity per GPU; GB200 NVL72: the rack's
    360 (BF16) and 720 (FP8) PFLOPS with sparsity, 13.4 TB and 576 TB/s over 72 GPUs."""
    b200, gb200 = DEVICES["b200"], DEVICES["gb200"]
    assert b200.peak_flops["bf16"] == 4500 / 2 * T and b200.peak_flops["fp8"] == 9000 / 2 * T
    assert gb200.peak_flops["bf16"] == pytest.approx(360e3 / 72 / 2 * T)
    assert gb200.peak_flops["fp8"] == pytest.approx(720e3 / 72 / 2 * T)
    assert gb200.memory_bytes == round(13.4e3 / 72) * 2**30
    assert gb200.bandwidth_bytes_per_s == pytest.approx(576 / 72 * T)
    assert b200.bandwidth_bytes_per_s == 7.7 * T
    # the NVL72 rack is one NVLink domain; a DGX/HGX B200 node is 8 GPUs
    assert (gb200.gpus_per_node, b200.gpus_per_node) == (72, 8)
    assert gb200.link_bytes_per_s(True) == b200.link_bytes_per_s(True) == 0.8 * 900e9
    assert DEVICES["gb300"].link_bytes_per_s(False) == 2 * gb200.link_bytes_per_s(False)
    # Blackwell Ultra cut INT8 to a sliver of its FP8 rate
    assert DEVICES["b300"].peak_flops["int8"] < DEVICES["b300"].peak_flops["fp8"] / 10


def test_blackwell_attention_runs_at_its_sourced_share_and_other_kernels_at_the_factor(
) -> None:
    b200 = DEVICES["b200"]
    assert b200.achievable_flops("bf16", "attention-forward") == pytest.approx(0.55 * 2250 * T)
    assert b200.achievable_flops("bf16", "attention-backward") == pytest.approx(0.45 * 2250 * T)
    for unmeasured in ("gemm-grouped", "gemm-misaligned"):
        assert b200.achievable_flops("bf16", unmeasured) == b200.achievable_flops("bf16")
    assert b200.achievable_flops("fp8") == pytest.approx(GEMM_EFFICIENCY * 4500 * T)


def test_flash_attention_2_takes_its_measured_hopper_shares_and_only_there() -> None:
    """bench/gpu/attention.py on an H200: FlashAttention-2 0.26–0.34 of the dense peak
    forward, 0.23–0.27 backward, where cuDNN's kernel (each entry's default) reached
    0.47–0.62 and 0.39–0.49."""
    for name in ("h100", "h200"):
        cudnn = DEVICES[name]
        flash2 = cudnn.with_attention("flash2")
        assert flash2.achievable_flops("bf16", "attention-forward") == pytest.approx(
            0.30 * 989.5 * T)
        assert flash2.achievable_flops("bf16", "attention-backward") == pytest.approx(
            0.25 * 989.5 * T)
        assert flash2.achievable_flops("bf16") == cudnn.achievable_flops("bf16")
        assert cudnn.with_attention("cudnn") == cudnn
    b200 = DEVICES["b200"]       # no FlashAttention-2 figure measured: its entry stays
    assert b200.with_attention("flash2") == b200
    assert spec_from_json(DEVICES["h100"].to_json()) == DEVICES["h100"]


def test_a_user_file_gives_a_device_its_flash_attention_2_shares(tmp_path: Path) -> None:
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"devices": {"a100": {"flash2_efficiency": {
        "attention-forward": 0.6, "attention-backward": 0.5}}}}))
    mine = load_devices(path)["a100-80gb"].with_attention("flash2")
    assert mine.achievable_flops("bf16", "attention-backward") == pytest.approx(0.5 * 312 * T)


@pytest.mark.parametrize(("driver_name", "entry"), [
    ("NVIDIA B200", "b200"), ("NVIDIA GB200", "gb200"), ("NVIDIA B300 SXM6 AC", "b300"),
    ("NVIDIA GB300", "gb300"), ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100")])
def test_the_driver_names_find_their_entry(driver_name: str, entry: str) -> None:
    assert registry_name(driver_name) == entry


def test_missing_paths_fall_back_and_say_so() -> None:
    assert DEVICES["a100-80gb"].peak("fp8") == (312 * T, "bf16")   # Ampere: no FP8
    assert DEVICES["t4"].peak("bf16") == (8.1 * T, "fp32")          # Turing: no BF16
    assert DEVICES["t4"].peak("fp8") == (8.1 * T, "fp32")
    assert DEVICES["h100"].peak("tf32") == (494.5 * T, "tf32")


def test_achievable_figures_apply_the_stated_factors() -> None:
    h100 = DEVICES["h100"]
    assert h100.compute_efficiency == GEMM_EFFICIENCY == 0.7
    assert h100.bandwidth_efficiency == BANDWIDTH_EFFICIENCY == 0.8
    assert h100.achievable_flops("bf16") == pytest.approx(0.7 * 989.5 * T)
    assert h100.achievable_bandwidth == pytest.approx(0.8 * 3.35 * T)


def test_aliases_and_unknown_names() -> None:
    assert device("H100-SXM") is DEVICES["h100"]
    assert device("a100") is DEVICES["a100-80gb"]
    with pytest.raises(ValueError, match="known devices: .*cpu.*h100"):
        device("h1000")


def test_grace_hosted_gpus_pay_the_grace_cpus_time_per_call() -> None:
    """TransformerEngine#2053: one nn.Linear forward cost 37.08 µs of CPU time on a GB200,
    13.48 µs on a DGX H100's Xeon; the x86 servers keep the measured x86 figures."""
    ratio = 37.08 / 13.48
    for name in ("gb200", "gb300"):
        spec = DEVICES[name]
        assert spec.launch_s == pytest.approx(GPU_LAUNCH_S * ratio)
        assert spec.host_free_s == pytest.approx(HOST_FREE_S * ratio)
        assert spec.host_module_s == pytest.approx(HOST_MODULE_S * ratio)
    for name in ("h100", "h200", "b200", "b300", "a100-80gb"):
        spec = DEVICES[name]
        assert (spec.launch_s, spec.host_free_s, spec.host_module_s) == (
            GPU_LAUNCH_S, HOST_FREE_S, HOST_MODULE_S)


def test_host_cpu_defaults_are_conservative_and_stated() -> None:
    cpu = host_cpu()
    assert cpu.kind == "cpu" and not cpu.calibrated
    assert cpu.peak_flops["fp32"] <= 2e11 and cpu.bandwidth_bytes_per_s <= 2e10
    assert "calibrate" in cpu.source


def test_user_file_overrides_and_adds_devices(tmp_path: Path) -> None:
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"devices": {
        "H100": {"bandwidth_bytes_per_s": 3.0e12, "peak_flops": {"bf16": 7.0e14}},
        "lab-l40s": {"memory_bytes": 48 * 2**30, "bandwidth_bytes_per_s": 8.64e11,
                 "peak_flops": {"fp32": 9.16e13, "bf16": 3.62e14},
                 "source": "NVIDIA L40S datasheet"},
    }}))
    extra = load_devices(path)
    h100 = device("h100", extra)
    assert h100.bandwidth_bytes_per_s == 3.0e12 and h100.peak_flops["bf16"] == 7.0e14
    assert h100.peak_flops["fp8"] == DEVICES["h100"].peak_flops["fp8"]   # merged, not replaced
    l40s = device("lab-l40s", extra)      # a device of the file's own: only its figures
    assert l40s.source == "NVIDIA L40S datasheet" and l40s.peak_flops["fp8"] == 0.0
    assert l40s.peak("fp8") == (3.62e14, "bf16")


# what PyTorch reports as the total (its out-of-memory message's "total capacity"), sourced in
# fxlens/rules/hardware.py; the CUDA context's GiB comes off it
REPORTED_GIB = {"h100": 79.11, "h200": 139.80, "a100-80gb": 79.15, "a100-40gb": 39.50,
                "rtx4090": 23.68, "t4": 14.56, "b200": 178.35}


@pytest.mark.parametrize("name", REQUIRED)
def test_usable_memory_is_the_drivers_total_less_the_cuda_context(name: str) -> None:
    spec = device(name)
    total = round(REPORTED_GIB[name] * 2**30) if name in REPORTED_GIB else spec.memory_bytes
    context = 0 if name == "cpu" else 2**30
    assert spec.usable_bytes == total - context
    assert spec.usable_bytes < spec.memory_bytes or name == "cpu"
    assert spec.figures().capacity_bytes == spec.usable_bytes   # what a report records


def test_hopper_fp8_gemms_reach_their_measured_share_of_the_fp8_peak(tmp_path: Path) -> None:
    h100 = device("h100")
    assert h100.achievable_flops("fp8") == pytest.approx(0.65 * 1979 * T)
    assert h100.achievable_flops("bf16") == pytest.approx(GEMM_EFFICIENCY * 989.5 * T)
    assert h100.achievable_flops("fp8", "gemm-misaligned") == pytest.approx(0.1 * 1979 * T)
    assert device("a100-80gb").dtype_efficiency == {}       # unmeasured: the rule of thumb
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"devices": {"h100": {"dtype_efficiency": {"bf16": 0.8}}}}))
    mine = device("h100", load_devices(path))
    assert mine.achievable_flops("bf16") == pytest.approx(0.8 * 989.5 * T)
    path.write_text(json.dumps({"devices": {"h100": {"dtype_efficiency": {"fp4": 0.8}}}}))
    with pytest.raises(ValueError, match="fp4"):
        load_devices(path)


def test_a_users_memory_figure_is_the_budget_as_given(tmp_path: Path) -> None:
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"devices": {
        "h100": {"memory_bytes": 64 * 2**30},
        "lab-gpu": {"memory_bytes": 48 * 2**30, "bandwidth_bytes_per_s": 1e12,
                    "peak_flops": {"fp32": 1e13}},
        "lab-driver": {"memory_bytes": 48 * 2**30, "reported_bytes": 47 * 2**30,
                       "context_bytes": 2**29, "bandwidth_bytes_per_s": 1e12,
                       "peak_flops": {"fp32": 1e13}},
    }}))
    extra = load_devices(path)
    assert device("h100", extra).usable_bytes == 64 * 2**30   # not the sourced 79.11 GiB
    assert device("lab-gpu", extra).usable_bytes == 48 * 2**30
    assert device("lab-driver", extra).usable_bytes == 47 * 2**30 - 2**29
    assert DEVICES["h100"].with_usable(10).usable_bytes == 10


@pytest.mark.parametrize("bad", [
    {"devices": {"x": {"peak_flops": {"fp4": 1.0}}}},
    {"devices": {"x": {"bandwidth": 1.0}}},
    {"devices": {"h100": {"kernel_efficiency": {"gemm-odd": 0.5}}}},
    {"devices": {"h100": {"kernel_efficiency": {"gemm-misaligned": 1.5}}}},
    {"devices": {"h100": {"kernel_efficiency": [0.5]}}},
    {"devices": []},
    {"nothing": {}},
])
def test_bad_user_files_name_the_problem(tmp_path: Path, bad: dict) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="cannot read devices from"):
        load_devices(path)


def test_kernel_class_shares_are_the_devices_and_can_be_overridden(tmp_path: Path) -> None:
    """Hopper's misaligned-GEMM share was measured on an H200 (bench/gpu); others keep their
    compute efficiency until measured; a user file sets its own."""
    h100 = device("h100")
    assert h100.achievable_flops("bf16", "gemm-misaligned") == pytest.approx(0.1 * 989.5 * T)
    assert h100.achievable_flops("bf16") == pytest.approx(GEMM_EFFICIENCY * 989.5 * T)
    a100 = device("a100")
    assert a100.achievable_flops("bf16", "gemm-misaligned") == a100.achievable_flops("bf16")
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"devices": {"a100": {"kernel_efficiency":
                                                     {"gemm-misaligned": 0.25}}}}))
    mine = load_devices(path)["a100-80gb"]
    assert mine.achievable_flops("bf16", "gemm-misaligned") == pytest.approx(0.25 * 312 * T)
    assert spec_from_json(mine.to_json()) == mine


def test_profiles_round_trip_and_are_found_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert profile_dir() == tmp_path / "fxlens" / "profiles"
    assert cached_profile("cpu") is None
    spec = DeviceSpec("cpu", 2**30, "calibrated here", {k: 1e11 for k in DTYPE_KEYS}, 2e10,
                      kind="cpu", compute_efficiency=1.0, bandwidth_efficiency=1.0,
                      launch_s=2e-6, calibrated=True)
    profile_dir().mkdir(parents=True)
    (profile_dir() / "cpu.json").write_text(json.dumps({"device": spec.to_json(), "measured": {}}))
    assert cached_profile("cpu") == spec
    assert load_profile(profile_dir() / "cpu.json") == spec
    assert spec_from_json(spec.to_json()) == spec
