"""Output files: an entry's MP4 on disk is either complete or not there at all.

A regular file (new or existing) is written to a temporary ``<name>.part`` beside it and put in place by
``os.replace`` only once the container closed cleanly, so a failed or cancelled session, or one whose last
write hits a full disk, leaves whatever was at the path before — byte for byte — and removes only the
temporary file. Anything else at the path (a character device, a FIFO) is no file to replace and not ours to
remove: it is written directly and left in place. With ``provenance=`` it is refused when the options are
built (:func:`check_output_files` with ``signed``): written as the bytes come, it holds nothing to sign once
the last one is written, and an unsigned output would be lost without a word.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

__all__ = ["OutputFile", "check_output_files"]

_WRITE_FLAGS = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
# O_EXCL: a temporary name that exists belongs to someone else (another render, another program).
_CREATE_FLAGS = _WRITE_FLAGS | os.O_CREAT | os.O_EXCL
# Fresh random names tried after ``<name>.part`` before giving up (each collision is a 2**-32 event).
_NAME_ATTEMPTS = 16


def check_output_files(paths: object, *, signed: bool = False) -> list[Path]:
    """``paths`` as one :class:`~pathlib.Path` per batch entry, checked before any work starts.

    ``signed`` (the session has ``provenance``): a device or FIFO among them is a ValueError, since a file
    written as its bytes come cannot be signed once they are all there.

    ValueError for a single path (a ``str`` would otherwise be one path per character), an element that is
    not ``str`` / ``os.PathLike``, or two entries naming the same file; and the ``OSError`` that
    opening a path would raise (``IsADirectoryError``, ``FileNotFoundError`` for a missing directory,
    ``NotADirectoryError``, ``PermissionError``), without leaving anything behind. A FIFO is not opened here:
    opening one for writing waits for its reader.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise ValueError(
            f"output_files must be a sequence with one path per batch entry, got the single path {paths!r}: "
            f"pass [{paths!r}]"
        )
    if not isinstance(paths, Sequence):
        raise ValueError(
            f"output_files must be a sequence with one path per batch entry, got {type(paths).__name__}"
        )
    checked: list[Path] = []
    for entry, path in enumerate(paths):
        name = os.fspath(path) if isinstance(path, os.PathLike) else path
        if not isinstance(name, str):
            raise ValueError(f"output_files[{entry}] must be a str or os.PathLike path, got {path!r}")
        checked.append(Path(name))
    seen: dict[str, int] = {}
    for entry, path in enumerate(checked):
        resolved = os.path.realpath(path)
        if resolved in seen:
            first = seen[resolved]
            raise ValueError(
                f"output_files[{first}] ({str(checked[first])!r}) and output_files[{entry}] ({str(path)!r}) "
                f"are the same file {resolved!r}: each batch entry needs its own path"
            )
        seen[resolved] = entry
    for entry, path in enumerate(checked):
        _check_writable(path)
        status = _stat_or_none(path)
        if signed and status is not None and not stat.S_ISREG(status.st_mode):
            raise ValueError(
                f"output_files[{entry}] ({str(path)!r}) is no regular file (a device or a FIFO): written as "
                "the MP4 is made, it cannot be signed once it is; with provenance=, give a regular file path"
            )
    return checked


def _check_writable(path: Path) -> None:
    """Raise what opening ``path`` for writing would raise; create nothing that outlives the check."""
    status = _stat_or_none(path)
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if status is not None and not stat.S_ISREG(status.st_mode):
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return
    # A regular file is replaced through a temporary file beside it: that is what has to be creatable.
    try:
        fd, temporary = _create_temporary(Path(os.path.realpath(path)))
    except OSError as error:
        raise type(error)(error.errno, error.strerror, str(path)) from None
    os.close(fd)
    os.unlink(temporary)


