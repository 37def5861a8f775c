"""`settled_heap()`: keep Python's cyclic garbage collector off what an analysis keeps alive.

An analysis builds hundreds of thousands of long-lived objects (torch and transformers
modules, the loaded model, the captured graph with its nodes, specs and references). Every
full (oldest-generation) collection walks all of them again, and allocation-heavy phases
trigger many: on hf:llama-2-7b ``--train`` at seq 2048 the collector took 3.4 s of a 17.5 s
run. ``gc.freeze()`` moves everything alive at that moment into a permanent generation that
collections skip; `settled_heap` does that when an analysis starts and again each time
`settle()` is called (after a capture), and gives the objects back to the collector at the
end (``gc.unfreeze()``), so garbage among them is collected as before once the analysis is
over — a long-lived process (a sweep's worker) leaks nothing.

Why this cannot move a number: no figure depends on when cyclic garbage is collected. The
only place where object lifetimes are measured is the eager-memory simulation
(`fxlens.analyzer.memory.measure`), where fake storages are freed by reference counting; on
every model of the test zoo (``tests/models/hf_zoo.py``, 30 architectures) its timeline is
identical with the collector running, disabled, and with the heap frozen (bench/README.md,
"Issue 15").

A host process that froze objects itself (``gc.get_freeze_count() > 0``) is left alone.

A one-shot process (the ``analyze`` command) ends differently: everything alive when it is
done goes out with it. Its whole run is one `settled_heap`, so the analysis's own scope nests
in it and the heap stays frozen while the report is written: given back at the analysis's
end, the first allocations of the writing set off a full collection of everything (0.4 s of
hf:llama-2-7b ``--train``'s run). `freeze_for_exit()` then freezes it all for good, and the
interpreter's last collection at exit walks none of it (that walk took 1.35 s on
hf:llama-3-70b).

Its start-up is quieter still: importing torch and transformers and building the model make
hundreds of thousands of objects that all live to the end, and each full collection that
their allocations set off walks everything built so far and frees nothing (0.45 s of the 5.5 s
``analyze hf:llama-3-70b --seq-len 2048``: 0.27 s in full collections before the model was
loaded). `collector_off_until_loaded()` turns the collector off for the command;
`model_loaded()`, called where the analysis has frozen the loaded heap, turns it back on, so
the analysis itself is collected exactly as before. The only garbage left uncollected is
start-up's own cycles, frozen with the rest. NB: that includes cycles a model file's own code
leaves while it loads; tensors are freed by reference counting as always.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_owned = False   # a settled_heap of this process is open and gives the heap back at its end
_until_loaded = False   # the collector is off until the model is loaded (the analyze command)


@contextmanager
def settled_heap() -> Iterator[Callable[[], None]]:
    """Freeze the heap now; the yielded `settle()` freezes what was built since; unfreeze
    at the end. A no-op when the process had frozen objects of its own. Inside another
    `settled_heap` it freezes into that one's scope, which gives the heap back at its end."""
    global _owned
    if _owned:
        gc.freeze()
        yield gc.freeze
        return
    ours = gc.get_freeze_count() == 0

    def settle() -> None:
        if ours:
            gc.freeze()

    settle()
    _owned = ours
    try:
        yield settle
    finally:
        if ours:
            _owned = False
            gc.unfreeze()


def freeze_for_exit() -> None:
    """A process about to end: keep the interpreter's last collection off everything alive.
    Reference counting still frees what it frees; only cycles left over are not walked."""
    gc.freeze()


@contextmanager
def collector_off_until_loaded() -> Iterator[None]:
    """The collector off until `model_loaded()`; on again at the end if no model was loaded
    (a bad target, a load error). A host that turned the collector off is left alone."""
    global _until_loaded
    if not gc.isenabled():
        yield
        return
    gc.disable()
    _until_loaded = True
    try:
        yield
    finally:
        if _until_loaded:
            _until_loaded = False
            gc.enable()


def model_loaded() -> None:
    """Called inside a `settled_heap`, once the model is loaded: that heap's freeze has taken
    what start-up built, so the collector runs again over what the analysis builds."""
    global _until_loaded
    if _until_loaded:
        _until_loaded = False
        gc.enable()
