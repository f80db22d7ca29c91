"""One owner per data directory: an exclusive lock on ``DATA_DIR/.lock``.

Two processes writing one data directory lose acknowledged writes: a second server
builds its own FAISS index and never sees the first one's upserts, and a file
swapped under a running server (``normcal restore``) is written through an unlinked
inode and vanishes at shutdown. So ``normcal serve`` (whatever its storage: the data
dir also keeps the fit jobs and the exported model graph) and ``normcal restore``
take ``fcntl.flock(LOCK_EX)`` on ``.lock`` before they open anything, and hold it
for the process's life. The kernel releases it when the holder's last descriptor
closes, however the process ends (``kill -9`` included), so a stale lock cannot
outlive its owner and there is nothing to clean up by hand. The file keeps the
holder's pid and command, for the message the next process prints; it is never
removed (removing a lock file races another process opening it).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

LOCK_FILE = ".lock"
DIR_MODE = 0o700
_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


class DataDirBusyError(Exception):
    """Another live process holds the data directory's lock."""

    def __init__(self, data_dir: Path, holder: str) -> None:
        self.data_dir = data_dir
        self.holder = holder  # "pid 1234 (normcal serve)", or "another process"
        super().__init__(f"data dir {data_dir} is in use by {holder}")


class DataDirLock:
    """The held lock of one data directory; :meth:`release` (or ``with``) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Close the descriptor, which releases the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def lock_data_dir(data_dir: Path, command: str) -> DataDirLock:
    """Take ``data_dir``'s lock for ``command`` (``DataDirBusyError`` if held).

    Creates the directory (0700) when it is absent. On a read-only directory the
    lock file is opened read-only when it exists (``flock`` needs no write access;
    no pid is recorded then); other ``OSError`` s propagate.
    """
    data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    writable = True
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as error:
        if error.errno not in _READ_ONLY or not path.is_file():
            raise
        fd, writable = os.open(path, os.O_RDONLY | os.O_CLOEXEC), False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise DataDirBusyError(data_dir, holder) from None
    except BaseException:
        os.close(fd)
        raise
    if writable:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} normcal {command}\n".encode(), 0)
    return DataDirLock(path, fd)


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says (it may not have written it yet)."""
    try:
        pid, _, command = os.pread(fd, 256, 0).decode().strip().partition(" ")
    except (OSError, UnicodeDecodeError):
        return "another process"
    if not pid.isdigit():
        return "another process"
    return f"pid {pid} ({command})" if command else f"pid {pid}"
