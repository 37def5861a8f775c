"""bench/gdn_kernel.py prices vLLM's published FLA forward calls with fxlens's rule on the B200
entry: the same chunks cost the same however the tokens are split into sequences, to within
the sequences' final states (what the README's reading of the measured gap rests on), and the
table prints every published row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import gdn_kernel  # noqa: E402


def test_the_same_chunks_cost_the_same_however_split_into_sequences() -> None:
    one, eight = gdn_kernel.predicted_ms(1, 8192, 2, 8), gdn_kernel.predicted_ms(8, 1024, 2, 8)
    assert one == pytest.approx(eight, rel=0.02)      # eight final states against one
    assert gdn_kernel.predicted_ms(1, 4096, 2, 8)[0] == pytest.approx(one[0] / 2, rel=0.01)


def test_the_table_has_every_published_row(capsys: pytest.CaptureFixture[str]) -> None:
    gdn_kernel.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 397B")]
    assert len(rows) == len(gdn_kernel.PUBLISHED)
    assert all(line.rstrip(" |").endswith("×") for line in rows)
