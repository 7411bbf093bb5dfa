"""Fixtures: the sample data in examples/data, the real CNTK data in testdata/real, and a small
reference reader of well-formed CTF files (plain Python) to compare cntkio's arrays with."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "data"

sys.path.insert(0, str(REPO / "tools"))
from testdata import testdata_dir  # noqa: E402  (tools/testdata.py: the one finder of the test material)


@pytest.fixture
def real() -> Path:
    """The real CNTK data: testdata/real, or $CNTKIO_SHARED_DIR/data/real (FileNotFoundError if missing)."""
    return Path(testdata_dir("real"))


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


_ID = re.compile(rb"^(\d+)")


def reference_ctf(
    path: Path, streams: Dict[str, Tuple[str, int, bool]], dtype: type = np.float32
) -> Tuple[List[int], Dict[str, List[List[object]]]]:
    """Reads a well-formed CTF file: ``streams`` maps name -> (alias, dim, is_sparse). Returns the sequence
    keys and, per stream, each sequence's samples (dense: a list of values; sparse: a list of
    (index, value) pairs in file order). Comments (``|#``) are skipped; a row without an id continues the
    previous sequence in id mode; without an id on the first row, every row is a sequence."""
    by_alias = {a: (name, dim, sparse) for name, (a, dim, sparse) in streams.items()}
    keys: List[int] = []
    seqs: Dict[str, List[List[object]]] = {name: [] for name in streams}
    lines = path.read_bytes().replace(b"\r\n", b"\n").split(b"\n")
    id_mode = _ID.match(lines[0]) is not None
    current = None
    for line in lines:
        if not line.strip():
            continue
        m = _ID.match(line)
        key = int(m.group(1)) if (m and id_mode) else None
        rest = line[m.end():] if (m and id_mode) else line
        if not id_mode:
            key = len(keys)
        if key is None:
            key = current
        if key != current or not keys:
            keys.append(key)
            for name in streams:
                seqs[name].append([])
            current = key
        for field in rest.split(b"|")[1:]:
            if field.startswith(b"#"):
                continue
            parts = field.split()
            if not parts:
                continue
            alias = parts[0].decode()
            if alias not in by_alias:
                continue
            name, dim, sparse = by_alias[alias]
            if sparse:
                sample = [(int(i), float(v)) for i, v in (p.split(b":") for p in parts[1:])]
            else:
                vals = [float(v) for v in parts[1:]]
                sample = vals + [0.0] * (dim - len(vals))
            seqs[name][-1].append(sample)
    return keys, seqs


def _values_equal(actual, expected) -> None:
    if actual.dtype == np.float64:
        # CNTK's double arithmetic (which cntkio reproduces) is not always correctly rounded: within an ulp
        np.testing.assert_allclose(actual, expected, rtol=4.5e-16, atol=0)
    else:
        np.testing.assert_array_equal(actual, expected)


def assert_stream_equal(stream, ref_seqs: List[List[object]], dtype) -> None:
    """Compares a StreamData with the reference reader's sequences, value for value (float32: exactly;
    float64: within an ulp, as CNTK's arithmetic is not correctly rounded)."""
    assert stream.num_sequences == len(ref_seqs)
    assert list(stream.lengths) == [len(s) for s in ref_seqs]
    samples = [sample for seq in ref_seqs for sample in seq]
    if stream.is_sparse:
        data, indices, indptr = stream.raw()
        assert list(np.diff(indptr)) == [len(s) for s in samples]
        assert indices.tolist() == [i for s in samples for i, _ in s]
        _values_equal(data, np.array([v for s in samples for _, v in s], dtype=dtype))
    else:
        _values_equal(stream.values, np.array(samples, dtype=dtype).reshape(len(samples), stream.dim))


def assert_data_equal(a, b) -> None:
    """Two :class:`cntkio.Data` hold the same streams, keys, lengths and values (bit for bit)."""
    assert list(a) == list(b)
    np.testing.assert_array_equal(a.sequence_keys, b.sequence_keys)
    np.testing.assert_array_equal(a.sequence_lengths, b.sequence_lengths)
    for name in a:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.is_sparse == y.is_sparse
        np.testing.assert_array_equal(x.offsets, y.offsets)
        np.testing.assert_array_equal(x.values, y.values)
        if x.is_sparse:
            np.testing.assert_array_equal(x.indices, y.indices)
            np.testing.assert_array_equal(x.indptr, y.indptr)
