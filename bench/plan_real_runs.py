"""fxlens's `--plan` against published multi-GPU training runs (`bench/plan_runs/runs.json`).

Each row with a published (or derived) step time is run as a user would: the model's preset at
the run's sequence length and micro-batch, the run's precision (``amp-bf16``: bf16 weights with
fp32 master copies and moments, as Megatron keeps them; ``fp8``: GEMMs at the fp8 peak; a row's
``training_precision`` where its recipe keeps another, e.g. ``bf16`` for NeMo Automodel's bf16
weights and bf16 Adam moments), AdamW, and its layout written as `--strategy` (Megatron's
distributed optimizer as ``zero=1``, FSDP as ``zero=3``, sequence parallel with tp, full
recompute as ``ckpt``, Megatron's selective ``--recompute-modules`` as
``ckpt=layernorm+moe_act``, the MoE dispatcher as ``dispatch=``, its 1F1B all-to-all overlap as
``a2a-overlap``, a benchmark gate that gives each token consecutive experts as
``routing=blocks``) on the device named by the row, with the device's datasheet × factor
figures — the same for every row; nothing is fitted to a run. Each row is planned twice: as
captured (the `transformers` program's ops and saved tensors) and with ``--fused`` (the
predicted fused kernels timed, activations saved as fused kernels keep them), since every
source runs fused kernels (Transformer Engine and Megatron's fusions, torch.compile for
torchtitan). A row may name its GPU's memory where it differs from the device entry's
(``device_memory``: ``--device-mem``) and the fused attention its stack ran
(``attention_kernel``: ``--attention-kernel``, FlashAttention-2 for PyTorch SDPA before torch
2.10). Rows fxlens cannot express yet are listed with the reason.

    python bench/plan_real_runs.py [--only NAME …] [--out bench/plan_runs/results.json]

About 50 minutes on 2 cores for all 250 rows (each row twice); ``--only … --merge`` runs a few.

Writes the results JSON and prints the Markdown table `bench/README.md` holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent / "plan_runs"
PRECISION = {"bf16": "amp-bf16", "fp8": "fp8"}
# how the sources say every layer is recomputed
FULL_RECOMPUTE = ("full", "activation_checkpointing: true", "activation checkpointing")


def strategy_of(run: dict[str, Any]) -> tuple[str | None, str]:
    """The run's layout as `--strategy` text, or None and why it cannot be written."""
    lay = run["layout"]
    recompute = (lay.get("recompute") or "").lower()
    parts = [f"dp={lay['dp']}"]
    for key, name in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep"), ("vp", "v")):
        if (lay.get(key) or 1) > 1:
            parts.append(f"{name}={lay[key]}")
    if (lay.get("cp") or 1) > 1 and lay.get("cp_comm"):     # Megatron's cp_comm_type
        parts.append(f"cp_comm={lay['cp_comm']}")
    if (lay.get("ep") or 1) > 1 and lay.get("etp"):
        parts.append(f"etp={lay['etp']}")
    if lay.get("fsdp"):
        parts.append("zero=3")
    elif lay.get("distributed_optimizer"):
        parts.append("zero=1")
    if lay.get("cuda_graphs"):          # the recipe's CUDA graphs: full_iteration, or scopes
        parts.append("graphs" if lay["cuda_graphs"] == "full" else
                     f"graphs={lay['cuda_graphs']}")
    if lay.get("sp") and (lay.get("tp") or 1) > 1:
        parts.append("sp")
    if lay.get("pipeline_layout"):      # Megatron's --pipeline-model-parallel-layout
        parts.append(f"layout={lay['pipeline_layout']}")
    if (lay.get("ep") or 1) > 1 and lay.get("dispatcher"):
        parts.append(f"dispatch={lay['dispatcher']}")
    if (lay.get("ep") or 1) > 1 and lay.get("a2a_overlap"):
        parts.append("a2a-overlap")
    if (lay.get("ep") or 1) > 1 and lay.get("routing"):
        parts.append(f"routing={lay['routing']}")     # blocks: Automodel's fake gate
    if "selective" in recompute:
        if not lay.get("recompute_modules"):
            return None, f"selective recompute ({lay['recompute']}) without its module list"
        parts.append("ckpt=" + "+".join(lay["recompute_modules"]))   # Megatron's names
    elif any(said in recompute for said in FULL_RECOMPUTE) and not recompute.startswith("none"):
        parts.append("ckpt")
    return ",".join(parts), ""


