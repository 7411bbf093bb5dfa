"""``cntkio.Loader``: batches for a training loop, planned and assembled by native threads.

The loader runs CNTK's minibatch source (the same sequences, keys, values and order as ``cntkio batches`` and
:class:`cntkio.MinibatchSource` for the same options) on threads of its own: one plans the minibatches in
order, ``num_threads`` copy their sequences into reused buffers, ``prefetch`` batches ahead of the one the
loop holds. The GIL is not held while they work, and no DataLoader worker processes are needed.

**Lifetime of a batch.** The arrays of a batch are views of a native buffer, handed over without a copy. A
buffer goes back to the loader for reuse only when no array (or view, or tensor made from one) refers to it
any more, so a batch stays valid for as long as the program holds any part of it — keeping batches is safe,
it only costs memory.
"""

from __future__ import annotations

import json as _json
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from cntkio import UsageError, _Deserializer, _has_scipy, _native
from cntkio._source import DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS, BpttLayout, Minibatch, MinibatchData, MinibatchSource

PathLike = Union[str, "os.PathLike[str]"]
LAYOUTS = ("flat", "padded")
SPARSE = ("csr", "dense", "raw")

STATE_VERSION = 1
"""The version of :meth:`Loader.state_dict`'s form."""


def default_threads() -> int:
    """``CNTKIO_THREADS`` if set, else the number of cores."""
    v = os.environ.get("CNTKIO_THREADS", "").strip()
    if v:
        try:
            n = int(v)
        except ValueError:
            raise UsageError(f"environment variable CNTKIO_THREADS={v!r} is not an integer") from None
        if n > 0:
            return n
    return os.cpu_count() or 1


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UsageError(f"{name} must be a positive integer, found {value!r}")
    return int(value)


