"""The parts of a relayed answer a cancelled turn is counted from (turn/watch.py `answer_parts`,
turn/scan.py): the first answer under its id on the node that broke first, each continuation
under its own id (read from its first events, before they are renamed) on its node."""

from __future__ import annotations

from hearth.gateway.turn.scan import Scan
from hearth.gateway.turn.watch import answer_parts

CHUNK = b'data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","choices":[]}'


def test_one_node_is_one_part() -> None:
    scan = Scan()
    scan.feed(CHUNK % b"a1")
    assert answer_parts(scan, [], ["a"]) == [("a", "chatcmpl-a1")]
    assert answer_parts(Scan(), [], ["a"]) == []  # no id seen: nothing to look up


def test_each_continuation_is_a_part_on_its_node() -> None:
    scan = Scan()
    scan.feed(CHUNK % b"a1")
    scan.moved("b")
    scan.feed_part(b": keep-alive")  # not an event with an id: looked past
    scan.feed_part(CHUNK % b"b1")
    scan.feed_part(CHUNK % b"b2")  # its id is its first one
    scan.moved("c")
    for _ in range(3):
        scan.feed_part(b"data: {}")  # three events without one: no longer looked for
    scan.feed_part(CHUNK % b"c1")
    assert scan.parts == [["b", "chatcmpl-b1"], ["c", None]]
    # c's id never came: its part cannot be looked up, the others are
    assert answer_parts(scan, ["a", "b"], ["a", "b", "c"]) == [("a", "chatcmpl-a1"), ("b", "chatcmpl-b1")]
