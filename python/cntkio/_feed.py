"""The native feed's batches as :class:`cntkio.Minibatch` objects (shared by ``cntkio.torch`` and
``cntkio.Loader``)."""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple

import numpy as np

from cntkio._source import BpttLayout, Minibatch, MinibatchData


def part_of(stream: Any, first: int, end: int) -> Any:
    """``(values, offsets, indices, indptr)`` of sequences ``first:end`` of a stream's arrays (views, offsets
    rebased)."""
    values, offsets, indices, indptr = stream
    a, b = int(offsets[first]), int(offsets[end])
    part_offsets = offsets[first : end + 1] - a
    if indices is None:
        return values[a:b], part_offsets, None, None
    p, q = int(indptr[a]), int(indptr[b])
    return values[p:q], part_offsets, indices[p:q], indptr[a : b + 1] - p


def minibatches_of(raw: Any, infos: List[Any]) -> Iterator[Tuple[Minibatch, str, int]]:
    """The minibatches of one batch of the native feed (``_native.Feed.next``), each with the checkpoint after
    it and its number of sequences."""
    keys, lengths, streams, parts, layout = raw
    first = 0
    for n, eos, eor, position in parts:
        end = first + n
        if len(parts) == 1:
            k, ln, st = keys, lengths, streams
        else:
            k, ln = keys[first:end], lengths[first:end]
            st = [part_of(s, first, end) for s in streams]
        # The feed's offsets are u64 (its own memory): as int64, NumPy's index type.
        st = [(v, o.view(np.int64), i, p) for v, o, i, p in st]
        bptt = None if layout is None else BpttLayout(layout[0], layout[1], layout[2], ln)
        items = {
            info: MinibatchData(info, values, offsets, indices, indptr, k, ln, eos, bptt)
            for info, (values, offsets, indices, indptr) in zip(infos, st)
        }
        yield Minibatch(items, k, ln, eos, eor, bptt), position, n
        first = end
