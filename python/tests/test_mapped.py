"""CBF files read through a memory map (the default): a file that becomes shorter while it is read raises
IoError naming it, in the process and in DataLoader workers, instead of the SIGBUS that would end the
process; ``mmap=False`` reads it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cntkio

STREAMS = cntkio.StreamDefs(x=cntkio.StreamDef(field="x", shape=64))


def _cbf(tmp_path: Path, name: str = "m.cbf", sequences: int = 3000) -> Path:
    """A CBF file of one-sample sequences whose values tell their key (x[k] == key * 64 + k), in chunks of
    about 64 KiB."""
    ctf = tmp_path / (name + ".ctf")
    with open(ctf, "w") as f:
        for i in range(sequences):
            f.write(f"{i} |x " + " ".join(str(i * 64 + k) for k in range(64)) + "\n")
    out = tmp_path / name
    cntkio.convert(ctf, out, STREAMS, chunk_size=64 << 10)
    return out


def _shrink(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 3)


def _check(batch: dict) -> None:
    x, keys = batch["x"], batch["keys"]
    np.testing.assert_array_equal(np.asarray(x)[:, 5], np.asarray(keys) * 64 + 5)


def test_cbf_is_mapped_by_default_and_read_with_mmap_false(tmp_path: Path) -> None:
    path = _cbf(tmp_path)
    for options in ({}, {"mmap": False}):
        loader = cntkio.Loader(paths=path, batch_size=256, shuffle=True, seed=3, with_keys=True, **options)
        n = 0
        for b in loader:
            _check(b)
            n += len(b["keys"])
        assert n == 3000
    # Mapped or read, the same batches.
    a = [b["keys"].copy() for b in cntkio.Loader(paths=path, batch_size=256, seed=3, with_keys=True)]
    b = [b["keys"].copy() for b in cntkio.Loader(paths=path, batch_size=256, seed=3, with_keys=True, mmap=False)]
    assert all(np.array_equal(p, q) for p, q in zip(a, b)) and len(a) == len(b)


def test_a_mapped_file_truncated_meanwhile_raises_ioerror(tmp_path: Path) -> None:
    path = _cbf(tmp_path)
    loader = cntkio.Loader(paths=path, batch_size=128, shuffle=True, seed=1, with_keys=True, num_threads=2)
    it = iter(loader)
    _check(next(it))
    _shrink(path)
    with pytest.raises(cntkio.IoError) as e:
        for b in it:
            _check(b)  # every batch handed out before the error holds the file's values
    assert "became shorter or unreadable while it was memory-mapped" in str(e.value)
    assert str(path) in str(e.value)

    # The deserializer's own chunk reads, and CNTK's API.
    path = _cbf(tmp_path, "n.cbf")
    d = cntkio.CBFDeserializer(path, STREAMS)
    src = cntkio.MinibatchSource(d, randomize=False, max_sweeps=1)
    assert src.next_minibatch(100)
    _shrink(path)
    with pytest.raises(cntkio.IoError, match="memory-mapped"):
        while src.next_minibatch(100):
            pass


@pytest.mark.parametrize("parent_maps_first", [False, True])
def test_a_dataloader_worker_raises_too(tmp_path: Path, parent_maps_first: bool) -> None:
    """PyTorch's DataLoader workers install a SIGBUS handler of their own (which ends the worker); the
    dataset puts the guard back in front of it. Run in a fresh interpreter: the worker's error reaches the
    main process (DataLoader re-raises it), and nothing dies of SIGBUS."""
    pytest.importorskip("torch")
    path = _cbf(tmp_path)
    script = textwrap.dedent(
        f"""
        import os, sys, numpy as np, torch, cntkio, cntkio.torch as ct
        from torch.utils.data import DataLoader
        path = {str(path)!r}
        streams = cntkio.StreamDefs(x=cntkio.StreamDef(field="x", shape=64))
        if {parent_maps_first!r}:
            keep = cntkio.CBFDeserializer(path, streams)
            cntkio.MinibatchSource(keep, max_sweeps=1).next_minibatch(10)  # the parent maps the file first
        ds = ct.IterableDataset(paths=path, batch_size=64, shuffle=False, with_keys=True)
        it = iter(DataLoader(ds, batch_size=None, num_workers=1))
        b = next(it)
        assert np.array_equal(b["x"][:, 5].numpy(), b["keys"].numpy() * 64 + 5)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 3)
        try:
            for b in it:
                pass
        except Exception as e:
            print("raised", type(e).__name__, e)
            sys.exit(0)
        print("no error")
        sys.exit(3)
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "became shorter or unreadable while it was memory-mapped" in r.stdout, r.stdout + r.stderr
    assert "bus error" not in r.stderr.lower(), r.stderr
