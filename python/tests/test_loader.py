"""cntkio.Loader and cntkio.torch.Loader: the batches of `cntkio batches`, whatever the threads and prefetch;
kept batches stay intact; resuming; the torch dicts of IterableDataset."""

from __future__ import annotations

import gc
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import cntkio


def write_data(path: Path, rng: random.Random, sequences: int, max_len: int, frame: bool = False) -> None:
    """A CTF file with a dense stream `a` (dim 3), a sparse stream `b` (dim 7) and sequences of 1..max_len
    rows (one row each in frame mode), some with several sparse entries per sample."""
    lines = []
    for s in range(sequences):
        n = 1 if frame else rng.randint(1, max_len)
        for r in range(n):
            dense = " ".join(f"{rng.uniform(-5, 5):.4g}" for _ in range(3))
            k = rng.randint(1, 3)
            sparse = " ".join(f"{rng.randrange(7)}:{rng.uniform(0, 2):.3g}" for _ in range(k))
            lines.append(f"{s} |a {dense} |b {sparse}")
    path.write_text("\n".join(lines) + "\n")


STREAMS = ["--stream", "a:3:dense", "--stream", "b:7:sparse"]


def defs() -> cntkio.StreamDefs:
    return cntkio.StreamDefs(
        a=cntkio.StreamDef(field="a", shape=3, is_sparse=False),
        b=cntkio.StreamDef(field="b", shape=7, is_sparse=True),
    )


