"""bench.tool_calls' own logic, without a server: where a text answer's extra first-byte time
goes (the held characters, the chunks that carry them off, the time the model took to write
them there, and what is left)."""

from __future__ import annotations

from bench.tool_calls import Answer, held_chars, summarize

FENCED = '```json\n{\n  "name": "README.md",\n  "arguments": {}\n}\n```'
CHUNKS = ["```", "json", "\n", "{\n", " ", ' "', "name", '":', ' "', "README", ".md", '",\n']


def marks(chunks: list[str], t0: float, step: float) -> list[tuple[float, int]]:
    out, n = [], 0
    for k, c in enumerate(chunks):
        n += len(c)
        out.append((t0 + k * step, n))
    return out


def test_held_characters_end_at_the_names_first_character() -> None:
    assert held_chars(FENCED) == len('```json\n{\n  "name": "R')
    assert held_chars("The file says hello") == 1


def test_the_extra_time_is_split_into_writing_the_held_tokens_and_the_rest() -> None:
    text = "".join(CHUNKS)
    off = Answer(0, False, [], text, "stop", 0.03, 1.0, marks(CHUNKS, 0.03, 0.02))
    on = Answer(0, True, [], text, "stop", 0.03 + 9 * 0.02 + 0.01, 1.0, [])
    s = summarize([off, on])
    assert s["held_tokens_stayed_text"] == {"median": 10, "max": 10}  # through "README"
    assert s["writing_held_s"] == round(9 * 0.02, 3)  # the first chunk to the tenth
    assert s["extra_beyond_writing_s"] == 0.01
    assert s["text_unchanged"] is True
