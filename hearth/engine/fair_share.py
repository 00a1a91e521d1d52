"""Whose turn it is: priority classes first, then weighted fair shares between tenants.

Pure bookkeeping (no asyncio, no runner), unit-tested on its own with a frozen clock
(tests/unit/engine/test_fair_share.py). The node's admission queue
(backends/local/admission.py) asks `pick` which waiting request takes the next free slot;
the engine's scheduler `charge`s every token it puts into a decode (prompt chunks and decoded
tokens alike) to the tenant of its request.

Policy (docs/api.md, "Fair shares and priority classes"):
- classes are strict: a waiting request of a higher class (`PRIORITY` > `DEFAULT` > `FLEX`)
  is admitted before any of a lower one;
- within a class, the tenant with the least work served per unit of weight goes next
  (`served / weight`, in tokens): weighted fair queuing over tokens, which is deficit round
  robin with a quantum of one token. FCFS within a tenant;
- a tenant that had nothing waiting or running starts at the least normalised work of the
  tenants that are busy (never below what it had): idle time earns no credit, so a tenant
  back from a pause cannot take the server for as long as it was away. With nobody busy, it
  starts at the least normalised work of the last busy tenants (`floor`, a virtual time): a
  tenant that used the idle node alone carries no debt for it into the next contention, and
  one that starts while the node is idle gets no credit for the others' past work;
- work-conserving: `pick` always names a waiting request when there is one; a tenant alone
  gets every slot.

Thread safety: `charge` runs on the engine thread, `pick`/`enter`/`leave` on the event loop;
one lock guards the tallies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, TypeVar


class Priority(IntEnum):
    """A request's admission class. Higher goes first."""

    FLEX = 0
    DEFAULT = 1
    PRIORITY = 2

    @property
    def tier(self) -> str:
        """OpenAI's `service_tier` name of the class (what a response echoes)."""
        return self.name.lower()


# OpenAI's service_tier values and Hearth's own `priority` field (same names): the class each is.
CLASS_NAMES: dict[str, Priority] = {"flex": Priority.FLEX, "default": Priority.DEFAULT, "auto": Priority.DEFAULT,
                                    "priority": Priority.PRIORITY}


def parse_class(value: str) -> Priority:
    """A class from its name; ValueError naming the accepted ones."""
    try:
        return CLASS_NAMES[value]
    except KeyError:
        raise ValueError(f"must be one of {', '.join(CLASS_NAMES)}") from None


def resolve_class(asked: Priority | None, default: Priority, ceiling: Priority) -> Priority:
    """The class a request runs in: what it asked for (else its key's default), never above the
    key's ceiling (as OpenAI runs a request that asks for a tier it may not have in `default`)."""
    return min(asked if asked is not None else default, ceiling)


def slot_share_room(mine: int, theirs: int) -> int:
    """How many of another tenant's `theirs` admitted requests (of a class at most the asking
    one's) may be paused for a tenant that has `mine`: fair shares of the slots, the one rule
    the admission queue (backends/local/admission.py) lets a request in by and the engine
    pauses by (preempt.py `victim`). Each pause leaves the other tenant at least as many as the
    asking one then has, so the split moves toward even and two tenants never pause each other
    back and forth."""
    return max(0, theirs - mine - 1)


class Ticket(Protocol):
    """A waiting request as the policy sees it (the admission queue's waiter)."""

    tenant: str
    weight: float
    priority: Priority
    seq: int  # arrival order


T = TypeVar("T", bound=Ticket)


@dataclass(slots=True)
class TenantTally:
    """One tenant's counters (for /metrics and `hearth ps`)."""

    served: int = 0  # tokens put into decodes for it (prompt and generated)
    normalised: float = 0.0  # served / weight, plus the catch-up given when it became busy
    waiting: int = 0  # requests in the admission queue now
    running: int = 0  # requests admitted and not yet released
    admitted: int = 0  # requests admitted so far
    wait_seconds: float = 0.0  # total time its admitted requests waited in the queue
    preempted: int = 0  # its running requests paused for a higher class
    by_class: dict[Priority, int] = field(default_factory=dict)  # waiting requests per class

    @property
    def busy(self) -> bool:
        return self.waiting > 0 or self.running > 0


class FairShare:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, TenantTally] = {}
        self._weights: dict[str, float] = {}
        # the least normalised work of the busy tenants when some last were: where a tenant
        # that turns busy while nobody is starts (the policy's virtual time)
        self.floor = 0.0

    def _tally(self, tenant: str) -> TenantTally:
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = TenantTally()
        return t

    def charge(self, tenant: str, tokens: int) -> None:
        """`tokens` of work done for `tenant` (called by the engine's scheduler each step)."""
        with self._lock:
            t = self._tally(tenant)
            t.served += tokens
            t.normalised += tokens / self._weights.get(tenant, 1.0)
            self._advance()

    def enter(self, ticket: Ticket) -> None:
        """A request joins the queue."""
        with self._lock:
            self._weights[ticket.tenant] = ticket.weight
            t = self._tally(ticket.tenant)
            if not t.busy:  # back from idle: level with the busy tenants (no credit for idling)
                busy = [o.normalised for name, o in self._tenants.items() if o.busy and name != ticket.tenant]
                if busy:
                    t.normalised = max(t.normalised, min(busy))
                else:  # nobody busy: the work done while a tenant was alone is neither credit nor debt
                    t.normalised = self.floor
            t.waiting += 1
            t.by_class[ticket.priority] = t.by_class.get(ticket.priority, 0) + 1

    def leave(self, ticket: Ticket, admitted: bool, since: float) -> None:
        """A request leaves the queue: admitted (it runs until `release`) or given up."""
        with self._lock:
            t = self._tally(ticket.tenant)
            t.waiting -= 1
            t.by_class[ticket.priority] -= 1
            if admitted:
                t.running += 1
                t.admitted += 1
                t.wait_seconds += max(0.0, self.clock() - since)

    def release(self, tenant: str) -> None:
        """An admitted request ended."""
        with self._lock:
            self._tally(tenant).running -= 1

    def _advance(self) -> None:
        """Lock held: the floor follows the least normalised work of the busy tenants."""
        busy = [t.normalised for t in self._tenants.values() if t.busy]
        if busy:
            self.floor = min(busy)

    def preempted(self, tenant: str) -> None:
        with self._lock:
            self._tally(tenant).preempted += 1

    def pick(self, waiting: Sequence[T]) -> T | None:
        """The waiting request that goes next: highest class, then the least-served tenant
        (per weight), then the earliest. None only if nothing waits."""
        if not waiting:
            return None
        with self._lock:
            # ties (tenants charged alike, e.g. between steps) go to the one running less
            share = {name: (t.normalised, t.running / self._weights.get(name, 1.0))
                     for name, t in self._tenants.items()}
        return min(waiting, key=lambda w: (-w.priority, *share.get(w.tenant, (0.0, 0.0)), w.seq))

    def snapshot(self) -> dict[str, TenantTally]:
        """A copy of every tenant's counters."""
        with self._lock:
            return {name: TenantTally(t.served, t.normalised, t.waiting, t.running, t.admitted, t.wait_seconds,
                                      t.preempted, dict(t.by_class))
                    for name, t in self._tenants.items()}
