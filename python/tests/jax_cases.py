"""The cases of test_jax.py that run in this process's JAX, each run in an interpreter of its own
(``python jax_cases.py CASE TMP_DIR PARAMS_JSON``): JAX's threads would make every fork of the test process
after them (DataLoader workers) unsafe."""

from __future__ import annotations

import gc
import json
import pickle
import random
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import cntkio
import cntkio.jax as cj
import jax
from test_loader import assert_resume_continues, defs, write_data


def numpy_batches(**opts: Any) -> List[Dict[str, Any]]:
    return [{k: np.array(v) for k, v in d.items()} for d in cntkio.Loader(sparse="dense", **opts)]


def host(batch: Dict[str, Any]) -> Dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in batch.items()}


OPTIONS = [
    dict(batch_size=16, seed=1, chunkSizeInBytes=600, num_threads=1, prefetch=1, device_prefetch=1),
    dict(batch_size=37, seed=2, chunkSizeInBytes=900, randomization_window_in_chunks=2, num_threads=3,
         prefetch=7, device_prefetch=4, with_keys=True),
    dict(batch_size=8, seed=3, chunkSizeInBytes=500, world_size=2, rank=1, balanced_workers=True, num_threads=2),
    dict(batch_size=20, shuffle=False, chunkSizeInBytes=700, layout="padded", with_keys=True),
]


def test_batches_are_those_of_cntkio_loader(tmp_path, i):
    opts = OPTIONS[i]
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(21), 300, 4)
    jopts = dict(opts)
    numpy_opts = {k: v for k, v in opts.items() if k != "device_prefetch"}
    loader = cj.Loader(paths=path, streams=defs(), **jopts)
    loader.set_epoch(2)
    got = list(loader)
    want_loader = cntkio.Loader(paths=path, streams=defs(), sparse="dense", **numpy_opts)
    want_loader.set_epoch(2)
    want = [{k: np.array(v) for k, v in d.items()} for d in want_loader]
    assert len(got) == len(want) == len(loader) > 3
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k, v in g.items():
            if k == "keys":
                assert isinstance(v, np.ndarray) and v.dtype == np.int64
            else:
                assert isinstance(v, jax.Array), k
            a = np.asarray(v)
            assert np.array_equal(a, w[k]), k
            if k.endswith("_lengths"):
                assert a.dtype == np.int32  # JAX's integer without 64-bit mode
            elif not k.endswith("_mask") and k != "keys":
                assert a.dtype == np.float32


