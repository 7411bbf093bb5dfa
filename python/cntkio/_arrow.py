"""Minibatches as Arrow record batches in cntkio's Arrow mapping (README, "Parquet and Arrow"), built with
pyarrow over the minibatch's NumPy arrays: values and sparse indices are shared, not copied; only offsets are
narrowed to Arrow's 32-bit ones. The Rust side builds the same mapping in ``crates/cntkio/src/arrow``."""

from __future__ import annotations

import json as _json
from typing import TYPE_CHECKING, Any, List, Optional

import numpy as _np

from cntkio import LimitError, StreamInformation, UsageError, _pyarrow

if TYPE_CHECKING:
    from cntkio._source import Minibatch, MinibatchData

MAPPING_VERSION = 1
METADATA_KEY = "cntkio.arrow"
_FIXED_COLUMNS = ("key", "num_samples")
_I32_MAX = 2**31 - 1
_ELEMENT_TYPES = {_np.dtype(_np.float32): "float", _np.dtype(_np.float64): "double"}


def _item(pa: Any, t: Any) -> Any:
    """The mapping's list items: named ``item``, never null (as the Rust side's ``item``)."""
    return pa.field("item", t, nullable=False)


def _value_type(pa: Any, info: StreamInformation) -> Any:
    return pa.float32() if _np.dtype(info.dtype) == _np.float32 else pa.float64()


def _sample_type(pa: Any, info: StreamInformation) -> Any:
    v = _value_type(pa, info)
    if info.is_sparse:
        return pa.struct(
            [
                pa.field("indices", pa.list_(_item(pa, pa.int32())), nullable=False),
                pa.field("values", pa.list_(_item(pa, v)), nullable=False),
            ]
        )
    return pa.list_(_item(pa, v), info.dim)


def schema(pa: Any, infos: List[StreamInformation], flatten: bool) -> Any:
    """The mapping's Arrow schema of these streams, with its ``cntkio.arrow`` metadata (the same JSON text
    the Rust side writes)."""
    for info in infos:
        if info.name in _FIXED_COLUMNS:
            raise UsageError(
                f"stream {info.name!r} is the name of a column of the Arrow mapping (key, num_samples); rename "
                "the stream (StreamDef(field=...) under another name)"
            )
        if _np.dtype(info.dtype) not in _ELEMENT_TYPES:
            raise UsageError(f"stream {info.name!r} has values of type {info.dtype}, not float32 or float64")
        if not info.is_sparse and info.dim > _I32_MAX:
            raise LimitError(f"dense stream {info.name!r} has dim {info.dim}, over Arrow's limit of 2^31 - 1")
    fields = [pa.field("key", pa.uint64(), nullable=False)]
    if not flatten:
        fields.append(pa.field("num_samples", pa.uint32(), nullable=False))
    for info in infos:
        t = _sample_type(pa, info)
        fields.append(pa.field(info.name, t if flatten else pa.list_(_item(pa, t)), nullable=False))
    meta = {
        "mapping": MAPPING_VERSION,
        "rows": "samples" if flatten else "sequences",
        "streams": [
            {
                "name": i.name,
                "alias": i.alias,
                "dim": i.dim,
                "storage": i.storage_format,
                "element_type": _ELEMENT_TYPES[_np.dtype(i.dtype)],
            }
            for i in infos
        ],
    }
    text = _json.dumps(meta, ensure_ascii=False, separators=(",", ":"))
    return pa.schema(fields, metadata={METADATA_KEY: text})


def _offsets(pa: Any, offsets: Any, stream: str, what: str) -> Any:
    """``offsets`` as an Arrow buffer of int32 (the one copy made), checked to fit."""
    o = _np.asarray(offsets)
    if len(o) and int(o[-1]) > _I32_MAX:
        raise LimitError(
            f"stream {stream!r} has {int(o[-1])} {what} in this minibatch, over the 2^31 - 1 of an Arrow list; "
            "use smaller minibatches"
        )
    return pa.py_buffer(o.astype(_np.int32))