def cli_batches(path: Path, *args: Any) -> List[Dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "cntkio", "batches", str(path), *STREAMS, *[str(a) for a in args]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"mb"')]


def as_cli(mb: cntkio.Minibatch) -> Dict[str, Any]:
    """A minibatch in the JSON shape of `cntkio batches` (numbers as float32 / float64 values)."""
    streams: Dict[str, Any] = {}
    keys = [int(k) for k in mb.sequence_keys]
    for name, s in mb.by_name().items():
        seqs = []
        for q in range(s.num_sequences):
            a, b = int(s.offsets[q]), int(s.offsets[q + 1])
            if s.is_sparse:
                seqs.append(
                    [
                        [[int(i), float(v)] for i, v in zip(s.indices[s.indptr[j] : s.indptr[j + 1]],
                                                            s.values[s.indptr[j] : s.indptr[j + 1]])]
                        for j in range(a, b)
                    ]
                )
            else:
                seqs.append([[float(v) for v in row] for row in s.values[a:b]])
        streams[name] = {"keys": keys, "sequences": seqs}
    return {"sweep_end": bool(mb.end_of_sweep), "streams": streams}


def normalized(cli: Dict[str, Any]) -> Dict[str, Any]:
    """The CLI's line with its numbers as float32 (the data's element type), without the minibatch number."""

    def f32(x: Any) -> Any:
        if isinstance(x, list):
            return [f32(v) for v in x]
        if isinstance(x, str):
            return float(x)
        return float(np.float32(x))

    streams = {}
    for name, s in cli["streams"].items():
        if name == "b":
            seqs = [[[[int(i), float(np.float32(v))] for i, v in sample] for sample in q] for q in s["sequences"]]
        else:
            seqs = f32(s["sequences"])
        streams[name] = {"keys": s["keys"], "sequences": seqs}
    return {"sweep_end": cli["sweep_end"], "streams": streams}


def assert_same_batches(got: List[Dict[str, Any]], want: List[Dict[str, Any]]) -> None:
    """The same number of tensor dicts, with the same keys and equal tensors (sparse ones compared dense, device
    ones on the CPU)."""
    import torch

    assert len(got) == len(want)
    for x, y in zip(got, want):
        assert x.keys() == y.keys()
        for k in x:
            a, b = x[k].cpu(), y[k].cpu()
            if a.layout == torch.sparse_csr:
                a, b = a.to_dense(), b.to_dense()
            assert torch.equal(a, b), k


CASES = [
    # seed, sequences, max_len, batch (per rank), window_chunks, chunk_size, world_size, rank, threads, prefetch
    (1, 300, 4, 16, 4, 600, 1, 0, 1, 1),
    (2, 400, 3, 37, 2, 900, 1, 0, 3, 7),
    (3, 250, 5, 8, 128, 500, 2, 1, 2, 2),
    (4, 500, 2, 50, 3, 700, 3, 2, 4, 16),
    (5, 120, 6, 200, 1, 400, 1, 0, 2, 3),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("balanced", [False, True])
def test_loader_gives_the_minibatches_of_cntkio_batches(tmp_path, case, balanced):
    seed, n, max_len, batch, window, chunk, world, rank, threads, prefetch = case
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(seed), n, max_len)
    want = cli_batches(
        path, "--randomize", "--seed", seed + 3, "--mb-size", batch * world, "--window-chunks", window,
        "--chunk-size", chunk, "--workers", world, "--rank", rank, *(["--balanced-workers"] if balanced else []),
    )
    assert want, "the CLI printed minibatches"
    loader = cntkio.Loader(
        paths=path, streams=defs(), batch_size=batch, seed=seed, randomization_window_in_chunks=window,
        chunkSizeInBytes=chunk, world_size=world, rank=rank, num_threads=threads, prefetch=prefetch,
        balanced_workers=balanced,
    )
    loader.set_epoch(3)
    got = [as_cli(mb) for mb in loader.minibatches()]
    assert got == [normalized(w) for w in want]
    assert len(loader) == len(want)


def test_loader_frame_mode_and_file_order(tmp_path):
    path = tmp_path / "frames.ctf"
    write_data(path, random.Random(9), 333, 1, frame=True)
    want = cli_batches(path, "--frame-mode", "--mb-size", 10, "--chunk-size", 500)
    loader = cntkio.Loader(paths=path, streams=defs(), batch_size=10, shuffle=False, frame_mode=True,
                           chunkSizeInBytes=500, num_threads=2)
    assert [as_cli(mb) for mb in loader.minibatches()] == [normalized(w) for w in want]


def test_loader_truncated_bptt(tmp_path):
    path = tmp_path / "seq.ctf"
    rng = random.Random(4)
    lines = []
    for s in range(60):
        for _ in range(rng.randint(1, 9)):
            lines.append(f"{s} |a {rng.random():.3g} {rng.random():.3g} {rng.random():.3g} |b {rng.randrange(7)}:1")
    path.write_text("\n".join(lines) + "\n")
    want = cli_batches(path, "--randomize", "--seed", 2, "--mb-size", 12, "--truncation", 4, "--chunk-size", 300)
    loader = cntkio.Loader(paths=path, streams=defs(), batch_size=12, seed=2, truncation_length=4,
                           chunkSizeInBytes=300, num_threads=3)
    got = list(loader.minibatches())
    assert len(got) == len(want)
    for mb, w in zip(got, want):
        assert [list(f) for f in mb.bptt.fragments] == w["bptt"]["fragments"]
        assert [int(k) for k in mb.sequence_keys] == w["streams"]["a"]["keys"]
        # BPTT delivers every stream dense: compare the values of each fragment.
        for name in ("a", "b"):
            s = mb[name]
            seqs = [s.values[int(s.offsets[q]) : int(s.offsets[q + 1])].tolist() for q in range(s.num_sequences)]
            assert np.allclose(np.concatenate([np.ravel(x) for x in seqs]),
                               np.concatenate([np.ravel(np.array(x, dtype=np.float32)) for x in w["streams"][name]["sequences"]]))


def test_dicts_and_threads_do_not_change_batches(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(11), 400, 4)
    runs = []
    for threads, prefetch in [(1, 1), (2, 2), (4, 9)]:
        loader = cntkio.Loader(paths=path, streams=defs(), batch_size=24, seed=5, chunkSizeInBytes=800,
                               num_threads=threads, prefetch=prefetch, with_keys=True, sparse="dense")
        runs.append([{k: np.array(v) for k, v in d.items()} for d in loader])
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for x, y in zip(runs[0], other):
            assert x.keys() == y.keys()
            for k in x:
                assert np.array_equal(x[k], y[k])
    first = runs[0][0]
    assert set(first) == {"a", "a_lengths", "b", "b_lengths", "keys"}
    assert first["a"].shape[1] == 3 and first["b"].shape[1] == 7 and first["keys"].dtype == np.int64


def test_padded_layout_and_csr(tmp_path):
    pytest.importorskip("scipy")
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(12), 100, 5)
    loader = cntkio.Loader(paths=path, streams=defs(), batch_size=20, seed=1, layout="padded", num_threads=2)
    for d in loader:
        lengths = d["a_lengths"]
        assert d["a"].shape == (len(lengths), int(lengths.max()), 3)
        assert np.array_equal(d["a_mask"].sum(axis=1), lengths)
    flat = cntkio.Loader(paths=path, streams=defs(), batch_size=20, seed=1, num_threads=2)
    d = next(iter(flat))
    assert d["b"].shape == (int(d["b_lengths"].sum()), 7)


