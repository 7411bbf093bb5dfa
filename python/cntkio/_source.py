"""CNTK's ``MinibatchSource``: randomized minibatches, sweeps, workers and checkpoints (READER.md)."""

from __future__ import annotations

import json as _json
import logging as _logging
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as _np

from cntkio import _native
from cntkio import (
    CTFDeserializer,
    StreamData,
    StreamInformation,
    UsageError,
    _Deserializer,
    _did_you_mean,
    _infos,
    _Record,
)
from cntkio._threads import default_threads

_log = _logging.getLogger("cntkio")

INFINITELY_REPEAT: int = 2**64 - 1
"""``max_samples`` / ``max_sweeps``: repeat the data forever (the default)."""
FULL_DATA_SWEEP: int = 2**64 - 2
"""``max_samples=FULL_DATA_SWEEP``: one sweep over the data."""
DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS: int = 128
"""CNTK 2.7's default randomization window (4 GiB of 32 MiB chunks)."""

# CNTK's configuration names (BrainScript / the C++ MinibatchSourceConfig dictionary) → argument names.
_CONFIG_NAMES = {
    "maxSamples": "max_samples",
    "maxSweeps": "max_sweeps",
    "randomizationWindow": "randomization_window_in_chunks",
    "randomizationWindowInChunks": "randomization_window_in_chunks",
    "randomizationWindowInSamples": "randomization_window_in_samples",
    "randomizationSeed": "randomization_seed",
    "traceLevel": "trace_level",
    "multiThreadedDeserialization": "multithreaded_deserializer",
    "frameMode": "frame_mode",
    "truncationLength": "truncation_length",
    "maxErrors": "max_errors",
}


def _int(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, (bool, _np.bool_)) or not isinstance(value, (int, _np.integer)):
        raise UsageError(f"{name} must be an integer, found {value!r}")
    if not minimum <= int(value) <= INFINITELY_REPEAT:
        raise UsageError(f"{name} must be an integer ≥ {minimum}, found {value!r}")
    return int(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, _np.bool_)):
        raise UsageError(f"{name} must be True or False, found {value!r}")
    return bool(value)


class BpttLayout:
    """Where the sequences of a truncated-BPTT minibatch lie (CNTK's ``MBLayout`` of its
    ``TruncatedBPTTPacker``): ``rows`` parallel rows of ``columns`` time steps (the truncation length).
    Each sequence of the minibatch is a *fragment* of a data sequence: the ``i``-th (in the minibatch's
    order, row by row and left to right) lies in row ``row[i]`` from column ``column[i]`` for
    ``lengths[i]`` steps; ``offset[i]`` samples of its sequence (``sequence_len[i]`` samples long) were
    delivered in earlier minibatches. A row continues its sequence in the next minibatch, so a recurrent
    state carried per row is reset exactly where a fragment ``starts``.

    ``fragments`` is the ``(fragments, 4)`` int64 array ``[row, column, offset, sequence_len]``.
    """

    __slots__ = ("rows", "columns", "fragments", "lengths")

    def __init__(self, rows: int, columns: int, fragments: Any, lengths: Any) -> None:
        self.rows = int(rows)
        """Parallel rows of this worker."""
        self.columns = int(columns)
        """Time steps of the minibatch: the truncation length."""
        self.fragments = fragments
        self.lengths = _np.asarray(lengths, dtype=_np.int64)
        """Each fragment's length in samples (the minibatch's ``sequence_lengths``)."""

    @property
    def num_fragments(self) -> int:
        return len(self.fragments)

    @property
    def row(self) -> Any:
        return self.fragments[:, 0]

    @property
    def column(self) -> Any:
        """The column of each fragment's first sample."""
        return self.fragments[:, 1]

    @property
    def offset(self) -> Any:
        """Samples of each fragment's sequence delivered in earlier minibatches."""
        return self.fragments[:, 2]

    @property
    def sequence_len(self) -> Any:
        """Each fragment's whole sequence's length."""
        return self.fragments[:, 3]

    @property
    def starts(self) -> Any:
        """Boolean per fragment: it begins its sequence (``offset == 0``; CNTK's mask value 2)."""
        return self.offset == 0

    @property
    def ends(self) -> Any:
        """Boolean per fragment: it ends its sequence (the next minibatch's row goes on with another)."""
        return self.offset + self.lengths == self.sequence_len

    def mask(self) -> Any:
        """``(rows, columns)`` uint8: 2 where a sequence begins, 1 at its other samples, 0 in gaps."""
        m = _np.zeros((self.rows, self.columns), dtype=_np.uint8)
        r, c = self._cells()
        m[r, c] = 1
        first = self.starts & (self.lengths > 0)
        m[self.row[first], self.column[first]] = 2
        return m

    def _cells(self) -> Tuple[Any, Any]:
        """Row and column of every sample of the minibatch, in the packed (fragment after fragment) order."""
        lengths = self.lengths
        total = int(lengths.sum())
        starts = _np.concatenate(([0], _np.cumsum(lengths)[:-1])) if len(lengths) else _np.zeros(0, _np.int64)
        rows = _np.repeat(self.row, lengths)
        cols = _np.repeat(self.column - starts, lengths) + _np.arange(total)
        return rows, cols

    def __repr__(self) -> str:
        return f"<BpttLayout rows={self.rows} columns={self.columns} fragments={self.num_fragments}>"


