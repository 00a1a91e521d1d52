"""The gateway's HTTP/1.1 client for generation requests: kept-alive connections per node, the
response parsed by httptools (the C parser uvicorn uses), body bytes handed over as they arrive.

Why not httpx here: on the relay path httpx/httpcore cost ~60 % of the gateway's CPU per
request (request building, cookie handling, h11's pure-Python parser, anyio locks and cancel
scopes on every read), and on a busy machine every bit of the gateway's CPU is added latency.
httpx still serves everything that is not per-token (probes, sessions, admin, migration).

Invariants:
- A connection carries one request at a time and goes back to its node's idle list only when its
  response was read to the end and both sides keep it alive; anything else closes it. So an
  abandoned stream (the client left, a stall) closes the upstream connection, which is how a node
  learns that nobody is listening and cancels the generation.
- An idle connection is reused for at most `IDLE_REUSE` seconds, under uvicorn's default 5 s
  keep-alive, so the node does not close it under a request. If a reused connection dies before a
  single response byte arrived, the request is sent once more on a new connection (the node never
  started on it: that is the race with a keep-alive close).
- Failures raise httpx's transport exceptions (ConnectError, ReadError, RemoteProtocolError), so
  callers treat both clients alike.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import Protocol, TypeVar, cast
from urllib.parse import urlsplit

import httptools
import httpx

T = TypeVar("T")

IDLE_REUSE = 4.0  # seconds an idle connection may be reused (uvicorn closes idle ones after 5 s)
# Idle connections kept per node: past any node's max_in_flight (128 at most in practice), so a
# node whose every slot finished at once keeps its connections (closed ones were reopened on the
# next burst: a connect, and a socket in TIME_WAIT, per request past the limit).
MAX_IDLE = 256
HIGH_WATER = 1 << 20  # buffered body bytes past which reading from the node pauses
_BREAKS = frozenset("\r\n\0")
_LINE_END = re.compile(r"\r\n|\r|\n")


class Stalled(Exception):
    """An upstream sent nothing for the stall timeout."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no bytes from the upstream for {seconds:g} s (the stall timeout)")


async def within(items: AsyncIterator[T], stall: float | None) -> AsyncIterator[T]:
    """`items`, each arriving within `stall` seconds of the one before (None: no limit), else
    Stalled. Only the wait for the next item is timed, not what the consumer does with one."""
    while True:
        try:
            async with asyncio.timeout(stall):
                item = await anext(items)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise Stalled(stall or 0.0) from None
        yield item


class Answer(Protocol):
    """An upstream response as the proxy reads it (httpx.Response is one too)."""

    status_code: int

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...

    async def aclose(self) -> None: ...


async def lines_of(answer: Answer) -> AsyncIterator[str]:
    """The body's lines (SSE's line ends: CRLF, CR, LF), without their ends, as UTF-8 text. An
    httpx response keeps httpx's own reader (it undoes a content encoding; the fast client asks
    for none)."""
    if isinstance(answer, httpx.Response):
        async for line in answer.aiter_lines():
            yield line
        return
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    async for raw in answer.aiter_raw():
        text = pending + decoder.decode(raw)
        parts = _LINE_END.split(text[:-1] if text.endswith("\r") else text)  # a CR may be half a CRLF
        pending = parts.pop() + ("\r" if text.endswith("\r") else "")
        for line in parts:
            yield line
    pending += decoder.decode(b"", final=True)
    for line in _LINE_END.split(pending):
        if line:
            yield line


class Sender(Protocol):
    async def send(self, method: str, url: str, headers: Mapping[str, str], body: bytes,
                   connect_timeout: float) -> Answer: ...


class Buffered:
    """An answer already read (the proxy looked at it before passing it on)."""

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self._content = content

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        yield self._content

    async def aread(self) -> bytes:
        return self._content

    async def aclose(self) -> None:
        return None


