"""Core benchmark: wall time and peak RSS of `analyze` on big presets, beside FlopCounterMode.

    .venv/bin/python bench/core.py [--repeat 3] [--cases llama-2-7b llama-3-70b] [--out FILE]
    .venv/bin/python bench/core.py --before /tmp/before-wt    # + fxlens from another checkout

With ``--before CHECKOUT`` every case also runs fxlens from that checkout (``git worktree add
--detach CHECKOUT <commit>``; run with ``PYTHONPATH=CHECKOUT``).

Each run is a process of its own (so peak RSS is that process's alone, read from wait4);
times are medians over `--repeat` rounds, and each round runs every tool of a case once, in
turn (`interleaved`), so a ratio compares runs minutes apart at most. Both tools load the
same meta-device model.

Rows (issue 15): the default command (report folder with its pages: JSON, DOT, SVG, HTML,
Markdown) on GPT-2, Llama-2-7B and Llama-3-70B at their sequence length; the JSON alone
(``--no-pages``) on Llama-2-7B; ``--train`` on Llama-2-7B against FlopCounterMode over a
forward *and* backward; the presets Llama-3.1-405B and DeepSeek-V3 (default sequence
length). Targets (issue 15): 7B and 70B default ≤ 1.0× FlopCounterMode, 70B < 15 s, the
7B training step ≤ 1.0× FlopCounterMode forward+backward, 405B and DeepSeek-V3 < 20 s and
< 1.5 GiB. `--cases extra` adds the slow rows: 70B ``--train`` at seq 4096, and issue 30's
whole ``--plan`` of DeepSeek-V3 on 1,024 H100s (target: under 60 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    name: str
    target: str
    seq_len: int | None          # None: the preset's own
    flags: tuple[str, ...] = ()  # fxlens flags beyond the target and sequence length
    pages: bool = True           # the default command writes the pages
    train: bool = False          # the baseline runs forward + backward
    extra: bool = False          # only with --cases extra (or named)


CASES = (
    Case("gpt2", "hf:gpt2", 1024),
    Case("llama-2-7b", "hf:llama-2-7b", 2048),
    Case("llama-2-7b-json", "hf:llama-2-7b", 2048, pages=False),
    Case("llama-3-70b", "hf:llama-3-70b", 2048),
    Case("llama-2-7b-train", "hf:llama-2-7b", 2048, ("--train",), train=True),
    Case("llama-3.1-405b", "hf:llama-3.1-405b", None),
    Case("deepseek-v3", "hf:deepseek-v3", None),
    Case("llama-3-70b-train-4k", "hf:llama-3-70b", 4096, ("--train",), pages=False,
         train=True, extra=True),
    # issue 30: the whole --plan of a 1,024-GPU layout that does not fit (so the search runs)
    Case("deepseek-v3-plan-1024", "hf:deepseek-v3", 4096,
         ("--batch", "1", "--plan", "--strategy", "dp=32,tp=2,pp=16,ep=64", "--micro-batches",
          "256", "--device", "h100", "--allow-large"), train=True, extra=True),
)


@dataclass(frozen=True)
class Run:
    seconds: float
    peak_rss_bytes: int
    output: str
    cpu_seconds: float = 0.0     # user + system time of the process (steadier on a shared box)


def run_measured(command: list[str], checkout: Path | None = None) -> Run:
    """`command` in its own process: wall time and that process's peak RSS (wait4); with
    `checkout`, fxlens is imported from there."""
    env = None if checkout is None else {**os.environ, "PYTHONPATH": str(checkout)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env,
                                cwd=checkout)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{err.read()[-2000:]}")
        return Run(seconds, usage.ru_maxrss * 1024, out.read().strip(),
                   usage.ru_utime + usage.ru_stime)


Summary = tuple[float, int, str, float]   # median wall s, max peak RSS, last output, median CPU s


def interleaved(commands: dict[str, tuple[list[str], Path | None]], repeat: int
                ) -> dict[str, Summary]:
    """Each command (with the checkout it imports fxlens from) run `repeat` times, one run of
    each in turn, the order reversed every other round: the host's speed drifts by ±20 %
    over minutes, and tools measured in blocks would each get a different machine."""
    runs: dict[str, list[Run]] = {name: [] for name in commands}
    for round_ in range(repeat):
        for name in (list(commands) if round_ % 2 == 0 else list(reversed(commands))):
            runs[name].append(run_measured(*commands[name]))
    return {name: (statistics.median(r.seconds for r in done),
                   max(r.peak_rss_bytes for r in done), done[-1].output,
                   statistics.median(r.cpu_seconds for r in done))
            for name, done in runs.items()}


def fxlens_command(case: Case, folder: Path) -> list[str]:
    command = [sys.executable, "-m", "fxlens", case.target, *case.flags]
    if case.seq_len is not None:
        command += ["--seq-len", str(case.seq_len)]
    if case.pages:
        return command + ["--out", str(folder)]     # the default command, in a temp folder
    return command + ["--no-pages", "--quiet", "--json", str(folder / "report.json")]


def baseline_command(case: Case) -> list[str]:
    command = [sys.executable, str(HERE / "flop_counter_baseline.py"), case.target]
    if case.seq_len is not None:
        command += ["--seq-len", str(case.seq_len)]
    return command + (["--train"] if case.train else [])


def shown(case: Case) -> str:
    command = ["analyze", case.target, *case.flags]
    if case.seq_len is not None:
        command += ["--seq-len", str(case.seq_len)]
    command += [] if case.pages else ["--no-pages", "--json r.json"]
    return "`" + " ".join(command) + "`"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", nargs="*", help="case names (default: all but the extra "
                        f"ones; 'extra' adds them): {', '.join(c.name for c in CASES)}")
    parser.add_argument("--no-baseline", action="store_true", help="fxlens only")
    parser.add_argument("--before", type=Path, help="also run fxlens from this checkout")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "core.md")
    args = parser.parse_args()
    wanted = set(args.cases or ())
    cases = [c for c in CASES if (c.name in wanted) or
             (not (wanted - {"extra"}) and (not c.extra or "extra" in wanted))]
    rows = []
    for case in cases:
        with tempfile.TemporaryDirectory() as ours_dir, tempfile.TemporaryDirectory() as then:
            commands: dict[str, tuple[list[str], Path | None]] = {
                "ours": (fxlens_command(case, Path(ours_dir)), None)}
            if args.before is not None:
                commands["before"] = (fxlens_command(case, Path(then)), args.before.resolve())
            if not args.no_baseline:
                commands["theirs"] = (baseline_command(case), None)
            measured = interleaved(commands, args.repeat)
            flops = json.loads((Path(ours_dir) / "report.json").read_text())["totals"]["flops"]
        ours, before, theirs = measured["ours"], measured.get("before"), measured.get("theirs")
        rows.append((case, before, ours, flops, theirs))
        print(f"{case.name}: "
              + ("" if before is None else f"before {before[0]:.1f} s (cpu {before[3]:.1f} s) "
                 f"{before[1] / 2**30:.2f} GiB · ")
              + f"fxlens {ours[0]:.1f} s (cpu {ours[3]:.1f} s) {ours[1] / 2**30:.2f} GiB"
              + ("" if theirs is None else f" · FlopCounterMode {theirs[0]:.1f} s "
                 f"(cpu {theirs[3]:.1f} s) {theirs[1] / 2**30:.2f} GiB"),
              file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    before_head = ("fxlens before (CPU) | before peak RSS | " if args.before else "")
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}; median of {args.repeat} run(s), "
        f"each in its own process; 1-minute load average at the end {load:.1f}.",
        "",
        f"| case | command | {before_head}fxlens time (CPU) | fxlens peak RSS | FlopCounterMode "
        "time (CPU) | FlopCounterMode peak RSS | time ratio (CPU ratio) | fxlens FLOPs | "
        "FlopCounterMode FLOPs |",
        "|---|---|" + ("---|---|" if args.before else "") + "---|---|---|---|---|---|---|",
    ]
    for case, before, ours, flops, theirs in rows:
        base = (f"— | — | — | {float(flops):.3e} | —" if theirs is None else
                f"{theirs[0]:.1f} s ({theirs[3]:.1f} s) | {theirs[1] / 2**30:.2f} GiB | "
                f"{ours[0] / theirs[0]:.2f}× ({ours[3] / theirs[3]:.2f}×) | "
                f"{float(flops):.3e} | {float(theirs[2]):.3e}")
        then = ("" if before is None else
                f"{before[0]:.1f} s ({before[3]:.1f} s) | {before[1] / 2**30:.2f} GiB | ")
        lines.append(f"| {case.name} | {shown(case)} | {then}{ours[0]:.1f} s ({ours[3]:.1f} s) | "
                     f"{ours[1] / 2**30:.2f} GiB | {base} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
