//! Inspection: what a file holds, without a schema — the report of `cntkio inspect` and Python's
//! `cntkio.inspect`.
//!
//! A CTF file is read once by CNTK's index, each sequence fed to the schema inferrer (the pass of
//! [`infer_schema`](crate::ctf::infer_schema)): streams with their smallest dims, sequences, rows and the
//! distribution of sequence lengths. A CBF file is decoded chunk by chunk: its header, streams and chunk
//! table, with samples and non-zeros counted.
//!
//! The report serialises to the JSON of `inspect --json`, version 1 of its shape (the dict Python's
//! `inspect()` returns); the shape changes only with a new `version`.
//!
//! ```
//! use cntkio::inspect::{inspect, InspectReport};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("data.ctf");
//! std::fs::write(&path, "0 |x 1 2 |y 3:1\n0 |x 3 4\n1 |x 5 6 |y 0:1\n").unwrap();
//! let InspectReport::Ctf(r) = inspect(&path, false).unwrap() else { unreachable!() };
//! assert_eq!((r.sequences, r.rows, r.sequence_length.max), (2, 3, 2));
//! let streams: Vec<_> = r.streams.iter().map(|s| (s.alias.as_str(), s.storage.name(), s.min_dim)).collect();
//! assert_eq!(streams, [("x", "dense", 2), ("y", "sparse", 4)]);
//! let json = serde_json::to_value(&r).unwrap();
//! assert_eq!((json["format"].as_str(), json["mode"].as_str()), (Some("ctf"), Some("ids")));
//! ```

use crate::cbf::CbfFile;
use crate::convert::{detect_format, Format};
use crate::ctf::{survey, IndexMode};
use crate::input::{Access, InputFile};
use crate::length_stats::LengthStats;
use crate::{ChunkData, ElementType, Error, Layout, StorageFormat, StreamSpec};
use serde::{Serialize, Serializer};
use std::path::{Path, PathBuf};

/// The version of the JSON shape the reports serialise to.
pub const REPORT_VERSION: u32 = 1;

/// What [`inspect`] found, by the file's format. Serialises as the report of that format (no tag: the
/// report's own `format` field tells them apart).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum InspectReport {
    /// A CTF file's report.
    Ctf(CtfReport),
    /// A CBF file's report.
    Cbf(CbfReport),
    /// A Parquet or Arrow IPC file's report.
    Arrow(ArrowReport),
}

/// What a Parquet or Arrow IPC file in cntkio's [Arrow mapping](crate::arrow) holds (see
/// [`inspect_arrow`]).
#[derive(Debug, Clone, Serialize)]
pub struct ArrowReport {
    /// The file's length.
    pub bytes: u64,
    /// The chunks (Parquet row groups, Arrow IPC record batches), in file order.
    pub chunks: Vec<ArrowChunk>,
    /// [`Format::Parquet`] or [`Format::ArrowIpc`].
    #[serde(serialize_with = "format_name")]
    pub format: Format,
    /// The version of the Arrow mapping the file is in.
    pub mapping_version: u32,
    /// The file, as given.
    #[serde(serialize_with = "display_path")]
    pub path: PathBuf,
    /// `"sequences"` (a row per sequence) or `"samples"` (flattened).
    #[serde(serialize_with = "rows_name")]
    pub rows: crate::arrow::Rows,
    /// Σ of the sequences' declared lengths.
    pub samples: u64,
    /// The distribution of the sequences' declared lengths.
    pub sequence_length: CbfLengths,
    /// Sequences in the file.
    pub sequences: u64,
    /// The streams, in column order.
    pub streams: Vec<CbfStream>,
    /// [`REPORT_VERSION`].
    pub version: u32,
}

/// A chunk of a Parquet or Arrow IPC file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ArrowChunk {
    /// Σ of its sequences' declared lengths.
    pub samples: u64,
    /// Its sequences (rows).
    pub sequences: u64,
}

// The reports' fields are declared in the alphabetical order of their JSON names: version 1 of the shape
// lists the keys so (a test checks it), and serde writes fields in declaration order.

