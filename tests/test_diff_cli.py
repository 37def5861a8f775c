"""`analyze diff` and `analyze TARGET --baseline` end to end, on real git repositories.

Each test builds a repository in a temp folder with two commits of a tiny model file (and a
sibling module it imports), so the ``git:REF:path`` form is exercised for real.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from fxlens.cli.console import EXIT_ERROR, EXIT_GATE, EXIT_OK
from fxlens.cli.main import main

MODEL = """
import torch
from torch import nn

from layers import HIDDEN


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, HIDDEN)
        self.act = nn.ReLU()
        self.{head} = nn.Linear(HIDDEN, 4)
{extra_init}
    def forward(self, x):
        y = self.act(self.fc1(x))
{extra_forward}        return self.{head}(y)


def build():
    return Net(), (torch.randn(2, 16),)
"""


def write_model(repo: Path, hidden: int, head: str = "fc2", extra: bool = False) -> None:
    extra_init = "        self.extra = nn.Linear(HIDDEN, HIDDEN)\n" if extra else ""
    extra_forward = "        y = self.extra(y)\n" if extra else ""
    (repo / "net.py").write_text(textwrap.dedent(MODEL).format(
        head=head, extra_init=extra_init, extra_forward=extra_forward))
    (repo / "layers.py").write_text(f"HIDDEN = {hidden}\n")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Commit 1: hidden 8; commit 2 (HEAD): hidden 32 and a module `extra` added."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    write_model(root, hidden=8)
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "small")
    write_model(root, hidden=32, extra=True)
    git(root, "commit", "-q", "-am", "bigger")
    monkeypatch.chdir(root)
    return root


def test_git_ref_against_work_tree_writes_every_output(
        repo: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["diff", "git:HEAD~1:net.py", "net.py", "--md", "out/c.md", "--html",
                 "out/c.html", "--json", "out/c.json"])
    assert code == EXIT_OK
    assert "fxlens diff" in capsys.readouterr().out
    data = json.loads((repo / "out/c.json").read_text())
    statuses = {m["path"]: m["status"] for m in data["modules"]}
    # layers.py at HEAD~1 was used (hidden 8), not the work tree's: fc1 changed.
    assert statuses == {"extra": "added", "fc1": "changed", "fc2": "changed", "act": "changed"}
    fc1 = next(m for m in data["modules"] if m["path"] == "fc1")
    assert fc1["metrics"]["params"] == {"old": 16 * 8 + 8, "new": 16 * 32 + 32,
                                        "change": 16 * 24 + 24, "relative": 3.0}
    assert data["totals"]["flops"]["change"] > 0
    assert {"module": "fc1", "op": "aten.linear.default", "index": 0, "old": [[2, 8]],
            "new": [[2, 32]]} in data["shape_changes"]
    assert "<details>" in (repo / "out/c.md").read_text()
    assert (repo / "out/c.html").read_text().startswith("<!DOCTYPE html>")


def test_two_refs_and_a_tripped_gate(repo: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["diff", "git:HEAD~1:net.py", "git:HEAD:net.py", "--quiet",
                 "--fail-on", "flops:+2%,peak_memory:+1000%"])
    assert code == EXIT_GATE
    captured = capsys.readouterr()
    assert "flops:+2% TRIPPED" in captured.out and "peak_memory:+1000% ok" in captured.out
    assert "1 gate(s) tripped: flops:+2%" in captured.err


def test_renamed_module_across_commits(repo: Path, capsys: pytest.CaptureFixture) -> None:
    write_model(repo, hidden=32, head="head", extra=True)
    git(repo, "commit", "-q", "-am", "rename fc2 to head")
    code = main(["diff", "git:HEAD~1:net.py", "net.py", "--json", "d.json",
                 "--fail-on", "flops:+0,params:+0"])
    assert code == EXIT_OK
    (module,) = json.loads((repo / "d.json").read_text())["modules"]
    assert (module["status"], module["old_path"], module["path"]) == ("renamed", "fc2", "head")
    assert "fc2 → head" in capsys.readouterr().out


def test_baseline_on_the_main_command(repo: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["net.py", "--quiet", "--json", "main.report.json"]) == EXIT_OK
    # Same model as the baseline JSON: nothing grows, no gate trips.
    assert main(["net.py", "--quiet", "--json", "again.json", "--baseline", "main.report.json",
                 "--fail-on", "flops:+0,params:+0"]) == EXIT_OK
    # Against the older commit, the parameter count grew.
    code = main(["net.py", "--quiet", "--json", "again.json", "--baseline", "git:HEAD~1:net.py",
                 "--fail-on", "params:+0"])
    assert code == EXIT_GATE
    assert "params:+0 TRIPPED" in capsys.readouterr().out


def test_baseline_from_another_machine_compares(
        repo: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["net.py", "--quiet", "--json", "new.json"]) == EXIT_OK
    data = json.loads((repo / "new.json").read_text())
    data["meta"]["torch_version"] = "2.12.0"
    data["model"]["source"] = "/home/ci/work/net.py"
    for node in data["nodes"]:       # another torch version numbers its nodes differently
        node["id"] += 100
        node["inputs"] = [i + 100 for i in node["inputs"]]
    (repo / "ci.json").write_text(json.dumps(data))
    assert main(["diff", "ci.json", "new.json", "--fail-on", "flops:+0"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "torch version differs: 2.12.0 (old)" in out and "0 changed" in out


def test_older_schema_baseline_is_a_clear_error(
        repo: Path, capsys: pytest.CaptureFixture) -> None:
    (repo / "old.json").write_text(json.dumps(
        {"schema_version": 0, "model": {"name": "net"}, "total_flops": 1}))
    assert main(["diff", "old.json", "net.py"]) == EXIT_ERROR
    assert "schema version 0; this fxlens reads version 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["diff", "git:nope:net.py", "net.py"], "unknown git ref 'nope'"),
    (["diff", "git:HEAD:missing.py", "net.py"], "missing.py does not exist at HEAD"),
    (["diff", "git:HEAD", "net.py"], "expected git:REF:path"),
    (["diff", "a.json", "b.json", "--fail-on", "flops:lots"], "cannot read"),
])
def test_what_cannot_run_exits_2(repo: Path, capsys: pytest.CaptureFixture,
                                 argv: list[str], message: str) -> None:
    assert main(argv) == EXIT_ERROR
    assert message in capsys.readouterr().err.replace("\n", " ")


def test_git_checkout_of_a_file_in_a_subfolder(repo: Path) -> None:
    """The file lands at its repository path, with its sibling .py files, from any cwd."""
    from fxlens.analyzer.review.git_source import git_checkout, parse_git_target

    (repo / "models").mkdir()
    (repo / "models/net.py").write_text("A = 1\n")
    (repo / "models/util.py").write_text("B = 1\n")
    (repo / "models/notes.txt").write_text("not python\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "models")
    (repo / "models/net.py").write_text("A = 2\n")
    with git_checkout(parse_git_target("git:HEAD:net.py"), cwd=repo / "models") as path:
        assert path.parts[-2:] == ("models", "net.py")
        assert path.read_text() == "A = 1\n"
        assert (path.parent / "util.py").exists() and not (path.parent / "notes.txt").exists()
        folder = path.parent
    assert not folder.exists()
