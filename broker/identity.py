"""What names a broker across restarts and moves: its identity, not its address.

A durable broker's identity is written into its data path the first time it
starts there (``<data-path>/identity``, e.g. ``n412-5d1e0c9a7b3f2e11``: the
node id it had then, and a random part) and read back on every later start, so
a broker restarted on other ports, or on another host with the same data path,
is the same broker: a reader's offsets name its leases by this identity and
find them wherever it now answers. A memory-only broker keeps nothing across a
restart, so its identity is its instance's (it changes on every start).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE_NAME = "identity"


def new_identity(node_id: int) -> str:
    return f"n{node_id}-{secrets.token_hex(8)}"


def data_path_identity(data_path: str | os.PathLike[str], node_id: int) -> str:
    """The identity kept in ``data_path``, written there (durably) if it has none yet."""
    path = Path(data_path) / FILE_NAME
    try:
        identity = path.read_text().strip()
        if identity:
            return identity
    except FileNotFoundError:
        pass
    identity = new_identity(node_id)
    tmp = path.with_name(FILE_NAME + ".tmp")
    with open(tmp, "w") as f:
        f.write(identity + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power loss
    finally:
        os.close(fd)
    return identity