/// What a CTF file holds, as its rows say (see [`inspect_ctf`]).
#[derive(Debug, Clone, Serialize)]
pub struct CtfReport {
    /// The file's length.
    pub bytes: u64,
    /// Chunks of [`DEFAULT_CHUNK_SIZE`](crate::options::DEFAULT_CHUNK_SIZE) bytes (32 MiB) CNTK's index
    /// makes of it.
    #[serde(rename = "chunks_at_32MiB")]
    pub chunks: u64,
    /// Comments (`|#`) in the file.
    pub comments: u64,
    /// Rows without a sample (blank, or comments only).
    pub empty_rows: u64,
    /// [`Format::Ctf`].
    #[serde(serialize_with = "format_name")]
    pub format: Format,
    /// How rows are grouped into sequences: by sequence id (`"ids"`) or one per line (`"lines"`).
    #[serde(serialize_with = "mode_name")]
    pub mode: IndexMode,
    /// The file, as given.
    #[serde(serialize_with = "display_path")]
    pub path: PathBuf,
    /// Rows in the file.
    pub rows: u64,
    /// The distribution of sequence lengths, in rows.
    pub sequence_length: CtfLengths,
    /// Sequences, as CNTK's index finds them.
    pub sequences: u64,
    /// The input names the rows have (the alias written after `|`), in order of first appearance.
    pub streams: Vec<CtfStream>,
    /// [`REPORT_VERSION`].
    pub version: u32,
}

/// The distribution of a CTF file's sequence lengths (rows per sequence); quantiles are the nearest
/// rank (0 without sequences). Found in bounded memory: see `exact`.
#[derive(Debug, Clone, Serialize)]
pub struct CtfLengths {
    /// The quantiles are exact. False for a file whose lengths of 4,096 or more take more than 65,536
    /// distinct values: quantiles among those are then less than 1/128 below the true value (min, max,
    /// mean and the histogram stay exact).
    pub exact: bool,
    /// Sequences by their length's next power of two, ascending (empty classes left out).
    pub histogram: Vec<LengthClass>,
    /// The longest.
    pub max: u32,
    /// The mean length (0 without sequences).
    pub mean: f64,
    /// The shortest.
    pub min: u32,
    /// The median.
    pub p50: u32,
    /// The 90th percentile.
    pub p90: u32,
    /// The 99th percentile.
    pub p99: u32,
    /// `"rows"`.
    pub unit: &'static str,
}

/// A class of the histogram of sequence lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LengthClass {
    /// Sequences in it.
    pub sequences: u64,
    /// Its bound: a power of two; the class holds the lengths above the previous power of two, up to it.
    pub up_to: u64,
}

/// A stream of a CTF file, as its rows show it.
#[derive(Debug, Clone, Serialize)]
pub struct CtfStream {
    /// The name written after `|`.
    pub alias: String,
    /// Samples without a value.
    pub empty_samples: u64,
    /// The largest sparse index, if any sample was sparse.
    pub max_index: Option<u64>,
    /// The most samples of it in one sequence.
    pub max_samples_per_sequence: u64,
    /// The smallest dim that holds every sample.
    pub min_dim: u64,
    /// Sparse: the non-zeros (`index:value` entries); `None` for a dense stream.
    pub nnz: Option<u64>,
    /// Its samples.
    pub samples: u64,
    /// Sequences with at least one sample of it.
    pub sequences: u64,
    /// Sparse if any sample has an `index:value` entry, else dense.
    #[serde(serialize_with = "storage_name")]
    pub storage: StorageFormat,
    /// Dense: the fewest and the most values in a sample; `None` for a sparse stream.
    pub values_per_sample: Option<ValueRange>,
}

/// The fewest and the most values of a dense stream's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ValueRange {
    /// The most values.
    pub max: u64,
    /// The fewest values (0 without samples).
    pub min: u64,
}

/// What a CBF file holds: its header and chunk table, with samples and non-zeros counted (see
/// [`inspect_cbf`]).
#[derive(Debug, Clone, Serialize)]
pub struct CbfReport {
    /// The file's length.
    pub bytes: u64,
    /// The format version of the file: 1, the only one.
    pub cbf_version: u32,
    /// The chunk table, in file order.
    pub chunks: Vec<CbfChunk>,
    /// [`Format::Cbf`].
    #[serde(serialize_with = "format_name")]
    pub format: Format,
    /// Where the header (after the last chunk) starts.
    pub header_offset: u64,
    /// The file, as given.
    #[serde(serialize_with = "display_path")]
    pub path: PathBuf,
    /// Σ of the sequences' meta counts (their declared lengths).
    pub samples: u64,
    /// The distribution of the sequences' meta counts.
    pub sequence_length: CbfLengths,
    /// Sequences in the file.
    pub sequences: u64,
    /// The streams, in file order.
    pub streams: Vec<CbfStream>,
    /// [`REPORT_VERSION`].
    pub version: u32,
}

