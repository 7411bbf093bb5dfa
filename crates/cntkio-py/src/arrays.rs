//! Columnar chunk data handed to NumPy: value vectors move into arrays without a copy; offsets are
//! converted to NumPy's signed index types (small).

use cntkio::{ChunkData, Layout, Values};
use numpy::{IntoPyArray, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// Appends `src`'s sequences to `dst` (same schema), rebasing the offsets.
pub fn append(dst: &mut ChunkData, src: &ChunkData) {
    dst.keys.extend(src.keys.iter());
    dst.num_samples.extend(src.num_samples.iter());
    for (d, s) in dst.streams.iter_mut().zip(&src.streams) {
        let base = d.num_samples();
        d.sequence_offsets.extend(s.sequence_offsets[1..].iter().map(|&o| o + base));
        let n = s.values.len();
        d.values.extend_from(&s.values, 0..n);
        if let (
            Layout::Sparse { indices: di, sample_offsets: dso },
            Layout::Sparse { indices: si, sample_offsets: sso },
        ) = (&mut d.layout, &s.layout)
        {
            let base = *dso.last().unwrap_or(&0);
            di.extend_from_slice(si);
            dso.extend(sso[1..].iter().map(|&o| o + base));
        }
    }
}

/// Concatenates chunks in order (moves the first one when it is the only one).
pub fn concat(empty: ChunkData, chunks: Vec<ChunkData>) -> ChunkData {
    if chunks.len() == 1 {
        return chunks.into_iter().next().unwrap_or(empty);
    }
    let mut acc = empty;
    for c in &chunks {
        append(&mut acc, c);
    }
    acc
}

fn offsets_i64<'py>(py: Python<'py>, v: &[u64]) -> Bound<'py, PyAny> {
    v.iter().map(|&x| x as i64).collect::<Vec<i64>>().into_pyarray(py).into_any()
}

/// A sparse stream's per-sample offsets as a CSR `indptr`: i32 when its `entries` fit, else i64.
pub fn indptr_to_py<'py>(py: Python<'py>, sample_offsets: &[u64], entries: usize) -> Bound<'py, PyAny> {
    if entries <= i32::MAX as usize {
        sample_offsets.iter().map(|&x| x as i32).collect::<Vec<i32>>().into_pyarray(py).into_any()
    } else {
        offsets_i64(py, sample_offsets)
    }
}

/// A chunk as `(keys u64[S], num_samples u32[S], [(values, sequence_offsets i64[S+1], indices, indptr)…])`:
/// dense values shaped `(samples, dim)`; sparse values, `indices` (i32) and `indptr` (per sample; i32 when
/// the entries fit, else i64) ready for `scipy.sparse.csr_matrix`; `indices`/`indptr` are None for dense.
pub fn chunk_to_py(py: Python<'_>, data: ChunkData) -> PyResult<Bound<'_, PyTuple>> {
    let ChunkData { keys, num_samples, streams } = data;
    let out = PyList::empty(py);
    for s in streams {
        let offsets = offsets_i64(py, &s.sequence_offsets);
        let (values, indices, indptr): (Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>) = match s.layout {
            Layout::Dense => {
                let n = s.sequence_offsets.last().copied().unwrap_or(0) as usize;
                let values = match s.values {
                    Values::F32(v) => v.into_pyarray(py).reshape([n, s.dim])?.into_any(),
                    Values::F64(v) => v.into_pyarray(py).reshape([n, s.dim])?.into_any(),
                };
                (values, py.None().into_bound(py), py.None().into_bound(py))
            }
            Layout::Sparse { indices, sample_offsets } => {
                let values = match s.values {
                    Values::F32(v) => v.into_pyarray(py).into_any(),
                    Values::F64(v) => v.into_pyarray(py).into_any(),
                };
                let indptr = indptr_to_py(py, &sample_offsets, indices.len());
                (values, indices.into_pyarray(py).into_any(), indptr)
            }
        };
        out.append(PyTuple::new(py, [values, offsets, indices, indptr])?)?;
    }
    PyTuple::new(
        py,
        [
            Vec::from(keys).into_pyarray(py).into_any(),
            Vec::from(num_samples).into_pyarray(py).into_any(),
            out.into_any(),
        ],
    )
}
