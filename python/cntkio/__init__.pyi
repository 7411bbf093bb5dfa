"""Typing stubs of the cntkio package."""

import os
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from cntkio._errors import (
    CntkError as CntkError,
    FormatError as FormatError,
    InternalError as InternalError,
    IoError as IoError,
    LimitError as LimitError,
    NotFoundError as NotFoundError,
    PermissionDeniedError as PermissionDeniedError,
    UsageError as UsageError,
)

PathLike = Union[str, os.PathLike[str]]
Precision = Union[str, type, np.dtype[Any], None]

__version__: str
DEFAULT_CHUNK_SIZE: int

class StreamDef(Dict[str, Any]):
    stream_alias: Optional[str]
    is_sparse: bool
    dim: int
    shape: Tuple[int, ...]
    defines_mb_size: bool
    def __init__(
        self,
        field: Optional[str] = ...,
        shape: Union[int, Sequence[int], None] = ...,
        is_sparse: bool = ...,
        defines_mb_size: bool = ...,
    ) -> None: ...
    def __getattr__(self, key: str) -> Any: ...

class StreamDefs(Dict[str, StreamDef]):
    def __init__(self, **streams: StreamDef) -> None: ...
    def __getattr__(self, key: str) -> StreamDef: ...

class StreamInformation(NamedTuple):
    name: str
    alias: str
    dim: int
    is_sparse: bool
    dtype: np.dtype[Any]
    defines_mb_size: bool
    shape: Optional[Tuple[int, ...]] = ...
    @property
    def m_name(self) -> str: ...
    @property
    def storage_format(self) -> str: ...
    @property
    def sample_shape(self) -> Tuple[int, ...]: ...

_native: Any

class _Record(Dict[str, Any]):
    def __getattr__(self, key: str) -> Any: ...

class StreamData:
    def __init__(
        self,
        name: str,
        dim: int,
        is_sparse: bool,
        values: Any,
        offsets: Any,
        indices: Any,
        indptr: Any,
        sample_shape: Optional[Tuple[int, ...]] = ...,
    ) -> None: ...
    name: str
    dim: int
    is_sparse: bool
    sample_shape: Tuple[int, ...]
    values: npt.NDArray[np.floating[Any]]
    offsets: npt.NDArray[np.int64]
    indices: Optional[npt.NDArray[np.int32]]
    indptr: Optional[npt.NDArray[np.signedinteger[Any]]]
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def num_sequences(self) -> int: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def lengths(self) -> npt.NDArray[np.int64]: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    def raw(self) -> Tuple[npt.NDArray[np.floating[Any]], npt.NDArray[np.int32], npt.NDArray[np.signedinteger[Any]]]: ...
    def csr(self) -> Any: ...
    def asarray(self) -> Any: ...
    def todense(self) -> npt.NDArray[np.floating[Any]]: ...
    def sequence(self, s: int) -> Any: ...
    def as_sequences(self) -> List[Any]: ...
    def padded(self, max_length: Optional[int] = ...) -> Tuple[npt.NDArray[np.floating[Any]], npt.NDArray[np.bool_]]: ...

class Data(Mapping[str, StreamData]):
    sequence_keys: npt.NDArray[np.uint64]
    sequence_lengths: npt.NDArray[np.uint32]
    streams: Dict[str, StreamData]
    def __init__(self, sequence_keys: Any, sequence_lengths: Any, streams: Dict[str, StreamData]) -> None: ...
    @property
    def num_sequences(self) -> int: ...
    @property
    def num_samples(self) -> int: ...
    def __getitem__(self, name: str) -> StreamData: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...

class _Deserializer(Dict[str, Any]):
    @property
    def path(self) -> str: ...
    def open(self) -> Any: ...
    def stream_infos(self) -> List[StreamInformation]: ...
    @property
    def num_chunks(self) -> int: ...
    def chunk_sizes(self) -> List[Tuple[int, int]]: ...
    def read_chunk(self, i: int) -> Data: ...
    def chunks(self) -> Iterator[Data]: ...
    def read(self, threads: Optional[int] = ...) -> Data: ...
    def arrow(self, chunks: Optional[range] = ..., *, flatten: bool = ...) -> ArrowStream: ...
    def copy(self) -> _Deserializer: ...

class ArrowStream:
    """Record batches in cntkio's Arrow mapping, for consumers of the Arrow PyCapsule interface."""

    @property
    def num_rows(self) -> Optional[int]: ...
    def __arrow_c_stream__(self, requested_schema: Optional[object] = ...) -> object: ...
    def __arrow_c_schema__(self) -> object: ...