class MinibatchData(StreamData):
    """One stream of a minibatch, as ``cntk.io.MinibatchData``.

    CNTK's accessors: ``num_sequences``, ``num_samples`` (this stream's samples, so a label stream with one
    label per sequence has ``num_samples == num_sequences``), ``end_of_sweep``, ``is_sparse``, ``shape``
    (``(sequences, longest sequence, *sample_shape)``), ``mask`` (2 = start of a sequence, 1 = sample, 0 =
    padding), ``asarray()`` (dense: the padded ``(sequences, longest, *sample_shape)`` array; sparse: one CSR
    matrix per sequence, over the flattened dimension), ``as_sequences()`` and ``data`` (the object itself,
    for ``mb[s].data.asarray()``).

    cntkio's: the packed samples ``values`` (``(samples, *sample_shape)``, dense — ``sample_shape`` is the
    StreamDef's shape, ``(dim,)`` for an int; the NumPy array owns the memory the
    reader filled, nothing was copied), ``offsets`` (sequence ``s`` is ``offsets[s]:offsets[s+1]``),
    ``lengths``, ``keys`` (sequence keys), ``sequence_lengths`` (declared lengths, what the minibatch size
    counts), ``csr()`` / ``raw()`` (sparse, samples as rows), ``padded()`` (array and boolean mask),
    ``todense()``.
    """

    __slots__ = ("info", "keys", "sequence_lengths", "end_of_sweep", "bptt")

    def __init__(
        self,
        info: StreamInformation,
        values: Any,
        offsets: Any,
        indices: Any,
        indptr: Any,
        keys: Any,
        sequence_lengths: Any,
        end_of_sweep: bool,
        bptt: Optional[BpttLayout] = None,
    ) -> None:
        StreamData.__init__(
            self, info.name, info.dim, info.is_sparse, values, offsets, indices, indptr, info.sample_shape
        )
        self.info = info
        self.keys = keys
        self.sequence_lengths = sequence_lengths
        self.end_of_sweep = end_of_sweep
        self.bptt = bptt
        """With truncated BPTT: the minibatch's :class:`BpttLayout` (each sequence is then a fragment)."""

    @property
    def max_length(self) -> int:
        """The longest sequence of this stream in the minibatch; with truncated BPTT the truncation length
        (CNTK's time axis is the layout's columns)."""
        if self.bptt is not None:
            return self.bptt.columns
        lengths = self.lengths
        return int(lengths.max()) if len(lengths) else 0

    @property
    def shape(self) -> Tuple[int, ...]:
        """``(sequences, longest sequence, *sample_shape)``, as CNTK's (sparse: ``(…, dim)``)."""
        return (self.num_sequences, self.max_length) + self._item_shape

    @property
    def data(self) -> "MinibatchData":
        """The object itself (CNTK's ``Value``: ``mb[s].data.asarray()``, ``mb[s].data.mask`` work)."""
        return self

    @property
    def mask(self) -> Any:
        """CNTK's mask, ``(sequences, longest)`` uint8: 2 at a sequence's first sample, 1 at its other
        samples, 0 after its end. With truncated BPTT ``(fragments, truncation length)``, and a fragment
        continuing a sequence of an earlier minibatch starts with 1, not 2 (as CNTK's)."""
        lengths = self.lengths
        m = (_np.arange(self.max_length) < lengths[:, None]).astype(_np.uint8)
        if m.shape[1]:
            first = lengths > 0
            if self.bptt is not None:
                first &= self.bptt.starts
            m[first, 0] = 2
        return m

    def asarray(self) -> Any:
        """Dense: ``(sequences, longest, *sample_shape)`` with zeros after each sequence's end (a view of
        ``values`` when every sequence has the same length); with truncated BPTT ``(fragments, truncation
        length, *sample_shape)``, as CNTK's ``Value``. Sparse: one CSR matrix per sequence (raw ``(data, indices,
        indptr)`` parts without SciPy), as CNTK returns them."""
        if self.is_sparse:
            return self.as_sequences()
        lengths = self.lengths
        s = len(lengths)
        width = self.max_length
        if s and width * s == self.num_samples and bool((lengths == width).all()):
            return self.values.reshape((s, width) + self.sample_shape)
        return self.padded(width)[0]

    def rows(self) -> Tuple[Any, Any]:
        """Truncated BPTT: the packed layout, ``(array, mask)`` — samples shaped ``(rows, truncation
        length, *sample_shape)`` (zeros in gaps) and the :meth:`BpttLayout.mask` ``(rows, truncation length)``
        uint8 (2 where a sequence begins, 1 at its other samples, 0 in gaps). Row ``r`` of the next
        minibatch continues row ``r`` of this one. Sparse streams never occur (BPTT densifies them)."""
        layout = self.bptt
        if layout is None:
            raise UsageError("rows() needs a minibatch of truncated BPTT (truncation_length > 0)")
        dense = self.todense()
        out = _np.zeros((layout.rows, layout.columns) + self._item_shape, dtype=dense.dtype)
        r, c = layout._cells()
        out[r, c] = dense
        return out, layout.mask()

    def as_sequences(self, variable: Any = None) -> List[Any]:
        """Each sequence's samples: dense ``(length, dim)`` views, sparse CSR matrices. ``variable`` is
        accepted for CNTK compatibility and ignored."""
        return StreamData.as_sequences(self)

    def __len__(self) -> int:
        return self.num_sequences

    def __repr__(self) -> str:
        kind = "sparse" if self.is_sparse else "dense"
        return (
            f"<MinibatchData {self.name!r} {kind} dim={self.dim} {self.dtype} sequences={self.num_sequences} "
            f"samples={self.num_samples} end_of_sweep={self.end_of_sweep}>"
        )