class Loader:
    """Batches of CNTK data for a training loop, as NumPy arrays, assembled by native threads.

    Each iteration is one epoch (one sweep over this rank's share of the data) and yields dicts:

    * ``NAME``: the stream's samples. ``layout="flat"`` (default): ``(samples, *sample_shape)``, sequence
      after sequence; sparse streams as a ``scipy.sparse.csr_matrix`` (``sparse="csr"``, the default; its
      ``(data, indices, indptr)`` tuple without SciPy or with ``sparse="raw"``) or densified
      (``sparse="dense"``). ``layout="padded"``: ``(sequences, longest, *sample_shape)`` with zeros after
      each sequence's end.
    * ``NAME_lengths``: int64 samples of each sequence in this stream.
    * ``NAME_mask`` (padded): bool ``(sequences, longest)``, True at real samples.
    * ``keys`` (``with_keys=True``): int64 sequence keys.

    Args:
        deserializers: a deserializer or a list (joined by key as CNTK does, or read one after another
            with ``concat=True``).
        paths: instead of ``deserializers``: one or more CTF/CBF files (format by magic number), read one
            after another; ``streams`` (a :class:`cntkio.StreamDefs`) is required for CTF, and the other
            keywords (``chunkSizeInBytes``, ``maxErrors``, …) are deserializer options.
        batch_size: samples per batch of this rank (CNTK's minibatch size, counted with the declared
            lengths; a sequence is never split).
        shuffle, seed: CNTK's randomization; epoch ``e`` is CNTK's sweep ``e`` of a source with
            ``randomization_seed=seed`` (shuffled with ``seed + e``).
        randomization_window_in_chunks / randomization_window_in_samples, frame_mode, truncation_length:
            as :class:`cntkio.MinibatchSource`.
        rank, world_size: this process's place in distributed training (default: ``torch.distributed``
            when initialised, else ``RANK`` / ``WORLD_SIZE``, else 0 of 1). Each rank reads its partition.
        balanced_workers: deal sequences instead of CNTK's whole chunks to the ranks (equal shares ±1).
        num_threads: native threads assembling batches (default ``CNTKIO_THREADS`` or the number of cores).
        prefetch: batches planned or ready ahead (default ``2 × num_threads + 2``).
    """

    def __init__(
        self,
        deserializers: Union[_Deserializer, Sequence[_Deserializer], None] = None,
        *,
        paths: Union[PathLike, Sequence[PathLike], None] = None,
        streams: Optional[Mapping[str, Mapping[str, Any]]] = None,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        randomization_window_in_chunks: int = DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS,
        randomization_window_in_samples: int = 0,
        frame_mode: bool = False,
        truncation_length: int = 0,
        concat: Optional[bool] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        balanced_workers: bool = False,
        layout: str = "flat",
        sparse: str = "csr",
        with_keys: bool = False,
        num_threads: Optional[int] = None,
        prefetch: Optional[int] = None,
        **options: Any,
    ) -> None:
        from cntkio.torch import _open_paths, distributed_rank_and_size

        if (deserializers is None) == (paths is None):
            raise UsageError("give deserializers or paths (and streams), not both")
        if deserializers is not None:
            if options:
                raise UsageError(f"options {sorted(options)} apply to paths; set them on the deserializers")
            ds = [deserializers] if isinstance(deserializers, _Deserializer) else list(deserializers)
            for d in ds:
                if not isinstance(d, _Deserializer):
                    raise UsageError(f"not a cntkio deserializer: {d!r}")
            self._deserializers = [d.copy() for d in ds]
            concat = bool(concat)
        else:
            assert paths is not None
            self._deserializers = _open_paths(paths, streams, options)
            concat = True if concat is None else bool(concat)
        if layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {LAYOUTS}, found {layout!r}")
        if sparse not in SPARSE:
            raise UsageError(f"sparse must be one of {SPARSE}, found {sparse!r}")
        self.batch_size = _positive("batch_size", batch_size)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise UsageError(f"seed must be a non-negative integer, found {seed!r}")
        self.seed = seed
        self.shuffle = bool(shuffle)
        self.rank, self.world_size = distributed_rank_and_size(rank, world_size)
        self.layout = layout
        self.sparse = sparse
        self.with_keys = bool(with_keys)
        self.num_threads = default_threads() if num_threads is None else _positive("num_threads", num_threads)
        self.prefetch = 2 * self.num_threads + 2 if prefetch is None else _positive("prefetch", prefetch)
        self._options: Dict[str, Any] = dict(
            randomization_window_in_chunks=randomization_window_in_chunks,
            randomization_window_in_samples=randomization_window_in_samples,
            frame_mode=bool(frame_mode),
            truncation_length=truncation_length,
            concat=concat,
            balanced_workers=bool(balanced_workers),
        )
        self.epoch = 0
        self._batches = 0  # batches yielded in the current epoch (counting those skipped by a resume)
        self._position: Optional[str] = None  # the source's checkpoint after the last batch yielded
        self._resume: Optional[Dict[str, Any]] = None  # (epoch, batches, source state) to continue from
        self._lengths: Dict[int, int] = {}
        self._feed: Any = None
        # Opens the files and checks the options now.
        src = self._source(0)
        self._infos = src.stream_infos()
        names = [i.name for i in self._infos]
        made = {f"{n}_{suffix}" for n in names for suffix in ("lengths", "mask")} | {"keys"}
        clash = sorted(set(names) & made)
        if clash:
            raise UsageError(f"stream names {clash} clash with the names of the lengths/masks/keys entries")

    # ---- configuration ----------------------------------------------------------------------------------
    def _source(self, epoch: int) -> MinibatchSource:
        return MinibatchSource(
            self._deserializers,
            max_sweeps=1,
            randomize=self.shuffle,
            randomization_seed=self.seed + epoch,
            **self._options,
        )

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration: shuffled with ``seed + epoch``. Call it before every epoch, on
        every rank (as with ``DistributedSampler``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise UsageError(f"epoch must be a non-negative integer, found {epoch!r}")
        if epoch != self.epoch:
            self._batches = 0
            self._position = None
        self.epoch = epoch

    def __len__(self) -> int:
        """Batches of this rank in one epoch (found from the index, without reading data)."""
        if self._options["truncation_length"]:
            raise TypeError("the number of batches of truncated BPTT is known only when read")
        if self.epoch not in self._lengths:
            src = self._source(self.epoch)
            size = self.batch_size * self.world_size
            self._lengths[self.epoch] = len(src._plan(size, self.world_size, self.rank))
        return self._lengths[self.epoch]

    # ---- resuming ---------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The position in the current epoch after the batches yielded so far (small, JSON-compatible):
        :meth:`load_state_dict` continues with the next batch."""
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "batches": self._batches,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "rank": self.rank,
            "source": None if self._position is None else _json.loads(self._position),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from :meth:`state_dict` (taken with the same data, options and world size): the next
        iteration yields the rest of that epoch."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise UsageError(f"not a cntkio.Loader state (version {STATE_VERSION}): {state!r}")
        for key in ("seed", "batch_size", "shuffle", "world_size"):
            if state.get(key) != getattr(self, key):
                raise UsageError(f"the state has {key}={state.get(key)!r}, this loader {getattr(self, key)!r}")
        self.set_epoch(int(state["epoch"]))
        self._batches = int(state["batches"])
        src = state.get("source")
        self._position = None if src is None else _json.dumps(src)
        self._resume = {"epoch": self.epoch, "batches": self._batches, "source": self._position}

    # ---- iteration --------------------------------------------------------------------------------------
    def minibatches(self) -> Iterator[Minibatch]:
        """This rank's minibatches of the current epoch as :class:`cntkio.Minibatch` objects."""
        src = self._source(self.epoch)
        restore = None
        resume, self._resume = self._resume, None
        if resume is not None and resume["epoch"] == self.epoch:
            restore = resume["source"]
            self._batches = resume["batches"]
        else:
            self._batches = 0
        self._position = restore
        feed = _native.Feed(
            src._src,
            self.batch_size * self.world_size,
            workers=self.world_size,
            rank=self.rank,
            threads=self.num_threads,
            ahead=self.prefetch,
            restore=restore,
        )
        infos = self._infos
        try:
            while True:
                raw = feed.next()
                if raw is None:
                    break
                keys, lengths, streams, eos, eor, position, layout = raw
                bptt = None if layout is None else BpttLayout(layout[0], layout[1], layout[2], lengths)
                items = {
                    info: MinibatchData(info, values, offsets, indices, indptr, keys, lengths, eos, bptt)
                    for info, (values, offsets, indices, indptr) in zip(infos, streams)
                }
                self._position = position
                self._batches += 1
                yield Minibatch(items, keys, lengths, eos, eor, bptt)
        finally:
            feed.close()

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        layout, sparse, with_keys = self.layout, self.sparse, self.with_keys
        for mb in self.minibatches():
            yield _to_arrays(mb, layout, with_keys, sparse)

    def __repr__(self) -> str:
        files = ", ".join(d.path for d in self._deserializers)
        return (
            f"<{type(self).__name__} [{files}] batch_size={self.batch_size} shuffle={self.shuffle} seed={self.seed} "
            f"epoch={self.epoch} rank={self.rank}/{self.world_size} num_threads={self.num_threads}>"
        )


def _to_arrays(mb: Minibatch, layout: str, with_keys: bool, sparse: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name, s in mb.by_name().items():
        if layout == "padded":
            values, mask = s.padded()
            out[name] = values
            out[f"{name}_mask"] = mask
        elif s.is_sparse and sparse == "dense":
            out[name] = s.todense()
        elif s.is_sparse and sparse == "raw":
            out[name] = s.raw()
        elif s.is_sparse:
            out[name] = s.csr() if _has_scipy() else s.raw()
        else:
            out[name] = s.values
        out[f"{name}_lengths"] = s.lengths
    if with_keys:
        out["keys"] = mb.sequence_keys.astype(np.int64)
    return out


__all__: List[str] = ["Loader"]
