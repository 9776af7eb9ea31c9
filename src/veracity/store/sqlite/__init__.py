"""The SQLite store (the standard library's sqlite3, on a dedicated thread)."""

from veracity.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