MODES = ("eager", "fused")     # as captured; over the predicted fused kernels (--fused)


def command(run: dict[str, Any], strategy: str, out: Path, mode: str,
            devices: Path | None = None) -> list[str]:
    lay = run["layout"]
    micro = run["global_batch_size"] // (run["micro_batch_size"] * lay["dp"])
    argv = [sys.executable, "-m", "fxlens", f"hf:{run['model']['preset']}",
            "--seq-len", str(run["seq_len"]), "--batch", str(run["micro_batch_size"]),
            "--precision", run.get("training_precision") or PRECISION[run["precision"]],
            "--optimizer", run.get("optimizer", "adamw"),
            "--plan", "--strategy", strategy, "--micro-batches", str(micro),
            "--device", run["device"], "--allow-large", "--no-pages", "--json", str(out),
            "--out", str(out.parent / "report")]
    if mode == "fused":
        argv.append("--fused")
    if run.get("device_memory"):       # a variant with more memory than the named device's
        argv += ["--device-mem", run["device_memory"]]
    if run.get("attention_kernel"):    # the fused attention the stack ran (cuDNN's if unsaid)
        argv += ["--attention-kernel", run["attention_kernel"]]
    if devices is not None:            # a devices file overriding the rows' devices' figures
        argv += ["--devices", str(devices)]
    if run.get("loss_dtype"):          # the recipe's loss (e.g. no fp32 cast of the logits)
        argv += ["--loss-dtype", run["loss_dtype"]]
    if run["model"].get("mtp"):        # the multi-token prediction depths the recipe trains
        argv += ["--mtp", str(run["model"]["mtp"])]
        argv += ["--mtp-shared"] if run["model"].get("mtp_shared") else []
    if run["model"].get("lora"):       # LoRA fine-tuning: the adapters' rank and layers
        lora = run["model"]["lora"]
        argv += ["--lora", str(lora["rank"]), "--lora-targets", ",".join(lora["targets"])]
        argv += ["--lora-base", lora["base"]] if lora.get("base") else []
    for key, value in (run["model"].get("overrides") or {}).items():
        argv += ["--set", f"{key}={json.dumps(value)}"]
    return argv


