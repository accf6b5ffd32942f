"""Disk storage behind the core: ``--data-path`` holds every durable topic's log
and the metadata, and nothing of ``#ephemeral`` topics or channels."""

from .store import DataPathLocked, Storage

__all__ = ["DataPathLocked", "Storage"]
