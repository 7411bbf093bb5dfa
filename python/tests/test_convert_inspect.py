"""cntkio.convert round trips, cntkio.inspect against the CLI's `inspect --json`, cntkio.detect_format."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import cntkio
from conftest import assert_data_equal as same
from cntkio import CBFDeserializer, CTFDeserializer, StreamDef, StreamDefs

SLOTS = StreamDefs(
    query=StreamDef(field="word", shape=13, is_sparse=True, defines_mb_size=True),
    intent=StreamDef(field="intent", shape=5, is_sparse=True),
    slots=StreamDef(field="slot", shape=12, is_sparse=True),
)


def test_ctf_cbf_ctf_round_trip(tmp_path, examples):
    src = CTFDeserializer(examples / "slots.ctf", SLOTS)
    summary = cntkio.convert(src, tmp_path / "slots.cbf", chunk_size=2000)
    assert summary["input_format"] == "ctf"
    assert summary["sequences"] == 60 and summary["samples"] == 354 and summary["chunks"] > 1
    assert cntkio.detect_format(tmp_path / "slots.cbf") == "cbf"
    cbf = CBFDeserializer(tmp_path / "slots.cbf")
    assert cbf.num_chunks == summary["chunks"]
    same(cbf.read(), src.read())

    back = cntkio.convert(tmp_path / "slots.cbf", tmp_path / "back.ctf", SLOTS)
    assert back["input_format"] == "cbf" and back["sequences"] == 60
    assert cntkio.detect_format(tmp_path / "back.ctf") == "ctf"
    same(CTFDeserializer(tmp_path / "back.ctf", SLOTS).read(), src.read())


def test_convert_with_streams_and_options(tmp_path, examples):
    streams = StreamDefs(features=StreamDef(shape=2), labels=StreamDef(shape=1))
    s = cntkio.convert(examples / "logreg.ctf", tmp_path / "lr.cbf", streams, precision="double")
    assert s["sequences"] == 300
    data = CBFDeserializer(tmp_path / "lr.cbf").read()
    assert data["features"].dtype == np.float64
    np.testing.assert_array_equal(
        data["features"].values, CTFDeserializer(examples / "logreg.ctf", streams, precision="double").read()["features"].values
    )
    # without the CNTK names, CBF → CTF writes the stream names after '|'
    cntkio.convert(tmp_path / "lr.cbf", tmp_path / "lr.ctf")
    assert (tmp_path / "lr.ctf").read_text().startswith("0 |features ")


def test_convert_ctf_needs_streams(tmp_path, examples):
    """A CTF file given without streams: the error names the StreamDefs its first rows suggest, which work."""
    with pytest.raises(cntkio.UsageError, match="needs its streams") as e:
        cntkio.convert(examples / "logreg.ctf", tmp_path / "x.cbf")
    assert not (tmp_path / "x.cbf").exists()
    suggested = str(e.value).split("its first rows suggest streams=", 1)[1].split(" (each shape", 1)[0]
    assert suggested == (
        "StreamDefs(features=StreamDef(field='features', shape=2), labels=StreamDef(field='labels', shape=1))"
    )
    streams = eval(suggested, {"StreamDefs": StreamDefs, "StreamDef": StreamDef})
    assert cntkio.convert(examples / "logreg.ctf", tmp_path / "x.cbf", streams)["sequences"] == 300
    # Names that are not identifiers, sparse streams, and the other ways in.
    odd = tmp_path / "odd.ctf"
    odd.write_text("0 |my-x 1 2 3 |y 4:1\n")
    with pytest.raises(cntkio.UsageError) as e:
        cntkio.read_arrow(odd)
    assert (
        "suggest streams=StreamDefs(**{'my-x': StreamDef(field='my-x', shape=3), "
        "'y': StreamDef(field='y', shape=5, is_sparse=True)})" in str(e.value)
    )
    with pytest.raises(cntkio.UsageError, match="suggest streams=StreamDefs"):
        cntkio.Loader(paths=[examples / "logreg.ctf"], batch_size=10)
    # A file whose first rows name no input: the request alone.
    bare = tmp_path / "bare.ctf"
    bare.write_text("0 |# nothing\n")
    with pytest.raises(cntkio.UsageError, match="needs its streams") as e:
        cntkio.convert(bare, tmp_path / "y.cbf")
    assert "suggest" not in str(e.value)


def test_convert_real_cbf_ctf2bin_compatible(tmp_path, real):
    streams = StreamDefs(features=StreamDef(field="F0", shape=100, is_sparse=True))
    cntkio.convert(real / "cbf" / "10x10_sparse.ctf", tmp_path / "a.bin", streams, precision="double", ctf2bin_compatible=True)
    mine = CBFDeserializer(tmp_path / "a.bin").read()["features"]
    theirs = CBFDeserializer(real / "cbf" / "10x10_sparse.bin").read()["features"]
    np.testing.assert_array_equal(mine.indices, theirs.indices)
    np.testing.assert_array_max_ulp(mine.values, theirs.values, maxulp=1)


def cli_json(*args):
    out = subprocess.run([sys.executable, "-m", "cntkio", "inspect", "--json", *map(str, args)], capture_output=True, check=True)
    return json.loads(out.stdout)


def test_inspect_ctf_same_as_cli(examples):
    r = cntkio.inspect(examples / "slots.ctf")
    assert r == cli_json(examples / "slots.ctf")
    assert r["format"] == "ctf" and r["sequences"] == 60
    assert [(s["alias"], s["storage"], s["min_dim"]) for s in r["streams"]] == [
        ("word", "sparse", 13),
        ("intent", "sparse", 5),
        ("slot", "sparse", 12),
    ]


def test_inspect_cbf_same_as_cli(real):
    path = real / "cbf" / "Simple_dense.bin"
    r = cntkio.inspect(path)
    assert r == cli_json(path)
    assert r["format"] == "cbf" and r["sequences"] == 10000
    assert [s["name"] for s in r["streams"]] == ["features", "labels"]


def test_inspect_skip_sequence_ids(examples):
    assert cntkio.inspect(examples / "slots.ctf", skip_sequence_ids=True)["sequences"] == 354


def test_inspect_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        cntkio.inspect(tmp_path / "missing.ctf")
    assert isinstance(e.value, cntkio.NotFoundError) and e.value.path == str(tmp_path / "missing.ctf")


def test_convert_is_interrupted_by_ctrl_c(tmp_path):
    """Ctrl-C (SIGINT) during a conversion raises KeyboardInterrupt promptly, in either direction, and leaves
    neither the output nor a temporary file behind."""
    import os
    import signal
    import threading
    import time

    row = "|x " + " ".join(f"{k * 97 % 1000}:1" for k in range(40)) + " |y 3:1\n"
    src = tmp_path / "big.ctf"
    src.write_text(row * 400_000)  # about 100 MB: converting it takes far longer than the 20 ms below
    streams = StreamDefs(x=StreamDef(shape=1000, is_sparse=True), y=StreamDef(shape=10, is_sparse=True))
    cbf = tmp_path / "big.cbf"
    cntkio.convert(src, cbf, streams)
    before = sorted(p.name for p in tmp_path.iterdir())
    for source, target in [(src, tmp_path / "again.cbf"), (cbf, tmp_path / "back.ctf")]:
        timer = threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGINT))
        started = time.monotonic()
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                cntkio.convert(source, target, streams)
        finally:
            timer.cancel()
        assert time.monotonic() - started < 5, "the conversion noticed the interrupt late"
        assert sorted(p.name for p in tmp_path.iterdir()) == before, f"{target.name}: nothing left behind"
