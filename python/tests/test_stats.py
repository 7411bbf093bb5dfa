"""cntkio.stats and `cntkio stats`: per-dimension mean, std, min, max of the values as a model sees them (sparse
streams dense) and entries per index, equal to NumPy's over the data read, whatever the threads and chunks."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

import cntkio
from test_loader import STREAMS, defs, write_data


def expected(path, **options):
    """NumPy's figures over every sample of the file (sparse streams densified)."""
    data = cntkio.CTFDeserializer(path, defs(), **options).read()
    out = {}
    for name in ("a", "b"):
        s = data[name]
        # The loaders' dense form: an index repeated in a sample holds the sum of its entries there.
        dense = s.todense().astype(np.float64)
        if s.is_sparse:
            _, indices, indptr = s.raw()
            present = np.zeros((s.num_samples, s.dim), dtype=bool)
            present[np.repeat(np.arange(s.num_samples), np.diff(indptr)), indices] = True
            assert present.sum() < len(indices), "the data repeats indices in some samples"
        out[name] = dict(samples=dense.shape[0], mean=dense.mean(0), std=dense.std(0), min=dense.min(0),
                         max=dense.max(0))
        if s.is_sparse:
            out[name]["entries_per_index"] = present.sum(0)
            out[name]["entries"] = len(indices)
    return data.num_sequences, out


def assert_matches(report, sequences, want):
    assert report["sequences"] == sequences
    for name, w in want.items():
        s = report["streams"][name]
        assert s["samples"] == w["samples"] and s["nan"] == 0 and s["infinite"] == 0
        for k in ("mean", "std", "min", "max"):
            np.testing.assert_allclose(s[k], w[k], rtol=1e-12, atol=1e-12, err_msg=f"{name} {k}")
        if "entries" in w:
            assert s["format"] == "sparse" and s["entries"] == w["entries"]
            assert np.array_equal(s["entries_per_index"], w["entries_per_index"])
        else:
            assert s["format"] == "dense" and "entries" not in s


@pytest.mark.parametrize("chunk", [300, 2000, 1 << 20])
def test_figures_are_numpys_for_any_chunks_and_threads(tmp_path, chunk):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(41), 500, 4)
    sequences, want = expected(path)
    reports = [cntkio.stats(path, defs(), chunkSizeInBytes=chunk, threads=t) for t in (1, 2, 3)]
    for r in reports:
        assert_matches(r, sequences, want)
    # The same figures to the last bit whatever the threads.
    for r in reports[1:]:
        for name in ("a", "b"):
            for k in ("mean", "std"):
                assert np.array_equal(r["streams"][name][k], reports[0]["streams"][name][k])


def test_several_inputs_are_taken_together_and_cbf_agrees(tmp_path):
    one, two = tmp_path / "one.ctf", tmp_path / "two.ctf"
    write_data(one, random.Random(42), 120, 3)
    write_data(two, random.Random(43), 80, 5)
    both = tmp_path / "both.ctf"
    # Keys of the second file continue after the first's, as one file of both.
    rows = one.read_text().splitlines() + [f"{1000 + int(r.split(' ', 1)[0])} {r.split(' ', 1)[1]}"
                                           for r in two.read_text().splitlines()]
    both.write_text("\n".join(rows) + "\n")
    sequences, want = expected(both)
    assert_matches(cntkio.stats([one, two], defs()), sequences, want)
    cbf = tmp_path / "both.cbf"
    cntkio.convert(both, cbf, defs())
    assert_matches(cntkio.stats(cbf), sequences, want)
    assert_matches(cntkio.stats([cntkio.CTFDeserializer(one, defs()), cntkio.CTFDeserializer(two, defs())]),
                   sequences, want)


def test_command_line_prints_the_same_report(tmp_path):
    path = tmp_path / "data.ctf"
    write_data(path, random.Random(44), 200, 3)
    out = subprocess.run([sys.executable, "-m", "cntkio", "stats", str(path), *STREAMS, "--json", "-j", "2"],
                         check=True, capture_output=True, text=True).stdout
    cli = json.loads(out)
    py = cntkio.stats(path, defs())
    assert cli["version"] == 1 and cli["sequences"] == py["sequences"]
    for s in cli["streams"]:
        for k in ("mean", "std", "min", "max"):
            assert np.array_equal(np.array(s[k], dtype=np.float64), py["streams"][s["name"]][k])
    text = subprocess.run([sys.executable, "-m", "cntkio", "stats", str(path), *STREAMS, "--dims", "2"],
                          check=True, capture_output=True, text=True).stdout
    assert "a   dense   dim 3   samples" in text and "… 1 more dims" in text
    assert "b   sparse   dim 7" in text and "entries" in text and "% of samples" in text


def test_non_finite_values_and_errors(tmp_path):
    path = tmp_path / "odd.ctf"
    # 1e39 overflows float32: infinite, as CNTK reads it.
    path.write_text("0 |a 1 1e39 2 |b 1:1\n1 |a 3 4 5 |b 2:1\n")
    s = cntkio.stats(path, defs())["streams"]["a"]
    assert (s["nan"], s["infinite"]) == (0, 1)
    assert s["mean"][0] == 2.0 and np.isinf(s["mean"][1]) and np.isnan(s["std"][1]) and s["mean"][2] == 3.5
    with pytest.raises(cntkio.UsageError, match="streams="):
        cntkio.stats(path)  # CTF without a schema: the error suggests one
    with pytest.raises(cntkio.UsageError, match="did you mean 'maxErrors'"):
        cntkio.stats(path, defs(), maxErrorz=3)
    bad = tmp_path / "bad.ctf"
    bad.write_text("0 |a 1 2 3 |b 1:1\n1 |a 1 x 3 |b 1:1\n")
    with pytest.raises(cntkio.CntkError):
        cntkio.stats(bad, defs())
