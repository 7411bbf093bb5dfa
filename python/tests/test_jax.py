"""cntkio.jax.Loader: cntkio.Loader's batches as jax.Arrays — the same values in the same order, padded to fixed
shapes on request, laid out across devices and processes by a sharding; resuming counts what was yielded.

Every case runs in an interpreter of its own (jax_cases.py, or a script here): once JAX has started its
threads, forking the test process (DataLoader workers in later tests) would be unsafe."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict

import pytest

from test_loader import write_data

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
HERE = Path(__file__).parent


def isolated(case: str, tmp_path: Path, *params: Any) -> None:
    """Runs ``jax_cases.CASE(tmp_path, *params)`` in a new interpreter (warnings are errors there too)."""
    out = subprocess.run(
        [sys.executable, "-W", "error", str(HERE / "jax_cases.py"), case, str(tmp_path), json.dumps(params)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(HERE)),
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-6000:]


@pytest.mark.parametrize("opts", range(4))
def test_batches_are_those_of_cntkio_loader(tmp_path, opts):
    isolated("test_batches_are_those_of_cntkio_loader", tmp_path, opts)


@pytest.mark.parametrize(
    "case",
    [
        "test_pad_to_gives_every_batch_the_same_shapes",
        "test_pad_to_and_pad_length_with_the_padded_layout",
        "test_state_counts_the_batches_yielded_not_those_placed_ahead",
        "test_kept_batches_stay_intact",
        "test_errors_and_pickling",
    ],
)
def test_case(tmp_path, case):
    isolated(case, tmp_path)


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_padding_batches_are_shaped_as_the_padded_ones(tmp_path, layout):
    isolated("test_padding_batches_are_shaped_as_the_padded_ones", tmp_path, layout)


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
