"""Fixtures the planner's test modules share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fxlens.analyzer.capture.load import load
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.plan_pass import plan_facts
from fxlens.rules.hardware import device

MODELS = Path(__file__).parent.parent / "models"


@pytest.fixture(scope="module")
def gpt() -> Iterator[tuple[Report, ModelFacts]]:
    """tests/models/tiny_gpt.py (b = 2, s = 16, h = 64, 2 blocks) under AMP bf16 + AdamW, as
    a report and the planner's facts."""
    loaded = load(str(MODELS / "tiny_gpt.py"))
    options = AnalysisOptions(train=True, precision="amp-bf16", plan=True, strategy="ddp",
                              gpus=2, strict=True)
    ctx = Context(loaded, options, lambda _: None)
    report = run_context(ctx)
    yield report, plan_facts(ctx, report, device("h100"))


@dataclass(frozen=True)
class FakeLinks:
    """A cluster as a layout reads it (`fxlens.analyzer.plan.transfers.Links`), links in
    bytes/s: `nvlink` inside a node, `nic` per GPU across nodes; `base_s` and `hop_s` a
    collective call's latency (none by default: the closed forms are the bytes')."""

    nvlink: float = 400e9
    nic: float = 50e9
    name: str = "test"
    usable_bytes: int = 80 << 30
    gpus_per_node: int = 8
    multiprocessors: int = 0
    collective_sms: int = 0
    framework_launch_s: float = 0.0      # no host floor: the closed forms are the GPUs'

    base_s: float = 0.0
    hop_s: float = 0.0

    def link_bytes_per_s(self, within_node: bool) -> float:
        return self.nvlink if within_node else self.nic

    def collective_latency_s(self, steps_inside: int, steps_across: int = 0) -> float:
        steps = steps_inside + steps_across
        return self.base_s + steps * self.hop_s if steps else 0.0
