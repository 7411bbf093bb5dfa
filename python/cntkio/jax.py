"""JAX: CNTK data as batches of ``jax.Array``, on a device or sharded across devices and processes.

::

    import cntkio.jax

    loader = cntkio.jax.Loader(paths="train.cbf", batch_size=4096, shuffle=True, seed=1, pad_to=4096)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for batch in loader:                  # jax.Arrays, the same shapes every step: jit compiles once
            state = train_step(state, batch["features"], batch["labels"], batch["features_mask"])

:class:`Loader` is :class:`cntkio.Loader` (CNTK's minibatch source on native threads, the same sequences, keys,
values and order as ``cntkio batches``) with the arrays of each batch placed on a JAX device, or laid out
across devices by a ``jax.sharding.Sharding``, ``device_prefetch`` batches ahead of the step
(``jax.device_put`` is asynchronous, so the copies overlap the step). JAX is imported when a loader is made.

**Shapes.** ``jax.jit`` compiles a function once per shape, and CNTK's batches hold whole sequences, so their
sample counts vary. ``pad_to=N`` pads every batch's first axis (samples with ``layout="flat"``, sequences with
``layout="padded"``) with zeros up to a multiple of ``N`` — ``N`` itself for every batch of at most ``N``
samples — and adds ``NAME_mask`` (True at real samples) to the flat layout; ``pad_length=L`` pads the padded
layout's time axis up to a multiple of ``L``. The values before the padding are the batch's, unchanged.

**Many devices and processes.** With ``sharding`` (``NamedSharding(mesh, P("data"))``, say) every array of a
batch is laid out along its first axis across the sharding's devices; give ``pad_to`` a multiple of their
number. In a multi-process run (``jax.distributed.initialize``) each process reads its own partition of the
data (``rank`` / ``world_size`` default to ``jax.process_index()`` / ``jax.process_count()``) and the batch is
the global array made of every process's part (``jax.make_array_from_process_local_data``), which needs the
same shapes in every process: ``pad_to`` (and ``pad_length`` with the padded layout). Every process yields as
many batches an epoch (the processes share their counts at its start): one whose partition ends first yields
batches of padding only (masks all False, lengths 0, no keys) until the others end, so that none waits in a
step the others no longer take. ``balanced_workers=True`` gives every process the same number of sequences
(±1), and so the fewest such batches.

**Types.** Values keep their type; ``float64`` streams (``precision="double"``) need
``jax.config.update("jax_enable_x64", True)``, as JAX would otherwise round them to ``float32``. Lengths are
JAX's default integer (``int32`` unless 64-bit mode is on). ``keys`` (``with_keys=True``) stay a NumPy
``int64`` array of this process's sequences (keys need 64 bits; they are for bookkeeping, not the step).
Sparse streams are densified.
"""

from __future__ import annotations

import collections
from typing import Any, Deque, Dict, Iterator, Optional, Tuple

import numpy as np

from cntkio import UsageError, _feed
from cntkio._loader import Loader as _NumpyLoader
from cntkio._loader import _positive, _to_arrays

__all__ = ["Loader"]


def _jax() -> Any:
    try:
        import jax
    except ImportError:
        raise ImportError(
            "cntkio.jax.Loader needs JAX: pip install jax (or cntkio[jax]); cntkio.Loader gives the same batches "
            "as NumPy arrays without it"
        ) from None
    return jax


