//! Reading Parquet and Arrow IPC files in the mapping: [`ArrowFile`] (chunks = Parquet row groups or IPC
//! record batches) and [`ArrowSource`], the deserializer over it.

use super::{decode, format_error, ArrowFormat, Mapping, Rows};
use crate::randomize::{ChunkInfo, SequenceInfo, SequenceSource};
use crate::source::{set_element_types, Deserializer};
use crate::{ChunkData, ElementType, Error, Schema, StreamSpec};
use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_ipc::reader::FileReader;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use std::cell::Cell;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};

/// Rows decoded at a time from a Parquet row group at most (a row group of more rows is decoded in
/// several batches).
const PARQUET_BATCH_ROWS: usize = 64 * 1024;

/// About how many bytes of data a Parquet batch decodes at a time (rows are counted from the row group's
/// uncompressed size).
const PARQUET_BATCH_BYTES: u64 = 16 << 20;

/// The Parquet decoder and the IPC reader are other crates' code fed untrusted bytes: a panic in them
/// on a malformed file becomes an error naming the file, never an abort of the caller, and prints
/// nothing (the panic hook stays quiet while this thread is in here; other panics print as before).
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    match r {
        Ok(r) => r,
        Err(p) => {
            Err(format_error(format!("the {what} decoder failed on this file: {}", crate::panic_message(p.as_ref()))))
        }
    }
}

thread_local! {
    /// This thread is in [`guarded`]: a panic is caught there and reported as an error.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Installs, once, the panic hook that [`QUIET`] silences.
static QUIET_HOOK: Once = Once::new();

pub(super) fn parquet_error(e: parquet::errors::ParquetError) -> Error {
    match e {
        parquet::errors::ParquetError::External(b) => match b.downcast::<std::io::Error>() {
            Ok(io) => Error::io("read", *io),
            Err(b) => format_error(format!("invalid Parquet file: {b}")),
        },
        e => format_error(format!("invalid Parquet file: {e}")),
    }
}

pub(super) fn ipc_error(e: arrow_schema::ArrowError) -> Error {
    read_error("Arrow IPC", e)
}

/// An error of the decoder of a `what` file (Parquet, Arrow IPC).
fn read_error(what: &str, e: arrow_schema::ArrowError) -> Error {
    match e {
        arrow_schema::ArrowError::IoError(op, io) => Error::io(op, io),
        e => format_error(format!("invalid {what} file: {e}")),
    }
}

/// The Parquet decoder reads each column chunk's byte range whole: the ranges are checked against the
/// file before anything is allocated for them.
fn check_column_chunks(meta: &ArrowReaderMetadata, file_len: u64) -> Result<(), Error> {
    for (k, g) in meta.metadata().row_groups().iter().enumerate() {
        for c in g.columns() {
            let (start, len) = c.byte_range();
            if start.checked_add(len).is_none_or(|end| end > file_len) {
                return Err(format_error(format!(
                    "row group {k}, column {}: bytes {start}..+{len} lie outside the file of {file_len} bytes",
                    c.column_path()
                )));
            }
        }
    }
    Ok(())
}

/// An Arrow IPC file's reader (its footer's length checked first).
fn open_ipc(path: &Path) -> Result<FileReader<BufReader<File>>, Error> {
    let p = path.display();
    let mut f = File::open(path).map_err(|e| Error::io(format!("open {p}"), e))?;
    let file_len = f.metadata().map_err(|e| Error::io(format!("stat {p}"), e))?.len();
    check_footer(&mut f, file_len)?;
    FileReader::try_new(BufReader::new(f), None).map_err(ipc_error)
}

/// The IPC reader allocates the footer's length (the 4 bytes before the closing magic) before reading it,
/// and each record batch's (or dictionary's) lengths before reading it: all are checked against the file
/// first, so that no number in the file makes it allocate more than the file holds.
fn check_footer(f: &mut File, file_len: u64) -> Result<(), Error> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |e| Error::io("read the Arrow IPC footer", e);
    let mut tail = [0u8; 4];
    f.seek(SeekFrom::Start(file_len.saturating_sub(10))).and_then(|_| f.read_exact(&mut tail)).map_err(io)?;
    let footer_len = i32::from_le_bytes(tail);
    // Magic (8 bytes with padding) + footer + length (4) + magic (6).
    let Some(len) = u64::try_from(footer_len).ok().filter(|n| n + 18 <= file_len) else {
        return Err(format_error(format!(
            "the footer's length {footer_len} does not fit in the file of {file_len} bytes"
        )));
    };
    let mut footer = vec![0u8; len as usize];
    f.seek(SeekFrom::Start(file_len - 10 - len))
        .and_then(|_| f.read_exact(&mut footer))
        .and_then(|_| f.seek(SeekFrom::Start(0)))
        .map_err(io)?;
    let footer =
        arrow_ipc::root_as_footer(&footer).map_err(|e| format_error(format!("invalid Arrow IPC footer: {e}")))?;
    let blocks = [("record batch", footer.recordBatches()), ("dictionary", footer.dictionaries())];
    for (what, list) in blocks {
        for (k, b) in list.iter().flatten().enumerate() {
            let end = [b.offset(), i64::from(b.metaDataLength()), b.bodyLength()]
                .into_iter()
                .try_fold(0u64, |sum, n| u64::try_from(n).ok().and_then(|n| sum.checked_add(n)));
            if end.is_none_or(|end| end > file_len) {
                return Err(format_error(format!(
                    "{what} {k}: bytes {}..+{}+{} lie outside the file of {file_len} bytes",
                    b.offset(),
                    b.metaDataLength(),
                    b.bodyLength()
                )));
            }
        }
    }
    Ok(())
}

