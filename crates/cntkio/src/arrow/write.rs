//! Conversions into the mapping (CTF, CBF or a file in the mapping → Parquet or Arrow IPC) and out of it
//! (→ CTF, → CBF). Chunks are read in order on the calling thread (CTF: parsed on the scan's threads)
//! and handed to a writer thread that turns them into record batches and encodes them; memory holds a
//! few chunks and the row group being encoded.

use super::{build, ArrowFile, ArrowFormat, Mapping, Rows};
use crate::cbf::{CbfFile, CbfOptions, CbfWriter, CbfWriterOptions};
use crate::convert::{ChunkSource, ConvertSummary, Hooks};
use crate::ctf::{scan_file_owned, ScanOptions};
use crate::input::{Access, InputFile};
use crate::output::Target;
use crate::{ChunkData, CtfOptions, Error, ErrorKind, Schema};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::fs::File;
use std::io::BufWriter;
use std::ops::ControlFlow;
use std::path::Path;

/// Parquet's compression of the pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParquetCompression {
    /// zstd at its default level (the default).
    #[default]
    Zstd,
    /// Snappy.
    Snappy,
    /// None.
    None,
}

impl ParquetCompression {
    /// `zstd`, `snappy` or `none`.
    pub fn parse(s: &str) -> Option<ParquetCompression> {
        match s.to_ascii_lowercase().as_str() {
            "zstd" => Some(ParquetCompression::Zstd),
            "snappy" => Some(ParquetCompression::Snappy),
            "none" | "uncompressed" => Some(ParquetCompression::None),
            _ => None,
        }
    }
}

/// Row groups (Parquet) and record batches (Arrow IPC) are closed at about this many bytes of data,
/// unless [`ToArrow::rows_per_group`] closes them first: what bounds the writer's memory.
pub const GROUP_BYTES: usize = 64 << 20;

/// About how many bytes of a record batch the Parquet writer is handed at a time.
const SLICE_BYTES: usize = 4 << 20;

/// How a conversion into the mapping writes.
#[derive(Debug, Clone, Copy)]
pub struct ToArrow {
    /// Parquet or Arrow IPC.
    pub format: ArrowFormat,
    /// Parquet's page compression (Arrow IPC files are written uncompressed).
    pub compression: ParquetCompression,
    /// Rows per Parquet row group or IPC record batch at most (`None`: as many as fit in
    /// [`GROUP_BYTES`]).
    pub rows_per_group: Option<usize>,
    /// One row per sample ([`Rows::Samples`]); every sequence must then have one sample of each stream.
    pub flatten: bool,
    /// Callbacks.
    pub hooks: Hooks,
}

impl ToArrow {
    /// Default options for the format `path`'s extension names (see
    /// [`ArrowFormat::from_extension`]). Errors: another extension.
    pub fn for_path(path: &Path) -> Result<ToArrow, Error> {
        let format = ArrowFormat::from_extension(path).ok_or_else(|| {
            Error::option_value("output", path.display().to_string(), "has no .parquet or .arrow extension")
        })?;
        Ok(ToArrow::new(format))
    }

    /// Default options for `format`.
    pub fn new(format: ArrowFormat) -> ToArrow {
        ToArrow {
            format,
            compression: ParquetCompression::Zstd,
            rows_per_group: None,
            flatten: false,
            hooks: Hooks::default(),
        }
    }

    fn parquet_properties(&self) -> WriterProperties {
        let compression = match self.compression {
            ParquetCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
            ParquetCompression::Snappy => Compression::SNAPPY,
            ParquetCompression::None => Compression::UNCOMPRESSED,
        };
        // Dictionaries do not pay for keys (unique) nor for measured values; statistics are kept for
        // the keys only (readers filter on them).
        WriterProperties::builder()
            .set_compression(compression)
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::None)
            .set_column_statistics_enabled(ColumnPath::from(super::KEY_COLUMN), EnabledStatistics::Chunk)
            .set_max_row_group_row_count(Some(self.rows_per_group.unwrap_or(1 << 20).max(1)))
            .set_max_row_group_bytes(Some(GROUP_BYTES))
            .set_created_by(format!("cntkio {}", env!("CARGO_PKG_VERSION")))
            .build()
    }
}

enum Encoder {
    Parquet(Box<ArrowWriter<BufWriter<File>>>),
    Ipc(Box<arrow_ipc::writer::FileWriter<BufWriter<File>>>),
}

