"""Stored responses in SQLite: put, update, chains, delete, id checks."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from hearth.api.openai.responses_store import ResponseStore, valid_id


def rid(n: int) -> str:
    return f"resp_{n:032x}"


def response(n: int, previous: str | None = None, text: str = "out") -> dict[str, Any]:
    return {"id": rid(n), "object": "response", "created_at": 1, "previous_response_id": previous,
            "status": "completed", "output": [{"type": "message", "role": "assistant",
                                               "content": [{"type": "output_text", "text": text}]}]}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def test_put_get_update_delete(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "deep" / "hearth.db")
    assert store.get(rid(1)) is None
    store.put(response(1), [user("hi")])
    got = store.get(rid(1))
    assert got is not None and got.response == response(1) and got.input == [user("hi")]
    assert store.update({**response(1), "status": "incomplete"})
    got = store.get(rid(1))
    assert got is not None and got.response["status"] == "incomplete"
    assert store.delete(rid(1)) and not store.delete(rid(1))
    assert not store.update(response(1))  # a deleted response stays deleted
    assert store.get(rid(1)) is None
    mode = sqlite3.connect(tmp_path / "deep" / "hearth.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_chain_replays_inputs_and_outputs_oldest_first(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "hearth.db")
    store.put(response(1, text="a1"), [user("q1")])
    store.put(response(2, rid(1), text="a2"), [user("q2")])
    store.put(response(3, rid(2), text="a3"), [user("q3")])
    items = store.chain(rid(3))
    assert items is not None
    texts = [i["content"] if i["role"] == "user" else i["content"][0]["text"] for i in items]
    assert texts == ["q1", "a1", "q2", "a2", "q3", "a3"]
    assert store.chain(rid(9)) is None
    store.delete(rid(1))  # a missing link ends the chain there
    chain = store.chain(rid(3))
    assert chain is not None and len(chain) == 4


def test_ids_are_checked_before_the_database(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "hearth.db")
    for bad in ("resp_1", "x' OR '1'='1", "resp_" + "g" * 32, "../resp_" + "0" * 32, ""):
        assert not valid_id(bad)
        assert store.get(bad) is None and store.chain(bad) is None and not store.delete(bad)
    assert valid_id(rid(5))


def test_output_items_are_found_by_id_while_their_response_lives(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "hearth.db")
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}
    store.put({**response(1), "output": []}, [user("hi")])
    assert store.item("msg_1") is None  # in progress: no output yet
    assert store.update({**response(1), "output": [message, call]})
    assert store.item("msg_1") == message and store.item("fc_1") == call
    assert store.item("msg_2") is None and store.item("bad id; DROP") is None and store.item("") is None
    assert store.delete(rid(1))
    assert store.item("msg_1") is None and store.item("fc_1") is None
    rows = sqlite3.connect(tmp_path / "hearth.db").execute("SELECT count(*) FROM response_items").fetchone()[0]
    assert rows == 0
