"""`settled_heap`: the analysis's objects frozen while it runs, given back after; a host's own
freeze left alone; the collector off through the analyze command's start-up only; and the
eager-memory simulation (the one figure made of object lifetimes) the same with the heap
frozen, the collector off, or running."""

from __future__ import annotations

import gc
from pathlib import Path

from fxlens.analyzer.core.heap import collector_off_until_loaded, model_loaded, settled_heap
from fxlens.analyzer.memory.measure import simulate_eager_memory
from fxlens.cli.main import main
from tests.models.tiny_gpt import build as build_tiny_gpt


def test_frozen_while_running_and_given_back() -> None:
    assert gc.get_freeze_count() == 0
    with settled_heap() as settle:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        kept = [[] for _ in range(1000)]   # containers: tracked by the collector
        settle()
        assert gc.get_freeze_count() >= frozen + len(kept)
    assert gc.get_freeze_count() == 0


def frozen(objects: list[object]) -> bool:
    """Whether every one of `objects` is in the collector's permanent generation: tracked, yet
    in none of the generations a collection walks. (Not a count: a frozen object that another
    thread of the test process releases meanwhile leaves the permanent generation.)"""
    collectable = {id(o) for o in gc.get_objects()}
    return all(gc.is_tracked(o) and id(o) not in collectable for o in objects)


def test_a_nested_scope_settles_into_the_outer_one() -> None:
    """The analysis inside the `analyze` command's scope: its objects are frozen, and the
    heap stays frozen until the command's scope ends."""
    with settled_heap():
        with settled_heap() as settle:
            kept: list[object] = [[] for _ in range(1000)]
            assert not frozen(kept)
            settle()
            assert frozen(kept)
        assert frozen(kept)   # not given back yet
    assert gc.get_freeze_count() == 0 and not frozen(kept)


def test_a_hosts_freeze_is_left_alone() -> None:
    """Neither frozen again (the count would grow by what was built since) nor unfrozen (it
    would drop to 0). NB: not `== before`: a frozen object that another thread of the test
    process releases meanwhile (a worker that ran Ray) leaves the permanent generation."""
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with settled_heap() as settle:
            built = [[] for _ in range(1000)]   # tracked by the collector: a freeze counts them
            settle()
            assert 0 < gc.get_freeze_count() <= before
        assert 0 < gc.get_freeze_count() <= before
        del built
    finally:
        gc.unfreeze()


def test_eager_simulation_does_not_depend_on_the_collector() -> None:
    module, inputs = build_tiny_gpt()
    running = simulate_eager_memory(module, inputs)
    with settled_heap():
        frozen = simulate_eager_memory(module, inputs)
    gc.disable()
    try:
        off = simulate_eager_memory(module, inputs)
    finally:
        gc.enable()
    assert running.timeline == frozen.timeline == off.timeline
    assert running.peak_bytes == frozen.peak_bytes == off.peak_bytes > 0


def test_the_collector_is_off_until_the_model_is_loaded_then_runs_again() -> None:
    assert gc.isenabled()
    with collector_off_until_loaded():
        assert not gc.isenabled()
        with settled_heap():
            model_loaded()
            assert gc.isenabled()
        assert gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_start_up_that_loads_nothing_turns_the_collector_back_on() -> None:
    try:
        with collector_off_until_loaded():
            raise ValueError("a bad target")
    except ValueError:
        pass
    assert gc.isenabled()
    model_loaded()   # no start-up open: nothing to turn on, nothing turned off
    assert gc.isenabled()


def test_a_host_that_turned_the_collector_off_is_left_alone() -> None:
    gc.disable()
    try:
        with collector_off_until_loaded(), settled_heap():
            model_loaded()
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_analyze_command_leaves_the_collector_as_it_found_it(tmp_path: Path) -> None:
    """In process (tests, a notebook): on after a run, on after a load error, nothing frozen."""
    model = Path(__file__).parents[1] / "models" / "tiny_gpt.py"
    assert main([str(model), "--quiet", "--no-pages", "--json", str(tmp_path / "r.json")]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert main([str(tmp_path / "missing.py"), "--quiet"]) == 2
    assert gc.isenabled() and gc.get_freeze_count() == 0
