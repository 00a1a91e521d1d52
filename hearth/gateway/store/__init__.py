"""The gateway's database: the interface and its SQL (base.py), SQLite (sqlite.py, one gateway) or
PostgreSQL (postgres.py, any number of gateways), the schema and its steps (schema.py), and
`create_store`, which picks one."""

from __future__ import annotations

import uuid

from hearth.gateway.settings import GatewaySettings
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.store.sqlite import SqliteStore


def create_store(settings: GatewaySettings) -> GatewayStore:
    """PostgreSQL when the settings name one (its driver imported only then), else SQLite."""
    store: GatewayStore
    if settings.database is None:
        store = SqliteStore(settings.data_dir / "gateway.sqlite3")
    else:
        from hearth.gateway.store.postgres import PostgresStore
        store = PostgresStore(settings.database, uuid.uuid4().hex)
    store.lease_ttl = settings.lease_ttl
    return store
