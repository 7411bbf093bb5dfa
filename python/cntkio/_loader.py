"""``cntkio.Loader``: batches for a training loop, planned and assembled by native threads.

The loader runs CNTK's minibatch source (the same sequences, keys, values and order as ``cntkio batches`` and
:class:`cntkio.MinibatchSource` for the same options) on threads of its own: one plans the minibatches in
order, ``num_threads`` copy their sequences into reused buffers, ``prefetch`` batches ahead of the one the
loop holds. The GIL is not held while they work, and no DataLoader worker processes are needed.

**Epochs.** Keep one loader for the run and call ``set_epoch`` before each epoch: the chunks stay loaded from
one epoch to the next (``keep_chunks``), and once an epoch has planned its last minibatch the next epoch's
source starts on a thread of its own, shuffling its sweep while this epoch's last batches are copied, so that
its first batch does not wait for the shuffle (``CNTKIO_NEXT_EPOCH``: ``auto``, ``always`` or ``off``; see the
README). The batches are the same either way.

**Lifetime of a batch.** The arrays of a batch are views of a native buffer, handed over without a copy. A
buffer goes back to the loader for reuse only when no array (or view, or tensor made from one) refers to it
any more, so a batch stays valid for as long as the program holds any part of it — keeping batches is safe,
it only costs memory.
"""

from __future__ import annotations

import json as _json
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from cntkio import UsageError, _Deserializer, _has_scipy, _native
from cntkio._threads import default_threads
from cntkio._source import Minibatch

LAYOUTS = ("flat", "padded")
SPARSE = ("csr", "dense", "raw")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UsageError(f"{name} must be a positive integer, found {value!r}")
    return int(value)


def _iterable_base() -> Any:
    from cntkio.torch import MinibatchIterable

    return MinibatchIterable


