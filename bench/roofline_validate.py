"""Roofline validation: predicted vs measured forward time, per model and per op class.

    .venv/bin/python bench/roofline_validate.py [--profile PATH] [--repeat 5]     # CPU, test zoo
    .venv/bin/python bench/roofline_validate.py --device cuda --dtype bfloat16 \\
        --targets hf:gpt2 hf:llama-2-7b --set num_hidden_layers=2        # GPU targets (issue 4)

Without `--profile`, calibrates the device first (`analyze calibrate`, saved under
bench/results/) so predictions use measured figures. Each model runs through
`fxlens.devices.validate`: the captured graph interpreted node by node, every node
timed (median of `--repeat` runs after `--warmup`), beside its roofline prediction. Prints
Markdown tables: one row per model, then the op classes of `--detail`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fxlens.analyzer.core.loaded import LoadedModel  # noqa: E402
from fxlens.analyzer.time.device_calibration import calibrate  # noqa: E402
from fxlens.analyzer.time.validate import RunSettings  # noqa: E402
from fxlens.api import load  # noqa: E402
from fxlens.devices import DTYPES, profile_spec, validate  # noqa: E402
from fxlens.rules.device_files import load_profile  # noqa: E402
from fxlens.rules.hardware import DeviceSpec  # noqa: E402


def zoo() -> dict[str, Any]:
    from tests.models import OWN_ZOO
    from tests.models.hf_zoo import ZOO

    return {**OWN_ZOO, **{f"hf-{k}": v for k, v in ZOO.items()}}


def mid_sized() -> list[LoadedModel]:
    """Zoo architectures at sizes where the work, not the per-op overhead, dominates on CPU."""
    from tests.models import mlp, tiny_gpt

    return [
        LoadedModel(*mlp.build(batch=512, d_in=1024, d_hidden=4096, d_out=1024),
                    name="mlp 512×1024→4096", source="tests/models/mlp.py"),
        LoadedModel(*tiny_gpt.build(batch=4, n_layer=4, n_head=8, d_model=512, seq_len=128,
                                    vocab=8192),
                    name="tiny_gpt d512 L4 T128 B4", source="tests/models/tiny_gpt.py"),
    ]


def loaded_models(args: argparse.Namespace, overrides: dict[str, str]) -> list[LoadedModel]:
    if args.mid:
        return mid_sized()
    if not args.targets:
        return [LoadedModel(*build(), name=name, source="tests zoo")
                for name, build in zoo().items()]
    sizes = {"batch": args.batch, "seq_len": args.seq_len}
    return [load(t, None, overrides, sizes) for t in args.targets]


def spec_for(args: argparse.Namespace) -> DeviceSpec:
    if args.profile:
        return load_profile(Path(args.profile))
    spec = profile_spec(calibrate(args.device))
    out = ROOT / "bench/results" / f"profile-{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": spec.to_json()}, indent=2, sort_keys=True) + "\n")
    return spec


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--profile")
    parser.add_argument("--dtype", choices=tuple(DTYPES))
    parser.add_argument("--targets", nargs="*", default=[])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--mid", action="store_true", help="mid-sized zoo architectures")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--detail", default="tiny_gpt", help="model whose op classes to list")
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.overrides)
    spec = spec_for(args)
    settings = RunSettings(args.device, args.warmup, args.repeat)
    dtype = DTYPES.get(args.dtype or "")
    print(f"device: {spec.source}; torch {torch.__version__}, {platform.machine()}, "
          f"{torch.get_num_threads()} threads; fp32 {spec.peak_flops['fp32'] / 1e9:.0f} GFLOP/s, "
          f"copy {spec.bandwidth_bytes_per_s / 1e9:.1f} GB/s, launch "
          f"{spec.launch_s * 1e6:.2f} µs\n")
    print("| model | nodes | predicted | measured (Σ nodes) | error | interpreted pass | "
          "eager forward | peak mem pred / meas |")
    print("|---|---|---|---|---|---|---|---|")
    detail, detail_name = None, ""
    for model in loaded_models(args, overrides):
        report = validate(model, spec, settings, dtype)
        v = report.to_dict()["validation"]
        total, memory = v["total"], v["memory"]
        print(f"| {model.name} | {v['timed_nodes']} | {ms(total['predicted_s'])} | "
              f"{ms(total['measured_s'])} | {pct(total['error'])} | {ms(total['pass_s'])} | "
              f"{ms(total['eager_s'])} | {memory['predicted_peak_bytes'] / 2**20:.2f} / "
              f"{memory['measured_peak_bytes'] / 2**20:.2f} MiB |", flush=True)
        if model.name == args.detail or (detail is None and (args.targets or args.mid)):
            detail, detail_name = v, model.name
    if detail is not None:
        print(f"\nop classes of {detail_name}:\n")
        print("| op | calls | predicted | measured | error |")
        print("|---|---|---|---|---|")
        for row in detail["op_classes"]:
            print(f"| {row['op']} | {row['calls']} | {ms(row['predicted_s'])} | "
                  f"{ms(row['measured_s'])} | {pct(row['error'])} |")


if __name__ == "__main__":
    main()
