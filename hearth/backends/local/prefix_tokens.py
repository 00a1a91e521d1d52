"""How many of a prompt's tokens a prefix of its text keeps, without tokenizing that prefix again.

`keep_tokens` (hearth.backends.local.prepare) asks, on every request with a cache_control
breakpoint, how much of the prompt's tokens the prompt rendered up to the breakpoint shares:
`common_prefix_len(tokenize(prefix), tokens)`. Tokenizing the prefix costs as much as the whole
prompt (13 ms for Claude Code's 12k tokens on this machine, on every turn); this finds the same
number from the tokens already made.

Why it is the same number: llama.cpp's tokenizer first cuts the text at every special token
spelled in it (`Runner.cuts_text`), then tokenizes each piece alone. Let S be a special token of
`tokens` whose text ends at or before the breakpoint and whose bytes are where `tokens` puts
them. Then the prefix's tokens are `tokens` up to S followed by the tokens of the prefix's text
from S on, so `common_prefix_len(tokenize(prefix), tokens)` is S's index plus the common prefix
of `tokenize(prefix[S:])` with `tokens` from S: only the piece from S to the breakpoint (in a
ChatML prompt the `<|im_end|>\\n` that ends the breakpoint's message) is tokenized again.

S is found by walking the tokens' text from whichever end of the prompt is nearer the
breakpoint, checking each token's bytes against the text. Whatever does not line up (a
template whose whole text does not start with the prefix's, a tokenizer that adds or strips
text, no special token before the breakpoint) answers None: the caller tokenizes the prefix.
The walk reads one token's text at a time (about as slow per token as the tokenizer), so it
gives up after a quarter of the prompt's tokens: a breakpoint far from both ends (or no
special token near it) costs at most a quarter more than tokenizing the prefix.
"""

from __future__ import annotations

from hearth.engine.runner import Runner

MIN_WALK = 64  # tokens a walk may always take (a short prompt's quarter is nothing to save)


def split_at_special(runner: Runner, tokens: list[int], text: str, prefix: str) -> tuple[int, str] | None:
    """(i, rest) where `tokens[i]` is the last special token ending at or before the end of
    `prefix` and `rest` is the text of `prefix` from that token on, with `tokens` the
    tokenization of `text` (special tokens parsed, none added); None when no such token is
    found where the text puts it (then nothing can be said without tokenizing `prefix`)."""
    if not text.startswith(prefix):
        return None
    whole = text.encode()
    cut = len(prefix.encode())
    steps = max(MIN_WALK, len(tokens) // 4)
    found = (_forward(runner, tokens, whole, cut, steps) if cut <= len(whole) - cut
             else _backward(runner, tokens, whole, cut, steps))
    if found is None:
        return None
    i, at = found
    try:
        return i, whole[at:cut].decode()
    except UnicodeDecodeError:  # a special token that starts inside a character: not one to cut at
        return None


def _backward(runner: Runner, tokens: list[int], whole: bytes, cut: int, steps: int) -> tuple[int, int] | None:
    """From the end: the first special token ending at or before `cut`, every token after it
    spelling the text where it stands (within the last `steps` tokens)."""
    end = len(whole)
    for i in range(len(tokens) - 1, max(-1, len(tokens) - 1 - steps), -1):
        piece = runner.token_text(tokens[i])
        start = end - len(piece)
        if start < 0 or not whole.startswith(piece, start):
            return None
        if end <= cut and runner.cuts_text(tokens[i]):
            return i, start
        end = start
    return None


def _forward(runner: Runner, tokens: list[int], whole: bytes, cut: int, steps: int) -> tuple[int, int] | None:
    """From the start: the last special token ending at or before `cut`, every token up to
    `cut` spelling the text where it stands (`cut` within the first `steps` tokens)."""
    found = None
    start = 0
    for i, token in enumerate(tokens):
        if start >= cut:
            break
        if i == steps:
            return None
        piece = runner.token_text(token)
        if not whole.startswith(piece, start):
            return None
        end = start + len(piece)
        if end <= cut and runner.cuts_text(token):
            found = (i, start)
        start = end
    return found