/// The distribution of a CBF file's sequence lengths (meta counts); quantiles are the nearest rank (0
/// without sequences). Found in bounded memory, as [`CtfLengths`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CbfLengths {
    /// The quantiles are exact (see [`CtfLengths::exact`]).
    pub exact: bool,
    /// The longest.
    pub max: u32,
    /// The shortest.
    pub min: u32,
    /// The median.
    pub p50: u32,
    /// The 90th percentile.
    pub p90: u32,
    /// `"meta samples"`.
    pub unit: &'static str,
}

/// An entry of a CBF file's chunk table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CbfChunk {
    /// Its length: up to the next chunk, or to the header for the last.
    pub bytes: u64,
    /// Where it starts.
    pub offset: u64,
    /// Σ of its sequences' meta counts, as the table says.
    pub samples: u32,
    /// Its sequences, as the table says.
    pub sequences: u32,
}

/// A stream of a CBF file.
#[derive(Debug, Clone, Serialize)]
pub struct CbfStream {
    /// Its dim.
    pub dim: u32,
    /// float32 (`"float"`) or float64 (`"double"`).
    #[serde(serialize_with = "element_type_name")]
    pub element_type: ElementType,
    /// Its name.
    pub name: String,
    /// Sparse: the non-zeros; `None` for a dense stream.
    pub nnz: Option<u64>,
    /// Its samples.
    pub samples: u64,
    /// Sequences with at least one sample of it.
    pub sequences: u64,
    /// Dense or sparse.
    #[serde(serialize_with = "storage_name")]
    pub storage: StorageFormat,
}

/// Inspects the file at `path`, CTF or CBF as its magic number says. `skip_sequence_ids` is CNTK's
/// `skipSequenceIds` (CTF only).
pub fn inspect(path: &Path, skip_sequence_ids: bool) -> Result<InspectReport, Error> {
    match detect_format(path)? {
        Format::Cbf => inspect_cbf(path).map(InspectReport::Cbf),
        Format::Parquet | Format::ArrowIpc => inspect_arrow(path).map(InspectReport::Arrow),
        Format::Ctf => {
            let file = InputFile::open(path, Access::Read)?;
            inspect_ctf(&file, skip_sequence_ids, &mut |_| {}).map(InspectReport::Ctf)
        }
    }
}