def test_pad_to_gives_every_batch_the_same_shapes(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(22), 400, 5)
    opts = dict(paths=path, streams=defs(), batch_size=24, seed=4, chunkSizeInBytes=800, num_threads=2)
    want = numpy_batches(**opts)
    got = [host(d) for d in cj.Loader(**opts, pad_to=24)]
    assert len(got) == len(want)
    sizes = set()
    for g, w in zip(got, want):
        assert set(g) == set(w) | {"a_mask", "b_mask"}
        for name, dim in (("a", 3), ("b", 7)):
            n = len(w[name])
            rows = g[name].shape[0]
            # A batch of at most 24 samples is padded to 24; CNTK puts a longer sequence alone in a batch,
            # which is padded to the next multiple.
            assert rows == max(1, -(-n // 24)) * 24 and g[name].shape[1] == dim
            sizes.add(rows)
            assert np.array_equal(g[name][:n], w[name]) and not g[name][n:].any()
            assert np.array_equal(g[f"{name}_mask"], np.arange(rows) < n)
            lengths = g[f"{name}_lengths"]
            s = len(w[f"{name}_lengths"])
            assert lengths.shape == (24,)
            assert np.array_equal(lengths[:s], w[f"{name}_lengths"]) and not lengths[s:].any()
    assert sizes == {24}, "every batch of this data fits 24 samples"


def test_pad_to_and_pad_length_with_the_padded_layout(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(23), 200, 7)
    opts = dict(paths=path, streams=defs(), batch_size=30, seed=5, chunkSizeInBytes=600, layout="padded")
    want = numpy_batches(**opts)
    got = [host(d) for d in cj.Loader(**opts, pad_to=16, pad_length=4)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for name in ("a", "b"):
            s, longest = w[name].shape[:2]
            rows, width = g[name].shape[:2]
            assert rows == max(1, -(-s // 16)) * 16 and width == max(1, -(-longest // 4)) * 4
            assert np.array_equal(g[name][:s, :longest], w[name])
            assert not g[name][s:].any() and not g[name][:, longest:].any()
            assert g[f"{name}_mask"].shape == (rows, width)
            assert np.array_equal(g[f"{name}_mask"][:s, :longest], w[f"{name}_mask"])
            assert g[f"{name}_mask"].sum() == w[f"{name}_lengths"].sum()
            assert g[f"{name}_lengths"].shape == (rows,)


def test_padding_batches_are_shaped_as_the_padded_ones(tmp_path, layout):
    """The empty batches a process pads its epoch with (a sharding across processes) have the shapes and
    types of its batches, and hold nothing."""
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(29), 200, 3)
    opts = dict(paths=path, streams=defs(), batch_size=8, seed=5, layout=layout, with_keys=True)
    loader = cj.Loader(**opts, pad_to=8, **({"pad_length": 4} if layout == "padded" else {}))
    empty = loader._empty()
    real = next(iter(loader))
    assert empty.keys() == real.keys()
    for k, v in real.items():
        assert empty[k].shape[1:] == v.shape[1:] and empty[k].dtype == v.dtype, k
        if k != "keys":
            assert empty[k].shape == v.shape and not empty[k].any(), k
    assert empty["keys"].shape == (0,)


def test_state_counts_the_batches_yielded_not_those_placed_ahead(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(24), 300, 3)
    opts = dict(paths=path, streams=defs(), batch_size=20, seed=6, chunkSizeInBytes=600, with_keys=True,
                device_prefetch=3)
    assert_resume_continues(lambda: cj.Loader(**opts), (0, 2))


def test_kept_batches_stay_intact(tmp_path):
    """On the CPU, jax.device_put may share the loader's buffer instead of copying it: a buffer is reused only
    once no array of JAX's refers to it either."""
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(25), 600, 3)
    opts = dict(paths=path, streams=defs(), batch_size=16, seed=2, chunkSizeInBytes=700, num_threads=3, prefetch=2)
    want = numpy_batches(**opts)
    kept = []
    for i, d in enumerate(cj.Loader(**opts, device="cpu")):
        if i % 3 == 0:
            kept.append((i, d))
        del d
        gc.collect()
    assert len(kept) > 5
    for i, d in kept:
        for k, v in d.items():
            assert np.array_equal(np.asarray(v), want[i][k]), (i, k)


def test_errors_and_pickling(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(26), 60, 2)
    base = dict(paths=path, streams=defs())
    for kwargs, said in [
        ({"sparse": "csr"}, "densifies sparse streams"),
        ({"device": "cpu", "sharding": object()}, "give device or sharding, not both"),
        ({"device": 3}, "device must be a jax.Device"),
        ({"sharding": "data"}, "sharding must be a jax.sharding.Sharding"),
        ({"pad_to": 0}, "pad_to must be a positive integer"),
        ({"pad_length": 4}, "pad_length pads the time axis of layout='padded'"),
        ({"device_prefetch": 0}, "device_prefetch must be a positive integer"),
        ({"pad_too": 8}, "unknown argument 'pad_too' (did you mean 'pad_to'?)"),
    ]:
        with pytest.raises(cntkio.UsageError) as e:
            cj.Loader(**base, **kwargs)
        assert said in str(e.value), str(e.value)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    with pytest.raises(cntkio.UsageError, match="give pad_to"):
        cj.Loader(**base, sharding=sharding)
    # float64 values would be rounded by JAX without 64-bit mode.
    with pytest.raises(cntkio.UsageError, match="jax_enable_x64"):
        cj.Loader(**base, precision="double")
    loader = cj.Loader(**base, batch_size=7, seed=3, with_keys=True, pad_to=8)
    other = pickle.loads(pickle.dumps(loader))
    assert other.pad_to == 8
    assert [d["keys"].tolist() for d in other] == [d["keys"].tolist() for d in loader]
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(cj.Loader(**base, device="cpu"))


if __name__ == "__main__":
    case, tmp, params = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    globals()[case](tmp, *params)
