"""Topics, channels and their paused state, written atomically on every change."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    """Temp file, fsync, rename, fsync the directory: all of it or none of it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"version": 1, "topics": []}
    with open(path) as f:
        return json.load(f)
