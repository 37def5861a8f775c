"""Loading model files, factories and their errors."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.load import load
from fxlens.analyzer.core.errors import LoadError
from fxlens.rules import load_rules

MODEL = """
import torch

def build(batch=2):
    return torch.nn.Linear(4, 3), (torch.randn(batch, 4),)

def build_small():
    return torch.nn.Linear(2, 2), {"input": torch.randn(1, 2)}
"""


def write(tmp_path: Path, text: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_build_receives_sizes_it_declares(tmp_path: Path) -> None:
    loaded = load(str(write(tmp_path, MODEL)), sizes={"batch": 5, "seq_len": 7})
    assert isinstance(loaded.module, torch.nn.Linear)
    assert loaded.inputs[0].shape == (5, 4)
    assert loaded.name == "model"


def test_entry_names_another_factory_with_keyword_inputs(tmp_path: Path) -> None:
    loaded = load(str(write(tmp_path, MODEL)), entry="build_small")
    assert set(loaded.inputs) == {"input"}
    assert loaded.name == "model:build_small"


def test_module_level_model_and_inputs(tmp_path: Path) -> None:
    text = "import torch\nmodel = torch.nn.ReLU()\nexample_inputs = torch.ones(3)\n"
    path = write(tmp_path, text)
    loaded = load(str(path))
    assert isinstance(loaded.inputs, tuple) and loaded.inputs[0].shape == (3,)


def test_package_function_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg, MODEL, "models.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load("mypkg.models:build", sizes={"batch": 3})
    assert loaded.inputs[0].shape == (3, 4)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("def build(:\n    pass\n", "syntax error in"),
        ("import torch\n", "has no function `build()`"),
        ("def build():\n    raise ValueError('boom')\n", "model.py:2"),
        ("def build():\n    return 1\n", "must return (module, example_inputs)"),
        ("import torch\nmodel = torch.nn.ReLU()\n", "no `example_inputs`"),
        ("import torch\ndef build():\n    return torch.nn.ReLU(), 3\n", "example inputs must be"),
    ],
)
def test_bad_model_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(LoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(str(write(tmp_path, text)))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="not found"):
        load(str(tmp_path / "nope.py"))


def test_model_file_with_dataclasses_loads(tmp_path: Path) -> None:
    text = """
    from __future__ import annotations
    from dataclasses import dataclass
    import torch

    @dataclass(frozen=True)
    class Config:
        width: int = 4

    def build():
        return torch.nn.Linear(Config().width, 2), (torch.randn(1, 4),)
    """
    loaded = load(str(write(tmp_path, text, "with_dataclass.py")))
    assert loaded.module.in_features == 4


GLOBALS_IN_FORWARD = """
from __future__ import annotations
from dataclasses import dataclass
import torch

SCALE = 3.0

@dataclass(frozen=True)
class Config:
    width: int = 4

class Net(torch.nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(config.width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * SCALE

def build():
    return Net(Config()), (torch.randn(1, 4),)
"""


def test_loading_leaves_sys_modules_and_sys_path_as_they_were(tmp_path: Path) -> None:
    path = write(tmp_path, GLOBALS_IN_FORWARD, "clean_model.py")
    search_path = list(sys.path)
    first = load(str(path))
    assert "fxlens_user_clean_model" not in sys.modules and sys.path == search_path
    assert not [m for m in list(sys.modules.values())
                if str(tmp_path) in str(getattr(m, "__file__", None) or "")]
    second = load(str(path))  # the same file again: a fresh module, no stale state
    assert type(second.module) is not type(first.module)
    # The forward still reaches its module's globals (SCALE) when traced after loading.
    graph = capture(first.module, first.inputs, load_rules())
    assert any(n.target == "aten.mul.Tensor" for n in graph.calls())


def test_a_failing_model_file_is_unregistered_too(tmp_path: Path) -> None:
    path = write(tmp_path, "def build():\n    raise ValueError('boom')\n", "failing.py")
    search_path = list(sys.path)
    with pytest.raises(LoadError):
        load(str(path))
    assert "fxlens_user_failing" not in sys.modules and sys.path == search_path


@pytest.mark.parametrize("kind", ["missing.py", "folder", "report.json", "plain", "set"])
def test_bad_targets_refused_before_torch_with_loads_words(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing file, a folder, a JSON report, a target of no known form, --set on a file:
    `check_target` (no torch) says what `load` says, and the CLI answers with it, exit 2,
    without importing torch."""
    import subprocess

    from fxlens.analyzer.capture.target import check_target

    (tmp_path / "folder").mkdir()
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "model.py").write_text("")
    target = {"missing.py": "missing.py", "folder": "folder", "report.json": "report.json",
              "plain": "no_such_target", "set": "model.py"}[kind]
    overrides = {"n_layer": "2"} if kind == "set" else {}
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError) as early:
        check_target(target, overrides)
    with pytest.raises(LoadError) as late:
        load(target, overrides=overrides)
    assert str(early.value) == str(late.value)
    argv = [target, *(["--set", "n_layer=2"] if kind == "set" else [])]
    probe = ("import sys; from fxlens.cli.main import main\n"
             f"code = main({argv!r})\n"
             "assert 'torch' not in sys.modules, 'torch imported'\n"
             "sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert str(early.value) in result.stderr
