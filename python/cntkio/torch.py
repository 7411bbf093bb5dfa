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
``DistributedSampler``; call it before each epoch, also with ``persistent_workers=True``: the workers read it
from shared memory) is shuffled with seed ``seed + e``, which is exactly
CNTK's sweep ``e`` of a source with ``randomization_seed=seed`` (CNTK shuffles sweep *k* with seed + *k*):
every rank and worker derives the same order from the shared seed. ``batch_size`` is the number of samples
(declared lengths, as CNTK counts them) per batch of each worker.

**Resuming.** :meth:`state_dict` returns the epoch and the number of batches consumed in it;
:meth:`load_state_dict` makes that epoch's iterations skip exactly those (until :meth:`set_epoch` moves on). In the main process (``num_workers=0``)
the dataset counts the batches it yields; with worker processes pass the count the training loop took
(``ds.state_dict(batches=step + 1, num_workers=2)``): each worker replays the DataLoader's round robin (workers in turn,
exhausted workers skipped) from the index alone, without reading data, and restores its source to the
position after its share, so the resumed run yields what the uninterrupted one would have. With one state the
number of workers, ranks and the options must be the same.

*Elastic resume* (``balanced_workers=True`` with ``shuffle=True``): the state also records, per partition of
the rank, the sequences it consumed in the epoch (``consumed``). Collect every rank's state
(:func:`gather_states` does it over ``torch.distributed``) and give the list to :meth:`load_state_dict`, with
the new ``num_workers`` when it changed: any world size and number of DataLoader workers may then resume the
epoch. With the same world size and workers it is the exact resume above; otherwise the sequences the old
partitions consumed are left out of the epoch's order and the rest is dealt to the new partitions in turn, so
that every sequence of the epoch is read exactly once across the runs (the new run's batches are not the
uninterrupted run's). After an elastic resume ``batches`` counts the batches taken since the resume (the
dataset's own count does). CNTK's chunk dealing cannot do this: without ``balanced_workers`` and ``shuffle`` a
list of states of another world size is a :class:`cntkio.UsageError`.

**Reading.** Each iteration's minibatches are planned and assembled by native threads into reused buffers
(the cores shared among a DataLoader's workers); a worker sends each batch to the main process through shared
memory of its own that is reused once the main process drops the batch. A persistent worker
(``persistent_workers=True``) makes its next epoch's source while it reads one, from its second epoch on
(``CNTKIO_NEXT_EPOCH``, as for :class:`Loader`). :class:`Loader` (``cntkio.torch.Loader``)
yields the same batches in the main process, with no worker processes, and copies them to a GPU ahead of the
step with ``device="cuda"``: the faster path for training.

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

from cntkio import (
    _ALIASES,
    _CTF_OPTIONS,
    CBFDeserializer,
    CTFDeserializer,
    UsageError,
    _Deserializer,
    _feed,
    _native,
    _shared,
    _did_you_mean,
    _streams_wanted,
    detect_format,
)
from cntkio._source import DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS, Minibatch, MinibatchSource
from cntkio._threads import _env_int, default_threads

__all__ = ["IterableDataset", "Loader", "MinibatchIterable", "gather_states"]

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


def _in_dataloader_worker() -> bool:
    """Whether this runs in a DataLoader worker process."""
    utils = sys.modules.get("torch.utils.data")
    return utils is not None and utils.get_worker_info() is not None


def _worker_loaders(workers: int) -> int:
    """Chunk loaders of each of ``workers`` DataLoader workers: its share of the default number, but 2 where
    the default allows (a load waits for the file's pages; a second loader overlaps the waits)."""
    n = default_threads()
    return max(min(2, n), n // workers)


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
                raise _streams_wanted(os.fspath(p), "reading it")
            out.append(CTFDeserializer(p, streams, **options))
        else:
            cbf_options = {k: v for k, v in options.items() if k in ("precision", "traceLevel", "mmap")}
            out.append(CBFDeserializer(p, streams, **cbf_options))
    if not out:
        raise UsageError("no paths given")
    return out


def _unknown_arguments(cls: type, names: List[str]) -> str:
    """The error of keywords ``names`` given to ``cls`` that are neither its arguments nor deserializer options,
    each with the closest of those (a misspelt ``shufle`` would otherwise be taken for a deserializer
    option)."""
    import inspect

    known = set(_ALIASES)
    for c in cls.__mro__:
        init = c.__dict__.get("__init__")
        if init is not None:
            params = inspect.signature(init).parameters.values()
            known.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    known.discard("self")
    said = [f"{n!r}{_did_you_mean(n, known)}" for n in names]
    return (
        f"{cls.__name__}: unknown argument{'s' if len(names) > 1 else ''} {', '.join(said)}; the keywords beside "
        f"its own arguments are the deserializers' options: {', '.join(_CTF_OPTIONS)}"
    )


class MinibatchIterable:
    """One rank's and worker's share of the data, one sweep per iteration, as :class:`cntkio.Minibatch`
    objects (NumPy arrays) — the PyTorch-free core of :class:`IterableDataset` (see the module docs for
    splitting, epochs and resuming).

    Args:
        deserializers: a deserializer or a list (joined by key as CNTK does, or read one after another
            with ``concat=True``).
        paths: instead of ``deserializers``: one or more CTF, CBF, Parquet or Arrow IPC files (format by
            magic number), read one after another as shards; ``streams`` (a :class:`cntkio.StreamDefs`) is
            required for CTF, and the other keywords (``chunkSizeInBytes``, ``maxErrors``, …) are deserializer
            options (``mmap=False`` reads CBF files instead of mapping them; see :class:`cntkio.CBFDeserializer`).
        batch_size: samples per batch and worker (CNTK's minibatch size; a sequence is never split).
        shuffle: randomize (CNTK's randomization), with ``seed`` + epoch.
        randomization_window_in_chunks / randomization_window_in_samples: CNTK's window.
        frame_mode: CNTK's frame mode (every sequence has at most one sample per stream).
        truncation_length: truncated BPTT (as :class:`cntkio.MinibatchSource`; resuming it needs the
            state of :class:`cntkio.Loader`, which holds the rows).
        rank / world_size: this process's place in distributed training (see the module docs).
        balanced_workers: (cntkio) deal sequences instead of CNTK's whole chunks to the ranks and DataLoader
            workers, so that every partition gets the same number of sequences (±1) per epoch — with DDP,
            ranks then run the same number of batches when sequences have equal lengths.
        keep_chunks: (cntkio) with shuffle and a randomization window that covers the data, keep the chunks
            loaded from one epoch to the next in each process that reads (never more than an epoch held at
            once), so that later epochs read nothing from the files; False frees them at the end of every
            epoch.
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
        keep_chunks: bool = True,
        **options: Any,
    ) -> None:
        unknown = sorted(k for k in options if k not in _ALIASES)
        if unknown:
            raise UsageError(_unknown_arguments(type(self), unknown))
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
        self.keep_chunks = bool(keep_chunks)
        self._options: Dict[str, Any] = dict(
            randomization_window_in_chunks=randomization_window_in_chunks,
            randomization_window_in_samples=randomization_window_in_samples,
            frame_mode=bool(frame_mode),
            truncation_length=truncation_length,
            concat=concat,
            balanced_workers=bool(balanced_workers),
        )
        self.epoch = 0
        self._resume: Optional[Tuple[int, int, int]] = None  # (epoch, batches, workers) to skip
        self._yielded = 0  # batches yielded in this process in the current epoch
        # Sequences those batches held (balanced dealing; None when not counted).
        self._delivered: Optional[int] = 0
        # (epoch, rounds): the epoch resumed elastically and the sequences earlier runs consumed of it.
        self._elastic: Optional[Tuple[int, List[List[int]]]] = None
        self._counting = True  # this process hands the batches to the training loop (no DataLoader worker)
        # Opens the files and checks the options now, not only in the workers.
        self._infos = self._source(0).stream_infos()

    # ---- configuration ----------------------------------------------------------------------------------
    def _source(self, epoch: int, workers: int = 1) -> MinibatchSource:
        """The source of epoch ``epoch``, read by one of ``workers`` DataLoader workers (which share the
        cores: each gets its part of the default number of chunk loaders, :func:`_worker_loaders`)."""
        rounds = self._rounds(epoch)
        return MinibatchSource(
            self._deserializers,
            max_sweeps=1,
            randomize=self.shuffle,
            randomization_seed=self.seed + epoch,
            elastic_resume=None if not rounds else {"sweep": 0, "rounds": rounds},
            _keep=self._chunk_keep() if self.keep_chunks else None,
            _loaders=None if workers == 1 else _worker_loaders(workers),
            **self._options,
        )

    def _chunk_keep(self) -> Any:
        """Where the epochs' sources of this process leave the chunks they hold for the next epoch (made in
        each process that reads; never pickled)."""
        kept = self.__dict__.get("_kept")
        if kept is None or kept[0] != os.getpid():
            kept = (os.getpid(), _native.Keep())
            self.__dict__["_kept"] = kept
        return kept[1]

    def _rounds(self, epoch: int) -> List[List[int]]:
        """The sequences earlier runs consumed of epoch ``epoch`` when it was resumed elastically (else [])."""
        if self._elastic is None or self._elastic[0] != epoch:
            return []
        return [list(r) for r in self._elastic[1]]

    def _balanced(self) -> bool:
        return self.shuffle and bool(self._options["balanced_workers"])

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration: shuffled with ``seed + epoch``. Call it before every epoch, on
        every rank (as with ``DistributedSampler``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise UsageError(f"epoch must be a non-negative integer, found {epoch!r}")
        if epoch != self.epoch:
            self._yielded = 0
            self._delivered = 0
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        if self._elastic is not None and self._elastic[0] != epoch:
            self._elastic = None
        self.epoch = epoch
        self.__dict__["_epoch_set"] = True

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
        state: Dict[str, Any] = {
            "version": 1,
            "epoch": self.epoch,
            "batches": batches,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "num_workers": None if w == 1 else w,
            "rank": self.rank,
        }
        if self._balanced():
            state["consumed"] = self._consumed(batches, w)
            state["elastic"] = self._rounds(self.epoch)
        return state

    def _consumed(self, batches: int, workers: int) -> List[int]:
        """The sequences each partition of this rank (``rank × workers + w``, by ``w``) consumed in the
        epoch in its first ``batches`` batches: counted while iterating in this process, else found by
        replaying the DataLoader's round robin as :meth:`_resume_slot` does."""
        if workers == 1 and batches == self._yielded and self._delivered is not None:
            return [self._delivered]
        if batches == 0:
            return [0] * workers
        src = self._source(self.epoch)
        partitions = self.world_size * workers
        size = self.batch_size * partitions
        plans = [
            src._plan_counts(size, partitions, self.rank * workers + w, limit=batches) for w in range(workers)
        ]
        shares, _ = _consumed_shares(batches, [len(p) for p in plans])
        return [int(plans[w][k - 1][1] or 0) if k else 0 for w, k in enumerate(shares)]

    def load_state_dict(
        self, state: Union[Mapping[str, Any], Sequence[Mapping[str, Any]]], num_workers: Optional[int] = None
    ) -> None:
        """Resumes: the iterations of epoch ``state['epoch']`` leave out its first ``state['batches']``
        batches, until :meth:`set_epoch` moves to another epoch (worker processes cannot tell the dataset
        that an iteration ended, so the same holds with and without them). ``num_workers``: the DataLoader's
        (default: the state's); with one state it must be the one the state was taken with.

        ``state`` may also be the list of every rank's state (:func:`gather_states`): then any world size and
        ``num_workers`` may resume the epoch (elastic resume, ``balanced_workers=True`` with ``shuffle=True``
        only; see the module docs)."""
        if isinstance(state, Mapping):
            self._load_one(state, num_workers)
            return
        if isinstance(state, (str, bytes)) or not isinstance(state, Sequence) or not state:
            raise UsageError(f"a state is a dict of state_dict(), or a non-empty list of every rank's: {state!r}")
        states = [self._check_state(s) for s in state]
        first = states[0]
        for s in states[1:]:
            for key in ("epoch", "world_size", "num_workers", "elastic"):
                if s.get(key) != first.get(key):
                    raise UsageError(
                        f"the states differ in {key} ({first.get(key)!r} and {s.get(key)!r}): give the states of "
                        "one checkpoint of every rank"
                    )
        old_world = int(first["world_size"])
        ranks = sorted(s.get("rank", -1) for s in states)
        if ranks != list(range(old_world)):
            raise UsageError(
                f"the states are of ranks {ranks}; give the state of every rank of the old world size "
                f"{old_world} once (ranks 0..{old_world - 1}; states without a rank predate elastic resume)"
            )
        old_workers = max(1, int(first.get("num_workers") or 0))
        workers = max(1, int(num_workers)) if num_workers is not None else old_workers
        if old_world == self.world_size and old_workers == workers:
            # The same partitions: this rank's own state resumes exactly.
            self._load_one(next(s for s in states if s["rank"] == self.rank), num_workers)
            return
        if not self._balanced():
            raise UsageError(
                f"resuming states of world size {old_world} with {old_workers} DataLoader worker(s) per rank on "
                f"world size {self.world_size} with {workers} is an elastic resume: it needs balanced_workers=True "
                "and shuffle=True (CNTK's chunk dealing cannot resume with other partitions)"
            )
        consumed: List[int] = []
        for s in sorted(states, key=lambda s: int(s["rank"])):
            c = s.get("consumed")
            if not isinstance(c, list) or len(c) != old_workers:
                raise UsageError(
                    f"the state of rank {s['rank']} has no per-worker counts of consumed sequences for its "
                    f"{old_workers} worker(s) (consumed={c!r}); take it with balanced_workers=True, shuffle=True"
                )
            consumed.extend(int(n) for n in c)
        epoch = int(first["epoch"])
        rounds = [list(r) for r in (first.get("elastic") or [])] + [consumed]
        previous = (self.epoch, self._elastic, self._resume, self._yielded, self._delivered)
        self.set_epoch(epoch)
        self._elastic = (epoch, rounds)
        self._resume = (epoch, 0, workers)
        self._yielded = 0
        self._delivered = 0
        try:
            self._source(epoch)  # checks the counts against the data now
        except Exception:
            self.epoch, self._elastic, self._resume, self._yielded, self._delivered = previous
            raise

    def _check_state(self, state: Any) -> Mapping[str, Any]:
        if not isinstance(state, Mapping) or state.get("version") != 1:
            raise UsageError(f"not a cntkio.torch state (version 1): {state!r}")
        for key in ("seed", "batch_size", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise UsageError(f"the state has {key}={state.get(key)!r}, this dataset {getattr(self, key)!r}")
        return state

    def _load_one(self, state: Mapping[str, Any], num_workers: Optional[int]) -> None:
        self._check_state(state)
        if state.get("world_size") != self.world_size:
            raise UsageError(
                f"the state has world_size={state.get('world_size')!r}, this dataset {self.world_size!r}: to "
                "resume on another world size give the list of every rank's state (balanced_workers=True)"
            )
        rounds = state.get("elastic") or []
        if rounds and not self._balanced():
            raise UsageError("the state is of an elastic resume: it needs balanced_workers=True and shuffle=True")
        self.set_epoch(int(state["epoch"]))
        self._elastic = (self.epoch, [list(r) for r in rounds]) if rounds else None
        workers = num_workers if num_workers is not None else state.get("num_workers")
        self._resume = (self.epoch, int(state["batches"]), max(1, int(workers or 0)))
        self._yielded = int(state["batches"])
        self._delivered = None

    def _resume_slot(self, src: MinibatchSource, size: int, worker: int, workers: int) -> Tuple[int, int, int]:
        """``(slot, skipped, delivered)``: which of this rank's ``workers`` partitions this worker reads, how
        many of its batches it skips (``src`` is restored past them), and the sequences those held (counted
        with balanced dealing, else 0). Without a resume point: its own, none. When
        resuming after ``n`` batches, the DataLoader's round robin is replayed from the index: each partition's
        share of the ``n`` is skipped, and the partitions are rotated so that the resumed loader's worker 0
        reads the partition whose turn was next — the resumed loader then yields the uninterrupted order."""
        if self._resume is None or self._resume[0] != self.epoch:
            return worker, 0, 0
        _, n, saved_workers = self._resume
        if saved_workers != workers:
            raise UsageError(
                f"the state was taken with {saved_workers} DataLoader worker(s) per rank, this loader has "
                f"{workers}: pass num_workers to load_state_dict, or use the same number"
            )
        if n == 0:
            return worker, 0, 0
        partitions = self.world_size * workers
        first = self.rank * workers
        # A partition contributes at most n of the first n batches: its first n checkpoints are enough.
        plans = [src._plan_counts(size, partitions, first + w, limit=n) for w in range(workers)]
        shares, turn = _consumed_shares(n, [len(p) for p in plans])
        slot = (turn + worker) % workers
        k = shares[slot]
        if k:
            src.restore_from_checkpoint(plans[slot][k - 1][0])
        return slot, k, int(plans[slot][k - 1][1] or 0) if k else 0

    # ---- iteration --------------------------------------------------------------------------------------
    def _caller(self) -> Tuple[int, int]:
        """``(worker id, number of workers)`` of the DataLoader worker iterating (``(0, 1)`` outside one)."""
        return _worker()

    def _feed_threads(self, workers: int) -> int:
        """Native threads assembling this iteration's batches: the cores, shared by the DataLoader workers."""
        return max(1, default_threads() // workers)

    def _feed_ahead(self, threads: int) -> int:
        """Minibatches planned or ready ahead."""
        return 2 * threads + 2

    def _group(self) -> int:
        """Minibatches per batch of the native feed."""
        return 1

    def _batch_pool(self) -> Any:
        """The batches the feed reuses (None: a pool of the feed's own)."""
        return None

    def _begin(self, src: MinibatchSource, size: int, worker: int, workers: int) -> Tuple[int, Optional[str]]:
        """This iteration's partition index and the checkpoint its feed starts from (None: the start), after
        skipping what a resume leaves out; sets the counts of batches and sequences handed out."""
        slot, skipped, delivered = self._resume_slot(src, size, worker, workers)
        if workers == 1:
            self._yielded = skipped
            self._delivered = delivered
        return self.rank * workers + slot, (src._src.state() if skipped else None)

    def _raw_batches(self) -> Iterator[Any]:
        """The native feed's batches of this partition's minibatches of the current epoch (see
        ``_native.Feed.next``): minibatches planned and assembled by native threads into reused buffers (the
        minibatches of ``MinibatchSource.next_minibatch``). The caller accounts for each minibatch it hands
        out (:meth:`_handed_out`)."""
        worker, workers = self._caller()
        partitions = self.world_size * workers
        src = self._source(self.epoch, workers)
        if self.shuffle and not self._options["balanced_workers"] and src.num_chunks < partitions:
            _log.warning(
                "%d partitions (ranks × workers) but the data has %d chunk(s): with shuffle, chunks are dealt "
                "to partitions and some get no data; use a smaller chunkSizeInBytes",
                partitions,
                src.num_chunks,
            )
        size = self.batch_size * partitions
        index, restore = self._begin(src, size, worker, workers)
        self._counting = workers == 1
        threads = self._feed_threads(workers)
        group = self._group()
        after, then_epoch, always = self._next_epoch(workers, restore)
        feed = _native.Feed(
            src._src,
            size,
            workers=partitions,
            rank=index,
            threads=threads,
            ahead=-(-self._feed_ahead(threads) // group),
            restore=restore,
            group=group,
            pool=self._batch_pool(),
            after=after,
            then=None if then_epoch is None else self._source(then_epoch, workers)._src,
            then_always=always,
        )
        try:
            while True:
                raw = feed.next()
                if raw is None:
                    break
                yield raw
            if then_epoch is not None:
                self.__dict__["_next_source"] = (os.getpid(), then_epoch, feed.next_source())
        finally:
            feed.close()

    def _next_epoch(self, workers: int, restore: Optional[str]) -> Tuple[Any, Optional[int], bool]:
        """The source of this epoch if the last epoch's feed made it ahead (``after``); the epoch the next
        iteration most likely reads, whose source this epoch's feed makes ahead (``then``); and whether it
        does so even when the process keeps every core busy. With ``CNTKIO_NEXT_EPOCH=auto`` (the default):
        after :meth:`set_epoch` since the last iteration (a loop over epochs), the next epoch, always;
        otherwise this epoch again, only if the process left a core idle meanwhile (it may not be read
        again). ``always``: as after ``set_epoch``; ``off``: never. In a DataLoader worker, only from the
        worker's second iteration on (a persistent worker, iterated again: one started for a single epoch
        would make it for nothing), always (the worker's cores are shared with the other workers, so the
        idle-core rule cannot tell; and a persistent worker's dataset is read again)."""
        kept = self.__dict__.pop("_next_source", None)
        after = None
        if kept is not None and kept[0] == os.getpid() and kept[1] == self.epoch and restore is None:
            after = kept[2]
        moved = self.__dict__.pop("_epoch_set", False)
        mode = os.environ.get("CNTKIO_NEXT_EPOCH", "auto")
        if mode not in ("auto", "always", "off"):
            raise UsageError(f"CNTKIO_NEXT_EPOCH must be auto, always or off, found {mode!r}")
        in_worker = workers != 1 or _in_dataloader_worker()
        iterated_here = self.__dict__.get("_iterated_in") == os.getpid()
        self.__dict__["_iterated_in"] = os.getpid()
        if mode == "off" or (in_worker and not iterated_here):
            return after, None, False
        return after, self.epoch + 1 if moved else self.epoch, moved or mode == "always" or in_worker

    def _handed_out(self, position: str, sequences: int) -> None:
        """Accounts for a minibatch handed out (in the main process): ``position`` is the checkpoint after it."""
        if self._counting:
            self._yielded += 1
            if self._delivered is not None:
                self._delivered += sequences

    def minibatches(self) -> Iterator[Minibatch]:
        """This partition's minibatches of the current epoch (one sweep)."""
        for raw in self._raw_batches():
            for mb, position, n in _feed.minibatches_of(raw, self._infos):
                self._handed_out(position, n)
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
            keep_chunks=self.keep_chunks,
            **self._options,
        )

    # The position kept across pickling (the rest is rebuilt from the configuration).
    _PICKLED_STATE: Tuple[str, ...] = ("epoch", "_resume", "_yielded", "_delivered", "_elastic")

    def __reduce__(self) -> Any:
        extra = dict(self.__dict__)
        state = {k: extra[k] for k in self._PICKLED_STATE}
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


def gather_states(
    dataset_or_state: Union[MinibatchIterable, Mapping[str, Any]],
    batches: Optional[int] = None,
    num_workers: Optional[int] = None,
) -> List[Dict[str, Any]]:
    """Every rank's state, for :meth:`MinibatchIterable.load_state_dict` on any world size: the state of
    ``dataset_or_state`` (a dataset's :meth:`~MinibatchIterable.state_dict` with ``batches`` and
    ``num_workers``, or a state dict) gathered with ``torch.distributed.all_gather_object`` when
    ``torch.distributed`` is initialised (a collective: call it on every rank), else ``[state]``."""
    if isinstance(dataset_or_state, MinibatchIterable):
        state = dataset_or_state.state_dict(batches=batches, num_workers=num_workers)
    elif isinstance(dataset_or_state, Mapping):
        if batches is not None or num_workers is not None:
            raise UsageError("batches and num_workers apply to a dataset, not to a state dict")
        state = dict(dataset_or_state)
    else:
        raise UsageError(f"gather_states takes a cntkio.torch dataset or its state_dict(), found {dataset_or_state!r}")
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return [state]
    out: List[Any] = [None] * int(dist.get_world_size())
    dist.all_gather_object(out, state)
    return [dict(s) for s in out]


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
            out[name] = _csr_tensor(
                torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(data), (s.num_samples, s.dim)
            )
        elif s.is_sparse:
            out[name] = torch.from_numpy(s.todense())
        else:
            out[name] = torch.from_numpy(s.values)
        out[f"{name}_lengths"] = lengths
    if with_keys:
        out["keys"] = torch.from_numpy(mb.sequence_keys.astype(np.int64))
    return out


def _csr_tensor(crow: Any, col: Any, values: Any, size: Any) -> Any:
    """``torch.sparse_csr_tensor`` of parts cntkio made (valid: no invariant checks), without its warnings."""
    torch = _torch()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        # PyTorch 2.11 warns when invariant checks are off by default; cntkio's parts are valid.
        warnings.filterwarnings("ignore", message=".*[Ss]parse invariant checks are implicitly disabled.*")
        return torch.sparse_csr_tensor(crow, col, values, size=size, check_invariants=False)


def _in_one_shared_segment(batch: Dict[str, Any]) -> Dict[str, Any]:
    """The tensors of ``batch`` copied into one shared-memory segment (views of it, 64-byte aligned), so that
    sending the batch to another process maps one segment instead of one per tensor."""
    torch = _torch()
    parts = _shared.tensor_parts(batch)
    offsets, total = _shared.packed([t.numel() * t.element_size() for t in parts])
    segment = torch.empty(max(total, 1), dtype=torch.uint8).share_memory_()
    views = []
    for t, o in zip(parts, offsets):
        v = segment[o : o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        v.copy_(t)
        views.append(v)
    out: Dict[str, Any] = {}
    it = iter(views)
    for k, v in batch.items():
        if v.layout == torch.sparse_csr:
            out[k] = _csr_tensor(next(it), next(it), next(it), v.shape)
        else:
            out[k] = next(it)
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
            # The epoch and the number of states loaded, in shared memory: DataLoader's persistent workers keep
            # the copy of the dataset they were started with, and read the epoch set since from here (a state
            # loaded since cannot reach them: they say so).
            self._shared_epoch = torch.zeros(2, dtype=torch.int64)
            self._states_loaded = 0
            try:
                self._shared_epoch.share_memory_()
            except (RuntimeError, OSError) as e:
                _log.warning("no shared memory for the epoch (%s): persistent DataLoader workers would not see "
                             "set_epoch; use workers started for each epoch", e)

        _PICKLED_STATE = MinibatchIterable._PICKLED_STATE + ("_shared_epoch", "_states_loaded")

        def set_epoch(self, epoch: int) -> None:
            MinibatchIterable.set_epoch(self, epoch)
            self._shared_epoch[0] = epoch

        set_epoch.__doc__ = MinibatchIterable.set_epoch.__doc__

        def load_state_dict(self, state: Any, num_workers: Optional[int] = None) -> None:
            MinibatchIterable.load_state_dict(self, state, num_workers)
            self._states_loaded += 1
            self._shared_epoch[1] = self._states_loaded  # (its epoch, set_epoch has shared)

        load_state_dict.__doc__ = MinibatchIterable.load_state_dict.__doc__

        def __iter__(self) -> Iterator[Dict[str, Any]]:
            in_worker = _worker()[1] > 1 or sys.modules["torch.utils.data"].get_worker_info() is not None
            if in_worker:
                # DataLoader put a SIGBUS handler of its own in place of the one that turns a mapped CBF file
                # shrinking into an IoError (and hands it every other SIGBUS).
                _native.rearm_map_guard()
                if int(self._shared_epoch[1]) != self._states_loaded:
                    raise UsageError(
                        "load_state_dict was called after this DataLoader's persistent workers started: they "
                        "keep the dataset they started with; load the state before the DataLoader's first "
                        "iteration (or make a new DataLoader)"
                    )
                epoch = int(self._shared_epoch[0])
                if epoch != self.epoch:
                    MinibatchIterable.set_epoch(self, epoch)
            ring = _shared.ring() if in_worker else None
            for mb in self.minibatches():
                batch = _to_tensors(mb, self.layout, self.with_keys, self.sparse)
                # A DataLoader worker's batch goes to the main process through shared memory: a slot of the
                # worker's reused segments (module _shared), else one segment for the whole batch (DataLoader
                # would move each tensor to a fresh segment of its own).
                if ring is not None:
                    yield ring.put(batch)
                elif in_worker:
                    yield _in_one_shared_segment(batch)
                else:
                    yield batch

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
