"""A streamed answer rendered as markdown in the terminal (`hearth chat` without --plain).

The answer is cut into top-level markdown blocks (markdown-it, the parser rich's Markdown uses).
A block is finished once the parser has seen the next one start: it is printed once, for good,
above a live region that shows only the block being written and is redrawn as it grows (rich's
Live). So the screen never redraws what scrolled away (a Live taller than the terminal cannot
erase it and leaves copies), and each redraw parses one block, not the whole answer: the same
split as the chat page's render.js. When the answer ends, the live region is replaced by the
last block, printed like the others.
"""

from __future__ import annotations

import time

from markdown_it import MarkdownIt
from rich.console import Console, Group
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text

# Redraws at most this often: a token every few ms would otherwise re-parse the block each time.
REDRAW_SECONDS = 0.05


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("strikethrough").enable("table")  # as rich.markdown.Markdown


def finished_prefix(text: str, parser: MarkdownIt | None = None) -> int:
    """How many characters at the start of `text` are whole top-level blocks that another block
    already follows (0 while the text holds at most one block)."""
    tokens = (parser or _parser()).parse(text)
    starts = [t.map[0] for t in tokens if t.level == 0 and t.map is not None and t.nesting >= 0]
    if len(starts) < 2:
        return 0
    lines = text.splitlines(keepends=True)
    return sum(len(line) for line in lines[:starts[-1]])


class MarkdownStream:
    """Feed it the answer's pieces with `add`; `close` prints what is left. `live` is False where
    the output is no terminal: then nothing is drawn until `close`, which prints it all."""

    def __init__(self, out: Console, *, live: bool = True) -> None:
        self.out = out
        self.text = ""
        self.done = 0  # text[:done] is printed, as finished blocks
        self.parser = _parser()
        self.last_draw = 0.0
        self.live: Live | None = None
        if live:
            self.live = Live(Text(""), console=out, transient=True, auto_refresh=False,
                             vertical_overflow="crop")
            self.live.start()

    def add(self, piece: str) -> None:
        self.text += piece
        now = time.monotonic()
        if self.live is None or now - self.last_draw < REDRAW_SECONDS:
            return
        self.last_draw = now
        self._draw()

    def _draw(self) -> None:
        assert self.live is not None
        tail = self.text[self.done:]
        cut = finished_prefix(tail, self.parser)
        if cut:
            self._print_blocks(tail[:cut])
            self.done += cut
        self.live.update(Markdown(self.text[self.done:]), refresh=True)

    def _print_blocks(self, markdown: str) -> None:
        # Blocks printed apart are spaced as rich spaces them within one Markdown: a blank line.
        # (Printed while the Live runs, they land above its region.)
        self.out.print(Group(Markdown(markdown), Text("")))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
        rest = self.text[self.done:]
        if rest.strip():
            self.out.print(Markdown(rest))
        self.done = len(self.text)
