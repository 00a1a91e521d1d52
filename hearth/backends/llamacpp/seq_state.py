"""A sequence's saved KV state, in a form that does not depend on --parallel.

llama.cpp (`llama_state_seq_get_data`) writes a short header (a magic and version in this
build), a u32 stream count, then one block per KV stream (cell count, cell positions, each
layer's K and V rows; an empty stream is a zero cell count, four zero bytes). With one stream
per sequence only the saved sequence's own stream is non-empty, so `single_stream` cuts the
bytes down to a one-stream state and `as_streams` pads the empty streams back: a snapshot
loads into a server with any number of slots. (With kv_unified there is one stream already.)

The header's length is not a constant of the format: `header_len` measures it once, on the
state of an empty sequence. Pure functions over bytes; the runner reads and writes them.
"""

from __future__ import annotations

_U32 = 4


def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + _U32], "little")


def header_len(empty: bytes, n_stream: int) -> int:
    """The bytes before the stream count, from an empty sequence's state: header, u32
    n_stream, n_stream zero cell counts. RuntimeError if the bytes are not laid out so."""
    h = len(empty) - _U32 - _U32 * n_stream
    if h < 0 or _u32(empty, h) != n_stream or any(empty[h + _U32:]):
        raise RuntimeError("unexpected layout of llama.cpp's sequence state")
    return h


def single_stream(data: bytes, header: int, seq_id: int, n_stream: int) -> bytes:
    """`data` (the state of `seq_id`, one stream per sequence) as a one-stream state: only its
    own block kept. RuntimeError if any other stream is not empty."""
    before, after = _U32 * seq_id, _U32 * (n_stream - 1 - seq_id)
    block = data[header + _U32 + before: len(data) - after]
    if (_u32(data, header) != n_stream or any(data[header + _U32: header + _U32 + before])
            or any(data[len(data) - after:]) or len(block) < _U32):
        raise RuntimeError("unexpected layout of llama.cpp's sequence state")
    return data[:header] + (1).to_bytes(_U32, "little") + block


def check_single_stream(data: bytes, header: int) -> None:
    """ValueError unless `data` is a one-stream state (what `single_stream` returns)."""
    if len(data) < header + 2 * _U32 or _u32(data, header) != 1:
        raise ValueError("not a single-stream sequence state")


def as_streams(data: bytes, header: int, n_stream: int) -> bytes:
    """A one-stream state as the state of one sequence among `n_stream`: llama.cpp reads the
    one non-empty block into the sequence's own stream, the rest are empty."""
    return data[:header] + n_stream.to_bytes(_U32, "little") + data[header + _U32:] + bytes(_U32 * (n_stream - 1))
