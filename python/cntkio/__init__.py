"""cntkio: CNTK's data formats — CNTK Text Format (CTF) and CNTK Binary Format (CBF) — on NumPy and SciPy.

The data is CNTK 2.7's: the same sequences, keys and values bit for bit, the same errors tolerated by
``maxErrors``. The API follows ``cntk.io`` so that existing scripts port with small edits::

    import cntkio
    d = cntkio.CTFDeserializer("train.ctf", cntkio.StreamDefs(
        features=cntkio.StreamDef(field="x", shape=784),
        labels=cntkio.StreamDef(field="y", shape=10, is_sparse=True),
    ))
    d["chunkSizeInBytes"] = 8 << 20          # CNTK's option names (snake_case works too)
    data = d.read()                          # every sequence, in file order
    x = data["features"].asarray()           # float32, shape (samples, 784)
    y = data["labels"].asarray()             # scipy.sparse.csr_matrix (samples, 10)
    lengths = data["features"].lengths       # samples per sequence

Errors are raised as :class:`CntkError` subclasses with the position as attributes; the GIL is released
while files are read; the Rust library's log records go to :mod:`logging`.
"""

from __future__ import annotations

import json as _json
import logging as _logging
import os as _os
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as _np

from cntkio import _native
from cntkio._errors import (
    CntkError,
    FormatError,
    InternalError,
    IoError,
    LimitError,
    NotFoundError,
    PermissionDeniedError,
    UsageError,
)

__version__: str = _native.__version__

__all__ = [
    "ArrowStream",
    "BpttLayout",
    "DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS",
    "FULL_DATA_SWEEP",
    "INFINITELY_REPEAT",
    "Loader",
    "Minibatch",
    "MinibatchData",
    "MinibatchSource",
    "CBFDeserializer",
    "CTFDeserializer",
    "CntkError",
    "Data",
    "FormatError",
    "InternalError",
    "IoError",
    "LimitError",
    "NotFoundError",
    "PermissionDeniedError",
    "StreamData",
    "StreamDef",
    "StreamDefs",
    "StreamInformation",
    "UsageError",
    "ValidationError",
    "ValidationReport",
    "convert",
    "detect_format",
    "inspect",
    "read_arrow",
    "recompress",
    "stats",
    "validate",
]

PathLike = Union[str, "_os.PathLike[str]"]

DEFAULT_CHUNK_SIZE: int = _native.DEFAULT_CHUNK_SIZE
"""CNTK's default ``chunkSizeInBytes`` (32 MiB)."""

ArrowStream = _native.ArrowStream
"""Record batches in cntkio's Arrow mapping for consumers of the Arrow PyCapsule interface
(``__arrow_c_stream__``): what :meth:`CTFDeserializer.arrow` returns."""


# --------------------------------------------------------------------------------------------------------
# Stream definitions