/// Inspects a CTF file: one tolerant pass (no schema; the sequences as CNTK's index finds them).
/// `progress` gets the bytes read so far.
pub fn inspect_ctf(
    file: &InputFile,
    skip_sequence_ids: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<CtfReport, Error> {
    let mut lengths = LengthStats::default();
    let seen = survey(file, skip_sequence_ids, &mut |n| lengths.add(n), progress)?;
    let q = |f: f64| lengths.quantile(f);
    let inf = seen.inferrer;
    let streams = inf
        .streams
        .iter()
        .map(|s| {
            let sparse = s.is_sparse();
            CtfStream {
                alias: s.alias.clone(),
                empty_samples: s.empty_samples,
                max_index: s.max_index,
                max_samples_per_sequence: s.max_per_sequence,
                min_dim: s.min_dim(),
                nnz: sparse.then_some(s.nnz),
                samples: s.samples(),
                sequences: s.sequences,
                storage: if sparse { StorageFormat::Sparse } else { StorageFormat::Dense },
                values_per_sample: (!sparse).then_some(ValueRange {
                    max: s.max_values,
                    // `min_values` starts at u64::MAX and stays there without samples.
                    min: if s.min_values == u64::MAX { 0 } else { s.min_values },
                }),
            }
        })
        .collect();
    Ok(CtfReport {
        bytes: file.len(),
        chunks: seen.chunks,
        comments: inf.comments,
        empty_rows: inf.empty_rows,
        format: Format::Ctf,
        mode: seen.mode,
        path: file.path().to_path_buf(),
        rows: inf.rows,
        sequence_length: CtfLengths {
            exact: lengths.is_exact(),
            histogram: histogram(&lengths),
            max: q(1.0),
            mean: lengths.mean(),
            min: q(0.0),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            unit: "rows",
        },
        sequences: lengths.count(),
        streams,
        version: REPORT_VERSION,
    })
}

/// Inspects a CBF file: its header, and every chunk decoded to count samples and non-zeros.
pub fn inspect_cbf(path: &Path) -> Result<CbfReport, Error> {
    let f = CbfFile::open(path)?;
    let len = f.input().stored_len();
    let schema = f.schema()?;
    let mut data = ChunkData::new(&schema);
    let mut buf = Vec::new();
    let mut counts = StreamCounts::new(schema.len());
    let mut lengths = LengthStats::default();
    let mut chunks = Vec::with_capacity(f.chunk_count());
    for (k, c) in f.chunks().iter().enumerate() {
        f.read_chunk_into(k, &mut buf, &mut data)?;
        for n in data.num_samples.iter() {
            lengths.add(n);
        }
        counts.add(&data);
        let end = f.chunks().get(k + 1).map_or(f.header().header_offset(), |d| d.offset);
        chunks.push(CbfChunk {
            bytes: end - c.offset,
            offset: c.offset,
            samples: c.num_samples,
            sequences: c.num_sequences,
        });
    }
    Ok(CbfReport {
        bytes: len,
        cbf_version: 1,
        chunks,
        format: Format::Cbf,
        header_offset: f.header().header_offset(),
        path: path.to_path_buf(),
        samples: u64::try_from(lengths.sum()).unwrap_or(u64::MAX),
        sequence_length: CbfLengths::of(&lengths, "meta samples"),
        sequences: lengths.count(),
        streams: counts.reports(schema.streams()),
        version: REPORT_VERSION,
    })
}

/// Inspects a Parquet or Arrow IPC file in the mapping: its metadata, and every chunk decoded to count
/// samples and non-zeros.
pub fn inspect_arrow(path: &Path) -> Result<ArrowReport, Error> {
    let f = crate::arrow::ArrowFile::open(path)?;
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let schema = f.schema();
    let mut counts = StreamCounts::new(schema.len());
    let mut lengths = LengthStats::default();
    let mut chunks = Vec::with_capacity(f.chunk_count());
    let mut data = ChunkData::new(schema);
    for k in 0..f.chunk_count() {
        f.read_chunk_into(k, &mut data)?;
        for n in data.num_samples.iter() {
            lengths.add(n);
        }
        counts.add(&data);
        chunks.push(ArrowChunk {
            samples: data.num_samples.iter().map(u64::from).sum(),
            sequences: data.num_sequences() as u64,
        });
    }
    Ok(ArrowReport {
        bytes: len,
        chunks,
        format: if f.format() == crate::arrow::ArrowFormat::Parquet { Format::Parquet } else { Format::ArrowIpc },
        mapping_version: crate::arrow::MAPPING_VERSION,
        path: path.to_path_buf(),
        rows: f.mapping().rows,
        samples: u64::try_from(lengths.sum()).unwrap_or(u64::MAX),
        sequence_length: CbfLengths::of(&lengths, "declared samples"),
        sequences: lengths.count(),
        streams: counts.reports(schema.streams()),
        version: REPORT_VERSION,
    })
}

/// Adds each stream's samples, non-zeros and sequences with a sample in `data` to the counts.
/// Per stream: samples, non-zeros and sequences with a sample, counted chunk by chunk.
struct StreamCounts {
    samples: Vec<u64>,
    nnz: Vec<u64>,
    sequences: Vec<u64>,
}

impl StreamCounts {
    fn new(streams: usize) -> StreamCounts {
        StreamCounts { samples: vec![0; streams], nnz: vec![0; streams], sequences: vec![0; streams] }
    }

    fn add(&mut self, data: &ChunkData) {
        for (i, st) in data.streams.iter().enumerate() {
            self.samples[i] += st.num_samples();
            if let Layout::Sparse { indices, .. } = &st.layout {
                self.nnz[i] += indices.len() as u64;
            }
            self.sequences[i] += (0..st.num_sequences()).filter(|&q| st.sequence_len(q) > 0).count() as u64;
        }
    }

    /// The streams' reports, in schema order.
    fn reports(&self, streams: &[StreamSpec]) -> Vec<CbfStream> {
        streams
            .iter()
            .enumerate()
            .map(|(i, s)| CbfStream {
                dim: u32::try_from(s.dim).unwrap_or(u32::MAX),
                element_type: s.element_type,
                name: s.name.clone(),
                nnz: (s.format == StorageFormat::Sparse).then_some(self.nnz[i]),
                samples: self.samples[i],
                sequences: self.sequences[i],
                storage: s.format,
            })
            .collect()
    }
}

impl CbfLengths {
    /// The distribution `lengths` holds, counted in `unit`.
    fn of(lengths: &LengthStats, unit: &'static str) -> CbfLengths {
        let q = |p: f64| lengths.quantile(p);
        CbfLengths { exact: lengths.is_exact(), max: q(1.0), min: q(0.0), p50: q(0.5), p90: q(0.9), unit }
    }
}

/// The power-of-two histogram of the lengths.
fn histogram(lengths: &LengthStats) -> Vec<LengthClass> {
    lengths.pow2_classes().map(|(up_to, sequences)| LengthClass { sequences, up_to }).collect()
}

fn format_name<S: Serializer>(f: &Format, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(f.name())
}

fn rows_name<S: Serializer>(r: &crate::arrow::Rows, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match r {
        crate::arrow::Rows::Sequences => "sequences",
        crate::arrow::Rows::Samples => "samples",
    })
}

