"""cntkio.torch: splitting between workers and ranks, epochs, resuming, pickling — first without PyTorch
(MinibatchIterable, simulated workers), then with DataLoader (skipped when PyTorch is not installed)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import numpy as np
import pytest

import cntkio
import cntkio.torch as ct
from cntkio import CTFDeserializer, MinibatchSource, StreamDef, StreamDefs, UsageError

REPO = Path(__file__).resolve().parents[2]
NO_TORCH = (
    "PyTorch is not installed (pip install torch, or cntkio[torch]; scripts/test-python.sh installs it unless "
    "CNTKIO_NO_TORCH=1)"
)


def data(tmp_path: Path, n: int = 50, chunk: int = 60) -> CTFDeserializer:
    """`n` sequences `i |a i i |b (i mod 3):1`, 1 to 3 rows each, small chunks (several per partition)."""
    rows = []
    for i in range(n):
        for r in range(1 + i % 3):
            rows.append(f"{i} |a {i} {r}" + (f" |b {i % 3}:1" if r == 0 else "") + "\n")
    p = tmp_path / "seq.ctf"
    p.write_text("".join(rows))
    return CTFDeserializer(
        p,
        StreamDefs(a=StreamDef(field="a", shape=2), b=StreamDef(field="b", shape=3, is_sparse=True)),
        chunkSizeInBytes=chunk,
    )


def keys(mbs) -> List[List[int]]:
    return [[int(k) for k in mb.sequence_keys] for mb in mbs]


def simulate_loader(make, workers: int) -> Iterator[Tuple[int, List[int]]]:
    """What a DataLoader with `workers` processes yields, without PyTorch: each worker's iterator made by
    `make()` with get_worker_info() faked, then taken in turn, exhausted workers skipped."""
    its = []
    for w in range(workers):
        ct_worker = ct._worker
        ct._worker = lambda w=w: (w, workers)
        try:
            it = make()
            its.append(list(keys(it.minibatches())))
        finally:
            ct._worker = ct_worker
    pos = [0] * workers
    w = 0
    while any(pos[v] < len(its[v]) for v in range(workers)):
        if pos[w] < len(its[w]):
            yield w, its[w][pos[w]]
            pos[w] += 1
        w = (w + 1) % workers


# ------------------------------------------------------------------------------------------------------------
# Without PyTorch


def test_module_imports_without_torch():
    code = "import sys, cntkio.torch; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
    blocked = (
        "import sys; sys.modules['torch'] = None\n"
        "import cntkio.torch\n"
        "try:\n    cntkio.torch.IterableDataset\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, check=True)
    assert "needs PyTorch" in out.stdout and "MinibatchIterable" in out.stdout


def test_epochs_are_cntk_sweeps(tmp_path):
    d = data(tmp_path)
    it = ct.MinibatchIterable(d, batch_size=7, seed=3)
    cntk = MinibatchSource(d, randomization_seed=3, max_sweeps=3)
    sweeps: List[List[int]] = [[], [], []]
    k = 0
    while True:
        mb = cntk.next_minibatch(cntk.sweep_size)
        if not mb:
            break
        sweeps[k] += [int(x) for x in mb.sequence_keys]
        k += 1
    for e in range(3):
        it.set_epoch(e)
        assert [x for mb in keys(it) for x in mb] == sweeps[e]
    assert sweeps[0] != sweeps[1] and sorted(sweeps[0]) == sorted(sweeps[1]) == list(range(50))
    it.set_epoch(0)
    assert [x for mb in keys(it) for x in mb] == sweeps[0]  # the same seed, the same order
    unshuffled = ct.MinibatchIterable(d, batch_size=7, shuffle=False)
    assert [x for mb in keys(unshuffled) for x in mb] == list(range(50))


@pytest.mark.parametrize("shuffle", [True, False])
def test_ranks_and_workers_split_without_overlap(tmp_path, shuffle):
    d = data(tmp_path)
    for world in (1, 2, 3):
        for workers in (1, 2):
            seen: List[int] = []
            for rank in range(world):
                make = lambda rank=rank: ct.MinibatchIterable(  # noqa: E731
                    d, batch_size=5, shuffle=shuffle, seed=1, rank=rank, world_size=world)
                seen += [k for _, mb in simulate_loader(make, workers) for k in mb]
            assert sorted(seen) == list(range(50)), (world, workers)


def test_balanced_workers_split_evenly(tmp_path):
    # cntkio's addition: sequence dealing; 2 ranks x 2 workers get 12 or 13 of the 50 sequences each, together
    # all of them, in the single reader's order
    d = data(tmp_path)
    order = [k for mb in keys(ct.MinibatchIterable(d, batch_size=5, seed=4)) for k in mb]
    parts = []
    for rank in range(2):
        make = lambda rank=rank: ct.MinibatchIterable(  # noqa: E731
            d, batch_size=5, seed=4, rank=rank, world_size=2, balanced_workers=True)
        got: Dict[int, List[int]] = {}
        for w, mb in simulate_loader(make, 2):
            got.setdefault(w, []).extend(mb)
        parts += list(got.values())
    assert sorted(len(p) for p in parts) == [12, 12, 13, 13]
    assert sorted(k for p in parts for k in p) == list(range(50))
    assert all(p == [k for k in order if k in set(p)] for p in parts)


def test_batch_size_counts_samples(tmp_path):
    it = ct.MinibatchIterable(data(tmp_path), batch_size=6, shuffle=False)
    for mb in it:
        assert mb.num_samples <= 6 or mb.num_sequences == 1
    assert sum(mb.num_samples for mb in it) == sum(1 + i % 3 for i in range(50))


def test_rank_from_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert ct.distributed_rank_and_size() == (1, 4)
    assert ct.distributed_rank_and_size(rank=2) == (2, 4)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert ct.distributed_rank_and_size() == (0, 1)
    with pytest.raises(UsageError):
        ct.distributed_rank_and_size(rank=3, world_size=2)


def test_consumed_shares():
    assert ct._consumed_shares(5, [3, 3]) == ([3, 2], 1)
    assert ct._consumed_shares(5, [1, 4]) == ([1, 4], 0)
    assert ct._consumed_shares(4, [1, 2, 3]) == ([1, 2, 1], 2)
    assert ct._consumed_shares(5, [1, 2, 3]) == ([1, 2, 2], 0)
    assert ct._consumed_shares(2, [3, 3, 3]) == ([1, 1, 0], 2)
    assert ct._consumed_shares(0, [2, 2]) == ([0, 0], 0)


def test_resume_in_process(tmp_path):
    d = data(tmp_path)
    it = ct.MinibatchIterable(d, batch_size=4, seed=2)
    it.set_epoch(1)
    full = keys(it)
    for n in (0, 1, 5, len(full)):
        first = ct.MinibatchIterable(d, batch_size=4, seed=2)
        first.set_epoch(1)
        gen = first.minibatches()
        taken = [next(gen) for _ in range(n)]
        assert keys(taken) == full[:n]
        state = first.state_dict()
        assert state["batches"] == n and state["epoch"] == 1
        again = ct.MinibatchIterable(d, batch_size=4, seed=2)
        again.load_state_dict(state)
        assert keys(again) == full[n:]
        again.set_epoch(1)
        assert keys(again) == full[n:]  # the same epoch: still resumed
        again.set_epoch(2)
        again.set_epoch(1)
        assert keys(again) == full  # another epoch ends the resume
    with pytest.raises(UsageError, match="seed"):
        ct.MinibatchIterable(d, batch_size=4, seed=3).load_state_dict(state)


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_with_workers_replays_the_round_robin(tmp_path, shuffle):
    d = data(tmp_path, chunk=200)  # few chunks: with shuffle the workers' batch counts differ
    workers = 3

    def make(state=None):
        def f():
            it = ct.MinibatchIterable(d, batch_size=4, shuffle=shuffle, seed=5)
            it.set_epoch(2)
            if state is not None:
                it.load_state_dict(state)
            return it
        return f

    full = [mb for _, mb in simulate_loader(make(), workers)]
    counts = [sum(1 for w, _ in simulate_loader(make(), workers) if w == v) for v in range(workers)]
    assert len(set(counts)) > 1 or not shuffle  # some worker runs out first
    for n in range(len(full) + 1):
        state = make()().state_dict(batches=n, num_workers=workers)
        rest = [mb for _, mb in simulate_loader(make(state), workers)]
        assert rest == full[n:], n


def test_pickle_by_path_and_options(tmp_path):
    d = data(tmp_path)
    it = ct.MinibatchIterable(d, batch_size=4, seed=2, rank=1, world_size=2)
    it.set_epoch(3)
    blob = pickle.dumps(it)
    assert b"seq.ctf" in blob and len(blob) < 2000
    copy = pickle.loads(blob)
    assert (copy.epoch, copy.rank, copy.world_size, copy.seed) == (3, 1, 2, 2)
    assert keys(copy) == keys(it)


def test_paths_and_options(tmp_path):
    d = data(tmp_path)
    cntkio.convert(d, tmp_path / "seq.cbf", chunk_size=200)
    streams = StreamDefs(a=StreamDef(field="a", shape=2), b=StreamDef(field="b", shape=3, is_sparse=True))
    by_path = ct.MinibatchIterable(paths=d.path, streams=streams, chunkSizeInBytes=60, batch_size=5, seed=1)
    assert keys(by_path) == keys(ct.MinibatchIterable(d, batch_size=5, seed=1))
    shards = ct.MinibatchIterable(paths=[tmp_path / "seq.cbf", d.path], streams=streams, batch_size=5, shuffle=False)
    flat = [k for mb in keys(shards) for k in mb]
    assert flat == list(range(50)) * 2
    with pytest.raises(UsageError, match="streams"):
        ct.MinibatchIterable(paths=d.path)
    with pytest.raises(UsageError):
        ct.MinibatchIterable(d, paths=d.path)
    with pytest.raises(UsageError):
        ct.MinibatchIterable(d, batch_size=0)


# ------------------------------------------------------------------------------------------------------------
# With PyTorch

# PyTorch itself warns, once per process, when it rebuilds a sparse CSR tensor a worker process sent.
_REBUILD_WARNINGS = ("ignore:Sparse invariant checks are implicitly disabled:UserWarning",
                     "ignore:Sparse CSR tensor support is in beta state:UserWarning")


def SPARSE_REBUILD(f):  # noqa: N802
    for w in _REBUILD_WARNINGS:
        f = pytest.mark.filterwarnings(w)(f)
    return f


@pytest.fixture(scope="module")
def torch():
    try:
        import torch
    except ImportError:
        pytest.skip(NO_TORCH)
    return torch


def loader_keys(torch, ds, **kw) -> List[List[int]]:
    from torch.utils.data import DataLoader

    return [b["keys"].tolist() for b in DataLoader(ds, batch_size=None, **kw)]


@SPARSE_REBUILD
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader(torch, tmp_path, workers):
    d = data(tmp_path)
    ds = ct.IterableDataset(d, batch_size=6, seed=1, with_keys=True)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    from torch.utils.data import DataLoader

    batches = list(DataLoader(ds, batch_size=None, num_workers=workers))
    got = [k for b in batches for k in b["keys"].tolist()]
    assert sorted(got) == list(range(50))
    b = batches[0]
    assert b["a"].dtype == torch.float32 and b["a"].shape == (int(b["a_lengths"].sum()), 2)
    assert b["a_lengths"].dtype == torch.int64 and b["keys"].dtype == torch.int64
    assert b["b"].layout == torch.sparse_csr and b["b"].shape == (int(b["b_lengths"].sum()), 3)
    if workers == 0:
        ref = [x for mb in keys(ct.MinibatchIterable(d, batch_size=6, seed=1)) for x in mb]
        assert got == ref


@SPARSE_REBUILD
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_dataloader_spawn(torch, tmp_path, context):
    d = data(tmp_path)
    ds = ct.IterableDataset(d, batch_size=6, seed=4, with_keys=True)
    ds.set_epoch(2)
    spawned = loader_keys(torch, ds, num_workers=2, multiprocessing_context=context)
    forked = loader_keys(torch, ds, num_workers=2)
    assert spawned == forked and sorted(k for b in spawned for k in b) == list(range(50))


@SPARSE_REBUILD
def test_two_ranks(torch, tmp_path, monkeypatch):
    d = data(tmp_path)
    per_rank = []
    for rank in (0, 1):
        if rank == 0:
            ds = ct.IterableDataset(d, batch_size=4, seed=7, rank=rank, world_size=2, with_keys=True)
        else:  # as torchrun sets them
            monkeypatch.setenv("RANK", "1")
            monkeypatch.setenv("WORLD_SIZE", "2")
            ds = ct.IterableDataset(d, batch_size=4, seed=7, with_keys=True)
        assert (ds.rank, ds.world_size) == (rank, 2)
        per_rank.append({k for b in loader_keys(torch, ds, num_workers=2) for k in b})
    assert not per_rank[0] & per_rank[1] and per_rank[0] | per_rank[1] == set(range(50))


@SPARSE_REBUILD
def test_resume_dataloader(torch, tmp_path):
    d = data(tmp_path, chunk=120)
    from torch.utils.data import DataLoader

    def make() -> object:
        ds = ct.IterableDataset(d, batch_size=4, seed=8, with_keys=True)
        ds.set_epoch(1)
        return ds

    full = loader_keys(torch, make(), num_workers=2)
    for n in (1, 5, len(full) - 1):
        ds = make()
        it = iter(DataLoader(ds, batch_size=None, num_workers=2))
        taken = [next(it)["keys"].tolist() for _ in range(n)]
        del it
        assert taken == full[:n]
        state = ds.state_dict(batches=n, num_workers=2)
        resumed = make()
        resumed.load_state_dict(state)
        assert loader_keys(torch, resumed, num_workers=2) == full[n:]
        resumed.set_epoch(2)
        resumed.set_epoch(1)
        assert loader_keys(torch, resumed, num_workers=2) == full  # another epoch ends the resume
    with pytest.raises(UsageError, match="worker"):
        resumed = make()
        resumed.load_state_dict(state)
        loader_keys(torch, resumed, num_workers=0)


def test_layouts(torch, tmp_path):
    d = data(tmp_path)
    ds = ct.IterableDataset(d, batch_size=9, shuffle=False, layout="padded", with_keys=True)
    b = next(iter(ds))
    lengths = b["a_lengths"]
    assert b["a"].shape == (len(lengths), int(lengths.max()), 2) and b["a_mask"].dtype == torch.bool
    assert (b["a_mask"].sum(1) == lengths).all()
    assert b["b"].shape == (len(lengths), 1, 3) and b["b"].layout == torch.strided
    mb = next(iter(ct.MinibatchIterable(d, batch_size=9, shuffle=False)))
    assert np.array_equal(b["a"][b["a_mask"]].numpy(), mb["a"].values)
    flat = next(iter(ct.IterableDataset(d, batch_size=9, shuffle=False, sparse="dense")))
    assert flat["b"].layout == torch.strided and np.array_equal(flat["b"].numpy(), mb["b"].todense())
    with pytest.raises(UsageError):
        ct.IterableDataset(d, layout="ragged")


def test_pickle_dataset(torch, tmp_path):
    d = data(tmp_path)
    ds = ct.IterableDataset(d, batch_size=4, seed=2, layout="padded", with_keys=True)
    ds.set_epoch(5)
    copy = pickle.loads(pickle.dumps(ds))
    assert type(copy) is type(ds) and copy.layout == "padded" and copy.epoch == 5
    assert [b["keys"].tolist() for b in copy] == [b["keys"].tolist() for b in ds]


@pytest.mark.parametrize("how", [["--workers", "2"], []], ids=["dataloader", "loader"])
def test_example_trains(torch, how):
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_logreg.py"), "--epochs", "8", *how],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    accuracy = float(out.stdout.strip().splitlines()[-1].split()[-1])
    assert accuracy > 0.85, out.stdout


def _ddp_rank(rank: int, world: int, init: str, path: str, out: str) -> None:
    import json

    import torch.distributed as dist

    import cntkio
    import cntkio.torch as ct

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        d = cntkio.CTFDeserializer(path, StreamDefs(a=StreamDef(field="a", shape=2)), chunkSizeInBytes=60)
        ds = ct.IterableDataset(d, batch_size=4, seed=3, with_keys=True)
        keys = [k for b in ds for k in b["keys"].tolist()]
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"rank": ds.rank, "world": ds.world_size, "keys": keys}, f)
    finally:
        dist.destroy_process_group()


def test_torch_distributed_ranks(torch, tmp_path):
    """Two processes in a gloo process group: the dataset takes rank and world size from torch.distributed."""
    import json

    import torch.multiprocessing as mp

    path = data(tmp_path).path
    out = str(tmp_path / "ranks")
    init = f"file://{tmp_path / 'pg'}"
    mp.start_processes(_ddp_rank, args=(2, init, path, out), nprocs=2, join=True, start_method="spawn")
    results = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in results] == [(0, 2), (1, 2)]
    a, b = set(results[0]["keys"]), set(results[1]["keys"])
    assert not a & b and a | b == set(range(50))


def _cntkio_shm() -> List[str]:
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("cntkio-")) if os.path.isdir("/dev/shm") else []


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(torch, tmp_path, context):
    """DataLoader's persistent workers keep the dataset they started with: each epoch set since is read
    from shared memory, so that epoch e is CNTK's sweep with seed + e there too (as with workers started
    for each epoch), and the chunks kept in each worker serve the later epochs."""
    from torch.utils.data import DataLoader

    d = data(tmp_path, n=300, chunk=200)
    opts = dict(batch_size=8, seed=4, with_keys=True)
    want = []
    for epoch in range(3):
        fresh = ct.IterableDataset(d, **opts)
        fresh.set_epoch(epoch)
        want.append([b["keys"].tolist() for b in DataLoader(fresh, batch_size=None, num_workers=2)])
    assert want[0] != want[1] != want[2]
    ds = ct.IterableDataset(d, **opts)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=context)
    for epoch in range(3):
        ds.set_epoch(epoch)
        assert [b["keys"].tolist() for b in loader] == want[epoch], f"epoch {epoch}"
    assert pickle.loads(pickle.dumps(ds)).epoch == 2
    # A state loaded once the workers run cannot reach them: they say so.
    ds.load_state_dict(ds.state_dict(batches=3, num_workers=2), num_workers=2)
    with pytest.raises(Exception, match="persistent workers started"):
        list(loader)
    # Loaded before the first iteration, it resumes there.
    resumed = ct.IterableDataset(d, **opts)
    resumed.load_state_dict(ds.state_dict(batches=3, num_workers=2), num_workers=2)
    fresh_loader = DataLoader(resumed, batch_size=None, num_workers=2, persistent_workers=True,
                              multiprocessing_context=context)
    assert [b["keys"].tolist() for b in fresh_loader] == want[2][3:]


try:
    from torch.utils.data import IterableDataset as _TorchIterable
except ImportError:  # the tests that use it are skipped
    _TorchIterable = object  # type: ignore[assignment,misc]


class _NextEpochProbe(_TorchIterable):  # type: ignore[misc,valid-type]
    """A cntkio dataset's batches, then from each worker what the iteration left ahead: the epoch whose source
    it made while reading this one (None: none) and whether that source is planning."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        yield from self.inner
        kept = self.inner.__dict__.get("_next_source")
        yield {"next_epoch": -1 if kept is None else kept[1], "waiting": kept is not None and kept[2].waiting}


