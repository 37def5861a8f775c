"""The `analyze` command end to end: files written, JSON contract, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fxlens.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_example_writes_the_versioned_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "report.json"
    assert main([str(ROOT / "examples/tiny_gpt.py"), "--json", str(out), "--depth", "3",
                 "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "forward FLOPs" in printed and "top 10 ops" in printed
    report = json.loads(out.read_text())
    assert report["schema_version"] == 1
    assert {"name", "capture_method", "params", "param_bytes"} <= set(report["model"])
    assert set(report["totals"]) >= {"flops", "macs", "bytes_read", "bytes_written"}
    node = report["nodes"][0]
    assert set(node) >= {"id", "target", "module", "module_type", "source", "outputs", "flops",
                         "bytes_read", "bytes_written"}
    assert {"path", "type", "flops", "params"} <= set(report["modules"][0])
    assert set(report["coverage"]) >= {"costed", "free", "unsupported"}
    assert report["coverage"]["unsupported"] == {}
    assert report["totals"]["flops"] == sum(n["flops"] for n in report["nodes"])
    root = next(m for m in report["modules"] if m["path"] == "")
    assert root["flops"] == report["totals"]["flops"]
    assert root["params"] == report["model"]["params"]


@pytest.mark.slow
def test_python_dash_m_is_the_same_cli(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = subprocess.run(
        [sys.executable, "-m", "fxlens", str(ROOT / "tests/models/mlp.py"), "--quiet",
         "--json", str(out)], capture_output=True, text=True, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["model"]["name"] == "mlp"


def test_the_console_script_exits_with_the_heap_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """`entry` keeps the interpreter's last collection off the heap a run leaves behind, and
    exits with `main`'s code."""
    import gc

    import fxlens.cli.main as cli

    monkeypatch.setattr(cli, "main", lambda: 3)
    before = gc.get_freeze_count()
    try:
        with pytest.raises(SystemExit) as exited:
            cli.entry()
        assert exited.value.code == 3
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


BAD_FORWARD = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.fc(x)
        raise ValueError("forward is broken")

def build():
    return Net(), (torch.randn(2, 4),)
"""

WRONG_SHAPE = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)

def build():
    return Net(), (torch.randn(2, 5),)
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "model file not found"),
        ("def build(:\n", "syntax error in"),
        ("x = 1\n", "has no function `build()`"),
        (BAD_FORWARD, "model.py:11"),
        (WRONG_SHAPE, "model.py:10"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str | None, expected: str
) -> None:
    path = tmp_path / "model.py"
    if text is not None:
        path.write_text(textwrap.dedent(text))
    assert main([str(path), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err
    assert "Traceback" not in captured.err


def test_unknown_preset_lists_the_known_ones(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    assert main(["hf:not-a-model", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "llama-2-7b" in err and "gpt2" in err


def test_memory_section_in_every_report(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main([str(ROOT / "tests/models/mlp.py"), "--quiet", "--json", str(out),
                 "--out", str(tmp_path)]) == 0
    memory = json.loads(out.read_text())["memory"]
    assert {"param_bytes", "buffer_bytes", "peak_activation_bytes", "peak_node",
            "timeline"} <= set(memory)
    report = json.loads(out.read_text())
    assert len(memory["timeline"]) == len(report["nodes"])
    assert memory["peak_activation_bytes"] == max(memory["timeline"])


def test_train_flags_fill_the_training_section(tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.json"
    argv = [str(ROOT / "tests/models/tiny_gpt.py"), "--train", "--precision", "amp-bf16",
            "--optimizer", "adam", "--checkpoint", "--device-mem", "24GiB", "--json", str(out),
            "--out", str(tmp_path)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "training step · amp-bf16 · adam" in printed and "fits" in printed
    training = json.loads(out.read_text())["training"]
    assert training["precision"] == "amp-bf16" and training["optimizer"] == "adam"
    assert training["fit"]["device_bytes"] == 24 * 2**30
    assert training["checkpointing"]["blocks"] == ["blocks.0", "blocks.1"]
    assert training["backward_flops"] > training["forward_flops"] > 0


def test_train_under_autocast(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.json"
    argv = [str(ROOT / "tests/models/tiny_gpt.py"), "--train", "--precision", "autocast-bf16",
            "--json", str(out), "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "training step · autocast-bf16 · adamw" in capsys.readouterr().out
    report = json.loads(out.read_text())
    states = report["training"]["states"]
    assert states["master_bytes"] == 0 and states["weights_bytes"] == states["grad_bytes"]
    assert any("torch.autocast(bfloat16)" in note for note in report["model"]["capture_notes"])


@pytest.mark.slow
def test_kv_cache_of_a_preset(tmp_path: Path) -> None:
    """Llama-2-7B shape, batch 1, context 2048, fp16: 2 × 32 × 2048 × 4096 × 2 B = 1 GiB."""
    out = tmp_path / "r.json"
    argv = ["hf:llama-2-7b", "--seq-len", "16", "--kv-cache", "--context", "2048",
            "--quiet", "--json", str(out), "--out", str(tmp_path)]
    assert main(argv) == 0
    cache = json.loads(out.read_text())["kv_cache"]
    assert cache["total_bytes"] == 2 * 32 * 2048 * 4096 * 2 == 2**30
    assert len(cache["layers"]) == 32
    step = cache["decode_step"]
    assert step["total_bytes"] == step["weights_bytes"] + 2**30 + step["activation_bytes"]


def test_unknown_device_is_a_one_line_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    assert main([str(ROOT / "tests/models/mlp.py"), "--train", "--device-mem", "h1000",
                 "--out", str(tmp_path)]) == 2
    assert "h100" in capsys.readouterr().err
