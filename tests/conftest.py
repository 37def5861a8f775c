"""Suite-wide options and guards.

- ``--update-goldens`` rewrites golden files instead of comparing.
- Tests write only under their tmp dirs: the session fails if the repository's ``fxlens-out/``
  (the CLI's default report folder) appears or changes during the run. Run the CLI in tests
  with ``--out`` (and ``--json``) into ``tmp_path``, or ``monkeypatch.chdir(tmp_path)``.
"""

from __future__ import annotations

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