def test_kept_batches_are_never_overwritten(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(13), 600, 3)
    opts = dict(paths=path, streams=defs(), batch_size=16, seed=2, chunkSizeInBytes=700, sparse="raw")
    copies = [{k: (np.array(v) if not isinstance(v, tuple) else tuple(np.array(p) for p in v)) for k, v in d.items()}
              for d in cntkio.Loader(**opts, num_threads=3, prefetch=2)]
    kept: List[Tuple[int, Dict[str, Any]]] = []
    views = []
    for i, d in enumerate(cntkio.Loader(**opts, num_threads=3, prefetch=2)):
        # Keep every third batch whole, a view of one array of every fifth, and drop the rest (whose
        # buffers are then reused by later batches).
        if i % 3 == 0:
            kept.append((i, d))
        if i % 5 == 0:
            views.append((i, d["a"][1:]))
        del d
        gc.collect()
    assert len(kept) > 5
    for i, d in kept:
        assert np.array_equal(d["a"], copies[i]["a"])
        for p, q in zip(d["b"], copies[i]["b"]):
            assert np.array_equal(p, q)
    for i, v in views:
        assert np.array_equal(v, copies[i]["a"][1:])


def copies(batches: Any) -> List[Dict[str, Any]]:
    return [{k: np.array(v) for k, v in d.items()} for d in batches]


def assert_same_arrays(got: List[Dict[str, Any]], want: List[Dict[str, Any]], what: str) -> None:
    assert len(got) == len(want) > 0, what
    for x, y in zip(got, want):
        assert x.keys() == y.keys(), what
        for k in x:
            assert np.array_equal(x[k], y[k]), f"{what}: {k}"


