"""Batches of DataLoader workers sent to the main process through shared memory that is reused.

PyTorch's DataLoader moves each tensor a worker yields to a shared-memory segment of its own, created for that
batch, and the main process maps every one of them: for batches of a few MB that costs more than reading them.
A worker of ``cntkio.torch.IterableDataset`` instead copies each batch into a slot of its ring of segments
(files under ``/dev/shm``, made once and reused) and yields a :class:`Ticket`: in the worker, the batch's dict
of tensors (views of the slot), which a ``collate_fn`` or a wrapping dataset may read or change like any
batch; sent unchanged through a multiprocessing queue (DataLoader's, whose pickler is ``ForkingPickler``),
only a reference to the slot, which the main process turns back into the batch's dict of tensors viewing the
slot (its segment mapped once per process). A ticket changed (an entry added, removed or replaced) is sent
as a plain dict, and any other pickle of a ticket (``pickle.dumps`` in user code) is a plain dict of its
tensors: only a queue's receiver gives the slot back.

A slot is reused only once neither process holds anything of the batch in it. The flags segment has two
bytes per slot, each written by one process only: the worker's, cleared when the last of the worker's
arrays, tensors or views of the batch is gone, and the main process's, set by the worker when it sends the
ticket and cleared by the main process when the last of its arrays of the batch is gone. A worker that finds
no free slot makes another, so a program that keeps batches only costs memory. The segments are removed
when the worker process exits.
"""

from __future__ import annotations

import mmap
import os
import secrets
from collections import OrderedDict
from multiprocessing.reduction import ForkingPickler
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

SHM_DIR = "/dev/shm"
MAX_SLOTS = 1024
"""Slots a worker's ring may grow to (a slot per batch the main process holds at once)."""
_ALIGN = 64
_MAPPED_CAP = 64
"""Segments the main process keeps mapped for reuse (arrays keep theirs mapped as long as they live)."""


