"""Which store ``oncebus serve`` opens: ``--store`` (or ``$ONCEBUS_STORE``), else the data directory's SQLite file.

Kept apart from ``oncebus.store.postgres`` so that choosing the store never needs the PostgreSQL driver unless a
PostgreSQL URL is given: without it, the user gets one line saying which extra to install.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from oncebus.core.errors import InvalidArgumentError, StoreError

if TYPE_CHECKING:
    from oncebus.store.postgres import PostgresStore
    from oncebus.store.sqlite import SqliteStore

STORE_ENV = "ONCEBUS_STORE"
SCHEMES = ("postgresql://", "postgres://")


def store_spec(given: str | None, *, option: str = "--store") -> str | None:
    """The store asked for (``--store``, else ``ONCEBUS_STORE`` as ``oncebus.server.settings`` read it; ``option``
    names where it came from), checked: a PostgreSQL URL, or None for the embedded SQLite file (also what
    ``sqlite`` or an empty value mean)."""
    source = option
    if given is None or given.strip() in ("", "sqlite"):
        return None
    spec = given.strip()
    if not spec.lower().startswith(SCHEMES):
        raise InvalidArgumentError(
            f"{source} {spec[:40]!r}: give a PostgreSQL URL (postgresql://user:password@host:port/database), "
            "or 'sqlite' (the default: oncebus.db in the data directory)"
        )
    return spec


def open_store(spec: str | None, sqlite_path: Path) -> SqliteStore | PostgresStore:
    """Open the store ``spec`` names (see ``store_spec``); None opens the SQLite file at ``sqlite_path``."""
    if spec is None:
        from oncebus.store.sqlite import SqliteStore

        return SqliteStore(sqlite_path)
    try:
        from oncebus.store.postgres import PostgresStore
    except ImportError as exc:
        raise StoreError(
            f"the PostgreSQL store needs the psycopg driver ({exc}): install it with pip install 'oncebus[postgresql]'"
        ) from None
    return PostgresStore(spec)