@pytest.mark.parametrize("window", [2, 128])
@pytest.mark.parametrize("balanced", [False, True])
def test_epochs_of_one_loader_keep_their_chunks(tmp_path, monkeypatch, window, balanced):
    """One loader over several epochs (its chunks kept from one epoch to the next, the next epoch's source
    made while the last one is read) gives each epoch's batches as a loader made for that epoch does; so
    does an IterableDataset kept across epochs."""
    monkeypatch.setenv("CNTKIO_NEXT_EPOCH", "always")  # whatever the load of the machine
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(17), 500, 3)
    opts = dict(paths=path, streams=defs(), batch_size=16, seed=3, chunkSizeInBytes=900, sparse="dense",
                with_keys=True, randomization_window_in_chunks=window, balanced_workers=balanced, world_size=2,
                rank=1)
    one = cntkio.Loader(**opts, num_threads=2)
    for epoch in range(3):
        fresh = cntkio.Loader(**opts, num_threads=2)
        fresh.set_epoch(epoch)
        one.set_epoch(epoch)
        assert_same_arrays(copies(one), copies(fresh), f"epoch {epoch}")
        # Kept only where the window covers the data.
        assert (len(one._chunk_keep()) > 0) == (window == 128)
        # The next epoch's source was made while this one was read, and is planning: the next iteration
        # reads it.
        assert one._next_source[1] == epoch + 1 and one._next_source[2].waiting
    # Without set_epoch the next iteration repeats the epoch, and that is the source made ahead; after
    # set_epoch to another epoch than the one made ahead, a fresh source is read.
    for epoch, moved in ((2, False), (2, False), (7, True), (3, True)):
        if moved:
            one.set_epoch(epoch)
        fresh = cntkio.Loader(**opts, num_threads=2)
        fresh.set_epoch(epoch)
        assert_same_arrays(copies(one), copies(fresh), f"epoch {epoch} again")
        assert one._next_source[1] == (epoch + 1 if moved else epoch)
    # Off: nothing is made ahead; a wrong value is refused.
    monkeypatch.setenv("CNTKIO_NEXT_EPOCH", "off")
    copies(one)
    assert "_next_source" not in one.__dict__
    monkeypatch.setenv("CNTKIO_NEXT_EPOCH", "sometimes")
    with pytest.raises(cntkio.UsageError, match="CNTKIO_NEXT_EPOCH"):
        copies(one)
    monkeypatch.setenv("CNTKIO_NEXT_EPOCH", "always")
    torch = pytest.importorskip("torch")
    import cntkio.torch as ct

    ds = ct.IterableDataset(**{k: v for k, v in opts.items()})
    for epoch in range(3):
        fresh = ct.IterableDataset(**opts)
        fresh.set_epoch(epoch)
        ds.set_epoch(epoch)
        got, want = list(ds), list(fresh)
        assert len(got) == len(want) > 0
        for x, y in zip(got, want):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_default_threads_share_the_cores_among_a_launchers_processes(tmp_path, monkeypatch):
    """The default number of native threads: ``CNTKIO_THREADS``; else the cores this process may run on,
    divided among the processes torchrun started on the machine (``LOCAL_WORLD_SIZE``) unless each process
    is bound to its share of the cores already."""
    from cntkio import _native, _threads

    monkeypatch.delenv("CNTKIO_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cores = _native.available_cores()
    assert _threads.default_threads() == cores >= 1
    if hasattr(os, "sched_getaffinity"):
        assert cores <= len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    # (cores this process may use, LOCAL_WORLD_SIZE, threads)
    for usable, local, want in [
        (64, None, 64),
        (64, "1", 64),
        (64, "8", 8),  # torchrun's 8 processes share the machine
        (64, "3", 21),
        (64, "128", 1),
        (32, "8", 4),  # a container's 32 cores shared by 8 processes
        (8, "8", 8),  # each process bound to 8 cores of its own
        (5, "8", 5),
    ]:
        monkeypatch.setattr(_native, "available_cores", lambda usable=usable: usable)
        if local is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        assert _threads.default_threads() == want, (usable, local)
    monkeypatch.setattr(_native, "available_cores", lambda: 64)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(29), 50, 3)
    assert cntkio.Loader(paths=path, streams=defs(), batch_size=8).num_threads == 8
    monkeypatch.setenv("CNTKIO_THREADS", "3")
    assert _threads.default_threads() == 3
    assert cntkio.Loader(paths=path, streams=defs(), batch_size=8).num_threads == 3
    monkeypatch.setenv("CNTKIO_THREADS", "0")
    assert _threads.default_threads() == 8
    monkeypatch.setenv("CNTKIO_THREADS", "many")
    with pytest.raises(cntkio.UsageError, match="CNTKIO_THREADS"):
        _threads.default_threads()
    monkeypatch.delenv("CNTKIO_THREADS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "eight")
    with pytest.raises(cntkio.UsageError, match="LOCAL_WORLD_SIZE"):
        _threads.default_threads()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_lets_go_of_the_next_source(tmp_path, monkeypatch):
    """A process forked while a loader's next epoch is made ahead (a DataLoader worker started after an epoch
    read in the main process) reads a fresh source and lets go of its copy of the parent's without touching
    the parent's threads; the parent still reads the source it made."""
    monkeypatch.setenv("CNTKIO_NEXT_EPOCH", "always")
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(23), 400, 3)
    opts = dict(paths=path, streams=defs(), batch_size=16, seed=5, chunkSizeInBytes=900, sparse="dense",
                with_keys=True)
    fresh = cntkio.Loader(**opts, num_threads=2)
    fresh.set_epoch(1)
    want = copies(fresh)
    one = cntkio.Loader(**opts, num_threads=2)
    one.set_epoch(0)
    copies(one)
    assert one._next_source[1] == 1 and one._next_source[2].waiting
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads running
        pid = os.fork()
    if pid == 0:  # the child: its exit status is the test's outcome there
        code = 1
        try:
            code = 2
            assert not one._next_source[2].waiting  # not this process's
            one.set_epoch(1)
            code = 3
            assert_same_arrays(copies(one), want, "child")
            one.__dict__.pop("_next_source", None)
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not finish")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert one._next_source[2].waiting
    one.set_epoch(1)
    assert_same_arrays(copies(one), want, "parent")