class CTFDeserializer(_Deserializer):
    def __init__(self, filename: PathLike, streams: Mapping[str, Mapping[str, Any]], **options: Any) -> None: ...
    def copy(self) -> CTFDeserializer: ...

class CBFDeserializer(_Deserializer):
    def __init__(
        self, filename: PathLike, streams: Optional[Mapping[str, Mapping[str, Any]]] = ..., **options: Any
    ) -> None: ...
    def copy(self) -> CBFDeserializer: ...

class ValidationError(NamedTuple):
    path: Optional[str]
    line: Optional[int]
    column: Optional[int]
    byte: Optional[int]
    sequence_id: Optional[int]
    code: str
    kind: str
    category: str
    severity: str
    message: str
    help: Optional[str]
    display: str

class ValidationReport(NamedTuple):
    path: str
    format: str
    valid: bool
    verdict: str
    sequences: int
    samples: int
    num_errors: int
    dropped_sequences: int
    num_warnings: int
    max_errors: int
    errors: List[ValidationError]
    warnings: List[ValidationError]
    notes: List[str]
    schema: List[str] = ...
    schema_inferred: bool = ...
    stream_samples: Dict[str, int] = ...
    missing_inputs: List[Dict[str, Any]] = ...
    warning_notes: List[Dict[str, Any]] = ...
    def to_dict(self) -> Dict[str, Any]: ...

def detect_format(path: PathLike) -> str: ...
def recompress(input: PathLike, output: PathLike, *, threads: Optional[int] = ...) -> int: ...
def inspect(path: PathLike, *, skip_sequence_ids: bool = ...) -> Dict[str, Any]: ...
def stats(
    input: Union[PathLike, _Deserializer, Sequence[Union[PathLike, _Deserializer]]],
    streams: Optional[Mapping[str, Mapping[str, Any]]] = ...,
    *,
    threads: Optional[int] = ...,
    **options: Any,
) -> Dict[str, Any]: ...
def convert(
    input: Union[PathLike, _Deserializer],
    output: PathLike,
    streams: Optional[Mapping[str, Mapping[str, Any]]] = ...,
    *,
    chunk_size: Optional[int] = ...,
    max_errors: Optional[int] = ...,
    skip_sequence_ids: Optional[bool] = ...,
    precision: Precision = ...,
    ctf2bin_compatible: bool = ...,
    skip_bad_sequences: bool = ...,
    threads: Optional[int] = ...,
    flatten: bool = ...,
    row_group_size: Optional[int] = ...,
) -> Dict[str, Any]: ...
def read_arrow(
    source: Union[PathLike, _Deserializer],
    streams: Optional[Mapping[str, Mapping[str, Any]]] = ...,
    *,
    chunks: Optional[range] = ...,
    flatten: bool = ...,
    **options: Any,
) -> Any: ...
def validate(
    path: Union[PathLike, _Deserializer],
    streams: Optional[Mapping[str, Mapping[str, Any]]] = ...,
    *,
    max_errors: Optional[int] = ...,
    skip_sequence_ids: Optional[bool] = ...,
    precision: Precision = ...,
    chunk_size: Optional[int] = ...,
    warnings: bool = ...,
    limit: int = ...,
    threads: Optional[int] = ...,
) -> ValidationReport: ...

INFINITELY_REPEAT: int
FULL_DATA_SWEEP: int
DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS: int

class BpttLayout:
    rows: int
    columns: int
    fragments: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    def __init__(self, rows: int, columns: int, fragments: Any, lengths: Any) -> None: ...
    @property
    def num_fragments(self) -> int: ...
    @property
    def row(self) -> npt.NDArray[np.int64]: ...
    @property
    def column(self) -> npt.NDArray[np.int64]: ...
    @property
    def offset(self) -> npt.NDArray[np.int64]: ...
    @property
    def sequence_len(self) -> npt.NDArray[np.int64]: ...
    @property
    def starts(self) -> npt.NDArray[np.bool_]: ...
    @property
    def ends(self) -> npt.NDArray[np.bool_]: ...
    def mask(self) -> npt.NDArray[np.uint8]: ...

class MinibatchData(StreamData):
    info: StreamInformation
    keys: npt.NDArray[np.uint64]
    sequence_lengths: npt.NDArray[np.uint32]
    end_of_sweep: bool
    bptt: Optional[BpttLayout]
    @property
    def max_length(self) -> int: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def data(self) -> MinibatchData: ...
    @property
    def mask(self) -> npt.NDArray[np.uint8]: ...
    def asarray(self) -> Any: ...
    def as_sequences(self, variable: Any = ...) -> List[Any]: ...
    def rows(self) -> Tuple[npt.NDArray[np.floating[Any]], npt.NDArray[np.uint8]]: ...
    def __len__(self) -> int: ...

