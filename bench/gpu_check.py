"""fxlens's time and memory predictions against one real device, in one run (issue 37).

    python bench/gpu_check.py --device cuda --out-dir bench/results     # a GPU, < 8 min on H100
    python bench/gpu_check.py --device cpu                              # small sizes, ~1 min
    python bench/gpu_check.py --predict RAW.json                        # predictions only

Parts, in this order (each case is written out as soon as it is done, so a run stopped at
its limit keeps what it measured; `--deadline-s` skips what would not finish in time):

1. calibrate: GEMM FLOP/s per dtype and copy bandwidth (`analyze calibrate`), against the
   registry's datasheet figure × the efficiency factor fxlens assumes.
2. validate: `analyze validate` per case (`bench/gpu/validate.py`), predicted with the datasheet
   entry and with the calibrated profile: total, memory peak and the op classes.
3. forward, train, decode: measured by `bench/gpu/measure.py` (torch and transformers only),
   predicted by `bench/gpu/predict.py` (fxlens on fake tensors) for both specs.

Measurements never need fxlens: on a device whose torch fxlens cannot run, each prediction
records its error and ``--predict RAW.json`` fills the predictions in later, on any machine,
with the calibrated profile the run saved. Writes ``gpu_check-<device>.json`` (every figure) and
``gpu_check-<device>.md`` (the tables: `bench/gpu/tables.py`).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu import measure  # noqa: E402
from bench.gpu.cases import cpu_cases, gpu_cases  # noqa: E402
from bench.gpu.measure import Case  # noqa: E402

PARTS = ("calibrate", "kernels", "forward", "train", "decode", "validate")
MEASURE: dict[str, Callable[..., dict[str, Any]]] = {
    "forward": measure.forward, "train": measure.train_step, "decode": measure.decode}


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                           "machine": platform.machine(), "threads": torch.get_num_threads(),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_bytes=int(props.total_memory),
                   multiprocessors=props.multi_processor_count, cuda=torch.version.cuda,
                   driver=_driver())
    return env


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    """``{"value": fn()}``, or ``{"error": ...}`` with the last lines of the traceback."""
    try:
        return {"value": fn()}
    except Exception as error:  # each case stands alone: record why, go on with the next
        tail = traceback.format_exc().strip().splitlines()[-6:]
        return {"error": f"{type(error).__name__}: {error}"[:500], "traceback": tail}


class Run:
    """The JSON being built, written after every case."""

    def __init__(self, args: argparse.Namespace, data: dict[str, Any], name: str = "") -> None:
        self.args, self.data, self.start = args, data, time.monotonic()
        self.stem = args.out_dir / (name or f"gpu_check-{data['device']}")

    def late(self) -> bool:
        return time.monotonic() - self.start > self.args.deadline_s

    def save(self) -> None:
        from bench.gpu.tables import markdown

        self.args.out_dir.mkdir(parents=True, exist_ok=True)
        if self.args.deadline_s != float("inf"):     # a measuring run, not a refill
            self.data["elapsed_s"] = round(time.monotonic() - self.start, 1)
        self.stem.with_suffix(".json").write_text(json.dumps(self.data, indent=2) + "\n")
        self.stem.with_suffix(".md").write_text(markdown(self.data))


def specs(run: Run) -> dict[str, Any]:
    """The device specs predictions use: the registry entry and the calibrated profile."""
    from fxlens.rules.device_files import load_profile, registry_name
    from fxlens.rules.hardware import device, host_cpu

    found: dict[str, Any] = {}
    gpu = run.data["env"].get("gpu")
    if gpu is None:
        found["datasheet"] = host_cpu()
    elif registry_name(gpu):
        found["datasheet"] = device(registry_name(gpu) or "")
    profile = run.stem.with_name(run.stem.name + "-profile.json")
    if profile.is_file():
        found["calibrated"] = load_profile(profile)
    return found


def calibrate(run: Run) -> None:
    from fxlens.devices import calibrate_profile

    path = run.stem.with_name(run.stem.name + "-profile.json")
    result = attempt(lambda: calibrate_profile(run.data["device"], path).spec.to_json())
    if "value" in result:
        result["measured"] = json.loads(path.read_text())["measured"]
    run.data["calibrate"] = result
    run.save()


def predict_case(part: str, case: Case, measured: dict[str, Any], spec_map: dict[str, Any]
                 ) -> dict[str, Any]:
    from bench.gpu import predict

    out = {}
    for label, spec in spec_map.items():
        if part == "decode":
            tokens = measured.get("cache_tokens", case.context + 1)
            out[label] = attempt(lambda s=spec, n=tokens: predict.decode(case, s, n))
        else:
            fn = predict.forward if part == "forward" else predict.train_step
            out[label] = attempt(lambda s=spec, f=fn: f(case, s))
    return out


def run_parts(run: Run, cases: dict[str, list[Case]], device: torch.device) -> None:
    warmup, repeat = run.args.warmup, run.args.repeat
    if "calibrate" in run.args.parts:
        calibrate(run)
    if "kernels" in run.args.parts:
        from bench.gpu.kernels import kernels
        run.data["kernels"] = attempt(lambda: kernels(device, warmup, repeat))
        run.save()
    spec_map = attempt(lambda: specs(run))
    run.data["specs"] = {k: v.to_json() for k, v in spec_map.get("value", {}).items()}
    run.data.setdefault("spec_error", spec_map.get("error"))
    spec_map = spec_map.get("value", {})
    for part in (p for p in PARTS[2:] if p in run.args.parts):
        predicting = run.args.predict_now
        rows = run.data.setdefault(part, [])
        for case in cases[part]:
            row: dict[str, Any] = {"case": case.to_json()}
            if run.late():
                row["skipped"] = f"past the {run.args.deadline_s:.0f} s deadline"
            elif part == "validate":
                from bench.gpu.validate import validate
                row.update(attempt(lambda c=case: validate(c, spec_map, device.type, warmup,
                                                           repeat)))
            else:
                row["measured"] = attempt(lambda c=case, p=part: MEASURE[p](c, device, warmup,
                                                                           repeat))
                if predicting:
                    row["predicted"] = predict_case(part, case, row["measured"].get("value", {}),
                                                    spec_map)
            rows.append(row)
            measure.free(device)
            run.save()
            print(f"[{time.monotonic() - run.start:6.1f} s] {part}: {case.name}"
                  f"{' (error)' if _failed(row) else ''}", flush=True)


def _failed(row: dict[str, Any]) -> bool:
    parts = [row, row.get("measured", {}), *row.get("predicted", {}).values()]
    return any("error" in part for part in parts)


def refill(path: Path, out_dir: Path) -> None:
    """Fill in the predictions of a saved run (measured elsewhere) on this machine, with the
    calibrated profile saved beside it (or rebuilt from the run's calibration); written to
    `out_dir` under the run's own name."""
    data = json.loads(path.read_text())
    run = Run(argparse.Namespace(out_dir=out_dir, deadline_s=float("inf")), data, path.stem)
    out_dir.mkdir(parents=True, exist_ok=True)
    profile = run.stem.with_name(run.stem.name + "-profile.json")
    beside = path.with_name(path.stem + "-profile.json")
    if beside.is_file() and beside.resolve() != profile.resolve():
        profile.write_text(beside.read_text())
    elif not profile.is_file() and "value" in data.get("calibrate", {}):
        profile.write_text(json.dumps({"device": data["calibrate"]["value"]}) + "\n")
    spec_map = specs(run)
    data["specs"] = {k: v.to_json() for k, v in spec_map.items()}
    for part in ("forward", "train", "decode"):
        for row in data.get(part, []):
            if "value" in row.get("measured", {}):
                case = Case(**row["case"])
                row["predicted"] = predict_case(part, case, row["measured"]["value"], spec_map)
    data["predicted_on"] = environment(torch.device("cpu"))
    run.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench/results")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--deadline-s", type=float, default=420.0,
                        help="skip the cases left after this many seconds (default 420)")
    parser.add_argument("--no-predict", dest="predict_now", action="store_false",
                        help="measure forward, train and decode only; fill the predictions in "
                             "later with --predict (saves device time)")
    parser.add_argument("--predict", type=Path, metavar="RAW_JSON",
                        help="fill in the predictions of a saved run, then write the tables")
    args = parser.parse_args(argv)
    if args.predict:
        refill(args.predict, args.out_dir)
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --device cpu)", file=sys.stderr)
        return 2
    cases = gpu_cases() if device.type == "cuda" else cpu_cases()
    run = Run(args, {"device": device.type, "env": environment(device)})
    run_parts(run, cases, device)
    run.save()
    print(f"wrote {run.stem}.json and .md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
