#!/usr/bin/env python3
"""The feed of a training loop, side by side in one run: how many samples per second each path from a CNTK
file to a training step delivers (one epoch each, shuffled, batches of ``--batch-size`` samples).

    python3 tools/gen_bench_data.py dense /tmp/dense.ctf 1000
    cntkio convert /tmp/dense.ctf /tmp/dense.cbf --stream features:100:dense --stream labels:10:dense
    python3 python/bench_feed.py /tmp/dense.cbf [--batch-size 4096] [--repeat 3] [--threads N]

Rows (each the best of ``--repeat`` epochs, the paths taking turns so that the machine's load falls on all):

* ``native``: ``cntkio batches --bench`` (native assembly, no Python), the ceiling of the others; and the best
  later sweep of a run of three (``--max-sweeps 3``), which finds its window's chunks loaded, as the ceiling of
  the ``kept across epochs`` rows;
* ``numpy Loader``: :class:`cntkio.Loader`, touching each batch's arrays: a new loader's epoch, and in the
  ``kept across epochs`` row the second epoch of a loader (``set_epoch`` after the first), as a training run
  that keeps its loader sees every epoch after the first: its chunks stay loaded from one epoch to the next;
* ``jax Loader``: :class:`cntkio.jax.Loader` on JAX's default device (where JAX is installed), each batch's
  arrays ready (``block_until_ready``);
* ``MinibatchSource.next_minibatch``: CNTK's API, one call per minibatch;
* ``torch Loader`` (with ``pin_memory`` where CUDA is present): :class:`cntkio.torch.Loader` (also kept across
  epochs);
* ``DataLoader(IterableDataset), W workers``: ``torch.utils.data.DataLoader`` over
  :class:`cntkio.torch.IterableDataset` with 0 and ``--workers`` (default 2) worker processes, started for each
  epoch (DataLoader's default) and, in the ``persistent`` row, once for all epochs (``persistent_workers=True``);
  with 0 workers, also the second epoch of one dataset;
* ``DataLoader's own ceiling``: the same DataLoader over items without data (one per batch): what DataLoader's
  worker processes and hand-over alone cost, as the rate no dataset can pass through them;
* with CUDA, a training step of a 100→1024→1024→10 MLP (dims from the file) fed by
  ``cntkio.torch.Loader(device="cuda")``, against the same steps on batches already on the GPU.

CBF files are memory-mapped, as the Python API maps them by default (``--read``: positional reads,
``mmap=False``). CTF files need ``--stream NAME:DIM:dense|sparse`` for each stream. Prints a Markdown table
(``--json`` for JSON lines).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

# This script lives beside the package's sources (python/cntkio, without the compiled extension): import the
# installed package instead.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
import cntkio  # noqa: E402


def parse_stream(spec: str) -> tuple:
    parts = spec.split(":")
    if len(parts) not in (3, 4) or parts[2] not in ("dense", "sparse"):
        raise SystemExit(f"--stream NAME:DIM:dense|sparse[:ALIAS], found {spec!r}")
    name, dim, kind = parts[:3]
    alias = parts[3] if len(parts) == 4 else name
    return name, cntkio.StreamDef(field=alias, shape=int(dim), is_sparse=kind == "sparse")


def touch(batch: Dict[str, Any]) -> int:
    """Reads one value of each array (as a training step's first use would) and returns the samples."""
    n = 0
    for k, v in batch.items():
        if k.endswith("_lengths"):
            n = max(n, int(v.sum()))
        elif hasattr(v, "block_until_ready"):
            v.block_until_ready()  # a jax.Array: placed on its device asynchronously
        elif hasattr(v, "shape") and len(v.shape) and v.shape[0]:
            v[0]
    return n


def rate(batches: Any) -> float:
    """Samples per second of iterating ``batches`` (an iterable made beforehand), touching each batch."""
    t = time.perf_counter()
    n = 0
    for b in batches:
        n += touch(b)
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--stream", action="append", default=[], help="NAME:DIM:dense|sparse[:ALIAS] (CTF)")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="native threads (default: all cores)")
    ap.add_argument("--workers", type=int, action="append", default=[],
                    help="DataLoader workers of a worker row (repeat for several rows; default 2)")
    ap.add_argument("--skip", action="append", default=[], help="leave out rows whose name contains this")
    ap.add_argument("--train-batches", type=int, default=300, help="training steps per timed run (CUDA rows)")
    ap.add_argument("--read", action="store_true",
                    help="read CBF files with positional reads (mmap=False; native with --no-mmap) instead of mapping them")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    threads = args.threads or cntkio._loader.default_threads()
    streams = cntkio.StreamDefs(**dict(map(parse_stream, args.stream))) if args.stream else None
    opts: Dict[str, Any] = dict(paths=args.path, streams=streams, batch_size=args.batch_size, shuffle=True,
                                seed=args.seed)
    cli_streams = [a for s in args.stream for a in ("--stream", s)]
    # Python and `cntkio batches` map CBF files by default; --read reads them on both sides.
    mapped = cntkio.detect_format(args.path) == "cbf" and not args.read
    if args.read:
        opts["mmap"] = False
    cli_access = ["--no-mmap"] if args.read and cntkio.detect_format(args.path) == "cbf" else []
    rows: Dict[str, List[float]] = {}
    notes: Dict[str, str] = {}

    def native_run(*more: str) -> Dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "cntkio", "batches", args.path, *cli_streams, "--mb-size", str(args.batch_size),
             "--randomize", "--seed", str(args.seed), "--bench", "-j", str(threads), *cli_access, *more],
            check=True, capture_output=True, text=True,
        ).stdout
        return dict(json.loads(out))

    def native() -> float:
        return float(native_run()["samples_per_second"])

    def native_later_sweeps() -> float:
        """The best later sweep of a 3-sweep run: its window's chunks are loaded already, as a loader's later
        epochs find them."""
        return max(float(s["samples_per_second"]) for s in native_run("--max-sweeps", "3")["sweeps"][1:])

    def epoch(make: Callable[[], Any]) -> Callable[[], float]:
        return lambda: rate(make())

    paths: Dict[str, Callable[[], float]] = {"native (cntkio batches --bench)": native}
    paths["native, a later sweep of one run (--max-sweeps 3)"] = native_later_sweeps
    paths["numpy Loader"] = epoch(lambda: cntkio.Loader(**opts, num_threads=threads))
    paths["numpy Loader, kept across epochs"] = second_epoch(lambda: cntkio.Loader(**opts, num_threads=threads))

    def cntk_api() -> float:
        """CNTK's own API: ``MinibatchSource.next_minibatch`` in a loop, one sweep."""
        from cntkio.torch import _open_paths

        src = cntkio.MinibatchSource(_open_paths(args.path, streams, {}), randomization_seed=args.seed, max_sweeps=1)
        t = time.perf_counter()
        n = 0
        while True:
            mb = src.next_minibatch(args.batch_size)
            if not mb:
                return n / (time.perf_counter() - t)
            n += mb.num_samples

    paths["MinibatchSource.next_minibatch (CNTK's API)"] = cntk_api
    try:
        import cntkio.jax as cj

        cj._jax()
        paths["jax Loader"] = epoch(lambda: cj.Loader(**opts, num_threads=threads))
        paths["jax Loader, kept across epochs"] = second_epoch(lambda: cj.Loader(**opts, num_threads=threads))
    except ImportError:
        notes["jax"] = "JAX not installed: jax rows left out"
    torch: Optional[Any] = None
    try:
        import torch as _torch  # noqa: F401

        torch = _torch
    except ImportError:
        notes["torch"] = "PyTorch not installed: torch rows left out"
    cuda = torch is not None and torch.cuda.is_available()
    if torch is not None:
        import cntkio.torch as ct
        from torch.utils.data import DataLoader

        paths["torch Loader"] = epoch(lambda: ct.Loader(**opts, num_threads=threads))
        paths["torch Loader, kept across epochs"] = second_epoch(lambda: ct.Loader(**opts, num_threads=threads))
        if cuda:
            paths["torch Loader, pin_memory"] = epoch(lambda: ct.Loader(**opts, num_threads=threads, pin_memory=True))
        for w in sorted({0, *(args.workers or [2])}):
            def make(w: int = w) -> Any:
                ds = ct.IterableDataset(**opts)
                return DataLoader(ds, batch_size=None, num_workers=w, persistent_workers=False)
            paths[f"DataLoader(IterableDataset), {w} workers"] = epoch(make)
        paths["DataLoader(IterableDataset), 0 workers, kept across epochs"] = second_epoch(
            lambda: dataloader_of_one_dataset(ct, DataLoader, opts)
        )
        for w in sorted(set(args.workers or [2]) - {0}):
            paths[f"DataLoader(IterableDataset), {w} persistent workers"] = persistent(ct, DataLoader, opts, w)
            paths[f"DataLoader's own ceiling, {w} workers (batches without data)"] = dataloader_ceiling(
                torch, DataLoader, opts, w
            )
    if cuda:
        paths.update(training_rows(torch, opts, threads, args.train_batches))
    paths = {k: v for k, v in paths.items() if not any(s in k for s in args.skip)}

    # Warm-up: the file's pages in the cache, the index built, CUDA initialised.
    next(iter(cntkio.Loader(**opts, num_threads=threads)))
    for r in range(args.repeat):
        for name, run in paths.items():
            rows.setdefault(name, []).append(run())
            if not args.json:
                print(f"  round {r + 1}: {name}: {rows[name][-1] / 1e6:.2f} M samples/s", file=sys.stderr)

    native_best = max(rows.get("native (cntkio batches --bench)", [0.0]))
    later_best = max(rows.get("native, a later sweep of one run (--max-sweeps 3)", [0.0]))
    gpu_best = max(rows.get("MLP step on batches already on the GPU", [0.0]))
    machine = f"{os.cpu_count()} cores" + (f", {torch.cuda.get_device_name()}" if cuda else "")
    if args.json:
        for name, v in rows.items():
            print(json.dumps({"path": name, "samples_per_second": max(v), "runs": v, "machine": machine}))
        return
    access = "memory-mapped" if mapped else "read"
    print(f"{args.path} ({access}): batches of {args.batch_size}, shuffled, {threads} native threads; {machine}; "
          f"best of {args.repeat}")
    print()
    print("| path | M samples/s | vs native | vs MLP on GPU data |")
    print("|---|---|---|---|")
    for name, v in rows.items():
        best = max(v)
        # Epochs after the first, and later sweeps, against the native later sweep.
        later = any(w in name for w in ("kept across", "persistent", "later"))
        ref = later_best if later_best and later else native_best
        vs_native = f"{best / ref:.2f}×" if ref and "MLP" not in name else ""
        vs_gpu = f"{best / gpu_best:.0%}" if gpu_best and "MLP" in name else ""
        print(f"| {name} | {best / 1e6:.2f} | {vs_native} | {vs_gpu} |")
    if later_best:
        print("\nvs native: the rows of epochs after the first (kept across epochs, persistent workers) against the "
              "native later sweep, the others against the native run")
    for k, v in notes.items():
        print(f"\n{k}: {v}")


