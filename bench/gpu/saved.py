"""Saved activations of a training step, eager and under torch.compile, measured and predicted
(issue 30: the plan's memory verdicts, `--plan --fused`).

The measurement counts what autograd keeps for the backward: every tensor packed through
``torch.autograd.graph.saved_tensors_hooks`` during one forward (eager, and a
``torch.compile``'d model, whose compiled autograd function saves through the same hooks),
each storage once, parameters left out; and the allocator's peak over forward + backward.
The prediction is fxlens's saved set on fake tensors: as captured, and as fused kernels keep
it (`fxlens.analyzer.plan.workload.fused_saved`).

    python -m bench.gpu.saved --measure --out saved.json        # on the GPU, ~2 min
    python -m bench.gpu.saved --predict saved.json              # anywhere
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

CASES = (
    {"name": "llama-3-8b L2 T8192 bf16", "preset": "llama-3-8b", "layers": 2, "tokens": 8192},
    {"name": "qwen3-30b-a3b L2 T4096 bf16", "preset": "qwen3-30b-a3b", "layers": 2,
     "tokens": 4096},
)


def _model(case: dict[str, Any], device: torch.device) -> Any:
    from .measure import Case, build

    return build(Case(case["name"], case["preset"], 1, case["tokens"], "bfloat16",
                      _overrides(case)), device).train()


def _overrides(case: dict[str, Any]) -> dict[str, Any]:
    return {"num_hidden_layers": case["layers"], **case.get("overrides", {})}


def saved_bytes(model: Any, ids: torch.Tensor) -> tuple[int, Any]:
    """Bytes autograd saves in one forward (each storage once, parameters out), and the loss."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    return sum(storages.values()), loss


def measure(device: torch.device) -> list[dict[str, Any]]:
    from .measure import free, peak, reset_peak

    rows = []
    for case in CASES:
        row: dict[str, Any] = dict(case)
        for mode in ("eager", "compiled"):
            try:
                model = _model(case, device)
                run = torch.compile(model) if mode == "compiled" else model
                ids = torch.randint(0, 500, (1, case["tokens"]), device=device)
                saved_bytes(run, ids)[1].backward()          # warm-up (compiles)
                model.zero_grad(set_to_none=True)
                base = reset_peak(device)
                saved, loss = saved_bytes(run, ids)
                loss.backward()
                row[mode] = {"saved_bytes": saved, "peak_bytes": (peak(device) or 0) - base}
                del model, run, loss
            except Exception as error:   # each mode stands alone: record why, go on
                row[mode] = {"error": f"{type(error).__name__}: {error}"[:400]}
            free(device)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def predict(case: dict[str, Any]) -> dict[str, int]:
    """fxlens's saved bytes for the same model and tokens: as captured and as fused."""
    from fxlens.analyzer.capture.hf import load_preset
    from fxlens.pipeline import AnalysisOptions, Context, run_context
    from fxlens.plan_pass import plan_facts
    from fxlens.rules.hardware import device

    out = {}
    for mode, fused in (("captured", False), ("fused", True)):
        loaded = load_preset(case["preset"], {k: str(v) for k, v in _overrides(case).items()},
                             1, case["tokens"], dtype="bfloat16")
        options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=1,
                                  device="h100", precision="bf16", fused=fused)
        ctx = Context(loaded, options, lambda _: None)
        facts = plan_facts(ctx, run_context(ctx), device("h100"))
        out[mode] = sum(u.saved_bytes for u in facts.units)
    return out


def table(result: dict[str, Any]) -> str:
    """Measured and predicted saved bytes of each case as Markdown."""
    lines = ["| case | eager, measured | fxlens as captured | error | torch.compile, measured | "
             "fxlens --fused | error |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        cells = []
        for measured, predicted in (("eager", "captured"), ("compiled", "fused")):
            got, said = row[measured].get("saved_bytes"), row["predicted"][predicted]
            cells += [f"{got / 2**30:.2f} GiB" if got else row[measured].get("error", "—"),
                      f"{said / 2**30:.2f} GiB", f"{said / got - 1:+.0%}" if got else "—"]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("saved.json"))
    parser.add_argument("--predict", type=Path)
    args = parser.parse_args()
    if args.measure:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        args.out.write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                        "rows": measure(device)}, indent=1))
    if args.predict:
        result = json.loads(args.predict.read_text())
        for row in result["rows"]:
            row["predicted"] = predict(row)
        args.predict.write_text(json.dumps(result, indent=1))
        print(table(result))


if __name__ == "__main__":
    main()