def available() -> bool:
    """Whether this system has POSIX shared memory files (Linux)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def _create(size: int) -> Tuple[str, mmap.mmap]:
    name = f"cntkio-{os.getpid()}-{secrets.token_hex(6)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        # Room taken now: a full /dev/shm is an error here, not a SIGBUS when the map is written.
        os.posix_fallocate(fd, 0, size)
        return path, mmap.mmap(fd, size)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def tensor_parts(batch: Dict[str, Any]) -> List[Any]:
    """The dense tensors holding ``batch``'s data, in order: each tensor, or a sparse CSR tensor's row
    offsets, column indices and values."""
    import torch

    parts: List[Any] = []
    for v in batch.values():
        if v.layout == torch.sparse_csr:
            parts.extend((v.crow_indices(), v.col_indices(), v.values()))
        else:
            parts.append(v)
    return parts


def packed(sizes: List[int]) -> Tuple[List[int], int]:
    """Offsets of parts of ``sizes`` bytes laid one after another at 64-byte boundaries, and the total."""
    offsets = []
    total = 0
    for n in sizes:
        offsets.append(total)
        total += (n + _ALIGN - 1) // _ALIGN * _ALIGN
    return offsets, total


class Ring:
    """A worker's slots (one segment each) and the flags segment the main process frees them in."""

    def __init__(self) -> None:
        self.flags_path, self._flags_map = _create(2 * MAX_SLOTS)
        self.flags = np.frombuffer(self._flags_map, dtype=np.uint8)
        self.slots: List[Tuple[str, mmap.mmap]] = []
        self._paths = [self.flags_path]

    def _slot(self, size: int) -> Optional[int]:
        """A free slot of at least ``size`` bytes (a free one grown, or a new one); None when the ring is full
        of batches the main process still holds."""
        flags = self.flags
        free = [i for i in range(len(self.slots)) if flags[_WORKER + 2 * i] == 0 and flags[_MAIN + 2 * i] == 0]
        for i in free:
            if len(self.slots[i][1]) >= size:
                return i
        if free:
            i = free[0]
        elif len(self.slots) < MAX_SLOTS:
            i = len(self.slots)
        else:
            return None
        try:
            path, mm = _create(max(size, 1) + size // 4)
        except OSError:
            return None  # no room in /dev/shm: this batch goes the ordinary way
        self._paths.append(path)
        if i == len(self.slots):
            self.slots.append((path, mm))
        else:
            # A free slot too small for this batch: the main process holds nothing of it any more.
            self._unlink(self.slots[i][0])
            self.slots[i] = (path, mm)
        return i

    def _unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if path in self._paths:
            self._paths.remove(path)

    def put(self, batch: Dict[str, Any]) -> Any:
        """A :class:`Ticket` for ``batch`` (a dict of CPU tensors) copied into a slot, or ``batch`` itself when
        no slot can be had (the ring is full of batches still held, or /dev/shm is full)."""
        import torch

        arrays = [p.numpy() for p in tensor_parts(batch)]
        offsets, total = packed([a.nbytes for a in arrays])
        slot = self._slot(total)
        if slot is None:
            return batch
        path, mm = self.slots[slot]
        self.flags[_WORKER + 2 * slot] = 1
        lease = _Lease(self.flags, _WORKER + 2 * slot)
        specs = []
        for a, o in zip(arrays, offsets):
            dst = np.frombuffer(mm, dtype=a.dtype, count=a.size, offset=o).reshape(a.shape)
            np.copyto(dst, a)
            specs.append((a.dtype.str, a.shape, o))
        layout = []
        it = iter(specs)
        for k, v in batch.items():
            if v.layout == torch.sparse_csr:
                layout.append((k, tuple(v.shape), (next(it), next(it), next(it))))
            else:
                layout.append((k, None, (next(it),)))
        batch = _batch_of(mm, layout, lease)
        return Ticket(batch, _SlotRef(self.flags, self.flags_path, slot, path, layout, list(batch.items())))

    def close(self) -> None:
        """Removes the ring's files (mappings stay valid where they are)."""
        for p in list(self._paths):
            self._unlink(p)


_WORKER = 0
_MAIN = 1
"""A slot's bytes in the flags segment: ``flags[2 * slot + _WORKER]`` and ``flags[2 * slot + _MAIN]``."""


class Ticket(dict):  # type: ignore[type-arg]
    """A batch in a slot of a worker's ring (see the module docs): in the worker, the batch's dict of tensors
    viewing the slot; pickled unchanged, a reference to the slot, unpickled as the batch's dict of tensors.

    A copy (``copy.copy``, as DataLoader's ``default_convert`` makes) refers to the same slot; of a ticket
    and its copies, the first pickled unchanged sends the reference, and any later one sends its tensors."""

    __slots__ = ("_slot",)

    def __init__(self, batch: Dict[str, Any], slot: "_SlotRef") -> None:
        super().__init__(batch)
        self._slot = slot

    def _unchanged(self) -> bool:
        parts = self._slot.parts
        return len(self) == len(parts) and all(k in self and self[k] is v for k, v in parts)

    def __copy__(self) -> "Ticket":
        return Ticket(self, self._slot)

    def __deepcopy__(self, memo: Dict[int, Any]) -> Dict[str, Any]:
        import copy

        return copy.deepcopy(dict(self), memo)

    def __reduce__(self) -> Any:
        # Pickled other than by a multiprocessing queue: nothing would give the slot back.
        return (dict, (dict(self),))

    def _reduce_for_queue(self) -> Any:
        """The reduction of a ticket sent through a multiprocessing queue (``ForkingPickler``'s)."""
        r = self._slot
        if r.sent or not self._unchanged():
            return (dict, (dict(self),))  # changed by the worker, or sent already: its tensors go the ordinary way
        # The main process holds the slot from now until it drops the batch.
        r.sent = True
        r.flags[_MAIN + 2 * r.slot] = 1
        return (_open_batch, (r.flags_path, r.slot, r.path, r.layout))


ForkingPickler.register(Ticket, Ticket._reduce_for_queue)


class _SlotRef:
    """What the tickets of one batch share: where it lies, the tensors it was made with, and whether its slot
    was sent."""

    __slots__ = ("flags", "flags_path", "slot", "path", "layout", "parts", "sent")

    def __init__(self, flags: Any, flags_path: str, slot: int, path: str, layout: List[Any],
                 parts: List[Tuple[str, Any]]) -> None:
        self.flags = flags
        self.flags_path = flags_path
        self.slot = slot
        self.path = path
        self.layout = layout
        self.parts = parts
        self.sent = False


class _Lease:
    """Clears a slot's byte of one process (``flags[index]``) when the last array of its batch in that process
    is gone."""

    __slots__ = ("flags", "index")

    def __init__(self, flags: Any, index: int) -> None:
        self.flags = flags
        self.index = index

    def __del__(self) -> None:
        try:
            self.flags[self.index] = 0
        except Exception:  # interpreter shutdown: nothing reads the flags any more
            pass


class _Leased(np.ndarray):
    """An array of a slot, holding the slot's lease."""


_MAPPED: "OrderedDict[str, mmap.mmap]" = OrderedDict()


def _mapped(path: str) -> mmap.mmap:
    mm = _MAPPED.get(path)
    if mm is None:
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        _MAPPED[path] = mm
        while len(_MAPPED) > _MAPPED_CAP:
            _MAPPED.popitem(last=False)
    else:
        _MAPPED.move_to_end(path)
    return mm


def _open_batch(flags_path: str, slot: int, path: str, layout: List[Any]) -> Dict[str, Any]:
    """The batch of a ticket (in the main process): tensors viewing the slot, leasing it."""
    lease = _Lease(np.frombuffer(_mapped(flags_path), dtype=np.uint8), _MAIN + 2 * slot)
    return _batch_of(_mapped(path), layout, lease)


def _batch_of(mm: mmap.mmap, layout: List[Any], lease: _Lease) -> Dict[str, Any]:
    """The dict of tensors of a batch laid out in ``mm`` as ``layout`` says, every array holding ``lease``."""
    import torch

    def tensor(spec: Any) -> Any:
        dtype, shape, offset = spec
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        a = np.frombuffer(mm, dtype=dt, count=count, offset=offset).reshape(shape).view(_Leased)
        a._lease = lease  # type: ignore[attr-defined]
        return torch.from_numpy(a)

    out: Dict[str, Any] = {}
    for key, size, specs in layout:
        if size is None:
            out[key] = tensor(specs[0])
        else:
            from cntkio.torch import _csr_tensor

            out[key] = _csr_tensor(tensor(specs[0]), tensor(specs[1]), tensor(specs[2]), size)
    return out


_RING: Optional[Tuple[int, Ring]] = None


def ring() -> Optional[Ring]:
    """This process's ring (made on first use; its files are removed when the process exits), or None where
    shared memory files cannot be made."""
    global _RING
    if not available():
        return None
    if _RING is None or _RING[0] != os.getpid():
        try:
            r = Ring()
        except OSError:
            return None
        from multiprocessing import util

        util.Finalize(r, r.close, exitpriority=10)
        _RING = (os.getpid(), r)
    return _RING[1]
