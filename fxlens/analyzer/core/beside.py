"""`beside(work)`: run `work` in a forked copy of this process while this one goes on.

Three pairs of slow steps need nothing from each other, so on a machine with two cores one
of each pair runs in a child process while the parent does the other; the child sends its
result back pickled (plain data) and exits:

- the capture's proof, a fake forward (`fxlens.analyzer.capture.blocks.find_repeats`), and the
  export of each group's first block on groups guessed from structure
  (`fxlens.analyzer.capture.chain`), which returns the converted nodes;
- the memory passes and the fusion analysis of a big graph (`fxlens.pipeline`), which returns
  the kernels and findings;
- the report's JSON and its pages (`fxlens.cli.analyze`), which returns the paths written.

Forking is only safe in a process whose threads are all known: a thread holding a lock at the
moment of the fork leaves that lock held forever in the child. So it is off unless the
process's owner turns it on (`allow_forking`): the ``analyze`` console script does, where the
only other thread is the terminal's progress spinner, which the child never touches (it
writes nothing to the terminal and ends with ``os._exit``, running no exit handlers). A
library caller (a notebook kernel, a Ray worker with gRPC threads, a test runner) keeps the
default: the same work, one step after the other. Forking is also off where ``fork`` is
missing or unsafe (Windows, macOS), on a single core, where it would only add a process, and
once this process has started CUDA, which a forked child cannot use.

The child is never trusted to finish (a lock it inherited held, a crash): `Beside.result`
waits at most `MIN_WAIT_S` or `WAIT_FACTOR` times as long as the parent worked beside it,
whichever is longer (the export of a model's unique blocks takes 0.4–0.8× the proof's time
on the presets; a child that needs five times as long is stuck), or as long as the caller
says (pages wait for graphviz's own budgets), then kills it and raises `BesideError`, and
the caller does the work itself.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

MIN_WAIT_S = 10.0
WAIT_FACTOR = 5.0
_allowed = False


class BesideError(Exception):
    """The work beside failed, died or took too long: do it here instead."""


def allow_forking() -> None:
    """Say this process may fork (its owner knows all its threads)."""
    global _allowed
    _allowed = True


def can_fork() -> bool:
    return (_allowed and sys.platform == "linux" and hasattr(os, "fork")
            and len(os.sched_getaffinity(0)) >= 2 and not _cuda_initialized())


def _cuda_initialized() -> bool:
    """A forked child cannot use the CUDA this process started (torch refuses it there)."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


class Beside:
    """`work` running in a forked child; `result()` waits for what it returned."""

    def __init__(self, work: Callable[[], Any]) -> None:
        for stream in (sys.stdout, sys.stderr):   # nothing buffered is written twice
            with contextlib.suppress(Exception):
                stream.flush()
        read, write = os.pipe()
        try:
            self._pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            raise
        if self._pid == 0:
            os.close(read)
            _child(work, write)                   # never returns
        os.close(write)
        self._read: int | None = read
        self._started = time.monotonic()

    def result(self, timeout_s: float | None = None) -> Any:
        """What `work` returned; `BesideError` if it raised, died or took more than
        `timeout_s` from now (by default `MIN_WAIT_S`, or `WAIT_FACTOR` times as long as
        the parent worked beside it, whichever is longer)."""
        if self._read is None:
            raise BesideError("the work beside was already collected")
        now = time.monotonic()
        if timeout_s is None:
            timeout_s = max(MIN_WAIT_S, WAIT_FACTOR * (now - self._started))
        chunks, deadline = [], now + timeout_s
        ready = select.poll()         # poll, not select: any fd number (select stops at 1024)
        ready.register(self._read, select.POLLIN)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not ready.poll(left * 1000):
                    raise BesideError(f"the work beside took more than {timeout_s:.0f} s")
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            self.close()
        try:
            with warnings.catch_warnings():  # torch's pytree specs warn when unpickled
                warnings.simplefilter("ignore", FutureWarning)
                status, value = pickle.loads(b"".join(chunks))
        except Exception as error:    # the child died before it wrote everything
            raise BesideError(f"the work beside ended without a result ({error})") from None
        if status != "ok":
            raise BesideError(value)
        return value

    def close(self) -> None:
        """Stop the child if it still runs and reap it."""
        if self._read is None:
            return
        os.close(self._read)
        self._read = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self._pid, 0)


def _child(work: Callable[[], Any], write: int) -> None:
    # The collector would walk the whole inherited heap, touching every object and so
    # copying every page it shares with the parent; the child lives seconds: no collection.
    gc.disable()
    try:
        try:
            payload = pickle.dumps(("ok", work()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as error:   # noqa: BLE001 - whatever it was, the parent is told
            payload = pickle.dumps(("error", f"{type(error).__name__}: {error}"))
        with os.fdopen(write, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(0)


def result_or_none(started: Beside | None, what: str, timeout_s: float | None = None) -> Any:
    """What the work started beside returned; None where none was started or it failed (said
    in the log): the caller then does the work itself."""
    if started is None:
        return None
    try:
        return started.result(timeout_s)
    except BesideError as error:
        log.info("%s made beside is not used: %s", what, error)
        return None


@contextlib.contextmanager
def beside(work: Callable[[], Any] | None) -> Iterator[Beside | None]:
    """`work` started in a forked child if this process may fork (else None: the caller
    does it itself when it needs it); the child is stopped on the way out. No `work`:
    nothing to start, None."""
    started = None
    if work is not None and can_fork():
        try:
            started = Beside(work)
        except OSError as error:     # no process or pipe to be had: the caller does it
            log.info("nothing started beside: %s", error)
    if started is None:
        yield None
        return
    try:
        yield started
    finally:
        started.close()
