"""cntkio.grain.IterDataset: cntkio.Loader's batches epoch after epoch as a Grain source; its iterators' state
resumes exactly, also through Grain transformations."""

from __future__ import annotations

import json
import logging
import random
from typing import Any, Dict, List

import numpy as np
import pytest

import cntkio
from test_loader import defs, write_data

grain = pytest.importorskip("grain")
import cntkio.grain as cg  # noqa: E402


def arrays(d: Dict[str, Any]) -> Dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in d.items()}


def loader_epochs(opts: Dict[str, Any], epochs: range) -> List[Dict[str, np.ndarray]]:
    loader = cntkio.Loader(**opts)
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out.extend(arrays(d) for d in loader)
    return out


def assert_same(got: List[Dict[str, Any]], want: List[Dict[str, Any]]) -> None:
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            assert np.array_equal(g[k], w[k]), k


@pytest.fixture
def opts(tmp_path: Any) -> Dict[str, Any]:
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(31), 250, 3)
    return dict(paths=path, streams=defs(), batch_size=24, seed=5, chunkSizeInBytes=700, with_keys=True,
                sparse="dense")


def test_epochs_are_the_loaders(opts):
    ds = cg.IterDataset(**opts, first_epoch=2, num_epochs=3)
    assert isinstance(ds, grain.IterDataset)
    got = [arrays(d) for d in ds]
    assert_same(got, loader_epochs(opts, range(2, 5)))
    assert len(ds) == len(got)
    # Without num_epochs it goes on: the first batches of epoch 1 follow epoch 0.
    endless = iter(cg.IterDataset(**opts))
    want = loader_epochs(opts, range(0, 2))
    assert_same([arrays(next(endless)) for _ in range(len(want))], want)


@pytest.mark.parametrize("stop", [0, 3, "epoch end", "second epoch"])
def test_state_resumes_exactly_through_a_pipeline(opts, stop):
    ds = cg.IterDataset(**opts, num_epochs=2).map(lambda d: {**d, "n": len(d["keys"])})
    full = [d["keys"].tolist() for d in ds]
    per_epoch = len(cntkio.Loader(**opts))
    k = {"epoch end": per_epoch, "second epoch": per_epoch + 2}.get(stop, stop)
    it = iter(ds)
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # as Grain's checkpointing stores it
    resumed = iter(cg.IterDataset(**opts, num_epochs=2).map(lambda d: {**d, "n": len(d["keys"])}))
    resumed.set_state(state)
    assert [d["keys"].tolist() for d in resumed] == full[k:]
    # An iterator set back to an earlier state goes on from there too.
    it.set_state(state)
    assert [d["keys"].tolist() for d in it] == full[k:]


def test_an_epoch_without_batches_ends_an_endless_dataset(tmp_path, caplog):
    path = tmp_path / "one.ctf"
    write_data(path, random.Random(32), 20, 2)
    # One chunk dealt to two ranks with shuffle: rank 1 gets none.
    ds = cg.IterDataset(paths=path, streams=defs(), batch_size=8, world_size=2, rank=1)
    with caplog.at_level(logging.WARNING, logger="cntkio.grain"):
        assert list(ds) == []
    assert "holds no batch" in caplog.text


def test_errors(opts):
    with pytest.raises(cntkio.UsageError, match="num_epochs must be a positive integer"):
        cg.IterDataset(**opts, num_epochs=0)
    with pytest.raises(cntkio.UsageError, match="first_epoch must be a non-negative integer"):
        cg.IterDataset(**opts, first_epoch=-1)
    with pytest.raises(cntkio.UsageError, match="did you mean 'batch_size'"):
        cg.IterDataset(**opts, batch_sise=3)
    with pytest.raises(TypeError, match="no end"):
        len(cg.IterDataset(**opts))


def test_grain_workers_read_one_partition_each_and_resume(opts):
    """mp_prefetch: each of Grain's worker processes reads a partition of its own (the sequences once in all),
    and the pipeline's state resumes it."""
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags (an absl app parses them)
    ds = cg.IterDataset(**opts, num_epochs=1)
    mp = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    batches = [d["keys"].tolist() for d in mp]
    keys = [k for b in batches for k in b]
    assert sorted(keys) == sorted(k for d in cntkio.Loader(**opts) for k in d["keys"].tolist())
    assert len(keys) == len(set(keys)) == 250
    it = iter(mp)
    for _ in range(3):
        next(it)
    state = it.get_state()
    resumed = iter(cg.IterDataset(**opts, num_epochs=1).mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    resumed.set_state(state)
    assert [d["keys"].tolist() for d in resumed] == batches[3:]
    with pytest.raises(cntkio.UsageError, match="slice"):
        ds.set_slice(slice(0, 10))
