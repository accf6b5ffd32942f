"""The records' checksum: CRC-32 with zlib's polynomial (``zlib.crc32``'s numbers).

Computed by zlib-ng where it is installed (a dependency of the broker): its CRC-32 runs
on the CPU's vector instructions, some 15 times zlib's speed over a message body, which
every publish writes and every message read back from the log checks. zlib computes the
same numbers, so a log reads the same whichever of them wrote it, and a broker without
zlib-ng (a platform it has no wheel for) falls back on zlib.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # (zlib-ng is a dependency: a platform without its wheel)
    from zlib import crc32

__all__ = ["crc32"]