class _LoaderThreadsProbe(_TorchIterable):  # type: ignore[misc,valid-type]
    """The chunk loaders and assembling threads of a cntkio dataset's source in each DataLoader worker."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        from cntkio.torch import _worker

        workers = _worker()[1]
        yield {"loaders": self.inner._source(0, workers)._src.loader_threads(),
               "assemblers": self.inner._feed_threads(workers)}


def test_dataloader_workers_share_the_default_threads(torch, tmp_path, monkeypatch):
    """DataLoader workers share the cores: each worker's source gets its part of the default number of chunk
    loaders (at least 2 where the default allows) and assembling threads (the main process, all of them)."""
    from torch.utils.data import DataLoader

    d = data(tmp_path, n=60, chunk=200)
    # (CNTKIO_THREADS, each worker's chunk loaders, its assembling threads): loaders at least 2 where the
    # default allows.
    for threads, loaders, assemblers in (("6", 3, 3), ("3", 2, 1), ("1", 1, 1)):
        monkeypatch.setenv("CNTKIO_THREADS", threads)
        ds = ct.IterableDataset(d, batch_size=8)
        assert ds._source(0)._src.loader_threads() == int(threads)
        got = list(DataLoader(_LoaderThreadsProbe(ds), batch_size=None, num_workers=2))
        assert [(b["loaders"], b["assemblers"]) for b in got] == [(loaders, assemblers)] * 2, threads


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_make_the_next_epoch_ahead(torch, tmp_path, context):
    """A persistent worker, iterated again, makes its next epoch's source while it reads this one: the epoch
    after one set by set_epoch, else the same epoch again. The batches stay those of a worker started for
    the epoch, which makes nothing ahead (it is not iterated again)."""
    from torch.utils.data import DataLoader

    d = data(tmp_path, n=300, chunk=200)
    opts = dict(batch_size=8, seed=4, with_keys=True)

    def fresh(epoch: int) -> List[List[int]]:
        f = ct.IterableDataset(d, **opts)
        f.set_epoch(epoch)
        got = list(DataLoader(_NextEpochProbe(f), batch_size=None, num_workers=2))
        assert [b["next_epoch"] for b in got if "next_epoch" in b] == [-1, -1]
        return [b["keys"].tolist() for b in got if "keys" in b]

    ds = ct.IterableDataset(d, **opts)
    loader = DataLoader(_NextEpochProbe(ds), batch_size=None, num_workers=2, persistent_workers=True,
                        multiprocessing_context=context)
    # (epoch, set_epoch called before it): a loop, a repeat without set_epoch, a jump past the epoch made
    # ahead, and the loop again.
    for i, (epoch, moved) in enumerate([(0, True), (1, True), (2, True), (2, False), (5, True), (6, True)]):
        if moved:
            ds.set_epoch(epoch)
        got = list(loader)
        assert [b["keys"].tolist() for b in got if "keys" in b] == fresh(epoch), f"epoch {epoch}"
        ahead = [(b["next_epoch"], b["waiting"]) for b in got if "next_epoch" in b]
        want = (-1, False) if i == 0 else (epoch + 1 if moved else epoch, True)
        assert ahead == [want, want], f"epoch {epoch}"


def _double_a(batch: Dict) -> Dict:
    """A ``collate_fn`` that reads the batch in the worker."""
    return {"a2": batch["a"] * 2, "keys": batch["keys"]}


class _Wrapped:
    """A dataset of another one's batches, rebuilt in the worker (a new dict holding the batch's own tensors)."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        for b in self.inner:
            yield {"a": b["a"], "keys": b["keys"], "rows": torch_len(b["a"])}


