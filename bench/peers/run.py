"""Peer benchmark (issue 9): fxlens beside the FLOP counters users would otherwise pick.

    .venv/bin/python bench/peers/run.py --setup --repeat 3     # make bench/.peers-venv, run all
    .venv/bin/python bench/peers/run.py --cases hf-gpt2 --tools fvcore thop --repeat 1

Writes bench/results/peers.json (every run's raw result) and bench/results/peers.md (the
tables), and prints the tables. With ``--resume`` the (tool, model) pairs already in
peers.json are kept and not run again.

The peers (FlopCounterMode, fvcore, ptflops with its default ``pytorch`` and its ``aten``
backend, thop, calflops, DeepSpeed's FLOPs profiler, torchinfo, torchview) live in their own
virtual environment, ``bench/.peers-venv`` (``--setup``: ``python -m venv``, the CPU build of
torch 2.13.0 from this machine's wheels, the transformers version of fxlens's environment, then
the peers), never in fxlens's dependencies. fxlens runs from ``.venv``: the public API up to
the JSON report (`bench/peers/fxlens_json.py`; the CLI would also render graph.svg and HTML
pages, which no peer does).

Each (tool, model) runs in its own process; wall time is the median of ``--repeat`` runs,
peak RSS the maximum, from ``wait4``. Both include Python start-up, imports and building the
model, for fxlens and for every peer alike. A tool that crashes (or needs real weights) is run
once. Times are ratios to fxlens's median on the same model in the same run.

Accuracy: every tool's count, converted to FLOPs = 2 × MACs, against the per-op ground truth
of `bench/peers/truth.py` ("GEMM + conv + dense attention"; see its docstring). Ops a tool
missed are *inferred*: the subset of the truth's categories (with or without fxlens's count of
the remaining elementwise/norm/softmax work) whose sum is nearest the tool's count; what is
left out is listed, and a residual over 5 % of the basis is shown beside it.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.peers.zoo import BY_NAME, CASES  # noqa: E402

HERE = Path(__file__).resolve().parent
VENV = ROOT / "bench" / ".peers-venv"
PEER_PYTHON = VENV / "bin" / "python"
RESULTS = ROOT / "bench" / "results"
TOOLS = ("FlopCounterMode", "fvcore", "ptflops", "ptflops-aten", "thop", "calflops",
         "deepspeed", "torchinfo", "torchview")
PEERS = ("fvcore", "ptflops", "thop", "calflops", "deepspeed", "torchinfo", "torchview")


def setup() -> None:
    """Create bench/.peers-venv with torch 2.13.0 (CPU), transformers and the peers."""
    import transformers

    def pip(*args: str, env: dict[str, str] | None = None) -> None:
        subprocess.run([str(PEER_PYTHON), "-m", "pip", "install", "-q", *args], check=True,
                       env={**os.environ, **(env or {})})

    if not PEER_PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    # Pinned first: an unpinned torch would pull the multi-GB CUDA build.
    pip("torch==2.13.0", f"transformers=={transformers.__version__}", "rich", "numpy")
    pip(*[p for p in PEERS if p != "deepspeed"])
    try:  # DeepSpeed builds no ops for its profiler; its build needs the torch installed above
        pip("--no-build-isolation", "deepspeed", env={"DS_BUILD_OPS": "0"})
    except subprocess.CalledProcessError as error:
        print(f"deepspeed did not install ({error}); its rows will say so", file=sys.stderr)


def versions() -> dict[str, str]:
    out = subprocess.run([str(PEER_PYTHON), "-m", "pip", "list", "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    wanted = {"torch", "transformers", *PEERS}
    return {p["name"]: p["version"] for p in json.loads(out) if p["name"] in wanted}


def timed(command: list[str]) -> tuple[float, int, str, str]:
    """Run `command`; wall seconds, its own peak RSS (wait4), stdout, stderr."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True, cwd=ROOT)
        _, _, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return seconds, usage.ru_maxrss * 1024, out.read(), err.read()


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def run_fxlens(case: Any, repeat: int) -> dict[str, Any]:
    runs, flops, error = [], None, None
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [str(ROOT / ".venv" / "bin" / "python"), str(HERE / "fxlens_json.py"),
                   *case.cli_args, "--json", str(report)]
        for _ in range(repeat):
            seconds, rss, _, err = timed(command)
            runs.append((seconds, rss))
            if report.exists():
                flops = json.loads(report.read_text())["totals"]["flops"]
            else:
                error = (err.strip().splitlines() or ["no output"])[-1][:200]
                break
    return {"tool": "fxlens", "case": case.name, "status": "ok" if flops else "crash",
            "flops": flops, "unit": "FLOPs", "error": error, **_summary(runs)}


def run_peer(tool: str, case: Any, repeat: int) -> dict[str, Any]:
    runs: list[tuple[float, int]] = []
    result: dict[str, Any] = {}
    for _ in range(repeat):
        seconds, rss, out, err = timed([str(PEER_PYTHON), str(HERE / "tool.py"), tool,
                                        case.name])
        runs.append((seconds, rss))
        parsed = last_json(out)
        if parsed is None:  # killed or crashed outside the tool's own try (segfault, OOM)
            tail = (err.strip().splitlines() or ["no output"])[-1][:200]
            parsed = {"tool": tool, "case": case.name, "status": "crash", "error": tail}
        result = parsed
        if result.get("status") != "ok":
            break
    return {**result, **_summary(runs)}


def _summary(runs: list[tuple[float, int]]) -> dict[str, Any]:
    return {"wall_s": statistics.median(s for s, _ in runs),
            "peak_rss_bytes": max(r for _, r in runs), "runs": len(runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help="create/refresh bench/.peers-venv")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", nargs="*", default=[c.name for c in CASES])
    parser.add_argument("--tools", nargs="*", default=list(TOOLS))
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "peers.json")
    args = parser.parse_args()
    if args.setup or not PEER_PYTHON.exists():
        setup()
    data: dict[str, Any] = {"results": [], "truth": {}}
    if args.resume and args.out.exists():
        data = json.loads(args.out.read_text())
    done = {(r["tool"], r["case"]) for r in data["results"]}
    cases = [BY_NAME[name] for name in args.cases]
    for case in cases:
        if case.name not in data["truth"]:
            _, _, out, err = timed([str(ROOT / ".venv" / "bin" / "python"),
                                    str(HERE / "truth.py"), case.name])
            found = last_json(out)
            if found is None:
                raise SystemExit(f"ground truth failed for {case.name}: {err[-1500:]}")
            data["truth"][case.name] = found
        for tool in ["fxlens", *args.tools]:
            if (tool, case.name) in done:
                continue
            result = (run_fxlens(case, args.repeat) if tool == "fxlens"
                      else run_peer(tool, case, args.repeat))
            data["results"].append(result)
            print(f"{case.name:14} {tool:16} {result['status']:18} "
                  f"{result.get('flops')!s:>16} {result['wall_s']:6.1f} s "
                  f"{result['peak_rss_bytes'] / 2**20:7.0f} MiB {result.get('error') or ''}",
                  file=sys.stderr, flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(data, indent=1, default=str))
    data["meta"] = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
                    "cpus": os.cpu_count(), "repeat": args.repeat, "versions": versions()}
    args.out.write_text(json.dumps(data, indent=1, default=str))
    from bench.peers.tables import render

    text = render(data)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
