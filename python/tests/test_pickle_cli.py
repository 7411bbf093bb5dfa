"""Pickling deserializers (as path and options), the command line from Python, threads."""

from __future__ import annotations

import multiprocessing
import pickle
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, StreamDef, StreamDefs
from cntkio.__main__ import run

LOGREG = StreamDefs(features=StreamDef(field="features", shape=2), labels=StreamDef(field="labels", shape=1))


def test_pickle_deserializers(examples, real):
    d = CTFDeserializer(examples / "logreg.ctf", LOGREG, maxErrors=2, chunkSizeInBytes=4096)
    assert d.num_chunks > 1  # opened: the open file is not part of the pickle
    blob = pickle.dumps(d)
    assert b"logreg.ctf" in blob and len(blob) < 1000
    e = pickle.loads(blob)
    assert type(e) is CTFDeserializer and e == d and e["maxErrors"] == 2
    np.testing.assert_array_equal(e.read()["features"].values, d.read()["features"].values)
    c = CBFDeserializer(real / "cbf" / "Simple_dense.bin", StreamDefs(x=StreamDef(field="features")))
    c2 = pickle.loads(pickle.dumps(c))
    assert type(c2) is CBFDeserializer and list(c2.read()) == ["x", "labels"]
    s = pickle.loads(pickle.dumps(LOGREG))
    assert s == LOGREG and s.features.stream_alias == "features" and s.features.dim == 2


def _count(d):
    return d.read().num_sequences


def test_deserializer_in_spawned_process(examples):
    d = CTFDeserializer(examples / "logreg.ctf", LOGREG)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_count, (d,)) == 300


def test_records_are_immutable():
    s = StreamDef(field="x", shape=3)
    with pytest.raises(AttributeError):
        s.dim = 4
    with pytest.raises(AttributeError):
        s.nothing


def test_reading_from_threads(examples):
    d = CTFDeserializer(examples / "slots.ctf", StreamDefs(word=StreamDef(shape=13, is_sparse=True)), skipSequenceIds=True)
    results = []
    threads = [threading.Thread(target=lambda: results.append(d.copy().read().num_sequences)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [354] * 4


def test_python_m_cntkio(examples, tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "cntkio", "validate", str(examples / "logreg.ctf"), "--stream", "features:2:dense", "--stream", "labels:1:dense"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.ctf"
    bad.write_bytes(b"|x 1\n|x 2,5\n")
    invalid = subprocess.run([sys.executable, "-m", "cntkio", "validate", str(bad), "--stream", "x:1:dense"], capture_output=True, text=True)
    assert invalid.returncode == 1 and "bad.ctf:2:" in invalid.stderr
    usage = subprocess.run([sys.executable, "-m", "cntkio", "nonsense"], capture_output=True, text=True)
    assert usage.returncode == 2
    version = subprocess.run([sys.executable, "-m", "cntkio", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == f"cntkio {cntkio.__version__}"


def test_run_in_process(examples, capfd):
    assert run(["inspect", str(examples / "logreg.ctf")]) == 0
    assert "logreg.ctf: CTF" in capfd.readouterr().out
    assert run(["validate", str(examples / "logreg.ctf"), "--stream", "features:1:dense", "--stream", "labels:1:dense"]) == 1


def test_console_script_installed():
    script = shutil.which("cntkio", path=sysconfig.get_path("scripts")) or shutil.which("cntkio")
    if script is None:
        pytest.skip("the cntkio console script is not on the PATH (package not installed with pip)")
    out = subprocess.run([script, "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("cntkio ")
    assert Path(script).name == "cntkio"