def _stat_or_none(path: Path) -> os.stat_result | None:
    """``os.stat(path)``, or None if nothing is there; a missing or non-directory parent raises."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _create_temporary(target: Path) -> tuple[int, Path]:
    """A new file beside ``target`` that nobody else made: ``<name>.part``, else ``<name>.<random>.part``."""
    name = f"{target.name}.part"
    for _ in range(_NAME_ATTEMPTS):
        temporary = target.with_name(name)
        try:
            return os.open(temporary, _CREATE_FLAGS, 0o666), temporary
        except FileExistsError:
            name = f"{target.name}.{secrets.token_hex(4)}.part"
    raise FileExistsError(errno.EEXIST, "no free temporary name beside the output file", str(target))


class OutputFile:
    """One MP4 written to ``path``: nothing lost, nothing half-written.

    :meth:`open`, then :meth:`write` as bytes are produced, then :meth:`commit` once the container closed
    cleanly, or :meth:`abort`. A regular file (or a new one) appears at ``path`` only in :meth:`commit`,
    complete and flushed to disk, with the mode of the file it replaces (a new file gets ``0o666`` less the
    umask); until then the bytes go to a temporary ``<name>.part`` beside it, which :meth:`abort` — or a
    failing :meth:`commit` — removes, leaving ``path`` untouched. A device or FIFO at ``path`` is written
    directly and never replaced or removed; its write errors (``ENOSPC``…) are raised unchanged.

    Blocking calls: use it from a worker thread, one caller at a time.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._state: Literal["new", "open", "committed", "aborted"] = "new"
        self._fd: int | None = None
        self._temporary: Path | None = None  # None when writing in place
        self._target: Path | None = None

    def open(self) -> None:
        """Open the temporary file (or the device); raises the ``OSError`` the file system gives."""
        if self._state != "new":
            raise RuntimeError(f"OutputFile.open() on a file that is {self._state}")
        status = _stat_or_none(self.path)
        if status is not None and not stat.S_ISREG(status.st_mode):
            self._fd = os.open(self.path, _WRITE_FLAGS)  # a directory raises IsADirectoryError here
            self._state = "open"
            return
        # Beside the real file, so that a symlinked path keeps its link and the replace stays one rename.
        self._target = Path(os.path.realpath(self.path))
        self._fd, self._temporary = _create_temporary(self._target)
        self._state = "open"
        if status is not None:
            try:
                os.fchmod(self._fd, stat.S_IMODE(status.st_mode))
            except BaseException:
                self.abort()
                raise

    def write(self, data: bytes) -> None:
        """Write all of ``data``; an ``OSError`` (disk full, file too large) is raised as it is."""
        if self._fd is None:
            raise RuntimeError(f"OutputFile.write() on a file that is {self._state}")
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def commit(self, *, sign: Callable[[Path, Path], None] | None = None) -> None:
        """Flush to disk and put the file in place; on any failure remove the temporary file and raise.

        ``sign(source, destination)`` (Content Credentials) writes the complete file, signed, to a second
        temporary file, which is what is put in place: a failure to sign leaves ``path`` as it was. A device
        or FIFO was written as it went: there is nothing left to sign.
        """
        if self._state != "open":
            raise RuntimeError(f"OutputFile.commit() on a file that is {self._state}")
        try:
            if self._temporary is not None:
                assert self._fd is not None
                os.fsync(self._fd)  # the bytes are on disk before the name points at them
            self._close_fd()  # close reports late write errors (NFS, quotas) too
            if self._temporary is not None:
                assert self._target is not None
                if sign is not None:
                    self._temporary = self._signed(self._temporary, self._target, sign)
                os.replace(self._temporary, self._target)
                self._temporary = None
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        if self._target is not None:
            _fsync_directory(self._target.parent)

    @staticmethod
    def _signed(temporary: Path, target: Path, sign: Callable[[Path, Path], None]) -> Path:
        """``temporary`` signed into a new temporary file beside ``target``, with its mode, on disk; the
        unsigned one removed. On a failure only the new one is removed (the caller removes the other)."""
        fd, signed = _create_temporary(target)
        try:
            os.close(fd)
            sign(temporary, signed)
            os.chmod(signed, stat.S_IMODE(os.stat(temporary).st_mode))
            fd = os.open(signed, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(signed)
            raise
        os.unlink(temporary)
        return signed

    def abort(self) -> None:
        """Close and remove the temporary file; ``path`` keeps what it had. A no-op after :meth:`commit`.

        Best effort: it runs while another error propagates, which must not be replaced by a cleanup error.
        """
        if self._state in ("committed", "aborted"):
            return
        self._state = "aborted"
        with contextlib.suppress(OSError):
            self._close_fd()
        temporary, self._temporary = self._temporary, None
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the descriptor is released even when this raises


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable. The file is complete and in place already, so a file system that cannot
    sync a directory (or a platform that cannot open one) does not turn the session into a failure."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
