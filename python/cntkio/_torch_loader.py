"""``cntkio.torch.Loader``: :class:`cntkio.Loader`'s batches as PyTorch tensors, optionally in page-locked
memory and copied to a device ahead of the training step."""

from __future__ import annotations

import collections
from typing import Any, Deque, Dict, Iterator, Optional, Tuple

import numpy as np

from cntkio import StreamData, UsageError
from cntkio._loader import Loader as _NumpyLoader

DEVICE_GROUP = 8
"""Minibatches copied to a device together (one copy per array) by ``cntkio.torch.Loader``."""

_CLASS: Any = None
_HOST_REGISTER: Any = False  # not looked up yet


def loader_class() -> Any:
    """Makes ``cntkio.torch.Loader`` on first use (it needs PyTorch)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make()
    return _CLASS


def cuda_host_register(torch: Any) -> Optional[Tuple[int, int]]:
    """The addresses of ``cudaHostRegister`` and ``cudaHostUnregister`` in the CUDA runtime library PyTorch
    loaded (found in ``/proc/self/maps``), or None where there is none to find (a runtime linked into
    PyTorch statically, another system): the loader's buffers are then copied into PyTorch's pinned memory
    instead of being page-locked where they are."""
    global _HOST_REGISTER
    if _HOST_REGISTER is not False:
        return _HOST_REGISTER
    _HOST_REGISTER = None
    try:
        import ctypes

        torch.cuda.init()
        with open("/proc/self/maps") as f:
            paths = [line.split(None, 5)[-1].strip() for line in f if "libcudart.so" in line]
        if paths:
            lib = ctypes.CDLL(paths[0])
            register = ctypes.cast(lib.cudaHostRegister, ctypes.c_void_p).value
            unregister = ctypes.cast(lib.cudaHostUnregister, ctypes.c_void_p).value
            if register and unregister:
                _HOST_REGISTER = (int(register), int(unregister))
    except (OSError, AttributeError, RuntimeError):
        pass
    return _HOST_REGISTER


def _make() -> Any:
    from cntkio import _feed
    from cntkio.torch import _to_tensors, _torch

    torch = _torch()

    def record(t: Any, stream: Any) -> None:
        """Marks ``t``'s memory as used by ``stream`` (the caching allocator then keeps it until the stream's
        work queued so far is done)."""
        if t.layout == torch.sparse_csr:
            for part in (t.crow_indices(), t.col_indices(), t.values()):
                part.record_stream(stream)
        else:
            t.record_stream(stream)

    def pinned(t: Any) -> Any:
        """``t`` in page-locked memory: itself when it is, else a pinned copy."""
        if t.layout == torch.sparse_csr:
            return t if t.values().is_pinned() else t.pin_memory()
        return t if t.is_pinned() else t.pin_memory()

    class Loader(_NumpyLoader):  # type: ignore[misc,valid-type]
        """:class:`cntkio.Loader` yielding dicts of PyTorch tensors: the dicts ``cntkio.torch.IterableDataset``
        yields (``NAME``, ``NAME_lengths``, ``NAME_mask`` with ``layout="padded"``, ``keys`` with
        ``with_keys=True``; sparse streams as ``torch.sparse_csr_tensor`` or, with ``sparse="dense"``, dense),
        in the same order, with no DataLoader needed.

        Tensors on the CPU share the loader's buffers (no copy); such a buffer is reused only once no tensor
        or array refers to it.

        Args (besides :class:`cntkio.Loader`'s):
            pin_memory: page-lock the batches (default: on when ``device`` is a CUDA device). The loader's
                buffers are locked where they are, once (``cudaHostRegister`` of the CUDA runtime PyTorch
                loaded), so pinning costs no copy; the few small arrays made per batch (lengths, masks) are
                copied into PyTorch's pinned memory when ``device`` is None. A warning, and no pinning, when
                CUDA is not available.
            device: ``None`` (CPU tensors), ``"cuda"``, ``"cuda:1"`` or a ``torch.device``: each batch is copied
                there on a side CUDA stream ``device_prefetch`` batches before it is yielded; a yielded batch
                is ready for work queued on the current stream (which waits for its copy), so the copies
                overlap the training step. Its host buffers are reused only once its copy is done.
            device_prefetch: batches copied ahead (default 2).
        """

        def __init__(
            self,
            deserializers: Any = None,
            *,
            pin_memory: Optional[bool] = None,
            device: Any = None,
            device_prefetch: int = 2,
            **kwargs: Any,
        ) -> None:
            if kwargs.get("sparse", "csr") not in ("csr", "dense"):
                raise UsageError(f"sparse must be 'csr' or 'dense', found {kwargs['sparse']!r}")
            super().__init__(deserializers, **kwargs)
            self.device = None if device is None else torch.device(device)
            cuda = self.device is not None and self.device.type == "cuda"
            if cuda and not torch.cuda.is_available():
                raise UsageError(f"device {device!r}: CUDA is not available")
            pin = cuda if pin_memory is None else bool(pin_memory)
            if pin and not torch.cuda.is_available():
                import warnings

                warnings.warn(
                    "cntkio.torch.Loader(pin_memory=True): no CUDA device, batches are not pinned", stacklevel=2
                )
                pin = False
            self.pin_memory = pin
            if isinstance(device_prefetch, bool) or not isinstance(device_prefetch, int) or device_prefetch < 1:
                raise UsageError(f"device_prefetch must be a positive integer, found {device_prefetch!r}")
            self.device_prefetch = device_prefetch

        def _loader_config(self) -> Dict[str, Any]:
            device = None if self.device is None else str(self.device)
            return dict(
                super()._loader_config(),
                pin_memory=self.pin_memory,
                device=device,
                device_prefetch=self.device_prefetch,
            )

        def _pool_options(self) -> Dict[str, Any]:
            if not self.pin_memory:
                return {}
            return {"cuda_host_register": cuda_host_register(torch)}

        def _grouped(self) -> bool:
            """Whether batches go to the device a group at a time: flat layout, every stream dense (or
            densified), on a CUDA device."""
            return (
                self.device is not None
                and self.device.type == "cuda"
                and self.layout == "flat"
                and (self.sparse == "dense" or not any(i.is_sparse for i in self._infos))
                and not self._options["truncation_length"]
            )

        def _group(self) -> int:
            return DEVICE_GROUP if self._grouped() else 1

        def _tensors(self) -> Iterator[Dict[str, Any]]:
            layout, sparse, with_keys = self.layout, self.sparse, self.with_keys
            for mb in self.minibatches():
                yield _to_tensors(mb, layout, with_keys, sparse)

        def __iter__(self) -> Iterator[Dict[str, Any]]:
            if self._grouped():
                return self._to_device(self.device, self._dense_groups())
            if self.device is not None and self.device.type == "cuda":
                return self._to_device(self.device, self._minibatch_items())
            if self.pin_memory:
                return ({k: pinned(v) for k, v in t.items()} for t in self._tensors())
            if self.device is not None:
                return ({k: v.to(self.device) for k, v in t.items()} for t in self._tensors())
            return self._tensors()

        def _minibatch_items(self) -> Iterator[Tuple[Dict[str, Any], Any, Any]]:
            """For :meth:`_to_device`: each minibatch's tensors, handed out (counted for :meth:`state_dict`)
            when it is yielded, not when it is copied ahead."""
            layout, sparse, with_keys = self.layout, self.sparse, self.with_keys
            for raw in self._raw_batches():
                for mb, position, n in _feed.minibatches_of(raw, self._infos):

                    def split(g: Dict[str, Any], position: str = position, n: int = n) -> Iterator[Dict[str, Any]]:
                        self._handed_out(position, n)
                        yield g

                    yield _to_tensors(mb, layout, with_keys, sparse), None, split

        def _dense_groups(self) -> Iterator[Tuple[Dict[str, Any], Any, Any]]:
            """For :meth:`_to_device`: each batch of the feed (a group of consecutive minibatches, dense
            streams) as its arrays, the lengths to take of the offsets once on the device, and the minibatches
            as views of the group's device tensors."""
            names = [i.name for i in self._infos]
            shapes = [i.sample_shape for i in self._infos]
            sparse = [i.is_sparse for i in self._infos]
            dims = [i.dim for i in self._infos]
            with_keys = self.with_keys
            for keys, _, streams, parts, _ in self._raw_batches():
                # Every array here views the feed's page-locked buffers (but a densified sparse stream): all
                # copies are asynchronous. Lengths are taken on the device.
                host: Dict[str, Any] = {}
                offsets = []
                for name, shape, is_sparse, dim, (values, offs, indices, indptr) in zip(
                    names, shapes, sparse, dims, streams
                ):
                    offs = offs.view(np.int64)
                    if is_sparse:
                        values = StreamData(name, dim, True, values, offs, indices, indptr).todense()
                    elif len(shape) != 1:
                        values = values.reshape((values.shape[0],) + tuple(shape))
                    host[name] = torch.from_numpy(values)
                    host[("offsets", name)] = torch.from_numpy(offs)  # a key no stream name can take
                    offsets.append(offs)
                if with_keys:
                    host["keys"] = torch.from_numpy(keys.view(np.int64))

                def lengths(g: Dict[str, Any]) -> None:
                    for name in names:
                        o = g.pop(("offsets", name))
                        g[f"{name}_lengths"] = o[1:] - o[:-1]

                def split(g: Dict[str, Any], parts: Any = parts, offsets: Any = offsets) -> Iterator[Dict[str, Any]]:
                    first = 0
                    for n, _, _, position in parts:
                        end = first + n
                        out: Dict[str, Any] = {}
                        for name, offs in zip(names, offsets):
                            out[name] = g[name][int(offs[first]) : int(offs[end])]
                            out[f"{name}_lengths"] = g[f"{name}_lengths"][first:end]
                        if with_keys:
                            out["keys"] = g["keys"][first:end]
                        self._handed_out(position, n)
                        yield out
                        first = end

                yield host, lengths, split

        def _to_device(self, device: Any, items: Iterator[Tuple[Dict[str, Any], Any, Any]]) -> Iterator[Dict[str, Any]]:
            """Copies each item's host tensors to ``device`` on a side stream, ``device_prefetch`` items before
            they are used; an item is ``(host tensors, then, split)``: ``then(g)`` runs on the side stream
            after the copies (or None), ``split(g)`` gives the batches to yield of the copied dict ``g``. A
            yielded batch is ready for work on the current stream (which waits for the copy's event); the host
            tensors are kept, their buffers not reused, until their copy is done."""
            stream = torch.cuda.Stream(device)
            ahead: Deque[Tuple[Dict[str, Any], Any, Any]] = collections.deque()
            copying: Deque[Tuple[Any, Dict[str, Any]]] = collections.deque()
            try:
                while True:
                    item = next(items, None)
                    if item is not None:
                        host, then, split = item
                        with torch.cuda.stream(stream):
                            g = {k: v.to(device, non_blocking=True) for k, v in host.items()}
                            if then is not None:
                                then(g)
                            event = torch.cuda.Event()
                            event.record(stream)
                        ahead.append((g, event, split))
                        copying.append((event, host))
                    while copying and (copying[0][0].query() or len(copying) > 2 * self.device_prefetch + 2):
                        copying[0][0].synchronize()
                        copying.popleft()
                    if not ahead or (item is not None and len(ahead) <= self.device_prefetch):
                        if item is None:
                            return
                        continue
                    g, event, split = ahead.popleft()
                    current = torch.cuda.current_stream(device)
                    current.wait_event(event)
                    for v in g.values():
                        record(v, current)
                    yield from split(g)
            finally:
                for event, _ in copying:
                    event.synchronize()
                items.close()

    Loader.__module__ = "cntkio.torch"
    Loader.__qualname__ = "Loader"
    return Loader
