"""Documents cut into chunks of whole lines, each citable by file and line range."""

from __future__ import annotations

from dataclasses import dataclass

from hearth.retrieval.documents import Document


@dataclass(frozen=True, slots=True)
class Chunk:
    path: str
    start: int  # first line, 1-based
    end: int  # last line, inclusive
    text: str

    @property
    def cite(self) -> str:
        return f"{self.path}:{self.start}" if self.start == self.end else f"{self.path}:{self.start}-{self.end}"


def chunk_document(doc: Document, max_chars: int) -> list[Chunk]:
    """Whole lines, at most `max_chars` a chunk, without blank lines at either end. A chunk is cut
    after the last blank line in its second half when there is one; a line longer than
    `max_chars` is cut into pieces that all cite that line."""
    chunks: list[Chunk] = []
    buf: list[tuple[int, str]] = []  # (line number, line) not yet in a chunk
    size = 0  # len("\n".join(buf)) + 1

    def emit(part: list[tuple[int, str]]) -> None:
        while part and not part[0][1].strip():
            part = part[1:]
        while part and not part[-1][1].strip():
            part = part[:-1]
        if part:
            chunks.append(Chunk(doc.path, part[0][0], part[-1][0], "\n".join(line for _, line in part)))

    for no, line in enumerate(doc.text.splitlines(), 1):
        if len(line) > max_chars:
            emit(buf)
            buf, size = [], 0
            chunks += [Chunk(doc.path, no, no, line[i:i + max_chars]) for i in range(0, len(line), max_chars)
                       if line[i:i + max_chars].strip()]
            continue
        while buf and size + len(line) > max_chars:
            blanks = [i for i in range(len(buf) // 2, len(buf)) if not buf[i][1].strip()]
            cut = blanks[-1] + 1 if blanks else len(buf)
            emit(buf[:cut])
            buf = buf[cut:]
            size = sum(len(x) + 1 for _, x in buf)
        buf.append((no, line))
        size += len(line) + 1
    emit(buf)
    return chunks
