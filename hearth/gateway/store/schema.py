"""The gateway's schema, as numbered migrations (store/base.py applies those a database lacks,
recording each in `schema_version`; on PostgreSQL under an advisory lock, so gateways that
start together apply each once).

One text for both databases: TEXT, DOUBLE PRECISION (SQLite gives it REAL affinity; PostgreSQL's
REAL would be 4 bytes, too coarse for a timestamp), INTEGER, BYTEA (SQLite gives it NUMERIC
affinity, which keeps a bytes value as a BLOB, untouched), and JSON kept as TEXT. A step may be
a coroutine over the migration's transaction, for data SQL alone cannot move (migration 5). A
migration is never edited once released: a change is a new one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from hearth.gateway.store.chunks import move_legacy
from hearth.gateway.store.tx import Tx

Step = str | Callable[[Tx], Awaitable[None]]  # a statement, or a data step run in the migration's transaction

MIGRATIONS: list[tuple[int, list[Step]]] = [
    # 1: the tables of the SQLite store before versions (IF NOT EXISTS: a file of then is at 1)
    (1, [
        "CREATE TABLE IF NOT EXISTS affinity (key TEXT PRIMARY KEY, node TEXT NOT NULL, "
        "updated DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS transcripts (session_id TEXT PRIMARY KEY, model TEXT NOT NULL, "
        "messages TEXT NOT NULL, updated DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, previous TEXT, items TEXT NOT NULL, "
        "updated DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS background (id TEXT PRIMARY KEY, status TEXT NOT NULL, response TEXT NOT NULL, "
        "updated DOUBLE PRECISION NOT NULL)",
    ]),
    # 2: several gateways on one database: whose background run, gateway leases, moves and
    # drains in progress, tenants' ownership, nodes that joined at run time
    (2, [
        "ALTER TABLE background ADD COLUMN gateway TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX IF NOT EXISTS affinity_node ON affinity (node)",
        "CREATE TABLE IF NOT EXISTS gateways (id TEXT PRIMARY KEY, expires DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS moves (session_id TEXT PRIMARY KEY, src TEXT NOT NULL, dst TEXT NOT NULL, "
        "snapshot TEXT, state TEXT NOT NULL, gateway TEXT NOT NULL, updated DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS drains (node TEXT PRIMARY KEY, state TEXT NOT NULL, gateway TEXT NOT NULL, "
        "updated DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS owners (kind TEXT NOT NULL, id TEXT NOT NULL, owner TEXT NOT NULL, "
        "PRIMARY KEY (kind, id))",
        "CREATE TABLE IF NOT EXISTS members (name TEXT PRIMARY KEY, url TEXT NOT NULL, spec TEXT NOT NULL, "
        "expires DOUBLE PRECISION NOT NULL)",
    ]),
    # 3: the Batch API through the gateway (store/batches.py): files (content as UTF-8 JSONL),
    # batches (the object, its input lines, the gateway running it) and each finished line
    (3, [
        "CREATE TABLE IF NOT EXISTS batch_files (id TEXT PRIMARY KEY, owner TEXT NOT NULL, obj TEXT NOT NULL, "
        "content TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, owner TEXT NOT NULL, caller TEXT NOT NULL, "
        "status TEXT NOT NULL, obj TEXT NOT NULL, input TEXT NOT NULL, gateway TEXT NOT NULL, "
        "created DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS batch_results (batch_id TEXT NOT NULL, custom_id TEXT NOT NULL, "
        "ok INTEGER NOT NULL, line TEXT NOT NULL, seq DOUBLE PRECISION NOT NULL, PRIMARY KEY (batch_id, custom_id))",
    ]),
    # 4: the usage ledger (store/usage.py): one row per generation turn, every gateway's
    (4, [
        "CREATE TABLE IF NOT EXISTS usage (at DOUBLE PRECISION NOT NULL, request_id TEXT NOT NULL, "
        "gateway TEXT NOT NULL, tenant TEXT NOT NULL, key TEXT, via TEXT, model TEXT NOT NULL, "
        "endpoint TEXT NOT NULL, node TEXT, nodes TEXT NOT NULL, failovers INTEGER NOT NULL, "
        "retries INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL, "
        "generated_tokens INTEGER NOT NULL, discarded_tokens INTEGER NOT NULL, finish_reason TEXT, cancelled TEXT, "
        "error TEXT, status INTEGER, "
        "ttft_ms DOUBLE PRECISION, total_ms DOUBLE PRECISION NOT NULL)",
        "CREATE INDEX IF NOT EXISTS usage_at ON usage (at)",
        "CREATE INDEX IF NOT EXISTS usage_tenant_at ON usage (tenant, at)",
    ]),
    # 5: batch files in bounded chunks (store/chunks.py): a file's content, and a batch's copy of
    # its input, as rows of at most 1 MiB each; the whole values of before moved there (their
    # columns `batch_files.content` and `batches.input` hold '' from then on)
    (5, [
        "CREATE TABLE IF NOT EXISTS batch_file_chunks (file_id TEXT NOT NULL, idx INTEGER NOT NULL, "
        "data BYTEA NOT NULL, PRIMARY KEY (file_id, idx))",
        move_legacy,
    ]),
]

VERSION = MIGRATIONS[-1][0]