class Minibatch(Mapping[StreamInformation, MinibatchData]):
    """What :meth:`MinibatchSource.next_minibatch` returns: a mapping of :class:`StreamInformation` to
    :class:`MinibatchData`, as CNTK's dict; items can also be looked up by stream name (``mb['features']``).
    Empty (and false) when the run is over."""

    __slots__ = ("_items", "_by_name", "sequence_keys", "sequence_lengths", "end_of_sweep", "end_of_run", "bptt")

    def __init__(
        self,
        items: Dict[StreamInformation, MinibatchData],
        sequence_keys: Any = None,
        sequence_lengths: Any = None,
        end_of_sweep: bool = False,
        end_of_run: bool = True,
        bptt: Optional[BpttLayout] = None,
    ) -> None:
        self._items = items
        self._by_name = {info.name: data for info, data in items.items()}
        self.sequence_keys = sequence_keys
        """The sequences' keys (uint64): their ids in a CTF file, their indices in a CBF file."""
        self.sequence_lengths = sequence_lengths
        """The sequences' declared lengths (uint32): what the minibatch size counts."""
        self.end_of_sweep = end_of_sweep
        """The minibatch reached or crossed the end of a sweep."""
        self.end_of_run = end_of_run
        """The run (``max_samples`` / ``max_sweeps``) ended with this minibatch."""
        self.bptt = bptt
        """With truncated BPTT (``truncation_length > 0``): the :class:`BpttLayout` of the rows; each
        sequence (key, length) is then a fragment of the data sequence with that key. None otherwise."""

    @property
    def num_sequences(self) -> int:
        return 0 if self.sequence_keys is None else len(self.sequence_keys)

    @property
    def num_samples(self) -> int:
        """Σ of the declared sequence lengths (what the requested size counted); with truncated BPTT the
        samples of the fragments."""
        return 0 if self.sequence_lengths is None else int(self.sequence_lengths.sum(dtype=_np.uint64))

    def __getitem__(self, key: Union[StreamInformation, str]) -> MinibatchData:
        if isinstance(key, str):
            return self._by_name[key]
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._by_name if isinstance(key, str) else key in self._items

    def __iter__(self) -> Iterator[StreamInformation]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def by_name(self) -> Dict[str, MinibatchData]:
        """The streams by name."""
        return dict(self._by_name)

    # ---- Arrow ------------------------------------------------------------------------------------------
    def to_arrow(self, *, flatten: bool = False) -> Any:
        """The minibatch as a ``pyarrow.RecordBatch`` in cntkio's Arrow mapping (README, "Parquet and
        Arrow"), as :func:`cntkio.read_arrow` gives the same sequences: one row per sequence with its
        ``key``, ``num_samples`` and a column per stream; ``flatten``: one row per sample, when every
        sequence has exactly one (frame mode). The values and sparse indices are the minibatch's NumPy
        arrays, not copies; only offsets are narrowed to 32 bits. Refused (:class:`UsageError`): an empty
        minibatch, truncated BPTT (fragments of sequences). Needs pyarrow (``pip install cntkio[arrow]``)."""
        from cntkio import _arrow

        return _arrow.record_batch(self, _bool("flatten", flatten))

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow C stream interface: one record batch, :meth:`to_arrow` (``pyarrow.table(mb)``, DuckDB's
        ``FROM mb``; ``polars.from_arrow(mb)`` makes a Series of structs, ``.struct.unnest()`` its columns)."""
        from cntkio import _arrow

        return _arrow.c_stream(self, requested_schema)

    def __arrow_c_schema__(self) -> Any:
        """The Arrow schema of :meth:`to_arrow`, as a PyCapsule."""
        from cntkio import _arrow

        return _arrow.minibatch_schema(self).__arrow_c_schema__()

    def __repr__(self) -> str:
        if not self._items:
            return "<Minibatch (empty)>"
        return (
            f"<Minibatch sequences={self.num_sequences} samples={self.num_samples} "
            f"streams=[{', '.join(self._by_name)}] end_of_sweep={self.end_of_sweep}>"
        )


def _resolve_aliases(args: Dict[str, Any], defaults: Dict[str, Any], config: Dict[str, Any]) -> None:
    """Applies CNTK's configuration names given as keywords to ``args`` (in place)."""
    config = dict(config)
    sample_based = config.pop("sampleBasedRandomizationWindow", None)
    truncated = config.pop("truncated", None)
    for key, value in config.items():
        name = _CONFIG_NAMES.get(key)
        if name is None:
            known = sorted(set(_CONFIG_NAMES) | {"sampleBasedRandomizationWindow", "truncated"})
            hint = _did_you_mean(key, known + list(defaults))
            raise UsageError(
                f"unknown MinibatchSource argument {key!r}{hint}; CNTK configuration names accepted: {', '.join(known)}"
            )
        if sample_based is not None and key == "randomizationWindow" and _bool(
            "sampleBasedRandomizationWindow", sample_based
        ):
            name = "randomization_window_in_samples"
            if args["randomization_window_in_chunks"] == defaults["randomization_window_in_chunks"]:
                args["randomization_window_in_chunks"] = 0
        if args[name] != defaults[name]:
            raise UsageError(f"{key!r} and {name!r} both given")
        args[name] = value
    if sample_based is not None and _bool("sampleBasedRandomizationWindow", sample_based) and (
        "randomizationWindow" not in config
    ):
        raise UsageError("'sampleBasedRandomizationWindow' (== True) requires that 'randomizationWindow' is given")
    if truncated is not None and _bool("truncated", truncated) and not args["truncation_length"]:
        raise UsageError("'truncated' needs a 'truncationLength' > 0")


