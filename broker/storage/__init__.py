"""Disk storage behind the core: ``--data-path`` holds every durable topic's log,
and nothing of ``#ephemeral`` topics or channels."""

from .store import DataPathLocked, DiskStore, MemoryStore, Store

__all__ = ["DataPathLocked", "DiskStore", "MemoryStore", "Store"]
