"""The load/unload scheduler over a fake loader: one load per model for a burst, least recently
used idle model first, never a model in use, keep-alive on a fake clock, failed loads.

Deterministic: loads that must stay "in progress" wait on a threading.Event the test opens;
expiry runs when the test calls `expire()` with the clock where it wants it."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hearth.backends.local.loader import FOREVER, LoadPolicy, ModelLoader
from hearth.errors import Conflict, Unavailable
from hearth.models import ModelSpec
from tests.helpers.polling import until


@dataclass
class Model:
    id: str
    generation: int


@dataclass
class FakeLoads:
    """Loads and unloads recorded; `gates[id]` holds that model's load until it is set;
    `broken` ids fail to load."""

    loaded: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    gates: dict[str, threading.Event] = field(default_factory=dict)
    started: dict[str, threading.Event] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)

    def gate(self, model_id: str) -> threading.Event:
        self.started[model_id] = threading.Event()
        self.gates[model_id] = threading.Event()
        return self.gates[model_id]

    def load(self, spec: ModelSpec) -> Model:
        if spec.id in self.started:
            self.started[spec.id].set()
        if spec.id in self.gates:
            assert self.gates[spec.id].wait(120), "the test never opened the gate"
        if spec.id in self.broken:
            raise ValueError(f"{spec.path}: not a GGUF file")
        self.loaded.append(spec.id)
        return Model(spec.id, len(self.loaded))

    def unload(self, model: Model) -> None:
        self.unloaded.append(model.id)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def loader(fake: FakeLoads, *ids: str, max_loaded: int = 4, keep_alive: float = 300.0, pinned: set[str] | None = None,
           clock: Clock | None = None) -> ModelLoader[Model]:
    specs = [ModelSpec(i, Path(f"/models/{i}.gguf")) for i in ids]
    return ModelLoader(specs, fake.load, fake.unload, policy=LoadPolicy(max_loaded, keep_alive), pinned=pinned,
                       clock=clock or Clock())


async def started(fake: FakeLoads, model_id: str) -> None:
    assert await asyncio.to_thread(fake.started[model_id].wait, 120)


async def test_a_burst_of_requests_for_an_unloaded_model_makes_one_load() -> None:
    fake = FakeLoads()
    gate = fake.gate("a")
    ml = loader(fake, "a", "b")
    tasks = [asyncio.create_task(ml.acquire("a")) for _ in range(5)]
    await started(fake, "a")
    assert ml.entry("a").state == "loading" and not any(t.done() for t in tasks)
    gate.set()
    models = await asyncio.gather(*tasks)
    assert fake.loaded == ["a"] and all(m is models[0] for m in models)
    assert ml.entry("a").users == 5 and ml.entry("a").loads == 1


async def test_a_failed_load_fails_its_waiters_naming_the_model_and_the_next_request_tries_again() -> None:
    fake = FakeLoads(broken={"bad"})
    gate = fake.gate("bad")
    ml = loader(fake, "good", "bad")
    tasks = [asyncio.create_task(ml.acquire("bad")) for _ in range(3)]
    await started(fake, "bad")
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results)
    err = results[0]
    assert isinstance(err, Unavailable) and err.code == "model_load_failed"
    assert "'bad'" in str(err) and "not a GGUF file" in str(err)
    e = ml.entry("bad")
    assert e.state == "unloaded" and e.load_failures == 1 and e.users == 0 and "not a GGUF" in (e.error or "")
    assert (await ml.acquire("good")).id == "good"  # the others still serve
    with pytest.raises(Unavailable):
        await ml.acquire("bad")
    assert ml.entry("bad").load_failures == 2  # tried again, not remembered as broken


async def test_past_models_max_the_least_recently_used_idle_model_is_unloaded() -> None:
    fake, clock = FakeLoads(), Clock()
    ml = loader(fake, "a", "b", "c", max_loaded=2, clock=clock)
    for mid in ("a", "b"):
        await ml.acquire(mid)
        clock.now += 1
    ml.release("b")  # b idle first, a later: a is the more recently used
    clock.now += 1
    ml.release("a")
    await ml.acquire("c")
    assert fake.unloaded == ["b"] and set(ml.loaded()) == {"a", "c"}
    clock.now += 1
    ml.release("c")
    await ml.acquire("b")  # alternating: b comes back, the least recently used (a) goes
    assert fake.unloaded == ["b", "a"] and fake.loaded == ["a", "b", "c", "b"]
    assert ml.entry("b").loads == 2


async def test_a_model_with_a_running_request_is_never_unloaded_to_make_room() -> None:
    fake = FakeLoads()
    ml = loader(fake, "a", "b", max_loaded=1)
    await ml.acquire("a")
    waiting = asyncio.create_task(ml.acquire("b"))
    await until(lambda: ml.waiting_for_room == 1, "b's request to wait for room")
    assert not waiting.done() and ml.entry("b").state == "unloaded" and fake.unloaded == []
    ml.release("a")
    assert (await waiting).id == "b"
    assert fake.unloaded == ["a"] and set(ml.loaded()) == {"b"}


async def test_keep_alive_runs_out_on_the_clock_and_a_request_sets_its_own() -> None:
    fake, clock = FakeLoads(), Clock()
    ml = loader(fake, "a", "b", "c", keep_alive=300, clock=clock)
    for mid in ("a", "b", "c"):
        await ml.acquire(mid)
    ml.release("a")  # the server's 300 s
    ml.release("b", keep_alive=10)
    ml.release("c", keep_alive=-1)  # Ollama's -1: forever
    assert ml.entry("c").keep_alive == FOREVER
    clock.now += 9
    assert await ml.expire() == []
    clock.now += 1
    assert await ml.expire() == ["b"]
    clock.now += 290
    assert await ml.expire() == ["a"]
    clock.now += 10**6
    assert await ml.expire() == [] and set(ml.loaded()) == {"c"}
    await ml.acquire("a")  # loaded again, it starts from the server's default
    assert ml.entry("a").keep_alive is None


async def test_keep_alive_zero_unloads_when_the_last_request_ends() -> None:
    fake = FakeLoads()
    ml = loader(fake, "a")
    await ml.acquire("a")
    await ml.acquire("a")
    ml.release("a", keep_alive=0)
    assert ml.entry("a").state == "loaded"  # one request still runs
    ml.release("a", keep_alive=0)
    busy = ml.entry("a").busy
    assert busy is not None and ml.entry("a").state == "unloading"
    await busy
    assert fake.unloaded == ["a"] and ml.entry("a").state == "unloaded"


async def test_a_request_for_a_model_being_unloaded_waits_and_loads_it_again() -> None:
    fake = FakeLoads()
    ml = loader(fake, "a")
    await ml.acquire("a")
    ml.release("a", keep_alive=0)
    assert ml.entry("a").state == "unloading"
    m = await ml.acquire("a")
    assert m.generation == 2 and fake.loaded == ["a", "a"] and fake.unloaded == ["a"]


async def test_pinned_models_stay_and_refuse_unload_and_count_against_the_max() -> None:
    fake, clock = FakeLoads(), Clock()
    with pytest.raises(ValueError, match="--models-max 1"):
        loader(fake, "a", "b", max_loaded=1, pinned={"a", "b"})
    ml = loader(fake, "a", "b", max_loaded=1, pinned={"a"}, clock=clock)
    await ml.load("a", keep_alive=0)
    clock.now += 10**6
    assert await ml.expire() == [] and set(ml.loaded()) == {"a"}
    with pytest.raises(Conflict) as err:
        await ml.unload("a")
    assert err.value.code == "model_pinned"
    with pytest.raises(Unavailable) as full:
        await ml.acquire("b")
    assert full.value.code == "models_max" and "--models-max" in str(full.value)


async def test_explicit_unload_refuses_a_busy_model_and_reports_an_unloaded_one() -> None:
    fake = FakeLoads()
    ml = loader(fake, "a")
    assert await ml.unload("a") is False
    await ml.acquire("a")
    with pytest.raises(Conflict) as err:
        await ml.unload("a")
    assert err.value.code == "model_busy"
    ml.release("a")
    assert await ml.unload("a") is True and fake.unloaded == ["a"]


async def test_a_waiter_that_leaves_during_a_load_does_not_stop_it() -> None:
    fake = FakeLoads()
    gate = fake.gate("a")
    ml = loader(fake, "a")
    leaving = asyncio.create_task(ml.acquire("a"))
    await started(fake, "a")
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    gate.set()
    load = ml.entry("a").busy
    assert load is not None
    await load
    e = ml.entry("a")
    assert e.state == "loaded" and e.users == 0 and fake.loaded == ["a"]  # loaded, held by nobody


async def test_close_unloads_everything_pinned_or_not() -> None:
    fake = FakeLoads()
    ml = loader(fake, "a", "b", pinned={"a"})
    await ml.load("a")
    await ml.load("b")
    await ml.close()
    assert sorted(fake.unloaded) == ["a", "b"] and ml.loaded() == {}


class Memory:
    """A process's RSS as the fake loads change it: each model takes `sizes[id]` bytes."""

    def __init__(self, fake: FakeLoads, sizes: dict[str, int]) -> None:
        self.rss, self.sizes = 1000, sizes
        load, unload = fake.load, fake.unload

        def measured_load(spec: ModelSpec) -> Model:
            m = load(spec)
            self.rss += sizes[spec.id]
            return m

        def measured_unload(m: Model) -> None:
            unload(m)
            self.rss -= sizes[m.id]

        fake.load, fake.unload = measured_load, measured_unload  # type: ignore[method-assign]

    def __call__(self) -> int:
        return self.rss


