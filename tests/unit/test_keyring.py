"""The key file reloaded (hearth/http/keyring.py): the diff by name, the one-reference swap and
what follows it (the accounts keep their state by name), and every file a reload refuses
changing nothing. No server: the key check and the accounts are driven directly."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hearth.errors import BadRequest, TooManyRequests
from hearth.http.access import AccessSettings
from hearth.http.auth import AuthMiddleware
from hearth.http.key_usage import KeyAccounts
from hearth.http.keyring import LiveKeys, Ring, diff
from hearth.tenants import ApiKey, Caller, bare_key, read_key_file


def keyfile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return path


def live_of(path: Path, fixed: tuple[str, ...] = ()) -> LiveKeys:
    return LiveKeys([*(bare_key(k) for k in fixed), *read_key_file(path)], path, fixed)


def test_the_diff_is_by_name() -> None:
    a, b, c = ApiKey("ka", "alice", "t"), ApiKey("kb", "bob", "t"), ApiKey("kc", "carol", "t")
    d = diff([a, b, c], [ApiKey("ka2", "alice", "t"), c, ApiKey("kd", "dave", "t")])
    assert (d.added, d.removed, d.changed, d.unchanged) == (("dave",), ("bob",), ("alice",), 1)
    assert d.as_json() == {"object": "keys.reload", "added": 1, "removed": 1, "changed": 1, "unchanged": 1}
    limits = diff([a], [ApiKey("ka", "alice", "t", rpm=5)])  # same key, a new limit: changed
    assert limits.changed == ("alice",) and limits.unchanged == 0
    assert diff([a, b], [b, a]).as_json()["unchanged"] == 2  # order does not matter


def test_a_reload_swaps_the_ring_and_tells_the_listeners(tmp_path: Path) -> None:
    path = keyfile(tmp_path, "ka name=alice rpm=2\nkb name=bob\n")
    live = live_of(path, fixed=("flag-key",))
    before = live.ring
    seen: list[Ring] = []
    live.on_swap(seen.append)
    path.write_text("# bob is gone, carol is new, alice's limit is raised\nka name=alice rpm=5\nkc name=carol\n")
    assert live.reload() == {"object": "keys.reload", "added": 1, "removed": 1, "changed": 1, "unchanged": 1}
    assert live.ring is not before and seen == [live.ring]
    assert before.names == {"alice", "bob", bare_key("flag-key").name}  # the old ring is never changed
    assert live.ring.names == {"alice", "carol", bare_key("flag-key").name}  # the flag's key is kept
    assert live.ring.values == tuple(k.key for k in live.ring.keys)
    assert [k.rpm for k in live.ring.keys if k.name == "alice"] == [5]


def test_a_reload_logs_counts_never_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = keyfile(tmp_path, "secret-a name=alice\n")
    live = live_of(path)
    path.write_text("secret-a name=alice\nsecret-b name=bob\n")
    with caplog.at_level(logging.INFO, logger="hearth.keys"):
        live.reload()
    lines = [r.getMessage() for r in caplog.records if r.name == "hearth.keys"]
    assert lines == ["API keys reloaded: 1 added, 0 removed, 0 changed, 1 unchanged"]


@pytest.mark.parametrize(("text", "where", "why"), [
    ("sk-a1 name=alice\nsk-b1 name=bob rpm=zero\n", ":2:", "rpm must be a whole number"),
    ("sk-a1 name=alice\n\nsk-a1 name=bob\n", ":3:", "same API key is on line 1"),
    ("sk-a1 name=alice\nsk-b1 name=alice\n", ":2:", "'alice' is on line 1 too"),
    ("sk-a1 name=alice colour=red\n", ":1:", "unknown, empty or repeated key attribute"),
    ("# every key removed\n", "", "does not turn key checks (or a gateway's tenants) off"),
    ("flag-key name=x\n", "", "twice"),  # a --api-key flag's key in the file too
])
def test_an_invalid_file_changes_nothing(tmp_path: Path, text: str, where: str, why: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    path = keyfile(tmp_path, "sk-a0 name=alice rpm=2\n")
    live = live_of(path, fixed=("flag-key",))
    before, told = live.ring, []
    live.on_swap(told.append)
    path.write_text(text)
    with caplog.at_level(logging.ERROR, logger="hearth.keys"), pytest.raises(BadRequest) as e:
        live.reload()
    assert e.value.code == "invalid_key_file" and f"{path}{where}" in e.value.message and why in e.value.message
    assert "unchanged" in e.value.message and "sk-" not in e.value.message.replace(str(path), "")  # never a key
    assert live.ring is before and told == []
    assert any(why in r.getMessage() for r in caplog.records)  # logged too (SIGHUP has no one to answer)


def test_an_unreadable_or_missing_file_changes_nothing(tmp_path: Path) -> None:
    path = keyfile(tmp_path, "ka name=alice\n")
    live = live_of(path)
    before = live.ring
    path.unlink()
    with pytest.raises(BadRequest) as e:
        live.reload()
    assert e.value.code == "invalid_key_file" and str(path) in e.value.message
    path.write_bytes(b"\xff\xfe not text\n")
    with pytest.raises(BadRequest) as e:
        live.reload()
    assert e.value.code == "invalid_key_file" and live.ring is before


def test_no_key_file_nothing_to_reload(tmp_path: Path) -> None:
    live = LiveKeys([bare_key("k")], None, ("k",))
    with pytest.raises(BadRequest) as e:
        live.reload()
    assert e.value.code == "no_key_file" and "--api-key-file" in e.value.message
    # a server that started with an empty key file checks no keys: a reload does not turn them on
    path = keyfile(tmp_path, "# none yet\n")
    empty = live_of(path)
    path.write_text("ka name=alice\n")
    with pytest.raises(BadRequest, match="turn key checks on"):
        empty.reload()
    assert empty.ring.keys == ()


def test_the_key_check_reads_the_ring_in_force(tmp_path: Path) -> None:
    path = keyfile(tmp_path, "ka name=alice tenant=team-a\nkg name=gw role=gateway\n")
    live = live_of(path)
    mw = AuthMiddleware(lambda *a: None, AccessSettings(live.ring.keys, admin_key="adm", live=live))  # type: ignore[arg-type]
    assert mw._verdict("GET", "/v1/models", "ka") is None and mw._caller("ka") == Caller("team-a", "alice")
    old = live.ring
    path.write_text("kb name=bob\nkg2 name=gw role=gateway\n")
    live.reload()
    assert mw._verdict("GET", "/v1/models", "ka") is not None  # removed: 401
    assert mw._verdict("GET", "/v1/models", "kg") is not None  # a gateway key rotated: the old value fails
    assert mw._verdict("GET", "/v1/models", "kg2") is None and mw._verdict("GET", "/v1/models", "kb") is None
    assert mw._verdict("GET", "/v1/models", "adm") is None  # the admin key is a flag: a reload keeps it
    # a request that read the old ring decides with it alone (never a mix)
    assert mw._verdict("GET", "/v1/models", "ka", old) is None and mw._caller("ka", ring=old).key_name == "alice"


def test_the_accounts_keep_their_state_by_name() -> None:
    now = [1000.0]
    alice, bob = ApiKey("ka", "alice", "t", rpm=2), ApiKey("kb", "bob", "t", concurrent=1)
    accounts = KeyAccounts([alice, bob], clock=lambda: now[0])
    accounts.admit("alice")
    accounts.admit("alice")
    accounts.release("alice")
    accounts.release("alice")
    accounts.admit("bob")  # bob's request is in flight across the reloads
    with pytest.raises(TooManyRequests):
        accounts.admit("alice")
    accounts.rekey([ApiKey("ka-rotated", "alice", "t", rpm=2), ApiKey("kc", "carol", "t")])  # bob removed
    with pytest.raises(TooManyRequests):  # a reload is no way out of the rpm window
        accounts.admit("alice")
    assert {r["name"] for r in accounts.usage()} == {"alice", "carol"}
    accounts.release("bob")  # bob's request ends after his removal: counted to his set-aside account
    accounts.spend("bob", 3, 4, 0)
    accounts.rekey([ApiKey("ka", "alice", "t", rpm=3), bob])  # alice's limit raised; bob back
    accounts.admit("alice")  # the third request in the window: the new limit applies at once
    rows = {r["name"]: r for r in accounts.usage()}
    assert rows["alice"]["requests"] == 3 and rows["alice"]["limits"]["rpm"] == 3
    assert (rows["bob"]["requests"], rows["bob"]["in_flight"], rows["bob"]["completion_tokens"]) == (1, 0, 4)
    now[0] += 61
    accounts.admit("alice")  # the window slid as it would have without any reload
