"""Sharing tables between processes: handles (``Table.export``/``ipc_import``) and the store daemon.

See docs/ipc.md for the handle format, the lifetime rules and the security model.
"""

from __future__ import annotations

from .client import Store
from .export import ipc_import
from .server import serve

__all__ = ["Store", "ipc_import", "serve"]
