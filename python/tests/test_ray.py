"""cntkio.ray on a local Ray cluster: read_cntk yields every sequence once with the single-process values;
CBFDatasink writes the dataset as CBF shards that hold the same sequences."""

from __future__ import annotations

import shutil

import pytest

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, StreamDef, StreamDefs

pa = pytest.importorskip("pyarrow")
ray = pytest.importorskip("ray")
cntkio_ray = pytest.importorskip("cntkio.ray")

# Ray's own deprecation warnings (its configuration reads deprecated settings) are not this package's.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")

SLOTS = StreamDefs(
    query=StreamDef(field="word", shape=13, is_sparse=True, defines_mb_size=True),
    intent=StreamDef(field="intent", shape=5, is_sparse=True),
    slots=StreamDef(field="slot", shape=12, is_sparse=True),
)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def rows_without_keys(t):
    """The table's rows (keys left out), sorted: the same sequences whatever their order and keys."""
    return sorted(repr(r) for r in t.drop_columns(["key"]).to_pylist())


def collect(ds):
    return pa.concat_tables([t.replace_schema_metadata(None) for t in ray.get(ds.to_arrow_refs())])


def test_read_cntk_yields_every_sequence_once(cluster, tmp_path, examples):
    src = tmp_path / "slots.ctf"
    shutil.copy(examples / "slots.ctf", src)
    want = cntkio.read_arrow(src, SLOTS, chunk_size=2000)
    n = CTFDeserializer(src, SLOTS, chunk_size=2000).num_chunks
    assert n > 2

    ds = cntkio_ray.read_cntk(src, SLOTS, chunk_size=2000).materialize()
    assert ds.num_blocks() == n
    got = collect(ds).sort_by("key")
    assert got.num_rows == want.num_rows == 60
    assert got.equals(want.replace_schema_metadata(None).sort_by("key"))

    # A Parquet and a CBF twin side by side: each file's chunks are read once.
    cntkio.convert(src, tmp_path / "slots.parquet", SLOTS, row_group_size=9)
    cntkio.convert(src, tmp_path / "slots.cbf", SLOTS, chunk_size=2000)
    both = cntkio_ray.read_cntk([tmp_path / "slots.parquet", tmp_path / "slots.cbf"]).materialize()
    assert both.num_blocks() == 7 + CBFDeserializer(tmp_path / "slots.cbf").num_chunks
    assert rows_without_keys(collect(both)) == sorted(rows_without_keys(want) * 2)


def test_cbf_datasink_writes_shards_of_the_same_sequences(cluster, tmp_path, examples):
    src = tmp_path / "slots.ctf"
    shutil.copy(examples / "slots.ctf", src)
    want = cntkio.read_arrow(src, SLOTS, chunk_size=2000)
    ds = cntkio_ray.read_cntk(src, SLOTS, chunk_size=2000).repartition(3)
    ds.write_datasink(cntkio_ray.CBFDatasink(tmp_path / "shards", chunk_size=1000))
    shards = sorted((tmp_path / "shards").glob("shard-*.cbf"))
    assert 1 <= len(shards) <= 3
    assert not [p for p in (tmp_path / "shards").iterdir() if p.suffix != ".cbf"]
    tables = [cntkio.read_arrow(p).replace_schema_metadata(None) for p in shards]
    got = pa.concat_tables(tables)
    assert rows_without_keys(got) == rows_without_keys(want)
    assert sum(CBFDeserializer(p).read().num_samples for p in shards) == 354


def test_the_datasink_refuses_data_outside_the_mapping(cluster, tmp_path):
    ds = ray.data.from_items([{"a": 1}])
    with pytest.raises(Exception, match="cntkio's Arrow mapping"):
        ds.write_datasink(cntkio_ray.CBFDatasink(tmp_path / "out"))