/// Writes record batches to the temporary file of the output.
struct BatchWriter {
    tmp: tempfile::NamedTempFile,
    target: Target,
    mapping: Mapping,
    schema: SchemaRef,
    encoder: Encoder,
    rows_per_group: Option<usize>,
    /// IPC: batches waiting to fill a record batch of the group size.
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    summary: ConvertSummary,
    /// Asked between the parts of an upload to an object store.
    cancel: Option<fn() -> bool>,
}

impl BatchWriter {
    fn new(output: &Path, schema: &Schema, how: &ToArrow) -> Result<BatchWriter, Error> {
        let mapping = Mapping::new(schema, if how.flatten { Rows::Samples } else { Rows::Sequences })?;
        let arrow_schema = mapping.arrow_schema()?;
        let tmp = crate::output::temporary_noted(output, how.hooks.on_temporary_file)?;
        let target = Target::new(output, tmp.as_file());
        let file = tmp.as_file().try_clone().map_err(|e| target.error(e))?;
        let out = BufWriter::with_capacity(1 << 20, file);
        let encoder = match how.format {
            ArrowFormat::Parquet => Encoder::Parquet(Box::new(
                ArrowWriter::try_new(out, arrow_schema.clone(), Some(how.parquet_properties()))
                    .map_err(|e| write_error(&target, e))?,
            )),
            ArrowFormat::Ipc => Encoder::Ipc(Box::new(
                arrow_ipc::writer::FileWriter::try_new(out, &arrow_schema).map_err(|e| ipc_write_error(&target, e))?,
            )),
        };
        Ok(BatchWriter {
            tmp,
            target,
            mapping,
            schema: arrow_schema,
            encoder,
            rows_per_group: how.rows_per_group,
            pending: Vec::new(),
            pending_rows: 0,
            summary: ConvertSummary::default(),
            cancel: how.hooks.cancel,
        })
    }

    fn write(&mut self, data: ChunkData) -> Result<(), Error> {
        self.summary.sequences += data.num_sequences() as u64;
        self.summary.samples += data.num_samples.iter().map(u64::from).sum::<u64>();
        let batch = build::record_batch(data, &self.mapping, &self.schema)?;
        match &mut self.encoder {
            Encoder::Parquet(w) => {
                // The writer computes each leaf value's levels for a whole batch at once: handed in
                // slices of a few MB, it holds that much extra rather than a chunk's worth.
                let per_row = batch.get_array_memory_size() / batch.num_rows().max(1);
                let rows = (SLICE_BYTES / per_row.max(1)).max(1);
                let mut at = 0;
                while at < batch.num_rows() {
                    let n = rows.min(batch.num_rows() - at);
                    w.write(&batch.slice(at, n)).map_err(|e| write_error(&self.target, e))?;
                    at += n;
                }
                Ok(())
            }
            Encoder::Ipc(_) => {
                self.pending_rows += batch.num_rows();
                self.pending.push(batch);
                self.flush_ipc(false)
            }
        }
    }

    /// Writes the pending batches as record batches of the group size (all of them when `all`).
    fn flush_ipc(&mut self, all: bool) -> Result<(), Error> {
        let Some(first) = self.pending.first() else { return Ok(()) };
        let rows = self.rows_per_group.unwrap_or_else(|| {
            let per_row = first.get_array_memory_size() / first.num_rows().max(1);
            (GROUP_BYTES / per_row.max(1)).clamp(1, 1 << 20)
        });
        if self.pending_rows < rows && !all {
            return Ok(());
        }
        let merged = arrow_select::concat::concat_batches(&self.schema, &self.pending)
            .map_err(|e| Error::internal(format!("concatenating record batches: {e}")))?;
        self.pending.clear();
        self.pending_rows = 0;
        let Encoder::Ipc(w) = &mut self.encoder else { return Ok(()) };
        let mut at = 0;
        while merged.num_rows() - at >= rows || (all && at < merged.num_rows()) {
            let n = rows.min(merged.num_rows() - at);
            w.write(&merged.slice(at, n)).map_err(|e| ipc_write_error(&self.target, e))?;
            self.summary.chunks += 1;
            at += n;
        }
        if at < merged.num_rows() {
            self.pending_rows = merged.num_rows() - at;
            self.pending.push(merged.slice(at, self.pending_rows));
        }
        Ok(())
    }

