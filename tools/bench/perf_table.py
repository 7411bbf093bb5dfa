#!/usr/bin/env python3
"""Measures cntkio and the baselines that run on this machine, side by side, and prints the README's
performance table (Markdown).

    python3 tools/bench/perf_table.py [--dir DIR] [--quick] [--rounds N] [--size-mb MB]
        [--ctf2bin PATH/ctf2bin.py] [--python2 python2] [--feed-python PYTHON]

* Benchmark files (``tools/gen_bench_data.py``: dense and sparse CTF of ``--size-mb`` MB, and their CBF made
  by cntkio) are written to ``--dir`` (default ``$BENCH_DIR`` or ``/tmp/cntkio-bench``) when missing.
* Every command of every row runs once per round, all rows in turn, for ``--rounds`` rounds: a baseline
  sees the same moments of a shared machine as the cntkio command it is compared with. A figure is the
  median of the rounds. Each input is read into the page cache before each command.
* Figures are the wall time of the whole process (start, index, work, exit): MB/s of the input file (of
  the text written, for CBF to CTF), or samples per second for the minibatch rows.
* Baselines: ``ctf2bin.py`` (CNTK 2.7's CTF to CBF converter, ``--ctf2bin``, run with ``--python2``; its
  sparse path needs Python 2) and the Python model of CNTK 2.7's reader that ships in ``testdata/model``
  (a model written for the conformance tests, not CNTK: a reference for an interpreter's speed). Both are
  too slow for the whole file: they run on its first ``--slice-mb`` MB (``--model-mb`` for the model),
  and their figure is MB/s of that slice. A baseline that is not found is left out, with a note.
* The Python feed row runs ``python/bench_feed.py`` with ``--feed-python`` (an interpreter with the
  ``cntkio`` package installed; left out when it cannot import it).

``--quick``: 200 MB files, 3 rounds, 5 MB slices (1 MB for the model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = {
    "dense": ["-s", "features:100:dense", "-s", "labels:10:dense"],
    "sparse": ["-s", "features:100000:sparse", "-s", "labels:10:sparse"],
}
HEADER = {
    "dense": "features features dense 100\nlabels labels dense 10\n",
    "sparse": "features features sparse 100000\nlabels labels sparse 10\n",
}
STREAMS = {
    kind: [
        dict(name="features", alias="features", dense=kind == "dense", dim=100 if kind == "dense" else 100000),
        dict(name="labels", alias="labels", dense=kind == "dense", dim=10),
    ]
    for kind in ("dense", "sparse")
}

# Runs the Python model of CNTK's CTF reader over a whole file: index, then load every sequence.
MODEL_CTF = """
import json, sys
sys.path.insert(0, sys.argv[1])
import ctfref
data = open(sys.argv[2], 'rb').read()
streams = json.loads(sys.argv[3])
parser = ctfref.Parser(data, streams, 0, 0, 'x')
samples = 0
for chunk in ctfref.index(data):
    for seq in chunk.seqs:
        parser.load(seq)
        samples += seq.ns
print(json.dumps({"samples": samples}))
"""

# Runs the Python model of CNTK's CBF reader over a whole file: decode every chunk.
MODEL_CBF = """
import json, sys
sys.path.insert(0, sys.argv[1])
import cbfref
d = cbfref.CBFDeser(sys.argv[2])
samples = 0
for info in d.chunk_infos():
    d.load_chunk(info.id)
    d.cache.clear()
    samples += info.ns
