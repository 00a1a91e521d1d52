"""The requests: an agent's captured first request, and the same request as another conversation
would send it.

Where the stock CLIs put what changes from one conversation to the next (the fixtures in
tests/fixtures/agents, captured in /tmp/work on 2026-11-23, outside a git repository):

- Claude Code (Messages API): the working directory in the `system` turn that follows the task
  ("Primary working directory: /tmp/work", "Is a git repository: false", "Today's date is
  2026-11-23") and, earlier, in the memory path of the third system block
  (`/tmp/home/.claude/projects/-tmp-work/memory/`: the directory spelled with dashes); the
  session id in `metadata.user_id` and the `X-Claude-Code-Session-Id` header (not rendered).
  Inside a git repository it would also add its git status; the fixture has none to change.
- Codex (Responses API): `<cwd>`, `<current_date>` and the workspace root in the
  `<environment_context>` user message after the two developer messages; its session, thread,
  turn and message ids (`prompt_cache_key`, `client_metadata`, headers, `input[].id`: not
  rendered). The installation id stays: it names the machine, not the conversation.

A variant replaces those strings everywhere in the body and headers (and checks that each one
was there, so a recaptured fixture that moves them fails loudly rather than measuring nothing).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import uuid
from typing import Any

CAPTURED_CWD = "/tmp/work"
CAPTURED_DATE = dt.date(2026, 11, 23)
TASK = "Run the shell command `echo hearth-tool-ok-7f3a` and tell me what it printed."
GIT_NO, GIT_YES = "Is a git repository: false", "Is a git repository: true"

# Working directories of the second conversations: each starts with another letter after the
# first "/" (than /tmp/work and than each other), so every variant differs from every earlier
# prompt at the same place, however many variants the cache already holds.
OTHER_DIRS = ("/home/alice/src/webapp", "/srv/build/api-server", "/opt/projects/cli-tool", "/data/repos/parser",
              "/usr/local/src/engine", "/mnt/work/dashboard", "/root/code/scheduler", "/var/apps/gateway")

# What a variant changes: "other-dir" is a new conversation in another project on another day
# (the "second conversation from another directory"); "next-day" the same project,
# another day and session (what changes for someone who comes back to the same repository).
VARIANTS = ("other-dir", "next-day")

# Part e: twenty tasks a user might start Claude Code with in one project.
TASKS = (
    TASK, "List the Python files in this directory.", "What does the main function in app.py do?",
    "Add a --verbose flag to the CLI.", "Run the test suite and summarise the failures.",
    "Rename the function load_cfg to load_config everywhere.", "Write a README section about installation.",
    "Why does `make build` fail?", "Add type hints to utils.py.", "Find where the database connection is opened.",
    "Create a .gitignore for a Python project.", "Explain the retry logic in client.py.",
    "Upgrade the requests dependency and check nothing breaks.", "Add a unit test for parse_date.",
    "Remove the unused imports in the package.", "Show the last five commits and what they changed.",
    "Make the logger print timestamps in UTC.", "Split server.py into smaller modules.",
    "Check the Dockerfile for outdated base images.", "Count the lines of code per directory.",
)

# Body fields a server does not render into the prompt (ids and metadata).
_NOT_RENDERED = re.compile(r"^(metadata|prompt_cache_key|client_metadata)\b|\.id(@\d+)?$")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_INSTALLATION = re.compile(r'installation[_-]id\\*"\s*:\s*\\*"([0-9a-f-]{36})')


def is_messages(captured: dict[str, Any]) -> bool:
    return str(captured["path"]).startswith("/v1/messages")


def _replace_all(text: str, old: str, new: str) -> str:
    if old not in text:
        raise ValueError(f"the fixture no longer holds {old!r}: where does the client put it now?")
    return text.replace(old, new)


def new_ids(text: str) -> str:
    """Every conversation id in `text` (JSON of a captured request) replaced by a fresh one, the
    same old id by the same new one; the installation id stays."""
    keep = set(_INSTALLATION.findall(text))
    fresh: dict[str, str] = {}
    return _UUID.sub(lambda m: m[0] if m[0] in keep else fresh.setdefault(m[0], str(uuid.uuid4())), text)


def memory_slug(cwd: str) -> str:
    """Claude Code's project folder name for a working directory (`/tmp/work` → `-tmp-work`)."""
    return re.sub(r"[^A-Za-z0-9]", "-", cwd)


def second_conversation(captured: dict[str, Any], variant: str, n: int) -> dict[str, Any]:
    """The captured request as the `n`-th (0-based) later conversation of `variant` would send it."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    text = new_ids(json.dumps({k: captured[k] for k in ("method", "path", "headers", "body")}))
    date = (CAPTURED_DATE + dt.timedelta(days=1 + n)).isoformat()
    text = _replace_all(text, CAPTURED_DATE.isoformat(), date)
    if variant == "other-dir":
        cwd = OTHER_DIRS[n % len(OTHER_DIRS)]
        if is_messages(captured):
            text = _replace_all(text, memory_slug(CAPTURED_CWD), memory_slug(cwd))
            text = _replace_all(text, GIT_NO, GIT_YES)
        text = _replace_all(text, CAPTURED_CWD, cwd)
    out: dict[str, Any] = json.loads(text)
    return out


def with_task(captured: dict[str, Any], task: str) -> dict[str, Any]:
    """The captured request with another user task (and, as a new conversation, new ids)."""
    text = new_ids(json.dumps({k: captured[k] for k in ("method", "path", "headers", "body")}))
    out: dict[str, Any] = json.loads(_replace_all(text, json.dumps(TASK)[1:-1], json.dumps(task)[1:-1]))
    return out


def without_tools(captured: dict[str, Any]) -> dict[str, Any]:
    """--quick: the request without its tool list (which is two thirds of it), so it fits the
    default model's 8k context (~5k tokens on SmolLM2) and keeps everything a variant changes."""
    out = copy.deepcopy(captured)
    out["body"].pop("tools", None)
    out["body"].pop("tool_choice", None)
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two request bodies differ, in document order: a JSON path per differing value, with
    the offset of the first differing character for strings (`system[2].text@3581`)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in list(a) + [k for k in b if k not in a]:
            out += differences(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        for i in range(max(len(a), len(b))):
            out += differences(a[i] if i < len(a) else None, b[i] if i < len(b) else None, f"{path}[{i}]")
        return out
    if a == b:
        return []
    if isinstance(a, str) and isinstance(b, str):
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return [f"{path}@{i}"]
    return [path]


def prompt_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """`differences` of two bodies less the fields no server renders (ids, metadata)."""
    return [d for d in differences(a, b) if not _NOT_RENDERED.search(d)]
