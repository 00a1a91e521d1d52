"""When a generation request is tried again on another node, and what the client hears when
every node failed.

Before the first byte reaches the client a failed attempt is retried on another node: a
connect error, a 502/503/504, an upstream 429 (the node is then left alone for its
Retry-After), or a stream that broke before its first event. After the first byte nothing is
retried (the client already has part of the answer: a retry would duplicate it); a failure
ends the stream with the protocol's terminal error (`protocols.py`). The first byte is the
upstream's first event, or a heartbeat comment once `heartbeat` seconds pass without one (a
long prefill), whichever comes first (`relay.py`).

Each node is tried at most once per request (`Proxy.generate`).
"""

from __future__ import annotations

from hearth.errors import HearthError, TooManyRequests, Unavailable
from hearth.gateway.upstream.http import Answer

RETRY_STATUSES = (429, 502, 503, 504)  # the one spelling: Hearth nodes and foreign engines alike


class Retry(Exception):
    """An attempt that failed before the client saw a byte: try another node. `label` names the
    failure in the retries metric (connect, status_429, read, broken_before_first_byte, ...);
    `retry_after` is the seconds the node asked for (its Retry-After; 1 when it said nothing)."""

    def __init__(self, label: str, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(reason)
        self.label = label
        self.reason = reason
        self.retry_after = retry_after


def retry_after(resp: Answer) -> float:
    """The answer's Retry-After in seconds, within 0..60 (1 when absent or not a number)."""
    try:
        return min(60.0, max(0.0, float(resp.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


def refused(node: str, resp: Answer) -> Retry:
    """`node` answered one of RETRY_STATUSES: the Retry it stands for."""
    return Retry(f"status_{resp.status_code}", f"{node} answered {resp.status_code}", retry_after(resp))


def exhausted(failures: list[Retry], probe_interval: float) -> HearthError:
    """The error once no node could take the request: a 429 when every node said it is full
    (the fleet is at capacity, not broken: retry after the soonest Retry-After), else a 503."""
    if failures and all(f.label == "status_429" for f in failures):
        return TooManyRequests("every upstream is at capacity; retry later", code="upstreams_full",
                               retry_after=max(1, int(min(f.retry_after for f in failures))))
    last = failures[-1].reason if failures else "no upstream could take the request"
    return Unavailable(f"every upstream failed: {last}", code="upstream_failed",
                       retry_after=max(1, int(probe_interval)))