fn mode_name<S: Serializer>(m: &IndexMode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match m {
        IndexMode::Ids => "ids",
        IndexMode::Lines => "lines",
    })
}

fn storage_name<S: Serializer>(f: &StorageFormat, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(f.name())
}

fn element_type_name<S: Serializer>(t: &ElementType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(t.cntk_name())
}

fn display_path<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&p.display())
}

#[cfg(test)]
mod tests {
    use super::{histogram, inspect, InspectReport, LengthClass, LengthStats};

    /// serde writes fields in declaration order; version 1 of the JSON shape has its keys sorted (as a
    /// `serde_json::Value` sorts them).
    fn assert_keys_sorted(r: &InspectReport) {
        let direct = serde_json::to_string(r).unwrap();
        let sorted = serde_json::to_string(&serde_json::to_value(r).unwrap()).unwrap();
        assert_eq!(direct, sorted);
    }

    #[test]
    fn ctf_cbf_and_arrow_reports_list_their_keys_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let ctf = dir.path().join("a.ctf");
        std::fs::write(&ctf, "0 |x 1 2 |y 3:1\n0 |x 3\n1 |# c\n2 |y 0:1\n").unwrap();
        let r = inspect(&ctf, false).unwrap();
        assert!(matches!(r, InspectReport::Ctf(_)));
        assert_keys_sorted(&r);
        let cbf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/real/cbf/10x10_sparse.bin");
        let r = inspect(&cbf, false).unwrap();
        let InspectReport::Cbf(c) = &r else { panic!("not CBF") };
        assert_eq!((c.sequences, c.samples, c.chunks.len()), (10, 100, 1));
        assert_keys_sorted(&r);
        let pq = dir.path().join("a.parquet");
        let how = crate::arrow::ToArrow::for_path(&pq).unwrap();
        crate::arrow::cbf_to_arrow(&cbf, &pq, &Default::default(), &how, &mut |_| {}).unwrap();
        let r = inspect(&pq, false).unwrap();
        let InspectReport::Arrow(a) = &r else { panic!("not Parquet") };
        assert_eq!((a.sequences, a.samples, a.streams[0].nnz.is_some()), (c.sequences, c.samples, true));
        assert_keys_sorted(&r);
    }

    #[test]
    fn lengths() {
        let mut l = LengthStats::default();
        for n in [9, 1, 3, 2, 3, 4, 5] {
            l.add(n);
        }
        let classes: Vec<(u64, u64)> = histogram(&l).iter().map(|c: &LengthClass| (c.up_to, c.sequences)).collect();
        assert_eq!(classes, [(1, 1), (2, 1), (4, 3), (8, 1), (16, 1)]);
        assert_eq!((l.quantile(0.0), l.quantile(0.5), l.quantile(1.0)), (1, 3, 9));
        assert_eq!(LengthStats::default().quantile(0.5), 0);
    }
}
