"""A Hearth server on the 32k tool-calling model, shared by the agent end-to-end tests."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.helpers import Server, start_server, stop_server

# One line per HTTP request in Hearth's log: "[req_…] POST /v1/responses 200 1234.5ms".
ACCESS_LINE = re.compile(r"\] (GET|POST|PUT|PATCH|DELETE|HEAD) (\S+) (\d{3}) ")


def statuses(server: Server, since: int = 0) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request the server logged, from byte `since` of its log."""
    text = server.log.read_bytes()[since:].decode(errors="replace")
    return [(m[1], m[2], int(m[3])) for m in ACCESS_LINE.finditer(text)]


@pytest.fixture(scope="session")
def qwen_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Qwen2.5-Coder-0.5B (installed by scripts/setup_agents.sh) with its whole 32k context:
    agents' prompts run 4k-20k tokens, and Claude Code asks for max_tokens 32000 whatever the
    prompt (the server's default lowers it to what the context leaves). The default time cap
    counts from the first token, so a cold prefill on a loaded CI machine is not cut."""
    s = start_server(tmp_path_factory.mktemp("agents"), "--model", "qwen2.5-coder-0.5b", "--ctx", "32768",
                     "--parallel", "2")
    yield s
    stop_server(s)
