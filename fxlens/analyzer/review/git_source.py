"""``git:REF:path/to/model.py``: a file as it was at a git ref, in a temporary folder.

`git_checkout(spec)` reads the file with git (``git archive``, so nothing in the work tree or
the index changes) into a temporary folder, at the same path relative to the repository root,
and yields its location; the folder is removed afterwards. The path is relative to the current
directory, as ``git show REF:./path`` reads it.

Only regular files are unpacked: a symlink at REF (absolute, or out of the folder) is left
out, never created or followed; the model file itself being one is an error.

Limitations (stated to the user in the README):
- Only the file and its sibling ``.py`` files at that ref are taken, so ``import layers`` of a
  module next to it works; sub-packages and modules elsewhere in the repository are imported
  from the current environment (the work tree or what is installed), not from REF.
- Sibling modules already imported in this process are set aside while the ref's copy runs,
  and put back afterwards, so the two sides do not share a cached ``layers`` module.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fxlens.analyzer.core.errors import LoadError

PREFIX = "git:"


@dataclass(frozen=True)
class GitTarget:
    ref: str
    path: str                   # as the user wrote it, relative to the current directory


def parse_git_target(spec: str) -> GitTarget:
    """``git:main:models/net.py`` → GitTarget("main", "models/net.py")."""
    ref, sep, path = spec[len(PREFIX):].partition(":")
    if not spec.startswith(PREFIX) or not sep or not ref or not path:
        raise LoadError(f"cannot read {spec!r}: expected git:REF:path/to/model.py, "
                        f"e.g. git:main:models/net.py")
    return GitTarget(ref, path)


@contextmanager
def git_checkout(target: GitTarget, cwd: Path | None = None) -> Iterator[Path]:
    """Yield a temporary copy of `target.path` (and its sibling .py files) as at `target.ref`."""
    cwd = Path.cwd() if cwd is None else cwd
    root = Path(_git(cwd, "rev-parse", "--show-toplevel").strip())
    relative = _relative_to_root(root, cwd, target.path)
    _git(cwd, "rev-parse", "--verify", "--quiet", f"{target.ref}^{{commit}}",
         what=f"unknown git ref {target.ref!r}")
    _git(root, "cat-file", "-e", f"{target.ref}:{relative}",
         what=f"{relative} does not exist at {target.ref}")
    files = _siblings(root, target.ref, relative)
    with tempfile.TemporaryDirectory(prefix="fxlens-git-") as folder:
        archive = _git_bytes(root, "archive", "--format=tar", target.ref, "--", *files)
        _extract_files(archive, folder, relative, target.ref)
        with _isolated_modules(PurePosixPath(f).stem for f in files):
            yield Path(folder) / relative


def _extract_files(archive: bytes, folder: str, relative: str, ref: str) -> None:
    """Extract the regular files of `archive` into `folder`. A symlink (which may point
    anywhere, absolute or out of the folder) is never followed nor created: a sibling that is
    one is left out, and the model file itself being one is a `LoadError`."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            members = tar.getmembers()
            for member in members:
                if member.name == relative and not member.isfile():
                    raise LoadError(f"{relative} at {ref} is a symlink or not a regular file; "
                                    f"git: targets must be regular files")
            regular = [m for m in members if m.isfile() or m.isdir()]
            tar.extractall(folder, members=regular, filter="data")
    except tarfile.TarError as error:
        raise LoadError(f"cannot unpack {relative} at {ref}: {error}") from None


def _relative_to_root(root: Path, cwd: Path, path: str) -> str:
    absolute = Path(os.path.abspath(cwd / path))
    try:
        return absolute.relative_to(root.resolve()).as_posix()
    except ValueError:
        try:
            return absolute.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            raise LoadError(f"{path} is outside the git repository at {root}") from None


def _siblings(root: Path, ref: str, relative: str) -> list[str]:
    """The file itself and the other .py files of its folder at `ref`."""
    folder = PurePosixPath(relative).parent
    spec = f"{ref}:{'' if str(folder) == '.' else folder}"
    listing = _git(root, "ls-tree", "--name-only", spec)
    names = [n for n in listing.splitlines() if n.endswith(".py")]
    files = {relative} | {(folder / n).as_posix() for n in names}
    return sorted(files)


@contextmanager
def _isolated_modules(names: Iterable[str]) -> Iterator[None]:
    """Set aside the cached modules of these names; drop what the block imports under them."""
    names = list(names)
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def _git(cwd: Path, *args: str, what: str = "") -> str:
    return _git_bytes(cwd, *args, what=what).decode()


def _git_bytes(cwd: Path, *args: str, what: str = "") -> bytes:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    except OSError as error:
        raise LoadError(f"cannot run git: {error}") from error
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip()
        raise LoadError(f"git {args[0]} failed in {cwd}: {what or detail or 'no message'}")
    return result.stdout