def second_epoch(make: Callable[[], Any]) -> Callable[[], float]:
    """The rate of the second epoch of a loader made by ``make()`` (``set_epoch(1)`` after a first epoch, not
    timed, itself after ``set_epoch(0)``), as a training run that keeps its loader sees every epoch after the
    first. The loader goes after each call: what it holds would make the other rows' worker processes slower
    to fork."""

    def run() -> float:
        loader = make()
        loader.set_epoch(0)
        rate(loader)
        loader.set_epoch(1)
        return rate(loader)

    return run


def persistent(ct: Any, data_loader: Any, opts: Dict[str, Any], workers: int) -> Callable[[], float]:
    """One epoch per call of one DataLoader kept across calls (``persistent_workers=True``, ``set_epoch``
    between epochs), as a training run keeps it: the worker processes start once."""
    ds = ct.IterableDataset(**opts)
    loader = data_loader(ds, batch_size=None, num_workers=workers, persistent_workers=True)
    rounds = [0]

    def run() -> float:
        ds.set_epoch(rounds[0])
        rounds[0] += 1
        return rate(loader)

    return run


class _EpochsOfDataset:
    """A DataLoader over one ``IterableDataset`` whose ``set_epoch`` sets the dataset's epoch."""

    def __init__(self, ds: Any, loader: Any) -> None:
        self.ds = ds
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.ds.set_epoch(epoch)

    def __iter__(self) -> Any:
        return iter(self.loader)


