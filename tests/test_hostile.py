"""Hostile names, reports, options and model files (issue 14): every case ends with its exit
code (0 ok, 1 a gate tripped and nothing else, 2 bad input, 3 a bug), one line on stderr,
no traceback, no raw control character anywhere, and nothing on stdout but what was asked.

The battery is table-driven: `CASES` holds (id, argv, expected exit code, message pattern);
`{tmp}`, `{base}` (a valid report JSON of tests/models/mlp.py) and `{models}` are filled in,
and `SETUP` writes the files a case needs. Cases that need more than argv and a message
(files written, the process itself exiting, timing) follow as their own tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from fxlens.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
MLP = str(ROOT / "tests/models/mlp.py")
ESC = "\x1b"
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
OSC52 = "\x1b]52;c;ZXZpbA==\x07"            # write "evil" to the clipboard
FAKE_PASS = "\x1b[2J\x1b[32mall gates passed\x1b[0m"

MODELS: dict[str, str] = {
    "exit0.py": "import sys\ndef build():\n    sys.exit(0)\n",
    "exit1.py": "import sys\ndef build():\n    sys.exit(1)\n",
    "base_exc.py": "class Boom(BaseException):\n    pass\ndef build():\n    raise Boom('x')\n",
    "markup.py": ("def build():\n    raise ValueError('shape [batch, seq] "
                  "[link=http://e.vil]y[/link] [/] end')\n"),
    "esc_error.py": "def build():\n    raise ValueError('bad \\x1b]0;title\\x07 \\x1b[2J')\n",
    "newline_error.py": "def build():\n    raise ValueError('first\\r\\nall gates passed')\n",
    "int_input.py": "import torch\ndef build():\n    return torch.nn.Linear(4, 3), "
                    "(torch.ones(2, 4, dtype=torch.int64),)\n",
    "empty_input.py": "import torch\ndef build(batch=0):\n    return torch.nn.Linear(4, 3), "
                      "(torch.ones(batch, 4),)\n",
    "exit_in_forward.py": textwrap.dedent("""
        import sys
        import torch
        class Net(torch.nn.Module):
            def forward(self, x):
                sys.exit(0)
        def build():
            return Net(), (torch.ones(2, 4),)
        """),
    "mixed_train.py": textwrap.dedent("""
        import torch
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(8, 8).to(torch.bfloat16)
                self.b = nn.Linear(8, 4)
            def forward(self, x):
                h = self.a(x.to(torch.bfloat16))
                if h.sum().item() > -1e9:      # needs real values: recorded on real tensors
                    h = h * 2
                return self.b(h.float())
        def build():
            return Net(), (torch.randn(2, 8),)
        """),
    "marker.py": textwrap.dedent("""
        import pathlib, torch
        def build():
            pathlib.Path(__file__).with_suffix(".ran").write_text("ran")
            return torch.nn.Linear(4, 3), (torch.ones(2, 4),)
        """),
}


def _report(base: Path, edit: Callable[[dict], object] | None = None,
            raw: str | None = None) -> Callable[[Path], None]:
    """Setup writing ``{tmp}/bad.json``: the base report edited, or `raw` text."""
    def write(tmp: Path) -> None:
        if raw is not None:
            (tmp / "bad.json").write_text(raw)
            return
        data = json.loads(base.read_text())
        assert edit is not None
        edit(data)
        (tmp / "bad.json").write_text(json.dumps(data))
    return write


def _set(path: str, value: object) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        *parents, last = path.split(".")
        node: object = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]  # type: ignore[index]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value  # type: ignore[index]
    return edit


def _nan(data: dict) -> None:
    data["totals"]["flops"] = float("nan")


def _inf(data: dict) -> None:
    data["totals"]["flops"] = float("inf")


def _deep(data: dict) -> None:
    deep: list = []
    for _ in range(200):
        deep = [deep]
    data["nodes"][0]["outputs"][0]["extra"] = deep


def _hostile_names(data: dict) -> None:
    data["model"]["name"] = f"pr{OSC52}{FAKE_PASS}"
    for module in data["modules"]:
        if module["path"]:
            module["path"] = module["path"] + "\u202e" + ESC + "[31m"
    data["meta"]["torch_version"] = f"2.13{ESC}]0;pwned{ESC}\\"


DEVICES_NAN = ('{"devices": {"mygpu": {"bandwidth_bytes_per_s": NaN, '
               '"peak_flops": {"fp32": 1e12}}}}')
DEVICES_NEG = ('{"devices": {"mygpu": {"bandwidth_bytes_per_s": 1e12, '
               '"peak_flops": {"fp32": -1e12}}}}')

# id, argv, expected exit code, message pattern (searched in stderr, newlines kept)
CASES: list[tuple[str, list[str], int, str]] = [
    # --- security: markup and escapes in exception texts -------------------------------------
    ("markup in an exception", ["{models}/markup.py", "--out", "{tmp}/o"], 2,
     r"\[batch, seq\] \[link=http://e\.vil\]y\[/link\] \[/\] end"),
    ("escapes in an exception", ["{models}/esc_error.py", "--out", "{tmp}/o"], 2,
     r"bad \\x1b\]0;title\\x07 \\x1b\[2J"),
    ("line breaks in an exception", ["{models}/newline_error.py", "--out", "{tmp}/o"], 2,
     r"ValueError: first all gates passed"),
    # --- fail-open gates --------------------------------------------------------------------
    ("NaN in a baseline", ["diff", "{tmp}/bad.json", "{base}", "--fail-on", "flops:+0"], 2,
     r"bad\.json: NaN is not a number JSON allows"),
    ("Infinity in a report", ["diff", "{base}", "{tmp}/bad.json", "--fail-on", "flops:+0"], 2,
     r"Infinity is not a number JSON allows"),
    ("1e400 in a report", ["diff", "{tmp}/bad.json", "{base}", "--fail-on", "flops:+0"], 2,
     r"does not fit a 64-bit float"),
    ("empty gate spec", ["diff", "{base}", "{base}", "--fail-on", ""], 2, r"no gate given"),
    ("blank gate spec", ["diff", "{base}", "{base}", "--fail-on", " , "], 2, r"no gate given"),
    ("huge threshold", ["diff", "{base}", "{base}", "--fail-on", "flops:+" + "9" * 400], 2,
     r"threshold of flops is out of range"),
    ("NaN in --devices", [MLP, "--device", "mygpu", "--devices", "{tmp}/dev.json",
                          "--out", "{tmp}/o"], 2, r"NaN is not a number JSON allows"),
    ("negative peak in --devices", [MLP, "--device", "mygpu", "--devices", "{tmp}/dev.json",
                                    "--out", "{tmp}/o"], 2, r"finite number ≥ 0, got -1e\+12"),
    ("report is /dev/zero", ["diff", "{tmp}/zero.json", "{base}"], 2,
     r"not a regular file \(a character device\)"),
    ("report is a FIFO", ["diff", "{tmp}/fifo.json", "{base}"], 2,
     r"not a regular file \(a FIFO\)"),
    # --- user code ending the run -----------------------------------------------------------
    ("sys.exit(0) in build under --fail-on",
     ["{models}/exit0.py", "--baseline", "{base}", "--fail-on", "flops:+0", "--out", "{tmp}/o"],
     2, r"called sys\.exit\(0\) at .*exit0\.py:3"),
    ("sys.exit(1) in build", ["{models}/exit1.py", "--out", "{tmp}/o"], 2,
     r"called sys\.exit\(1\)"),
    ("BaseException subclass", ["{models}/base_exc.py", "--out", "{tmp}/o"], 2,
     r"raised Boom \(a BaseException\)"),
    ("sys.exit in forward", ["{models}/exit_in_forward.py", "--out", "{tmp}/o"], 2,
     r"called sys\.exit\(0\)"),
    # --- reports of models that cannot run --------------------------------------------------
    ("int input into nn.Linear", ["{models}/int_input.py", "--out", "{tmp}/o"], 2,
     r"aten\.linear .*input is int64 but weight is float32; eager PyTorch refuses"),
    ("empty example input", ["{models}/empty_input.py", "--out", "{tmp}/o"], 2,
     r"shape \(0, 4\), no elements"),
    ("--batch 0", [MLP, "--batch", "0"], 2, r"--batch: must be at least 1, got 0"),
    ("--seq-len 0", [MLP, "--seq-len", "0"], 2, r"--seq-len: must be at least 1, got 0"),
    ("--set n_layer=-1", ["hf:gpt2", "--set", "n_layer=-1", "--out", "{tmp}/o"], 2,
     r"--set n_layer=-1: a size or count must be at least 1"),
    ("--set num_hidden_layers=100000",
     ["hf:llama-2-7b", "--set", "num_hidden_layers=100000", "--out", "{tmp}/o"], 2,
     r"100,000 layers: about 6,000,000 graph nodes, roughly .* h .*--allow-large"),
    ("mixed bf16/fp32 under --train --precision fp32",
     ["{models}/mixed_train.py", "--train", "--precision", "fp32", "--out", "{tmp}/o"], 2,
     r"could not record the training step \(recorded with every weight cast to float32"),
    # --- crashes that were tracebacks -------------------------------------------------------
    ("a .json as the model", ["{base}", "--out", "{tmp}/o"], 2,
     r"is a JSON file, not a model.*analyze diff"),
    ("a .txt as the model", ["{tmp}/notes.txt", "--out", "{tmp}/o"], 2,
     r"is not a Python file"),
    ("a saved module as the model", ["{tmp}/pruned.pt", "--out", "{tmp}/o"], 2,
     r"is a saved module, not a model file: .*torch\.load\("),
    ("a binary .py", ["{tmp}/binary.py", "--out", "{tmp}/o"], 2,
     r"syntax error in .*binary\.py"),
    ("report is a list", ["diff", "{tmp}/bad.json", "{base}"], 2, r"schema version none"),
    ("schema_version true", ["diff", "{tmp}/bad.json", "{base}"], 2, r"schema version True"),
    ("nodes is an object", ["diff", "{tmp}/bad.json", "{base}"], 2,
     r"nodes: expected a list, got dict"),
    ("flops is a string", ["diff", "{tmp}/bad.json", "{base}"], 2,
     r"totals\.flops: expected an integer, got 'lots'"),
    ("10**400", ["diff", "{tmp}/bad.json", "{base}", "--fail-on", "flops:+0"], 2,
     r"an integer of 401 digits is out of range"),
    ("deep nesting", ["diff", "{tmp}/bad.json", "{base}"], 2, r"nested deeper than 64 levels"),
    ("very deep nesting", ["diff", "{tmp}/bad.json", "{base}"], 2, r"nested deeper than"),
    ("not UTF-8", ["diff", "{tmp}/bad.json", "{base}"], 2, r"not UTF-8 text"),
    ("shape of strings", ["diff", "{tmp}/bad.json", "{base}"], 2,
     r"nodes\[id=\d+\]\.outputs\[0\]\.shape\[0\]: expected an integer"),
    ("--out is a file", [MLP, "--out", "{base}"], 2, r"is a file, not a folder"),
    ("--json is a directory", [MLP, "--json", "{tmp}", "--out", "{tmp}/o"], 2,
     r"it is a directory"),
    ("diff --md is a directory", ["diff", "{base}", "{base}", "--md", "{tmp}"], 2,
     r"it is a directory"),
    ("--device-mem 0", [MLP, "--train", "--device-mem", "0", "--out", "{tmp}/o"], 2,
     r"--device-mem: '0' is no memory"),
    ("--context -1", [MLP, "--kv-cache", "--context", "-1"], 2,
     r"--context: must be at least 1, got -1"),
    ("--group-size 0", [MLP, "--quant-plan", "w4a16", "--group-size", "0"], 2,
     r"--group-size: must be at least 1"),
    ("--group-size -1", [MLP, "--quant-plan", "w4a16", "--group-size", "-1"], 2,
     r"--group-size: must be at least 1"),
    # --- options checked before the analysis (the marker model never runs) ------------------
    ("bad --fail-on", ["{models}/marker.py", "--baseline", "{base}", "--fail-on", "flops:lots",
                       "--out", "{tmp}/o"], 2, r"cannot read 'flops:lots'"),
    ("bad --devices", ["{models}/marker.py", "--device", "x", "--devices", "{tmp}/notes.txt",
                       "--out", "{tmp}/o"], 2, r"cannot read devices file"),
    ("bad --profile", ["{models}/marker.py", "--device", "cpu", "--profile", "{tmp}/notes.txt",
                       "--out", "{tmp}/o"], 2, r"cannot read profile"),
    ("bad --device-mem", ["{models}/marker.py", "--train", "--device-mem", "lots",
                          "--out", "{tmp}/o"], 2, r"--device-mem: unknown device 'lots'"),
    ("bad --budget", ["{models}/marker.py", "--quant-plan", "w8a8", "--budget", "lots",
                      "--out", "{tmp}/o"], 2, r"--quant-plan/--budget: cannot read 'lots'"),
    ("time gate without --device", ["{models}/marker.py", "--baseline", "{base}", "--fail-on",
                                    "time:+0", "--out", "{tmp}/o"], 2,
     r"--fail-on time needs an estimated time, hence --device"),
    ("time gate on a model side of diff", ["diff", "{models}/marker.py", "{base}",
                                           "--fail-on", "time:+0"], 2,
     r"--fail-on time needs an estimated time on both sides"),
    ("malformed baseline before the analysis", ["{models}/marker.py", "--baseline",
                                                "{tmp}/bad.json", "--out", "{tmp}/o"], 2,
     r"NaN is not a number"),
    ("--color time without --device", ["{models}/marker.py", "--color", "time",
                                       "--out", "{tmp}/o"], 2, r"needs --device"),
]

SETUP: dict[str, Callable[[Path, Path], None]] = {
    "NaN in a baseline": lambda tmp, base: _report(base, _nan)(tmp),
    "Infinity in a report": lambda tmp, base: _report(base, _inf)(tmp),
    "1e400 in a report": lambda tmp, base: _report(
        base, raw=base.read_text().replace('"totals":{', '"totals":{"x":1e400,'))(tmp),
    "NaN in --devices": lambda tmp, base: (tmp / "dev.json").write_text(DEVICES_NAN),
    "negative peak in --devices": lambda tmp, base: (tmp / "dev.json").write_text(DEVICES_NEG),
    "report is /dev/zero": lambda tmp, base: (tmp / "zero.json").symlink_to("/dev/zero"),
    "report is a FIFO": lambda tmp, base: os.mkfifo(tmp / "fifo.json"),
    "a .txt as the model": lambda tmp, base: (tmp / "notes.txt").write_text("hi\n"),
    "a saved module as the model": lambda tmp, base: (tmp / "pruned.pt").write_bytes(b"PK"),
    "a binary .py": lambda tmp, base: (tmp / "binary.py").write_bytes(bytes(range(256))),
    "report is a list": lambda tmp, base: _report(base, raw="[1, 2]")(tmp),
    "schema_version true": lambda tmp, base: _report(base, _set("schema_version", True))(tmp),
    "nodes is an object": lambda tmp, base: _report(base, _set("nodes", {"a": 1}))(tmp),
    "flops is a string": lambda tmp, base: _report(base, _set("totals.flops", "lots"))(tmp),
    "10**400": lambda tmp, base: _report(base, _set("totals.flops", 10**400))(tmp),
    "deep nesting": lambda tmp, base: _report(base, _deep)(tmp),
    "very deep nesting": lambda tmp, base: _report(
        base, raw='{"schema_version": 1, "meta": ' + "[" * 100_000 + "]" * 100_000 + "}")(tmp),
    "not UTF-8": lambda tmp, base: (tmp / "bad.json").write_bytes(b'{"a": "\xff\xfe"}'),
    "shape of strings": lambda tmp, base: _report(
        base, _set("nodes.0.outputs.0.shape", ["a", "b"]))(tmp),
    "bad --devices": lambda tmp, base: (tmp / "notes.txt").write_text("not json"),
    "bad --profile": lambda tmp, base: (tmp / "notes.txt").write_text("not json"),
    "malformed baseline before the analysis": lambda tmp, base: _report(base, _nan)(tmp),
}


@pytest.fixture(scope="module")
def base_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("base")
    path = folder / "base.json"
    assert main([MLP, "--quiet", "--no-pages", "--json", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    for name, source in MODELS.items():
        (folder / name).write_text(source)
    return folder


def fill(argv: list[str], tmp: Path, base: Path, models: Path) -> list[str]:
    return [a.format(tmp=tmp, base=base, models=models) for a in argv]


def check_clean(out: str, err: str) -> None:
    """No traceback, no raw control character (ESC, BEL, bidi overrides) on either stream."""
    assert "Traceback" not in err and "Traceback" not in out
    assert not RAW_CONTROL.search(out), repr(out[:300])
    assert not RAW_CONTROL.search(err), repr(err[:300])


@pytest.mark.parametrize("name, argv, code, pattern", CASES, ids=[c[0] for c in CASES])
def test_battery(name: str, argv: list[str], code: int, pattern: str, tmp_path: Path,
                 base_report: Path, models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if name in SETUP:
        SETUP[name](tmp_path, base_report)
    marker = models / "marker.ran"
    marker.unlink(missing_ok=True)
    got = call(fill(argv, tmp_path, base_report, models))
    out, err = capsys.readouterr()
    assert got == code, err
    check_clean(out, err)
    assert out == "", "errors go to stderr; stdout holds only what was asked"
    assert re.search(pattern, err), err
    assert len(err.strip().splitlines()) == 1, f"one line per error: {err!r}"
    assert not marker.exists(), "the model ran although an option was bad"


def call(argv: list[str]) -> int | str | None:
    """`main`, with argparse's own exit (a bad option) as the status the shell would see."""
    try:
        return main(argv)
    except SystemExit as exited:
        return exited.code


