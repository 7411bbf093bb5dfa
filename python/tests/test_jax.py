"""cntkio.jax.Loader: cntkio.Loader's batches as jax.Arrays — the same values in the same order, padded to fixed
shapes on request, laid out across devices and processes by a sharding; resuming counts what was yielded."""

from __future__ import annotations

import gc
import json
import os
import pickle
import random
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import cntkio
from test_loader import assert_resume_continues, defs, write_data

jax = pytest.importorskip("jax")
import cntkio.jax as cj  # noqa: E402


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


@pytest.mark.parametrize("opts", OPTIONS)
def test_batches_are_those_of_cntkio_loader(tmp_path, opts):
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


@pytest.mark.parametrize("layout", ["flat", "padded"])
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


def run_script(code: str, env: Dict[str, str], timeout: int = 240) -> str:
    full = dict(os.environ, **env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_double_precision_with_64_bit_mode(tmp_path):
    path = tmp_path / "data.ctf"
    path.write_text("0 |a 0.1 0.2 0.30000000000000004 |b 1:1\n1 |a 1e-300 2 3 |b 2:0.5\n")
    code = f"""
        import numpy as np, cntkio, cntkio.jax
        from test_loader import defs
        opts = dict(paths={str(path)!r}, streams=defs(), precision="double", batch_size=2, shuffle=False)
        [d] = list(cntkio.jax.Loader(**opts))
        [w] = list(cntkio.Loader(sparse="dense", **opts))
        assert d["a"].dtype == np.float64 and d["a_lengths"].dtype == np.int64
        assert np.array_equal(np.asarray(d["a"]), w["a"]) and np.array_equal(np.asarray(d["b"]), w["b"])
        print("ok")
    """
    env = {"JAX_ENABLE_X64": "1", "PYTHONPATH": str(Path(__file__).parent)}
    assert run_script(code, env).strip() == "ok"


def test_sharding_lays_batches_out_across_devices(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(27), 300, 3)
    code = f"""
        import numpy as np, jax, cntkio, cntkio.jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from test_loader import defs
        assert len(jax.devices()) == 4
        sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
        opts = dict(paths={str(path)!r}, streams=defs(), batch_size=16, seed=7, chunkSizeInBytes=600)
        want = [{{k: np.array(v) for k, v in d.items()}} for d in cntkio.Loader(sparse="dense", **opts)]
        got = list(cntkio.jax.Loader(sharding=sharding, pad_to=16, **opts))
        assert len(got) == len(want) > 3
        for g, w in zip(got, want):
            for name in ("a", "b"):
                x = g[name]
                n = len(w[name])
                assert x.sharding == sharding and x.shape[0] % 16 == 0
                shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start)
                assert len(shards) == 4 and {{s.data.shape[0] for s in shards}} == {{x.shape[0] // 4}}
                assert np.array_equal(np.concatenate([np.asarray(s.data) for s in shards])[:n], w[name])
        try:
            list(cntkio.jax.Loader(sharding=sharding, pad_to=6, **opts))
        except cntkio.UsageError as e:
            assert "pad_to=6 must be a multiple" in str(e), e
        else:
            raise AssertionError("pad_to=6 over 4 devices was taken")
        print("ok")
    """
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PYTHONPATH": str(Path(__file__).parent)}
    assert run_script(code, env).strip() == "ok"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("balanced", [True, False])
def test_processes_make_global_arrays_of_their_partitions(tmp_path, balanced):
    """Two processes (jax.distributed), two CPU devices each: each loader reads its rank's partition (rank and
    world size from JAX), the batch is the global array of both processes' padded parts, and both yield as
    many batches (CNTK's chunk dealing gives the ranks unequal shares: the shorter pads with empty batches)."""
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(28), 400, 3)
    port = free_port()
    code = """
        import sys, json, numpy as np, jax
        pid = int(sys.argv[1])
        jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=2, process_id=pid)
        import cntkio, cntkio.jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from test_loader import defs
        sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
        opts = dict(paths=PATH, streams=defs(), batch_size=16, seed=8, chunkSizeInBytes=CHUNK,
                    balanced_workers=BALANCED)
        loader = cntkio.jax.Loader(sharding=sharding, pad_to=16, with_keys=True, **opts)
        assert (loader.rank, loader.world_size) == (pid, 2), (loader.rank, loader.world_size)
        mine = [{k: np.array(v) for k, v in d.items()}
                for d in cntkio.Loader(sparse="dense", rank=pid, world_size=2, with_keys=True, **opts)]
        got = list(loader)
        assert len(got) >= len(mine) > 3
        for i, g in enumerate(got):
            x = g["a"]
            assert x.shape == (32, 3) and not x.is_fully_addressable
            local = sorted(x.addressable_shards, key=lambda s: s.index[0].start)
            assert local[0].index[0].start == 16 * pid
            part = np.concatenate([np.asarray(s.data) for s in local])
            mask = np.concatenate([np.asarray(s.data) for s in
                                   sorted(g["a_mask"].addressable_shards, key=lambda s: s.index[0].start)])
            if i < len(mine):
                w = mine[i]
                assert np.array_equal(g["keys"], w["keys"])
                assert np.array_equal(part[: len(w["a"])], w["a"]) and not part[len(w["a"]):].any()
                assert mask.sum() == len(w["a"])
            else:  # padding: this partition has ended
                assert len(g["keys"]) == 0 and not part.any() and not mask.any()
        print(json.dumps([len(got), len(mine), sum(len(d["keys"]) for d in got)]))
    """
    code = code.replace("PORT", str(port)).replace("PATH", repr(str(path))).replace("BALANCED", str(balanced))
    # Unbalanced: three chunks dealt to two ranks.
    code = code.replace("CHUNK", "600" if balanced else str(path.stat().st_size // 3 + 1))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=str(Path(__file__).parent))
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    try:
        results = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    counts = []
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
        counts.append(json.loads(out.strip().splitlines()[-1]))
    assert counts[0][0] == counts[1][0]  # as many batches in both processes
    assert sum(c[2] for c in counts) == 400  # the partitions cover the epoch
    if not balanced:
        assert counts[0][1] != counts[1][1], "the chunks are dealt unequally"
