"""Tenants (hearth.tenants): the key file, the keyring's checks, which key a request presented,
the owners of stored objects and the migration of data from before owners."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hearth.api.http.cancels import CancelRegistry
from hearth.api.openai.responses_store import ResponseStore, ScopedResponses
from hearth.config import Settings
from hearth.http.access import AccessSettings
from hearth.http.auth import AuthMiddleware, which
from hearth.sessions.snapshots import SnapshotStore
from hearth.sessions.store import SessionRow, SessionStore
from hearth.tenants import ADMIN, ADMIN_CALLER, OPEN, ApiKey, Caller, bare_key, read_key_file

ALICE = Caller("team-a", "alice")
BOB = Caller("team-b", "bob")


def test_the_key_file_names_keys_and_their_tenants(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team keys\n\nbare-key\nka name=alice tenant=team-a\nka2 tenant=team-a name=alice-ci\n"
                    "kb name=bob\n  kc   tenant=team-c  \n")
    keys = read_key_file(path)
    assert keys[0] == bare_key("bare-key") and keys[0].name == keys[0].tenant
    assert keys[0].name.startswith("key-") and "bare" not in keys[0].name  # named after a hash, never the key
    assert keys[1:4] == [ApiKey("ka", "alice", "team-a"), ApiKey("ka2", "alice-ci", "team-a"),
                         ApiKey("kb", "bob", "bob")]
    assert keys[4].tenant == "team-c" and keys[4].name == bare_key("kc").name


def test_the_key_file_gives_limits_and_the_cache_namespace(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("ka name=a concurrent=2 rpm=60 tpm=10000\nkb name=b cache=shared\n")
    a, b = read_key_file(path)
    assert (a.concurrent, a.rpm, a.tpm, a.cache) == (2, 60, 10000, "tenant")
    assert (b.concurrent, b.rpm, b.tpm, b.cache) == (None, None, None, "shared")
    assert Caller("b", "b", shared_cache=True).namespace() == "" == ADMIN_CALLER.namespace() == OPEN.namespace()
    assert ALICE.namespace() != BOB.namespace() and ALICE.namespace("s") not in (ALICE.namespace(), BOB.namespace("s"))


@pytest.mark.parametrize("line", ["k owner=x", "k name=a name=b", "k name=", "k name=a/b", "k tenant=-x", "k name",
                                  "k rpm=0", "k tpm=-1", "k concurrent=x", "k cache=all"])
def test_a_bad_key_line_names_its_line_and_never_the_key(tmp_path: Path, line: str) -> None:
    path = tmp_path / "keys"
    path.write_text(f"ok\n{line.replace('k ', 'secret-key ', 1)}\n")
    with pytest.raises(ValueError) as e:
        read_key_file(path)
    assert f"{path}:2:" in str(e.value) and "secret-key" not in str(e.value)


def test_the_keyring_refuses_a_key_or_a_name_twice() -> None:
    assert [k.key for k in Settings(api_keys=["a", "a", "b"]).keyring] == ["a", "b"]  # a flag and the env
    with pytest.raises(ValueError, match="twice"):
        Settings(api_keys=["a"], named_keys=[ApiKey("a", "x", "x")])
    with pytest.raises(ValueError, match="share the name"):
        Settings(named_keys=[ApiKey("a", "x", "t"), ApiKey("b", "x", "t")])
    assert Settings(named_keys=[ApiKey("a", "x", "t")], host="0.0.0.0").host == "0.0.0.0"  # a key: may bind


def test_which_key_matched_and_the_caller_it_makes() -> None:
    keys = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b")]
    assert which("kb", keys) == keys[1] and which("kx", keys) is None and which(None, keys) is None
    mw = AuthMiddleware(lambda *a: None, AccessSettings.of(Settings(named_keys=keys, admin_key="adm")))  # type: ignore[arg-type]
    assert mw._caller("ka") == ALICE and mw._caller("adm") == ADMIN_CALLER
    assert mw._caller(None).sees("") is False  # an open path's caller sees nothing
    assert AuthMiddleware(lambda *a: None, AccessSettings.of(Settings()))._caller(None) == OPEN  # type: ignore[arg-type]


def test_who_sees_what() -> None:
    assert ALICE.sees("team-a") and not ALICE.sees("team-b") and not ALICE.sees(ADMIN)
    assert ADMIN_CALLER.sees("team-a") and ADMIN_CALLER.sees(ADMIN) and OPEN.sees("team-b")
    assert ALICE.scope == "team-a" and ADMIN_CALLER.scope is None


def test_sessions_from_before_owners_become_the_admins(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "sessions.db")
    db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, model TEXT NOT NULL, created_at REAL NOT NULL, "
               "last_used_at REAL NOT NULL, max_seq_len INTEGER NOT NULL)")
    db.execute("INSERT INTO sessions VALUES ('old', 'm', 1, 1, 64)")
    db.commit()
    db.close()
    store = SessionStore(tmp_path / "sessions.db")
    store.save(SessionRow("new", "m", 2, 2, 64, owner="team-a"), replace_messages=True)
    store.save(SessionRow("new", "m", 2, 3, 64, owner="team-b"))  # an owner is set once
    assert {r.id: r.owner for r in store.load_all()} == {"old": ADMIN, "new": "team-a"}
    store.close()
    assert {r.id: r.owner for r in SessionStore(tmp_path / "sessions.db").load_all()} == {"old": ADMIN,
                                                                                           "new": "team-a"}


def response(n: int, item: str) -> dict[str, object]:
    return {"id": f"resp_{n:032x}", "created_at": 1, "previous_response_id": f"resp_{n - 1:032x}" if n > 1 else None,
            "output": [{"type": "message", "id": item, "role": "assistant", "content": []}]}


def test_stored_responses_from_before_owners_become_the_admins(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "hearth.db")
    db.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, created_at REAL NOT NULL, previous_response_id TEXT, "
               "input TEXT NOT NULL, response TEXT NOT NULL)")
    db.execute("INSERT INTO responses VALUES (?, 1, NULL, '[]', ?)", (f"resp_{1:032x}", json.dumps(response(1, "m1"))))
    db.commit()
    db.close()
    store = ResponseStore(tmp_path / "hearth.db")
    alice, admin = ScopedResponses(store, ALICE), ScopedResponses(store, ADMIN_CALLER)
    assert alice.get(f"resp_{1:032x}") is None and admin.get(f"resp_{1:032x}") is not None
    alice.put(response(2, "m2"), [])  # continues the admin's: alice's chain stops where she cannot see
    assert alice.chain(f"resp_{2:032x}") == [response(2, "m2")["output"][0]]  # type: ignore[index]
    assert len(admin.chain(f"resp_{2:032x}") or []) == 2
    assert alice.item("m2") is not None and alice.item("m1") is None and admin.item("m2") is not None
    bob = ScopedResponses(store, BOB)
    assert bob.get(f"resp_{2:032x}") is None and bob.item("m2") is None and bob.chain(f"resp_{2:032x}") is None
    assert not bob.delete(f"resp_{2:032x}") and alice.get(f"resp_{2:032x}") is not None
    assert alice.delete(f"resp_{2:032x}") and store.item("m2") is None


def test_snapshot_owners_live_beside_the_snapshot_and_a_bad_one_is_the_admins(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    model = {"id": "m", "sha256": "0" * 64}
    session = {"session_id": "s1", "n_tokens": 0}
    mine = store.create(model=model, engine={}, session=session, messages=[], tokens=[], kv=b"", owner="team-a")
    admins = store.create(model=model, engine={}, session=session, messages=[], tokens=[], kv=b"")
    assert store.owner(mine["id"], ALICE) == "team-a" and store.owner(admins["id"]) == ADMIN
    assert [m["id"] for m in store.list(ALICE)] == [mine["id"]] and store.list(BOB) == []
    assert {m["id"] for m in store.list(ADMIN_CALLER)} == {mine["id"], admins["id"]}
    assert not (tmp_path / admins["id"] / "owner").exists()  # the admin's: no file, as before owners
    (tmp_path / mine["id"] / "owner").write_text("../team-a")  # not a tenant name: the admin's, never a tenant's
    assert store.list(ALICE) == []
    assert "owner" not in {n.split("/")[-1] for n in _archive_names(store, mine["id"])}


def _archive_names(store: SnapshotStore, snap_id: str) -> list[str]:
    import io
    import tarfile

    data = b"".join(store.archive(snap_id))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


def test_a_cancel_reaches_only_its_tenants_runs() -> None:
    registry = CancelRegistry()
    a = registry.open(cancel_id="c", session_id="s", ids=["x"], owner="team-a")
    assert registry.cancel(cancel_id="c", scope="team-b") == 0 and a.token.reason is None
    assert registry.cancel(session_id="s", ids=["x"], scope="team-b") == 0
    later = registry.open(cancel_id="c", owner="team-a")  # bob's stash of "c" is bob's alone
    assert later.token.reason is None
    b = registry.open(cancel_id="c", owner="team-b")
    assert b.token.reason == "cancel_call"
    assert registry.cancel(session_id="s", scope="team-a") == 1 and a.token.reason == "cancel_call"
    assert registry.cancel(cancel_id="c", scope=None) == 3  # the admin's: every tenant's runs named "c"
