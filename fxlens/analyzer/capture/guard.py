"""User code under a guard: whatever a model file does, fxlens ends with its own exit code.

A model file is arbitrary Python, run in fxlens's process: its import, ``build()``, its
``forward`` (during the capture) and its ``calibration()`` batches. Any of them may try to
end the run — ``sys.exit(0)`` (which would read as success under ``--fail-on``),
``sys.exit(1)`` (a tripped gate), ``os._exit(0)`` (nothing written, status 0) or a
`BaseException` of its own (a traceback).

- `user_code(what)`: around a call into user code, turns a `SystemExit` or other
  non-`Exception` `BaseException` into one `LoadError` (exit 2) saying who ended the run.
- `trapped_exit()`: while the CLI runs a command, ``os._exit`` in this process raises
  `UserExit` instead of ending it; forked children still exit for real.
- `user_exit_message`: the one line the CLI prints for either.

Kept free of torch, so the CLI can enter the trap before it knows whether it will need torch.

Known limit: a model that kills its own process (``os.kill(os.getpid(), SIGKILL)``,
``os.abort()``, a segfault in an extension) cannot be caught; the CLI then writes nothing and
the shell sees the signal's status (128 + N), never 0 or 1.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator

from fxlens.analyzer.core.errors import LoadError


class UserExit(BaseException):
    """Raised in place of ``os._exit`` while `trapped_exit` is active."""

    def __init__(self, code: object) -> None:
        super().__init__(f"os._exit({code!r})")
        self.code = code


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run user code (a model file, its factory, its calibration batches): a `SystemExit`
    (``sys.exit(0)`` in ``build()``) or any other `BaseException` it raises becomes one
    `LoadError` saying who ended the run, so the CLI exits 2 instead of 0 or 1 (which CI reads
    as success or a tripped gate). Ctrl-C (`KeyboardInterrupt`) passes through."""
    try:
        yield
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except Exception:
        raise
    except BaseException as error:
        raise LoadError(user_exit_message(what, error)) from error


def user_exit_message(what: str, error: BaseException) -> str:
    """One line for user code that tried to end the process or raised a `BaseException`."""
    if isinstance(error, SystemExit):
        kind = f"called sys.exit({error.code!r})"
    elif isinstance(error, UserExit):
        kind = f"called {error}"
    else:
        kind = f"raised {type(error).__name__} (a BaseException): {error}"
    from fxlens.analyzer.capture.fx_convert import user_frame

    frames = traceback.extract_tb(error.__traceback__)
    where = user_frame([(f.filename, f.lineno or 0) for f in frames])
    return (f"{what}: the model's code {kind}{f' at {where}' if where else ''}; fxlens stops "
            f"here without a report (a model file must return its module, not end the process)")


@contextlib.contextmanager
def trapped_exit() -> Iterator[None]:
    """While active, ``os._exit`` in this process raises `UserExit` instead of ending it
    without a word (and with status 0) — user code may call it anywhere, from ``build()`` to
    its ``forward``. Forked children (another pid) still exit for real."""
    real, owner = os._exit, os.getpid()

    def _exit(code: int) -> None:
        if os.getpid() != owner:
            real(code)
        raise UserExit(code)

    os._exit = _exit  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real