enum Inner {
    Parquet(ArrowReaderMetadata),
    Ipc(Box<Mutex<FileReader<BufReader<File>>>>),
}

/// An open Parquet or Arrow IPC file in cntkio's Arrow mapping: its mapping checked, chunks read on
/// demand. Chunk `k` is Parquet row group `k`, or IPC record batch `k`.
pub struct ArrowFile {
    path: PathBuf,
    format: ArrowFormat,
    mapping: Mapping,
    /// Rows of each chunk, as the file's metadata says (Parquet; IPC: unknown until read, `None`).
    rows: Vec<Option<u64>>,
    inner: Inner,
}

impl std::fmt::Debug for ArrowFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrowFile").field("path", &self.path).field("format", &self.format).finish()
    }
}

impl ArrowFile {
    /// Opens a Parquet or Arrow IPC file (told apart by their magic bytes) and checks its mapping.
    /// Errors carry the path: I/O, [`ErrorKind::ArrowFormat`](crate::ErrorKind::ArrowFormat) (not such a
    /// file, or not in the mapping), [`ErrorKind::ArrowColumn`](crate::ErrorKind::ArrowColumn) (a column
    /// of another type).
    pub fn open(path: impl AsRef<Path>) -> Result<ArrowFile, Error> {
        let path = path.as_ref();
        let p = path.display().to_string();
        let at = |e: Error| if e.position().path.is_none() { e.with_path(p.clone()) } else { e };
        let format = match crate::convert::detect_format(path).map_err(at)? {
            crate::convert::Format::Parquet => ArrowFormat::Parquet,
            crate::convert::Format::ArrowIpc => ArrowFormat::Ipc,
            _ => {
                return Err(at(format_error(
                    "the file is neither Parquet nor Arrow IPC (no PAR1 or ARROW1 magic bytes)",
                )))
            }
        };
        let open = || File::open(path).map_err(|e| Error::io(format!("open {p}"), e));
        let (inner, schema, rows) =
            guarded(if format == ArrowFormat::Parquet { "Parquet" } else { "Arrow IPC" }, || {
                Ok(match format {
                    ArrowFormat::Parquet => {
                        let meta = ArrowReaderMetadata::load(&open()?, Default::default()).map_err(parquet_error)?;
                        let file_len = std::fs::metadata(path).map_err(|e| Error::io(format!("stat {p}"), e))?.len();
                        check_column_chunks(&meta, file_len)?;
                        let rows =
                            meta.metadata().row_groups().iter().map(|g| u64::try_from(g.num_rows()).ok()).collect();
                        let schema = Arc::clone(meta.schema());
                        (Inner::Parquet(meta), schema, rows)
                    }
                    ArrowFormat::Ipc => {
                        let r = open_ipc(path)?;
                        let schema = r.schema();
                        let rows = vec![None; r.num_batches()];
                        (Inner::Ipc(Box::new(Mutex::new(r))), schema, rows)
                    }
                })
            })
            .map_err(at)?;
        let mapping = Mapping::from_arrow_schema(&schema).map_err(at)?;
        Ok(ArrowFile { path: path.to_path_buf(), format, mapping, rows, inner })
    }

