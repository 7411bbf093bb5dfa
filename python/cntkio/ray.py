"""CNTK data on Ray Data: read CTF, CBF, Parquet and Arrow IPC files as a ``ray.data.Dataset`` whose
blocks are Arrow tables in cntkio's Arrow mapping (README, "Arrow and Parquet"), and write a dataset in
that mapping as CBF shards. Needs Ray (``pip install cntkio[ray]``)::

    import ray
    import cntkio, cntkio.ray

    ds = cntkio.ray.read_cntk(["part-0.ctf", "part-1.ctf"], streams=cntkio.StreamDefs(
        x=cntkio.StreamDef(field="x", shape=784), y=cntkio.StreamDef(field="y", shape=10, is_sparse=True)))
    ds.write_datasink(cntkio.ray.CBFDatasink("shards/"))   # shards/shard-00000.cbf, …
    ds.write_parquet("parquet/")                           # or Ray's own Parquet writer

One read task per chunk (CTF: the chunks of the index, by ``chunkSizeInBytes``; CBF: the file's chunks;
Parquet: its row groups; Arrow IPC: its record batches). The driver indexes each CTF file once and keeps
the index in CNTK's index cache next to the file (``cacheIndex``), which the read tasks load instead of
indexing again: the files must be on storage that every node sees at the same path.
"""

from __future__ import annotations

import os as _os
import tempfile as _tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from cntkio import CTFDeserializer, PathLike, UsageError, _Deserializer, _open_any, convert, read_arrow

try:
    import ray.data as _ray_data
    from ray.data.block import BlockAccessor as _BlockAccessor
    from ray.data.block import BlockMetadata as _BlockMetadata
    from ray.data.datasource import Datasink as _Datasink
    from ray.data.datasource import Datasource as _Datasource
    from ray.data.datasource import ReadTask as _ReadTask
except ImportError:  # pragma: no cover - the message is the point
    raise UsageError("cntkio.ray needs Ray Data: pip install 'ray[data]' (or pip install cntkio[ray])") from None

__all__ = ["CBFDatasink", "CNTKDatasource", "read_cntk"]

_METADATA_KEY = b"cntkio.arrow"


