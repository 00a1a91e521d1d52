"""The admission policy (hearth/engine/fair_share.py): classes, weighted fair shares, work
conservation and ceilings, on a simulated server with a frozen clock (no threads, no sleeps).

`Sim` is a server of `slots` slots: each step every running request does `per_step` tokens of
work (charged to its tenant, as the engine's scheduler charges a decode) and ends after
`length` tokens; freed slots are filled with `FairShare.pick`, as the admission queue does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hearth.engine.fair_share import FairShare, Priority, parse_class, resolve_class
from hearth.engine.kv import SlotTable
from hearth.engine.scheduler import Scheduler
from hearth.engine.sequence import ActiveRequest, Sequence
from hearth.engine.types import EngineRequest, SamplingParams
from hearth.tenants import ApiKey, parse_key_line


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class Req:
    tenant: str
    weight: float = 1.0
    priority: Priority = Priority.DEFAULT
    seq: int = 0
    length: int = 8
    done: int = 0
    since: float = 0.0


@dataclass
class Sim:
    slots: int
    per_step: int = 1
    clock: Clock = field(default_factory=Clock)
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)
    admitted: list[Req] = field(default_factory=list)
    busy_steps: int = 0  # steps in which every slot ran while something waited or ran
    _seq: int = 0

    def __post_init__(self) -> None:
        self.fair = FairShare(self.clock)

    def submit(self, tenant: str, weight: float = 1.0, priority: Priority = Priority.DEFAULT,
               length: int = 8) -> Req:
        self._seq += 1
        r = Req(tenant, weight, priority, self._seq, length, since=self.clock.now)
        self.waiting.append(r)
        self.fair.enter(r)
        return r

    def admit(self) -> None:
        while len(self.running) < self.slots and (r := self.fair.pick(self.waiting)) is not None:
            self.waiting.remove(r)
            self.fair.leave(r, True, r.since)
            self.running.append(r)
            self.admitted.append(r)

    def step(self) -> None:
        self.admit()
        if len(self.running) == self.slots:
            self.busy_steps += 1
        for r in list(self.running):
            self.fair.charge(r.tenant, self.per_step)
            r.done += self.per_step
            if r.done >= r.length:
                self.running.remove(r)
                self.fair.release(r.tenant)
        self.clock.now += 1.0


def keep_backlogged(sim: Sim, tenant: str, depth: int, weight: float = 1.0,
                    priority: Priority = Priority.DEFAULT) -> None:
    """Top `tenant` up to `depth` requests waiting (a client with many streams)."""
    while sum(r.tenant == tenant for r in sim.waiting) < depth:
        sim.submit(tenant, weight, priority)


def served(sim: Sim, tenant: str) -> int:
    return sim.fair.snapshot()[tenant].served


def test_two_backlogged_tenants_of_equal_weight_share_the_work_evenly() -> None:
    sim = Sim(slots=4)
    for _ in range(400):
        keep_backlogged(sim, "a", 16)
        keep_backlogged(sim, "b", 2)  # few requests waiting, as many tokens served
        sim.step()
    a, b = served(sim, "a"), served(sim, "b")
    assert abs(a - b) <= 4 * 8  # within one request's work per slot
    assert sim.busy_steps == 400  # never a slot idle while work waits


def test_weights_split_the_work_in_their_ratio() -> None:
    sim = Sim(slots=4)
    for _ in range(800):
        keep_backlogged(sim, "heavy", 8, weight=3.0)
        keep_backlogged(sim, "light", 8, weight=1.0)
        sim.step()
    heavy, light = served(sim, "heavy"), served(sim, "light")
    assert heavy + light == 800 * 4
    assert abs(heavy - 3 * light) <= 4 * 8 * 4  # 3:1, within a few requests' work


def test_a_tenant_alone_gets_every_slot_work_conserving() -> None:
    sim = Sim(slots=4)
    for _ in range(50):
        keep_backlogged(sim, "only", 4)
        sim.step()
    assert sim.busy_steps == 50 and served(sim, "only") == 200


def b_first_beside_as_backlog(sim: Sim) -> bool:
    """A keeps 16 requests waiting for 20 steps, then B sends one: whether the first slot that
    frees goes to B, ahead of A's backlog."""
    for _ in range(20):
        keep_backlogged(sim, "a", 16)
        sim.step()
    before = len(sim.admitted)
    b = sim.submit("b")
    while b not in sim.admitted:
        keep_backlogged(sim, "a", 16)
        sim.step()
    return sim.admitted[before] is b


def goes_quiet(sim: Sim, tenant: str) -> None:
    """`tenant`'s waiting requests give up."""
    for r in [r for r in sim.waiting if r.tenant == tenant]:
        sim.waiting.remove(r)
        sim.fair.leave(r, False, r.since)


def test_a_newcomer_goes_before_the_backlog_of_a_busy_tenant() -> None:
    """The noisy neighbour: A keeps 16 requests waiting; B's one request takes the next free slot."""
    assert b_first_beside_as_backlog(Sim(slots=4))


def test_fcfs_within_a_tenant() -> None:
    sim = Sim(slots=1)
    reqs = [sim.submit("a") for _ in range(5)]
    for _ in range(60):
        sim.step()
    assert sim.admitted == reqs


