"""Arrow and Parquet from Python: deserializers over Parquet and Arrow IPC files (cntkio's Arrow mapping)
give the data of the CTF/CBF file they were converted from; cntkio.read_arrow and the Arrow C stream
interface hand the mapping to pyarrow, polars and DuckDB."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import cntkio
from conftest import assert_data_equal as same
from cntkio import CBFDeserializer, CTFDeserializer, MinibatchSource, StreamDef, StreamDefs

pa = pytest.importorskip("pyarrow")

SLOTS = StreamDefs(
    query=StreamDef(field="word", shape=13, is_sparse=True, defines_mb_size=True),
    intent=StreamDef(field="intent", shape=5, is_sparse=True),
    slots=StreamDef(field="slot", shape=12, is_sparse=True),
)
LOGREG = StreamDefs(features=StreamDef(field="features", shape=2), labels=StreamDef(field="labels", shape=1))


def minibatches(deserializer, **kw):
    """Every minibatch of one sweep: per stream, its keys' order and its values."""
    src = MinibatchSource(deserializer, max_sweeps=1, **kw)
    out = []
    while True:
        mb = src.next_minibatch(37)
        if not mb:
            return out
        row = {}
        for info in src.stream_infos():
            d = mb[info]
            arrays = d.raw() if d.is_sparse else (d.values,)
            row[info.name] = (d.num_sequences, d.num_samples, [np.asarray(a) for a in arrays])
        out.append(row)


def same_minibatches(a, b):
    assert len(a) == len(b) and len(a) > 1
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for name in x:
            assert x[name][:2] == y[name][:2]
            for a, b in zip(x[name][2], y[name][2]):
                np.testing.assert_array_equal(a, b)


@pytest.fixture
def slots(tmp_path, examples):
    """slots.ctf, its CBF twin, and both as Parquet and Arrow IPC (from the CTF and from the CBF)."""
    ctf = CTFDeserializer(examples / "slots.ctf", SLOTS, chunk_size=2000)
    cntkio.convert(ctf, tmp_path / "slots.cbf", chunk_size=2000)
    files = {}
    for ext in ("parquet", "arrow"):
        s = cntkio.convert(ctf, tmp_path / f"slots.{ext}", row_group_size=7)
        assert s["input_format"] == "ctf" and s["sequences"] == 60 and s["samples"] == 354
        assert cntkio.detect_format(tmp_path / f"slots.{ext}") == ext
        files[ext] = tmp_path / f"slots.{ext}"
        cntkio.convert(tmp_path / "slots.cbf", tmp_path / f"from_cbf.{ext}", row_group_size=7)
        files[f"cbf_{ext}"] = tmp_path / f"from_cbf.{ext}"
    return ctf, CBFDeserializer(tmp_path / "slots.cbf"), files


@pytest.mark.parametrize("ext", ["parquet", "arrow"])
def test_deserializers_read_parquet_and_arrow_as_the_file_converted(slots, ext):
    ctf, cbf, files = slots
    d = CBFDeserializer(files[ext])
    assert [s.name for s in d.stream_infos()] == ["query", "intent", "slots"]
    assert [(s.dim, s.is_sparse) for s in d.stream_infos()] == [(13, True), (5, True), (12, True)]
    same(d.read(), ctf.read())
    # The chunks are the row groups (7 sequences each), read one at a time.
    assert d.num_chunks == 9 and [n for n, _ in d.chunk_sizes()] == [7] * 8 + [4]
    keys = np.concatenate([c.sequence_keys for c in d.chunks()])
    np.testing.assert_array_equal(keys, ctf.read().sequence_keys)
    # From the CBF twin: the keys are the sequences' positions, as CBF gives them.
    same(CBFDeserializer(files[f"cbf_{ext}"]).read(), cbf.read())


def test_minibatches_from_parquet_equal_those_of_the_source(slots):
    ctf, cbf, files = slots
    ordered = minibatches(ctf, randomize=False)
    for ext in ("parquet", "arrow"):
        same_minibatches(minibatches(CBFDeserializer(files[ext]), randomize=False), ordered)
    # Randomized, the order follows the chunks: the same for both files of the same row groups.
    same_minibatches(
        minibatches(CBFDeserializer(files["parquet"]), randomization_seed=3),
        minibatches(CBFDeserializer(files["arrow"]), randomization_seed=3),
    )