# --- escapes in names reach no output raw --------------------------------------------------

ESC_MODEL = textwrap.dedent("""
    import torch
    from torch import nn
    NAME = "evil\\x1b]0;pwned\\x07\\x1b[2J\\u202e[bold]x[/]\\x1b]52;c;ZXZpbA==\\x07"
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module(NAME, nn.Linear(4, 4))
        def forward(self, x):
            return getattr(self, NAME)(x)
    def build():
        return Net(), (torch.randn(2, 4),)
    """)


def test_hostile_module_names_reach_no_output_raw(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "evil.py"
    model.write_text(ESC_MODEL)
    out_dir = tmp_path / "o"
    assert main([str(model), "--out", str(out_dir), "--depth", "3"]) == 0
    out, err = capsys.readouterr()
    check_clean(out, err)
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J\\u202e[bold" in out      # visible, markup too
    for page in ("summary.md", "graph.dot", "report.html", "graph.svg"):
        if (out_dir / page).exists():
            text = (out_dir / page).read_text()
            assert not RAW_CONTROL.search(text), page
    if (out_dir / "graph.svg").exists():
        ET.parse(out_dir / "graph.svg")     # well-formed XML


def test_crafted_pr_report_cannot_drive_the_terminal(tmp_path: Path, base_report: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _report(base_report, _hostile_names)(tmp_path)
    argv = ["diff", str(base_report), str(tmp_path / "bad.json"), "--fail-on", "flops:+0",
            "--md", str(tmp_path / "c.md"), "--html", str(tmp_path / "c.html"),
            "--json", str(tmp_path / "c.json")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    check_clean(out, err)
    assert "pr\\x1b]52;c;ZXZpbA==\\x07" in out
    for page in ("c.md", "c.html"):
        assert not RAW_CONTROL.search((tmp_path / page).read_text()), page


# --- atomic writes -------------------------------------------------------------------------


def test_a_failed_write_keeps_the_previous_report(tmp_path: Path, base_report: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "main.report.json"
    target.write_bytes(base_report.read_bytes())

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    assert main([MLP, "--quiet", "--no-pages", "--json", str(target)]) == 2
    out, err = capsys.readouterr()
    assert "No space left on device" in err and out == ""
    assert target.read_bytes() == base_report.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == [target.name], "temp file left behind"


def test_read_only_folder_is_refused_before_the_analysis(
        tmp_path: Path, models: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path
                        else real(p, mode))
    (models / "marker.ran").unlink(missing_ok=True)
    assert main([str(models / "marker.py"), "--json", str(tmp_path / "r.json"),
                 "--no-pages"]) == 2
    assert "is not writable" in capsys.readouterr().err
    assert not (models / "marker.ran").exists()


# --- the process itself ---------------------------------------------------------------------


def run_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fxlens", *argv], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_a_closed_pipe_silences_its_console_and_the_run_goes_on() -> None:
    from fxlens.cli.console import _Console

    read, write = os.pipe()
    os.close(read)                          # the reader is gone before anything is written
    with os.fdopen(write, "w") as stream:
        console = _Console(file=stream, highlight=False, markup=False, emoji=False)
        console.print("a table")            # rich's own console raises SystemExit(1) here
        console.print("and more")
        assert console.quiet
        stream.write("buffered for the closed pipe\n")   # goes to the null device now


@pytest.mark.slow
def test_a_reader_closing_stdout_early_keeps_the_exit_code(tmp_path: Path,
                                                          base_report: Path) -> None:
    """``analyze model.py --fail-on … | head``: the gate still fails the job (exit 1, not
    2 as "bad input"), and nothing is said about the pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "fxlens", str(ROOT / "tests/models/tiny_gpt.py"), "--out",
             "o", "--no-pages", "--baseline", str(base_report), "--fail-on", "params:+0"],
            stdout=write, stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120)
    finally:
        os.close(write)
    assert result.returncode == 1, result.stderr
    assert "error" not in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "o" / "report.json").is_file()


@pytest.mark.slow
def test_os_exit_in_build_is_exit_2_not_0(tmp_path: Path) -> None:
    (tmp_path / "osexit.py").write_text("import os\ndef build():\n    os._exit(0)\n")
    result = run_cli("osexit.py", "--out", "o", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "called os._exit(0)" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == "" and not (tmp_path / "o").exists()


def test_a_bug_in_fxlens_is_exit_3_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    import fxlens.api

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("oops")

    monkeypatch.setattr(fxlens.api, "analyze_target", broken)
    assert main([MLP, "--out", str(tmp_path)]) == 3
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("internal error: KeyError: 'oops'") and "--debug" in err


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str], models: Path,
                                   tmp_path: Path) -> None:
    assert main([str(models / "exit1.py"), "--debug", "--out", str(tmp_path)]) == 2
    assert "Traceback" in capsys.readouterr().err


# --- CLI conventions ------------------------------------------------------------------------


@pytest.mark.slow
def test_help_and_bad_options_answer_in_under_a_second_without_torch(tmp_path: Path) -> None:
    for argv in (["--help"], ["--version"], ["diff", "--help"], ["validate", "--help"],
                 ["x.py", "--batch", "0"], ["x.py", "--fail-on", "flops:+1%"]):
        start = time.perf_counter()
        result = run_cli(*argv, cwd=tmp_path)
        elapsed = time.perf_counter() - start
        assert elapsed < 1.0, (argv, elapsed)
        assert result.returncode in (0, 2) and "Traceback" not in result.stderr
    probe = ("import sys; from fxlens.cli.main import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "assert 'torch' not in sys.modules, 'building the parser imported torch'")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True,
                          cwd=tmp_path).returncode == 0


def test_help_lists_the_subcommands_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for name in ("diff", "validate", "calibrate", "explain"):
        assert f"analyze {name}" in out
    assert "--quant-calibrate" in out and "--calibrate " not in out
    with pytest.raises(SystemExit):
        main(["--version"])
    assert re.fullmatch(r"fxlens \d+\.\d+\.\d+\n", capsys.readouterr().out)


def test_json_to_stdout_and_nothing_else(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([MLP, "--json", "-", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["model"]["name"] == "mlp"
    assert "forward FLOPs" in err or "FLOPs" in err     # the tables went to stderr
    assert not (tmp_path / "report.json").exists()


def test_no_pages_and_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([MLP, "--no-pages", "--quiet", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr() == ("", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_no_pages_removes_the_pages_of_an_earlier_run_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A report.html beside a new report.json would describe another run; a folder whose
    report.html is not ours keeps its files."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    assert main([MLP, "--quiet", "--out", str(ours)]) == 0
    assert (ours / "report.html").is_file() and (ours / "summary.md").is_file()
    capsys.readouterr()
    assert main([MLP, "--no-pages", "--quiet", "--out", str(ours)]) == 0
    assert sorted(p.name for p in ours.iterdir()) == ["report.json"]
    assert "removed the pages of an earlier run" in capsys.readouterr().err
    theirs.mkdir()
    (theirs / "report.html").write_text("<p>my notes</p>")
    (theirs / "summary.md").write_text("# mine")
    assert main([MLP, "--no-pages", "--quiet", "--out", str(theirs)]) == 0
    assert sorted(p.name for p in theirs.iterdir()) == ["report.html", "report.json",
                                                        "summary.md"]


def test_deprecated_calibrate_flag_still_works(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([MLP, "--calibrate", "--quiet", "--no-pages", "--json",
                 str(tmp_path / "r.json")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--calibrate is deprecated" in err
    assert "--quant-calibrate" in err
    assert "calibrated" in json.dumps(json.loads((tmp_path / "r.json").read_text())["quant"])


def test_validate_on_and_its_deprecated_device_alias(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the error path does not apply")
    assert main(["validate", MLP, "--on", "cuda"]) == 2
    assert "--on cuda: no CUDA device" in capsys.readouterr().err
    assert main(["validate", MLP, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "validate --device is deprecated" in err and "no CUDA device" in err


def test_the_cli_choices_are_the_engines() -> None:
    from fxlens import checks, pipeline
    from fxlens.analyzer.capture.chain import METHODS
    from fxlens.cli import args, validate
    from fxlens.devices import DTYPES
    from fxlens.reports.views import VIEW_KEYS
    from fxlens.rules.hardware import ATTENTION_KERNELS
    from fxlens.rules.training import LOSS_DTYPES

    assert args.METHODS == METHODS
    assert args.ATTENTION_KERNELS == ATTENTION_KERNELS
    assert args.PRECISIONS == pipeline.PRECISIONS
    assert args.OPTIMIZERS == pipeline.OPTIMIZERS
    assert args.LOSS_DTYPES == LOSS_DTYPES
    assert args.LORA_BASES == checks.LORA_BASES
    assert args.VIEWS == VIEW_KEYS
    assert tuple(DTYPES) == validate.DTYPE_NAMES


# --- git: refs with symlinks ----------------------------------------------------------------


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def test_git_ref_whose_folder_holds_an_absolute_symlink(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fxlens.analyzer.review.git_source import git_checkout, parse_git_target

    _git(tmp_path, "init", "-q")
    (tmp_path / "net.py").write_text("A = 1\n")
    (tmp_path / "evil.py").symlink_to("/etc/passwd")
    (tmp_path / "self.py").symlink_to(tmp_path / "net.py")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "links")
    monkeypatch.chdir(tmp_path)
    with git_checkout(parse_git_target("git:HEAD:net.py")) as path:
        assert path.read_text() == "A = 1\n"
        assert not (path.parent / "evil.py").exists()
    assert main(["diff", "git:HEAD:evil.py", "net.py"]) == 2
    err = capsys.readouterr().err
    assert "is a symlink or not a regular file" in err and "Traceback" not in err
