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

A gateway's key (`role=gateway`) speaking for a tenant (hearth.tenants) is admitted and limited
as that key (the gateway enforces its tenants' own limits); what it uses is counted to the
key and, on a row of its own (`via`: the gateway key's name), to the tenant it spoke for. The
gateway keeps the same accounts for its own keys (`spend`: the usage it reads from the answers
it relays).

A reload of the keys (hearth/http/keyring.py) calls `rekey`: a key whose name stays keeps its
account (requests, in flight, its rpm and tpm windows) and takes its new line's limits for the
requests that come next, so a reload never resets a key's limits; a removed key's account is
set aside with its windows (its requests in flight still release and spend into it) and comes
back as it was if a later reload brings the name back, so removing and re-adding a key does not
reset its limits either.

Everything runs on the event loop (the middleware and the stream observers): no lock.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from hearth.chat.types import ChatEvent, Done
from hearth.errors import TooManyRequests
from hearth.http.auth import CALLER
from hearth.http.errors import ApiError, respond
from hearth.tenants import ApiKey, Caller

WINDOW = 60.0  # seconds: "per minute"


@dataclass(slots=True)
class Account:
    key: ApiKey
    via: str | None = None  # a tenant a gateway key spoke for: that key's name
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
                "limits": {"concurrent": k.concurrent, "rpm": k.rpm, "tpm": k.tpm},
                **({"via": self.via} if self.via is not None else {})}


class KeyAccounts:
    def __init__(self, keys: list[ApiKey], clock: Callable[[], float] = time.monotonic) -> None:
        self._accounts = {k.name: Account(k) for k in keys}
        self._retired: dict[str, Account] = {}  # keys a reload removed (rekey), by name
        self._via: dict[tuple[str, str], Account] = {}  # (gateway key name, tenant) -> its row
        self._clock = clock

    def __iter__(self) -> Iterator[Account]:
        return iter([*self._accounts.values(), *self._via.values()])

    def rekey(self, keys: Sequence[ApiKey]) -> None:
        """The keys after a reload: accounts kept by name with their state, limits from `keys`."""
        now = {k.name: k for k in keys}
        for name in [n for n in self._accounts if n not in now]:
            self._retired[name] = self._accounts.pop(name)
        for name, key in now.items():
            a = self._accounts.get(name) or self._retired.pop(name, None)
            if a is None:
                self._accounts[name] = Account(key)
            else:
                a.key = key
                self._accounts[name] = a

    def _own(self, name: str) -> Account | None:
        """The account of key `name`, a removed key's too (its requests still in flight end)."""
        return self._accounts.get(name) or self._retired.get(name)

    def _on_behalf(self, name: str, tenant: str | None) -> Account | None:
        """The row of `tenant` as gateway key `name` spoke for it (made on first use)."""
        if tenant is None or self._own(name) is None:
            return None
        a = self._via.get((name, tenant))
        if a is None:
            a = self._via[(name, tenant)] = Account(ApiKey("\0via", tenant, tenant), via=name)
        return a

    def _expire(self, a: Account, now: float) -> None:
        while a.arrivals and a.arrivals[0] <= now - WINDOW:
            a.arrivals.popleft()
        while a.spent and a.spent[0][0] <= now - WINDOW:
            a.spent.popleft()

    def admit(self, name: str, tenant: str | None = None) -> None:
        """Count a request of key `name` (a gateway key's for `tenant`: counted to it too), or
        refuse it (TooManyRequests, nothing counted but the refusal) when one of its limits is
        reached. Every admitted request is `release`d, with the same arguments."""
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
        if (b := self._on_behalf(name, tenant)) is not None:
            b.requests += 1
            b.in_flight += 1

    def release(self, name: str, tenant: str | None = None) -> None:
        for a in (self._own(name), self._on_behalf(name, tenant)):
            if a is not None:
                a.in_flight -= 1

    def spend(self, name: str | None, prompt: int, completion: int, cached: int, tenant: str | None = None) -> None:
        """A generation of key `name` (for `tenant`, a gateway key's) ended having used these tokens."""
        if name is None:
            return
        for a in (self._own(name), self._on_behalf(name, tenant)):
            if a is not None:
                a.prompt_tokens += prompt
                a.completion_tokens += completion
                a.cached_tokens += cached
                a.spent.append((self._clock(), prompt + completion))

    def observer(self, name: str | None, tenant: str | None = None) -> Callable[[ChatEvent], None]:
        """For a generation's event stream: its usage, when it ends, counted to key `name`."""

        def observe(ev: ChatEvent) -> None:
            if isinstance(ev, Done):
                u = ev.usage
                self.spend(name, u.prompt_tokens, u.completion_tokens, u.cached_tokens, tenant)

        return observe

    def usage(self) -> list[dict[str, Any]]:
        return [a.as_json() for a in self]

    def restore(self, rows: list[dict[str, Any]], wall_now: float) -> None:
        """After a restart: the totals the usage ledger holds (`Ledger.per_key`), and its last
        minute's tokens in the `tpm` window (their wall-clock times moved onto this clock)."""
        now = self._clock()
        touched: set[int] = set()
        for row in rows:  # a gateway key's rows for a tenant count to the key and to the tenant's row
            for a in (self._accounts.get(row["key"]), self._on_behalf(row["key"], row["tenant"])):
                if a is None:
                    continue  # a key no longer in the key file
                a.requests += row["requests"]
                a.prompt_tokens += row["prompt_tokens"]
                a.completion_tokens += row["completion_tokens"]
                a.cached_tokens += row["cached_tokens"]
                a.spent.extend((now - (wall_now - at), n) for at, n in row["recent"])
                touched.add(id(a))
        for a in self:
            if id(a) in touched:
                a.spent = deque(sorted(a.spent))  # the window expires from its oldest end


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
        tenant = who.on_behalf if isinstance(who, Caller) else None
        try:
            self.accounts.admit(name, tenant)
        except TooManyRequests as e:
            await respond(scope["path"], ApiError.of(e))(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)  # a stream's whole body: it is in flight until then
        finally:
            self.accounts.release(name, tenant)


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
            family = CounterMetricFamily(metric, doc, labels=["key", "tenant", "via"])
            for a in accounts:
                family.add_metric(self._labels(a), getattr(a, attr))
            yield family
        gauge = GaugeMetricFamily("hearth_key_in_flight", "Requests in flight per API key",
                                  labels=["key", "tenant", "via"])
        for a in accounts:
            gauge.add_metric(self._labels(a), a.in_flight)
        yield gauge

    @staticmethod
    def _labels(a: Account) -> list[str]:
        """key, tenant, via: a tenant a gateway key spoke for is the row (key = the tenant, via =
        the gateway key); a key's own row has via "" """
        return [a.key.name, a.key.tenant, a.via or ""]