def test_kept_chunks_are_not_read_again(tmp_path):
    """With a window covering the data, a loader's later epochs read no chunk from the file: rewritten in place
    with other values (the same sequences, so the same chunks), it still gives the batches of the old data,
    while a new loader reads the new values. (The file is read, not mapped: a mapped chunk is the file's
    pages, which an in-place rewrite changes.)"""
    ctf = tmp_path / "data.ctf"
    write_data(ctf, random.Random(19), 400, 3)
    other = tmp_path / "other.ctf"
    lines = []
    for line in ctf.read_text().splitlines():
        head, a, b = line.split("|")
        dense = " ".join(str(-float(v) - 1) for v in a.split()[1:])
        sparse = " ".join(f"{e.split(':')[0]}:{float(e.split(':')[1]) + 1}" for e in b.split()[1:])
        lines.append(f"{head}|a {dense} |b {sparse}")
    other.write_text("\n".join(lines) + "\n")
    cbf, cbf2 = tmp_path / "data.cbf", tmp_path / "other.cbf"
    for src, dst in ((ctf, cbf), (other, cbf2)):
        subprocess.run([sys.executable, "-m", "cntkio", "-q", "convert", str(src), str(dst), *STREAMS,
                        "--chunk-size", "2000"], check=True)
    assert cbf.stat().st_size == cbf2.stat().st_size
    opts = dict(paths=cbf, batch_size=16, seed=4, sparse="dense", with_keys=True, mmap=False)
    want = []
    for epoch in range(3):
        fresh = cntkio.Loader(**opts, num_threads=2)
        fresh.set_epoch(epoch)
        want.append(copies(fresh))
    one = cntkio.Loader(**opts, num_threads=2)
    assert_same_arrays(copies(one), want[0], "epoch 0")
    assert len(one._chunk_keep()) > 5
    with open(cbf, "r+b") as f:
        f.write(cbf2.read_bytes())
    for epoch in (1, 2):
        one.set_epoch(epoch)
        assert_same_arrays(copies(one), want[epoch], f"epoch {epoch}, file rewritten")
    fresh = cntkio.Loader(**opts, num_threads=2)
    fresh.set_epoch(1)
    changed = copies(fresh)
    assert len(changed) == len(want[1]) and not np.array_equal(changed[0]["a"], want[1][0]["a"])
    # keep_chunks=False: every epoch reads the file (the new values); nothing is kept between epochs.
    freeing = cntkio.Loader(**opts, num_threads=2, keep_chunks=False)
    copies(freeing)
    assert len(freeing._chunk_keep()) == 0
    freeing.set_epoch(1)
    assert_same_arrays(copies(freeing), changed, "keep_chunks=False")
    assert pickle.loads(pickle.dumps(freeing)).keep_chunks is False