def _primitive(pa: Any, t: Any, a: Any) -> Any:
    """A NumPy array as an Arrow array of ``t`` over the same memory (copied only when not contiguous)."""
    flat = _np.ascontiguousarray(a).reshape(-1)
    return pa.Array.from_buffers(t, len(flat), [None, pa.py_buffer(flat)])


def _samples(pa: Any, d: "MinibatchData") -> Any:
    """A stream's samples, one array element per sample."""
    info = d.info
    t = _sample_type(pa, info)
    n = d.num_samples
    values = _primitive(pa, _value_type(pa, info), d.values)
    if not info.is_sparse:
        return pa.Array.from_buffers(t, n, [None], children=[values])
    indptr = _offsets(pa, d.indptr, info.name, "sparse entries")
    indices = _primitive(pa, pa.int32(), _np.asarray(d.indices, dtype=_np.int32))
    parts = [
        pa.Array.from_buffers(f.type, n, [None, indptr], children=[child])
        for f, child in zip(t, (indices, values))
    ]
    return pa.Array.from_buffers(t, n, [None], children=parts)


def _check_flat(mb: "Minibatch") -> None:
    lengths = _np.asarray(mb.sequence_lengths)
    bad = _np.flatnonzero(lengths != 1)
    if len(bad):
        i = int(bad[0])
        raise UsageError(
            f"flattening needs sequences of exactly one sample, but sequence {int(mb.sequence_keys[i])} "
            f"declares {int(lengths[i])} samples"
        )
    for d in mb.values():
        bad = _np.flatnonzero(d.lengths != 1)
        if len(bad):
            i = int(bad[0])
            raise UsageError(
                f"flattening needs sequences of exactly one sample, but sequence {int(mb.sequence_keys[i])} "
                f"has {int(d.lengths[i])} samples of stream {d.name!r}"
            )


def _check(mb: "Minibatch") -> None:
    if not mb:
        raise UsageError("the minibatch is empty (the run is over): it has no streams to give Arrow")
    if mb.bptt is not None:
        raise UsageError(
            "a minibatch of truncated BPTT (truncation_length > 0) holds fragments of sequences, which cntkio's "
            "Arrow mapping (one row per sequence) cannot express; read with truncation_length=0"
        )


def minibatch_schema(mb: "Minibatch", flatten: bool = False) -> Any:
    """The Arrow schema of :func:`record_batch`'s batch."""
    pa = _pyarrow("Minibatch.to_arrow returns a pyarrow.RecordBatch")
    _check(mb)
    return schema(pa, [d.info for d in mb.values()], flatten)


def record_batch(mb: "Minibatch", flatten: bool = False) -> Any:
    """The minibatch as a ``pyarrow.RecordBatch`` of the mapping: one row per sequence (``flatten``: per
    sample, every sequence having exactly one)."""
    pa = _pyarrow("Minibatch.to_arrow returns a pyarrow.RecordBatch")
    _check(mb)
    infos = [d.info for d in mb.values()]
    s = schema(pa, infos, flatten)
    if flatten:
        _check_flat(mb)
    columns: List[Any] = [_primitive(pa, pa.uint64(), _np.asarray(mb.sequence_keys, dtype=_np.uint64))]
    if not flatten:
        columns.append(_primitive(pa, pa.uint32(), _np.asarray(mb.sequence_lengths, dtype=_np.uint32)))
    n = mb.num_sequences
    for i, d in enumerate(mb.values(), start=len(columns)):
        samples = _samples(pa, d)
        if flatten:
            columns.append(samples)
        else:
            offsets = _offsets(pa, d.offsets, d.name, "samples")
            columns.append(pa.Array.from_buffers(s.field(i).type, n, [None, offsets], children=[samples]))
    batch = pa.RecordBatch.from_arrays(columns, schema=s)
    batch.validate()
    return batch


def c_stream(mb: "Minibatch", requested_schema: Optional[Any]) -> Any:
    """The Arrow C stream (a PyCapsule) of one record batch."""
    pa = _pyarrow("Minibatch.__arrow_c_stream__ builds a pyarrow.RecordBatch")
    return pa.Table.from_batches([record_batch(mb)]).__arrow_c_stream__(requested_schema)