    fn finish(mut self, output: &Path) -> Result<ConvertSummary, Error> {
        self.flush_ipc(true)?;
        let out = match self.encoder {
            Encoder::Parquet(w) => {
                let meta = w.close().map_err(|e| write_error(&self.target, e))?;
                self.summary.chunks = meta.num_row_groups() as u64;
                None
            }
            Encoder::Ipc(mut w) => {
                w.finish().map_err(|e| ipc_write_error(&self.target, e))?;
                Some(w.into_inner().map_err(|e| ipc_write_error(&self.target, e))?)
            }
        };
        if let Some(mut out) = out {
            use std::io::Write;
            out.flush().map_err(|e| self.target.error(e))?;
        }
        self.summary.bytes_written = self.tmp.as_file().metadata().map(|m| m.len()).unwrap_or(0);
        crate::output::persist(self.tmp, output, self.cancel)?;
        Ok(self.summary)
    }
}

fn write_error(target: &Target, e: parquet::errors::ParquetError) -> Error {
    match e {
        parquet::errors::ParquetError::External(b) => match b.downcast::<std::io::Error>() {
            Ok(io) => target.error(*io),
            Err(b) => Error::internal(format!("writing Parquet: {b}")),
        },
        e => Error::internal(format!("writing Parquet: {e}")),
    }
}

fn ipc_write_error(target: &Target, e: arrow_schema::ArrowError) -> Error {
    match e {
        arrow_schema::ArrowError::IoError(_, io) => target.error(io),
        e => Error::internal(format!("writing Arrow IPC: {e}")),
    }
}

/// What a reader hands each chunk to.
type Hand<'a> = &'a mut dyn FnMut(ChunkData) -> Result<(), Error>;

