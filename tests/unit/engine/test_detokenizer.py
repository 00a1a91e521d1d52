from hearth.engine.detokenizer import Detokenizer, StopMatch


def feed(det: Detokenizer, pieces: list[bytes]) -> tuple[list[str], StopMatch | None]:
    out: list[str] = []
    for p in pieces:
        r = det.push(p)
        if isinstance(r, StopMatch):
            out.append(r.text)
            return out, r
        out.append(r)
    return out, None


def test_utf8_character_split_across_tokens_is_never_split_in_deltas() -> None:
    data = "héllo 🔥 wörld".encode()
    det = Detokenizer()
    deltas, _ = feed(det, [bytes([b]) for b in data])
    deltas.append(det.flush())
    assert "".join(deltas) == "héllo 🔥 wörld"
    assert all("\ufffd" not in d for d in deltas)
    # the 4-byte emoji comes out whole, in one delta
    assert "🔥" in deltas


def test_stop_string_is_cut_and_never_partly_streamed() -> None:
    det = Detokenizer(stop=["STOP"])
    deltas, match = feed(det, [b"ab", b"S", b"T", b"O", b"P", b"zz"])
    assert match is not None and match.stop == "STOP"
    assert "".join(deltas) == "ab"
    assert all("S" not in d for d in deltas)


def test_held_prefix_is_released_when_it_cannot_become_a_stop() -> None:
    det = Detokenizer(stop=["STOP"])
    assert det.push(b"ab") == "ab"
    assert det.push(b"ST") == ""
    assert det.push(b"x") == "STx"


def test_earliest_of_several_stops_wins() -> None:
    det = Detokenizer(stop=["world", "lo w"])
    r = det.push(b"hello world")
    assert isinstance(r, StopMatch)
    assert r.text == "hel" and r.stop == "lo w"


def test_flush_returns_held_text_and_replaces_incomplete_utf8() -> None:
    det = Detokenizer(stop=["xyz"])
    assert det.push(b"abx") == "ab"
    assert det.flush() == "x"
    det2 = Detokenizer()
    assert det2.push("é".encode()[:1]) == ""
    assert det2.flush() == "\ufffd"