class HttpxSender:
    """The same calls over an httpx client: for in-process tests whose fake fleet is an httpx
    transport (the fast client needs real sockets; it has its own tests)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def send(self, method: str, url: str, headers: Mapping[str, str], body: bytes,
                   connect_timeout: float) -> Answer:
        request = self.client.build_request(method, url, content=body, headers=dict(headers),
                                            timeout=httpx.Timeout(None, connect=connect_timeout))
        return await self.client.send(request, stream=True)

    async def aclose(self) -> None:
        return None  # the client is the app's; it closes it


class _Connection(asyncio.Protocol):
    """One TCP connection to a node and the response being read on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self._begin()

    def _begin(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.header_list: list[tuple[str, str]] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.received = False  # any byte of this response
        self.error: Exception | None = None
        self.body: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.error = httpx.RemoteProtocolError(f"malformed response from the upstream: {e}")
            self.close()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            reason = f": {exc}" if exc else ""
            self.error = httpx.ReadError(f"the upstream closed the connection{reason}")
        self._wake()

    # ---- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_list.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # only valid until the parser resets

    # ---- for the response ----------------------------------------------------------------------

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self) -> None:
        """Until something new happened (bytes, the end, an error)."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def take(self) -> bytes:
        data = b"".join(self.body) if len(self.body) > 1 else self.body[0]
        self.body.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.lost and self.error is None

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.close()
        self.lost = True


class UpstreamResponse:
    """A response whose headers have arrived; its body is read with `aiter_raw` or `aread`,
    then `aclose` (always: it returns the connection or closes it)."""

    def __init__(self, conn: _Connection, pool: UpstreamHttp, key: tuple[str, int]) -> None:
        self._conn: _Connection | None = conn
        self._pool = pool
        self._key = key
        self.status_code = conn.status
        self.headers: Mapping[str, str] = dict(conn.header_list)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        while True:
            if conn.body:
                yield conn.take()
                continue
            if conn.error is not None:
                raise conn.error
            if conn.complete:
                return
            await conn.wait()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.reusable() and not conn.body:
            self._pool.give_back(self._key, conn)
        else:
            conn.close()


class UpstreamHttp:
    """Kept-alive HTTP/1.1 connections to the nodes over plain http (loopback or a private
    network); other URLs (https) go to `fallback`."""

    def __init__(self, fallback: Sender) -> None:
        self._idle: dict[tuple[str, int], collections.deque[_Connection]] = {}
        self._clock = time.monotonic
        self._fallback = fallback

    async def send(self, method: str, url: str, headers: Mapping[str, str], body: bytes,
                   connect_timeout: float) -> Answer:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            return await self._fallback.send(method, url, headers, body, connect_timeout)
        key = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"{method} {target} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {len(body)}"]
        # A line break in a name or value would start a header of its own: such a header is dropped
        # (uvicorn's parser never lets one through from a client; this holds for any caller).
        head += [f"{k}: {v}" for k, v in headers.items()
                 if k.lower() not in ("host", "content-length") and not _BREAKS.intersection(k + v)]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        conn, reused = self._take(key), True
        if conn is None:
            conn, reused = await self._connect(key, connect_timeout), False
        try:
            return await self._exchange(conn, key, request)
        except httpx.TransportError:
            if not reused or conn.received:
                raise
        # A kept-alive connection the node closed as we sent on it: the node never saw the request.
        return await self._exchange(await self._connect(key, connect_timeout), key, request)

    async def _exchange(self, conn: _Connection, key: tuple[str, int], request: bytes) -> UpstreamResponse:
        conn._begin()
        assert conn.transport is not None
        try:
            if conn.lost:
                raise httpx.ReadError("the upstream closed the connection")
            conn.transport.write(request)
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait()
        except BaseException:
            conn.close()
            raise
        return UpstreamResponse(conn, self, key)

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = self._clock()
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to be alive
            if not conn.lost and now - conn.idle_since < IDLE_REUSE:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, int], timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(_Connection, *key), timeout)
        except TimeoutError as e:
            raise httpx.ConnectTimeout(f"no connection to {key[0]}:{key[1]} within {timeout:g} s") from e
        except OSError as e:
            raise httpx.ConnectError(f"{key[0]}:{key[1]}: {e}") from e
        return conn

    def give_back(self, key: tuple[str, int], conn: _Connection) -> None:
        conn.idle_since = self._clock()
        idle = self._idle.setdefault(key, collections.deque())
        idle.append(conn)
        while len(idle) > MAX_IDLE:
            idle.popleft().close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        await asyncio.sleep(0)  # let the transports close