class CNTKDatasource(_Datasource):  # type: ignore[misc]
    """CTF, CBF, Parquet or Arrow IPC files (format by magic number) as a Ray datasource: one read task per
    chunk, each giving that chunk as one Arrow table in cntkio's Arrow mapping. ``streams`` is required for
    CTF files (a :class:`cntkio.StreamDefs`) and renames the streams of the others; ``options`` are the
    deserializers' (``chunkSizeInBytes``, ``maxErrors``, ``precision``, …); ``flatten`` makes one row per
    sample. Files and their chunk tables are opened on the driver when the datasource is made."""

    def __init__(
        self,
        paths: Union[PathLike, Sequence[PathLike]],
        streams: Optional[Mapping[str, Mapping[str, Any]]] = None,
        *,
        flatten: bool = False,
        **options: Any,
    ) -> None:
        if isinstance(paths, (str, _os.PathLike)):
            paths = [paths]
        paths = [_os.fspath(p) for p in paths]
        if not paths:
            raise UsageError("cntkio.ray.read_cntk needs at least one file")
        self._flatten = bool(flatten)
        self._deserializers: List[_Deserializer] = []
        for p in paths:
            d = _open_any(p, streams, dict(options))
            if isinstance(d, CTFDeserializer) and "cacheIndex" not in d:
                d["cacheIndex"] = True
            self._deserializers.append(d)
        # (file, chunk, rows, bytes on disk shared out by samples)
        self._chunks: List[Any] = []
        for i, d in enumerate(self._deserializers):
            sizes = d.chunk_sizes()
            total = sum(samples for _, samples in sizes) or 1
            nbytes = _os.path.getsize(d.path)
            for c, (sequences, samples) in enumerate(sizes):
                rows = samples if self._flatten else sequences
                self._chunks.append((i, c, rows, nbytes * samples // total))

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return sum(_os.path.getsize(d.path) for d in self._deserializers)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None, **_: Any) -> List[Any]:
        tasks = []
        for i, c, rows, nbytes in self._chunks:
            d = self._deserializers[i]
            meta = _BlockMetadata(num_rows=rows, size_bytes=nbytes, exec_stats=None, input_files=[d.path])
            read = _partial_read(d, c, self._flatten)
            if per_task_row_limit is None:
                tasks.append(_ReadTask(read, meta))
            else:
                tasks.append(_ReadTask(read, meta, per_task_row_limit=per_task_row_limit))
        return tasks

    def get_name(self) -> str:
        return "CNTK"


def _partial_read(d: _Deserializer, chunk: int, flatten: bool) -> Any:
    """A read task's function: the deserializer (pickled as its configuration) reopens its file in the
    worker and reads the one chunk."""
    return lambda: [read_arrow(d, chunks=range(chunk, chunk + 1), flatten=flatten)]


def read_cntk(
    paths: Union[PathLike, Sequence[PathLike]],
    streams: Optional[Mapping[str, Mapping[str, Any]]] = None,
    *,
    flatten: bool = False,
    ray_remote_args: Optional[Dict[str, Any]] = None,
    **options: Any,
) -> Any:
    """The files as a ``ray.data.Dataset`` (see :class:`CNTKDatasource`): one read task per chunk, rows in
    cntkio's Arrow mapping (``key``, ``num_samples``, one column per stream)."""
    return _ray_data.read_datasource(
        CNTKDatasource(paths, streams, flatten=flatten, **options), ray_remote_args=ray_remote_args or {}
    )


class CBFDatasink(_Datasink):  # type: ignore[misc]
    """Writes a dataset in cntkio's Arrow mapping (as :func:`read_cntk` makes it) as CBF shards in
    ``path``: one file ``{prefix}-{task:05d}.cbf`` per write task that receives rows, each written to a
    temporary file and renamed when complete. ``chunk_size``: CBF chunk size in bytes (default 32 MiB).
    The shards' keys are their sequences' positions (CBF keeps no keys); training reads them with
    ``cntkio.torch`` (``paths=sorted(glob(...))``) or a :class:`cntkio.MinibatchSource` over several
    :class:`cntkio.CBFDeserializer` objects (``concat=True``)."""

    def __init__(self, path: PathLike, *, chunk_size: Optional[int] = None, prefix: str = "shard") -> None:
        self.path = _os.fspath(path)
        self.chunk_size = chunk_size
        self.prefix = prefix

    def on_write_start(self, schema: Any = None) -> None:
        _os.makedirs(self.path, exist_ok=True)

    def write(self, blocks: Iterable[Any], ctx: Any) -> Dict[str, Any]:
        import pyarrow as pa

        tables = [_BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return {"rows": 0, "files": []}
        metadata = tables[0].schema.metadata or {}
        if _METADATA_KEY not in metadata:
            raise UsageError(
                "CBFDatasink writes datasets in cntkio's Arrow mapping (as cntkio.ray.read_cntk makes them); "
                f"the blocks' schema has no {_METADATA_KEY.decode()!r} metadata"
            )
        target = _os.path.join(self.path, f"{self.prefix}-{ctx.task_idx:05d}.cbf")
        _os.makedirs(self.path, exist_ok=True)
        # The blocks go through an Arrow IPC file that the library converts (checking every value of the
        # mapping) and writes to a temporary file renamed over the target.
        with _tempfile.TemporaryDirectory(dir=self.path, prefix=".cntkio-") as tmp:
            ipc = _os.path.join(tmp, "blocks.arrow")
            schema = tables[0].schema
            with pa.ipc.new_file(ipc, schema) as w:
                for t in tables:
                    w.write_table(t.replace_schema_metadata(metadata).cast(schema))
            summary = convert(ipc, target, chunk_size=self.chunk_size)
        return {"rows": sum(t.num_rows for t in tables), "files": [target], "sequences": summary["sequences"]}

    def get_name(self) -> str:
        return "CBF"