class Loader(_iterable_base()):  # type: ignore[misc]
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

    The batches are those of :class:`cntkio.torch.MinibatchIterable` (and of ``cntkio batches``) for the
    same options, whatever ``num_threads`` and ``prefetch`` are; epochs (:meth:`set_epoch`), ranks and
    resuming (:meth:`state_dict`, :meth:`load_state_dict` with one state or, for an elastic resume on
    another world size, every rank's — see :mod:`cntkio.torch`) work as there.

    Args:
        deserializers: a deserializer or a list (joined by key as CNTK does, or read one after another
            with ``concat=True``).
        paths: instead of ``deserializers``: one or more CTF, CBF, Parquet or Arrow IPC files (format by
            magic number), read one after another; ``streams`` (a :class:`cntkio.StreamDefs`) is required
            for CTF, and the other keywords (``chunkSizeInBytes``, ``maxErrors``, …) are deserializer options
            (``mmap=False`` reads CBF files instead of mapping them; see :class:`cntkio.CBFDeserializer`).
        batch_size: samples per batch of this rank (CNTK's minibatch size, counted with the declared
            lengths; a sequence is never split).
        shuffle, seed: CNTK's randomization; epoch ``e`` is CNTK's sweep ``e`` of a source with
            ``randomization_seed=seed`` (shuffled with ``seed + e``).
        randomization_window_in_chunks / randomization_window_in_samples, frame_mode, truncation_length:
            as :class:`cntkio.MinibatchSource`.
        rank, world_size: this process's place in distributed training (default: ``torch.distributed``
            when initialised, else ``RANK`` / ``WORLD_SIZE``, else 0 of 1). Each rank reads its partition.
        balanced_workers: deal sequences instead of CNTK's whole chunks to the ranks (equal shares ±1; needed
            for an elastic resume).
        layout, sparse, with_keys: the form of the batches (above).
        num_threads: native threads assembling batches (default ``CNTKIO_THREADS``, else the cores this
            process may use, shared by the processes ``torchrun`` started on the machine: ``LOCAL_WORLD_SIZE``).
        prefetch: batches planned or ready ahead (default ``2 × num_threads + 2``).
    """

    def __init__(
        self,
        deserializers: Union[_Deserializer, Sequence[_Deserializer], None] = None,
        *,
        layout: str = "flat",
        sparse: str = "csr",
        with_keys: bool = False,
        num_threads: Optional[int] = None,
        prefetch: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        if layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {LAYOUTS}, found {layout!r}")
        if sparse not in SPARSE:
            raise UsageError(f"sparse must be one of {SPARSE}, found {sparse!r}")
        self.layout = layout
        self.sparse = sparse
        self.with_keys = bool(with_keys)
        self.num_threads = default_threads() if num_threads is None else _positive("num_threads", num_threads)
        self.prefetch = 2 * self.num_threads + 2 if prefetch is None else _positive("prefetch", prefetch)
        super().__init__(deserializers, **kwargs)
        # The source's checkpoint after the last batch yielded (JSON), and (epoch, checkpoint, consumed) of a
        # state loaded to continue from.
        self._position: Optional[str] = None
        self._exact: Optional[Tuple[int, str, Optional[int]]] = None
        self._pool: Any = None
        names = [i.name for i in self._infos]
        made = {f"{n}_{suffix}" for n in names for suffix in ("lengths", "mask")} | {"keys"}
        clash = sorted(set(names) & made)
        if clash:
            raise UsageError(f"stream names {clash} clash with the names of the lengths/masks/keys entries")

    def partition(self) -> Tuple[int, int]:
        """``(rank, world_size)``: the loader reads one partition per rank (no DataLoader workers)."""
        return self.rank, self.world_size

    def set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch != getattr(self, "epoch", epoch):
            self._position = None
        super().set_epoch(epoch)

    set_epoch.__doc__ = _iterable_base().set_epoch.__doc__

    def __len__(self) -> int:
        """Batches of this rank in one epoch (found from the index, without reading data; a resumed epoch
        counts the batches before the resume too)."""
        if self._options["truncation_length"]:
            raise TypeError("the number of batches of truncated BPTT is known only when read")
        src = self._source(self.epoch)
        return len(src._plan(self.batch_size * self.world_size, self.world_size, self.rank))

    # ---- resuming ---------------------------------------------------------------------------------------
    def state_dict(self, batches: Optional[int] = None, num_workers: Optional[int] = None) -> Dict[str, Any]:
        """The position in the current epoch after the batches yielded so far (small, JSON-compatible);
        :meth:`load_state_dict` continues with the next batch. It also holds the minibatch source's
        checkpoint (``source``), so that truncated BPTT's rows resume too."""
        if batches is not None and batches != self._yielded:
            raise UsageError("a Loader's state is the position after the batches it yielded: leave out batches")
        if num_workers not in (None, 0, 1):
            raise UsageError("a Loader has no DataLoader workers: leave out num_workers")
        state = super().state_dict(num_workers=1)
        state["source"] = None if self._position is None else _json.loads(self._position)
        return state

    def load_state_dict(self, state: Any, num_workers: Optional[int] = None) -> None:
        if num_workers not in (None, 0, 1):
            raise UsageError("a Loader has no DataLoader workers: leave out num_workers")
        super().load_state_dict(state, num_workers=None if isinstance(state, Mapping) else 1)
        self._exact = None
        one = isinstance(state, Mapping) or (
            len(state) == 1 and isinstance(state[0], Mapping) and state[0].get("world_size") == self.world_size
        )
        st = state if isinstance(state, Mapping) else state[0]
        if one and st.get("source") is not None and not st.get("num_workers"):
            consumed = st.get("consumed")
            self._exact = (self.epoch, _json.dumps(st["source"]), int(consumed[0]) if consumed else None)
        self._position = self._exact[1] if self._exact else None

    load_state_dict.__doc__ = _iterable_base().load_state_dict.__doc__

    # ---- iteration --------------------------------------------------------------------------------------
    def _group(self) -> int:
        """Minibatches per batch of the native feed (one Python call and one buffer for several)."""
        return 1

    def _pool_options(self) -> Dict[str, Any]:
        """Further arguments of the batch pool (``cntkio.torch.Loader``: the CUDA pinning hooks)."""
        return {}

    def _batch_pool(self) -> Any:
        """The batches the epochs' feeds reuse (made at the first iteration, kept across epochs)."""
        if self._pool is None:
            self._pool = _native.BatchPool(self.prefetch + self.num_threads + 8, **self._pool_options())
        return self._pool

    def _caller(self) -> Tuple[int, int]:
        return 0, 1  # one partition per rank, read in this process

    def _feed_threads(self, workers: int) -> int:
        return self.num_threads

    def _feed_ahead(self, threads: int) -> int:
        return self.prefetch

    def _begin(self, src: Any, size: int, worker: int, workers: int) -> Tuple[int, Optional[str]]:
        exact, self._exact = self._exact, None
        if exact is not None and exact[0] == self.epoch and self._resume is not None:
            # A Loader's own state: the source's checkpoint (with truncated BPTT's rows).
            restore: Optional[str] = exact[1]
            self._yielded, self._delivered = self._resume[1], exact[2]
        else:
            _, restore = super()._begin(src, size, worker, workers)
        self._resume = None
        self._position = restore
        return self.rank, restore

    def _handed_out(self, position: str, sequences: int) -> None:
        super()._handed_out(position, sequences)
        self._position = position

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        layout, sparse, with_keys = self.layout, self.sparse, self.with_keys
        for mb in self.minibatches():
            yield _to_arrays(mb, layout, with_keys, sparse)

    # ---- pickling ---------------------------------------------------------------------------------------
    def _loader_config(self) -> Dict[str, Any]:
        return dict(
            self._config(),
            layout=self.layout,
            sparse=self.sparse,
            with_keys=self.with_keys,
            num_threads=self.num_threads,
            prefetch=self.prefetch,
        )

    _PICKLED_STATE = _iterable_base()._PICKLED_STATE + ("_exact", "_position")

    def __reduce__(self) -> Any:
        state = {k: self.__dict__[k] for k in self._PICKLED_STATE}
        return (_rebuild_loader, (type(self).__module__, self._loader_config(), state))

    def __repr__(self) -> str:
        files = ", ".join(d.path for d in self._deserializers)
        return (
            f"<{type(self).__module__}.Loader [{files}] batch_size={self.batch_size} shuffle={self.shuffle} "
            f"seed={self.seed} epoch={self.epoch} rank={self.rank}/{self.world_size} num_threads={self.num_threads}>"
        )


def _rebuild_loader(module: str, config: Dict[str, Any], state: Dict[str, Any]) -> Any:
    if module == "cntkio.torch":
        from cntkio._torch_loader import loader_class

        obj = loader_class()(**config)
    elif module == "cntkio.jax":
        from cntkio.jax import Loader as JaxLoader

        obj = JaxLoader(**config)
    else:
        obj = Loader(**config)
    obj.__dict__.update(state)
    return obj


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
