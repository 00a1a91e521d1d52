"""The prompt-cache bench's own logic, without servers: the second conversations change what
the clients change and nothing else, and the first difference read off the block files is
where the prompts part."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.agents import load_fixture
from bench.prompt_cache import blocks
from bench.prompt_cache.conversations import (
    TASK,
    TASKS,
    differences,
    prompt_differences,
    second_conversation,
    with_task,
)
from bench.prompt_cache.summary import second_conversation as summarize_second
from hearth.engine.prefix_cache.files import block_key, root_key, write_block

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def uuids(captured: dict[str, Any]) -> set[str]:
    return set(UUID.findall(json.dumps([captured["headers"], captured["body"]])))


@pytest.mark.parametrize(("fixture", "variant", "rendered"), [
    ("claude-code-first", "other-dir", ["messages[1].content[0].text@98", "system[2].text@3581"]),
    ("claude-code-first", "next-day", ["messages[1].content[0].text@8978"]),
    ("codex-first", "other-dir", ["input[2].content[0].text@30"]),
    ("codex-first", "next-day", ["input[2].content[0].text@92"]),
])
def test_a_second_conversation_changes_where_the_client_puts_what_changes(fixture: str, variant: str,
                                                                          rendered: list[str]) -> None:
    captured = load_fixture(fixture)
    second = second_conversation(captured, variant, 0)
    assert prompt_differences(captured["body"], second["body"]) == rendered
    assert (second["method"], second["path"]) == (captured["method"], captured["path"])
    # every conversation id is new; the installation id (the machine's, Codex's) is not
    installation = set(re.findall(r'installation[_-]id\W+([0-9a-f-]{36})', json.dumps(captured)))
    assert uuids(captured) & uuids(second) == installation
    assert len(uuids(second) - uuids(captured)) == len(uuids(captured) - installation) > 0


def test_later_conversations_part_from_each_other_where_they_part_from_the_first() -> None:
    captured = load_fixture("claude-code-first")
    first, second = (second_conversation(captured, "other-dir", n) for n in (0, 1))
    assert prompt_differences(first["body"], second["body"]) == prompt_differences(captured["body"], first["body"])
    assert "/home/alice/src/webapp" in json.dumps(first["body"])
    assert "-home-alice-src-webapp" in first["body"]["system"][2]["text"]  # Claude Code's memory path
    assert "2026-11-24" in json.dumps(first["body"]) and "2026-11-25" in json.dumps(second["body"])


def test_a_fixture_that_no_longer_holds_the_working_directory_is_refused() -> None:
    captured = load_fixture("codex-first")
    text = json.dumps(captured).replace("/tmp/work", "/tmp/elsewhere")
    with pytest.raises(ValueError, match="/tmp/work"):
        second_conversation(json.loads(text), "other-dir", 0)


def test_another_task_changes_only_the_task() -> None:
    captured = load_fixture("claude-code-first")
    other = with_task(captured, TASKS[1])
    assert prompt_differences(captured["body"], other["body"]) == ["messages[0].content[1].text@0"]
    assert with_task(captured, TASK)["body"]["messages"] == captured["body"]["messages"]


def test_differences_name_the_path_and_the_first_differing_character() -> None:
    assert differences({"a": [{"t": "hello"}], "b": 1}, {"a": [{"t": "help!"}], "b": 1}) == ["a[0].t@3"]
    assert differences({"a": 1}, {"a": 1, "c": 2}) == ["c"]


def write_prompt(directory: Path, tokens: list[int], size: int = 256) -> None:
    """The blocks the cache writes for one prompt (files.py's format and hash chain)."""
    parent = root_key({})
    for start in range(0, len(tokens), size):
        chunk = tokens[start:start + size]
        key = block_key(parent, chunk)
        write_block(directory, key, parent, start, chunk, b"\0" * (2 * len(chunk)), {}, False)
        parent = key


def test_the_first_difference_is_where_the_new_prompts_blocks_leave_the_cached_ones(tmp_path: Path) -> None:
    first = list(range(600))
    write_prompt(tmp_path, first)
    before = sorted(tmp_path.glob("*.kvb"))
    assert blocks.stored(before) == {"blocks": 3, "tokens": 600, "kv_bytes": 1200}
    second = first[:300] + [7] * 250
    write_prompt(tmp_path, second)  # the first block is the same file; two new ones from 256
    after = sorted(tmp_path.glob("*.kvb"))
    assert len(after) == 5
    assert blocks.branch_point(before, after) == 300
    assert blocks.branch_point(after, after) is None  # nothing written: nothing to read it from


def test_the_target_is_every_token_before_the_first_difference() -> None:
    def run(cached: int, first: int | None = None, at_least: int | None = None) -> dict[str, Any]:
        return {"status": 200, "ttft_s": 1.0, "prompt_tokens": 1000, "cached_tokens": cached,
                "first_difference": first, "first_difference_at_least": at_least}

    met = summarize_second([run(300, 300), run(300, 300)])
    assert met["all_before_difference_cached"] and met["first_difference_at"] == "300"
    assert met["cached_share"] == 0.3 and met["first_difference_share"] == 0.3
    assert not summarize_second([run(256, 300)])["all_before_difference_cached"]
    assert summarize_second([run(999, 1000)])["all_before_difference_cached"]  # the last token is always computed
    bound = summarize_second([run(990, at_least=990)])
    assert bound["first_difference_at"] == "≥ 990" and "all_before_difference_cached" not in bound
