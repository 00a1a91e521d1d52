"""A Chat stream's text chunk from the prebuilt envelope (`Chunks.content`) is the chunk the
dict path builds, byte for byte."""

from __future__ import annotations

import json

import pytest

from hearth.api.openai.shapes import Chunks

TEXTS = ["", "a", " the", 'quote " and \\ backslash', "line\nbreak\ttab\r", "\x00\x01\x1f control",
         "ünïcödé", "日本語", "emoji 🐉 and \u2028 sep", "</script>", "{\"json\": [1, 2]}"]


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("model", ["SmolLM2-135M-Instruct", 'odd "model" / ü'])
@pytest.mark.parametrize("index", [0, 3, 15])
def test_content_equals_the_dict_chunk(include_usage: bool, model: str, index: int) -> None:
    chunk = Chunks("chatcmpl-abc", "chat.completion.chunk", 1764380000, model, include_usage)
    for text in TEXTS:
        expected = chunk([{"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}])
        assert chunk.content(index, text) == expected
        assert json.loads(expected[len(b"data: "):])["choices"][0]["delta"]["content"] == text
