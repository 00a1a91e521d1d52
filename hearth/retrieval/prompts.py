"""The messages that carry documents to the model: all of them whole, once, as a session's first
message (marked with a fingerprint, so a later run over unchanged documents finds them there), or
the passages chosen for one question; and the citations printed after an answer."""

from __future__ import annotations

import hashlib
import re

from hearth.retrieval.chunks import Chunk
from hearth.retrieval.documents import Document

MARK = "[hearth docs"  # how a session's first message says it holds documents


def fingerprint(docs: list[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(d.path.encode() + b"\0" + d.text.encode() + b"\0")
    return h.hexdigest()[:16]


def documents_message(docs: list[Document]) -> str:
    files = "\n\n".join(f"=== {d.path} ===\n{d.text.rstrip()}\n=== end of {d.path} ===" for d in docs)
    return (f"{MARK} {fingerprint(docs)}: {len(docs)} files]\n"
            f"Here are my documents. Answer my questions about them from what they say, and name the "
            f"files you used.\n\n{files}\n\nReply with OK once you have read them.")


def passage_block(n: int, c: Chunk) -> str:
    return f"[{n}] {c.cite}\n{c.text.rstrip()}"


def question_message(question: str, passages: list[Chunk]) -> str:
    if not passages:
        return f"{MARK} passages]\nNo passage of my documents matches this question.\n\nQuestion: {question}"
    blocks = "\n\n".join(passage_block(i, c) for i, c in enumerate(passages, 1))
    return (f"{MARK} passages]\nPassages from my documents:\n\n{blocks}\n\n"
            f"Answer from these passages and cite them by number, like [1].\n\nQuestion: {question}")


def citations(passages: list[Chunk], answer: str) -> list[str]:
    """One line per passage given: `[n] file:start-end`, marked when the answer cites it."""
    cited = {int(n) for n in re.findall(r"\[(\d+)\]", answer)}
    return [f"[{i}] {c.cite}{'  (cited)' if i in cited else ''}" for i, c in enumerate(passages, 1)]