def predict(run: dict[str, Any], devices: Path | None = None) -> dict[str, Any]:
    """The row with, per mode, fxlens's step, its error, the fits verdict and the peak. A run
    published as model TFLOP/s per GPU (Megatron's log line) is compared as a step: the
    model's FLOPs per step (fxlens's count of the forward and backward, each micro-batch of
    the global batch) over that rate on every GPU."""
    strategy, why = strategy_of(run)
    tflops = run["measured"].get("model_tflops_per_gpu")
    row: dict[str, Any] = {"name": run["name"], "gpus": run["gpus"], "device": run["device"],
                           "measured_step_s": run["measured"].get("step_s"),
                           "measured_tflops": tflops,
                           "measured_gib": run["measured"].get("memory_gib_reserved"),
                           "strategy": strategy, "source": run["source"]["url"]}
    published = row["measured_step_s"] is not None or tflops is not None
    if strategy is None or not published or not run["micro_batch_size"]:
        row["skipped"] = why or ("no micro-batch size published" if published else
                                 "no step time or throughput published")
        return row
    for mode in MODES:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "report.json"
            started = time.perf_counter()
            done = subprocess.run(command(run, strategy, out, mode, devices),
                                  capture_output=True, text=True)
            seconds = round(time.perf_counter() - started, 1)
            if done.returncode != 0:
                row["skipped"] = f"fxlens failed: {done.stderr.strip().splitlines()[-1:]}"
                return row
            report = json.loads(out.read_text())
            layout = report["plan"]["layouts"][0]
        if row["measured_step_s"] is None:
            training = report["training"]
            micro_batches = run["global_batch_size"] // run["micro_batch_size"]
            flops = (training["forward_flops"] + training["backward_flops"]) * micro_batches
            row["measured_step_s"] = flops / (tflops * 1e12 * run["gpus"])
        step = layout["time"]["step_s"]
        row[mode] = {"analysis_s": seconds, "predicted_step_s": step, "fits": layout["fits"],
                     "peak_gib": layout["memory"]["peak_bytes"] / 2**30,
                     "time": layout["time"], "error": step / row["measured_step_s"] - 1}
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| run | GPUs | layout | measured step | fxlens step (error) | fits (peak/GPU) | "
             "--fused step (error) | --fused fits (peak/GPU) |",
             "|---|---:|---|---:|---:|---|---:|---|"]
    for r in rows:
        head = f"| [{r['name']}]({r['source']}) | {r['gpus']} {r['device'].upper()} | "
        if "skipped" in r:
            lines.append(head + f"{r['strategy'] or '—'} | {r['measured_step_s'] or '—'} | — "
                         f"| not run: {r['skipped']} | — | — |")
            continue
        cells = []
        for mode in MODES:
            m = r[mode]
            cells += [f"{m['predicted_step_s']:.2f} s ({m['error']:+.0%})",
                      f"{'yes' if m['fits'] else 'no'} ({m['peak_gib']:.1f} GiB)"]
        derived = (f" ({r['measured_tflops']} TFLOP/s)" if r.get("measured_tflops")
                   and r["measured_step_s"] is not None else "")
        if r.get("measured_gib"):      # the run's own memory reading
            derived += f", {r['measured_gib']} GiB"
        lines.append(head + f"`{r['strategy']}` | {r['measured_step_s']:.2f} s{derived} | "
                     + " | ".join(cells) + " |")
    for mode in MODES:
        for family, devices in FAMILIES:
            ran = [r[mode] for r in rows if mode in r and "skipped" not in r
                   and (devices is None or r["device"] in devices)]
            errors = [abs(m["error"]) for m in ran]
            fits = sum(m["fits"] for m in ran)
            if errors:
                lines.append(f"\n{mode}, {family}: median absolute error "
                             f"{statistics.median(errors):.0%} over {len(errors)} runs; {fits} "
                             f"of {len(errors)} fit in their GPU's usable memory (all ran).")
    return "\n".join(lines)


# the summary lines' groups of rows: all, then by GPU generation
FAMILIES = (("all", None), ("Hopper", ("h100", "h200")),
            ("Blackwell", ("b200", "gb200", "b300", "gb300")),
            ("Ampere", ("a100-80gb", "a100-40gb")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run names to run (default: all)")
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    parser.add_argument("--merge", action="store_true",
                        help="replace the --only rows in --out's results, keep the others, "
                             "and print the whole table")
    parser.add_argument("--devices", type=Path,
                        help="a devices file (analyze --devices) for every row: e.g. "
                             "plan_runs/h100_grand_teton_nvl.json, the slow end of the "
                             "torchtitan hardware's bracket")
    args = parser.parse_args()
    runs = json.loads((HERE / "runs.json").read_text())["runs"]
    rows = []
    for run in runs:
        if args.only and run["name"] not in args.only:
            continue
        row = predict(run, args.devices)
        said = {m: round(row[m]["error"], 3) for m in MODES if m in row}
        print(f"{row['name']}: {said or row.get('skipped')}", file=sys.stderr)
        rows.append(row)
    if args.merge and args.out.exists():
        fresh = {r["name"]: r for r in rows}
        kept = {r["name"]: r for r in json.loads(args.out.read_text())}
        rows = [row for run in runs                      # in runs.json's order
                if (row := fresh.get(run["name"], kept.get(run["name"]))) is not None]
    device = {run["name"]: run["device"] for run in runs}
    for row in rows:
        row.setdefault("device", device[row["name"]])   # results written before rows had it
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
