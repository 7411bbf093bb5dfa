#!/usr/bin/env python3
"""Throughput of ``MinibatchSource.next_minibatch`` into NumPy, randomization on (the issue's target: ≥ 1 M
samples/s on the dense benchmark data read from CBF).

    python3 tools/gen_bench_data.py dense /root/py/dense.ctf 300
    cntkio convert /root/py/dense.ctf /root/py/dense.cbf --stream features:100:dense --stream labels:10:dense
    python3 python/bench_minibatch.py /root/py/dense.cbf [--mb-size 256] [--sweeps 3] [--repeat 3] [--mmap]

CTF files need their streams: ``--stream features:100:dense --stream labels:10:dense``. Each minibatch is
turned into the arrays a training loop takes (``values`` of every stream, and ``asarray()`` — a view — of
dense streams); the first sweep is included (chunks are read and decoded as the randomizer needs them).
Prints samples/s and MB/s of values for each repetition and the best.
"""

from __future__ import annotations

import argparse
import time

import cntkio


def parse_stream(spec: str) -> tuple:
    parts = spec.split(":")
    if len(parts) not in (3, 4) or parts[2] not in ("dense", "sparse"):
        raise SystemExit(f"--stream NAME:DIM:dense|sparse[:ALIAS], found {spec!r}")
    name, dim, kind = parts[:3]
    alias = parts[3] if len(parts) == 4 else name
    return name, cntkio.StreamDef(field=alias, shape=int(dim), is_sparse=kind == "sparse")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--stream", action="append", default=[], help="NAME:DIM:dense|sparse[:ALIAS] (CTF)")
    ap.add_argument("--mb-size", type=int, default=256)
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-randomize", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mmap", action="store_true", help="read the file through a memory map")
    args = ap.parse_args()

    if cntkio.detect_format(args.path) == "ctf":
        if not args.stream:
            raise SystemExit("a CTF file needs --stream NAME:DIM:dense|sparse for each stream")
        d: cntkio._Deserializer = cntkio.CTFDeserializer(args.path, cntkio.StreamDefs(**dict(map(parse_stream, args.stream))))
    else:
        d = cntkio.CBFDeserializer(args.path)
    if args.mmap:
        d["mmap"] = True
    d.open()  # index / header outside the timing
    best = 0.0
    for r in range(args.repeat):
        src = cntkio.MinibatchSource(
            d, randomize=not args.no_randomize, randomization_seed=args.seed + r, max_sweeps=args.sweeps
        )
        samples = nbytes = batches = 0
        first_sweep = None
        t0 = time.perf_counter()
        while True:
            mb = src.next_minibatch(args.mb_size)
            if not mb:
                break
            for s in mb.values():
                nbytes += s.values.nbytes
                if not s.is_sparse:
                    s.asarray()
            samples += mb.num_samples
            batches += 1
            if first_sweep is None and mb.end_of_sweep:
                first_sweep = (samples, time.perf_counter() - t0)
        dt = time.perf_counter() - t0
        rate = samples / dt
        best = max(best, rate)
        print(
            f"run {r + 1}: {samples} samples in {batches} minibatches of {args.mb_size}, {dt:.3f} s: "
            f"{rate / 1e6:.2f} M samples/s, {nbytes / dt / 1e6:.0f} MB/s of values "
            f"({'randomized' if src.randomized else 'file order'})"
        )
        if first_sweep is not None and args.sweeps > 1:
            n1, t1 = first_sweep
            print(
                f"       first sweep (every chunk read and decoded) {n1 / t1 / 1e6:.2f} M samples/s, "
                f"later sweeps {(samples - n1) / (dt - t1) / 1e6:.2f} M samples/s"
            )
    print(f"best: {best / 1e6:.2f} M samples/s")


if __name__ == "__main__":
    main()