def assert_resume_continues(make: Any, stops: Tuple[int, ...]) -> Any:
    """A loader made by ``make()`` (``with_keys=True``) stopped after ``k`` batches of epoch 1 (each of
    ``stops``, and the last but one) gives a state counting those ``k``, from which a new loader yields the
    rest of the epoch; returns the last resumed loader."""
    full = make()
    full.set_epoch(1)
    keys = [d["keys"].tolist() for d in full]
    for k in (*stops, len(keys) - 1):
        first = make()
        first.set_epoch(1)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        assert state["batches"] == k
        resumed = make()
        resumed.load_state_dict(state)
        assert [d["keys"].tolist() for d in resumed] == keys[k:]
    return resumed


def test_resume_continues_the_epoch(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(14), 300, 3)
    opts = dict(paths=path, streams=defs(), batch_size=20, seed=4, chunkSizeInBytes=600, num_threads=2,
                with_keys=True)
    resumed = assert_resume_continues(lambda: cntkio.Loader(**opts), (0, 1, 5))
    # The next epoch is whole again.
    resumed.set_epoch(2)
    assert sum(len(d["keys"]) for d in resumed) == 300


def test_loader_errors_and_pickling(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(15), 50, 2)
    with pytest.raises(cntkio.UsageError, match="batch_size"):
        cntkio.Loader(paths=path, streams=defs(), batch_size=0)
    with pytest.raises(cntkio.UsageError, match="num_threads"):
        cntkio.Loader(paths=path, streams=defs(), num_threads=0)
    with pytest.raises(cntkio.UsageError, match="layout"):
        cntkio.Loader(paths=path, streams=defs(), layout="ragged")
    # A misspelt argument is not taken for a deserializer option: the closest of the loader's own (its
    # class's and its base's) or of the options is named.
    for kwargs, said in [
        ({"shufle": False}, "Loader: unknown argument 'shufle' (did you mean 'shuffle'?)"),
        ({"prefech": 2}, "unknown argument 'prefech' (did you mean 'prefetch'?)"),
        ({"chunk_size_in_byte": 1}, "(did you mean 'chunk_size_in_bytes'?)"),
        ({"zzz": 1, "seeds": 2}, "unknown arguments 'seeds' (did you mean 'seed'?), 'zzz'; the keywords"),
    ]:
        with pytest.raises(cntkio.UsageError) as e:
            cntkio.Loader(paths=path, streams=defs(), **kwargs)
        assert said in str(e.value), str(e.value)
        with pytest.raises(cntkio.UsageError) as e:  # the same with deserializers
            cntkio.Loader(cntkio.CTFDeserializer(path, defs()), **kwargs)
        assert said in str(e.value), str(e.value)
    assert cntkio.Loader(paths=path, streams=defs(), chunk_size_in_bytes=1 << 20, maxErrors=1).batch_size == 256
    loader = cntkio.Loader(paths=path, streams=defs(), batch_size=7, seed=3, with_keys=True)
    other = pickle.loads(pickle.dumps(loader))
    assert [d["keys"].tolist() for d in other] == [d["keys"].tolist() for d in loader]
    # A data error surfaces where the minibatch source reports it, after the batches before it.
    long = tmp_path / "long.ctf"
    long.write_text("0 |a 1 2 3 |b 1:1\n1 |a 1 2 3 |b 1:1\n1 |a 1 2 3 |b 1:1\n")
    frames = cntkio.Loader(paths=long, streams=defs(), batch_size=1, shuffle=False, frame_mode=True)
    it = iter(frames)
    next(it)
    with pytest.raises(cntkio.CntkError, match="non-frame sequence"):
        next(it)