def _bucket(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    return max(1, -(-n // multiple)) * multiple


def _pad_axis(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``a`` with zeros appended along ``axis`` up to ``size`` (``a`` itself when it has that size)."""
    if a.shape[axis] == size:
        return a
    shape = list(a.shape)
    shape[axis] = size
    out = np.zeros(shape, dtype=a.dtype)
    out[tuple(slice(0, n) for n in a.shape)] = a
    return out


class Loader(_NumpyLoader):  # type: ignore[misc]
    """:class:`cntkio.Loader` yielding dicts of ``jax.Array`` (see the module docs): ``NAME``, ``NAME_lengths``,
    ``NAME_mask`` (with ``layout="padded"``, and with ``pad_to``), and ``keys`` (``with_keys=True``, NumPy), in
    the order of :class:`cntkio.Loader` for the same options.

    Args (besides :class:`cntkio.Loader`'s; ``sparse`` is ``"dense"``):
        device: a ``jax.Device`` or a platform name (``"cpu"``, ``"gpu"``, ``"tpu"``: its first device);
            default JAX's default device.
        sharding: instead of ``device``, a ``jax.sharding.Sharding`` laying each array out along its first
            axis (needs ``pad_to``); one spanning several processes makes global arrays of every process's
            batch.
        device_prefetch: batches placed on the device ahead of the one yielded (default 2).
        pad_to: pad the first axis of every array to a multiple of this (see the module docs).
        pad_length: with ``layout="padded"``, pad the time axis to a multiple of this.
    """

    def __init__(
        self,
        deserializers: Any = None,
        *,
        device: Any = None,
        sharding: Any = None,
        device_prefetch: int = 2,
        pad_to: Optional[int] = None,
        pad_length: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        jax = _jax()
        sparse = kwargs.pop("sparse", "dense")
        if sparse != "dense":
            raise UsageError(
                f"cntkio.jax.Loader densifies sparse streams (sparse='dense'), found sparse={sparse!r}: JAX's "
                "sparse arrays are experimental; cntkio.Loader gives CSR arrays"
            )
        if device is not None and sharding is not None:
            raise UsageError("give device or sharding, not both")
        if isinstance(device, str):
            try:
                device = jax.devices(device)[0]
            except RuntimeError as e:
                raise UsageError(f"device {device!r}: {e}") from None
        elif device is not None and not isinstance(device, jax.Device):
            raise UsageError(f"device must be a jax.Device or a platform name, found {device!r}")
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            raise UsageError(f"sharding must be a jax.sharding.Sharding, found {sharding!r}")
        self.device_prefetch = _positive("device_prefetch", device_prefetch)
        self.pad_to = None if pad_to is None else _positive("pad_to", pad_to)
        self.pad_length = None if pad_length is None else _positive("pad_length", pad_length)
        if sharding is not None and self.pad_to is None:
            raise UsageError(
                "a sharding splits every batch across devices, which needs the same shapes each batch: give pad_to "
                f"(a multiple of the sharding's {len(sharding.device_set)} devices)"
            )
        if self.pad_length is not None and kwargs.get("layout", "flat") != "padded":
            raise UsageError("pad_length pads the time axis of layout='padded'; the flat layout has none (pad_to)")
        # Global arrays of every process's part: each process reads its own partition.
        self._global = sharding is not None and not sharding.is_fully_addressable
        if self._global:
            if kwargs.get("layout") == "padded" and self.pad_length is None:
                raise UsageError(
                    "a sharding spanning processes needs the same shapes in every process: with layout='padded' "
                    "give pad_length too"
                )
            if kwargs.get("truncation_length"):
                raise UsageError(
                    "a sharding spanning processes needs every process to run the same number of batches, which "
                    "truncated BPTT knows only when read: use one loader per process with its own device"
                )
            if kwargs.get("rank") is None and kwargs.get("world_size") is None:
                kwargs["rank"], kwargs["world_size"] = jax.process_index(), jax.process_count()
        self.device = device
        self.sharding = sharding
        super().__init__(deserializers, sparse="dense", **kwargs)
        wide = [i.name for i in self._infos if np.dtype(i.dtype) == np.float64]
        if wide and jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
            raise UsageError(
                f"stream(s) {wide} hold float64 values, which JAX would round to float32: enable 64-bit mode "
                "(jax.config.update('jax_enable_x64', True)) or read them with precision='float'"
            )
        self._int = np.dtype(jax.dtypes.canonicalize_dtype(np.int64))

    # ---- iteration --------------------------------------------------------------------------------------
    def _host(self, mb: Any) -> Dict[str, Any]:
        """The NumPy arrays of a minibatch, padded as asked, lengths in JAX's integer type."""
        out = _to_arrays(mb, self.layout, self.with_keys, "dense")
        pad_to, pad_length = self.pad_to, self.pad_length
        for name in [i.name for i in self._infos]:
            lengths = out[f"{name}_lengths"].astype(self._int, copy=False)
            values = out[name]
            if self.layout == "padded":
                mask = out[f"{name}_mask"]
                if pad_length is not None:
                    width = _bucket(values.shape[1], pad_length)
                    values, mask = _pad_axis(values, 1, width), _pad_axis(mask, 1, width)
                if pad_to is not None:
                    rows = _bucket(values.shape[0], pad_to)
                    values, mask, lengths = (_pad_axis(a, 0, rows) for a in (values, mask, lengths))
                out[f"{name}_mask"] = mask
            elif pad_to is not None:
                n = values.shape[0]
                rows = _bucket(n, pad_to)
                values = _pad_axis(values, 0, rows)
                out[f"{name}_mask"] = np.arange(rows) < n
                lengths = _pad_axis(lengths, 0, _bucket(lengths.shape[0], pad_to))
            if self._global and values.shape[0] != pad_to:
                raise UsageError(
                    f"a batch holds {values.shape[0]} rows of stream {name!r}, more than pad_to={pad_to}: the "
                    "processes of a sharding need the same shapes; give pad_to at least the largest batch"
                )
            if self._global and self.layout == "padded" and values.shape[1] != pad_length:
                raise UsageError(
                    f"a batch holds a sequence of {values.shape[1]} samples of stream {name!r}, longer than "
                    f"pad_length={pad_length}: the processes of a sharding need the same shapes; give pad_length "
                    "at least the longest sequence"
                )
            out[name] = values
            out[f"{name}_lengths"] = lengths
        return out

    def _placer(self) -> Any:
        """The function placing one host array where the batches go."""
        jax = _jax()
        if self._global:
            sharding = self.sharding
            return lambda a: jax.make_array_from_process_local_data(sharding, a)
        where = self.sharding if self.sharding is not None else self.device
        return lambda a: jax.device_put(a, where)

    def _place(self, place: Any, host: Dict[str, Any]) -> Dict[str, Any]:
        try:
            return {k: v if k == "keys" else place(v) for k, v in host.items()}
        except ValueError as e:
            if self.sharding is not None and "divide" in str(e):
                raise UsageError(
                    f"a batch cannot be laid out by the sharding ({e}): pad_to={self.pad_to} must be a multiple of "
                    "the number of devices the first axis is split over"
                ) from None
            raise

    def _empty(self) -> Dict[str, Any]:
        """A batch of padding only (every mask False, lengths 0), shaped as the padded batches."""
        assert self.pad_to is not None
        rows = self.pad_to
        out: Dict[str, Any] = {}
        for i in self._infos:
            steps = () if self.layout == "flat" else (self.pad_length or 1,)
            out[i.name] = np.zeros((rows,) + steps + tuple(i.sample_shape), dtype=i.dtype)
            out[f"{i.name}_lengths"] = np.zeros(rows, dtype=self._int)
            out[f"{i.name}_mask"] = np.zeros((rows,) + steps, dtype=bool)
        if self.with_keys:
            out["keys"] = np.zeros(0, dtype=np.int64)
        return out

    def _batches_of_every_process(self) -> int:
        """The most batches any process has left of this epoch (an all-gather over the processes)."""
        from jax.experimental import multihost_utils

        resume = self._resume
        skipped = resume[1] if resume is not None and resume[0] == self.epoch else 0
        left = np.array(len(self) - skipped, dtype=np.int32)
        return int(np.max(multihost_utils.process_allgather(left)))

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        place = self._placer()
        # Every process yields as many batches: one whose partition ends first pads with empty batches, so
        # that no process waits forever in a step the others no longer take.
        total = self._batches_of_every_process() if self._global else None
        ahead: Deque[Tuple[Dict[str, Any], Optional[str], int]] = collections.deque()
        raw = self._raw_batches()
        yielded = 0
        try:
            for r in raw:
                for mb, position, n in _feed.minibatches_of(r, self._infos):
                    # Placed now (asynchronously), handed out (counted for state_dict) when yielded.
                    ahead.append((self._place(place, self._host(mb)), position, n))
                    if len(ahead) > self.device_prefetch:
                        batch, position, n = ahead.popleft()
                        self._handed_out(position, n)
                        yielded += 1
                        yield batch
            if total is not None and yielded + len(ahead) < total:
                empty = self._empty()
                for _ in range(total - yielded - len(ahead)):
                    ahead.append((self._place(place, empty), None, 0))
            while ahead:
                batch, position, n = ahead.popleft()
                if position is not None:
                    self._handed_out(position, n)
                yield batch
        finally:
            raw.close()

    # ---- pickling ---------------------------------------------------------------------------------------
    def _loader_config(self) -> Dict[str, Any]:
        if self.device is not None or self.sharding is not None:
            raise TypeError(
                "a cntkio.jax.Loader given a device or a sharding cannot be pickled (JAX devices cannot be): make "
                "it in the process that uses it"
            )
        config = dict(
            super()._loader_config(),
            device_prefetch=self.device_prefetch,
            pad_to=self.pad_to,
            pad_length=self.pad_length,
        )
        config.pop("sparse")
        return config