print(json.dumps({"samples": samples}))
"""


@dataclass
class Cmd:
    """One command of a row, timed once per round."""

    key: str
    argv: List[str]
    inputs: List[str]
    size: int  # bytes the MB/s figure divides by (0: samples/s from the command's JSON output)
    cleanup: List[str] = field(default_factory=list)
    walls: List[float] = field(default_factory=list)
    rss: List[int] = field(default_factory=list)
    samples: List[float] = field(default_factory=list)


def run_timed(cmd: Cmd) -> None:
    for path in cmd.inputs:
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd.argv, stdout=out, stderr=err)
        # wait4 gives this child's own peak RSS (getrusage's children figure is a maximum over all of them).
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"perf_table: {' '.join(cmd.argv)} failed ({proc.returncode}):\n{stderr.decode()[-2000:]}")
    cmd.rss.append(usage.ru_maxrss * 1024)
    cmd.walls.append(wall)
    if cmd.size == 0:
        info = json.loads(stdout.decode().strip().splitlines()[-1])
        cmd.samples.append(info["samples"] / wall)
    for path in cmd.cleanup:
        if os.path.exists(path):
            os.remove(path)


def median(xs: List[float]) -> float:
    return statistics.median(xs)


def mbps(cmd: Cmd) -> float:
    return cmd.size / median(cmd.walls) / 1e6


def msps(cmd: Cmd) -> float:
    return median(cmd.samples) / 1e6


def prepare(args: argparse.Namespace, cntkio: str) -> Dict[str, str]:
    """The benchmark files, made when missing; returns their paths by name."""
    os.makedirs(args.dir, exist_ok=True)
    files: Dict[str, str] = {}
    for kind in ("dense", "sparse"):
        ctf = os.path.join(args.dir, f"{kind}-{args.size_mb}.ctf")
        if not os.path.exists(ctf):
            print(f"perf_table: writing {ctf}", file=sys.stderr)
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_bench_data.py"), kind, ctf,
                            str(args.size_mb)], check=True)
        cbf = ctf[:-4] + ".cbf"
        if not os.path.exists(cbf):
            subprocess.run([cntkio, "convert", "-q", ctf, cbf] + SCHEMA[kind], check=True)
        for name, mb in (("slice", args.slice_mb), ("model", args.model_mb)):
            part = os.path.join(args.dir, f"{kind}-{name}-{mb:g}.ctf")
            if not os.path.exists(part):
                with open(ctf, "rb") as f:
                    head = f.read(int(mb * 1e6))
                with open(part, "wb") as f:
                    f.write(head[: head.rfind(b"\n") + 1])
            files[f"{kind}.{name}"] = part
        part_cbf = files[f"{kind}.model"][:-4] + ".cbf"
        if not os.path.exists(part_cbf):
            subprocess.run([cntkio, "convert", "-q", files[f"{kind}.model"], part_cbf] + SCHEMA[kind], check=True)
        header = os.path.join(args.dir, f"{kind}.header")
        with open(header, "w") as f:
            f.write(HEADER[kind])
        files.update({f"{kind}.ctf": ctf, f"{kind}.cbf": cbf, f"{kind}.model.cbf": part_cbf,
                      f"{kind}.header": header})
    return files


def machine() -> str:
    """The processor, its cores and whether the parser's vector paths (AVX-512) can run on it."""
    model, flags = "unknown processor", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown processor":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line
    except OSError:
        pass
    vector = "with AVX-512" if " avx512_vbmi2" in flags or " avx512vbmi2" in flags else "without AVX-512"
    return f"{model}, {os.cpu_count()} cores, {vector}"


