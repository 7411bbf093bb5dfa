"""``cntkio.torch.Loader``: :class:`cntkio.Loader`'s batches as PyTorch tensors, optionally page-locked and
moved to a device while the training step runs."""

from __future__ import annotations

import queue
import threading
from typing import Any, Dict, Iterator, Optional

from cntkio import UsageError
from cntkio._loader import Loader as _NumpyLoader

_END = object()
_CLASS: Any = None


def loader_class() -> Any:
    """Makes ``cntkio.torch.Loader`` on first use (it needs PyTorch)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make()
    return _CLASS


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

    class Loader(_NumpyLoader):  # type: ignore[misc,valid-type]
        """:class:`cntkio.Loader` yielding dicts of PyTorch tensors: the dicts ``cntkio.torch.IterableDataset``
        yields (``NAME``, ``NAME_lengths``, ``NAME_mask`` with ``layout="padded"``, ``keys`` with
        ``with_keys=True``; sparse streams as ``torch.sparse_csr_tensor`` or, with ``sparse="dense"``, dense),
        in the same order, with no DataLoader needed.

        Tensors on the CPU share the loader's buffers (no copy); such a buffer is reused only once no tensor
        or array refers to it.

        Args (besides :class:`cntkio.Loader`'s):
            pin_memory: copy each batch into page-locked memory (PyTorch's pinned-memory cache), so that
                copies to a GPU are asynchronous. Default: on when ``device`` is a CUDA device. Ignored, with
                a warning, when CUDA is not available.
            device: ``None`` (CPU tensors), ``"cuda"``, ``"cuda:1"`` or a ``torch.device``: batches are
                copied there on a side CUDA stream by a background thread, ``device_prefetch`` batches
                ahead; a yielded batch is ready for work queued on the current stream (it waits for the
                copy's event), so the copy of the next batches overlaps the training step.
            device_prefetch: batches pinned or copied ahead (default 2).
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

                warnings.warn("cntkio.torch.Loader(pin_memory=True): no CUDA device, batches are not pinned",
                              stacklevel=2)
                pin = False
            self.pin_memory = pin
            if isinstance(device_prefetch, bool) or not isinstance(device_prefetch, int) or device_prefetch < 1:
                raise UsageError(f"device_prefetch must be a positive integer, found {device_prefetch!r}")
            self.device_prefetch = device_prefetch

        def _tensors(self) -> Iterator[Dict[str, Any]]:
            layout, sparse, with_keys = self.layout, self.sparse, self.with_keys
            for mb in self.minibatches():
                yield _to_tensors(mb, layout, with_keys, sparse)

        def __iter__(self) -> Iterator[Dict[str, Any]]:
            if self.device is None and not self.pin_memory:
                return self._tensors()
            return self._moved()

        def _moved(self) -> Iterator[Dict[str, Any]]:
            """The batches pinned and/or moved to the device by a background thread."""
            device, pin = self.device, self.pin_memory
            cuda = device is not None and device.type == "cuda"
            stream = torch.cuda.Stream(device) if cuda else None
            q: "queue.Queue[Any]" = queue.Queue(maxsize=self.device_prefetch)
            stop = threading.Event()
            source = self._tensors()

            def put(item: Any) -> bool:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        return True
                    except queue.Full:
                        continue
                return False

            def work() -> None:
                try:
                    for t in source:
                        if pin:
                            t = {k: v.pin_memory() for k, v in t.items()}
                        event = None
                        if cuda:
                            with torch.cuda.stream(stream):
                                t = {k: v.to(device, non_blocking=True) for k, v in t.items()}
                                event = torch.cuda.Event()
                                event.record(stream)
                        elif device is not None:
                            t = {k: v.to(device) for k, v in t.items()}
                        if not put((t, event)):
                            return
                    put(_END)
                except BaseException as e:  # handed to the consumer, raised there
                    put(e)
                finally:
                    source.close()

            worker = threading.Thread(target=work, name="cntkio-device-copy", daemon=True)
            worker.start()
            try:
                while True:
                    item = q.get()
                    if item is _END:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    t, event = item
                    if event is not None:
                        current = torch.cuda.current_stream(device)
                        current.wait_event(event)
                        for v in t.values():
                            record(v, current)
                    yield t
            finally:
                stop.set()
                worker.join()

    Loader.__module__ = "cntkio.torch"
    Loader.__qualname__ = "Loader"
    return Loader
