"""PyTorch: CNTK data as a ``torch.utils.data.IterableDataset``, split between DataLoader workers and DDP ranks.

::

    from torch.utils.data import DataLoader
    import cntkio.torch

    ds = cntkio.torch.IterableDataset(
        paths="train.cbf", batch_size=256, shuffle=True, seed=1, chunkSizeInBytes=1 << 20)
    loader = DataLoader(ds, batch_size=None, num_workers=2)   # batches come from the dataset
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in loader:
            x, y = batch["features"], batch["labels"]          # (samples, dim) tensors

PyTorch is optional: this module imports without it; :class:`MinibatchIterable` (the same iteration,
yielding :class:`cntkio.Minibatch` objects of NumPy arrays) needs no PyTorch at all, and
``IterableDataset`` imports ``torch`` when it is first used.

**Splitting.** Every DataLoader worker of every rank reads one partition of the data, CNTK's distributed
reading: with ``P = world_size × num_workers`` partitions, the worker ``w`` of rank ``r`` reads partition
``r × num_workers + w``. With ``shuffle`` whole chunks are dealt to partitions (so the data needs at least
``P`` chunks — set ``chunkSizeInBytes`` for small CTF files — or some workers get nothing); without it
sequences are dealt round robin. No sequence is read by two partitions. Rank and world size come from
``rank=`` / ``world_size=``, else ``torch.distributed`` when it is initialised when the dataset is made,
else the ``RANK`` / ``WORLD_SIZE`` environment variables (set by ``torchrun``), else 0 and 1.

**Epochs and shuffling.** One iteration is one sweep over the data. Epoch ``e`` (:meth:`set_epoch`, as with
``DistributedSampler``; call it before each epoch) is shuffled with seed ``seed + e``, which is exactly
CNTK's sweep ``e`` of a source with ``randomization_seed=seed`` (CNTK shuffles sweep *k* with seed + *k*):
every rank and worker derives the same order from the shared seed. ``batch_size`` is the number of samples
(declared lengths, as CNTK counts them) per batch of each worker.

**Resuming.** :meth:`state_dict` returns the epoch and the number of batches consumed in it;
:meth:`load_state_dict` makes that epoch's iterations skip exactly those (until :meth:`set_epoch` moves on). In the main process (``num_workers=0``)
the dataset counts the batches it yields; with worker processes pass the count the training loop took
(``ds.state_dict(batches=step + 1, num_workers=2)``): each worker replays the DataLoader's round robin (workers in turn,
exhausted workers skipped) from the index alone, without reading data, and restores its source to the
position after its share, so the resumed run yields what the uninterrupted one would have. The number of
workers, ranks and the options must be the same.

**Pickling** is by path and options (deserializer configurations), never open files, so the dataset works
with ``spawn`` and ``forkserver`` workers.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from cntkio import CBFDeserializer, CTFDeserializer, UsageError, _Deserializer, detect_format
from cntkio._source import DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS, Minibatch, MinibatchSource

__all__ = ["IterableDataset", "Loader", "MinibatchIterable"]

_log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
_LAYOUTS = ("flat", "padded")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError(
            "cntkio.torch.IterableDataset needs PyTorch: pip install torch (or cntkio[torch]); "
            "cntkio.torch.MinibatchIterable gives the same batches as NumPy arrays without it"
        ) from None
    return torch


def _env_int(name: str) -> Optional[int]:
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise UsageError(f"environment variable {name}={v!r} is not an integer") from None


def distributed_rank_and_size(rank: Optional[int] = None, world_size: Optional[int] = None) -> Tuple[int, int]:
    """``(rank, world_size)``: the arguments if given, else ``torch.distributed``'s when it is initialised
    (PyTorch is not imported for this), else the ``RANK`` / ``WORLD_SIZE`` environment variables, else
    ``(0, 1)``."""
    if rank is None or world_size is None:
        dist = sys.modules.get("torch.distributed")
        r: Optional[int] = None
        w: Optional[int] = None
        if dist is not None and dist.is_available() and dist.is_initialized():
            r, w = int(dist.get_rank()), int(dist.get_world_size())
        else:
            r, w = _env_int("RANK"), _env_int("WORLD_SIZE")
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    rank = 0 if rank is None else int(rank)
    world_size = 1 if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} must be in [0, world_size) with world_size {world_size} ≥ 1")
    return rank, world_size


def _worker() -> Tuple[int, int]:
    """``(worker id, number of workers)`` of the DataLoader worker running this, ``(0, 1)`` outside one."""
    utils = sys.modules.get("torch.utils.data")
    info = utils.get_worker_info() if utils is not None else None
    if info is None:
        return 0, 1
    return int(info.id), int(info.num_workers)


def _consumed_shares(n: int, counts: Sequence[int]) -> Tuple[List[int], int]:
    """How many batches of each worker are among the first ``n`` a DataLoader yields, given each worker's
    number of batches (workers in turn, an exhausted worker skipped), and the worker whose turn is next."""
    taken = [0] * len(counts)
    left = min(n, sum(counts))
    w = 0
    while left:
        if taken[w] < counts[w]:
            taken[w] += 1
            left -= 1
        w = (w + 1) % len(counts)
    return taken, w


def _open_paths(paths: Union[PathLike, Sequence[PathLike]], streams: Any, options: Dict[str, Any]) -> List[_Deserializer]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: List[_Deserializer] = []
    for p in paths:
        if detect_format(p) == "ctf":
            if streams is None:
                raise UsageError(f"{os.fspath(p)} is a CTF file: give its streams (streams=StreamDefs(...))")
            out.append(CTFDeserializer(p, streams, **options))
        else:
            cbf_options = {k: v for k, v in options.items() if k in ("precision", "traceLevel", "mmap")}
            out.append(CBFDeserializer(p, streams, **cbf_options))
    if not out:
        raise UsageError("no paths given")
    return out


class MinibatchIterable:
    """One rank's and worker's share of the data, one sweep per iteration, as :class:`cntkio.Minibatch`
    objects (NumPy arrays) — the PyTorch-free core of :class:`IterableDataset` (see the module docs for
    splitting, epochs and resuming).

    Args:
        deserializers: a deserializer or a list (joined by key as CNTK does, or read one after another
            with ``concat=True``).
        paths: instead of ``deserializers``: one or more CTF/CBF files (format by magic number), read one
            after another as shards; ``streams`` (a :class:`cntkio.StreamDefs`) is required for CTF, and
            the other keywords (``chunkSizeInBytes``, ``maxErrors``, …) are deserializer options.
        batch_size: samples per batch and worker (CNTK's minibatch size; a sequence is never split).
        shuffle: randomize (CNTK's randomization), with ``seed`` + epoch.
        randomization_window_in_chunks / randomization_window_in_samples: CNTK's window.
        frame_mode: CNTK's frame mode (every sequence has at most one sample per stream).
        rank / world_size: this process's place in distributed training (see the module docs).
        balanced_workers: (cntkio) deal sequences instead of CNTK's whole chunks to the ranks and DataLoader
            workers, so that every partition gets the same number of sequences (±1) per epoch — with DDP,
            ranks then run the same number of batches when sequences have equal lengths.
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
        concat: Optional[bool] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        balanced_workers: bool = False,
        **options: Any,
    ) -> None:
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
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UsageError(f"batch_size must be a positive integer, found {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise UsageError(f"seed must be a non-negative integer, found {seed!r}")
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.rank, self.world_size = distributed_rank_and_size(rank, world_size)
        self._options: Dict[str, Any] = dict(
            randomization_window_in_chunks=randomization_window_in_chunks,
            randomization_window_in_samples=randomization_window_in_samples,
            frame_mode=bool(frame_mode),
            concat=concat,
            balanced_workers=bool(balanced_workers),
        )
        self.epoch = 0
        self._resume: Optional[Tuple[int, int, int]] = None  # (epoch, batches, workers) to skip
        self._yielded = 0  # batches yielded in this process in the current epoch
        # Opens the files and checks the options now, not only in the workers.
        self._infos = self._source(0).stream_infos()

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
            self._yielded = 0
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self.epoch = epoch

    def partition(self) -> Tuple[int, int]:
        """``(partition index, number of partitions)`` of the caller: ``rank × num_workers + worker id`` of
        ``world_size × num_workers`` (rotated among the rank's workers for the rest of a resumed epoch)."""
        w, n = _worker()
        return self.rank * n + w, self.world_size * n

    # ---- resuming ---------------------------------------------------------------------------------------
    def state_dict(self, batches: Optional[int] = None, num_workers: Optional[int] = None) -> Dict[str, Any]:
        """The position in the current epoch: ``batches`` consumed from its start by this rank's training loop
        (default: the batches this object yielded in this process — right with ``num_workers=0``), and the
        DataLoader's ``num_workers``. JSON-compatible."""
        if batches is None:
            batches = self._yielded
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise UsageError(f"batches must be a non-negative integer, found {batches!r}")
        if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                        or num_workers < 0):
            raise UsageError(f"num_workers must be a non-negative integer, found {num_workers!r}")
        w = _worker()[1] if num_workers is None else max(1, num_workers)
        return {
            "version": 1,
            "epoch": self.epoch,
            "batches": batches,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "num_workers": None if w == 1 else w,
        }

    def load_state_dict(self, state: Mapping[str, Any], num_workers: Optional[int] = None) -> None:
        """Resumes: the iterations of epoch ``state['epoch']`` leave out its first ``state['batches']``
        batches, until :meth:`set_epoch` moves to another epoch (worker processes cannot tell the dataset
        that an iteration ended, so the same holds with and without them). ``num_workers``: the DataLoader's (default: the state's); it must be the one the state was
        taken with."""
        if not isinstance(state, Mapping) or state.get("version") != 1:
            raise UsageError(f"not a cntkio.torch state (version 1): {state!r}")
        for key in ("seed", "batch_size", "shuffle", "world_size"):
            if state.get(key) != getattr(self, key):
                raise UsageError(f"the state has {key}={state.get(key)!r}, this dataset {getattr(self, key)!r}")
        self.set_epoch(int(state["epoch"]))
        workers = num_workers if num_workers is not None else state.get("num_workers")
        self._resume = (self.epoch, int(state["batches"]), max(1, int(workers or 0)))
        self._yielded = int(state["batches"])

    def _resume_slot(self, src: MinibatchSource, size: int, worker: int, workers: int) -> Tuple[int, int]:
        """``(slot, skipped)``: which of this rank's ``workers`` partitions this worker reads, and how many of
        its batches it skips (``src`` is restored past them). Without a resume point: its own, none. When
        resuming after ``n`` batches, the DataLoader's round robin is replayed from the index: each partition's
        share of the ``n`` is skipped, and the partitions are rotated so that the resumed loader's worker 0
        reads the partition whose turn was next — the resumed loader then yields the uninterrupted order."""
        if self._resume is None or self._resume[0] != self.epoch:
            return worker, 0
        _, n, saved_workers = self._resume
        if saved_workers != workers:
            raise UsageError(
                f"the state was taken with {saved_workers} DataLoader worker(s) per rank, this loader has "
                f"{workers}: pass num_workers to load_state_dict, or use the same number"
            )
        if n == 0:
            return worker, 0
        partitions = self.world_size * workers
        first = self.rank * workers
        # A partition contributes at most n of the first n batches: its first n checkpoints are enough.
        plans = [src._plan(size, partitions, first + w, limit=n) for w in range(workers)]
        shares, turn = _consumed_shares(n, [len(p) for p in plans])
        slot = (turn + worker) % workers
        k = shares[slot]
        if k:
            src.restore_from_checkpoint(plans[slot][k - 1])
        return slot, k

    # ---- iteration --------------------------------------------------------------------------------------
    def minibatches(self) -> Iterator[Minibatch]:
        """This partition's minibatches of the current epoch (one sweep)."""
        worker, workers = _worker()
        partitions = self.world_size * workers
        src = self._source(self.epoch)
        if self.shuffle and src.num_chunks < partitions:
            _log.warning(
                "%d partitions (ranks × workers) but the data has %d chunk(s): with shuffle, chunks are dealt "
                "to partitions and some get no data; use a smaller chunkSizeInBytes",
                partitions,
                src.num_chunks,
            )
        size = self.batch_size * partitions
        slot, skipped = self._resume_slot(src, size, worker, workers)
        index = self.rank * workers + slot
        in_process = workers == 1
        if in_process:
            self._yielded = skipped
        while True:
            mb = src.next_minibatch(size, num_data_partitions=partitions, partition_index=index)
            assert isinstance(mb, Minibatch)
            if not mb:
                break
            if in_process:
                self._yielded += 1
            yield mb

    def __iter__(self) -> Iterator[Any]:
        return iter(self.minibatches())

    # ---- pickling ---------------------------------------------------------------------------------------
    def _config(self) -> Dict[str, Any]:
        return dict(
            deserializers=self._deserializers,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
            **self._options,
        )

    def __reduce__(self) -> Any:
        extra = dict(self.__dict__)
        state = {k: extra[k] for k in ("epoch", "_resume", "_yielded")}
        for k in ("layout", "with_keys", "sparse"):
            if k in extra:
                state[k] = extra[k]
        return (_rebuild, (type(self).__name__, self._config(), state))

    def __repr__(self) -> str:
        files = ", ".join(d.path for d in self._deserializers)
        return (
            f"<{type(self).__name__} [{files}] batch_size={self.batch_size} shuffle={self.shuffle} "
            f"seed={self.seed} epoch={self.epoch} rank={self.rank}/{self.world_size}>"
        )


def _rebuild(cls_name: str, config: Dict[str, Any], state: Dict[str, Any]) -> Any:
    cls = MinibatchIterable if cls_name == "MinibatchIterable" else _dataset_class()
    extra = {k: state.pop(k) for k in ("layout", "with_keys", "sparse") if k in state}
    obj = cls(**config, **extra)
    obj.__dict__.update(state)
    return obj


def _to_tensors(mb: Minibatch, layout: str, with_keys: bool, sparse: str) -> Dict[str, Any]:
    torch = _torch()
    out: Dict[str, Any] = {}
    for name, s in mb.by_name().items():
        lengths = torch.from_numpy(s.lengths)
        if layout == "padded":
            values, mask = s.padded()
            out[name] = torch.from_numpy(values)
            out[f"{name}_mask"] = torch.from_numpy(mask)
        elif s.is_sparse and sparse == "csr":
            data, indices, indptr = s.raw()
            if indptr.dtype != indices.dtype:
                indices = indices.astype(indptr.dtype)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
                out[name] = torch.sparse_csr_tensor(
                    torch.from_numpy(indptr),
                    torch.from_numpy(indices),
                    torch.from_numpy(data),
                    size=(s.num_samples, s.dim),
                    check_invariants=False,
                )
        elif s.is_sparse:
            out[name] = torch.from_numpy(s.todense())
        else:
            out[name] = torch.from_numpy(s.values)
        out[f"{name}_lengths"] = lengths
    if with_keys:
        out["keys"] = torch.from_numpy(mb.sequence_keys.astype(np.int64))
    return out


_DATASET_CLASS: Any = None


def _dataset_class() -> Any:
    """Makes ``IterableDataset`` (a subclass of ``torch.utils.data.IterableDataset``) on first use."""
    global _DATASET_CLASS
    if _DATASET_CLASS is not None:
        return _DATASET_CLASS
    torch = _torch()

    class IterableDataset(MinibatchIterable, torch.utils.data.IterableDataset):  # type: ignore[misc,name-defined]
        """A ``torch.utils.data.IterableDataset`` of CNTK data (see :mod:`cntkio.torch` for splitting,
        epochs, resuming and pickling). Each item is one batch, a dict of tensors — use
        ``DataLoader(ds, batch_size=None, ...)``:

        * ``NAME``: the stream's samples. ``layout="flat"`` (default): ``(samples, dim)``, sequence after
          sequence (a view of the array the reader filled); sparse streams as ``torch.sparse_csr_tensor``
          (``sparse="dense"`` densifies them). ``layout="padded"``: ``(sequences, longest, dim)`` with
          zeros after each sequence's end.
        * ``NAME_lengths``: int64 samples of each sequence in this stream.
        * ``NAME_mask`` (padded): bool ``(sequences, longest)``, True at real samples.
        * ``keys`` (``with_keys=True``): int64 sequence keys.

        Takes the arguments of :class:`MinibatchIterable` plus ``layout``, ``sparse`` and ``with_keys``.
        """

        def __init__(
            self,
            deserializers: Any = None,
            *,
            layout: str = "flat",
            sparse: str = "csr",
            with_keys: bool = False,
            **kwargs: Any,
        ) -> None:
            if layout not in _LAYOUTS:
                raise UsageError(f"layout must be one of {_LAYOUTS}, found {layout!r}")
            if sparse not in ("csr", "dense"):
                raise UsageError(f"sparse must be 'csr' or 'dense', found {sparse!r}")
            MinibatchIterable.__init__(self, deserializers, **kwargs)
            self.layout = layout
            self.sparse = sparse
            self.with_keys = bool(with_keys)
            names = [i.name for i in self._infos]
            made = {f"{n}_{suffix}" for n in names for suffix in ("lengths", "mask")} | {"keys"}
            clash = sorted(set(names) & made)
            if clash:
                raise UsageError(f"stream names {clash} clash with the names of the lengths/masks/keys entries")

        def __iter__(self) -> Iterator[Dict[str, Any]]:
            for mb in self.minibatches():
                yield _to_tensors(mb, self.layout, self.with_keys, self.sparse)

    IterableDataset.__module__ = __name__
    IterableDataset.__qualname__ = "IterableDataset"
    _DATASET_CLASS = IterableDataset
    return IterableDataset


def __getattr__(name: str) -> Any:
    if name == "IterableDataset":
        return _dataset_class()
    if name == "Loader":
        from cntkio._torch_loader import loader_class

        return loader_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(list(globals()) + ["IterableDataset", "Loader"])
