"""How both products run their Starlette app under uvicorn.

KEEP_ALIVE_S: how long the server keeps a client's idle connection open. uvicorn's default is
5 s, which is exactly httpx's client-side `keepalive_expiry`: a client that sends on a
connection idle for ~5 s races the server's close and gets "server disconnected without
sending a response" with no answer (issue 39 item 8: connections dropped under a load that
paused between phases). Clients' own limits are shorter (httpx 5 s, undici 4 s, aiohttp 15 s)
or unbounded (urllib3, which then detects the close on the next use), so the server's must be
the longer one: 75 s, as nginx's default. A Hearth node behind a gateway is reused by the
gateway's fast client for at most 4 s (gateway/upstream/http.py: IDLE_REUSE), well inside it."""

from __future__ import annotations

KEEP_ALIVE_S = 75
GRACEFUL_SHUTDOWN_S = 5