def feed_python_ok(python: str) -> bool:
    r = subprocess.run([python, "-c", "import cntkio, numpy"], capture_output=True)
    return r.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.environ.get("BENCH_DIR", "/tmp/cntkio-bench"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "cntkio"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--size-mb", type=int)
    ap.add_argument("--slice-mb", type=float)
    ap.add_argument("--model-mb", type=float)
    ap.add_argument("--ctf2bin", default=os.environ.get("CTF2BIN", ""))
    ap.add_argument("--python2", default="python2")
    ap.add_argument("--feed-python", default=sys.executable)
    args = ap.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.size_mb = args.size_mb or (200 if args.quick else 1000)
    args.slice_mb = args.slice_mb or (5 if args.quick else 20)
    args.model_mb = args.model_mb or (1 if args.quick else 2)
    cntkio = args.bin
    if not os.access(cntkio, os.X_OK):
        raise SystemExit(f"perf_table: {cntkio} not found: cargo build --release -p cntkio-cli")
    files = prepare(args, cntkio)
    notes: List[str] = []
    model_dir = os.path.join(ROOT, "testdata", "model")
    out_dir = args.dir
    size = {k: os.path.getsize(v) for k, v in files.items() if not k.endswith(".header")}

    cmds: Dict[str, Cmd] = {}

    def add(key: str, argv: List[str], inputs: List[str], nbytes: int, cleanup: Optional[List[str]] = None) -> None:
        cmds[key] = Cmd(key, argv, inputs, nbytes, cleanup or [])

    for kind in ("dense", "sparse"):
        ctf, cbf = files[f"{kind}.ctf"], files[f"{kind}.cbf"]
        for j in (1, 2):
            bench = [cntkio, "bench", ctf, "--mmap", "--repeat", "1", "-j", str(j)] + SCHEMA[kind]
            add(f"parse.{kind}.j{j}", bench, [ctf], size[f"{kind}.ctf"])
            out = os.path.join(out_dir, f"out-{kind}.cbf")
            add(f"tocbf.{kind}.j{j}", [cntkio, "convert", "-q", "-j", str(j), ctf, out] + SCHEMA[kind], [ctf],
                size[f"{kind}.ctf"], [out])
        add(f"validate.{kind}", [cntkio, "-q", "validate", ctf] + SCHEMA[kind], [ctf], size[f"{kind}.ctf"])
        back = os.path.join(out_dir, f"back-{kind}.ctf")
        add(f"toctf.{kind}", [cntkio, "convert", "-q", cbf, back], [cbf], size[f"{kind}.ctf"], [back])
        model = files[f"{kind}.model"]
        add(f"model.parse.{kind}", [sys.executable, "-c", MODEL_CTF, model_dir, model, json.dumps(STREAMS[kind])],
            [model], size[f"{kind}.model"])
        if args.ctf2bin:
            part = files[f"{kind}.slice"]
            out = os.path.join(out_dir, f"ctf2bin-{kind}.cbf")
            argv = [args.python2, args.ctf2bin, "--input", part, "--header", files[f"{kind}.header"],
                    "--chunk_size", str(32 << 20), "--output", out]
            add(f"ctf2bin.{kind}", argv, [part], size[f"{kind}.slice"], [out])
    dense_cbf, dense_ctf = files["dense.cbf"], files["dense.ctf"]
    decode = [cntkio, "bench", dense_cbf, "--mmap", "--repeat", "1", "-j", "2"]
    add("decode.dense", decode, [dense_cbf], size["dense.cbf"])
    model_cbf = files["dense.model.cbf"]
    model_decode = [sys.executable, "-c", MODEL_CBF, model_dir, model_cbf]
    add("model.decode.dense", model_decode, [model_cbf], size["dense.model.cbf"])
    mb = ["--mb-size", "256", "--randomize", "--window-chunks", "128", "--bench"]
    add("batches.cbf", [cntkio, "batches", dense_cbf, "--max-sweeps", "3", "--mmap"] + mb, [dense_cbf], 0)
    add("batches.ctf", [cntkio, "batches", dense_ctf, "--max-sweeps", "3"] + mb + SCHEMA["dense"], [dense_ctf], 0)
    if not args.ctf2bin:
        notes.append("ctf2bin.py not given (--ctf2bin): its rows are left out")

    for r in range(args.rounds):
        print(f"perf_table: round {r + 1} of {args.rounds}", file=sys.stderr)
        for cmd in cmds.values():
            run_timed(cmd)

    feed: Dict[str, float] = {}
    if feed_python_ok(args.feed_python):
        r = subprocess.run([args.feed_python, os.path.join(ROOT, "python", "bench_feed.py"), dense_cbf, "--json",
                            "--repeat", str(args.rounds)], capture_output=True, text=True, check=True)
        for line in r.stdout.splitlines():
            row = json.loads(line)
            if "path" in row and "samples_per_second" in row:
                feed[row["path"]] = row["samples_per_second"] / 1e6
    else:
        notes.append(f"{args.feed_python} cannot import cntkio and numpy: the Python row is left out")

    print_table(args, cmds, feed, notes)


def print_table(args: argparse.Namespace, cmds: Dict[str, Cmd], feed: Dict[str, float], notes: List[str]) -> None:
    def rss(key: str) -> str:
        return f"{max(cmds[key].rss) / 2**20:.0f} MB"

    def base(key: str, label: str, value: float) -> str:
        if key not in cmds:
            return "—"
        b = mbps(cmds[key])
        return f"{label} {b:.2f} MB/s: {value / b:.0f}×"

    print(f"{machine()}; files of {args.size_mb} MB (`tools/gen_bench_data.py`); median of {args.rounds} rounds; "
          f"baselines on the first {args.slice_mb:g} MB (ctf2bin.py) and {args.model_mb:g} MB (model), "
          f"their ratio against cntkio with `-j 1`.\n")
    print("| what | command | cntkio | baseline, same rounds |")
    print("|---|---|---|---|")
    for kind, schema in (("dense", "features:100:dense …"), ("sparse", "features:100000:sparse …")):
        j1, j2 = mbps(cmds[f"parse.{kind}.j1"]), mbps(cmds[f"parse.{kind}.j2"])
        print(f"| CTF parse, {kind} | `cntkio bench {kind}.ctf -s … --mmap -j 1` (`-j 2`) "
              f"| {j1:.0f} MB/s ({j2:.0f} MB/s) "
              f"| {base(f'model.parse.{kind}', 'Python model of CNTK’s reader', j1)} |")
    for kind in ("dense", "sparse"):
        v = mbps(cmds[f"validate.{kind}"])
        print(f"| validate, {kind} | `cntkio -q validate {kind}.ctf -s …` "
              f"| {v:.0f} MB/s, peak RSS {rss(f'validate.{kind}')} | — |")
    for kind in ("dense", "sparse"):
        j1, j2 = mbps(cmds[f"tocbf.{kind}.j1"]), mbps(cmds[f"tocbf.{kind}.j2"])
        print(f"| CTF → CBF, {kind} | `cntkio convert {kind}.ctf {kind}.cbf -s … -j 1` (`-j 2`) "
              f"| {j1:.0f} MB/s ({j2:.0f} MB/s), "
              f"peak RSS {rss(f'tocbf.{kind}.j2')} | {base(f'ctf2bin.{kind}', 'ctf2bin.py', j1)} |")
    for kind in ("dense", "sparse"):
        t = median(cmds[f"toctf.{kind}"].walls)
        print(f"| CBF → CTF, {kind} | `cntkio convert {kind}.cbf back.ctf` "
              f"| {mbps(cmds[f'toctf.{kind}']):.0f} MB/s of text "
              f"({t:.2f} s), peak RSS {rss(f'toctf.{kind}')} | — |")
    d = mbps(cmds["decode.dense"])
    print(f"| CBF decode, dense | `cntkio bench dense.cbf --mmap -j 2` | {d:.0f} MB/s of file | "
          f"{base('model.decode.dense', 'Python model of CNTK’s reader', d)} |")
    print(f"| minibatches from CBF | `cntkio batches dense.cbf --mb-size 256 --randomize --window-chunks 128 "
          f"--max-sweeps 3 --bench --mmap` | {msps(cmds['batches.cbf']):.2f} M samples/s, "
          f"peak RSS {rss('batches.cbf')} | — |")
    print(f"| minibatches from CTF | `cntkio batches dense.ctf -s … --mb-size 256 --randomize --window-chunks 128 "
          f"--max-sweeps 3 --bench` | {msps(cmds['batches.ctf']):.2f} M samples/s, "
          f"peak RSS {rss('batches.ctf')} | — |")
    if feed:
        loader = feed.get("numpy Loader")
        native = feed.get("native (cntkio batches --bench)")
        torch = feed.get("torch Loader")
        jax = feed.get("jax Loader")
        fig = f"`cntkio.Loader` {loader:.2f} M samples/s" if loader else "—"
        if torch:
            fig += f", `cntkio.torch.Loader` {torch:.2f}"
        if jax:
            fig += f", `cntkio.jax.Loader` {jax:.2f}"
        vs = f"native `cntkio batches --bench` {native:.2f} M samples/s" if native else "—"
        print(f"| Python feed, from CBF | `python3 python/bench_feed.py dense.cbf` (batches of 4096, best epoch) "
              f"| {fig} | "
              f"{vs} |")
        k_loader = feed.get("numpy Loader, kept across epochs")
        kept = [("cntkio.Loader", k_loader)] + [
            (f"cntkio.{m}.Loader", feed.get(f"{m} Loader, kept across epochs")) for m in ("torch", "jax")
        ]
        if any(v for _, v in kept):
            figs = [f"`{n}` {v:.2f}" for n, v in kept if v]
            later = feed.get("native, a later sweep of one run (--max-sweeps 3)")
            vs_later = f"native, a later sweep of `--max-sweeps 3` {later:.2f} M samples/s" if later else vs
            print(f"| Python feed, epochs of one loader | the same, one loader for all epochs (`set_epoch` between "
                  f"them: its chunks stay loaded) | {', '.join(figs)} M samples/s | {vs_later} |")
    for n in notes:
        print(f"\nNote: {n}.")


if __name__ == "__main__":
    main()
