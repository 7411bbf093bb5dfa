//! An Arrow record batch in the mapping → chunk data. Every number from the file is checked before it
//! is used: offsets must lie within their arrays and go forward, sparse indices within the stream's dim,
//! and nothing may be null.

use super::{column_error, Mapping, Rows};
use crate::{ChunkData, Error, Layout, StreamData, StreamSpec, Values};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch};

fn no_nulls(a: &dyn Array, column: &str) -> Result<(), Error> {
    if a.null_count() > 0 {
        return Err(column_error(column, "no null values", format!("{} nulls", a.null_count())));
    }
    Ok(())
}

/// A list array's offsets as `start..end` ranges into its values, checked to go forward and lie within
/// `values_len`.
fn ranges(offsets: &[i32], values_len: usize, column: &str) -> Result<Vec<(usize, usize)>, Error> {
    let mut out = Vec::with_capacity(offsets.len().saturating_sub(1));
    for w in offsets.windows(2) {
        let (a, b) = (usize::try_from(w[0]), usize::try_from(w[1]));
        match (a, b) {
            (Ok(a), Ok(b)) if a <= b && b <= values_len => out.push((a, b)),
            _ => {
                return Err(column_error(
                    column,
                    format!("list offsets going forward within {values_len} values"),
                    format!("{}..{}", w[0], w[1]),
                ))
            }
        }
    }
    Ok(out)
}

/// Appends `src[a..b]` to `dst`, both of element type `t` (checked by the mapping's types).
fn push_values(dst: &mut Values, src: &ArrayRef, a: usize, b: usize, column: &str) -> Result<(), Error> {
    let bad =
        || column_error(column, "values of the stream's element type within the array", src.data_type().to_string());
    match dst {
        Values::F32(v) => {
            let s = src.as_primitive_opt::<Float32Type>().ok_or_else(bad)?;
            no_nulls(s, column)?;
            v.extend_from_slice(s.values().get(a..b).ok_or_else(bad)?);
        }
        Values::F64(v) => {
            let s = src.as_primitive_opt::<Float64Type>().ok_or_else(bad)?;
            no_nulls(s, column)?;
            v.extend_from_slice(s.values().get(a..b).ok_or_else(bad)?);
        }
    }
    Ok(())
}

/// Appends samples `a..b` of the samples array `samples` (one element per sample) to `d`.
fn push_samples(d: &mut StreamData, spec: &StreamSpec, samples: &ArrayRef, a: usize, b: usize) -> Result<(), Error> {
    let column = spec.name.as_str();
    let shape =
        || column_error(column, format!("samples of a {} stream", spec.format.name()), samples.data_type().to_string());
    no_nulls(samples.as_ref(), column)?;
    match &mut d.layout {
        Layout::Dense => {
            let fsl = samples.as_fixed_size_list_opt().ok_or_else(shape)?;
            let dim = spec.dim;
            if fsl.value_length() as usize != dim || b > fsl.len() {
                return Err(shape());
            }
            let (x, y) = (a.checked_mul(dim).ok_or_else(shape)?, b.checked_mul(dim).ok_or_else(shape)?);
            push_values(&mut d.values, fsl.values(), x, y, column)?;
        }
        Layout::Sparse { indices, sample_offsets } => {
            let st = samples.as_struct_opt().ok_or_else(shape)?;
            if b > st.len() || st.num_columns() != 2 {
                return Err(shape());
            }
            let idx = st.column(0).as_list_opt::<i32>().ok_or_else(shape)?;
            let val = st.column(1).as_list_opt::<i32>().ok_or_else(shape)?;
            no_nulls(idx, column)?;
            no_nulls(val, column)?;
            let idx_values = idx.values().as_primitive_opt::<Int32Type>().ok_or_else(shape)?;
            no_nulls(idx_values, column)?;
            let io = idx.value_offsets().get(a..b + 1).ok_or_else(shape)?;
            let vo = val.value_offsets().get(a..b + 1).ok_or_else(shape)?;
            let ir = ranges(io, idx_values.len(), column)?;
            let vr = ranges(vo, val.values().len(), column)?;
            let dim = spec.dim;
            for (&(i0, i1), &(v0, v1)) in ir.iter().zip(&vr) {
                if i1 - i0 != v1 - v0 {
                    return Err(column_error(
                        column,
                        "as many values as indices in each sample",
                        format!("{} indices and {} values", i1 - i0, v1 - v0),
                    ));
                }
                let part = idx_values.values().get(i0..i1).ok_or_else(shape)?;
                if let Some(&bad) = part.iter().find(|&&k| k < 0 || k as usize >= dim) {
                    return Err(column_error(column, format!("sparse indices in 0..{dim}"), format!("index {bad}")));
                }
                indices.extend_from_slice(part);
                push_values(&mut d.values, val.values(), v0, v1, column)?;
                sample_offsets.push(indices.len() as u64);
            }
        }
    }
    Ok(())
}

/// Appends the rows of `batch` (of the mapping's schema, checked when the file was opened) to `out`.
pub(super) fn append_batch(batch: &RecordBatch, mapping: &Mapping, out: &mut ChunkData) -> Result<(), Error> {
    let n = batch.num_rows();
    let cols = batch.columns();
    let fixed = if mapping.rows == Rows::Sequences { 2 } else { 1 };
    if cols.len() != fixed + mapping.schema.len() || out.streams.len() != mapping.schema.len() {
        return Err(super::format_error(format!(
            "a record batch has {} columns; the mapping has {}",
            cols.len(),
            fixed + mapping.schema.len()
        )));
    }
    let keys = cols[0]
        .as_primitive_opt::<UInt64Type>()
        .ok_or_else(|| column_error(super::KEY_COLUMN, "uint64", cols[0].data_type().to_string()))?;
    no_nulls(keys, super::KEY_COLUMN)?;
    out.keys.extend(keys.values().iter().copied());
    match mapping.rows {
        Rows::Sequences => {
            let lens = cols[1]
                .as_primitive_opt::<UInt32Type>()
                .ok_or_else(|| column_error(super::NUM_SAMPLES_COLUMN, "uint32", cols[1].data_type().to_string()))?;
            no_nulls(lens, super::NUM_SAMPLES_COLUMN)?;
            out.num_samples.extend(lens.values().iter().copied());
        }
        Rows::Samples => out.num_samples.extend(std::iter::repeat_n(1, n)),
    }
    for ((col, spec), d) in cols[fixed..].iter().zip(mapping.schema.streams()).zip(&mut out.streams) {
        let column = spec.name.as_str();
        no_nulls(col.as_ref(), column)?;
        let start = d.num_samples();
        match mapping.rows {
            Rows::Samples => {
                push_samples(d, spec, col, 0, n)?;
                d.sequence_offsets.extend((1..=n as u64).map(|k| start + k));
            }
            Rows::Sequences => {
                let list = col
                    .as_list_opt::<i32>()
                    .ok_or_else(|| column_error(column, "a list of samples", col.data_type().to_string()))?;
                let offsets = list.value_offsets();
                let r = ranges(offsets, list.values().len(), column)?;
                let (first, last) = match (r.first(), r.last()) {
                    (Some(f), Some(l)) => (f.0, l.1),
                    _ => (0, 0),
                };
                push_samples(d, spec, list.values(), first, last)?;
                d.sequence_offsets.extend(r.iter().map(|&(_, b)| start + (b - first) as u64));
            }
        }
    }
    Ok(())
}
