"""Suite-wide options and guards.

- ``--update-goldens`` rewrites golden files instead of comparing.
- Tests write only under their tmp dirs: the session fails if the repository's ``fxlens-out/``
  (the CLI's default report folder) appears or changes during the run. Run the CLI in tests
  with ``--out`` (and ``--json``) into ``tmp_path``, or ``monkeypatch.chdir(tmp_path)``.
- Under xdist each worker computes on its share of the cores (`_share_the_cores`): torch's
  default of one thread per core in every worker oversubscribes the machine, and the real
  runs some tests make (quantization, calibration, measured steps) slow down severalfold.
- The garbage collector walks every live object at each full collection: the `functools`
  caches a test module keeps (reports, captures) are cleared when its last test ends
  (`pytest_runtest_teardown`). Kept for the whole run, they had grown a worker's heap to
  1.8 M objects, and the full collections of one test of many small tensor ops to 62 s of
  its 70. (No `gc.freeze` here: `fxlens.analyzer.heap` owns it; test_heap.py checks that.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_OUTPUT = Path(__file__).resolve().parents[1] / "fxlens-out"
_before = pytest.StashKey[frozenset[tuple[str, int, int]] | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true",
                     help="rewrite tests/goldens/* from the current output")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


def _snapshot(folder: Path) -> frozenset[tuple[str, int, int]] | None:
    """Every file under `folder` with its size and mtime; None when there is no folder."""
    if not folder.exists():
        return None
    return frozenset((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                     for p in folder.rglob("*") if p.is_file())


def _is_controller(config: pytest.Config) -> bool:
    """Not an xdist worker: the controller alone sees the whole run start and end."""
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if not _is_controller(config):
        _share_the_cores(int(config.workerinput["workercount"]))   # type: ignore[attr-defined]


def _share_the_cores(workers: int) -> None:
    """This worker's threads: the cores over the workers (at least one), for torch here and,
    through OMP_NUM_THREADS, for the processes tests start (the CLI run as a user would)."""
    import torch

    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    module = getattr(item, "module", None)
    if module is None or getattr(nextitem, "module", None) is module:
        return
    for value in vars(module).values():
        if getattr(value, "__module__", None) == module.__name__ and callable(
                getattr(value, "cache_clear", None)):
            value.cache_clear()


def pytest_sessionstart(session: pytest.Session) -> None:
    if _is_controller(session.config):
        session.config.stash[_before] = _snapshot(REPO_OUTPUT)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not _is_controller(config) or _before not in config.stash:
        return
    written = sorted({name for name, *_ in (_snapshot(REPO_OUTPUT) or set())
                      - (config.stash[_before] or set())})
    if not written:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    message = (f"tests wrote into the repository's {REPO_OUTPUT.name}/ ({', '.join(written[:5])}"
               f"{' …' if len(written) > 5 else ''}); run the CLI with --out into tmp_path")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(f"ERROR: {message}", red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