def test_torch_loader_matches_iterable_dataset(tmp_path):
    torch = pytest.importorskip("torch")
    import cntkio.torch as ct

    path = tmp_path / "data.ctf"
    write_data(path, random.Random(16), 300, 3)
    opts = dict(paths=path, streams=defs(), batch_size=30, seed=6, chunkSizeInBytes=700, with_keys=True)
    for layout, sparse in [("flat", "csr"), ("flat", "dense"), ("padded", "csr")]:
        ds = ct.IterableDataset(**opts, layout=layout, sparse=sparse)
        want = list(ds)
        loader = ct.Loader(**opts, layout=layout, sparse=sparse, num_threads=2)
        assert_same_batches(list(loader), want)
    # Pickled with its device and copy options.
    copy = pickle.loads(pickle.dumps(ct.Loader(**opts, device="cpu", device_prefetch=3)))
    assert (str(copy.device), copy.device_prefetch, copy.pin_memory) == ("cpu", 3, False)
    # Moved to the device (here the CPU): the same batches.
    moved = list(ct.Loader(**opts, sparse="dense", device="cpu", num_threads=2))
    plain = list(ct.Loader(**opts, sparse="dense", num_threads=2))
    assert_same_batches(moved, plain)
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="not pinned"):
            ct.Loader(**opts, pin_memory=True)
        with pytest.raises(cntkio.UsageError, match="CUDA"):
            ct.Loader(**opts, device="cuda")
    # Leaving an iteration early stops its threads.
    it = iter(ct.Loader(**opts, device="cpu"))
    next(it)
    it.close()


def test_torch_loader_pins_and_moves_to_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: pinned memory and device copies are tested on a machine with one")
    import cntkio.torch as ct

    path = tmp_path / "data.ctf"
    write_data(path, random.Random(17), 300, 3)
    opts = dict(paths=path, streams=defs(), batch_size=30, seed=6, chunkSizeInBytes=700, with_keys=True)
    plain = list(ct.Loader(**opts, num_threads=2))
    pinned = list(ct.Loader(**opts, num_threads=2, pin_memory=True))
    assert all(v.is_pinned() for b in pinned for k, v in b.items() if v.layout == torch.strided)
    # Where PyTorch's CUDA runtime is a shared library, the loader's own buffers are page-locked: the value
    # arrays are pinned as they come from the loader, not copied.
    from cntkio._torch_loader import cuda_host_register

    if cuda_host_register(torch) is not None:
        raw = list(ct.Loader(**opts, num_threads=2, pin_memory=True, sparse="dense")._tensors())
        assert all(b["a"].is_pinned() for b in raw)
    # Batches kept while the loader goes on (their buffers page-locked where they are) stay intact.
    assert_same_batches(pinned, plain)
    for layout, sparse in [("flat", "csr"), ("padded", "dense"), ("flat", "dense")]:
        cpu = list(ct.Loader(**opts, layout=layout, sparse=sparse, num_threads=2))
        gpu = list(ct.Loader(**opts, layout=layout, sparse=sparse, num_threads=2, device="cuda"))
        assert len(cpu) == len(plain)
        assert all(v.device.type == "cuda" for b in gpu for v in b.values())
        assert_same_batches(gpu, cpu)
    # Batches used on the current stream while later ones are copied on the side stream stay intact.
    total = torch.zeros((), device="cuda")
    for b in ct.Loader(**opts, sparse="dense", num_threads=2, device="cuda"):
        total += (b["a"] * 2).sum()
    want = sum(float(x["a"].double().sum()) * 2 for x in plain)
    assert abs(float(total) - want) < 1e-3 * max(1.0, abs(want))
    # Minibatches copied a group at a time (flat, dense): a state taken in the middle of a group resumes
    # exactly, on the CPU too.
    keys = [b["keys"].tolist() for b in plain]
    for k in (1, 5, 9):
        gpu = ct.Loader(**opts, sparse="dense", num_threads=3, device="cuda")
        it = iter(gpu)
        for _ in range(k):
            next(it)
        state = gpu.state_dict()
        it.close()
        resumed = ct.Loader(**opts, sparse="dense", num_threads=2)
        resumed.load_state_dict(state)
        assert [b["keys"].tolist() for b in resumed] == keys[k:]


