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
                return self._groups_on_cuda(self.device)
            if self.device is not None and self.device.type == "cuda":
                return self._on_cuda(self.device)
            if self.pin_memory:
                return ({k: pinned(v) for k, v in t.items()} for t in self._tensors())
            if self.device is not None:
                return ({k: v.to(self.device) for k, v in t.items()} for t in self._tensors())
            return self._tensors()

        def _on_cuda(self, device: Any) -> Iterator[Dict[str, Any]]:
            """The batches copied to ``device`` on a side stream, ``device_prefetch`` ahead of the one yielded."""
            stream = torch.cuda.Stream(device)
            ahead: Deque[Tuple[Dict[str, Any], Any]] = collections.deque()
            # Host batches whose copies may still run: kept (their buffers not reused) until their event is done.
            copying: Deque[Tuple[Any, Dict[str, Any]]] = collections.deque()
            source = self._tensors()
            try:
                while True:
                    t = next(source, None)
                    if t is not None:
                        with torch.cuda.stream(stream):
                            g = {k: v.to(device, non_blocking=True) for k, v in t.items()}
                            event = torch.cuda.Event()
                            event.record(stream)
                        ahead.append((g, event))
                        copying.append((event, t))
                    while copying and (copying[0][0].query() or len(copying) > 2 * self.device_prefetch + 2):
                        copying[0][0].synchronize()
                        copying.popleft()
                    if not ahead or (t is not None and len(ahead) <= self.device_prefetch):
                        if t is None:
                            return
                        continue
                    g, event = ahead.popleft()
                    current = torch.cuda.current_stream(device)
                    current.wait_event(event)
                    for v in g.values():
                        record(v, current)
                    yield g
            finally:
                for event, _ in copying:
                    event.synchronize()
                source.close()

        def _groups_on_cuda(self, device: Any) -> Iterator[Dict[str, Any]]:
            """The batches copied to ``device`` a group of consecutive minibatches at a time (one copy per
            array), ``device_prefetch`` groups ahead; each minibatch is yielded as views of its group's
            tensors, so that handing out a minibatch costs a few slices."""
            stream = torch.cuda.Stream(device)
            names = [i.name for i in self._infos]
            shapes = [i.sample_shape for i in self._infos]
            sparse = [i.is_sparse for i in self._infos]
            dims = [i.dim for i in self._infos]
            with_keys = self.with_keys
            ahead: Deque[Tuple[Dict[str, Any], Any, Any, Any]] = collections.deque()
            copying: Deque[Tuple[Any, Any]] = collections.deque()
            source = self._raw_batches()
            try:
                while True:
                    raw = next(source, None)
                    if raw is not None:
                        keys, _, streams, parts, _ = raw
                        # Every array here views the feed's page-locked buffers (but a densified sparse
                        # stream): all copies are asynchronous. Lengths are taken on the device.
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
                            host[f"{name}_offsets"] = torch.from_numpy(offs)
                            offsets.append(offs)
                        if with_keys:
                            host["keys"] = torch.from_numpy(keys.view(np.int64))
                        with torch.cuda.stream(stream):
                            g = {k: v.to(device, non_blocking=True) for k, v in host.items()}
                            for name in names:
                                o = g.pop(f"{name}_offsets")
                                g[f"{name}_lengths"] = o[1:] - o[:-1]
                            event = torch.cuda.Event()
                            event.record(stream)
                        ahead.append((g, event, parts, offsets))
                        copying.append((event, host))
                    while copying and (copying[0][0].query() or len(copying) > 2 * self.device_prefetch + 2):
                        copying[0][0].synchronize()
                        copying.popleft()
                    if not ahead or (raw is not None and len(ahead) <= self.device_prefetch):
                        if raw is None:
                            return
                        continue
                    g, event, parts, offsets = ahead.popleft()
                    current = torch.cuda.current_stream(device)
                    current.wait_event(event)
                    for v in g.values():
                        v.record_stream(current)
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
            finally:
                for event, _ in copying:
                    event.synchronize()
                source.close()

    Loader.__module__ = "cntkio.torch"
    Loader.__qualname__ = "Loader"
    return Loader