def torch_len(t):
    import torch

    return torch.tensor(t.shape[0])


def test_worker_batches_are_dicts_to_collate_fn_and_wrappers(torch, tmp_path):
    """In a DataLoader worker the batches are dicts of tensors: a ``collate_fn`` or a dataset wrapping
    cntkio's reads and rebuilds them there, and the main process gets what it made — while the worker's slots
    are reused once both processes let go of a batch (a ring that never grows past a few slots)."""
    from torch.utils.data import DataLoader
    from torch.utils.data import IterableDataset as TorchIterable

    from cntkio import _shared

    d = data(tmp_path, n=400, chunk=200)
    ds = ct.IterableDataset(d, batch_size=8, seed=4, with_keys=True, sparse="dense")
    plain = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(plain) > 40

    doubled = list(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=_double_a))
    assert len(doubled) == len(plain)
    for b, want in zip(doubled, plain):
        assert set(b) == {"a2", "keys"}
        assert torch.equal(b["keys"], want["keys"]) and torch.equal(b["a2"], want["a"] * 2)

    class Wrapped(_Wrapped, TorchIterable):
        pass

    before = set(_cntkio_shm())
    most = 0
    n = 0
    for i, (b, want) in enumerate(zip(DataLoader(Wrapped(ds), batch_size=None, num_workers=2), plain)):
        assert torch.equal(b["keys"], want["keys"]) and torch.equal(b["a"], want["a"])
        assert int(b["rows"]) == want["a"].shape[0]
        n += 1
        if _shared.available() and i % 5 == 0:
            most = max(most, len(set(_cntkio_shm()) - before))
    assert n == len(plain)
    if _shared.available():
        assert 0 < most < 20, most


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no POSIX shared memory files on this system")
def test_ticket_slot_held_by_either_process(torch, tmp_path):
    """A ticket's slot is reused only once the worker and the receiving process both hold nothing of it; a
    ticket changed, or one whose copy was sent already, is sent as a plain dict of its tensors, and so is a
    ticket pickled other than through a multiprocessing queue (nothing would give its slot back)."""
    import copy
    from multiprocessing.reduction import ForkingPickler

    from cntkio import _shared

    def sent(t):  # as a DataLoader worker's queue sends it
        return pickle.loads(ForkingPickler.dumps(t))

    ring = _shared.Ring()
    try:
        batch = {"x": torch.arange(12, dtype=torch.float32).reshape(3, 4), "n": torch.tensor([1, 2, 3])}
        t = ring.put(batch)
        assert isinstance(t, dict) and torch.equal(t["x"], batch["x"]) and torch.equal(t["n"], batch["n"])
        kept = t["x"]  # the worker keeps a view of its batch
        got = sent(t)  # the receiver maps the slot
        assert type(got) is dict and torch.equal(got["x"], batch["x"])
        del t
        again = sent(got)  # a plain dict of tensors now
        assert torch.equal(again["x"], batch["x"])
        del got, again
        # The receiver let go, the worker still holds a view: the slot is not reused.
        t2 = ring.put({"x": torch.zeros(3, 4), "n": torch.tensor([0, 0, 0])})
        assert t2._slot.slot == 1 and torch.equal(kept, batch["x"])
        del kept
        t3 = ring.put({"x": torch.ones(3, 4), "n": torch.tensor([4, 5, 6])})
        assert t3._slot.slot == 0
        # A copy (DataLoader's default_convert makes one) sends the slot once; the other sends its tensors.
        c = copy.copy(t3)
        assert isinstance(c, _shared.Ticket)
        assert c._reduce_for_queue()[0] is _shared._open_batch
        assert t3._reduce_for_queue()[0] is dict
        # A changed ticket is sent as the dict it became.
        t2["extra"] = torch.tensor(7)
        r = sent(t2)
        assert type(r) is dict and set(r) == {"x", "n", "extra"} and int(r["extra"]) == 7
        assert type(copy.deepcopy(t2)) is dict
        # Pickled by user code in the worker (not through a queue): its tensors, and the slot stays the
        # worker's, free again once the ticket is gone.
        del c, t3, r, t2
        t4 = ring.put({"x": torch.full((3, 4), 2.0), "n": torch.tensor([7, 8, 9])})
        mine = pickle.loads(pickle.dumps(t4))
        assert type(mine) is dict and torch.equal(mine["x"], torch.full((3, 4), 2.0))
        slot = t4._slot.slot
        del t4
        assert ring.put({"x": torch.zeros(3, 4), "n": torch.tensor([0, 0, 0])})._slot.slot == slot
        assert sent(ring.put({"x": torch.ones(3, 4), "n": torch.tensor([1, 1, 1])}))["x"].sum() == 12
    finally:
        ring.close()


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_worker_batches_through_reused_shared_memory(torch, tmp_path, layout, monkeypatch):
    """DataLoader workers send batches through slots of their own shared memory: the batches equal those sent
    the ordinary way, a batch kept is never overwritten (a worker that finds no free slot makes another),
    slots are reused once the main process drops a batch, and the files go with the workers."""
    from torch.utils.data import DataLoader

    from cntkio import _shared

    d = data(tmp_path, n=400, chunk=200)
    ds = ct.IterableDataset(d, batch_size=8, seed=4, layout=layout, with_keys=True)
    with monkeypatch.context() as m, warnings.catch_warnings():
        m.setattr(_shared, "available", lambda: False)  # the (forked) workers send whole batches
        # PyTorch's own unpickling of a sparse CSR tensor warns about its invariant checks.
        warnings.filterwarnings("ignore", message=".*[Ss]parse invariant checks are implicitly disabled.*")
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        plain = list(DataLoader(ds, batch_size=None, num_workers=2))
    before = set(_cntkio_shm())
    kept = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(kept) == len(plain) > 40
    for b, want in zip(kept, plain):
        assert b.keys() == want.keys()
        for k in b:
            x, y = b[k], want[k]
            if x.layout == torch.sparse_csr:
                x, y = x.to_dense(), y.to_dense()
            assert torch.equal(x, y), k
    if _shared.available():
        # Dropping each batch: the workers reuse a few slots instead of making one per batch.
        most = 0
        for i, b in enumerate(DataLoader(ds, batch_size=None, num_workers=2)):
            del b
            if i % 5 == 0:
                most = max(most, len(set(_cntkio_shm()) - before))
        assert 0 < most < 20, most
        del kept
        import gc
        import time

        gc.collect()
        for _ in range(50):  # the workers have exited: their files are gone
            if not set(_cntkio_shm()) - before:
                break
            time.sleep(0.1)
        assert not set(_cntkio_shm()) - before
