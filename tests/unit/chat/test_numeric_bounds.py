"""Numeric bounds in grammars (numeric_bounds.py): the range expressions accept exactly the values
in range (checked with a pure-Python matcher over many strings), the schemas that carry them make
grammars llama.cpp parses, and what cannot be enforced is a 400 naming the keyword and where."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest

from hearth.chat.numeric_bounds import Range, check_numbers, int_range, number_range
from hearth.chat.structured import schema_grammar, tool_call_grammar
from hearth.chat.types import Tool
from hearth.errors import BadRequest
from tests.unit.chat.test_structured import parses, vocab  # noqa: F401  (the fixture)


def matcher(expr: str) -> re.Pattern[str]:
    """The range expressions use literals, [a-b] classes, {m,n}, ?, groups and |: the same in regex."""
    return re.compile(re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), expr).replace(" ", ""))


INT_CASES = [(0, 150), (1, 9), (None, 150), (-150, None), (-1000, -3), (-7, 7), (10, 10), (0, 0), (99, 1001),
             (None, None), (123, 987), (-999, 999), (5, None), (None, -5), (100, 199), (1, 1000)]


@pytest.mark.parametrize(("lo", "hi"), INT_CASES)
def test_an_integer_range_accepts_exactly_its_integers(lo: int | None, hi: int | None) -> None:
    m = matcher(int_range(lo, hi))
    for n in range(-2100, 2100):
        assert bool(m.fullmatch(str(n))) == ((lo is None or n >= lo) and (hi is None or n <= hi)), (n, lo, hi)
    for noncanonical in ("-0", "007", "+5", "1.0", "1e2", ""):
        assert not m.fullmatch(noncanonical)


def test_an_open_side_stops_at_sixteen_digits() -> None:
    m = matcher(int_range(0, None))
    assert m.fullmatch("9" * 16) and not m.fullmatch("1" + "0" * 16)


def numbers() -> list[str]:
    out = {f"{s}{i}{f}" for s in ("", "-") for i in range(0, 160)
           for f in ("", ".0", ".5", ".25", ".05", ".99", ".000001", ".10")}
    return sorted(out | {"1e2", "01", "-0", "00.5", "1.", ".5", "-", "1.0.0"})


def valid(text: str) -> Fraction | None:
    if not re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", text):
        return None
    return Fraction(text)


NUM_CASES = [Range(0, False, 150, False), Range(0, True, 1, False), Range(0, False, 1, True),
             Range(-5, False, 5, True), Range(None, False, -3, True), Range(-10, True, None, False),
             Range(0, False, None, False), Range(None, False, 0, False), Range(None, False, 0, True),
             Range(2, True, 3, True), Range(-3, False, -3, False), Range(-100, False, -20, False)]


@pytest.mark.parametrize("r", NUM_CASES)
def test_a_number_range_accepts_only_numbers_in_range(r: Range) -> None:
    m = matcher(number_range(r))
    accepted = 0
    for text in numbers():
        v = valid(text)
        ok = v is not None and (r.lo is None or (v > r.lo if r.lo_excl else v >= r.lo)) \
            and (r.hi is None or (v < r.hi if r.hi_excl else v <= r.hi))
        if m.fullmatch(text):
            assert ok, (text, r)
            accepted += 1
        elif ok and text != "-0" and not re.search(r"\.\d*0$", text):  # some value in range, written plainly
            raise AssertionError(("in range but refused", text, r))
    assert accepted


def test_a_bounded_number_has_few_enough_digits_to_stay_inside_as_a_double() -> None:
    m = matcher(number_range(Range(None, False, 150, True)))
    assert m.fullmatch("149.999999999") and not m.fullmatch("149." + "9" * 13)
    assert float("149.999999999") < 150


def test_schemas_with_bounds_make_valid_grammars(vocab: Any) -> None:  # noqa: F811
    person = {"type": "object", "required": ["age", "score", "n"], "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "n": {"type": ["integer", "null"], "exclusiveMaximum": 10, "minimum": -10},
        "even": {"type": "integer", "minimum": 0, "maximum": 20, "multipleOf": 2},
        "old": {"type": "integer", "minimum": 5, "exclusiveMinimum": True},  # draft 4
        "any": {"type": "integer", "multipleOf": 1}}}
    g = schema_grammar(person)
    assert parses(vocab, g)
    assert '"1" "5" "0"' in g and '"-"' in g and '"20"' in g
    assert parses(vocab, tool_call_grammar([Tool("f", "", person)], "hermes", False))


def test_pydantic_bounds(vocab: Any) -> None:  # noqa: F811
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        age: int = Field(ge=0, le=150)
        confidence: float = Field(ge=0.0, le=1.0)
        rank: int | None = Field(default=None, gt=0, lt=11)

    g = schema_grammar(Person.model_json_schema())
    assert parses(vocab, g)
    rules = dict(re.findall(r"^([\w-]+) ::= (.*)$", g, re.M))
    assert matcher(rules["age"].removesuffix(" space")).fullmatch("150")
    assert not matcher(rules["age"].removesuffix(" space")).fullmatch("1815")


@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "number", "maximum": 0.5}, "maximum 0.5 at properties.x"),
    ({"type": "number", "exclusiveMinimum": -0.25}, "exclusiveMinimum -0.25 at properties.x"),
    ({"type": "number", "multipleOf": 0.01}, "multipleOf at properties.x"),
    ({"type": "integer", "multipleOf": 7}, "multipleOf 7 at properties.x"),
    ({"type": "integer", "multipleOf": 2, "minimum": 0, "maximum": 100_000}, "multipleOf 2 at properties.x"),
    ({"type": "integer", "minimum": 10, "maximum": 5}, "no integer satisfies the bounds at properties.x"),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "no integer satisfies"),
    ({"type": "number", "minimum": 1, "exclusiveMaximum": 1}, "no number satisfies"),
    ({"type": "number", "maximum": 1e15}, "too large"),
    ({"type": "integer", "maximum": "150"}, "maximum at properties.x must be a finite number"),
])
def test_what_cannot_be_enforced_is_a_400_naming_it(schema: dict[str, Any], named: str) -> None:
    wrapped = {"type": "object", "properties": {"x": schema}}
    with pytest.raises(BadRequest) as e:
        schema_grammar(wrapped)
    assert named in e.value.message and e.value.param == "response_format"
    with pytest.raises(BadRequest) as e:
        tool_call_grammar([Tool("f", "", wrapped)], "hermes", False)
    assert "the parameters of 'f' at properties.x" in e.value.message and e.value.param == "tools"


def test_keywords_the_converter_writes_itself_are_left_to_it() -> None:
    check_numbers({"enum": [1, 2], "type": "integer", "maximum": 0.5})  # the enum decides
    check_numbers({"type": "string", "maximum": 0.5})  # not a number: nothing to bound
    check_numbers({"type": "number", "maximum": 1e20})  # past what a bounded number can write: no bound
