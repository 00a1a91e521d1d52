"""The saved-state byte layout, on hand-built bytes: a sequence's state among n streams becomes a
one-stream state and back, and bytes laid out otherwise are refused."""

from __future__ import annotations

import pytest

from hearth.backends.llamacpp import seq_state

HEADER = b"GGSQ\x01\x00\x00\x00"  # stands for llama.cpp's magic and version


def u32(n: int) -> bytes:
    return n.to_bytes(4, "little")


def state(n_stream: int, seq_id: int, block: bytes) -> bytes:
    """What llama.cpp writes for `seq_id`: its own stream's block, every other stream empty."""
    return HEADER + u32(n_stream) + b"".join(block if s == seq_id else u32(0) for s in range(n_stream))


def test_the_header_is_measured_on_an_empty_sequence() -> None:
    assert seq_state.header_len(HEADER + u32(3) + bytes(12), 3) == len(HEADER)
    with pytest.raises(RuntimeError):
        seq_state.header_len(HEADER + u32(2) + bytes(12), 3)  # the count is not the stream count


@pytest.mark.parametrize("seq_id", [0, 1, 3])
def test_a_sequence_among_streams_round_trips_through_one_stream(seq_id: int) -> None:
    block = u32(2) + b"cells and rows"
    one = seq_state.single_stream(state(4, seq_id, block), len(HEADER), seq_id, 4)
    assert one == HEADER + u32(1) + block
    seq_state.check_single_stream(one, len(HEADER))
    # llama.cpp reads the one non-empty block into the slot's own stream, whatever the slot
    assert seq_state.as_streams(one, len(HEADER), 4) == HEADER + u32(4) + block + bytes(12)


def test_another_streams_cells_are_refused() -> None:
    data = state(2, 0, u32(1) + b"x")[:-4] + u32(1)  # stream 1 not empty
    with pytest.raises(RuntimeError):
        seq_state.single_stream(data, len(HEADER), 0, 2)


def test_only_a_one_stream_state_loads() -> None:
    with pytest.raises(ValueError):
        seq_state.check_single_stream(state(2, 0, u32(1) + b"x"), len(HEADER))
    with pytest.raises(ValueError):
        seq_state.check_single_stream(HEADER + u32(1), len(HEADER))  # no block at all