class _Record(dict):  # type: ignore[type-arg]
    """A dict whose keys are also read as attributes (CNTK's ``Record``)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no attribute {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> Any:
        return (_rebuild_record, (type(self), dict(self)))


def _rebuild_record(cls: type, items: Dict[str, Any]) -> Any:
    r = dict.__new__(cls)
    dict.update(r, items)
    return r


def _dim_of(shape: Any) -> Tuple[int, Tuple[int, ...]]:
    if isinstance(shape, (bool, _np.bool_)):
        raise UsageError(f"shape must be an int or a tuple of ints, found {shape!r}")
    if isinstance(shape, (int, _np.integer)):
        dims: Tuple[int, ...] = (int(shape),)
    else:
        try:
            if isinstance(shape, (str, bytes)):
                raise TypeError
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise UsageError(f"shape must be an int or a tuple of ints, found {shape!r}") from None
    if any(d < 0 for d in dims):
        raise UsageError(f"shape must not be negative, found {shape!r}")
    dim = 1
    for d in dims:
        dim *= d
    return dim, dims


class StreamDef(_Record):
    """A stream of a deserializer, as ``cntk.io.StreamDef``.

    Args:
        field: the name written after ``|`` in a CTF file (CTF's alias); for CBF, the stream's name in the
            file when it differs from the key it is given in :class:`StreamDefs` (a rename). Defaults to
            that key (CNTK required it for CTF).
        shape: the sample shape: an int, or a tuple — CTF reads its product as the dimension, and dense
            arrays come out shaped ``(..., *shape)`` (sparse ones stay CSR over the flattened
            dimension, as CNTK's). Required for CTF; CBF files carry their dimension (a shape given
            for a CBF stream must have as many elements, and shapes its arrays).
        is_sparse: sparse (``index:value`` entries) rather than dense.
        defines_mb_size: this stream's sample count defines a sequence's length (CNTK's
            ``definesMBSize``).
    """

    def __init__(
        self,
        field: Optional[str] = None,
        shape: Union[int, Sequence[int], None] = None,
        is_sparse: bool = False,
        defines_mb_size: bool = False,
    ) -> None:
        if field is not None and not isinstance(field, str):
            raise UsageError(f"field must be a string, found {field!r}")
        items: Dict[str, Any] = {"stream_alias": field, "is_sparse": bool(is_sparse)}
        if shape is not None:
            items["dim"], items["shape"] = _dim_of(shape)
        items["defines_mb_size"] = bool(defines_mb_size)
        dict.__init__(self, items)


class StreamDefs(_Record):
    """Named streams, as ``cntk.io.StreamDefs``: ``StreamDefs(features=StreamDef(...), ...)``."""

    def __init__(self, **streams: StreamDef) -> None:
        for k, v in streams.items():
            if not isinstance(v, Mapping):
                raise UsageError(f"stream {k!r} must be a StreamDef, found {v!r}")
        dict.__init__(self, streams)


class StreamInformation(NamedTuple):
    """A stream a deserializer delivers (hashable: the key of a minibatch's streams). ``shape`` is the
    :class:`StreamDef`'s shape when it has several dimensions (else None); ``sample_shape`` is always the
    shape of a dense sample."""

    name: str
    alias: str
    dim: int
    is_sparse: bool
    dtype: Any
    defines_mb_size: bool
    shape: Optional[Tuple[int, ...]] = None

    @property
    def m_name(self) -> str:
        """The name (CNTK's attribute)."""
        return self.name

    @property
    def storage_format(self) -> str:
        """``"dense"`` or ``"sparse"``."""
        return "sparse" if self.is_sparse else "dense"

    @property
    def sample_shape(self) -> Tuple[int, ...]:
        """The shape of a dense sample: the StreamDef's ``shape``, else ``(dim,)``."""
        return tuple(self.shape) if self.shape else (self.dim,)


def _infos(raw: Any, shapes: Mapping[str, Tuple[int, ...]]) -> List[StreamInformation]:
    """Stream infos from the extension's tuples, with the StreamDefs' shapes (by stream name); a shape must
    have as many elements as the stream's dimension."""
    out = []
    for n, a, d, sp, t, m in raw:
        shape = shapes.get(n)
        if shape is not None:
            size = 1
            for x in shape:
                size *= x
            if size != d:
                raise UsageError(
                    f"stream {n!r}: shape {shape} has {size} elements, but the stream's dimension is {d}"
                )
        multi = tuple(shape) if shape is not None and len(shape) != 1 else None
        out.append(StreamInformation(n, a, d, sp, _np.dtype(t), m, multi))
    return out


# --------------------------------------------------------------------------------------------------------
# Data


def _csr_matrix(data: Any, indices: Any, indptr: Any, shape: Tuple[int, int]) -> Any:
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "SciPy is needed for CSR matrices (pip install scipy); use .raw() for (data, indices, indptr)"
        ) from None
    return sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)


def _has_scipy() -> bool:
    try:
        import scipy.sparse  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the environment
        return False
    return True


class StreamData:
    """One stream's samples of a run of sequences, sequence after sequence.

    ``offsets`` (int64, one more than the sequences) delimits each sequence's samples:
    sequence ``s`` has samples ``offsets[s]:offsets[s+1]``. Dense streams hold ``values`` shaped
    ``(samples, *sample_shape)`` (``(samples, dim)`` unless the StreamDef gave a tuple shape); sparse streams
    hold CSR parts with samples as rows over the flattened dimension: ``values`` (the non-zeros),
    ``indices`` (int32 column of each, in file order, duplicates kept) and ``indptr``.
    """

    __slots__ = ("name", "dim", "is_sparse", "values", "offsets", "indices", "indptr", "sample_shape")

    def __init__(
        self,
        name: str,
        dim: int,
        is_sparse: bool,
        values: Any,
        offsets: Any,
        indices: Any,
        indptr: Any,
        sample_shape: Optional[Tuple[int, ...]] = None,
    ) -> None:
        self.name = name
        self.dim = dim
        self.is_sparse = is_sparse
        self.sample_shape: Tuple[int, ...] = tuple(sample_shape) if sample_shape else (dim,)
        """The shape of a dense sample (a sparse stream's samples are rows of the flattened ``dim``)."""
        if not is_sparse and len(self.sample_shape) != 1:
            values = values.reshape((values.shape[0],) + self.sample_shape)
        self.values = values
        self.offsets = offsets
        self.indices = indices
        self.indptr = indptr

    @property
    def _item_shape(self) -> Tuple[int, ...]:
        """The shape of one sample in dense arrays: the sample shape (dense) or ``(dim,)`` (densified sparse)."""
        return (self.dim,) if self.is_sparse else self.sample_shape

    @property
    def dtype(self) -> Any:
        """float32 or float64."""
        return self.values.dtype

    @property
    def num_sequences(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_samples(self) -> int:
        """Samples of this stream (which may differ from the sequences' declared lengths)."""
        return int(self.offsets[-1])

    @property
    def lengths(self) -> Any:
        """Samples of this stream in each sequence (int64)."""
        return _np.diff(self.offsets)

    @property
    def shape(self) -> Tuple[int, ...]:
        """``(samples, *sample_shape)`` (sparse: ``(samples, dim)``)."""
        return (self.num_samples,) + self._item_shape

    def raw(self) -> Tuple[Any, Any, Any]:
        """Sparse streams: ``(data, indices, indptr)`` of the CSR matrix (samples as rows)."""
        if not self.is_sparse:
            raise UsageError(f"stream {self.name!r} is dense; use .values or .asarray()")
        return (self.values, self.indices, self.indptr)

    def csr(self) -> Any:
        """Sparse streams: a ``scipy.sparse.csr_matrix`` shaped ``(samples, dim)``, sharing the arrays."""
        data, indices, indptr = self.raw()
        return _csr_matrix(data, indices, indptr, (self.num_samples, self.dim))

    def asarray(self) -> Any:
        """Dense: the ``(samples, *sample_shape)`` array. Sparse: a CSR matrix when SciPy is installed, else
        ``(data, indices, indptr)``."""
        if not self.is_sparse:
            return self.values
        return self.csr() if _has_scipy() else self.raw()

    def todense(self) -> Any:
        """A dense array: ``values`` of a dense stream; ``(samples, dim)`` for a sparse one (entries summed
        where an index repeats)."""
        if not self.is_sparse:
            return self.values
        out = _np.zeros((self.num_samples, self.dim), dtype=self.values.dtype)
        rows = _np.repeat(_np.arange(self.num_samples), _np.diff(self.indptr))
        _np.add.at(out, (rows, self.indices), self.values)
        return out

    def sequence(self, s: int) -> Any:
        """Sequence ``s``'s samples: a view of the dense array, or a CSR matrix (raw parts without SciPy)."""
        n = self.num_sequences
        if s < 0:
            s += n
        if not 0 <= s < n:
            raise IndexError(f"sequence {s} out of range ({n} sequences)")
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        if not self.is_sparse:
            return self.values[a:b]
        lo, hi = int(self.indptr[a]), int(self.indptr[b])
        parts = (self.values[lo:hi], self.indices[lo:hi], self.indptr[a : b + 1] - self.indptr[a])
        return _csr_matrix(*parts, (b - a, self.dim)) if _has_scipy() else parts

    def as_sequences(self) -> List[Any]:
        """Every sequence's samples (see :meth:`sequence`), as ``cntk``'s ``as_sequences()``."""
        return [self.sequence(s) for s in range(self.num_sequences)]

    def padded(self, max_length: Optional[int] = None) -> Tuple[Any, Any]:
        """``(array, mask)``: samples shaped ``(sequences, max length, *sample_shape)`` with zeros after each
        sequence's end, and a boolean mask ``(sequences, max length)`` of the real samples. Sparse streams
        are densified (``(sequences, max length, dim)``). Sequences longer than ``max_length`` are cut."""
        lengths = self.lengths
        longest = int(lengths.max()) if len(lengths) else 0
        width = longest if max_length is None else int(max_length)
        mask = _np.arange(max(longest, width)) < lengths[:, None]
        dense = self.todense()
        out = _np.zeros((self.num_sequences, mask.shape[1]) + self._item_shape, dtype=dense.dtype)
        out[mask] = dense
        return out[:, :width], mask[:, :width]

    def __repr__(self) -> str:
        kind = "sparse" if self.is_sparse else "dense"
        shape = "" if len(self.sample_shape) == 1 else f" shape={self.sample_shape}"
        return (
            f"<StreamData {self.name!r} {kind} dim={self.dim}{shape} {self.dtype} "
            f"sequences={self.num_sequences} samples={self.num_samples}>"
        )


class Data(Mapping[str, StreamData]):
    """Sequences read from a deserializer: a mapping from stream name to :class:`StreamData`, with the
    sequences' keys and declared lengths."""

    def __init__(self, sequence_keys: Any, sequence_lengths: Any, streams: Dict[str, StreamData]) -> None:
        self.sequence_keys = sequence_keys
        """Each sequence's key (uint64): its id in a CTF file, its index in a CBF file."""
        self.sequence_lengths = sequence_lengths
        """Each sequence's declared length in samples (uint32), what minibatch sizes count."""
        self.streams = streams

    @property
    def num_sequences(self) -> int:
        return len(self.sequence_keys)

    @property
    def num_samples(self) -> int:
        """The sum of the declared sequence lengths."""
        return int(self.sequence_lengths.sum(dtype=_np.uint64))

    def __getitem__(self, name: str) -> StreamData:
        return self.streams[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.streams)

    def __len__(self) -> int:
        return len(self.streams)

    def __repr__(self) -> str:
        names = ", ".join(self.streams)
        return f"<Data sequences={self.num_sequences} samples={self.num_samples} streams=[{names}]>"


def _data(infos: List[StreamInformation], raw: Tuple[Any, Any, List[Tuple[Any, Any, Any, Any]]]) -> Data:
    keys, lengths, streams = raw
    out = {}
    for info, (values, offsets, indices, indptr) in zip(infos, streams):
        out[info.name] = StreamData(
            info.name, info.dim, info.is_sparse, values, offsets, indices, indptr, info.sample_shape
        )
    return Data(keys, lengths, out)


# --------------------------------------------------------------------------------------------------------
# Deserializers

_OPTION_NAMES = {
    # CNTK's name: accepted aliases
    "chunkSizeInBytes": ("chunk_size_in_bytes", "chunk_size", "chunkSize"),
    "maxErrors": ("max_errors",),
    "skipSequenceIds": ("skip_sequence_ids",),
    "cacheIndex": ("cache_index",),
    "keepDataInMemory": ("keep_data_in_memory",),
    "precision": ("element_type", "dtype"),
    "traceLevel": ("trace_level",),
    "mmap": ("memory_map",),
}
_ALIASES = {alias: name for name, aliases in _OPTION_NAMES.items() for alias in aliases + (name,)}
_CTF_OPTIONS = tuple(_OPTION_NAMES)
_CBF_OPTIONS = ("precision", "traceLevel", "mmap")
_STRUCTURE = ("type", "file", "input")


def _did_you_mean(name: str, candidates: Any) -> str:
    """`` (did you mean 'x'?)`` with the candidate closest to the misspelt ``name``, or nothing if none is close."""
    import difflib

    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _precision(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, str):
        v = value.lower()
        if v in ("float", "float32", "f32", "single"):
            return "float"
        if v in ("double", "float64", "f64"):
            return "double"
        raise UsageError(f'precision must be "float" or "double", found {value!r}')
    try:
        dt = _np.dtype(value)
    except TypeError:
        raise UsageError(f'precision must be "float" or "double", found {value!r}') from None
    if dt == _np.float32:
        return "float"
    if dt == _np.float64:
        return "double"
    raise UsageError(f"precision must be float32 or float64, found {dt}")


class _Deserializer(dict):  # type: ignore[type-arg]
    """A deserializer: a dict of CNTK's configuration (``type``, ``file``, ``input`` and the options),
    which reads its file on request. Pickles as its configuration (path and options), never as an open
    file."""

    _TYPE = ""
    _OPTIONS: Tuple[str, ...] = ()

    def __init__(self, config: Dict[str, Any]) -> None:
        dict.__init__(self)
        for k, v in config.items():
            self[k] = v
        self.__dict__["_reader"] = None
        self.__dict__["_reader_key"] = None

    # ---- CNTK's dict interface, with option names checked -----------------------------------------
    def _canonical(self, key: Any) -> str:
        if not isinstance(key, str):
            raise UsageError(f"option names are strings, found {key!r}")
        if key in _STRUCTURE:
            return key
        name = _ALIASES.get(key)
        if name is None or name not in self._OPTIONS:
            known = ", ".join(self._OPTIONS)
            hint = _did_you_mean(key, [a for a, n in _ALIASES.items() if n in self._OPTIONS])
            raise UsageError(f"unknown {type(self).__name__} option {key!r}{hint}; known options: {known}")
        return name

    def __setitem__(self, key: str, value: Any) -> None:
        name = self._canonical(key)
        if name == "precision":
            value = _precision(value)
        elif name == "file":
            value = _os.fspath(value)
        elif name == "input":
            value = {str(k): dict(v) for k, v in dict(value).items()}
        dict.__setitem__(self, name, value)

    def __getitem__(self, key: str) -> Any:
        return dict.__getitem__(self, self._canonical(key) if key in _ALIASES else key)

    def __delitem__(self, key: str) -> None:
        dict.__delitem__(self, self._canonical(key))

    def update(self, *args: Any, **kw: Any) -> None:  # type: ignore[override]
        for k, v in dict(*args, **kw).items():
            self[k] = v

    def setdefault(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        if key not in self:
            self[key] = default
        return self[key]

    def __reduce__(self) -> Any:
        return (_rebuild_deserializer, (type(self), dict(self)))

    def copy(self) -> "_Deserializer":  # type: ignore[override]
        return _rebuild_deserializer(type(self), dict(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"

    # ---- reading --------------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The data file."""
        return str(dict.__getitem__(self, "file"))

    def _config(self) -> Dict[str, Any]:
        return {k: (dict(v) if k == "input" else v) for k, v in self.items()}

    def open(self) -> Any:
        """The opened file (a CTF file is indexed, or its index cache loaded; a CBF header is read). Kept
        until the configuration changes."""
        key = repr(sorted(self._config().items(), key=lambda kv: kv[0]))
        if self.__dict__.get("_reader") is None or self.__dict__.get("_reader_key") != key:
            if dict.get(self, "traceLevel") is not None:
                _logging.getLogger("cntkio").warning(
                    "%s option traceLevel=%r is accepted for compatibility and has no effect: cntkio's messages "
                    "go to the 'cntkio' logger of the logging module (set its level instead)",
                    type(self).__name__,
                    dict.get(self, "traceLevel"),
                )
            self.__dict__["_reader"] = _native.Reader(self._config())
            self.__dict__["_reader_key"] = key
        return self.__dict__["_reader"]

    def stream_infos(self) -> List[StreamInformation]:
        """The streams delivered, in order (a CBF file's header is read for them)."""
        return _infos(_native.stream_infos(self._config()), self._shapes())

    def _shapes(self) -> Dict[str, Tuple[int, ...]]:
        """The StreamDefs' shapes by stream name (CTF: those of several dimensions; CBF: all given)."""
        streams = dict.get(self, "input") or {}
        return {name: tuple(s["shape"]) for name, s in streams.items() if s.get("shape")}

    @property
    def num_chunks(self) -> int:
        """Number of chunks (CTF: by ``chunkSizeInBytes``; CBF: the file's)."""
        return int(self.open().num_chunks())

    def chunk_sizes(self) -> List[Tuple[int, int]]:
        """``(sequences, samples)`` of each chunk."""
        return list(self.open().chunk_sizes())

    def read_chunk(self, i: int) -> Data:
        """Chunk ``i``'s sequences (errors count against ``maxErrors`` once per chunk)."""
        r = self.open()
        return _data(_infos(r.stream_infos(), self._shapes()), r.read_chunk(int(i)))

    def chunks(self) -> Iterator[Data]:
        """Every chunk in file order."""
        for i in range(self.num_chunks):
            yield self.read_chunk(i)

    def read(self, threads: Optional[int] = None) -> Data:
        """Every sequence in file order, read on ``threads`` threads (default: all cores), with CNTK's
        ``maxErrors`` budget over the whole file."""
        infos = self.stream_infos()
        return _data(infos, _native.read_all(self._config(), threads))

    def arrow(self, chunks: Optional[range] = None, *, flatten: bool = False) -> Any:
        """The chunks ``chunks`` (default: all) as an Arrow stream in cntkio's Arrow mapping (README, "Arrow
        and Parquet"): an object with ``__arrow_c_stream__``, which ``pyarrow.table(...)``,
        ``polars.DataFrame(...)`` and DuckDB read without copying the values. Chunks are loaded one at a
        time as the consumer reads; each consumer gets the stream from the first chunk. ``flatten``: one
        row per sample (every sequence must have one sample of each stream)."""
        start, stop = _chunk_range(chunks)
        return self.open().arrow_stream(start, stop, bool(flatten))


def _rebuild_deserializer(cls: type, config: Dict[str, Any]) -> Any:
    d = dict.__new__(cls)
    _Deserializer.__init__(d, config)
    return d


def _stream_config(key: str, s: Mapping[str, Any], ctf: bool) -> Dict[str, Any]:
    if not isinstance(s, Mapping):
        raise UsageError(f"stream {key!r} must be a StreamDef, found {s!r}")
    alias = s.get("stream_alias") or key
    # StreamDef keeps "shape"; CNTK's own dicts put the (int or tuple) shape in "dim".
    given = s.get("shape", s.get("dim"))
    shape: Optional[Tuple[int, ...]] = None
    dim: Optional[int] = None
    if given is not None:
        dim, shape = _dim_of(given)
    out: Dict[str, Any] = {"alias": alias}
    if shape is not None and (len(shape) != 1 or not ctf):
        out["shape"] = list(shape)  # read by the Python side only (a CBF stream's is checked against its dim)
    if not ctf:
        return out
    if dim is None:
        raise UsageError(f"stream {key!r} needs a shape: StreamDef(field=..., shape=DIM)")
    out.update(
        dim=dim,
        format="sparse" if s.get("is_sparse") else "dense",
        definesMBSize=bool(s.get("defines_mb_size", False)),
    )
    return out


class CTFDeserializer(_Deserializer):
    """A CNTK Text Format file, as ``cntk.io.CTFDeserializer(filename, streams)``.

    Options as in CNTK, set as items (``d['maxErrors'] = 10``) or keywords (``max_errors=10``):
    ``chunkSizeInBytes`` (32 MiB), ``maxErrors`` (0), ``skipSequenceIds`` (False), ``cacheIndex`` (False),
    ``keepDataInMemory`` (False), ``precision`` (``"float"`` or ``"double"``, honoured — CNTK's Python API
    ignored it), ``traceLevel`` (accepted for compatibility, no effect: a warning is logged; cntkio's
    messages go to the ``cntkio`` logger), and cntkio's ``mmap`` (read through a memory map; the file must not change
    while it is open).
    """

    _TYPE = _native.CTF_TYPE
    _OPTIONS = _CTF_OPTIONS

    def __init__(self, filename: PathLike, streams: Mapping[str, Mapping[str, Any]], **options: Any) -> None:
        if not isinstance(streams, Mapping) or not streams:
            raise UsageError("CTFDeserializer needs streams: StreamDefs(name=StreamDef(field=..., shape=...), ...)")
        config: Dict[str, Any] = {
            "type": self._TYPE,
            "file": _os.fspath(filename),
            "input": {str(k): _stream_config(str(k), s, True) for k, s in streams.items()},
        }
        config.update(options)
        super().__init__(config)


class CBFDeserializer(_Deserializer):
    """A CNTK Binary Format file, as ``cntk.io.CBFDeserializer(filename, streams)``. The file carries its
    streams; ``streams`` only renames them (``StreamDefs(new=StreamDef(field='name_in_file'))``). Values
    come in the file's element type unless ``precision`` is set (then converted). ``traceLevel`` is accepted
    for compatibility and has no effect (a warning is logged). The file is read through a memory map
    (``mmap=False``: with positional reads): no copy of its chunks, so a first epoch runs about twice as fast. A file
    that becomes shorter while it is mapped (truncated, or overwritten by a program that truncates it first,
    as ``ctf2bin.py`` does) raises ``IoError`` at the next
    minibatch or chunk read, rather than letting the kernel end the process with ``SIGBUS``."""

    _TYPE = _native.CBF_TYPE
    _OPTIONS = _CBF_OPTIONS

    def __init__(
        self, filename: PathLike, streams: Optional[Mapping[str, Mapping[str, Any]]] = None, **options: Any
    ) -> None:
        config: Dict[str, Any] = {
            "type": self._TYPE,
            "file": _os.fspath(filename),
            "input": {str(k): _stream_config(str(k), s, False) for k, s in (streams or {}).items()},
        }
        config.update(options)
        super().__init__(config)


# --------------------------------------------------------------------------------------------------------
# Conversion, inspection, validation


def detect_format(path: PathLike) -> str:
    """``"ctf"``, ``"cbf"``, ``"parquet"`` or ``"arrow"`` (Arrow IPC), by the file's magic number (not its
    name)."""
    return str(_native.detect(_os.fspath(path)))


def inspect(path: PathLike, *, skip_sequence_ids: bool = False) -> Dict[str, Any]:
    """What a file holds, without a schema: the report of ``cntkio inspect --json`` as a dict (CTF:
    inferred streams, dims, sequence lengths; CBF: header, streams, chunks)."""
    return dict(_json.loads(_native.inspect_json(_os.fspath(path), skip_sequence_ids)))


def stats(
    input: Union[PathLike, _Deserializer, Sequence[Union[PathLike, _Deserializer]]],
    streams: Optional[Mapping[str, Mapping[str, Any]]] = None,
    *,
    threads: Optional[int] = None,
    **options: Any,
) -> Dict[str, Any]:
    """Per stream and dimension, the mean, standard deviation (of the population), minimum and maximum of the
    values as a model sees them — sparse streams as :meth:`StreamData.todense` gives them: 0 where a sample has
    no entry, the sum of its entries where it repeats an index — and for sparse streams the samples with an
    entry at each index (for one-hot labels, the samples of each class): the report of ``cntkio stats
    --json`` with NumPy arrays, ``{"sequences": N, "streams": {NAME: {"format", "dim", "samples", "nan",
    "infinite", "mean", "std", "min", "max", and for sparse streams "entries", "entries_per_index"}}}`` (NaN
    for a dimension of a stream without samples).

    ``input``: a file, a deserializer, or a list of them, taken together (read one after another). CTF files
    need ``streams`` (a :class:`StreamDefs`); ``options`` are deserializer options (``maxErrors``, …). The
    chunks are read on ``threads`` threads (default: the cores); the figures do not depend on how many.
    Ctrl-C stops it."""
    from cntkio.torch import _open_paths

    unknown = sorted(k for k in options if k not in _ALIASES)
    if unknown:
        raise UsageError(f"stats: unknown argument {unknown[0]!r}{_did_you_mean(unknown[0], set(_ALIASES) | {'threads'})}")
    items = [input] if isinstance(input, (str, _os.PathLike, _Deserializer)) else list(input)
    ds: List[_Deserializer] = []
    for item in items:
        if isinstance(item, _Deserializer):
            if streams is not None or options:
                raise UsageError("streams and options apply to paths; set them on the deserializers")
            ds.append(item)
        else:
            ds.extend(_open_paths(item, streams, options))
    report = _json.loads(_native.stats_json([d.open() for d in ds], threads))
    out: Dict[str, Any] = {"sequences": report["sequences"], "streams": {}}
    for s in report["streams"]:
        entry = {k: v for k, v in s.items() if k != "name"}
        for k in ("mean", "std", "min", "max"):
            entry[k] = _np.array([float(x) for x in s[k]], dtype=_np.float64)  # "nan", "inf", "-inf" too
        if "entries_per_index" in s:
            entry["entries_per_index"] = _np.array(s["entries_per_index"], dtype=_np.int64)
        out["streams"][s["name"]] = entry
    return out


def _ctf_config(path: PathLike, streams: Any, options: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if isinstance(streams, _Deserializer):
        cfg = streams._config()
        for k, v in options.items():
            if v is not None:
                cfg[_ALIASES.get(k, k)] = _precision(v) if _ALIASES.get(k) == "precision" else v
        return cfg
    opts = {k: v for k, v in options.items() if v is not None}
    if streams is None:
        return None
    return CTFDeserializer(path, streams, **opts)._config()


def convert(
    input: Union[PathLike, _Deserializer],
    output: PathLike,
    streams: Optional[Mapping[str, Mapping[str, Any]]] = None,
    *,
    chunk_size: Optional[int] = None,
    max_errors: Optional[int] = None,
    skip_sequence_ids: Optional[bool] = None,
    precision: Any = None,
    ctf2bin_compatible: bool = False,
    skip_bad_sequences: bool = False,
    threads: Optional[int] = None,
    flatten: bool = False,
    row_group_size: Optional[int] = None,
) -> Dict[str, Any]:
    """Converts CTF → CBF or CBF → CTF (the input's format is detected by its magic number); any of them
    → Parquet or Arrow IPC when ``output`` ends in ``.parquet`` or ``.arrow`` (cntkio's Arrow mapping; one
    row per sample with ``flatten``; at most ``row_group_size`` rows per Parquet row group or IPC record
    batch, which are the chunks when it is read), and those → CBF (``.cbf``, ``.bin``) or else CTF.

    CTF input needs its streams: ``streams`` (a :class:`StreamDefs`) or a :class:`CTFDeserializer` as
    ``input`` (its options apply). CBF input: ``streams`` optionally gives the alias written after ``|``
    for each stream name (``StreamDef(field=...)``). ``chunk_size`` is the CBF chunk size in bytes (default
    32 MiB). The output is written to a temporary file and renamed when complete (an object-store URL such as
    ``s3://bucket/key.cbf`` gets the file by an upload completed only at the end); Ctrl-C (or any signal
    handler that raises) stops the conversion within about 50 ms (an upload between its parts), raising its
    exception and leaving the target untouched and no temporary file behind. Returns totals:
    ``sequences``, ``samples``, ``chunks``, ``dropped_sequences``, ``tolerated_errors``, ``bytes_written``.
    """
    if isinstance(input, _Deserializer):
        src, config_from = input.path, input
    else:
        src, config_from = _os.fspath(input), streams
    fmt = detect_format(src)
    options = {"maxErrors": max_errors, "skipSequenceIds": skip_sequence_ids, "precision": precision}
    config: Optional[Dict[str, Any]] = None
    aliases: Optional[List[Tuple[str, str]]] = None
    if fmt == "ctf":
        if config_from is None:
            raise _streams_wanted(src, "converting it")
        config = _ctf_config(src, config_from, options)
    elif isinstance(config_from, CBFDeserializer):
        config = config_from._config()
    elif isinstance(config_from, _Deserializer):
        aliases = [(k, v["alias"]) for k, v in config_from["input"].items()]
    elif config_from is not None:
        aliases = [(str(k), (s.get("stream_alias") or str(k))) for k, s in config_from.items()]
    return dict(
        _native.convert(
            src,
            _os.fspath(output),
            config,
            aliases,
            chunk_size,
            ctf2bin_compatible,
            skip_bad_sequences,
            threads,
            bool(flatten),
            row_group_size,
        )
    )


def recompress(input: PathLike, output: PathLike, *, threads: Optional[int] = None) -> int:
    """Rewrites ``input`` (plain, gzip or zstd; any content) compressed as ``output``'s name says: seekable
    zstd (``.zst``) or BGZF (``.gz``), whose byte ranges cntkio reads directly (shuffled chunks decompress
    only what they need) and which ``zstd -d``/``gzip -d`` read as usual. Written to a temporary file and
    renamed; returns the bytes written. ``cntkio recompress IN OUT`` on the command line."""
    return int(_native.recompress(_os.fspath(input), _os.fspath(output), threads))


def _chunk_range(chunks: Any) -> Tuple[Optional[int], Optional[int]]:
    if chunks is None:
        return None, None
    if not isinstance(chunks, range) or chunks.step != 1 or chunks.start < 0 or chunks.stop < chunks.start:
        raise UsageError(f"chunks must be a range of chunk numbers with step 1, as range(start, stop); found {chunks!r}")
    return chunks.start, chunks.stop


def _pyarrow(user: str = "cntkio.read_arrow returns a pyarrow.Table") -> Any:
    try:
        import pyarrow
    except ImportError:
        raise UsageError(f"{user} and needs pyarrow: pip install pyarrow (or pip install cntkio[arrow])") from None
    return pyarrow


def _streams_wanted(path: str, what: str) -> UsageError:
    """The error of the CTF file ``path`` given without streams: ``what`` needs them, and the ``StreamDefs`` the
    file's first rows suggest (ready to paste)."""
    message = f"{path} is CTF: {what} needs its streams (a StreamDefs)"
    try:
        found = _native.suggest_streams(path)
    except Exception:  # the suggestion is a courtesy: the error stands without it
        found = None
    if found:
        defs = [(n, f"StreamDef(field={n!r}, shape={d}{', is_sparse=True' if sparse else ''})") for n, d, sparse in found]
        if all(n.isidentifier() for n, _ in defs):
            args = ", ".join(f"{n}={d}" for n, d in defs)
        else:
            args = "**{" + ", ".join(f"{n!r}: {d}" for n, d in defs) + "}"
        message += (
            f"; its first rows suggest streams=StreamDefs({args}) (each shape the largest seen there: use your "
            "model's)"
        )
    return UsageError(message)


def _open_any(source: Union[PathLike, _Deserializer], streams: Any, options: Dict[str, Any]) -> _Deserializer:
    if isinstance(source, _Deserializer):
        if streams is not None or options:
            raise UsageError("give streams and options to the deserializer, not with it")
        return source
    path = _os.fspath(source)
    if detect_format(path) == "ctf":
        if streams is None:
            raise _streams_wanted(path, "reading it")
        return CTFDeserializer(path, streams, **options)
    return CBFDeserializer(path, streams, **options)


def read_arrow(
    source: Union[PathLike, _Deserializer],
    streams: Optional[Mapping[str, Mapping[str, Any]]] = None,
    *,
    chunks: Optional[range] = None,
    flatten: bool = False,
    **options: Any,
) -> Any:
    """A file (CTF, CBF, Parquet or Arrow IPC), or the chunks ``chunks`` of it (``range(start, stop)``), as a
    ``pyarrow.Table`` in cntkio's Arrow mapping (README, "Arrow and Parquet"): one row per sequence with its
    ``key``, ``num_samples`` and a column per stream; ``flatten``: one row per sample. ``source`` is a path
    (CTF needs ``streams``, a :class:`StreamDefs`; other formats take ``streams`` as renames, as
    :class:`CBFDeserializer` does; ``options`` are the deserializer's) or a deserializer. The values are
    handed to pyarrow without a copy. Needs pyarrow (``pip install cntkio[arrow]``)."""
    pa = _pyarrow()
    d = _open_any(source, streams, options)
    start, stop = _chunk_range(chunks)
    stream = d.open().read_arrow(start, stop, bool(flatten))
    if hasattr(pa.RecordBatchReader, "from_stream"):
        return pa.RecordBatchReader.from_stream(stream).read_all()
    # pyarrow 14: the interface without its public entry point.
    return pa.RecordBatchReader._import_from_c_capsule(stream.__arrow_c_stream__()).read_all()


class ValidationError(NamedTuple):
    """One problem found by :func:`validate` (``line``/``column`` are 1-based, ``byte`` 0-based)."""

    path: Optional[str]
    line: Optional[int]
    column: Optional[int]
    byte: Optional[int]
    sequence_id: Optional[int]
    code: str
    kind: str
    category: str
    severity: str
    message: str
    help: Optional[str]
    display: str

    def __str__(self) -> str:
        return self.display


def _validation_error(d: Dict[str, Any]) -> ValidationError:
    return ValidationError(*(d.get(f) for f in ValidationError._fields))


class ValidationReport(NamedTuple):
    """What :func:`validate` found: a verdict, totals, and the problems (up to ``limit`` of each)."""

    path: str
    format: str
    valid: bool
    verdict: str
    sequences: int
    samples: int
    num_errors: int
    dropped_sequences: int
    num_warnings: int
    max_errors: int
    errors: List[ValidationError]
    warnings: List[ValidationError]
    notes: List[str]
    """What the problems mean, a line each, causes first: an input of the schema that never appears in the
    file (with the names the file has, and the closest), then each class of warnings counted ("3 sample(s)
    of stream "features" had fewer than 3 values … and were zero-filled"). Also logged, once each, as
    warnings of the ``cntkio`` logger."""
    schema: List[str] = []
    """CTF: the schema checked against, each stream as ``--stream`` takes it (``NAME:DIM:dense|sparse[:ALIAS]``)."""
    schema_inferred: bool = False
    """CTF: no streams were given; the file was checked with the schema its rows suggest."""
    stream_samples: Dict[str, int] = {}
    """CTF: samples read per stream, by name."""
    missing_inputs: List[Dict[str, Any]] = []
    """CTF: the schema's inputs that no row has: ``stream``, ``alias``, ``found`` (the names the rows have,
    with their samples), ``suggestion``, ``text``."""
    warning_notes: List[Dict[str, Any]] = []
    """CTF: each class of warnings counted: ``code``, ``count``, ``text``."""

    def to_dict(self) -> Dict[str, Any]:
        """The report as the object ``cntkio validate --json`` prints for the file (``files[i]``)."""
        d = {k: getattr(self, k) for k in _SUMMARY_KEYS}
        d["errors"] = [e._asdict() for e in self.errors]
        d["warnings"] = [w._asdict() for w in self.warnings]
        return d


_SUMMARY_KEYS = (
    "path", "format", "schema_inferred", "schema", "valid", "verdict", "sequences", "samples",
    "stream_samples", "num_errors", "dropped_sequences", "num_warnings", "max_errors", "errors", "warnings",
    "missing_inputs", "warning_notes",
)  # fmt: skip


def validate(
    path: Union[PathLike, _Deserializer],
    streams: Optional[Mapping[str, Mapping[str, Any]]] = None,
    *,
    max_errors: Optional[int] = None,
    skip_sequence_ids: Optional[bool] = None,
    precision: Any = None,
    chunk_size: Optional[int] = None,
    warnings: bool = False,
    limit: int = 1000,
    threads: Optional[int] = None,
) -> ValidationReport:
    """Reads a whole file and reports every problem (not only the first) as :class:`ValidationError`
    objects, like ``cntkio validate``; raises only for I/O errors and wrong arguments.

    CTF files need their streams: ``streams`` (a :class:`StreamDefs`) or a :class:`CTFDeserializer` as
    ``path`` (its options apply). ``valid`` is False when CNTK could not read the file (more errors than
    ``max_errors``, a sequence lacking a stream, no sequence at all, a fatal error). The checks are the
    library's ``cntkio::validate``, the same as ``cntkio validate``'s (CBF: streams of mixed precision and
    streams without samples are errors, a chunk table disagreeing with the sequences a warning). Ctrl-C
    (or any signal handler that raises) stops it within about 50 ms, raising its exception.
    """
    if isinstance(path, _Deserializer):
        src, config_from = path.path, path
    else:
        src, config_from = _os.fspath(path), streams
    options = {
        "maxErrors": max_errors,
        "skipSequenceIds": skip_sequence_ids,
        "precision": precision,
        "chunkSizeInBytes": chunk_size,
    }
    config: Optional[Dict[str, Any]] = None
    if detect_format(src) == "ctf":
        config = _ctf_config(src, config_from, options)
    elif isinstance(config_from, CBFDeserializer):
        config = config_from._config()
    r = _json.loads(_native.validate_json(src, config, warnings, int(limit), threads))
    notes = [m["text"] for m in r["missing_inputs"]]
    notes += [f"{n['code']}: {n['text']}" for n in r["warning_notes"]]
    for note in notes:
        _logging.getLogger("cntkio").warning("%s: %s", r["path"], note)
    fields = {k: r[k] for k in _SUMMARY_KEYS if k not in ("errors", "warnings")}
    return ValidationReport(
        errors=[_validation_error(e) for e in r["errors"]],
        warnings=[_validation_error(w) for w in r["warnings"]],
        notes=notes,
        **fields,
    )


# --------------------------------------------------------------------------------------------------------
# The minibatch source (its module needs the classes above)

from cntkio._source import (  # noqa: E402
    DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS,
    BpttLayout,
    FULL_DATA_SWEEP,
    INFINITELY_REPEAT,
    Minibatch,
    MinibatchData,
    MinibatchSource,
)
from cntkio._loader import Loader  # noqa: E402

