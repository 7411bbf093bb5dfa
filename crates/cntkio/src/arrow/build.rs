//! Chunk data → an Arrow record batch in the mapping. Values move into the arrays without a copy; offsets
//! are narrowed to Arrow's 32-bit ones.

use super::{item, sparse_fields, value_type, Mapping, Rows};
use crate::{ChunkData, Error, Layout, StreamData, Values};
use arrow_array::types::{Float32Type, Float64Type, Int32Type, UInt32Type, UInt64Type};
use arrow_array::{ArrayRef, FixedSizeListArray, ListArray, PrimitiveArray, RecordBatch, StructArray};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, SchemaRef};
use std::sync::Arc;

fn arrow_error(e: arrow_schema::ArrowError) -> Error {
    Error::internal(format!("building an Arrow array: {e}"))
}

/// `offsets[from..]` less `offsets[from]`, as Arrow offsets. Errors: offsets that go back, or a list of
/// more than 2^31 − 1 elements.
fn narrow(offsets: &[u64], stream: &str) -> Result<OffsetBuffer<i32>, Error> {
    let base = offsets.first().copied().unwrap_or(0);
    let mut out = Vec::with_capacity(offsets.len().max(1));
    let mut last = 0i32;
    for &o in offsets {
        let d = o
            .checked_sub(base)
            .ok_or_else(|| Error::chunk_data(None, format!("stream \"{stream}\": offsets go back")))?;
        let v = i32::try_from(d).map_err(|_| {
            Error::limit(format!("elements of stream \"{stream}\" in one Arrow record batch"), d, i32::MAX as u64)
        })?;
        if v < last {
            return Err(Error::chunk_data(None, format!("stream \"{stream}\": offsets go back")));
        }
        last = v;
        out.push(v);
    }
    if out.is_empty() {
        out.push(0);
    }
    Ok(OffsetBuffer::new(ScalarBuffer::from(out)))
}

fn values_array(v: Values) -> ArrayRef {
    match v {
        Values::F32(v) => Arc::new(PrimitiveArray::<Float32Type>::new(ScalarBuffer::from(v), None)),
        Values::F64(v) => Arc::new(PrimitiveArray::<Float64Type>::new(ScalarBuffer::from(v), None)),
    }
}

/// The samples of one stream as an array of samples (one element per sample).
fn samples_array(d: StreamData, name: &str) -> Result<ArrayRef, Error> {
    let t = d.values.element_type();
    let n = usize::try_from(d.num_samples()).unwrap_or(usize::MAX);
    match d.layout {
        Layout::Dense => {
            let dim = i32::try_from(d.dim)
                .map_err(|_| Error::limit("dim of a dense stream", d.dim as u64, i32::MAX as u64))?;
            if n.checked_mul(d.dim) != Some(d.values.len()) {
                return Err(Error::chunk_data(
                    None,
                    format!("stream \"{name}\": {} values for {n} samples of dim {}", d.values.len(), d.dim),
                ));
            }
            let a = FixedSizeListArray::try_new_with_length(item(value_type(t)), dim, values_array(d.values), None, n)
                .map_err(arrow_error)?;
            Ok(Arc::new(a))
        }
        Layout::Sparse { indices, sample_offsets } => {
            if sample_offsets.len() != n + 1 || sample_offsets.last().copied() != Some(indices.len() as u64) {
                return Err(Error::chunk_data(
                    None,
                    format!("stream \"{name}\": sample offsets do not fit the entries"),
                ));
            }
            if indices.len() != d.values.len() {
                return Err(Error::chunk_data(
                    None,
                    format!("stream \"{name}\": {} indices, {} values", indices.len(), d.values.len()),
                ));
            }
            let offsets = narrow(&sample_offsets, name)?;
            let idx = PrimitiveArray::<Int32Type>::new(ScalarBuffer::from(indices), None);
            let idx =
                ListArray::try_new(item(DataType::Int32), offsets.clone(), Arc::new(idx), None).map_err(arrow_error)?;
            let vals =
                ListArray::try_new(item(value_type(t)), offsets, values_array(d.values), None).map_err(arrow_error)?;
            let s = StructArray::try_new_with_length(sparse_fields(t), vec![Arc::new(idx), Arc::new(vals)], None, n)
                .map_err(arrow_error)?;
            Ok(Arc::new(s))
        }
    }
}

/// Checks that every sequence of `data` has one sample of each stream and declares one sample.
pub(super) fn check_flat(data: &ChunkData, mapping: &Mapping) -> Result<(), Error> {
    let n = data.num_sequences();
    for (i, len) in data.num_samples.iter().enumerate() {
        if len != 1 {
            return Err(not_flat(data.keys.get(i), "declares", u64::from(len), None));
        }
    }
    for (d, s) in data.streams.iter().zip(mapping.schema.streams()) {
        if d.num_samples() != n as u64 {
            let i = (0..n).find(|&i| d.sequence_len(i) != 1).unwrap_or(0);
            return Err(not_flat(if i < n { data.keys.get(i) } else { 0 }, "has", d.sequence_len(i), Some(&s.name)));
        }
    }
    Ok(())
}

fn not_flat(key: u64, verb: &str, n: u64, stream: Option<&str>) -> Error {
    let of = stream.map(|s| format!(" of stream \"{s}\"")).unwrap_or_default();
    Error::option(
        "--flatten",
        format!("flattening needs sequences of exactly one sample, but sequence {key} {verb} {n} samples{of}"),
    )
}

/// `data` as a record batch of `schema` (the mapping's Arrow schema), taking its vectors over.
pub(super) fn record_batch(data: ChunkData, mapping: &Mapping, schema: &SchemaRef) -> Result<RecordBatch, Error> {
    if mapping.rows == Rows::Samples {
        check_flat(&data, mapping)?;
    }
    let n = data.num_sequences();
    if data.num_samples.len() != n || data.streams.len() != mapping.schema.len() {
        return Err(Error::chunk_data(None, "keys, lengths and streams do not match the mapping"));
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    columns.push(Arc::new(PrimitiveArray::<UInt64Type>::new(ScalarBuffer::from(Vec::from(data.keys)), None)));
    if mapping.rows == Rows::Sequences {
        columns
            .push(Arc::new(PrimitiveArray::<UInt32Type>::new(ScalarBuffer::from(Vec::from(data.num_samples)), None)));
    }
    for (d, s) in data.streams.into_iter().zip(mapping.schema.streams()) {
        if d.num_sequences() != n {
            return Err(Error::chunk_data(
                None,
                format!("stream \"{}\" has {} sequences, not {n}", s.name, d.num_sequences()),
            ));
        }
        let seq_offsets = narrow(&d.sequence_offsets, &s.name)?;
        let t = d.values.element_type();
        let format = d.format();
        if (format, t, d.dim) != (s.format, s.element_type, s.dim) {
            return Err(Error::chunk_data(
                None,
                format!("stream \"{}\" does not have the schema's storage, type or dim", s.name),
            ));
        }
        let samples = samples_array(d, &s.name)?;
        columns.push(match mapping.rows {
            Rows::Samples => samples,
            Rows::Sequences => {
                let field = item(samples.data_type().clone());
                Arc::new(ListArray::try_new(field, seq_offsets, samples, None).map_err(arrow_error)?)
            }
        });
    }
    RecordBatch::try_new(Arc::clone(schema), columns).map_err(arrow_error)
}
