"""Liveness hysteresis and the passive breaker."""

from __future__ import annotations

from hearth.gateway.fleet.health import COOLDOWN, FAILURES, FALL, RISE, Breaker, Liveness, counts_as_failure


def test_first_good_probe_brings_a_node_up_then_hysteresis() -> None:
    live = Liveness()
    assert live.probed(True) and live.up
    for _ in range(FALL - 1):
        assert not live.probed(False, "timeout")
    assert live.up  # one or two slow probes do not mark it dead
    assert live.probed(True) is False and live.streak == 0  # a good probe resets the streak
    for _ in range(FALL):
        live.probed(False, "timeout")
    assert not live.up and live.last_error == "timeout"
    for _ in range(RISE - 1):
        assert not live.probed(True)
    assert not live.up  # one good probe does not bring it back (no flapping)
    assert live.probed(True) and live.up
    assert live.transitions == 3


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_breaker_opens_after_consecutive_failures_and_half_opens_one_trial() -> None:
    clock = Clock()
    b = Breaker(clock=clock)
    for _ in range(FAILURES - 1):
        b.record(False)
    b.record(True)  # a success in between resets
    for _ in range(FAILURES - 1):
        b.record(False)
    assert b.state == "closed" and b.allows()
    b.record(False)
    assert b.state == "open" and not b.allows()
    clock.t += COOLDOWN
    assert b.state == "half_open" and b.allows()
    b.started()
    assert not b.allows()  # only one trial at a time
    b.record(False)
    assert b.state == "open"  # the trial failed: open again
    clock.t += COOLDOWN
    b.started()
    b.record(True)
    assert b.state == "closed" and b.allows()


def test_client_errors_and_429_are_not_failures() -> None:
    assert not any(counts_as_failure(s) for s in (400, 401, 404, 409, 413, 422, 429))
    assert all(counts_as_failure(s) for s in (500, 502, 503, 504))