class MinibatchSource:
    """CNTK 2.7's minibatch source, as ``cntk.io.MinibatchSource``: the same minibatches (sequences, order,
    ``end_of_sweep`` flags, split between workers) for the same data, seed and arguments.

    Args:
        deserializers: a :class:`CTFDeserializer` / :class:`CBFDeserializer` or a list of them. Several are
            joined by sequence key, as CNTK's composite reader does (the first is the primary; its
            sequences missing from another are dropped) — or, with ``concat=True`` (cntkio), read one after
            another as shards of one data set with the same streams.
        max_samples: stop at the first sequence boundary at or after this many samples (counted with
            the declared lengths); ``FULL_DATA_SWEEP`` = one sweep. Exclusive with ``max_sweeps``.
        max_sweeps: stop after this many sweeps.
        randomization_window_in_chunks: the randomization window in chunks (default 128); 0 with
            ``randomization_window_in_samples`` 0 turns randomization off.
        randomization_window_in_samples: a window in samples instead (needs
            ``randomization_window_in_chunks=0``: both non-zero is an error, as in CNTK).
        randomization_seed: sweep *k* is shuffled with ``randomization_seed + k``.
        trace_level: accepted for compatibility; no effect, and a warning is logged when it is given
            (cntkio's messages go to the ``cntkio`` logger of :mod:`logging`; set its level instead).
        multithreaded_deserializer: False loads chunks on the calling thread when they are needed
            (no background loading); True or None (the default): background loader threads, one per core
            this process may use, shared by the processes ``torchrun`` started on the machine
            (``LOCAL_WORLD_SIZE``; ``CNTKIO_THREADS`` overrides). Never changes a minibatch.
        frame_mode: every stream of every sequence must have at most one sample.
        truncation_length: truncated BPTT with this length in samples (READER.md §5.3, CNTK's
            ``TruncatedBPTTPacker``): ``max(1, size // truncation_length)`` parallel rows (shared between
            partitions), each a queue of whole sequences cut into fragments of at most
            ``truncation_length`` samples that continue in the next minibatch; every stream is delivered
            dense and must have the same length as the others in each sequence. The minibatch's
            :attr:`Minibatch.bptt` gives the layout; :meth:`MinibatchData.asarray` / ``mask`` are CNTK's
            ``(fragments, truncation_length, dim)`` form, :meth:`MinibatchData.rows` the packed rows.
            Checkpoints hold the rows. A new minibatch size starts new rows (the sequences held are
            dropped, as in CNTK).
        randomize: False turns randomization off whatever the windows.
        max_errors: CNTK 2.7's budget of invalid sequences, which CTF and CBF never produce: it does not
            reach the CTF parser (in CNTK neither), so it changes no data; a non-zero value logs a warning
            that names the deserializer option that does (``d['maxErrors'] = N``).
        concat: (cntkio) read several deserializers one after another instead of joining them by key.
        cntk_restore_quirk: (cntkio) restore checkpoints as CNTK 2.7 did, quirks included, instead of
            continuing exactly as the uninterrupted run (see the README).
        balanced_workers: (cntkio) with randomization, deal sequences instead of chunks to the partitions
            of ``next_minibatch(size, num_data_partitions, partition_index)``: partition r of W gets the
            sequences at indices r, r + W, … of the single reader's order, so partitions differ by at most one
            sequence per sweep (CNTK deals whole chunks; a partition beyond the number of chunks gets nothing).
        elastic_resume: (cntkio) with ``balanced_workers`` and randomization, ``{"sweep": k, "rounds": [[n, …],
            …]}``: earlier runs read part of sweep ``k`` with other numbers of partitions (``rounds[i][r]``:
            the sequences partition ``r`` of ``len(rounds[i])`` was delivered, as :meth:`sequences_delivered`
            counts them); this source reads the rest of that sweep, dealt to its partitions in turn, so that
            every sequence of the sweep is read once. Later sweeps are dealt as usual.

    CNTK's configuration names are accepted as keywords too: ``randomizationWindow`` (with
    ``sampleBasedRandomizationWindow``), ``randomizationSeed``, ``maxSamples``, ``maxSweeps``, ``frameMode``,
    ``truncationLength`` / ``truncated``, ``traceLevel``, ``multiThreadedDeserialization``,
    ``maxErrors``.
    """

    def __init__(
        self,
        deserializers: Union[_Deserializer, Sequence[_Deserializer]],
        max_samples: int = INFINITELY_REPEAT,
        max_sweeps: int = INFINITELY_REPEAT,
        randomization_window_in_chunks: int = DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS,
        randomization_window_in_samples: int = 0,
        randomization_seed: int = 0,
        trace_level: Any = None,
        multithreaded_deserializer: Optional[bool] = None,
        frame_mode: bool = False,
        truncation_length: int = 0,
        randomize: bool = True,
        max_errors: int = 0,
        *,
        concat: bool = False,
        cntk_restore_quirk: bool = False,
        balanced_workers: bool = False,
        elastic_resume: Optional[Mapping[str, Any]] = None,
        _keep: Any = None,
        _loaders: Optional[int] = None,
        **cntk_config: Any,
    ) -> None:
        args: Dict[str, Any] = dict(
            max_samples=max_samples,
            max_sweeps=max_sweeps,
            randomization_window_in_chunks=randomization_window_in_chunks,
            randomization_window_in_samples=randomization_window_in_samples,
            randomization_seed=randomization_seed,
            trace_level=trace_level,
            multithreaded_deserializer=multithreaded_deserializer,
            frame_mode=frame_mode,
            truncation_length=truncation_length,
            randomize=randomize,
            max_errors=max_errors,
        )
        _resolve_aliases(args, _DEFAULTS, cntk_config)
        if isinstance(deserializers, _Deserializer):
            deserializers = [deserializers]
        if not isinstance(deserializers, (list, tuple)) or not deserializers:
            raise UsageError("deserializers must be a CTFDeserializer, a CBFDeserializer or a non-empty list of them")
        for d in deserializers:
            if not isinstance(d, _Deserializer):
                raise UsageError(f"not a cntkio deserializer: {d!r} (use cntkio.CTFDeserializer / CBFDeserializer)")
        self._deserializers: List[_Deserializer] = [d.copy() for d in deserializers]
        self._args = args
        self._concat = _bool("concat", concat)
        self._quirk = _bool("cntk_restore_quirk", cntk_restore_quirk)
        self._balanced = _bool("balanced_workers", balanced_workers)
        self._elastic = _elastic_resume(elastic_resume)

        max_samples = _int("max_samples", args["max_samples"])
        max_sweeps = _int("max_sweeps", args["max_sweeps"])
        chunks = _int("randomization_window_in_chunks", args["randomization_window_in_chunks"])
        samples = _int("randomization_window_in_samples", args["randomization_window_in_samples"])
        seed = _int("randomization_seed", args["randomization_seed"])
        frame = _bool("frame_mode", args["frame_mode"])
        truncation = _int("truncation_length", args["truncation_length"])
        rand = _bool("randomize", args["randomize"])
        max_errors = _int("max_errors", args["max_errors"])
        if args["multithreaded_deserializer"] is not None and not _bool(
            "multithreaded_deserializer", args["multithreaded_deserializer"]
        ):
            threads = 0  # chunks loaded on the calling thread, when needed
        else:
            # `_loaders` where the caller shares the cores with other processes it knows of.
            threads = default_threads() if _loaders is None else max(1, int(_loaders))
        if args["trace_level"] is not None:
            _log.warning(
                "MinibatchSource(trace_level=%r) is accepted for compatibility and has no effect: cntkio's "
                "messages go to the 'cntkio' logger of the logging module (set its level instead)",
                args["trace_level"],
            )
        if max_samples != INFINITELY_REPEAT and max_sweeps != INFINITELY_REPEAT:
            raise UsageError("max samples and max sweeps are mutually exclusive options; set only one of them")
        if not rand:
            chunks = samples = 0
        if chunks and samples:
            raise UsageError(
                "randomization window in chunks and randomization window in samples are mutually exclusive "
                "options; set randomization_window_in_chunks=0 to use a window in samples"
            )
        if frame and truncation:
            raise UsageError("frame mode and truncation are mutually exclusive (frame_mode=True, truncation_length > 0)")
        run_samples: Optional[int] = None
        run_sweeps: Optional[int] = None
        if max_samples == FULL_DATA_SWEEP:
            run_sweeps = 1
        elif max_samples != INFINITELY_REPEAT:
            run_samples = max_samples
        elif max_sweeps != INFINITELY_REPEAT:
            run_sweeps = max_sweeps
        self.randomized: bool = bool(chunks or samples)
        """Whether sequences are randomized (randomize=True with a non-zero window)."""
        # The caller's deserializers keep their opened files (a CTF index is built once per object).
        readers = [d.open() for d in deserializers]
        if max_errors:
            # As in CNTK 2.7, the source's budget does not reach the CTF parser: the data stays CNTK's.
            _log.warning(
                "MinibatchSource(max_errors=%d) has no effect on CTF or CBF data (as in CNTK 2.7, where it "
                "counted invalid sequences, which these deserializers never produce); to tolerate malformed "
                "CTF lines set the deserializer's option: d['maxErrors'] = %d",
                max_errors,
                max_errors,
            )
        self._src = _native.Source(
            readers,
            join=not self._concat,
            randomize=self.randomized,
            window_chunks=chunks,
            window_samples=samples,
            seed=seed,
            max_samples=run_samples,
            max_sweeps=run_sweeps,
            frame_mode=frame,
            cntk_restore_quirk=self._quirk,
            truncation_length=truncation,
            threads=threads,
            balanced_workers=self._balanced,
            elastic_resume=self._elastic,
            keep=_keep,
        )
        self.truncation_length: int = truncation
        """Truncated BPTT's length in samples (0: off)."""
        shapes: Dict[str, Tuple[int, ...]] = {}
        for d in self._deserializers:
            shapes.update(d._shapes())
        self._infos = _infos(self._src.stream_infos(), shapes)
        self._streams: Optional[_Record] = None
        self._device_warned = False

    # ---- streams ----------------------------------------------------------------------------------------
    def stream_infos(self) -> List[StreamInformation]:
        """The streams this source delivers, in order."""
        return list(self._infos)

    @property
    def streams(self) -> _Record:
        """The streams by name (a dict whose keys are also attributes: ``src.streams.features``)."""
        if self._streams is None:
            self._streams = _Record({i.name: i for i in self._infos})
        return self._streams

    def stream_info(self, name: str) -> StreamInformation:
        """The stream named ``name`` (or, failing that, whose alias is ``name``)."""
        found = [i for i in self._infos if i.name == name] or [i for i in self._infos if i.alias == name]
        if len(found) != 1:
            names = ", ".join(i.name for i in self._infos)
            what = "no" if not found else "more than one"
            raise KeyError(f"{what} stream named {name!r} (streams: {names})")
        return found[0]

    def __getitem__(self, name: str) -> StreamInformation:
        return self.stream_info(name)

    @property
    def sweep_size(self) -> int:
        """Samples in one sweep (Σ of the declared sequence lengths)."""
        return int(self._src.sweep_size())

    @property
    def num_sequences(self) -> int:
        """Sequences in one sweep."""
        return int(self._src.num_sequences())

    @property
    def num_chunks(self) -> int:
        """Chunks of the data (after joining)."""
        return int(self._src.num_chunks())

    @property
    def deserializers(self) -> List[_Deserializer]:
        """Copies of the deserializers the source reads."""
        return [d.copy() for d in self._deserializers]

    # ---- reading ----------------------------------------------------------------------------------------
    def next_minibatch(
        self,
        minibatch_size_in_samples: int,
        input_map: Optional[Mapping[Any, Union[StreamInformation, str]]] = None,
        device: Any = None,
        num_data_partitions: Optional[int] = None,
        partition_index: Optional[int] = None,
    ) -> Union[Minibatch, Dict[Any, MinibatchData]]:
        """The next minibatch of about ``minibatch_size_in_samples`` samples (counted with the declared
        lengths; a sequence is never split, the first one is always taken), as a :class:`Minibatch` —
        or, with ``input_map`` (``{key: stream info or name}``), a dict ``{key: MinibatchData}``. Empty
        when the run is over.

        ``num_data_partitions`` / ``partition_index``: this worker's share of the data (CNTK's distributed
        reading: with randomization whole chunks are dealt to workers, without it sequences round robin);
        each worker gets about ``minibatch_size_in_samples / num_data_partitions`` samples. They may change
        between calls (the source continues from its position). ``device`` has no effect (NumPy arrays;
        a warning is logged the first time one is given).

        The GIL is released while the minibatch is read.
        """
        if device is not None and not self._device_warned:
            self._device_warned = True
            _log.warning("next_minibatch(device=%r) has no effect: cntkio returns NumPy arrays on the CPU", device)
        size = _int("minibatch_size_in_samples", minibatch_size_in_samples)
        workers = 1 if num_data_partitions is None else _int("num_data_partitions", num_data_partitions, 1)
        rank = 0 if partition_index is None else _int("partition_index", partition_index)
        if rank >= workers:
            raise UsageError(f"partition_index {rank} must be below num_data_partitions {workers}")
        raw = self._src.next_minibatch(size, workers, rank)
        if raw is None:
            mb = Minibatch({})
        else:
            keys, lengths, streams, eos, eor, layout = raw
            bptt = None if layout is None else BpttLayout(layout[0], layout[1], layout[2], lengths)
            items = {
                info: MinibatchData(info, values, offsets, indices, indptr, keys, lengths, eos, bptt)
                for info, (values, offsets, indices, indptr) in zip(self._infos, streams)
            }
            mb = Minibatch(items, keys, lengths, eos, eor, bptt)
        if input_map is None:
            return mb
        if not mb:
            return {}
        return {k: mb[v] for k, v in input_map.items()}

    def __iter__(self) -> Iterator[Minibatch]:
        raise TypeError("iterate with next_minibatch(size), or use cntkio.torch.IterableDataset")

    # ---- checkpoints ------------------------------------------------------------------------------------
    def get_checkpoint_state(self) -> Dict[str, Any]:
        """The position, as a JSON-compatible dict: CNTK's ``minibatchSourcePosition`` (the global sample
        position of the next sequence) with cntkio's ``version``, ``position``, ``minibatches`` and
        ``sweep_size`` (checked on restore) and, with truncated BPTT, ``bptt``: the sequences held in the
        rows (version 2), so that a restore continues them. Meaningful only with the same data and
        arguments, as in CNTK."""
        state: Dict[str, Any] = _json.loads(self._src.state())
        state["minibatchSourcePosition"] = state["position"]
        return state

    def restore_from_checkpoint(self, checkpoint: Union[Mapping[str, Any], str]) -> None:
        """Continues from a state of :meth:`get_checkpoint_state` (a dict or its JSON) — exactly as the
        uninterrupted run unless ``cntk_restore_quirk`` — or from CNTK's ``{'minibatchSourcePosition': P}``."""
        if isinstance(checkpoint, (str, bytes)):
            try:
                checkpoint = _json.loads(checkpoint)
            except ValueError as e:
                raise UsageError(f"not a minibatch source state: {e}") from None
        if not isinstance(checkpoint, Mapping):
            raise UsageError(f"a checkpoint is a dict of get_checkpoint_state(), found {checkpoint!r}")
        state = dict(checkpoint)
        cntk_position = state.pop("minibatchSourcePosition", None)
        if "version" not in state and cntk_position is not None:
            state = {
                "version": 1,
                "position": _int("minibatchSourcePosition", cntk_position),
                "minibatches": 0,
                "sweep_size": self.sweep_size,
            }
        self._src.restore(_json.dumps(state))

    @property
    def current_position(self) -> Dict[str, Any]:
        """:meth:`get_checkpoint_state`; assigning restores (CNTK's property)."""
        return self.get_checkpoint_state()

    @current_position.setter
    def current_position(self, position: Mapping[str, Any]) -> None:
        self.restore_from_checkpoint(position)

    def sequences_delivered(self, sweep: int = 0) -> int:
        """(cntkio) With ``balanced_workers`` and randomization: the number of sequences of sweep ``sweep``
        delivered by this source (to the partition of its last ``next_minibatch``) — the same after a restore
        as in the uninterrupted run. In a sweep resumed with ``elastic_resume``, of the sequences left to this
        run."""
        return int(self._src.sequences_delivered(_int("sweep", sweep)))

    def _plan(self, size: int, workers: int = 1, rank: int = 0, limit: Optional[int] = None) -> List[str]:
        """Checkpoints (JSON) after each minibatch of the whole run for one partition, found from the index
        without reading data."""
        return [state for state, _ in self._src.plan(size, workers, rank, limit)]

    def _plan_counts(
        self, size: int, workers: int = 1, rank: int = 0, limit: Optional[int] = None, sweep: int = 0
    ) -> List[Tuple[str, Optional[int]]]:
        """As :meth:`_plan`, each checkpoint with the sequences of sweep ``sweep`` the partition was delivered
        until then (None without balanced dealing)."""
        return list(self._src.plan(size, workers, rank, limit, sweep))

    # ---- pickling ---------------------------------------------------------------------------------------
    def __reduce__(self) -> Any:
        args = dict(self._args)
        return (
            _rebuild_source,
            (
                self._deserializers,
                args,
                self._concat,
                self._quirk,
                self._src.state(),
                self._balanced,
                None if self._elastic is None else {"sweep": self._elastic[0], "rounds": self._elastic[1]},
            ),
        )

    def __repr__(self) -> str:
        files = ", ".join(d.path for d in self._deserializers)
        return f"<MinibatchSource [{files}] streams=[{', '.join(i.name for i in self._infos)}]>"