def dataloader_of_one_dataset(ct: Any, data_loader: Any, opts: Dict[str, Any]) -> Any:
    """A DataLoader with no worker process over one ``IterableDataset`` kept across epochs."""
    ds = ct.IterableDataset(**opts)
    return _EpochsOfDataset(ds, data_loader(ds, batch_size=None, num_workers=0))


class _Count(int):
    """A batch's number of samples, standing for the batch in the ``DataLoader's own ceiling`` row."""

    def sum(self) -> int:
        return int(self)


def dataloader_ceiling(torch: Any, data_loader: Any, opts: Dict[str, Any], workers: int) -> Callable[[], float]:
    """What DataLoader itself costs with ``workers`` new worker processes per epoch: an epoch of as many
    items as the data has batches, each a small object that DataLoader passes on as it is (as it passes the
    tickets of cntkio's workers), read as the other rows read theirs; as a rate, the epoch's samples over that
    time — the most any dataset can deliver through it on this machine."""
    import cntkio.torch as ct

    sizes = [touch(b) for b in ct.Loader(**opts)]

    class Items(torch.utils.data.IterableDataset):  # type: ignore[misc,name-defined]
        def __iter__(self) -> Any:
            info = torch.utils.data.get_worker_info()
            w, n = (info.id, info.num_workers) if info is not None else (0, 1)
            for size in sizes[w::n]:
                yield {"x_lengths": _Count(size)}

    return lambda: rate(data_loader(Items(), batch_size=None, num_workers=workers, persistent_workers=False))


