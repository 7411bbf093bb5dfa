"""Reading CTF and CBF into NumPy and SciPy: dtypes, shapes, keys, lengths and values."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, StreamDef, StreamDefs
from conftest import assert_stream_equal, reference_ctf


def logreg(examples, **options):
    return CTFDeserializer(
        examples / "logreg.ctf",
        StreamDefs(features=StreamDef(field="features", shape=2), labels=StreamDef(field="labels", shape=1)),
        **options,
    )


def slots(path, **options):
    return CTFDeserializer(
        path,
        StreamDefs(
            query=StreamDef(field="word", shape=13, is_sparse=True, defines_mb_size=True),
            intent=StreamDef(field="intent", shape=5, is_sparse=True),
            slots=StreamDef(field="slot", shape=12, is_sparse=True),
        ),
        **options,
    )


SLOTS = {"query": ("word", 13, True), "intent": ("intent", 5, True), "slots": ("slot", 12, True)}


def test_dense_float32(examples):
    data = logreg(examples).read()
    assert data.num_sequences == 300 and data.num_samples == 300
    assert list(data) == ["features", "labels"]
    x = data["features"].asarray()
    assert x.dtype == np.float32 and x.shape == (300, 2) and x.flags["C_CONTIGUOUS"]
    assert data["labels"].asarray().shape == (300, 1)
    assert data.sequence_keys.dtype == np.uint64 and data.sequence_keys.tolist() == list(range(300))
    assert data.sequence_lengths.dtype == np.uint32 and set(data.sequence_lengths.tolist()) == {1}
    assert data["features"].offsets.dtype == np.int64
    np.testing.assert_array_equal(x[0], np.array([1.709340, 2.329687], dtype=np.float32))
    keys, ref = reference_ctf(examples / "logreg.ctf", {"features": ("features", 2, False), "labels": ("labels", 1, False)})
    assert_stream_equal(data["features"], ref["features"], np.float32)
    assert_stream_equal(data["labels"], ref["labels"], np.float32)


@pytest.mark.parametrize("precision", ["double", np.float64, "float64"])
def test_dense_double(examples, precision):
    d = logreg(examples)
    d["precision"] = precision
    assert d["precision"] == "double"
    data = d.read()
    assert data["features"].dtype == np.float64
    _, ref = reference_ctf(examples / "logreg.ctf", {"features": ("features", 2, False)})
    assert_stream_equal(data["features"], ref["features"], np.float64)


def test_sparse_csr_equals_ctf(examples):
    data = slots(examples / "slots.ctf").read()
    keys, ref = reference_ctf(examples / "slots.ctf", SLOTS)
    assert data.sequence_keys.tolist() == keys
    for name in SLOTS:
        assert_stream_equal(data[name], ref[name], np.float32)
    m = data["query"].asarray()
    assert isinstance(m, sp.csr_matrix) and m.shape == (354, 13) and m.dtype == np.float32
    assert m.indices.dtype == np.int32 and m.nnz == 354
    # the declared length is the length-defining stream's; the intent is on the first row only
    assert data.sequence_lengths.tolist() == data["query"].lengths.tolist()
    assert set(data["intent"].lengths.tolist()) == {1}
    # per-sequence CSR slices
    first = data["query"].sequence(0)
    assert first.shape == (len(ref["query"][0]), 13)
    assert [(int(i), float(v)) for i, v in zip(first.indices, first.data)] == [e for smp in ref["query"][0] for e in smp]


def test_raw_without_scipy(examples, monkeypatch):
    data = slots(examples / "slots.ctf").read()
    monkeypatch.setattr(cntkio, "_has_scipy", lambda: False)
    raw = data["slots"].asarray()
    assert isinstance(raw, tuple) and len(raw) == 3
    values, indices, indptr = raw
    assert values.dtype == np.float32 and indices.dtype == np.int32 and len(indptr) == 355
    assert isinstance(data["slots"].sequence(2), tuple)


def test_padded_and_sequences(examples):
    data = slots(examples / "slots.ctf").read()
    q = data["query"]
    arr, mask = q.padded()
    assert arr.shape == (60, 9, 13) and mask.shape == (60, 9) and mask.dtype == bool
    assert mask.sum() == 354 and mask.sum(axis=1).tolist() == q.lengths.tolist()
    np.testing.assert_array_equal(arr[mask], q.todense())
    assert (arr[~mask] == 0).all()
    arr4, mask4 = q.padded(max_length=4)
    assert arr4.shape == (60, 4, 13) and mask4.shape == (60, 4)
    seqs = logreg(examples).read()["features"].as_sequences()
    assert len(seqs) == 300 and seqs[0].shape == (1, 2)


def test_chunks_concatenate_to_read(examples):
    d = slots(examples / "slots.ctf", chunkSizeInBytes=1000)
    assert d.num_chunks > 5
    sizes = d.chunk_sizes()
    assert sum(s for s, _ in sizes) == 60 and sum(n for _, n in sizes) == 354
    whole = d.read()
    parts = list(d.chunks())
    assert [p.num_sequences for p in parts] == [s for s, _ in sizes]
    keys = np.concatenate([p.sequence_keys for p in parts])
    np.testing.assert_array_equal(keys, whole.sequence_keys)
    for name in SLOTS:
        a = sp.vstack([p[name].csr() for p in parts]).tocsr()
        b = whole[name].csr()
        assert (a != b).nnz == 0
    with pytest.raises(IndexError):
        d.read_chunk(d.num_chunks)


def test_options_by_cntk_and_python_names(examples):
    d = slots(examples / "slots.ctf")
    d["chunkSizeInBytes"] = 2000
    d["max_errors"] = 3
    d["skipSequenceIds"] = False
    d["cache_index"] = False
    assert d["chunkSizeInBytes"] == 2000 and d["maxErrors"] == 3 and d["max_errors"] == 3
    assert d["type"] == "CNTKTextFormatDeserializer" and d["file"].endswith("slots.ctf")
    assert d["input"]["query"] == {"alias": "word", "dim": 13, "format": "sparse", "definesMBSize": True}
    assert d.num_chunks >= 5
    d["chunkSizeInBytes"] = 1 << 20  # the opened file is dropped when the configuration changes
    assert d.num_chunks == 1


def test_skip_sequence_ids(examples):
    data = slots(examples / "slots.ctf", skipSequenceIds=True).read
    with pytest.raises(cntkio.FormatError) as e:
        data()  # every row is a sequence; most lack the intent
    assert e.value.code == "E0021"


def test_stream_infos(examples):
    infos = slots(examples / "slots.ctf", precision="double").stream_infos()
    assert [i.name for i in infos] == ["query", "intent", "slots"]
    assert infos[0] == cntkio.StreamInformation("query", "word", 13, True, np.dtype(np.float64), True)


def test_shape_tuple_shapes_dense_arrays(examples):
    d = CTFDeserializer(examples / "logreg.ctf", StreamDefs(features=StreamDef(shape=(1, 2)), labels=StreamDef(shape=1)))
    data = d.read()
    assert data["features"].values.shape == (300, 1, 2) and data["labels"].values.shape == (300, 1)
    assert data["features"].dim == 2  # test_shapes.py has the rest


def test_cache_index(tmp_path, examples):
    src = tmp_path / "slots.ctf"
    src.write_bytes((examples / "slots.ctf").read_bytes())
    first = slots(src, cacheIndex=True, chunkSizeInBytes=3000)
    assert first.num_chunks > 1
    assert list(tmp_path.glob("slots.ctf.cntkio-*.idx")), "the index cache was not written"
    again = slots(src, cacheIndex=True, chunkSizeInBytes=3000)
    assert again.read_chunk(1).sequence_keys.tolist() == first.read_chunk(1).sequence_keys.tolist()


def test_mmap(examples):
    a = slots(examples / "slots.ctf", mmap=True).read()
    b = slots(examples / "slots.ctf").read()
    assert (a["slots"].csr() != b["slots"].csr()).nnz == 0


# ---- real data (testdata/real) -----------------------------------------------------------------------

ATIS = {"query": ("S0", 943, True), "intent": ("S1", 26, True), "slots": ("S2", 129, True)}


def test_atis(real):
    path = real / "atis" / "atis.test.ctf"
    d = CTFDeserializer(
        path,
        StreamDefs(
            query=StreamDef(field="S0", shape=943, is_sparse=True),
            intent=StreamDef(field="S1", shape=26, is_sparse=True),
            slots=StreamDef(field="S2", shape=129, is_sparse=True),
        ),
    )
    data = d.read()
    assert data.num_sequences == 893
    keys, ref = reference_ctf(path, ATIS)
    assert data.sequence_keys.tolist() == keys
    for name in ATIS:
        assert_stream_equal(data[name], ref[name], np.float32)
    assert data["query"].csr().shape == (data["query"].num_samples, 943)


def test_mnist_dense_double(real):
    path = real / "mnist" / "MNIST_dense.ctf"
    d = CTFDeserializer(path, StreamDefs(features=StreamDef(field="F", shape=784), labels=StreamDef(field="L", shape=10)))
    d["precision"] = "double"
    data = d.read(threads=2)
    x = data["features"].asarray()
    assert x.dtype == np.float64 and x.shape == (1000, 784)
    assert data["labels"].asarray().sum() == 1000  # one-hot
    _, ref = reference_ctf(path, {"features": ("F", 784, False), "labels": ("L", 10, False)}, np.float64)
    assert_stream_equal(data["features"], ref["features"], np.float64)


def test_seqcla_mixed_sparse_dense(real):
    path = real / "seqcla" / "Train.ctf"
    d = CTFDeserializer(path, StreamDefs(features=StreamDef(field="x", shape=2000, is_sparse=True), labels=StreamDef(field="y", shape=5)))
    data = d.read()
    assert data.num_sequences == 1247
    assert data["labels"].asarray().shape == (1247, 5)
    keys, ref = reference_ctf(path, {"features": ("x", 2000, True), "labels": ("y", 5, False)})
    assert data.sequence_keys.tolist() == keys
    assert_stream_equal(data["features"], ref["features"], np.float32)
    assert_stream_equal(data["labels"], ref["labels"], np.float32)


CBF_PAIRS = [
    ("10x10_dense", False, 5, np.float32),
    ("10x10_sparse", True, 100, np.float64),
    ("50x20_jagged_sequences_dense", False, 3, np.float64),
    ("50x20_jagged_sequences_sparse", True, 100, np.float32),
]


@pytest.mark.parametrize("name,sparse,dim,dtype", CBF_PAIRS)
def test_cbf_equals_its_ctf(real, name, sparse, dim, dtype):
    cbf = CBFDeserializer(real / "cbf" / f"{name}.bin").read()
    assert cbf["features"].dtype == dtype and cbf["features"].is_sparse == sparse and cbf["features"].dim == dim
    ctf = CTFDeserializer(
        real / "cbf" / f"{name}.ctf",
        StreamDefs(features=StreamDef(field="F0", shape=dim, is_sparse=sparse)),
        precision="double" if dtype == np.float64 else "float",
    ).read()
    a, b = cbf["features"], ctf["features"]
    np.testing.assert_array_equal(a.offsets, b.offsets)
    # ctf2bin.py wrote Python's correctly rounded values; CNTK's CTF reader (and cntkio) may differ by an ulp
    np.testing.assert_array_max_ulp(a.values, b.values, maxulp=1)
    if sparse:
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.indptr, b.indptr)
    assert cbf.sequence_keys.tolist() == list(range(cbf.num_sequences))


def test_cbf_rename_and_precision(real):
    d = CBFDeserializer(real / "cbf" / "Simple_dense.bin", StreamDefs(x=StreamDef(field="features"), y=StreamDef(field="labels")))
    data = d.read()
    assert list(data) == ["x", "y"] and data["x"].asarray().shape == (10000, 2)
    d["precision"] = "double"
    assert d.read()["y"].dtype == np.float64
    assert d.num_chunks == 1 and d.chunk_sizes() == [(10000, 10000)]
    assert d.read_chunk(0).num_sequences == 10000
