"""Which chunks answer a question: BM25 (`bm25s`) over the chunks' words, and the best of them
that fit a token budget."""

from __future__ import annotations

import re

from hearth.retrieval.chunks import Chunk

_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_STOP = ("a an and are as at be but by can do does for from has have how i if in into is it its me my not of on or "
         "our so than that the their them then there these they this to was we were what when where which who why "
         "will with you your")
STOP_WORDS = frozenset(_STOP.split())


def terms(text: str) -> list[str]:
    """BM25 terms: lower-cased words without stop words; identifiers also by their parts
    (`parseConfigFile`, `parse_config_file` → parse, config, file)."""
    out = []
    for word in _WORD.findall(text):
        whole = word.lower()
        parts = [p.lower() for p in _CAMEL.findall(word)]
        for t in [whole, *parts] if len(parts) > 1 else [whole]:
            if len(t) > 1 and t not in STOP_WORDS:
                out.append(t)
    return out


class Index:
    """BM25 over chunks; a chunk is indexed with its file's path, so file names count."""

    def __init__(self, chunks: list[Chunk]) -> None:
        import bm25s  # imported here: `hearth --help` should not pay for it

        self.chunks = chunks
        self._bm25 = bm25s.BM25()
        self._bm25.index([terms(c.path.replace("/", " ") + "\n" + c.text) or ["\x00"] for c in chunks],
                         show_progress=False)

    def search(self, question: str, k: int) -> list[tuple[Chunk, float]]:
        """The best `k` chunks with a score above zero, best first."""
        vocab = self._bm25.vocab_dict
        query = [t for t in terms(question) if t in vocab]
        if not query or not self.chunks:
            return []
        scores = self._bm25.get_scores(query)
        order = sorted(range(len(self.chunks)), key=lambda i: (-float(scores[i]), i))
        return [(self.chunks[i], float(scores[i])) for i in order[:k] if scores[i] > 0]


def select_passages(ranked: list[Chunk], tokens: dict[Chunk, int], budget: int) -> list[Chunk]:
    """The ranked chunks, best first, that fit in `budget` tokens together (a chunk that does not
    fit is passed over for smaller ones after it)."""
    chosen, used = [], 0
    for c in ranked:
        if used + tokens[c] <= budget:
            chosen.append(c)
            used += tokens[c]
    return chosen