class Minibatch(Mapping[StreamInformation, MinibatchData]):
    sequence_keys: Optional[npt.NDArray[np.uint64]]
    sequence_lengths: Optional[npt.NDArray[np.uint32]]
    end_of_sweep: bool
    end_of_run: bool
    bptt: Optional[BpttLayout]
    @property
    def num_sequences(self) -> int: ...
    @property
    def num_samples(self) -> int: ...
    def __getitem__(self, key: Union[StreamInformation, str]) -> MinibatchData: ...
    def __iter__(self) -> Iterator[StreamInformation]: ...
    def __len__(self) -> int: ...
    def by_name(self) -> Dict[str, MinibatchData]: ...
    def to_arrow(self, *, flatten: bool = ...) -> Any: ...
    def __arrow_c_stream__(self, requested_schema: Optional[object] = ...) -> object: ...
    def __arrow_c_schema__(self) -> object: ...

class MinibatchSource:
    randomized: bool
    truncation_length: int
    def __init__(
        self,
        deserializers: Union[_Deserializer, Sequence[_Deserializer]],
        max_samples: int = ...,
        max_sweeps: int = ...,
        randomization_window_in_chunks: int = ...,
        randomization_window_in_samples: int = ...,
        randomization_seed: int = ...,
        trace_level: Any = ...,
        multithreaded_deserializer: Optional[bool] = ...,
        frame_mode: bool = ...,
        truncation_length: int = ...,
        randomize: bool = ...,
        max_errors: int = ...,
        *,
        concat: bool = ...,
        cntk_restore_quirk: bool = ...,
        balanced_workers: bool = ...,
        elastic_resume: Optional[Mapping[str, Any]] = ...,
        **cntk_config: Any,
    ) -> None: ...
    def stream_infos(self) -> List[StreamInformation]: ...
    @property
    def streams(self) -> _Record: ...
    def stream_info(self, name: str) -> StreamInformation: ...
    def __getitem__(self, name: str) -> StreamInformation: ...
    @property
    def sweep_size(self) -> int: ...
    @property
    def num_sequences(self) -> int: ...
    @property
    def num_chunks(self) -> int: ...
    @property
    def deserializers(self) -> List[_Deserializer]: ...
    def next_minibatch(
        self,
        minibatch_size_in_samples: int,
        input_map: Optional[Mapping[Any, Union[StreamInformation, str]]] = ...,
        device: Any = ...,
        num_data_partitions: Optional[int] = ...,
        partition_index: Optional[int] = ...,
    ) -> Any: ...
    def get_checkpoint_state(self) -> Dict[str, Any]: ...
    def restore_from_checkpoint(self, checkpoint: Union[Mapping[str, Any], str]) -> None: ...
    def sequences_delivered(self, sweep: int = ...) -> int: ...
    @property
    def current_position(self) -> Dict[str, Any]: ...
    @current_position.setter
    def current_position(self, position: Mapping[str, Any]) -> None: ...

class Loader:
    """Batches of CNTK data for a training loop, assembled by native threads (see cntkio._loader)."""

    batch_size: int
    shuffle: bool
    seed: int
    epoch: int
    rank: int
    world_size: int
    layout: str
    sparse: str
    with_keys: bool
    num_threads: int
    prefetch: int
    def __init__(
        self,
        deserializers: Union[_Deserializer, Sequence[_Deserializer], None] = ...,
        *,
        paths: Union[PathLike, Sequence[PathLike], None] = ...,
        streams: Optional[Mapping[str, Mapping[str, Any]]] = ...,
        batch_size: int = ...,
        shuffle: bool = ...,
        seed: int = ...,
        randomization_window_in_chunks: int = ...,
        randomization_window_in_samples: int = ...,
        frame_mode: bool = ...,
        truncation_length: int = ...,
        concat: Optional[bool] = ...,
        rank: Optional[int] = ...,
        world_size: Optional[int] = ...,
        balanced_workers: bool = ...,
        keep_chunks: bool = ...,
        layout: str = ...,
        sparse: str = ...,
        with_keys: bool = ...,
        num_threads: Optional[int] = ...,
        prefetch: Optional[int] = ...,
        **options: Any,
    ) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Dict[str, Any]]: ...
    def minibatches(self) -> Iterator[Minibatch]: ...
    def state_dict(self, batches: Optional[int] = ..., num_workers: Optional[int] = ...) -> Dict[str, Any]: ...
    def load_state_dict(
        self, state: Union[Mapping[str, Any], Sequence[Mapping[str, Any]]], num_workers: Optional[int] = ...
    ) -> None: ...
