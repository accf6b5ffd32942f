"""Every file call the storage makes goes through one ``Files`` object.

Tests swap in a subclass that fails a call with ENOSPC or EIO, writes short,
or forgets what was never fsynced (``tests/faultfs.py``); the storage itself
never calls ``os`` for file I/O directly.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil

# preadv's flag for "only what the page cache holds" (Linux 4.14+); None where absent.
_NOWAIT = getattr(os, "RWF_NOWAIT", None)


class Files:
    """The real thing: thin wrappers around ``os``."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def pread_cached(self, fd: int, size: int, offset: int) -> bytes | None:
        """``pread`` that never waits for the disk: what the page cache holds of the
        range (possibly less than asked), or None when nothing of it is there or the
        system cannot read that way."""
        if _NOWAIT is None:
            return None
        buf = bytearray(size)
        try:
            n = os.preadv(fd, [buf], offset, _NOWAIT)
        except BlockingIOError:
            return None
        except OSError as err:
            if err.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                return None
            raise
        del buf[n:]
        return bytes(buf)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def mkdir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def open_file_limit() -> int:
    """This process's open-file limit (``ulimit -n``, RLIMIT_NOFILE's soft limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def describe(err: OSError) -> str:
    """What an OSError means to an operator: the open-file limit, named as such (with
    the command that raises it), never as disk space."""
    if err.errno in (errno.EMFILE, errno.ENFILE):
        which = ("this process's open-file limit" if err.errno == errno.EMFILE
                 else "the system's open-file limit (fs.file-max)")
        return (f"{err.strerror or err}: {which} ({open_file_limit()} for this process) is "
                f"reached; raise it (`ulimit -n 65536` before starting, or LimitNOFILE= "
                f"for a systemd service)")
    return str(err.strerror or err)


# What a new DiskStore uses; tests replace it (monkeypatch) with a faulty one.
current: Files = Files()
