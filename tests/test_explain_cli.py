"""`analyze explain [CODE]`: a rule's page from its docstring, the list of codes, and one line
and exit 2 for anything unknown (fxlens/cli/explain.py)."""

from __future__ import annotations

import inspect

import pytest

from fxlens.cli.console import EXIT_ERROR, EXIT_OK
from fxlens.cli.main import SUBCOMMANDS, main
from fxlens.rules import load_rules
from fxlens.rules.matmul import mm


def explain(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["explain", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_explain_is_a_subcommand() -> None:
    assert SUBCOMMANDS["explain"] == "fxlens.cli.explain"


@pytest.mark.parametrize("code", ["FUS002", "FUS003", "FUS004", "QNT001", "QNT004", "fus002"])
def test_a_code_prints_the_rules_whole_docstring(capsys: pytest.CaptureFixture[str],
                                                 code: str) -> None:
    rule = load_rules().coded.get(code.upper())
    assert rule is not None
    status, out, err = explain(capsys, code)
    assert (status, err) == (EXIT_OK, "")
    assert out.splitlines()[0].startswith(f"{rule.code} · {rule.family} rule")
    assert rule.doc.text in out                       # title, why and Fix lines, unwrapped
    assert f"defined at {rule.site}" in out


def test_the_fus002_page_shows_both_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = explain(capsys, "FUS002")
    assert "Fix: torch.compile(mode='max-autotune')" in out
    assert "Fix (conv): torch.ao.quantization.fuse_modules(model.eval(), [[conv, relu]])" in out


def test_no_code_lists_every_code_with_its_title(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = explain(capsys)
    lines = out.splitlines()
    rules = list(load_rules().coded)
    assert status == EXIT_OK and len(lines) == len(rules) == 15
    for line, rule in zip(lines, rules, strict=True):
        assert line.startswith(rule.code) and line.endswith(rule.title)


@pytest.mark.parametrize("op", ["aten.mm", "mm", "torch.ops.aten.mm", "aten.mm.default"])
def test_an_op_prints_its_cost_rule_and_family(capsys: pytest.CaptureFixture[str],
                                               op: str) -> None:
    status, out, _ = explain(capsys, op)
    assert status == EXIT_OK
    assert "cost rule · family matmul" in out.splitlines()[0]
    assert str(inspect.getdoc(mm)) in out


def test_a_free_op_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    reason = load_rules().find("aten.view")
    status, out, _ = explain(capsys, "aten.view")
    assert status == EXIT_OK and isinstance(reason, str)
    assert "declared free" in out and reason in out


@pytest.mark.parametrize("code", ["NOPE", "FUS999", "aten.not_an_op", "QNT"])
def test_unknown_code_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                             code: str) -> None:
    status, out, err = explain(capsys, code)
    assert status == EXIT_ERROR == 2
    assert out == "" and len(err.strip().splitlines()) == 1 and repr(code) in err
