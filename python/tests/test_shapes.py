"""Multi-dimensional sample shapes: StreamDef(shape=(3, 4)) reads 12 values per sample and hands dense
arrays out shaped (..., 3, 4); sparse streams stay CSR over the flattened dimension, as CNTK's."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, MinibatchSource, StreamDef, StreamDefs, UsageError

# 3 sequences of 2, 1 and 3 samples; x: 2×3 dense (values 6k..6k+5 for sample k), y: sparse 2×5 (flattened 10)
ROWS = [(0, 0), (0, 1), (1, 2), (2, 3), (2, 4), (2, 5)]


def ctf_text() -> str:
    lines = []
    for sid, k in ROWS:
        x = " ".join(str(6 * k + j) for j in range(6))
        lines.append(f"{sid} |x {x} |y {k}:1 9:{k}")
    return "\n".join(lines) + "\n"


STREAMS = StreamDefs(x=StreamDef(shape=(2, 3)), y=StreamDef(shape=(2, 5), is_sparse=True))
ALL = np.arange(36, dtype=np.float32).reshape(6, 2, 3)


@pytest.fixture
def ctf(tmp_path):
    p = tmp_path / "shapes.ctf"
    p.write_text(ctf_text())
    return p


def test_stream_def_and_infos(ctf):
    d = CTFDeserializer(ctf, STREAMS)
    x, y = d.stream_infos()
    assert (x.dim, x.shape, x.sample_shape) == (6, (2, 3), (2, 3))
    assert (y.dim, y.sample_shape, y.is_sparse) == (10, (2, 5), True)
    # an int shape is (dim,), and the info equals the six-field form
    flat = CTFDeserializer(ctf, StreamDefs(x=StreamDef(shape=6), y=StreamDef(shape=10, is_sparse=True)))
    assert [(i.shape, i.sample_shape) for i in flat.stream_infos()] == [(None, (6,)), (None, (10,))]
    assert flat.stream_infos()[0] == cntkio.StreamInformation("x", "x", 6, False, np.dtype(np.float32), False)
    # CNTK's own dict form, with the shape under "dim"
    raw = CTFDeserializer(ctf, {"x": {"stream_alias": "x", "dim": (2, 3)}, "y": {"dim": 10, "is_sparse": True}})
    assert raw.stream_infos()[0].sample_shape == (2, 3)
    assert pickle.loads(pickle.dumps(d)).stream_infos()[0].sample_shape == (2, 3)


def test_read_shapes(ctf):
    data = CTFDeserializer(ctf, STREAMS).read()
    x, y = data["x"], data["y"]
    assert x.values.shape == (6, 2, 3) and x.shape == (6, 2, 3) and x.dtype == np.float32
    assert np.array_equal(x.values, ALL) and np.array_equal(x.asarray(), ALL)
    assert x.sequence(2).shape == (3, 2, 3) and np.array_equal(x.sequence(2), ALL[3:])
    padded, mask = x.padded()
    assert padded.shape == (3, 3, 2, 3) and mask.tolist() == [[True, True, False], [True, False, False], [True] * 3]
    assert np.array_equal(padded[0, :2], ALL[:2]) and not padded[0, 2].any()
    # sparse: CSR over the flattened 10
    assert y.shape == (6, 10) and y.sample_shape == (2, 5)
    csr = y.csr()
    assert csr.shape == (6, 10) and csr.toarray()[4].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 4]
    assert y.todense().shape == (6, 10)
    chunk = CTFDeserializer(ctf, STREAMS).read_chunk(0)
    assert chunk["x"].values.shape == (6, 2, 3)


def test_minibatch_shapes(ctf):
    src = MinibatchSource(CTFDeserializer(ctf, STREAMS), randomize=False, max_sweeps=1)
    assert src.streams.x.sample_shape == (2, 3)
    mb = src.next_minibatch(100)
    x = mb["x"]
    assert x.values.shape == (6, 2, 3) and x.shape == (3, 3, 2, 3)
    a = x.asarray()
    assert a.shape == (3, 3, 2, 3) and np.array_equal(a[2], ALL[3:]) and np.array_equal(a[1, 0], ALL[2])
    assert not a[1, 1:].any()
    assert [s.shape for s in x.as_sequences()] == [(2, 2, 3), (1, 2, 3), (3, 2, 3)]
    y = mb["y"]
    assert y.shape == (3, 3, 10) and y.csr().shape == (6, 10)
    # equal lengths: the view of values
    same = MinibatchSource(CTFDeserializer(ctf, STREAMS), randomize=False, max_sweeps=1).next_minibatch(1)
    assert same["x"].asarray().shape == (1, 2, 2, 3) and np.shares_memory(same["x"].asarray(), same["x"].values)


def test_bptt_rows_keep_the_shape(ctf):
    src = MinibatchSource(CTFDeserializer(ctf, STREAMS), randomize=False, max_sweeps=1, truncation_length=2)
    # 2 rows of 2 steps: row 0 holds 0 (2 samples ≤ τ, so it takes 1 too), row 1 holds 2 (3 samples)
    mb = src.next_minibatch(4)
    assert mb.sequence_keys.tolist() == [0, 2]
    values, mask = mb["x"].rows()
    assert values.shape == (2, 2, 2, 3) and np.array_equal(values[0], ALL[:2]) and np.array_equal(values[1], ALL[3:5])
    assert mask.tolist() == [[2, 1], [2, 1]]
    assert mb["x"].asarray().shape == (2, 2, 2, 3)
    # the sparse stream is densified under BPTT and takes its shape too
    y, _ = mb["y"].rows()
    assert y.shape == (2, 2, 2, 5) and y[0, 1].ravel().tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0, 1]


def test_cbf_shapes(ctf, tmp_path):
    out = tmp_path / "shapes.cbf"
    cntkio.convert(CTFDeserializer(ctf, STREAMS), out)
    d = CBFDeserializer(out, StreamDefs(x=StreamDef(shape=(3, 2))))
    data = d.read()
    assert data["x"].values.shape == (6, 3, 2) and np.array_equal(data["x"].values, ALL.reshape(6, 3, 2))
    assert data["y"].sample_shape == (10,)
    # a rename keeps the shape: the key names the stream
    renamed = CBFDeserializer(out, StreamDefs(feat=StreamDef(field="x", shape=(2, 3))))
    mb = MinibatchSource(renamed, randomize=False).next_minibatch(1)
    assert mb["feat"].values.shape == (2, 2, 3)
    with pytest.raises(UsageError, match=r"shape \(4,\) has 4 elements, but the stream's dimension is 6"):
        CBFDeserializer(out, StreamDefs(x=StreamDef(shape=4))).read()
    with pytest.raises(UsageError, match="dimension is 6"):
        MinibatchSource(CBFDeserializer(out, StreamDefs(x=StreamDef(shape=(5, 2)))))


def test_torch_tensors_keep_the_shape(ctf):
    torch = pytest.importorskip("torch")
    import cntkio.torch as ct

    ds = ct.IterableDataset(CTFDeserializer(ctf, STREAMS), batch_size=100, shuffle=False)
    batch = next(iter(ds))
    assert isinstance(batch["x"], torch.Tensor) and tuple(batch["x"].shape) == (6, 2, 3)
    assert torch.equal(batch["x"], torch.from_numpy(ALL))