def test_renames_precision_and_round_trip_back_to_cbf_and_ctf(slots, tmp_path):
    ctf, cbf, files = slots
    d = CBFDeserializer(files["parquet"], StreamDefs(words=StreamDef(field="query")), precision="double")
    infos = d.stream_infos()
    assert [s.name for s in infos] == ["words", "intent", "slots"]
    data = d.read()
    assert data["words"].dtype == np.float64
    np.testing.assert_array_equal(data["words"].values, ctf.read()["query"].values.astype(np.float64))
    assert d.read_chunk(1)["words"].dtype == np.float64

    back = cntkio.convert(files["parquet"], tmp_path / "back.cbf")
    assert back["input_format"] == "parquet"
    assert cntkio.detect_format(tmp_path / "back.cbf") == "cbf"
    same(CBFDeserializer(tmp_path / "back.cbf").read(), cbf.read())
    cntkio.convert(files["arrow"], tmp_path / "back.ctf")
    same(CTFDeserializer(tmp_path / "back.ctf", SLOTS).read(), ctf.read())


def test_read_arrow_sees_the_documented_schema(slots):
    ctf, _, files = slots
    t = cntkio.read_arrow(ctf)
    assert isinstance(t, pa.Table)
    assert t.column_names == ["key", "num_samples", "query", "intent", "slots"]
    assert t.schema.field("key").type == pa.uint64()
    assert t.schema.field("num_samples").type == pa.uint32()
    sparse = t.schema.field("query").type
    assert pa.types.is_list(sparse) and pa.types.is_struct(sparse.value_type)
    assert [f.name for f in sparse.value_type] == ["indices", "values"]
    assert sparse.value_type.field("indices").type.value_type == pa.int32()
    assert sparse.value_type.field("values").type.value_type == pa.float32()
    meta = json.loads(t.schema.metadata[b"cntkio.arrow"])
    assert meta["mapping"] == 1 and meta["rows"] == "sequences"
    assert [(s["name"], s["alias"], s["dim"], s["storage"]) for s in meta["streams"]] == [
        ("query", "word", 13, "sparse"),
        ("intent", "intent", 5, "sparse"),
        ("slots", "slot", 12, "sparse"),
    ]
    data = ctf.read()
    assert t.num_rows == data.num_sequences == 60
    np.testing.assert_array_equal(t.column("key").to_numpy(), data.sequence_keys)
    np.testing.assert_array_equal(t.column("num_samples").to_numpy(), data.sequence_lengths)
    # The values of a sequence's samples, in file order.
    q = data["query"]
    first = t.column("query")[0].as_py()
    assert [s["indices"] for s in first] == [list(q.indices[q.indptr[i] : q.indptr[i + 1]]) for i in range(len(first))]
    # Every reader of the same data gives the same table (a Parquet file, a path with its streams).
    assert cntkio.read_arrow(files["parquet"]).equals(t)
    assert cntkio.read_arrow(ctf.path, SLOTS, chunk_size=2000).equals(t)


def test_read_arrow_of_a_range_of_chunks(slots):
    ctf, _, files = slots
    whole = cntkio.read_arrow(files["arrow"])
    part = cntkio.read_arrow(files["arrow"], chunks=range(2, 5))
    assert part.num_rows == 21
    assert part.equals(whole.slice(14, 21))
    empty = cntkio.read_arrow(files["arrow"], chunks=range(9, 9))
    assert empty.num_rows == 0 and empty.schema.equals(whole.schema)
    n = ctf.num_chunks
    assert n > 1
    tables = [cntkio.read_arrow(ctf, chunks=range(i, i + 1)) for i in range(n)]
    assert pa.concat_tables(tables).equals(cntkio.read_arrow(ctf))