    /// The path given to `open`.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Parquet or Arrow IPC.
    pub fn format(&self) -> ArrowFormat {
        self.format
    }
    /// The mapping the file's metadata describes.
    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }
    /// The streams (names, aliases, dims, storage and element types from the metadata).
    pub fn schema(&self) -> &Schema {
        &self.mapping.schema
    }
    /// Chunks: Parquet row groups, or IPC record batches.
    pub fn chunk_count(&self) -> usize {
        self.rows.len()
    }
    /// The rows of chunk `k` as the Parquet metadata says (`None` for IPC files, whose record batches
    /// tell only when read).
    pub fn chunk_rows(&self, k: usize) -> Option<u64> {
        self.rows.get(k).copied().flatten()
    }

    fn batches(
        &self,
        k: usize,
        projection: Option<&[usize]>,
        each: &mut dyn FnMut(&RecordBatch) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if k >= self.rows.len() {
            return Err(Error::chunk_out_of_range(k as u64, self.rows.len()));
        }
        let p = self.path.display().to_string();
        let what = if self.format == ArrowFormat::Parquet { "Parquet" } else { "Arrow IPC" };
        guarded(what, || match &self.inner {
            Inner::Parquet(meta) => {
                let file = File::open(&self.path).map_err(|e| Error::io(format!("open {p}"), e))?;
                let rows = self.rows[k].unwrap_or(0);
                let bytes = u64::try_from(meta.metadata().row_group(k).total_byte_size()).unwrap_or(0).max(1);
                let fit = u128::from(rows) * u128::from(PARQUET_BATCH_BYTES) / u128::from(bytes);
                let batch = usize::try_from(fit.min(rows.into())).unwrap_or(usize::MAX).clamp(1, PARQUET_BATCH_ROWS);
                let mut b = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
                    .with_row_groups(vec![k])
                    .with_batch_size(batch);
                if let Some(cols) = projection {
                    let mask =
                        ProjectionMask::roots(meta.metadata().file_metadata().schema_descr(), cols.iter().copied());
                    b = b.with_projection(mask);
                }
                for batch in b.build().map_err(parquet_error)? {
                    each(&batch.map_err(|e| read_error("Parquet", e))?)?;
                }
                Ok(())
            }
            Inner::Ipc(r) => {
                let mut r = match r.lock() {
                    Ok(r) => r,
                    Err(poisoned) => {
                        // The decoder panicked on a damaged record batch, leaving this reader as it was then:
                        // a fresh one reads the other batches as if that had not happened.
                        let mut fresh = poisoned.into_inner();
                        *fresh = open_ipc(&self.path)?;
                        r.clear_poison();
                        fresh
                    }
                };
                r.set_index(k).map_err(ipc_error)?;
                let batch =
                    r.next().ok_or_else(|| format_error(format!("record batch {k} is missing")))?.map_err(ipc_error)?;
                match projection {
                    Some(cols) => each(&batch.project(cols).map_err(ipc_error)?),
                    None => each(&batch),
                }
            }
        })
        .map_err(|e| if e.position().path.is_none() { e.with_path(p.clone()) } else { e })
    }

    /// Reads chunk `k` record batch by record batch (Parquet: about 16 MB of data at a time), each
    /// decoded into `data` (cleared first) and handed to `each`: for a reader that streams, whose memory
    /// then holds one batch rather than the whole chunk.
    pub fn for_each_batch(
        &self,
        k: usize,
        data: &mut ChunkData,
        each: &mut dyn FnMut(&ChunkData) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if data.streams.len() != self.mapping.schema.len() {
            *data = ChunkData::new(&self.mapping.schema);
        }
        self.batches(k, None, &mut |b| {
            data.clear();
            decode::append_batch(b, &self.mapping, data)?;
            each(data)
        })
    }

    /// Reads and decodes chunk `k`.
    pub fn read_chunk(&self, k: usize) -> Result<ChunkData, Error> {
        let mut out = ChunkData::new(&self.mapping.schema);
        self.read_chunk_into(k, &mut out)?;
        Ok(out)
    }

    /// Reads chunk `k` into `out` (cleared first; it keeps its allocations). On error `out`'s contents
    /// are unspecified.
    pub fn read_chunk_into(&self, k: usize, out: &mut ChunkData) -> Result<(), Error> {
        out.clear();
        if out.streams.len() != self.mapping.schema.len() {
            *out = ChunkData::new(&self.mapping.schema);
        }
        self.batches(k, None, &mut |b| decode::append_batch(b, &self.mapping, out))
    }

    /// The keys and declared lengths of chunk `k`'s sequences, reading only those columns.
    pub fn read_sequences(&self, k: usize, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        let cols: &[usize] = if self.mapping.rows == Rows::Sequences { &[0, 1] } else { &[0] };
        self.batches(k, Some(cols), &mut |b| {
            let keys = b
                .column(0)
                .as_primitive_opt::<UInt64Type>()
                .ok_or_else(|| super::column_error(super::KEY_COLUMN, "uint64", b.column(0).data_type().to_string()))?;
            if keys.null_count() > 0 {
                return Err(super::column_error(
                    super::KEY_COLUMN,
                    "no null values",
                    format!("{} nulls", keys.null_count()),
                ));
            }
            match b.columns().get(1) {
                Some(c) => {
                    let lens = c.as_primitive_opt::<UInt32Type>().ok_or_else(|| {
                        super::column_error(super::NUM_SAMPLES_COLUMN, "uint32", c.data_type().to_string())
                    })?;
                    if lens.null_count() > 0 {
                        return Err(super::column_error(
                            super::NUM_SAMPLES_COLUMN,
                            "no null values",
                            format!("{} nulls", lens.null_count()),
                        ));
                    }
                    out.extend(
                        keys.values()
                            .iter()
                            .zip(lens.values())
                            .map(|(&key, &num_samples)| SequenceInfo { num_samples, key }),
                    );
                }
                None => out.extend(keys.values().iter().map(|&key| SequenceInfo { num_samples: 1, key })),
            }
            Ok(())
        })
    }
}

