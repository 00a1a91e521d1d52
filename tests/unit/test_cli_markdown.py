"""hearth/cli/markdown.py: where a streamed answer's finished blocks end, and that each is printed
once, in order, while the answer streams (the terminal's version of the page's render.js)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console, Group
from rich.markdown import Markdown

from hearth.cli import markdown as md

ANSWER = ("# Title\n\nA paragraph\nover two lines.\n\n- one\n- two\n\n```py\nx = 1\n\ny = 2\n```\n\n"
          "| a | b |\n|---|---|\n| 1 | 2 |\n\nThe end.")


def test_finished_prefix_stops_before_the_block_being_written() -> None:
    assert md.finished_prefix("") == 0
    assert md.finished_prefix("A paragraph\nstill going") == 0, "one block: nothing is finished"
    assert md.finished_prefix("# Title\n\nA para") == len("# Title\n\n")
    assert md.finished_prefix("- one\n- two\n\n") == 0, "a list may go on after a blank line"
    assert md.finished_prefix("- one\n- two\n\nNext") == len("- one\n- two\n\n")
    assert md.finished_prefix("```py\nx = 1\n\ny") == 0, "a blank line inside an open fence ends nothing"


def test_streamed_blocks_are_printed_once_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(md, "REDRAW_SECONDS", 0.0)  # a redraw on every piece: the most work
    out = Console(file=io.StringIO(), force_terminal=True, width=80)
    printed: list[str] = []
    real_print = out.print

    def spy(*objects: Any, **kw: Any) -> None:
        for o in objects:
            parts = o.renderables if isinstance(o, Group) else [o]
            printed.extend(p.markup for p in parts if isinstance(p, Markdown))
        real_print(*objects, **kw)

    monkeypatch.setattr(out, "print", spy)
    parsed = 0
    real_finished = md.finished_prefix

    def counting(text: str, parser: Any = None) -> int:
        nonlocal parsed
        parsed += len(text)
        return real_finished(text, parser)

    monkeypatch.setattr(md, "finished_prefix", counting)
    stream = md.MarkdownStream(out, live=True)
    for i in range(0, len(ANSWER), 2):
        stream.add(ANSWER[i:i + 2])
    stream.close()
    assert "".join(printed) == ANSWER, "every block printed once, nothing twice, nothing lost"
    assert len(printed) == 6, printed  # heading, paragraph, list, code, table, then the last paragraph
    longest = max(len(p) for p in printed)
    assert parsed <= (len(ANSWER) // 2 + 1) * (longest + 2), "each redraw parses one block, not the answer"
