"""The loop detector on token sequences."""

from __future__ import annotations

import pytest

from hearth.engine.repetition import RepetitionSpec, RepetitionTracker


def first_loop(tokens: list[int], spec: RepetitionSpec) -> int | None:
    """The index of the token on which the tracker calls it a loop."""
    t = RepetitionTracker(spec)
    return next((i for i, tok in enumerate(tokens) if t.observe(tok)), None)


def test_a_short_unit_loops_once_it_covers_min_tokens() -> None:
    spec = RepetitionSpec(min_repeats=4, min_tokens=20)
    assert first_loop([1, 2] * 30, spec) == 19  # "1\n1\n…": 20 tokens of period 2


def test_a_long_unit_needs_min_repeats() -> None:
    unit = list(range(100, 130))  # a 30-token line
    spec = RepetitionSpec(min_repeats=3, max_period=64, min_tokens=10)
    assert first_loop(unit * 5, spec) == 3 * 30 - 1


def test_varied_text_and_units_longer_than_max_period_do_not_loop() -> None:
    spec = RepetitionSpec(min_repeats=3, max_period=16, min_tokens=8)
    assert first_loop([i * 7919 % 1000 for i in range(2000)], spec) is None
    assert first_loop(list(range(20)) * 6, spec) is None  # period 20 > 16


def test_a_loop_after_prose_is_caught_and_a_break_resets_it() -> None:
    spec = RepetitionSpec(min_repeats=4, max_period=8, min_tokens=12)
    prose = list(range(500, 540))
    assert first_loop(prose + [7, 8, 9] * 10, spec) == 40 + 11
    # three repeats, something else, three repeats: never four in a row
    assert first_loop(([7, 8, 9] * 3 + [1]) * 5, RepetitionSpec(min_repeats=4, max_period=8, min_tokens=1)) is None


@pytest.mark.parametrize("kw", [{"min_repeats": 1}, {"max_period": 0}, {"min_tokens": 0}, {"max_period": 5000}])
def test_out_of_range_settings_are_refused(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        RepetitionSpec(**kw)