@pytest.mark.parametrize("old,new", [(2, 3), (4, 2), (3, 1)])
def test_loader_elastic_resume_reads_the_epoch_once(tmp_path, old, new):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(20 + old), 500, 3)
    opts = dict(paths=path, streams=defs(), batch_size=12, seed=8, chunkSizeInBytes=900, with_keys=True,
                balanced_workers=True, num_threads=2)
    rng = random.Random(old * 10 + new)
    seen: List[int] = []
    states = []
    for r in range(old):
        loader = cntkio.Loader(**opts, rank=r, world_size=old)
        loader.set_epoch(2)
        it = iter(loader)
        for _ in range(rng.randint(0, 6)):
            seen.extend(next(it)["keys"].tolist())
        states.append(json.loads(json.dumps(loader.state_dict())))
    for r in range(new):
        loader = cntkio.Loader(**opts, rank=r, world_size=new)
        loader.load_state_dict(states)
        assert loader.epoch == 2
        for d in loader:
            seen.extend(d["keys"].tolist())
    assert sorted(seen) == list(range(500))


def test_loader_elastic_resume_needs_balanced_workers(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(30), 100, 2)
    opts = dict(paths=path, streams=defs(), batch_size=8, chunkSizeInBytes=300)
    states = [cntkio.Loader(**opts, rank=r, world_size=2).state_dict() for r in range(2)]
    with pytest.raises(cntkio.UsageError, match="balanced_workers"):
        cntkio.Loader(**opts, rank=0, world_size=3).load_state_dict(states)


def test_loader_resumes_truncated_bptt_rows(tmp_path):
    path = tmp_path / "seq.ctf"
    rng = random.Random(31)
    lines = []
    for s in range(80):
        for _ in range(rng.randint(1, 9)):
            lines.append(f"{s} |a {rng.random():.3g} 0 0 |b {rng.randrange(7)}:1")
    path.write_text("\n".join(lines) + "\n")
    opts = dict(paths=path, streams=defs(), batch_size=12, seed=2, truncation_length=4, chunkSizeInBytes=300,
                num_threads=2, sparse="dense")
    full = [d["a"].tolist() for d in cntkio.Loader(**opts)]
    first = cntkio.Loader(**opts)
    it = iter(first)
    for _ in range(5):
        next(it)
    resumed = cntkio.Loader(**opts)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [d["a"].tolist() for d in resumed] == full[5:]


@pytest.mark.parametrize("grouped", [True, False], ids=["dense-groups", "per-minibatch"])
def test_device_pipeline_logic_on_the_cpu(tmp_path, monkeypatch, grouped):
    """The copy-ahead pipeline of cntkio.torch.Loader(device="cuda"), run on the CPU with CUDA's streams and
    events stood in for: the same batches as the CPU loader, in order, and a state taken mid-way (also in the
    middle of a group) counts only the batches yielded."""
    import contextlib

    torch = pytest.importorskip("torch")
    import cntkio.torch as ct

    class Event:
        def record(self, stream: Any) -> None:
            pass

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

    class Stream:
        def wait_event(self, event: Any) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None, raising=False)

    path = tmp_path / "data.ctf"
    write_data(path, random.Random(40), 400, 3)
    sparse = "dense" if grouped else "csr"
    opts = dict(paths=path, streams=defs(), batch_size=20, seed=3, chunkSizeInBytes=700, with_keys=True,
                sparse=sparse, num_threads=2)
    want = list(ct.Loader(**opts))

    def piped(loader: Any) -> Any:
        loader._grouped = lambda: grouped  # the group size the CUDA path asks of the feed
        items = loader._dense_groups() if grouped else loader._minibatch_items()
        return loader._to_device(torch.device("cpu"), items)

    assert len(want) > 10
    assert_same_batches(list(piped(ct.Loader(**opts))), want)
    keys = [b["keys"].tolist() for b in want]
    for k in (1, 3, 8, 11):
        loader = ct.Loader(**opts)
        it = piped(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
        it.close()
        assert state["batches"] == k
        resumed = ct.Loader(**opts)
        resumed.load_state_dict(state)
        assert [b["keys"].tolist() for b in resumed] == keys[k:]
