"""A collective call's fixed latency as a property of a device's links (`fxlens.rules.links`):
NCCL 2.20.3's cost model (ring, LL protocol) — 6.6 µs a call and 0.6 µs a ring step over
NVLink, 1.0 over PCIe, 2.7 over the network — and RCCL's for Infinity Fabric."""

from __future__ import annotations

import pytest

from fxlens.rules.device_files import load_devices
from fxlens.rules.hardware import device

US = 1e-6


@pytest.mark.parametrize("name, base, hop", [
    ("h100", 6.6, 0.6), ("h200", 6.6, 0.6), ("a100-80gb", 6.6, 0.6), ("l40s", 6.6, 1.0),
    ("h100-pcie", 6.6, 1.0), ("mi300x", 20.5, 2.3)])
@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_an_all_reduce_inside_a_node_costs_a_base_and_a_hop_per_ring_step(
        name: str, base: float, hop: float, gpus: int) -> None:
    steps = 2 * (gpus - 1)
    assert device(name).collective_latency_s(steps) == pytest.approx((base + steps * hop) * US)


def test_steps_across_nodes_take_the_networks_hop_and_no_step_costs_nothing() -> None:
    h100 = device("h100")
    assert h100.collective_latency_s(26, 4) == pytest.approx((6.6 + 26 * 0.6 + 4 * 2.7) * US)
    assert h100.collective_latency_s(0) == 0.0


def test_a_devices_file_sets_the_latency(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "devices.json"
    path.write_text('{"devices": {"h100": {"collective_base_s": 3e-6, '
                    '"intra_node_hop_s": 1e-6}}}')
    mine = load_devices(path)["h100"]
    assert mine.collective_latency_s(2) == pytest.approx(5e-6)
