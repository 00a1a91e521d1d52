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


# ---- blocks of tokens -----------------------------------------------------------------------

K_ROWS, V_ROWS = (6, 4), (4, 2)  # two layers: K and V bytes per token
V_EL = 2  # transposed V: bytes per element (V_ROWS // V_EL dimensions per layer)


def kv_state(positions: list[int], v_trans: bool) -> bytes:
    """A one-stream state whose cells hold `positions` in this (buffer) order; every K/V byte
    encodes (layer, position, byte index), so a misplaced byte shows."""
    n = len(positions)
    out = [HEADER, u32(1), u32(n)]
    out += [p.to_bytes(4, "little", signed=True) + u32(1) + u32(0) for p in positions]
    out += [u32(int(v_trans)), u32(len(K_ROWS))]
    for layer, row in enumerate(K_ROWS):
        out.append((1).to_bytes(4, "little") + row.to_bytes(8, "little"))
        out += [bytes((layer * 64 + p * 3 + i) % 256 for i in range(row)) for p in positions]
    for layer, row in enumerate(V_ROWS):
        if v_trans:
            dims = row // V_EL
            out.append((1).to_bytes(4, "little") + u32(V_EL) + u32(dims))
            out += [bytes((128 + layer * 32 + p * 5 + d * 7 + e) % 256 for p in positions for e in range(V_EL))
                    for d in range(dims)]
        else:
            out.append((1).to_bytes(4, "little") + row.to_bytes(8, "little"))
            out += [bytes((128 + layer * 32 + p * 5 + i) % 256 for i in range(row)) for p in positions]
    return b"".join(out)


@pytest.mark.parametrize("v_trans", [False, True])
def test_blocks_cut_from_a_state_join_back_into_it(v_trans: bool) -> None:
    data = kv_state(list(range(10)), v_trans)
    layout = seq_state.layout_of(data, len(HEADER))
    assert layout.per_token == sum(K_ROWS) + sum(V_ROWS)
    parts = seq_state.split_blocks(data, len(HEADER), layout, [(0, 4), (4, 8), (8, 10)])
    assert [len(p) for p in parts] == [4 * layout.per_token, 4 * layout.per_token, 2 * layout.per_token]
    assert seq_state.join_blocks(layout, [(parts[0], 4, 4), (parts[1], 4, 4), (parts[2], 2, 2)]) == data
    # a prefix ending inside a block is the state of those positions alone
    assert seq_state.join_blocks(layout, [(parts[0], 4, 4), (parts[1], 4, 1)]) == kv_state(list(range(5)), v_trans)


@pytest.mark.parametrize("v_trans", [False, True])
def test_cells_out_of_position_order_are_sorted_by_position(v_trans: bool) -> None:
    shuffled = [3, 0, 4, 1, 2]
    data = kv_state(shuffled, v_trans)
    layout = seq_state.layout_of(data, len(HEADER))
    parts = seq_state.split_blocks(data, len(HEADER), layout, [(0, 5)])
    assert seq_state.join_blocks(layout, [(parts[0], 5, 5)]) == kv_state(list(range(5)), v_trans)


def test_states_laid_out_otherwise_are_refused() -> None:
    good = kv_state(list(range(4)), False)
    layout = seq_state.layout_of(good, len(HEADER))
    with pytest.raises(ValueError):
        seq_state.layout_of(good[:-1], len(HEADER))  # truncated
    with pytest.raises(ValueError):
        seq_state.layout_of(good + b"x", len(HEADER))  # trailing bytes
    with pytest.raises(ValueError):
        seq_state.layout_of(kv_state([0, 1, 1, 3], False), len(HEADER))  # not positions 0..n-1
    with pytest.raises(ValueError):
        seq_state.split_blocks(good, len(HEADER), layout, [(2, 6)])  # past the cells
    with pytest.raises(ValueError):
        seq_state.split_blocks(kv_state(list(range(4)), True), len(HEADER), layout, [(0, 2)])  # another layout
    with pytest.raises(ValueError):
        seq_state.join_blocks(layout, [(b"\0" * 7, 1, 1)])  # a payload of the wrong size


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("n_stream", [1, 2, 4])
def test_blocks_join_straight_into_the_state_of_one_stream_among_many(v_trans: bool, n_stream: int) -> None:
    """join_blocks with the stream count is as_streams of the one-stream join (the buffer the
    runner hands llama.cpp as it is), whatever buffer type the payloads come in."""
    data = kv_state(list(range(10)), v_trans)
    layout = seq_state.layout_of(data, len(HEADER))
    parts = seq_state.split_blocks(data, len(HEADER), layout, [(0, 4), (4, 8), (8, 10)])
    joined = seq_state.join_blocks(layout, [(bytearray(parts[0]), 4, 4), (parts[1], 4, 4), (parts[2], 2, 1)], n_stream)
    assert isinstance(joined, bytearray)
    assert joined == seq_state.as_streams(kv_state(list(range(9)), v_trans), len(HEADER), n_stream)
