"""hearth.jsonsafe: bounded JSON from clients and disk (depth, value count, valid Unicode)."""

from __future__ import annotations

import json

import pytest

from hearth.jsonsafe import MAX_DEPTH, JSONRejected, check_structure, loads


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_nesting_to_the_limit_parses_and_past_it_is_refused_before_python_recurses() -> None:
    assert loads(nested(MAX_DEPTH)) is not None
    for depth in (MAX_DEPTH + 1, 1000, 100_000):  # 1000 was a RecursionError in json.loads
        with pytest.raises(JSONRejected, match=f"deeper than {MAX_DEPTH}"):
            loads(nested(depth))


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"code": "[" * 5000, "esc": '\\"[[[' * 100, "q": '"' * 10}).encode()
    assert loads(text)["code"] == "[" * 5000
    # an escaped backslash before a quote ends the string: what follows is real nesting
    with pytest.raises(JSONRejected):
        loads(b'["\\\\",' + nested(MAX_DEPTH) + b"]")
    loads(b'["\\\\",' + nested(MAX_DEPTH - 1) + b"]")


def test_value_count_is_bounded() -> None:
    check_structure(b"[" + b"1," * 999 + b"1]", max_values=1000)
    with pytest.raises(JSONRejected, match="more than 1000 values"):
        check_structure(b"[" + b"1," * 1000 + b"1]", max_values=1000)
    check_structure(json.dumps(["," * 5000]).encode(), max_values=1000)  # commas in a string are text


@pytest.mark.parametrize("body", [
    b'{"a": "\\ud800"}',  # a lone high surrogate
    b'{"a": "x\\udfff"}',  # a lone low surrogate
    b'{"a": ["ok", {"b": "\\udfff\\ud800"}]}',  # low before high is no pair
    b'{"\\ud800": 1}',  # in a key
    b'"\xed\xa0\x80"',  # a surrogate as raw (invalid) UTF-8 bytes
    b'{"a": "\xff"}',  # not UTF-8 at all
])
def test_text_that_is_not_valid_unicode_is_refused(body: bytes) -> None:
    with pytest.raises(JSONRejected) as e:
        loads(body)
    json.dumps(str(e.value)).encode()  # the message itself is valid text (it never echoes the surrogate)


def test_the_refusal_names_where_the_surrogate_is() -> None:
    with pytest.raises(JSONRejected, match=r"messages\[1\]\.name"):
        loads(b'{"messages": [{"role": "user"}, {"role": "user", "name": "\\ud800"}]}')


def test_valid_pairs_and_escaped_backslashes_are_text() -> None:
    assert loads(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}
    assert loads(b'{"a": "\\\\ud800"}') == {"a": "\\ud800"}  # a backslash, then the letters
    assert loads(b'{"a": "\\ud800"}', repair_surrogates=True) == {"a": "\ufffd"}
