"""hearth.text: finding and repairing lone surrogates."""

from __future__ import annotations

from hearth.text import find_lone_surrogate, lone_surrogate, scrub, scrub_value


def test_lone_surrogates_are_found_and_repaired() -> None:
    assert lone_surrogate("plain") is None and lone_surrogate("é\U0001f600") is None
    assert lone_surrogate("ab\ud800") == 2
    assert scrub("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert scrub_value({"k\ud800": ["x\udc00", 1, None]}) == {"k\ufffd": ["x\ufffd", 1, None]}
    assert find_lone_surrogate({"a": [{"b": "ok"}, {"c": "\ud800"}]}) == "a[1].c"
    assert find_lone_surrogate({"a": ["fine"]}) is None
    deep: object = "\ud800"
    for _ in range(5000):  # iterative: depth is no problem
        deep = [deep]
    assert find_lone_surrogate(deep) is not None
