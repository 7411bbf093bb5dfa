"""Grain: CNTK data as the source of a Grain pipeline, checkpointed with it.

::

    import grain
    import cntkio.grain

    ds = cntkio.grain.IterDataset(paths="train.cbf", batch_size=4096, shuffle=True, seed=1)
    ds = ds.map(augment)                      # any Grain transformation of the batch dicts
    it = iter(ds)
    for step, batch in zip(range(num_steps), it):
        state = train_step(state, batch["features"], batch["labels"])
    checkpoint = it.get_state()               # JSON; Orbax's Grain handler saves it with the model

:class:`IterDataset` is a ``grain.IterDataset`` whose elements are the batches of :class:`cntkio.Loader` (dicts
of NumPy arrays, in CNTK's order, assembled by native threads — no Grain worker processes are needed to read
them), one epoch after another: epoch ``e`` is CNTK's sweep ``e`` shuffled with ``seed + e``, as the loader's
:meth:`~cntkio.Loader.set_epoch` makes it. Under ``mp_prefetch`` each of Grain's worker processes reads one
partition of the rank's data, as a DataLoader worker does (CNTK's distributed reading). Its iterators' ``get_state()`` is the loader's state (small JSON)
and ``set_state()`` resumes exactly there, so Grain's checkpointing (``grain.checkpoint``, Orbax) continues an
interrupted run with the next batch it would have yielded. Grain is imported when a dataset is made.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterator, Optional

from cntkio import UsageError
from cntkio._loader import Loader, _positive

__all__ = ["IterDataset"]

_log = logging.getLogger(__name__)
_CLASSES: Optional[Dict[str, Any]] = None


def _grain() -> Any:
    try:
        import grain
    except ImportError:
        raise ImportError(
            "cntkio.grain needs Grain: pip install grain (or cntkio[grain]); cntkio.Loader gives the same batches "
            "without it"
        ) from None
    return grain


def _classes() -> Dict[str, Any]:
    """Makes the Grain classes on first use (they subclass Grain's)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    grain = _grain()

    class DatasetIterator(grain.DatasetIterator):  # type: ignore[misc,name-defined]
        """The batches of a :class:`cntkio.Loader`, epoch after epoch; its state is the loader's."""

        def __init__(self, loader: Loader, last_epoch: Optional[int]) -> None:
            super().__init__()
            self._loader = loader
            self._last_epoch = last_epoch  # the last epoch to read (None: no end)
            self._batches: Optional[Iterator[Dict[str, Any]]] = None
            self._read_any = False  # a batch came in the epochs since the last one that had none

        def __next__(self) -> Dict[str, Any]:
            loader = self._loader
            while True:
                if self._batches is None:
                    if self._last_epoch is not None and loader.epoch > self._last_epoch:
                        raise StopIteration
                    self._batches = iter(loader)
                batch = next(self._batches, None)
                if batch is not None:
                    self._read_any = True
                    return batch
                self._batches = None
                if not self._read_any and self._last_epoch is None:
                    _log.warning("cntkio.grain: epoch %d of rank %d holds no batch: the data ends here",
                                 loader.epoch, loader.rank)
                    raise StopIteration
                self._read_any = False
                loader.set_epoch(loader.epoch + 1)

        def get_state(self) -> Dict[str, Any]:
            """The loader's state (:meth:`cntkio.Loader.state_dict`): the epoch and the batches yielded of it."""
            return self._loader.state_dict()

        def set_state(self, state: Dict[str, Any]) -> None:
            """Continues after the batches a state (of :meth:`get_state`) counts, in its epoch."""
            self.close()
            self._loader.load_state_dict(state)
            self._read_any = True

        def close(self) -> None:
            if self._batches is not None:
                getattr(self._batches, "close", lambda: None)()
                self._batches = None

        def __str__(self) -> str:
            return f"cntkio.grain.DatasetIterator({self._loader!r})"

    class IterDataset(grain.IterDataset):  # type: ignore[misc,name-defined]
        """CNTK data as a ``grain.IterDataset`` of :class:`cntkio.Loader`'s batches (see :mod:`cntkio.grain`).

        Args:
            first_epoch: the epoch the iterators start at (default 0).
            num_epochs: how many epochs an iterator reads (default None: epoch after epoch, as a CNTK
                minibatch source repeats; it stops early only when an epoch holds no batch for this rank).
            **loader_args: those of :class:`cntkio.Loader` (``paths=``/``streams=`` or deserializers,
                ``batch_size``, ``shuffle``, ``seed``, the windows, ``rank``/``world_size``, ``layout``, …).
        """

        def __init__(self, deserializers: Any = None, *, first_epoch: int = 0, num_epochs: Optional[int] = None,
                     **loader_args: Any) -> None:
            super().__init__()
            if isinstance(first_epoch, bool) or not isinstance(first_epoch, int) or first_epoch < 0:
                raise UsageError(f"first_epoch must be a non-negative integer, found {first_epoch!r}")
            self.first_epoch = first_epoch
            self.num_epochs = None if num_epochs is None else _positive("num_epochs", num_epochs)
            self._args = dict(loader_args, deserializers=deserializers)
            loader = self._loader()  # opens the files and checks the arguments now
            self._args.update(rank=loader.rank, world_size=loader.world_size)

        def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
            """Reads one part of this rank's data: ``slice(w, None, n)`` is Grain's worker ``w`` of ``n``
            (``mp_prefetch``), which then reads partition ``rank × n + w`` of ``world_size × n``, as a
            DataLoader worker does (``sequential_slice`` changes nothing: the parts are CNTK's partitions)."""
            del sequential_slice
            n = 1 if sl.step is None else sl.step
            w = 0 if sl.start is None else sl.start
            if sl.stop is not None or n < 1 or not 0 <= w < n:
                raise UsageError(f"a cntkio.grain.IterDataset is split only as slice(w, None, n), not {sl!r}")
            rank, world = self._args["rank"], self._args["world_size"]
            self._args.update(rank=rank * n + w, world_size=world * n)

        def _loader(self) -> Loader:
            loader = Loader(**self._args)
            loader.set_epoch(self.first_epoch)
            return loader

        def __iter__(self) -> Any:
            last = None if self.num_epochs is None else self.first_epoch + self.num_epochs - 1
            return DatasetIterator(self._loader(), last)

        def __len__(self) -> int:
            """Batches of this rank in its epochs (``num_epochs`` needed; a loader's ``len()`` each)."""
            if self.num_epochs is None:
                raise TypeError("a cntkio.grain.IterDataset without num_epochs has no end")
            loader = self._loader()
            total = 0
            for e in range(self.first_epoch, self.first_epoch + self.num_epochs):
                loader.set_epoch(e)
                total += len(loader)
            return total

        def __str__(self) -> str:
            return f"cntkio.grain.IterDataset(first_epoch={self.first_epoch}, num_epochs={self.num_epochs})"

    for cls in (DatasetIterator, IterDataset):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__  # pickled by name (Grain's worker processes)
    _CLASSES = {"IterDataset": IterDataset, "DatasetIterator": DatasetIterator}
    return _CLASSES


def __getattr__(name: str) -> Any:
    if name in ("IterDataset", "DatasetIterator"):
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