def training_rows(torch: Any, opts: Dict[str, Any], threads: int, steps: int) -> Dict[str, Callable[[], float]]:
    """The MLP step fed by the Loader on the GPU, and on batches already there."""
    import cntkio.torch as ct

    device = torch.device("cuda")
    probe = next(iter(ct.Loader(**opts, num_threads=threads)))
    names = [k for k in probe if not k.endswith("_lengths")]
    x_name, y_name = names[0], names[-1]
    d_in, d_out = probe[x_name].shape[1], probe[y_name].shape[1]
    model = torch.nn.Sequential(
        torch.nn.Linear(d_in, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, d_out),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(x: Any, y: Any) -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    resident = [
        (b[x_name].to(device), b[y_name].to(device)) for _, b in zip(range(64), ct.Loader(**opts, num_threads=threads))
    ]

    def on_gpu() -> float:
        for x, y in resident[:10]:
            step(x, y)
        torch.cuda.synchronize()
        t = time.perf_counter()
        n = 0
        for i in range(steps):
            x, y = resident[i % len(resident)]
            step(x, y)
            n += x.shape[0]
        torch.cuda.synchronize()
        return n / (time.perf_counter() - t)

    # One loader per row for all rounds, as a training run keeps its loader across epochs (its buffers,
    # page-locked once, are reused): the best round is the steady state.
    loaders = {pin: ct.Loader(**opts, num_threads=threads, device=device, pin_memory=pin) for pin in (True, False)}
    rounds = {True: 0, False: 0}

    def fed(pin_memory: bool = True) -> float:
        # Timed from the 10th step on: the steady state, as on_gpu (the first batches wait for the
        # randomization window's chunks, which the native and epoch rows include).
        loader = loaders[pin_memory]
        loader.set_epoch(rounds[pin_memory])
        rounds[pin_memory] += 1
        n = 0
        t = 0.0
        for i, b in enumerate(loader):
            if i == 10:
                torch.cuda.synchronize()
                t = time.perf_counter()
                n = 0
            if i == steps + 10:
                break
            step(b[x_name], b[y_name])
            n += b[x_name].shape[0]
        torch.cuda.synchronize()
        return n / (time.perf_counter() - t)

    def fed_pageable() -> float:
        return fed(pin_memory=False)

    return {
        "MLP step fed by torch Loader(device='cuda')": fed,
        "MLP step fed by torch Loader(device='cuda', pin_memory=False)": fed_pageable,
        "MLP step on batches already on the GPU": on_gpu,
    }


if __name__ == "__main__":
    main()
