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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

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


def as_streams(data: bytes, header: int, n_stream: int) -> bytearray:
    """A one-stream state as the state of one sequence among `n_stream`: llama.cpp reads the
    one non-empty block into the sequence's own stream, the rest are empty. A new bytearray
    (one copy), so the runner hands it to llama.cpp without another."""
    out = bytearray(len(data) + _U32 * (n_stream - 1))  # the padding: empty streams, zero cell counts
    out[:len(data)] = data
    out[header:header + _U32] = n_stream.to_bytes(_U32, "little")
    return out


# ---- blocks of tokens (the prompt cache) -----------------------------------------------------
#
# A one-stream state holds, after the header and the stream count: the cell count n; per cell
# its position (i32), a sequence-id count that is 1 for a single sequence's state (u32) and that
# id (i32); u32 v_trans and u32 n_layer; per layer the K rows (i32 type, u64 row size, then n
# rows, one per cell); then per layer the V rows the same way, or, when V is stored transposed,
# i32 type, u32 element size, u32 embedding size, then per embedding dimension n elements.
# Cells come in the order of the KV buffer, not necessarily of position, so `kv_split` sorts
# them by position first. A block payload is that data for the tokens of one position range:
# every layer's K rows, then every layer's V rows (transposed: per dimension, the range's
# elements). `kv_join` builds a state back from consecutive payloads.


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What every state of one context has in common (learned from one state)."""

    # The state's own header. Not compared: one of its words differs between sequences, and
    # llama.cpp reads a state into any sequence whatever it says (swap and snapshots rely on it).
    header: bytes = field(compare=False)
    v_trans: bool
    k_heads: tuple[bytes, ...]  # per layer: the 12 bytes before its K rows
    k_rows: tuple[int, ...]  # per layer: K bytes per token
    v_heads: tuple[bytes, ...]
    v_rows: tuple[int, ...]  # per layer: V bytes per token (transposed: element size x dimensions)
    v_el: tuple[int, ...]  # transposed V: element size per layer (else 0)

    @property
    def per_token(self) -> int:
        return sum(self.k_rows) + sum(self.v_rows)


@dataclass(slots=True)
class _Parsed:
    layout: KVLayout
    n: int
    order: np.ndarray | None  # cells in position order (None: they already are)
    k: list[np.ndarray]  # per layer (n, row) uint8
    v: list[np.ndarray]  # per layer (n, row), or transposed (dims, n, el)


def _parse(data: bytes, header: int) -> _Parsed:
    """ValueError unless `data` is a one-stream state of positions 0..n-1 laid out as above."""
    buf = np.frombuffer(data, dtype=np.uint8)
    off = header

    def u32(at: int) -> int:
        if at + _U32 > len(data):
            raise ValueError("sequence state is truncated")
        return _u32(data, at)

    if u32(off) != 1:
        raise ValueError("not a single-stream sequence state")
    n = u32(off + _U32)
    off += 2 * _U32
    if n == 0 or off + 12 * n > len(data):
        raise ValueError("sequence state holds no cells or is truncated")
    meta = np.frombuffer(data, dtype="<i4", count=3 * n, offset=off).reshape(n, 3)
    off += 12 * n
    if (meta[:, 1] != 1).any():
        raise ValueError("unexpected cell layout in the sequence state")
    pos = meta[:, 0]
    order: np.ndarray | None = None
    if not np.array_equal(pos, np.arange(n)):
        order = np.argsort(pos, kind="stable")
        if not np.array_equal(pos[order], np.arange(n)):
            raise ValueError("the sequence state does not hold positions 0..n-1")
    v_trans, n_layer = u32(off), u32(off + _U32)
    off += 2 * _U32
    if v_trans > 1 or not 0 < n_layer <= 4096:
        raise ValueError("unexpected layer header in the sequence state")
    k_heads, k_rows, ks = [], [], []
    for _ in range(n_layer):
        head = data[off:off + 12]
        row = int.from_bytes(data[off + 4:off + 12], "little")
        off += 12
        if len(head) != 12 or off + n * row > len(data):
            raise ValueError("sequence state is truncated")
        ks.append(buf[off:off + n * row].reshape(n, row))
        k_heads.append(head)
        k_rows.append(row)
        off += n * row
    v_heads, v_rows, v_el, vs = [], [], [], []
    for _ in range(n_layer):
        head = data[off:off + 12]
        if len(head) != 12:
            raise ValueError("sequence state is truncated")
        if v_trans:
            el, dims = u32(off + 4), u32(off + 8)
            row = el * dims
        else:
            el, dims, row = 0, 0, int.from_bytes(data[off + 4:off + 12], "little")
        off += 12
        if off + n * row > len(data):
            raise ValueError("sequence state is truncated")
        block = buf[off:off + n * row]
        vs.append(block.reshape(dims, n, el) if v_trans else block.reshape(n, row))
        v_heads.append(head)
        v_rows.append(row)
        v_el.append(el)
        off += n * row
    if off != len(data):
        raise ValueError("trailing bytes in the sequence state")
    layout = KVLayout(data[:header], bool(v_trans), tuple(k_heads), tuple(k_rows), tuple(v_heads),
                      tuple(v_rows), tuple(v_el))
    return _Parsed(layout, n, order, ks, vs)


def layout_of(data: bytes, header: int) -> KVLayout:
    return _parse(data, header).layout


def cells_of(data: bytes, header: int, layout: KVLayout) -> int:
    """How many cells `data` holds; ValueError unless it is a one-stream state laid out as
    `layout` with positions 0..n-1 (what imported KV must be before it is used)."""
    p = _parse(data, header)
    if p.layout != layout:
        raise ValueError("the saved KV was laid out by another model or KV type")
    return p.n


def split_blocks(data: bytes, header: int, layout: KVLayout, ranges: list[tuple[int, int]]) -> list[bytes]:
    """Block payloads of `data` for each position range [a, b). ValueError if `data` is not laid
    out as `layout` says or a range is out of bounds."""
    p = _parse(data, header)
    if p.layout != layout:
        raise ValueError("the sequence state's layout changed")
    out = []
    for a, b in ranges:
        if not 0 <= a < b <= p.n:
            raise ValueError(f"block [{a}, {b}) is outside the {p.n} cells of the state")
        idx: np.ndarray | slice = p.order[a:b] if p.order is not None else slice(a, b)
        pieces = [k[idx] for k in p.k]
        pieces += [v[:, idx] if layout.v_trans else v[idx] for v in p.v]
        out.append(b"".join(np.ascontiguousarray(x).tobytes() for x in pieces))
    return out


def join_blocks(layout: KVLayout, parts: Sequence[tuple[bytes | bytearray, int, int]], n_stream: int = 1) -> bytearray:
    """A one-stream state of positions 0..N-1 from consecutive block payloads: each part is
    (payload, tokens in it, tokens of it to use, a prefix). ValueError on a payload of the
    wrong size. With `n_stream` > 1, the state of one sequence among `n_stream` (`as_streams`
    of it), so the runner hands the result to llama.cpp as it is.

    Every byte is copied once, from the payloads straight to its place in one preallocated
    buffer (no per-block `tobytes`, no join of the pieces, no padding copy after): a restore
    moves the KV at memory speed."""
    total = sum(u for _, _, u in parts)
    if total <= 0:
        raise ValueError("nothing to join")
    srcs = []
    for payload, n, use in parts:
        src = np.frombuffer(payload, dtype=np.uint8)
        if src.size != n * layout.per_token or not 0 < use <= n:
            raise ValueError("a block payload does not match its token count")
        srcs.append((src, n, use))
    n_layer = len(layout.k_rows)
    size = (len(layout.header) + 4 * _U32 + 12 * total + 2 * 12 * n_layer
            + total * layout.per_token + _U32 * (n_stream - 1))
    out = bytearray(size)  # zeroed: the empty streams' cell counts at the end are already there
    dst = np.frombuffer(out, dtype=np.uint8)
    off = len(layout.header)
    out[:off] = layout.header
    out[off:off + 2 * _U32] = n_stream.to_bytes(_U32, "little") + total.to_bytes(_U32, "little")
    off += 2 * _U32
    meta = dst[off:off + 12 * total].view("<i4").reshape(total, 3)
    meta[:, 0] = np.arange(total)
    meta[:, 1] = 1  # and the sequence id, 0 (zeroed)
    off += 12 * total
    out[off:off + 2 * _U32] = int(layout.v_trans).to_bytes(_U32, "little") + n_layer.to_bytes(_U32, "little")
    off += 2 * _U32
    src_off = [0] * len(srcs)  # where each payload's next layer starts
    for head, row in zip(layout.k_heads, layout.k_rows, strict=True):
        out[off:off + 12] = head
        off += 12
        for j, (src, n, use) in enumerate(srcs):
            a = src_off[j]
            dst[off:off + use * row] = src[a:a + use * row]  # a block's rows of a layer are contiguous
            off += use * row
            src_off[j] = a + n * row
    for head, row, el in zip(layout.v_heads, layout.v_rows, layout.v_el, strict=True):
        out[off:off + 12] = head
        off += 12
        if layout.v_trans:  # per dimension, every token's element: each block fills a column range
            dims = row // el
            v = dst[off:off + total * row].reshape(dims, total, el)
            t = 0
            for j, (src, n, use) in enumerate(srcs):
                a = src_off[j]
                v[:, t:t + use] = src[a:a + n * row].reshape(dims, n, el)[:, :use]
                t += use
                src_off[j] = a + n * row
            off += total * row
        else:
            for j, (src, n, use) in enumerate(srcs):
                a = src_off[j]
                dst[off:off + use * row] = src[a:a + use * row]
                off += use * row
                src_off[j] = a + n * row
    assert off == size - _U32 * (n_stream - 1)
    return out
