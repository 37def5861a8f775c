"""Predicted fused kernel count against Inductor's generated kernels, on the test zoo.

    .venv/bin/python bench/inductor_kernels.py [mlp convnet ...] [--out bench/results/inductor.md]

Each model of `tests.models.OWN_ZOO` (in eval mode, under ``no_grad``) is compiled with
``torch.compile`` (Inductor, CPU backend: C++ kernels built by the system compiler) and run
once through ``torch._inductor.utils.run_and_get_code``. Inductor's kernel count is the number
of kernel *launches* in the generated ``call()``: calls of generated C++ kernels
(``cpp_fused_*``) plus library calls (``extern_kernels.*``: mm, addmm, bmm, convolution…, and
``torch.ops.*`` fallbacks such as SDPA or LSTM). Our prediction is `kernels_fused` of the
report's ``fusion`` section. A model that Dynamo splits into several graphs counts the
launches of all of them; ops Dynamo leaves to eager (graph breaks) are not counted by Inductor
and the table says so (``lstm``: Dynamo skips frames holding ``nn.LSTM``/``nn.GRU`` and runs
them eagerly, so Inductor generates nothing to compare with). ``branchy`` is skipped: its
control flow depends on the data, so the captured graph follows one branch while Dynamo
guards and recompiles per branch.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fxlens.analyzer.core.loaded import LoadedModel  # noqa: E402
from fxlens.api import AnalysisOptions, analyze_loaded  # noqa: E402
from tests.models import OWN_ZOO  # noqa: E402

SKIPPED = {"branchy": "data-dependent control flow: one captured branch vs Dynamo's guards"}
TARGET = 0.20
LAUNCH = re.compile(
    r"^\s+(?:\w+ = )?(cpp_fused_\w+|extern_kernels\.\w+|torch\.ops\.[\w.]+)\(", re.MULTILINE)


@dataclass(frozen=True)
class Row:
    model: str
    predicted: int
    unfused: int
    inductor: int
    launches: tuple[str, ...]
    compile_s: float

    @property
    def error(self) -> float:
        return (self.predicted - self.inductor) / self.inductor if self.inductor else 0.0

    @property
    def ok(self) -> bool:
        """Within the target; a model Dynamo compiles nothing of has nothing to compare."""
        return self.inductor == 0 or abs(self.error) <= TARGET


def inductor_launches(code: str) -> list[str]:
    """Kernel launches in the ``call()`` of one generated module."""
    start = code.find("def call(")
    end = code.find("\nrunner = ", start) if start >= 0 else -1
    body = code[start:end if end > 0 else None] if start >= 0 else ""
    return LAUNCH.findall(body)


def compile_and_count(module: torch.nn.Module, inputs: Any) -> tuple[list[str], float]:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(module, backend="inductor")
    start = time.perf_counter()
    with torch.no_grad():
        if isinstance(inputs, dict):
            _, codes = run_and_get_code(compiled, **inputs)
        else:
            _, codes = run_and_get_code(compiled, *inputs)
    seconds = time.perf_counter() - start
    return [launch for code in codes for launch in inductor_launches(code)], seconds


def compare(name: str) -> Row:
    module, inputs = OWN_ZOO[name]()
    module.eval()
    report = analyze_loaded(LoadedModel(module, inputs, name, f"tests/models/{name}.py"),
                            AnalysisOptions(strict=True))
    fusion = report.to_dict()["fusion"]
    launches, seconds = compile_and_count(module, inputs)
    return Row(name, fusion["kernels_fused"], fusion["kernels_unfused"], len(launches),
               tuple(launches), seconds)


def table(rows: list[Row]) -> str:
    lines = ["| model | unfused ops | predicted kernels | Inductor kernels | error | within ±20 % |"
             " compile s |", "|---|---:|---:|---:|---:|:---:|---:|"]
    for r in rows:
        if r.inductor == 0:
            lines.append(f"| {r.model} | {r.unfused} | {r.predicted} | 0 | – | n/a: Dynamo "
                         "compiles nothing (runs the module eagerly) | – |")
            continue
        lines.append(f"| {r.model} | {r.unfused} | {r.predicted} | {r.inductor} | "
                     f"{r.error:+.0%} | {'yes' if r.ok else 'no'} | {r.compile_s:.1f} |")
    for name, reason in SKIPPED.items():
        lines.append(f"| {name} | – | – | – | – | skipped: {reason} | – |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=[m for m in OWN_ZOO if m not in SKIPPED])
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) here")
    parser.add_argument("--verbose", action="store_true", help="list Inductor's launches")
    args = parser.parse_args(argv)
    rows = [compare(name) for name in args.models]
    text = f"torch {torch.__version__}, Inductor CPU backend\n\n{table(rows)}\n"
    print(text)
    if args.verbose:
        for r in rows:
            print(r.model, ", ".join(r.launches))
    if args.out:
        args.out.write_text(text)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
