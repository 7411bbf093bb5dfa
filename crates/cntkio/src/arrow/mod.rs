//! CNTK data as Apache Arrow: the mapping (version [`MAPPING_VERSION`]), conversion of CTF and CBF to
//! Parquet and Arrow IPC files ([`ctf_to_arrow`], [`cbf_to_arrow`]), and reading such files back
//! ([`ArrowFile`], and [`ArrowSource`] as a deserializer).
//!
//! **The mapping, version 1.** One row per sequence (or, [flattened](Rows::Samples), one per sample):
//!
//! | column | Arrow type | holds |
//! | --- | --- | --- |
//! | `key` | `uint64` | the sequence's key as the reader reports it (CTF: its sequence id; CBF: its position) |
//! | `num_samples` | `uint32` | its declared length (CNTK's number of samples; CBF's meta count); not in flattened files |
//! | a dense stream | `list<fixed_size_list<float32 or float64, dim>>` | its samples, in order |
//! | a sparse stream | `list<struct<indices: list<int32>, values: list<float32 or float64>>>` | its samples; each sample's entries in file order |
//!
//! Columns come in that order, streams in schema order, named by the stream's name (so no stream may be
//! called `key` or `num_samples`). No value is null. A flattened file (every stream of every sequence
//! has exactly one sample, and every declared length is 1) has no `num_samples` column, and each stream
//! column is the sample itself: `fixed_size_list<…, dim>` or `struct<indices, values>`. The schema's
//! metadata key `cntkio.arrow` holds a JSON object: `{"mapping": 1, "rows": "sequences" | "samples",
//! "streams": [{"name", "alias", "dim", "storage": "dense" | "sparse", "element_type": "float" |
//! "double"}]}`, so that reading a file back guesses nothing. The mapping only changes with a new version
//! number; files of another version are refused with an error naming it.
//!
//! ```
//! use cntkio::arrow::{ArrowFile, ToArrow};
//! use cntkio::{ctf::ScanOptions, Access, CtfOptions, Schema, StorageFormat, StreamSpec};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let (ctf, parquet) = (dir.path().join("a.ctf"), dir.path().join("a.parquet"));
//! std::fs::write(&ctf, "0 |x 1 2 |y 3:1\n0 |x 3 4\n7 |x 5 6 |y 0:1 2:0.5\n").unwrap();
//! let schema = Schema::new(vec![
//!     StreamSpec::new("x", 2, StorageFormat::Dense),
//!     StreamSpec::new("y", 4, StorageFormat::Sparse),
//! ])
//! .unwrap();
//! let how = ToArrow::for_path(&parquet).unwrap();
//! let s = cntkio::arrow::ctf_to_arrow(
//!     &ctf, &parquet, &schema, &CtfOptions::default(), &ScanOptions::default(), Access::Read, &how, &mut |_| {},
//! )
//! .unwrap();
//! assert_eq!(s.sequences, 2);
//!
//! let f = ArrowFile::open(&parquet).unwrap();
//! let data = f.read_chunk(0).unwrap();
//! assert_eq!((data.keys.to_vec(), data.num_samples.to_vec()), (vec![0, 7], vec![2, 1]));
//! assert_eq!(f.schema().streams()[1].dim, 4);
//! ```

mod build;
mod decode;
mod file;
mod stream;
mod write;

pub use file::{ArrowFile, ArrowSource};
pub use stream::ChunkBatches;
pub use write::{
    arrow_to_arrow, arrow_to_cbf, arrow_to_ctf, cbf_to_arrow, ctf_to_arrow, ArrowToCbf, ArrowToCtf, ParquetCompression,
    ToArrow,
};
/// The Arrow crates of this API's types (so that a caller uses the same versions).
pub use {arrow_array, arrow_schema};

use crate::{ElementType, Error, ErrorKind, Schema, StorageFormat, StreamSpec};
use arrow_schema::{DataType, Field, Fields, Schema as ArrowSchema, SchemaRef};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The version of the Arrow mapping this library writes and reads.
pub const MAPPING_VERSION: u32 = 1;