/// Runs `read` (which hands chunks, in order, to the function it is given) on the calling thread and a
/// [`BatchWriter`] on a thread of its own. A writer's error concerns data before any the reader could
/// have failed on, so it comes first.
fn pipeline(
    output: &Path,
    schema: &Schema,
    how: &ToArrow,
    read: &mut dyn FnMut(Hand<'_>) -> Result<(), Error>,
) -> Result<ConvertSummary, Error> {
    crate::compress::refuse_compressed_output(output, "Parquet or Arrow IPC")?;
    let mut w = BatchWriter::new(output, schema, how)?;
    let (tx, rx) = crossbeam_channel::bounded::<ChunkData>(2);
    let (read_result, written) = std::thread::scope(|sc| {
        let writer = std::thread::Builder::new().name("cntkio-arrow-encode".into()).spawn_scoped(
            sc,
            move || -> Result<BatchWriter, Error> {
                for d in rx {
                    w.write(d)?;
                }
                Ok(w)
            },
        );
        let writer = match writer {
            Ok(h) => h,
            Err(e) => return (Ok(()), Err(Error::io("start the Arrow writer thread", e))),
        };
        let r = read(&mut |d| tx.send(d).map_err(|_| Error::internal("the Arrow writer stopped without an error")));
        drop(tx);
        let written = writer.join().unwrap_or_else(|_| Err(Error::internal("the Arrow writer thread panicked")));
        (r, written)
    });
    let w = written?;
    read_result?;
    if w.summary.sequences == 0 {
        return Err(Error::new(ErrorKind::NoSequences));
    }
    w.finish(output)
}

/// Converts a CTF file to Parquet or Arrow IPC in the mapping: the values, keys (sequence ids) and
/// declared lengths the CTF reader delivers. Chunks are parsed on `scan.threads` threads; memory stays
/// bounded by a few chunks and a row group whatever the input size.
#[allow(clippy::too_many_arguments)]
pub fn ctf_to_arrow(
    input: &Path,
    output: &Path,
    schema: &Schema,
    ctf: &CtfOptions,
    scan: &ScanOptions,
    access: Access,
    how: &ToArrow,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    crate::convert::refuse_same_file(input, output)?;
    let file = InputFile::open(input, access)?;
    let read_opts = CtfOptions { chunk_size: ctf.chunk_size.min(crate::convert::CONVERT_READ_CHUNK), ..ctf.clone() };
    let (mut tolerated, mut dropped) = (0, 0);
    let mut s = pipeline(output, schema, how, &mut |hand| {
        scan_file_owned(
            &file,
            schema,
            &read_opts,
            scan,
            |p| {
                crate::check_cancel(how.hooks.cancel)?;
                tolerated += p.num_errors;
                dropped += p.num_dropped;
                hand(p.data)?;
                Ok((ControlFlow::Continue(()), None))
            },
            progress,
        )
        .map(|_| ())
    })
    .map_err(|e| {
        if matches!(e.kind(), ErrorKind::NoSequences) {
            e.with_path(input.display().to_string())
        } else {
            e
        }
    })?;
    s.tolerated_errors = tolerated;
    s.dropped_sequences = dropped;
    Ok(s)
}

/// Converts a CBF file to Parquet or Arrow IPC in the mapping: keys are the sequences' positions,
/// declared lengths their meta counts.
pub fn cbf_to_arrow(
    input: &Path,
    output: &Path,
    cbf: &CbfOptions,
    how: &ToArrow,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    crate::convert::refuse_same_file(input, output)?;
    let f = CbfFile::open_with(input, cbf)?;
    let schema = f.schema()?;
    pipeline(output, &schema, how, &mut |hand| {
        for k in 0..f.chunk_count() {
            crate::check_cancel(how.hooks.cancel)?;
            hand(f.read_chunk(k)?)?;
            progress(f.chunks().get(k + 1).map_or(f.header().header_offset(), |c| c.offset));
        }
        Ok(())
    })
    .map_err(|e| {
        if matches!(e.kind(), ErrorKind::NoSequences) {
            e.with_path(input.display().to_string())
        } else {
            e
        }
    })
}

/// The input offset reached after chunk `k` of an Arrow file, for a progress bar (chunks are taken as
/// equal parts of the file).
fn arrow_progress(f: &ArrowFile, len: u64, k: usize) -> u64 {
    let n = f.chunk_count().max(1) as u64;
    len / n * (k as u64 + 1).min(n)
}

/// Opens the input of a conversion from a file in the mapping, with its length; refuses an output that
/// is the input.
fn open_input(input: &Path, output: &Path) -> Result<(ArrowFile, u64), Error> {
    crate::convert::refuse_same_file(input, output)?;
    let f = ArrowFile::open(input)?;
    let len = std::fs::metadata(input).map(|m| m.len()).unwrap_or(0);
    Ok((f, len))
}

/// Rewrites a file in the mapping as Parquet or Arrow IPC (to change the format, the compression, the
/// group size or the rows).
pub fn arrow_to_arrow(
    input: &Path,
    output: &Path,
    how: &ToArrow,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    let (f, len) = open_input(input, output)?;
    pipeline(output, &f.schema().clone(), how, &mut |hand| {
        for k in 0..f.chunk_count() {
            crate::check_cancel(how.hooks.cancel)?;
            hand(f.read_chunk(k)?)?;
            progress(arrow_progress(&f, len, k));
        }
        Ok(())
    })
}

/// How a conversion of a file in the mapping to CTF writes.
#[derive(Debug, Clone, Default)]
pub struct ArrowToCtf {
    /// `(stream name, alias)` pairs: each stream is written as `|alias` with the alias given for its
    /// name, else with the alias the file's metadata records.
    pub aliases: Vec<(String, String)>,
    /// Threads turning chunks into text (0: one per core).
    pub threads: usize,
    /// Callbacks.
    pub hooks: Hooks,
}

/// Converts a file in the mapping to CTF text, as [`cbf_to_ctf`](crate::convert::cbf_to_ctf) does: each
/// sequence written with its key as its id.
pub fn arrow_to_ctf(
    input: &Path,
    output: &Path,
    how: &ArrowToCtf,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    let (f, len) = open_input(input, output)?;
    let schema = crate::convert::with_aliases(f.schema().clone(), &how.aliases)?;
    let source =
        ChunkSource { count: f.chunk_count(), read: &mut |k| f.read_chunk(k), end_of: &|k| arrow_progress(&f, len, k) };
    crate::convert::chunks_to_ctf(output, &schema, source, how.threads, how.hooks, progress)
}

/// How a conversion of a file in the mapping to CBF writes.
#[derive(Debug, Clone)]
pub struct ArrowToCbf {
    /// The CBF writer's options.
    pub writer: CbfWriterOptions,
    /// Callbacks.
    pub hooks: Hooks,
}

/// Converts a file in the mapping to CBF: the declared lengths become the meta counts (CBF keeps no
/// keys: its keys are positions).
pub fn arrow_to_cbf(
    input: &Path,
    output: &Path,
    how: &ArrowToCbf,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    let (f, len) = open_input(input, output)?;
    let mut w = CbfWriter::with_hooks(output, f.schema(), how.writer, how.hooks)?;
    // Batch by batch (about 16 MB of data each), encoded as they come: memory holds a batch and the CBF
    // chunk being filled, not a whole row group.
    let mut data = ChunkData::new(f.schema());
    for k in 0..f.chunk_count() {
        crate::check_cancel(how.hooks.cancel)?;
        f.for_each_batch(k, &mut data, &mut |d| w.write(d))?;
        progress(arrow_progress(&f, len, k));
    }
    crate::convert::finish_cbf(w, input, ConvertSummary::default())
}
