"""A fault-injecting ``Files`` for the storage (as SQLite's test VFS is).

    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)   # before the broker starts
    files.fail("write", errno.ENOSPC)                # every write fails until healed
    files.fail("fsync", errno.EIO, times=1)          # the next fsync fails
    files.short_writes = True                        # writes stop half-way, then ENOSPC
    files.heal()
    with files.suspended(): ...                      # the test's own calls go through
    files.power_loss(data_path)                      # keep only what was fsynced
                                                     # (the logs and leases.journal)

It fails calls before they reach the disk, or writes short, and remembers how
much of each file was fsynced, so a test can cut every file back to that.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path
from typing import Iterator

from broker.storage.fileops import Files


class FaultyFiles(Files):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: dict[str, tuple[int, int | None]] = {}  # call -> (errno, times left)
        self._skip: dict[str, int] = {}                         # call -> good calls first
        self.short_writes = False
        self.failures = 0                         # calls failed so far
        self._paths: dict[int, str] = {}
        self._synced: dict[str, int] = {}         # path -> bytes known to be on disk

    # -- what to break ---------------------------------------------------------
    def fail(self, call: str, err: int = errno.ENOSPC, times: int | None = None,
             after: int = 0) -> None:
        """Make ``call`` (write, fsync, open, pread, ...) fail with ``err``,
        ``times`` times or until ``heal``, once ``after`` calls have gone through."""
        with self._lock:
            self._failing[call] = (err, times)
            self._skip[call] = after

    def heal(self) -> None:
        with self._lock:
            self._failing.clear()
            self.short_writes = False

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """No call fails inside (what a test's own reads need); the faults set before
        are back after, as they were."""
        with self._lock:
            failing, self._failing = self._failing, {}
        try:
            yield
        finally:
            with self._lock:
                self._failing = failing

    def _check(self, call: str) -> None:
        with self._lock:
            failing = self._failing.get(call)
            if failing is None:
                return
            if self._skip.get(call):
                self._skip[call] -= 1
                return
            err, times = failing
            if times is not None:
                if times <= 1:
                    del self._failing[call]
                else:
                    self._failing[call] = (err, times - 1)
            self.failures += 1
        raise OSError(err, os.strerror(err))

    # -- power loss ------------------------------------------------------------
    def unsynced_bytes(self, root: str | Path) -> int:
        """Bytes of the log files under ``root`` that a power loss would take now."""
        with self._lock:
            return sum(max(0, p.stat().st_size - self._synced.get(str(p), 0))
                       for p in Path(root).rglob("*.log"))

    def power_loss(self, root: str | Path) -> None:
        """Cut every log file under ``root``, and the lease journal, back to what was
        fsynced (a file never fsynced keeps nothing)."""
        for path in [*Path(root).rglob("*.log"), *Path(root).rglob("leases.journal")]:
            keep = self._synced.get(str(path), 0)
            if path.stat().st_size > keep:
                os.truncate(path, keep)

    # -- the calls -------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        self._check("open")
        if flags & os.O_CREAT and not os.path.exists(path):
            with self._lock:
                self._synced.pop(path, None)   # a new file: nothing of it synced yet
        fd = super().open(path, flags, mode)
        self._paths[fd] = path
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._check("write")
        if self.short_writes and len(data) > 1:
            written = super().write(fd, data[:len(data) // 2])
            self._failing.setdefault("write", (errno.ENOSPC, 1))
            return written
        return super().write(fd, data)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._check("pread")
        return super().pread(fd, size, offset)

    def pread_cached(self, fd: int, size: int, offset: int) -> bytes | None:
        self._check("pread")
        return super().pread_cached(fd, size, offset)

    def fsync(self, fd: int) -> None:
        self._check("fsync")
        super().fsync(fd)
        path = self._paths.get(fd)
        if path is not None:
            self._synced[path] = self.size(fd)

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        super().close(fd)

    def truncate(self, fd: int, size: int) -> None:
        self._check("truncate")
        super().truncate(fd, size)
        # A cut is kept, as a rename is: what was fsynced beyond it is gone, and what is
        # written after it is unsynced until the next fsync.
        path = self._paths.get(fd)
        with self._lock:
            if path is not None and self._synced.get(path, 0) > size:
                self._synced[path] = size

    def rename(self, src: str, dst: str) -> None:
        self._check("rename")
        super().rename(src, dst)
        with self._lock:  # what was synced goes with the files
            for path in [p for p in self._synced if p == src or p.startswith(src + os.sep)]:
                self._synced[dst + path[len(src):]] = self._synced.pop(path)

    def unlink(self, path: str) -> None:
        self._check("unlink")
        super().unlink(path)
        with self._lock:
            self._synced.pop(path, None)
