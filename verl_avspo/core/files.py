"""Writing a file so that nothing is lost or torn: the one way every file of the package is written
(run state, parquet, report, JSON, plots, summaries). Framework-free (standard library only).

A file is written to a temporary name beside its target and renamed into place once complete
(``os.replace`` is atomic on one file system), so a write that fails or is killed leaves the old file,
or nothing, never a torn one. A target that exists and is not a regular file (a folder, ``/dev/full``)
is refused rather than renamed over, and an existing file is replaced only when the caller says so.
``check_target`` (a file) and ``check_folder`` (a folder made on first use) refuse, before any work,
what cannot be written. Every failure names the path, what the system said and what to do.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["FileWriteError", "check_target", "check_folder", "atomic_write", "write_text"]

# What to do about each way a write fails; the rest get the system's own words.
_FIXES = {
    errno.ENOSPC: "no space left on the device: free some space or write elsewhere",
    errno.EDQUOT: "the disk quota is exceeded: free some space or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EACCES: "permission denied: write to a folder you can write to",
    errno.EPERM: "operation not permitted: write to a folder you can write to",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.ENOENT: "its folder does not exist: create it or choose another path",
}


class FileWriteError(OSError):
    """A file could not be written. The message names the path, the cause and the fix."""

    def __str__(self) -> str:  # the message alone: OSError's "[Errno 28] ...: 'path'" repeats the path
        return self.strerror or super().__str__()


def _explain(path: Path, err: OSError) -> FileWriteError:
    cause = _FIXES.get(err.errno or 0, err.strerror or str(err))
    wrapped = FileWriteError(err.errno or 0, f"cannot write {path}: {cause}")
    wrapped.filename = str(path)
    return wrapped


def check_target(path: str | os.PathLike, *, overwrite: bool = False, how_to_overwrite: str = "") -> Path:
    """Refuse, before any work, a target that cannot be written or must not be replaced.

    Args:
        path: the file to write.
        overwrite: whether an existing regular file may be replaced.
        how_to_overwrite: what the user gives to replace an existing file (``"--force"``), said in the
            message; empty where the caller never replaces one.

    Returns:
        ``path`` as a Path.

    Raises:
        FileWriteError: the target is a folder or another non-regular file, an existing file without
            ``overwrite``, or its folder is missing, not a folder or not writable (a file is made and
            removed there to tell).
    """
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not path.is_file():
            kind = "a folder" if path.is_dir() else "not a regular file"
            raise FileWriteError(errno.EEXIST, f"cannot write {path}: it is {kind}; name a file to write instead")
        if not overwrite:
            fix = f" (pass {how_to_overwrite} to replace it)" if how_to_overwrite else ""
            raise FileWriteError(errno.EEXIST, f"{path} exists and would be overwritten: name another file{fix}")
    if _writable_ancestor(path.parent, path) != path.parent.absolute():
        raise _explain(path, OSError(errno.ENOENT, "no such folder"))
    return path


def check_folder(folder: str | os.PathLike) -> Path:
    """Refuse, before any work, a folder that cannot be made and written in (one that does not exist yet
    is made on first use, as ``os.makedirs`` would): its nearest existing ancestor must be a folder that
    takes new files.

    Returns:
        That ancestor, absolute (``folder`` itself when it exists).

    Raises:
        FileWriteError: ``folder`` or one above it is a file, or the ancestor is not writable.
    """
    folder = Path(folder)
    return _writable_ancestor(folder, folder)


def _writable_ancestor(folder: Path, target: Path) -> Path:
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise _explain(target, OSError(errno.ENOTDIR, "not a folder"))
    # A file made and removed there, rather than os.access: root passes os.access on a read-only mount,
    # and /proc or a FUSE folder may refuse what the mode bits allow.
    try:
        handle, probe = tempfile.mkstemp(prefix=".avspo-probe.", dir=existing)
    except OSError as err:
        if err.errno == errno.ENOENT:  # the folder is there but makes no file: /proc
            raise FileWriteError(
                err.errno, f"cannot write {target}: {existing} takes no new files; write elsewhere"
            ) from err
        raise _explain(target, err) from err
    os.close(handle)
    os.unlink(probe)
    return existing


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; once the block ends without an error, it replaces ``path``.

    The caller writes the whole file to the yielded path (any writer that takes a path: ``torch.save``,
    ``pyarrow.parquet.write_table``, ``Figure.savefig``). On an error or an interrupt the temporary file
    is removed and ``path`` is left as it was; an OSError becomes a :class:`FileWriteError` naming ``path``.

    Raises:
        FileWriteError: ``path`` is a folder or not a regular file, or the write or the rename failed.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        check_target(path, overwrite=True)  # raises: a folder or a device is never renamed over
    try:
        handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _explain(path, err) from err
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb+") as written:  # on disk before the rename, so a crash cannot tear it
            os.fsync(written.fileno())
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o7777)
        else:
            os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except OSError as err:
        temporary.unlink(missing_ok=True)
        raise _explain(path, err) from err
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_write`; returns the path."""
    with atomic_write(path) as temporary:
        temporary.write_text(text)
    return Path(path)