/// The schema metadata key holding the mapping's description of the streams.
pub const METADATA_KEY: &str = "cntkio.arrow";

/// The column of sequence keys.
pub const KEY_COLUMN: &str = "key";

/// The column of declared sequence lengths (not in flattened files).
pub const NUM_SAMPLES_COLUMN: &str = "num_samples";

/// The two Arrow file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrowFormat {
    /// Apache Parquet.
    Parquet,
    /// The Arrow IPC file format (Feather version 2).
    Ipc,
}

impl ArrowFormat {
    /// The format a path's extension names: `.parquet` or `.pq` → Parquet; `.arrow`, `.ipc` or
    /// `.feather` → Arrow IPC; else `None`.
    pub fn from_extension(path: &Path) -> Option<ArrowFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "parquet" | "pq" => Some(ArrowFormat::Parquet),
            "arrow" | "ipc" | "feather" => Some(ArrowFormat::Ipc),
            _ => None,
        }
    }
}

/// What a row of a file in the mapping is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rows {
    /// One row per sequence, each stream's column a list of samples.
    Sequences,
    /// One row per sequence of one sample, each stream's column that sample (flattened).
    Samples,
}

/// A stream as the metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StreamMeta {
    name: String,
    alias: String,
    dim: u64,
    storage: String,
    element_type: String,
}

/// The metadata's JSON object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Meta {
    mapping: u32,
    rows: Rows,
    streams: Vec<StreamMeta>,
}

/// How a file in the mapping lays out its streams: rows, and the streams' schema.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// Sequences or samples per row.
    pub rows: Rows,
    /// The streams, in column order.
    pub schema: Schema,
}

fn format_error(problem: impl Into<String>) -> Error {
    Error::new(ErrorKind::ArrowFormat { problem: problem.into() })
}

fn column_error(column: &str, expected: impl Into<String>, found: impl Into<String>) -> Error {
    Error::new(ErrorKind::ArrowColumn { column: column.into(), expected: expected.into(), found: found.into() })
}

fn value_type(t: ElementType) -> DataType {
    match t {
        ElementType::F32 => DataType::Float32,
        ElementType::F64 => DataType::Float64,
    }
}

fn item(t: DataType) -> Arc<Field> {
    Arc::new(Field::new("item", t, false))
}

/// The fields of a sparse sample's struct.
fn sparse_fields(t: ElementType) -> Fields {
    Fields::from(vec![
        Field::new("indices", DataType::List(item(DataType::Int32)), false),
        Field::new("values", DataType::List(item(value_type(t))), false),
    ])
}

/// The Arrow type of one sample of a stream.
fn sample_type(s: &StreamSpec) -> Result<DataType, Error> {
    Ok(match s.format {
        StorageFormat::Dense => {
            let dim = i32::try_from(s.dim).map_err(|_| {
                Error::limit(
                    format!("dim of dense stream \"{}\" in an Arrow fixed-size list", s.name),
                    s.dim as u64,
                    i32::MAX as u64,
                )
            })?;
            DataType::FixedSizeList(item(value_type(s.element_type)), dim)
        }
        StorageFormat::Sparse => DataType::Struct(sparse_fields(s.element_type)),
    })
}

/// The Arrow type of a stream's column.
fn column_type(s: &StreamSpec, rows: Rows) -> Result<DataType, Error> {
    let sample = sample_type(s)?;
    Ok(match rows {
        Rows::Sequences => DataType::List(item(sample)),
        Rows::Samples => sample,
    })
}

impl Mapping {
    /// The mapping of `schema`'s streams with `rows` per row. Errors: a stream named like a fixed column
    /// (`key`, `num_samples`), or a dense dim over 2^31 − 1 (Arrow's fixed-size lists).
    pub fn new(schema: &Schema, rows: Rows) -> Result<Mapping, Error> {
        for s in schema.streams() {
            if s.name == KEY_COLUMN || s.name == NUM_SAMPLES_COLUMN {
                return Err(Error::option_value(
                    "stream",
                    &s.name,
                    format!("is the name of a column of the Arrow mapping ({KEY_COLUMN}, {NUM_SAMPLES_COLUMN}); rename the stream"),
                ));
            }
            sample_type(s)?;
        }
        Ok(Mapping { rows, schema: schema.clone() })
    }