_DEFAULTS: Dict[str, Any] = dict(
    max_samples=INFINITELY_REPEAT,
    max_sweeps=INFINITELY_REPEAT,
    randomization_window_in_chunks=DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS,
    randomization_window_in_samples=0,
    randomization_seed=0,
    trace_level=None,
    multithreaded_deserializer=None,
    frame_mode=False,
    truncation_length=0,
    randomize=True,
    max_errors=0,
)


def _rebuild_source(
    deserializers: List[_Deserializer],
    args: Dict[str, Any],
    concat: bool,
    quirk: bool,
    state: str,
    balanced: bool = False,
    elastic: Optional[Mapping[str, Any]] = None,
) -> MinibatchSource:
    s = MinibatchSource(
        deserializers,
        **args,
        concat=concat,
        cntk_restore_quirk=quirk,
        balanced_workers=balanced,
        elastic_resume=elastic,
    )
    s._src.restore(state)
    return s


def _elastic_resume(value: Optional[Mapping[str, Any]]) -> Optional[Tuple[int, List[List[int]]]]:
    """``elastic_resume={"sweep": k, "rounds": [[n, …], …]}`` as ``(k, rounds)``, checked for its shape (the
    counts are checked against the data by the source)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"sweep", "rounds"} or "rounds" not in value:
        raise UsageError(f'elastic_resume must be {{"sweep": k, "rounds": [[n, ...], ...]}}, found {value!r}')
    sweep = _int("elastic_resume sweep", value.get("sweep", 0))
    rounds = value["rounds"]
    if not isinstance(rounds, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in rounds):
        raise UsageError(f"elastic_resume rounds must be a list of lists of counts, found {rounds!r}")
    return sweep, [[_int("elastic_resume count", n) for n in r] for r in rounds]
