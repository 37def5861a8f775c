"""Reading JSON files that may be hostile, and writing every output file atomically.

- `read_json(path, what)`: a regular file only (a FIFO would hang the read, ``/dev/zero``
  would fill memory), at most `MAX_JSON_BYTES`, strict UTF-8, strict JSON (no ``NaN`` /
  ``Infinity``, no number that overflows a float, no integer of more than 4300 digits), nested
  at most `MAX_DEPTH` deep. Every failure is one `ReportError` saying which rule the file
  broke.
- `write_atomic(path, data)`: a temporary file in the same folder, flushed and synced, then
  `os.replace`d over `path`, so a reader (or the next CI run reading a baseline) sees the old
  file or the new one, never half of one, even on a full disk. The file gets the permissions
  a plain ``open(path, "w")`` would give it (or keeps those of the file it replaces). Every
  writer in fxlens goes through it: report JSON, pages, diff outputs, device profiles.

Known limitation: the folder itself is not fsynced after the rename, so a power cut right
after a write may still lose the new name on some file systems (never the old content).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from fxlens.analyzer.core.errors import ReportError

MAX_JSON_BYTES = 512 * 2**20     # a llama-3-70b training report is a few tens of MiB
MAX_DEPTH = 64                   # a report nests about 6 deep


def read_json(path: Path | str, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the regular file `path`; `ReportError` naming `what` otherwise."""
    raw = read_regular(path, what, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ReportError(f"cannot read {what} {path}: not UTF-8 text (byte {error.start})"
                          ) from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ReportError(f"cannot read {what} {path}: nested deeper than {MAX_DEPTH} levels"
                          ) from None
    except ValueError as error:  # JSONDecodeError, the bad constants, over-long integers
        raise ReportError(f"cannot read {what} {path}: {error}") from None
    check_depth(data, f"{what} {path}")
    return data


def read_regular(path: Path | str, what: str = "file", max_bytes: int = MAX_JSON_BYTES
                 ) -> bytes:
    """The bytes of `path` when it is a regular file of at most `max_bytes`.

    Opened non-blocking first, so a FIFO or a device is refused by `fstat` instead of hanging
    the read or streaming forever."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise ReportError(f"cannot read {what} {path}: {error.strerror or error}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ReportError(f"cannot read {what} {path}: not a regular file "
                              f"({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise ReportError(f"cannot read {what} {path}: {info.st_size} bytes, over the "
                              f"{max_bytes}-byte limit")
        try:
            raw = file.read(max_bytes + 1)
        except OSError as error:
            raise ReportError(f"cannot read {what} {path}: {error.strerror or error}"
                              ) from None
    if len(raw) > max_bytes:
        raise ReportError(f"cannot read {what} {path}: over the {max_bytes}-byte limit")
    return raw


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows (fxlens writes finite numbers only)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} does not fit a 64-bit float")
    return value


def check_depth(data: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """`ReportError` when lists and objects in `data` nest deeper than `limit` (iterative, so
    a hostile file cannot exhaust the recursion limit here or in whoever reads it next)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            raise ReportError(f"cannot read {where}: nested deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically; `ReportError` in one line if not."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    check_writable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise ReportError(f"cannot write {path}: {error.strerror or error}") from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp, _mode_for(path))
        os.replace(temp, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise ReportError(f"cannot write {path}: {error.strerror or error}") from None
    return path


def check_writable(path: Path | str) -> None:
    """`ReportError` unless `path` can be written: not a folder, and its nearest existing
    folder a writable folder (the missing ones are created when writing). Creates nothing, so
    the CLI checks every output path before an analysis starts."""
    path = Path(path)
    if path.is_dir():
        raise ReportError(f"cannot write {path}: it is a directory")
    for folder in path.absolute().parents:
        if folder.exists():
            break
    if not folder.is_dir():
        raise ReportError(f"cannot write {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ReportError(f"cannot write {path}: the folder {folder} is not writable")


def _mode_for(path: Path) -> int:
    """The mode of the file being replaced, else what ``open(path, "w")`` gives (umask)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
