"""Formatting at the edge: one `seconds` and one `short_op` for every surface."""

from __future__ import annotations

import pytest

from fxlens.reports.units import seconds, short_op


@pytest.mark.parametrize(("value", "text"), [
    (2.5, "2.50 s"),
    (0.00123, "1.23 ms"),
    (4.5e-6, "4.50 µs"),
    (4.5e-7, "450 ns"),
    (0.0, "0 ns"),                  # the same on every surface
    (3e-9, "3 ns"),
    (-0.002, "-2.00 ms"),           # a diff's negative change
])
def test_seconds(value: float, text: str) -> None:
    assert seconds(value) == text


@pytest.mark.parametrize(("target", "text"), [
    ("aten.addmm.default", "addmm"),
    ("aten.add.Tensor", "add.Tensor"),
    ("aten.layer_norm.default", "layer_norm"),
    ("prims.convert_element_type.default", "prims.convert_element_type"),
    ("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
     "_scaled_dot_product_flash_attention_backward"),
])
def test_short_op(target: str, text: str) -> None:
    assert short_op(target) == text