/// A Parquet or Arrow IPC file as a deserializer: chunks as in the file, sequence keys and declared
/// lengths from its `key` and `num_samples` columns (read for every chunk when the source is opened:
/// 12 bytes per sequence).
#[derive(Debug)]
pub struct ArrowSource {
    file: ArrowFile,
    /// The file's streams, renamed ([`ArrowSource::rename`]).
    streams: Vec<StreamSpec>,
    chunks: Vec<ChunkInfo>,
    sequences: Vec<SequenceInfo>,
    /// `sequences[offsets[c]..offsets[c + 1]]` are chunk `c`'s.
    offsets: Vec<usize>,
    /// Every stream delivered as this element type (None: the file's).
    precision: Option<ElementType>,
}

impl ArrowSource {
    /// Opens `path` ([`ArrowFile::open`]) and reads its keys and declared lengths.
    pub fn open(path: impl AsRef<Path>) -> Result<ArrowSource, Error> {
        ArrowSource::new(ArrowFile::open(path)?)
    }

    /// Wraps an open file, reading its keys and declared lengths. Errors: those of the file, and a chunk
    /// of more than 2^32 − 1 sequences.
    pub fn new(file: ArrowFile) -> Result<ArrowSource, Error> {
        let mut sequences = Vec::new();
        let mut offsets = vec![0];
        let mut chunks = Vec::with_capacity(file.chunk_count());
        for k in 0..file.chunk_count() {
            let from = sequences.len();
            file.read_sequences(k, &mut sequences)?;
            let n = sequences.len() - from;
            let num_sequences = u32::try_from(n)
                .map_err(|_| Error::limit(format!("sequences in chunk {k}"), n as u64, u32::MAX.into()))?;
            let num_samples = sequences[from..].iter().map(|s| u64::from(s.num_samples)).sum();
            chunks.push(ChunkInfo { num_samples, num_sequences });
            offsets.push(sequences.len());
        }
        let streams = file.schema().streams().to_vec();
        Ok(ArrowSource { file, streams, chunks, sequences, offsets, precision: None })
    }

    /// Renames streams as CNTK's CBF deserializer does: `(name in the file, new name)` pairs (see
    /// [`rename_streams`](cntkio_core::schema::rename_streams)). Returns the pairs that matched no stream.
    /// Errors: two streams left with one name.
    pub fn rename(&mut self, renames: &[(String, String)]) -> Result<Vec<(String, String)>, Error> {
        let mut streams = self.file.schema().streams().to_vec();
        let unused = cntkio_core::schema::rename_streams(streams.iter_mut().map(|s| &mut s.name).collect(), renames)?;
        set_element_types(&mut streams, self.precision);
        self.streams = streams;
        Ok(unused)
    }

    /// Delivers every stream as element type `t` (CNTK's `precision`); `None` keeps the file's types.
    pub fn with_precision(mut self, t: Option<ElementType>) -> ArrowSource {
        self.precision = t;
        for (s, f) in self.streams.iter_mut().zip(self.file.schema().streams()) {
            s.element_type = t.unwrap_or(f.element_type);
        }
        self
    }

    /// The file.
    pub fn file(&self) -> &ArrowFile {
        &self.file
    }
}

impl SequenceSource for ArrowSource {
    fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        let c = chunk as usize;
        match (self.offsets.get(c), self.offsets.get(c + 1)) {
            (Some(&a), Some(&b)) => {
                out.extend_from_slice(&self.sequences[a..b]);
                Ok(())
            }
            _ => Err(Error::chunk_out_of_range(chunk.into(), self.chunks.len())),
        }
    }
}

impl Deserializer for ArrowSource {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        let mut d = self.file.read_chunk(chunk as usize)?;
        // The sequences must be those the source announced (a file changed since it was opened is not).
        let c = chunk as usize;
        let announced = &self.sequences[self.offsets[c]..self.offsets[c + 1]];
        if d.num_sequences() != announced.len() || d.keys.iter().zip(announced).any(|(k, s)| k != s.key) {
            return Err(format_error(format!("chunk {c} changed since the file was opened"))
                .with_path(self.file.path().display().to_string()));
        }
        if let Some(t) = self.precision {
            cntkio_core::cbf::convert_element_type(&mut d, t);
        }
        Ok(Arc::new(d))
    }
}
