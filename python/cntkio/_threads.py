"""The default number of native threads of the loaders and minibatch sources."""

from __future__ import annotations

import os
from typing import Optional

from cntkio._errors import UsageError


def _env_int(name: str) -> Optional[int]:
    """The integer in environment variable ``name`` (None when unset or blank)."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        raise UsageError(f"environment variable {name}={v!r} is not an integer") from None


def default_threads() -> int:
    """``CNTKIO_THREADS`` if set; else the cores this process may run on (its CPU affinity, within its
    cgroup's CPU quota), shared with the other processes a launcher started on this machine: divided by
    ``LOCAL_WORLD_SIZE`` (set by ``torchrun``), unless the process has at most its share of the machine's
    cores already (a launcher that binds each process to cores of its own)."""
    n = _env_int("CNTKIO_THREADS")
    if n is not None and n > 0:
        return n
    from cntkio import _native

    cores = max(1, int(_native.available_cores()))
    local = _env_int("LOCAL_WORLD_SIZE") or 1
    machine = os.cpu_count() or cores
    if local > 1 and cores > machine // local:
        return max(1, cores // local)
    return cores
