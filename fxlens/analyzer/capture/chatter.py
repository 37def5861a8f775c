"""Torch's diagnostics while we capture or run a model on fake tensors go to our debug log.

A failing capture link, or a fake run that falls back to real tensors, is expected and
reported by us (capture notes, the method label); what torch prints about it on the way is
noise on the user's terminal. `torch_chatter_to_debug_log()` wraps one such step:

- warnings raised during it are caught for that call and logged at debug level;
- the partial graph that ``torch.export`` prints when a trace hits data-dependent control
  flow is logged at debug level by `export_prints_logged`, which the export itself wraps
  (importing torch.export's tracer costs about 0.45 s: a step that does not export, such as
  the proof of repeated blocks running beside it, does not pay it);
- records of the torch loggers in `QUIETED_TORCH_LOGGERS` (the fake-tensor mode logs a full
  ERROR traceback whenever a meta kernel refuses a call, even when the caller handles it; the
  symbolic-shapes module warns "Unable to find user code corresponding to {u0}" when a trace
  meets a data-dependent value) are held back and summarised in one debug line: how many,
  and the first one's message.

Nothing process-wide is swapped: ``sys.stderr``, file descriptors, handlers and levels are
untouched. The print shadow and the logger filter are installed for the duration of the step
only, counted, so nested or concurrent steps share them and the last one out removes them.
Torch's other loggers are left to the application (the CLI quiets them below ERROR).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import logging
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

QUIETED_TORCH_LOGGERS = (
    "torch._subclasses.fake_tensor",
    "torch.fx.experimental.symbolic_shapes",   # its own handler: our level does not reach it
)


@contextlib.contextmanager
def torch_chatter_to_debug_log() -> Iterator[None]:
    """Warnings, ``torch.export``'s failure dumps and the fake-tensor mode's log records of
    one step go to the debug log (see the module docstring)."""
    held: list[logging.LogRecord] = []
    with warnings.catch_warnings(record=True) as caught, _torch_records_held(held):
        yield
    for warning in caught:
        log.debug("warning during capture: %s: %s (%s:%s)", warning.category.__name__,
                  warning.message, warning.filename, warning.lineno)
    if held:
        log.debug("torch logged %d message(s) during capture, held back; the first: %s: %s",
                  len(held), held[0].name, _one_line(held[0]))


def _one_line(record: logging.LogRecord) -> str:
    message = record.getMessage().splitlines()[0] if record.getMessage() else ""
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        message += f" ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    return message[:300]


class _HoldTorchRecords(logging.Filter):
    """Drops the records of the loggers it filters into the lists of the steps running."""

    def __init__(self) -> None:
        super().__init__()
        self.sinks: list[list[logging.LogRecord]] = []

    def filter(self, record: logging.LogRecord) -> bool:
        for sink in self.sinks:
            sink.append(record)
        return False


_lock = threading.Lock()
_holder = _HoldTorchRecords()


@contextlib.contextmanager
def _torch_records_held(sink: list[logging.LogRecord]) -> Iterator[None]:
    with _lock:
        if not _holder.sinks:
            for name in QUIETED_TORCH_LOGGERS:
                logging.getLogger(name).addFilter(_holder)
        _holder.sinks.append(sink)
    try:
        yield
    finally:
        with _lock:
            # by identity: `list.remove` takes the first *equal* list, and two steps' sinks
            # are equal whenever they hold the same records (both empty, say)
            _holder.sinks[:] = [held for held in _holder.sinks if held is not sink]
            if not _holder.sinks:
                for name in QUIETED_TORCH_LOGGERS:
                    logging.getLogger(name).removeFilter(_holder)


_shadow_users = 0


@contextlib.contextmanager
def export_prints_logged() -> Iterator[None]:
    """NB: torch 2.13 prints a failed trace's partial graph with a bare ``print(...,
    file=sys.stderr)`` in ``torch.export._trace`` (``_log_export_wrapper``), with no switch to
    turn it off. While a step runs, that module's global name ``print`` is shadowed by one
    that logs; builtins, ``sys.stderr`` and file descriptors are untouched."""
    global _shadow_users
    try:
        module = importlib.import_module("torch.export._trace")
    except ImportError:  # torch moved it: nothing to shadow
        module = None
    if module is None or vars(module).get("print", _print_to_log) is not _print_to_log:
        yield   # someone else shadows it already: leave theirs alone
        return
    with _lock:
        _shadow_users += 1
        module.print = _print_to_log  # type: ignore[attr-defined]
    try:
        yield
    finally:
        with _lock:
            _shadow_users -= 1
            if _shadow_users == 0:
                del module.print


def _print_to_log(*values: object, sep: str | None = " ", end: str | None = "\n",
                  file: Any = None, flush: bool = False) -> None:
    if file is not sys.stderr:
        builtins.print(*values, sep=sep, end=end, file=file, flush=flush)
        return
    log.debug("torch.export printed during capture:\n%s", (sep or " ").join(map(str, values)))
