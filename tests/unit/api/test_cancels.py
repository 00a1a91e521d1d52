import threading

from hearth.api.http.cancels import CancelRegistry
from hearth.chat.cancel import CancelToken


def test_token_runs_callbacks_once_and_late_callbacks_at_once() -> None:
    t = CancelToken()
    seen: list[str] = []
    t.on_cancel(lambda: seen.append("a"))
    assert t.cancel("disconnect") and not t.cancel("cancel_call")
    t.on_cancel(lambda: seen.append("b"))
    assert seen == ["a", "b"] and t.reason == "disconnect"


def test_cancel_by_ids_and_session_counts_unique_runs() -> None:
    reg = CancelRegistry()
    a = reg.open(session_id="s1", ids=["chatcmpl-1"])
    b = reg.open(session_id="s1", ids=["chatcmpl-2"])
    c = reg.open(session_id="s2", ids=["resp_3"])
    assert reg.cancel(session_id="s1", ids=["chatcmpl-1"]) == 2  # a matched twice, counted once
    assert a.token.cancelled and b.token.cancelled and not c.token.cancelled
    assert reg.cancel(ids=["resp_3"]) == 1 and c.token.cancelled


def test_cancel_id_is_matched_alone() -> None:
    reg = CancelRegistry()
    newer = reg.open(cancel_id="run-2", session_id="s")
    assert reg.cancel(cancel_id="run-1", session_id="s") == 0  # stale cancel_id + session: nothing
    assert not newer.token.cancelled
    assert reg.cancel(cancel_id="run-2") == 1 and newer.token.cancelled


def test_naming_nothing_cancels_nothing() -> None:
    reg = CancelRegistry()
    run = reg.open(ids=["x"])
    assert reg.cancel() == 0 and not run.token.cancelled


def test_early_cancel_is_remembered_then_expires() -> None:
    now = [0.0]
    reg = CancelRegistry(clock=lambda: now[0], ttl=30)
    assert reg.cancel(cancel_id="early") == 0 and reg.pending == 1
    run = reg.open(cancel_id="early")
    assert run.token.cancelled and reg.pending == 0
    reg.cancel(cancel_id="late")
    now[0] = 31.0
    assert not reg.open(cancel_id="late").token.cancelled


def test_the_pending_count_drops_expired_cancels_without_a_new_request() -> None:
    """The hearth_cancel_registry_pending gauge reads `pending`: an expired stash must leave it
    at once, not at the next registration."""
    now = [0.0]
    reg = CancelRegistry(clock=lambda: now[0], ttl=30)
    reg.cancel(cancel_id="a")
    now[0] = 10.0
    reg.cancel(cancel_id="b")
    assert reg.pending == 2
    now[0] = 30.0
    assert reg.pending == 1
    now[0] = 40.0
    assert reg.pending == 0


def test_racing_cancels_against_registration_drop_nothing() -> None:
    reg = CancelRegistry()
    runs: list = []
    n = 2000

    def registrar() -> None:
        for i in range(n):
            runs.append(reg.open(cancel_id=f"c{i}"))

    def canceller() -> None:
        for i in range(n):
            reg.cancel(cancel_id=f"c{i}")

    threads = [threading.Thread(target=registrar), threading.Thread(target=canceller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.token.cancelled for r in runs)
    for r in runs:
        reg.close(r)
    assert len(reg) == 0 and reg.pending == 0