def test_dense_flattened(tmp_path, examples):
    d = CTFDeserializer(examples / "logreg.ctf", LOGREG)
    t = cntkio.read_arrow(d, flatten=True)
    assert t.column_names == ["key", "features", "labels"]
    assert t.schema.field("features").type == pa.list_(pa.field("item", pa.float32(), nullable=False), 2)
    x = np.stack(t.column("features").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(x, d.read()["features"].asarray())
    cntkio.convert(d, tmp_path / "flat.parquet", flatten=True)
    f = CBFDeserializer(tmp_path / "flat.parquet")
    same(f.read(), d.read())
    assert cntkio.read_arrow(tmp_path / "flat.parquet", flatten=True).equals(t)


def test_the_c_stream_goes_to_pyarrow_polars_and_duckdb_without_a_copy(slots, examples):
    ctf, _, files = slots
    stream = CBFDeserializer(files["parquet"]).arrow()
    assert stream.num_rows is None
    t = pa.table(stream)
    assert t.equals(cntkio.read_arrow(ctf))
    # Each export starts from the first chunk again.
    assert pa.table(stream).equals(t)
    assert pa.schema(stream).equals(t.schema)

    # Zero copy: pyarrow's table points at the buffers the extension made (the batches read_arrow keeps).
    dense = CTFDeserializer(examples / "logreg.ctf", LOGREG)
    held = dense.open().read_arrow()
    a = pa.table(held)
    b = pa.table(held)
    va = a.column("features").chunk(0).values.values.buffers()[1]
    vb = b.column("features").chunk(0).values.values.buffers()[1]
    assert va.address == vb.address

    pl = pytest.importorskip("polars")
    df = pl.DataFrame(dense.arrow(flatten=True))
    assert df.columns == ["key", "features", "labels"]
    np.testing.assert_array_equal(df["features"].to_numpy(), dense.read()["features"].asarray())

    duckdb = pytest.importorskip("duckdb")
    s = CBFDeserializer(files["arrow"]).arrow()  # noqa: F841 (DuckDB finds it by name)
    [(n, total)] = duckdb.sql("SELECT count(*), sum(num_samples) FROM s").fetchall()
    assert (n, total) == (60, 354)


def test_errors(slots, tmp_path, examples, monkeypatch):
    ctf, _, files = slots
    for bad in (range(0, 10, 2), range(3, 1), [0, 1], "0:2"):
        with pytest.raises(cntkio.UsageError, match="range"):
            cntkio.read_arrow(files["parquet"], chunks=bad)
    with pytest.raises(cntkio.UsageError) as e:
        cntkio.read_arrow(files["parquet"], chunks=range(5, 12))
    assert e.value.code == "E1008"
    with pytest.raises(cntkio.UsageError, match="needs its streams"):
        cntkio.read_arrow(examples / "slots.ctf")
    # Sequences of several samples cannot be flattened; the stream fails where the data does.
    with pytest.raises(cntkio.UsageError, match="exactly one sample"):
        cntkio.read_arrow(ctf, flatten=True)
    with pytest.raises(Exception, match="exactly one sample"):
        pa.table(ctf.arrow(flatten=True))
    with pytest.raises(cntkio.UsageError, match="Parquet and Arrow outputs"):
        cntkio.convert(ctf, tmp_path / "x.cbf", flatten=True)
    # A damaged Parquet file is a format error naming the file.
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    with pytest.raises(cntkio.FormatError) as e:
        CBFDeserializer(damaged).read()
    assert e.value.path == str(damaged)

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(cntkio.UsageError, match="pip install pyarrow"):
        cntkio.read_arrow(files["parquet"])


def test_the_command_reads_what_python_wrote(slots, tmp_path):
    ctf, _, files = slots
    out = subprocess.run(
        [sys.executable, "-m", "cntkio", "inspect", "--json", str(files["parquet"])],
        check=True,
        capture_output=True,
        text=True,
    )
    report = json.loads(out.stdout)
    assert report["format"] == "parquet"


def test_the_readme_example_runs(monkeypatch):
    pytest.importorskip("duckdb")
    from conftest import REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Arrow, Parquet and Ray", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(REPO)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    assert ns["t"].column_names == ["key", "features", "labels"] and ns["t"].num_rows == 300
    s = ns["s"]  # noqa: F841 (DuckDB finds it by name)
    assert ns["duckdb"].sql("SELECT count(*), sum(num_samples) FROM s").fetchall() == [(300, 300)]


# ---- Minibatches as Arrow -------------------------------------------------------------------------------

MIXED = StreamDefs(
    x=StreamDef(field="x", shape=3),
    y=StreamDef(field="y", shape=7, is_sparse=True),
)


@pytest.fixture
def mixed(tmp_path):
    """A CTF file of several chunks, a dense and a sparse stream, sequences of 1 to 4 samples (some with an
    empty sparse sample)."""
    rng = np.random.default_rng(5)
    lines = []
    for key in range(0, 240, 3):
        for i in range(int(rng.integers(1, 5))):
            x = " ".join(f"{v:.3f}" for v in rng.normal(size=3))
            entries = " ".join(f"{int(j)}:{v:.2f}" for j, v in zip(rng.integers(0, 7, 3), rng.normal(size=3)))
            y = f" |y {entries}" if i % 3 == 0 else (" |y" if i == 1 else "")
            lines.append(f"{key} |x {x}{y}")
    path = tmp_path / "mixed.ctf"
    path.write_text("\n".join(lines) + "\n")
    return path


def all_minibatches(d, size=29, **kw):
    src = MinibatchSource(d, max_sweeps=1, **kw)
    out = []
    while True:
        mb = src.next_minibatch(size)
        if not mb:
            return out
        out.append(mb)


@pytest.mark.parametrize("precision", ["float", "double"])
def test_in_order_minibatches_as_arrow_equal_read_arrow(mixed, tmp_path, precision):
    d = CTFDeserializer(mixed, MIXED, chunk_size=1500, precision=precision)
    assert d.num_chunks > 3
    whole = cntkio.read_arrow(d)
    value_type = pa.float32() if precision == "float" else pa.float64()
    assert whole.schema.field("x").type.value_type.value_type == value_type
    mbs = all_minibatches(d, randomize=False)
    assert len(mbs) > 3
    tables = [pa.table(mb) for mb in mbs]
    t = pa.concat_tables(tables)
    assert t.schema.equals(whole.schema, check_metadata=True)
    assert t.equals(whole, check_metadata=True)
    # to_arrow is the same record batch; its schema is the capsule's.
    assert pa.Table.from_batches([mbs[0].to_arrow()]).equals(tables[0])
    assert pa.schema(mbs[0]).equals(whole.schema, check_metadata=True)
    # The same from the CBF twin (keys are then positions, as read_arrow of the CBF gives them).
    cntkio.convert(d, tmp_path / "mixed.cbf")
    cbf = CBFDeserializer(tmp_path / "mixed.cbf")
    t = pa.Table.from_batches([mb.to_arrow() for mb in all_minibatches(cbf, randomize=False)])
    assert t.equals(cntkio.read_arrow(cbf), check_metadata=True)


def test_randomized_minibatches_as_arrow_hold_their_arrays(mixed):
    d = CTFDeserializer(mixed, MIXED, chunk_size=1500)
    keys = []
    for mb in all_minibatches(d, size=41, randomization_window_in_chunks=2, randomization_seed=7):
        t = pa.table(mb)
        assert t.num_rows == mb.num_sequences
        np.testing.assert_array_equal(t.column("key").to_numpy(), mb.sequence_keys)
        np.testing.assert_array_equal(t.column("num_samples").to_numpy(), mb.sequence_lengths)
        x, y = mb["x"], mb["y"]
        col = t.column("x").combine_chunks()
        np.testing.assert_array_equal(np.diff(col.offsets.to_numpy()), x.lengths)
        np.testing.assert_array_equal(col.values.values.to_numpy().reshape(-1, 3), x.values)
        sparse = t.column("y").combine_chunks()
        np.testing.assert_array_equal(np.diff(sparse.offsets.to_numpy()), y.lengths)
        samples = sparse.values
        np.testing.assert_array_equal(samples.field("indices").values.to_numpy(), y.indices)
        np.testing.assert_array_equal(samples.field("values").values.to_numpy(), y.values)
        np.testing.assert_array_equal(np.diff(samples.field("indices").offsets.to_numpy()), np.diff(y.indptr))
        keys.extend(mb.sequence_keys.tolist())
    ordered = cntkio.read_arrow(d).column("key").to_pylist()
    assert sorted(keys) == ordered and keys != ordered


def test_a_sample_shape_is_flattened_as_read_arrow_does(mixed):
    d = CTFDeserializer(mixed, StreamDefs(x=StreamDef(field="x", shape=(3, 1))), chunk_size=1500)
    mbs = all_minibatches(d, randomize=False)
    assert mbs[0]["x"].values.shape[1:] == (3, 1)
    t = pa.Table.from_batches([mb.to_arrow() for mb in mbs])
    assert t.schema.field("x").type.value_type.list_size == 3
    assert t.equals(cntkio.read_arrow(d), check_metadata=True)


def test_minibatch_arrow_shares_the_values(mixed):
    d = CTFDeserializer(mixed, MIXED, chunk_size=1500)
    mb = MinibatchSource(d, randomize=False).next_minibatch(50)
    b = mb.to_arrow()
    dense = b.column("x").values.values.buffers()[1]
    assert dense.address == mb["x"].values.ctypes.data
    sparse = b.column("y").values
    assert sparse.field("values").values.buffers()[1].address == mb["y"].values.ctypes.data
    assert sparse.field("indices").values.buffers()[1].address == mb["y"].indices.ctypes.data
    assert pa.table(mb).column("x").chunk(0).values.values.buffers()[1].address == mb["x"].values.ctypes.data


def test_minibatches_of_a_loader_go_to_polars_and_duckdb(mixed):
    d = CTFDeserializer(mixed, MIXED, chunk_size=1500)
    whole = cntkio.read_arrow(d)
    loader = cntkio.Loader(d, batch_size=33, shuffle=False, rank=0, world_size=1, num_threads=2)
    mbs = list(loader.minibatches())
    assert pa.concat_tables([pa.table(mb) for mb in mbs]).equals(whole)

    pl = pytest.importorskip("polars")
    # polars takes the C stream as a Series of structs (one per row), a DataFrame once unnested.
    df = pl.from_arrow(mbs[0])
    if isinstance(df, pl.Series):
        df = df.struct.unnest()
    assert pl.DataFrame(mbs[0].to_arrow()).equals(df)
    assert df.columns == ["key", "num_samples", "x", "y"]
    assert df["key"].to_list() == mbs[0].sequence_keys.tolist()
    np.testing.assert_array_equal(np.concatenate(df["x"].to_list()), mbs[0]["x"].values)

    duckdb = pytest.importorskip("duckdb")
    mb = mbs[1]  # noqa: F841 (DuckDB finds it by name)
    [(n, total)] = duckdb.sql("SELECT count(*), sum(num_samples) FROM mb").fetchall()
    assert (n, total) == (mbs[1].num_sequences, mbs[1].num_samples)


def test_frame_mode_minibatches_flatten(examples):
    d = CTFDeserializer(examples / "logreg.ctf", LOGREG)
    flat = cntkio.read_arrow(d, flatten=True)
    mbs = all_minibatches(d, size=64, randomize=False, frame_mode=True)
    t = pa.Table.from_batches([mb.to_arrow(flatten=True) for mb in mbs])
    assert t.equals(flat, check_metadata=True)
    assert pa.concat_tables([pa.table(mb) for mb in mbs]).equals(cntkio.read_arrow(d))


def test_minibatch_arrow_refusals(mixed, monkeypatch):
    d = CTFDeserializer(mixed, MIXED, chunk_size=1500)
    src = MinibatchSource(d, randomize=False, max_sweeps=1)
    mb = src.next_minibatch(20)
    with pytest.raises(cntkio.UsageError, match="exactly one sample, but sequence 0 declares"):
        mb.to_arrow(flatten=True)
    while mb:
        mb = src.next_minibatch(1000)
    with pytest.raises(cntkio.UsageError, match="empty"):
        pa.table(mb)
    bptt = MinibatchSource(
        CTFDeserializer(mixed, StreamDefs(x=StreamDef(field="x", shape=3))), randomize=False, truncation_length=2
    ).next_minibatch(8)
    assert bptt.bptt is not None
    with pytest.raises(cntkio.UsageError, match="truncated BPTT"):
        bptt.to_arrow()
    named = MinibatchSource(CTFDeserializer(mixed, StreamDefs(key=StreamDef(field="x", shape=3))), randomize=False)
    with pytest.raises(cntkio.UsageError, match="column of the Arrow mapping"):
        pa.table(named.next_minibatch(8))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(cntkio.UsageError, match=r"pip install cntkio\[arrow\]"):
        MinibatchSource(d, randomize=False).next_minibatch(8).to_arrow()


def test_the_readme_minibatch_example_runs(monkeypatch):
    pytest.importorskip("duckdb")
    from conftest import REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Arrow, Parquet and Ray", 1)[1]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:3]]
    monkeypatch.chdir(REPO)
    ns: dict = {}
    for code in blocks:
        exec(compile(code, "README.md", "exec"), ns)
    mb, b = ns["mb"], ns["b"]
    assert isinstance(b, ns["pa"].RecordBatch) and b.num_rows == mb.num_sequences == 100
    assert b.column_names == ["key", "num_samples", "features", "labels"]
    assert b.column("key").to_pylist() == mb.sequence_keys.tolist()
    assert ns["duckdb"].sql("SELECT count(*), sum(num_samples) FROM mb").fetchall() == [(100, 100)]
