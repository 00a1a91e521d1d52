"""Usage and limits per API key (docs/api.md, "Usage and limits per key").

`KeyAccounts` keeps, per named key: requests, requests refused for a limit, requests in
flight, and the tokens its generations used (prompt, completion, cached), as totals and over
the last minute. A key's limits come from the key file (hearth.tenants): `concurrent` requests
at once, `rpm` requests and `tpm` tokens (prompt + completion) per minute. `KeyLimitMiddleware`
admits or refuses each request of a limited key before anything else runs, with 429
`rate_limit_exceeded` and `Retry-After` (whole seconds until the limit would let it in), in the
protocol's own error envelope; other keys are never slowed by one key's refusals.

Windows slide over the last WINDOW seconds of the accounts' clock (`time.monotonic` unless a
test gives its own). A generation's tokens are known when it ends, so the token limit admits a
request while the last minute's tokens are under it: one request may take a key past its
`tpm`, and its next requests wait until the window drops below. The admin key and the metrics
token are never limited; a node without keys has no accounts.

Everything runs on the event loop (the middleware and the stream observers): no lock.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from hearth.api.http.auth import CALLER
from hearth.api.http.errors import ApiError, respond
from hearth.chat.types import ChatEvent, Done
from hearth.errors import TooManyRequests
from hearth.tenants import ApiKey, Caller

WINDOW = 60.0  # seconds: "per minute"


@dataclass(slots=True)
class Account:
    key: ApiKey
    requests: int = 0
    limited: int = 0  # refused with a 429 for one of its limits
    in_flight: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    arrivals: deque[float] = field(default_factory=deque)  # admission times in the window
    spent: deque[tuple[float, int]] = field(default_factory=deque)  # (when, tokens) in the window

    def as_json(self) -> dict[str, Any]:
        k = self.key
        return {"name": k.name, "tenant": k.tenant, "requests": self.requests, "limited": self.limited,
                "in_flight": self.in_flight, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
                "limits": {"concurrent": k.concurrent, "rpm": k.rpm, "tpm": k.tpm}}


class KeyAccounts:
    def __init__(self, keys: list[ApiKey], clock: Callable[[], float] = time.monotonic) -> None:
        self._accounts = {k.name: Account(k) for k in keys}
        self._clock = clock

    def __iter__(self) -> Iterator[Account]:
        return iter(self._accounts.values())

    def _expire(self, a: Account, now: float) -> None:
        while a.arrivals and a.arrivals[0] <= now - WINDOW:
            a.arrivals.popleft()
        while a.spent and a.spent[0][0] <= now - WINDOW:
            a.spent.popleft()

    def admit(self, name: str) -> None:
        """Count a request of key `name`, or refuse it (TooManyRequests, nothing counted but
        the refusal) when one of its limits is reached. Every admitted request is `release`d."""
        a = self._accounts.get(name)
        if a is None:
            return
        now = self._clock()
        self._expire(a, now)
        k, wait = a.key, None
        if k.concurrent is not None and a.in_flight >= k.concurrent:
            why, wait = f"{a.in_flight} requests in flight, its limit (concurrent={k.concurrent})", 1.0
        elif k.rpm is not None and len(a.arrivals) >= k.rpm:
            why, wait = f"{k.rpm} requests in the last minute (rpm={k.rpm})", a.arrivals[0] + WINDOW - now
        elif k.tpm is not None and (used := sum(n for _, n in a.spent)) >= k.tpm:
            # wait until enough of the window's tokens expire to bring it under the limit
            over, at = used - k.tpm, a.spent[0][0]
            for when, n in a.spent:
                at, over = when, over - n
                if over < 0:
                    break
            why, wait = f"{used} tokens in the last minute (tpm={k.tpm})", at + WINDOW - now
        if wait is not None:
            a.limited += 1
            raise TooManyRequests(f"API key {k.name!r} has {why}: retry later", retry_after=max(1, math.ceil(wait)))
        a.requests += 1
        a.in_flight += 1
        a.arrivals.append(now)

    def release(self, name: str) -> None:
        a = self._accounts.get(name)
        if a is not None:
            a.in_flight -= 1

    def observer(self, name: str | None) -> Callable[[ChatEvent], None]:
        """For a generation's event stream: its usage, when it ends, counted to key `name`."""
        a = self._accounts.get(name) if name is not None else None

        def observe(ev: ChatEvent) -> None:
            if a is not None and isinstance(ev, Done):
                u = ev.usage
                a.prompt_tokens += u.prompt_tokens
                a.completion_tokens += u.completion_tokens
                a.cached_tokens += u.cached_tokens
                a.spent.append((self._clock(), u.prompt_tokens + u.completion_tokens))

        return observe

    def usage(self) -> list[dict[str, Any]]:
        return [a.as_json() for a in self._accounts.values()]


class KeyLimitMiddleware:
    """Admits each request of a limited key (inside the key check: the caller is known)."""

    def __init__(self, app: ASGIApp, accounts: KeyAccounts | None) -> None:
        self.app = app
        self.accounts = accounts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = scope.get(CALLER)
        name = who.key_name if isinstance(who, Caller) and not who.admin else None
        if scope["type"] != "http" or self.accounts is None or name is None:
            await self.app(scope, receive, send)
            return
        try:
            self.accounts.admit(name)
        except TooManyRequests as e:
            await respond(scope["path"], ApiError.of(e))(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)  # a stream's whole body: it is in flight until then
        finally:
            self.accounts.release(name)


class KeyUsageCollector(Collector):
    """The accounts on /metrics, one sample per key name (never the key)."""

    def __init__(self, accounts: KeyAccounts) -> None:
        self.accounts = accounts

    def collect(self) -> Iterator[Metric]:
        counters = (("hearth_key_requests", "Requests admitted per API key", "requests"),
                    ("hearth_key_limited_requests", "Requests refused for a key's limit (429)", "limited"),
                    ("hearth_key_prompt_tokens", "Prompt tokens of generations per API key", "prompt_tokens"),
                    ("hearth_key_completion_tokens", "Tokens generated per API key", "completion_tokens"),
                    ("hearth_key_cached_tokens", "Prompt tokens reused from the cache per API key", "cached_tokens"))
        accounts = list(self.accounts)
        for metric, doc, attr in counters:
            family = CounterMetricFamily(metric, doc, labels=["key", "tenant"])
            for a in accounts:
                family.add_metric([a.key.name, a.key.tenant], getattr(a, attr))
            yield family
        gauge = GaugeMetricFamily("hearth_key_in_flight", "Requests in flight per API key", labels=["key", "tenant"])
        for a in accounts:
            gauge.add_metric([a.key.name, a.key.tenant], a.in_flight)
        yield gauge