async def test_the_ram_budget_counts_measured_loads_and_unloads_the_least_recently_used() -> None:
    fake, clock = FakeLoads(), Clock()
    memory = Memory(fake, {"a": 200, "b": 150, "c": 400})
    specs = [ModelSpec(i, Path(f"/models/{i}.gguf")) for i in "abc"]
    ml = ModelLoader(specs, fake.load, fake.unload, policy=LoadPolicy(4, 300.0, ram_budget=300), clock=clock,
                     measure=memory)
    await ml.load("a")
    assert ml.entry("a").loaded_bytes == 200 and ml.held_bytes() == 200
    clock.now += 1
    await ml.load("b")  # expected 0 before its first load (no file): it loads, measures 150, a goes
    busy = ml.entry("a").busy
    assert busy is not None
    await busy
    assert fake.unloaded == ["a"] and set(ml.loaded()) == {"b"} and ml.held_bytes() == 150
    clock.now += 1
    await ml.load("a")  # now known at 200: b (150) goes first to make room, before a loads
    assert fake.unloaded == ["a", "b"] and set(ml.loaded()) == {"a"}
    await ml.load("c")  # 400 > 300 once measured: it stays (loaded and asked for), every idle other goes
    await ml.unload("c")
    with pytest.raises(Unavailable) as err:
        await ml.acquire("c")
    assert err.value.code == "model_too_large" and "'c'" in str(err.value)