def test_idle_time_earns_no_credit() -> None:
    """A tenant back after a long pause starts level with the busy ones: it shares, it does not
    take the server for as long as it was away."""
    sim = Sim(slots=2)
    for _ in range(100):
        keep_backlogged(sim, "a", 4)
        keep_backlogged(sim, "b", 4)
        sim.step()
    goes_quiet(sim, "b")
    tally = sim.fair.snapshot()["b"]
    for _ in range(400):  # a alone: it gets everything
        keep_backlogged(sim, "a", 4)
        sim.step()
    assert served(sim, "b") <= tally.served + 2 * 8
    before_a, before_b = served(sim, "a"), served(sim, "b")
    for _ in range(200):
        keep_backlogged(sim, "a", 4)
        keep_backlogged(sim, "b", 4)
        sim.step()
    gained_a, gained_b = served(sim, "a") - before_a, served(sim, "b") - before_b
    assert abs(gained_a - gained_b) <= 2 * 8 * 2  # level again, no catch-up burst for b


def test_work_done_alone_is_no_debt_when_a_neighbour_arrives() -> None:
    """B used the idle node alone, then went quiet; A starts a backlog while nobody else is busy.
    B's next request is level with A (A started at the policy's virtual time, not at zero) and
    takes the next free slot, ahead of A's backlog."""
    sim = Sim(slots=4)
    for _ in range(100):
        keep_backlogged(sim, "b", 4)
        sim.step()
    goes_quiet(sim, "b")
    while sim.running:
        sim.step()
    assert b_first_beside_as_backlog(sim)


def test_a_higher_class_goes_first_whatever_the_shares() -> None:
    sim = Sim(slots=1)
    flex = sim.submit("batch", priority=Priority.FLEX)
    default = sim.submit("a")
    urgent = sim.submit("a", priority=Priority.PRIORITY)
    for _ in range(30):
        sim.step()
    assert sim.admitted == [urgent, default, flex]


def test_flex_fills_what_the_others_leave() -> None:
    sim = Sim(slots=4)
    for i in range(200):
        keep_backlogged(sim, "batch", 8, priority=Priority.FLEX)
        if i % 20 == 0:
            sim.submit("chat")
        sim.step()
    assert sim.busy_steps == 200  # the flex work kept every slot busy
    chats = [r for r in sim.admitted if r.tenant == "chat"]
    assert len(chats) == 10 and all(r.done >= r.length or r in sim.running for r in chats)


def test_waiting_time_is_measured_on_the_policy_clock() -> None:
    sim = Sim(slots=1)
    sim.submit("a", length=3)
    sim.submit("b", length=3)
    for _ in range(10):
        sim.step()
    snap = sim.fair.snapshot()
    assert snap["a"].wait_seconds == 0.0 and snap["b"].wait_seconds == 3.0
    assert snap["a"].admitted == snap["b"].admitted == 1 and snap["b"].running == 0


def test_classes_from_their_names_and_the_key_ceiling() -> None:
    assert parse_class("auto") is parse_class("default") is Priority.DEFAULT
    assert parse_class("flex") < parse_class("default") < parse_class("priority")
    with pytest.raises(ValueError, match="must be one of"):
        parse_class("urgent")
    # what it asked for, else the default; never above the ceiling
    assert resolve_class(Priority.PRIORITY, Priority.DEFAULT, Priority.DEFAULT) is Priority.DEFAULT
    assert resolve_class(Priority.FLEX, Priority.DEFAULT, Priority.DEFAULT) is Priority.FLEX
    assert resolve_class(None, Priority.FLEX, Priority.DEFAULT) is Priority.FLEX
    assert resolve_class(Priority.PRIORITY, Priority.DEFAULT, Priority.PRIORITY) is Priority.PRIORITY


def test_key_file_weight_and_classes() -> None:
    k = parse_key_line("sk-1 name=ci weight=2.5 priority=flex")
    assert (k.weight, k.priority, k.max_priority) == (2.5, "flex", "default")
    assert parse_key_line("sk-2 name=ops priority=priority").max_priority == "priority"
    assert parse_key_line("sk-3").weight == 1.0 and parse_key_line("sk-3").max_priority == "default"
    for bad in ("sk weight=0", "sk weight=-1", "sk weight=x", "sk priority=urgent", "sk max_priority=high",
                "sk priority=priority max_priority=default"):
        with pytest.raises(ValueError):
            parse_key_line(bad)
    with pytest.raises(ValueError, match="weight"):
        ApiKey("k", "n", "n", weight=float("nan"))


def test_the_scheduler_charges_prefill_and_decode_tokens_to_the_tenant() -> None:
    sched = Scheduler(SlotTable(2), 16)
    charged: dict[str, int] = {}
    sched.charge = lambda tenant, n: charged.__setitem__(tenant, charged.get(tenant, 0) + n)
    ars = [ActiveRequest(EngineRequest(rid, [1000 + i, 1, 2, 3, 4, 5], SamplingParams(), tenant=rid), lambda o: None,
                         max_len=64) for i, rid in enumerate(("t1", "t2"))]
    for ar in ars:
        sched.add(ar)
    for adm in sched.admit():
        adm.ar.seqs.extend(Sequence.placeholder(i, s) for i, s in enumerate(adm.placement.slots))
    sched.schedule()
    assert charged == {"t1": 6, "t2": 6}  # the whole prompts, one chunk each
