"""Refusing text whose size alone proves it cannot fit the context, before tokenizing it.

Tokenizing costs time linear in the text (a 31 MB /tokenize body took 42 s), so a prompt that
cannot fit is refused on its length first. The proof: no token covers more than
`longest_token` bytes of text (special tokens spelled out included), and a character is at least
one UTF-8 byte, so a text of more than `longest_token * n_ctx` characters needs more than
`n_ctx` tokens. (This holds for the BPE and SentencePiece vocabularies llama.cpp serves: none
of them drops characters while normalizing.)
"""

from __future__ import annotations

from hearth.engine.runner import Runner
from hearth.errors import ContextLimit


def longest_token(runner: Runner) -> int:
    """The most bytes of text one token of `runner`'s vocabulary stands for (at least 1)."""
    return max((len(runner.token_text(t)) for t in range(runner.n_vocab)), default=1) or 1


def check_fits(text: str, longest: int, n_ctx: int) -> None:
    """ContextLimit when `text` is provably longer than `n_ctx` tokens; O(1)."""
    limit = longest * n_ctx
    if len(text) > limit:
        at_least = -(-len(text) // longest)  # tokens the text needs at the fewest (> n_ctx)
        raise ContextLimit(f"This model's maximum context length is {n_ctx} tokens. The text is {len(text)} "
                           f"characters, more than {n_ctx} tokens can hold ({limit}: no token covers more than "
                           f"{longest} bytes), so it was refused without tokenizing it.",
                           n_prompt=at_least, limit=n_ctx)