    /// The Arrow schema of the mapping, with its metadata.
    pub fn arrow_schema(&self) -> Result<SchemaRef, Error> {
        let mut fields = vec![Field::new(KEY_COLUMN, DataType::UInt64, false)];
        if self.rows == Rows::Sequences {
            fields.push(Field::new(NUM_SAMPLES_COLUMN, DataType::UInt32, false));
        }
        for s in self.schema.streams() {
            fields.push(Field::new(&s.name, column_type(s, self.rows)?, false));
        }
        let meta = Meta {
            mapping: MAPPING_VERSION,
            rows: self.rows,
            streams: self
                .schema
                .streams()
                .iter()
                .map(|s| StreamMeta {
                    name: s.name.clone(),
                    alias: s.alias.clone(),
                    dim: s.dim as u64,
                    storage: s.format.name().to_string(),
                    element_type: s.element_type.cntk_name().to_string(),
                })
                .collect(),
        };
        let json = serde_json::to_string(&meta).map_err(|e| Error::internal(format!("metadata to JSON: {e}")))?;
        Ok(Arc::new(ArrowSchema::new_with_metadata(fields, HashMap::from([(METADATA_KEY.to_string(), json)]))))
    }

    /// Reads the mapping from a file's Arrow schema: its metadata, checked against the columns' names
    /// and types. Errors: [`ErrorKind::ArrowFormat`] (no or unreadable metadata, another version),
    /// [`ErrorKind::ArrowColumn`] (a column missing, or of another type than the metadata says).
    pub fn from_arrow_schema(a: &ArrowSchema) -> Result<Mapping, Error> {
        let json = a.metadata().get(METADATA_KEY).ok_or_else(|| {
            format_error(format!(
                "the file's schema has no \"{METADATA_KEY}\" metadata: it was not written in cntkio's Arrow mapping (columns: {})",
                a.fields().iter().map(|f| format!("{}: {}", f.name(), f.data_type())).collect::<Vec<_>>().join(", ")
            ))
        })?;
        let version: Option<u32> = serde_json::from_str::<serde_json::Value>(json)
            .ok()
            .and_then(|v| v.get("mapping")?.as_u64()?.try_into().ok());
        match version {
            Some(MAPPING_VERSION) => {}
            Some(v) => {
                return Err(format_error(format!(
                    "the file is in version {v} of cntkio's Arrow mapping; this cntkio reads version {MAPPING_VERSION}"
                )))
            }
            None => {
                return Err(format_error(format!(
                    "the \"{METADATA_KEY}\" metadata is not a mapping description: {json}"
                )))
            }
        }
        let meta: Meta = serde_json::from_str(json)
            .map_err(|e| format_error(format!("the \"{METADATA_KEY}\" metadata is malformed: {e}")))?;
        let mut streams = Vec::with_capacity(meta.streams.len());
        for s in &meta.streams {
            let bad = |what: &str, v: &str| {
                format_error(format!("the \"{METADATA_KEY}\" metadata gives stream \"{}\" the {what} {v:?}", s.name))
            };
            let format = match s.storage.as_str() {
                "dense" => StorageFormat::Dense,
                "sparse" => StorageFormat::Sparse,
                other => return Err(bad("storage", other)),
            };
            let t = ElementType::parse(&s.element_type).ok_or_else(|| bad("element type", &s.element_type))?;
            let dim = usize::try_from(s.dim).map_err(|_| bad("dim", &s.dim.to_string()))?;
            streams.push(StreamSpec::new(&s.name, dim, format).alias(&s.alias).element_type(t));
        }
        let schema = Schema::new(streams)?;
        let mapping = Mapping::new(&schema, meta.rows)?;
        let expected = mapping.arrow_schema()?;
        if a.fields().len() != expected.fields().len() {
            return Err(format_error(format!(
                "the file has {} columns; its \"{METADATA_KEY}\" metadata describes {} ({})",
                a.fields().len(),
                expected.fields().len(),
                expected.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
        for (found, want) in a.fields().iter().zip(expected.fields()) {
            if found.name() != want.name() {
                return Err(column_error(
                    found.name(),
                    format!("column \"{}\" here", want.name()),
                    format!("column \"{}\"", found.name()),
                ));
            }
            if !same_shape(found.data_type(), want.data_type()) {
                return Err(column_error(want.name(), want.data_type().to_string(), found.data_type().to_string()));
            }
        }
        Ok(mapping)
    }
}

/// `data` as a record batch of `mapping` (its vectors moved into the arrays, not copied): for a front
/// end that hands CNTK data to Arrow consumers. Errors ([`ErrorKind::InvalidChunkData`] or
/// [`ErrorKind::Limit`]): data that does not fit the mapping's streams, more than 2^31 − 1 samples or
/// entries of a stream; with [`Rows::Samples`] ([`ErrorKind::InvalidOption`]), a sequence without
/// exactly one sample of each stream.
pub fn to_record_batch(data: crate::ChunkData, mapping: &Mapping) -> Result<arrow_array::RecordBatch, Error> {
    build::record_batch(data, mapping, &mapping.arrow_schema()?)
}

/// A record batch of `mapping` (as [`to_record_batch`] makes it, or read from a file) as chunk data;
/// every offset, sparse index and null is checked. Errors: [`ErrorKind::ArrowColumn`].
pub fn from_record_batch(batch: &arrow_array::RecordBatch, mapping: &Mapping) -> Result<crate::ChunkData, Error> {
    let mut d = crate::ChunkData::new(&mapping.schema);
    decode::append_batch(batch, mapping, &mut d)?;
    Ok(d)
}

/// Whether two Arrow types are the same but for the names and nullability of list items (other writers
/// call them `element`; nulls are checked in the data).
fn same_shape(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::List(x), DataType::List(y)) => same_shape(x.data_type(), y.data_type()),
        (DataType::FixedSizeList(x, n), DataType::FixedSizeList(y, m)) => {
            n == m && same_shape(x.data_type(), y.data_type())
        }
        (DataType::Struct(x), DataType::Struct(y)) => {
            x.len() == y.len()
                && x.iter().zip(y.iter()).all(|(f, g)| f.name() == g.name() && same_shape(f.data_type(), g.data_type()))
        }
        _ => a == b,
    }
}

/// Parquet or Arrow IPC, from a file's first bytes `head` (at least 6 when it has them) and its last
/// bytes; `None` for other files.
pub(crate) fn detect(f: &crate::InputFile, head: &[u8]) -> Result<Option<crate::convert::Format>, Error> {
    if !head.starts_with(b"PAR1") && !head.starts_with(b"ARROW1") {
        // The length is not asked for: a gzip stream's is known only once it is decompressed.
        return Ok(None);
    }
    let len = f.len();
    let tail = |n: usize| -> Result<Vec<u8>, Error> {
        let mut t = vec![0u8; n];
        let got = f.read_some(len - n as u64, &mut t)?;
        t.truncate(got);
        Ok(t)
    };
    if head.starts_with(b"PAR1") && len >= 12 && tail(4)? == b"PAR1" {
        return Ok(Some(crate::convert::Format::Parquet));
    }
    if head.starts_with(b"ARROW1") && len >= 12 && tail(6)? == b"ARROW1" {
        return Ok(Some(crate::convert::Format::ArrowIpc));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        Schema::new(vec![
            StreamSpec::new("f", 3, StorageFormat::Dense).alias("x"),
            StreamSpec::new("l", 10, StorageFormat::Sparse).element_type(ElementType::F64),
        ])
        .unwrap()
    }

    #[test]
    fn the_schema_reads_back_as_the_mapping() {
        for rows in [Rows::Sequences, Rows::Samples] {
            let m = Mapping::new(&schema(), rows).unwrap();
            let a = m.arrow_schema().unwrap();
            let back = Mapping::from_arrow_schema(&a).unwrap();
            assert_eq!((back.rows, back.schema.streams()), (rows, schema().streams()));
        }
        let a = Mapping::new(&schema(), Rows::Sequences).unwrap().arrow_schema().unwrap();
        let types: Vec<&DataType> = a.fields().iter().map(|f| f.data_type()).collect();
        assert_eq!(types[..2], [&DataType::UInt64, &DataType::UInt32]);
        let DataType::List(dense) = types[2] else { panic!("{}", types[2]) };
        assert!(matches!(dense.data_type(), DataType::FixedSizeList(v, 3) if v.data_type() == &DataType::Float32));
        let DataType::List(sparse) = types[3] else { panic!("{}", types[3]) };
        let DataType::Struct(parts) = sparse.data_type() else { panic!("{sparse}") };
        let names: Vec<&str> = parts.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["indices", "values"]);
    }

    #[test]
    fn record_batches_carry_chunk_data_both_ways() {
        let text = b"0 |x 1 2 3 |l 9:0.5 1:2\n0 |x 4 5 6\n3 |x 7 8 9 |l\n";
        let schema = schema();
        let data = cntkio_core::ctf::parse::parse_bytes(text, &schema, false, &mut cntkio_core::ctf::parse::FailFast)
            .unwrap_or_else(|e| panic!("{e}"));
        let m = Mapping::new(&schema, Rows::Sequences).unwrap();
        let batch = to_record_batch(data.clone(), &m).unwrap();
        assert_eq!((batch.num_rows(), batch.num_columns()), (2, 4));
        assert_eq!(from_record_batch(&batch, &m).unwrap(), data);
        // A sparse index past the dim, made by hand, is refused on the way back.
        let mut bad = data.clone();
        if let crate::Layout::Sparse { indices, .. } = &mut bad.streams[1].layout {
            indices[0] = 10;
        }
        let e = from_record_batch(&to_record_batch(bad, &m).unwrap(), &m).unwrap_err();
        assert!(e.to_string().contains("index 10"), "{e}");
        // Flattening needs one sample per sequence.
        let flat = Mapping::new(&schema, Rows::Samples).unwrap();
        assert_eq!(to_record_batch(data, &flat).unwrap_err().code(), "E1006");
    }

    #[test]
    fn schemas_outside_the_mapping_are_refused_with_the_column() {
        let a = Mapping::new(&schema(), Rows::Sequences).unwrap().arrow_schema().unwrap();
        let plain = ArrowSchema::new(a.fields().clone());
        let e = Mapping::from_arrow_schema(&plain).unwrap_err();
        assert_eq!(e.code(), "E0102");
        assert!(e.to_string().contains("no \"cntkio.arrow\" metadata"), "{e}");
        // A column of another type than the metadata says.
        let mut fields: Vec<Field> = a.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields[2] = Field::new("f", DataType::List(item(DataType::Float32)), false);
        let e = Mapping::from_arrow_schema(&ArrowSchema::new_with_metadata(fields, a.metadata().clone())).unwrap_err();
        match e.kind() {
            ErrorKind::ArrowColumn { column, expected, found } => {
                assert_eq!(column, "f");
                assert!(expected.contains("FixedSizeList(3 x"), "{expected}");
                assert!(found.starts_with("List(") && !found.contains("Fixed"), "{found}");
            }
            k => panic!("{k:?}"),
        }
        // Another version, and a stream named like a fixed column.
        let mut meta = a.metadata().clone();
        let json = meta[METADATA_KEY].replace("\"mapping\":1", "\"mapping\":7");
        meta.insert(METADATA_KEY, json);
        let e = Mapping::from_arrow_schema(&ArrowSchema::new_with_metadata(a.fields().clone(), meta)).unwrap_err();
        assert!(e.to_string().contains("version 7"), "{e}");
        let keyed = Schema::new(vec![StreamSpec::new("key", 1, StorageFormat::Dense)]).unwrap();
        assert_eq!(Mapping::new(&keyed, Rows::Sequences).unwrap_err().code(), "E1006");
    }
}
