"""bench/gdn_kernel.py prices vLLM's published FLA forward calls with fxlens's rule on the B200
entry: the same chunks do the same work however the tokens are split into sequences, to
within the sequences' final states, while the state kernel's serial steps follow the chunks
one sequence walks; and what is left of each published time is one fixed part (the host's),
the reading of bench/README.md and of the Blackwell entries' `recurrence_step_s`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fxlens.rules.hardware import DEVICES

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import gdn_kernel  # noqa: E402


def test_the_same_chunks_do_the_same_work_however_split_into_sequences() -> None:
    one, eight = gdn_kernel.predicted_ms(1, 8192, 2, 8), gdn_kernel.predicted_ms(8, 1024, 2, 8)
    assert one[1:3] == pytest.approx(eight[1:3], rel=0.02)   # eight final states against one
    assert gdn_kernel.predicted_ms(1, 4096, 2, 8)[0] == pytest.approx(one[0] / 2, rel=0.01)
    # the serial steps: 128 chunks in one wave of 32 programs against 16 chunks in two waves
    # of 256 programs over the B200's 148 SMs
    step_ms = DEVICES["b200"].recurrence_step_s * 1e3
    assert one[3] == pytest.approx(128 * step_ms) and eight[3] == pytest.approx(2 * 16 * step_ms)


def test_what_the_steps_leave_of_each_published_time_is_one_fixed_part() -> None:
    left = [measured - gdn_kernel.predicted_ms(sequences, tokens, k_heads, heads)[0]
            for _, sequences, tokens, k_heads, heads, measured in gdn_kernel.PUBLISHED]
    assert max(left) - min(left) < 0.025, left     # ms: 0.14–0.16 in every row


def test_the_blackwell_step_is_the_published_tables_slope() -> None:
    """The Blackwell entries' `recurrence_step_s` is the least-squares slope of vLLM's three
    single-sequence TP8 rows over the chunks one program walks (roofline out); the line's
    intercept, the host's part, is ~0.15 ms."""
    step, fixed = gdn_kernel.fitted_step_s()
    assert DEVICES["b200"].recurrence_step_s == pytest.approx(step, rel=0.01)
    assert DEVICES["gb300"].recurrence_step_s == DEVICES["b200"].recurrence_step_s
    assert fixed == pytest.approx(0.15e-3, rel=0.05)


def test_the_table_has_every_published_row(capsys: pytest.CaptureFixture[str]) -> None:
    gdn_kernel.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 397B")]
    assert len(rows) == len(gdn_kernel.PUBLISHED)
    assert all(line.rstrip(" |").endswith("×") for line in rows)
