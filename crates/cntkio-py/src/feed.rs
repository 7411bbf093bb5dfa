//! The native side of `cntkio.Loader`: a [`cntkio::source::Feed`] (minibatches planned and assembled on
//! threads of their own) whose batches reach NumPy without a copy and go back to the feed's pool when
//! Python lets go of them.
//!
//! Each batch handed out is owned by a [`BatchMemory`] object; the value, key and index arrays given to
//! Python are views of its vectors with that object as their NumPy base. NumPy keeps a base alive while
//! any array (or a view of one, or a tensor made by `torch.from_numpy`) refers to it, so the batch returns
//! to the pool only when nothing in Python can read it any more: a batch the user keeps is never
//! overwritten.
#![allow(unsafe_code)]

use crate::errors::py_err;
use crate::source::{bptt_to_py, Source};
use cntkio::source::{Batch, Feed as NativeFeed, FeedConfig, Recycler, SourceState};
use cntkio::{Error, Layout, Values};
use numpy::ndarray::{ArrayView1, ArrayView2};
use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::sync::{Mutex, MutexGuard};

/// The memory of one batch, lent to NumPy arrays; given back to the feed's pool when Python drops it.
#[pyclass(module = "cntkio._native", frozen)]
pub struct BatchMemory {
    /// Never modified while the object lives (the arrays borrowed from it rely on that).
    batch: Option<Batch>,
    recycler: Recycler,
}

impl Drop for BatchMemory {
    fn drop(&mut self) {
        if let Some(b) = self.batch.take() {
            self.recycler.recycle(b);
        }
    }
}

/// A view of `v` as a NumPy array of `shape` whose base is `owner`.
///
/// `v` must belong to the batch held by `owner` (a [`BatchMemory`], which never modifies or drops its batch
/// before it is itself dropped).
fn view<'py, T: numpy::Element>(
    v: &[T],
    shape: &[usize],
    owner: &Bound<'py, BatchMemory>,
) -> PyResult<Bound<'py, PyAny>> {
    let base = owner.clone().into_any();
    Ok(match shape {
        [n, d] => {
            let a = ArrayView2::from_shape((*n, *d), v)
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
            // SAFETY: `v` lies in the vectors of the batch owned by `owner`, which is the array's base:
            // NumPy keeps the base alive as long as the array (or anything viewing it) exists, and a
            // `BatchMemory` never changes or reallocates its batch; the batch is recycled (and may then be
            // overwritten) only in its `Drop`, after the last array is gone.
            unsafe { PyArray2::borrow_from_array(&a, base) }.into_any()
        }
        _ => {
            let a = ArrayView1::from(v);
            // SAFETY: as above.
            unsafe { PyArray1::borrow_from_array(&a, base) }.into_any()
        }
    })
}

fn offsets_i64<'py>(py: Python<'py>, v: &[u64]) -> Bound<'py, PyAny> {
    v.iter().map(|&x| x as i64).collect::<Vec<i64>>().into_pyarray(py).into_any()
}

/// `(keys u64[S], num_samples u32[S], [(values, sequence_offsets i64[S+1], indices, indptr)…])` of a
/// batch, as `arrays::chunk_to_py` makes them, with the keys, lengths, values and sparse indices as views
/// of the batch's memory.
fn batch_to_py<'py>(py: Python<'py>, owner: &Bound<'py, BatchMemory>) -> PyResult<Bound<'py, PyTuple>> {
    let b = owner.get().batch.as_ref().expect("a batch memory holds its batch until dropped");
    let out = PyList::empty(py);
    for s in &b.data.streams {
        let offsets = offsets_i64(py, &s.sequence_offsets);
        let (values, indices, indptr) = match &s.layout {
            Layout::Dense => {
                let n = s.sequence_offsets.last().copied().unwrap_or(0) as usize;
                let values = match &s.values {
                    Values::F32(v) => view(v, &[n, s.dim], owner)?,
                    Values::F64(v) => view(v, &[n, s.dim], owner)?,
                };
                (values, py.None().into_bound(py), py.None().into_bound(py))
            }
            Layout::Sparse { indices, sample_offsets } => {
                let values = match &s.values {
                    Values::F32(v) => view(v, &[v.len()], owner)?,
                    Values::F64(v) => view(v, &[v.len()], owner)?,
                };
                let indptr = if indices.len() <= i32::MAX as usize {
                    sample_offsets.iter().map(|&x| x as i32).collect::<Vec<i32>>().into_pyarray(py).into_any()
                } else {
                    offsets_i64(py, sample_offsets)
                };
                (values, view(indices, &[indices.len()], owner)?, indptr)
            }
        };
        out.append(PyTuple::new(py, [values, offsets, indices, indptr])?)?;
    }
    let keys = view(&b.data.keys, &[b.data.keys.len()], owner)?;
    let lengths = view(&b.data.num_samples, &[b.data.num_samples.len()], owner)?;
    PyTuple::new(py, [keys, lengths, out.into_any()])
}

/// Minibatches of a source's configuration planned and assembled by native threads (`cntkio.Loader`).
#[pyclass(module = "cntkio._native", frozen)]
pub struct Feed {
    inner: Mutex<Option<NativeFeed>>,
}

fn lock(m: &Mutex<Option<NativeFeed>>) -> MutexGuard<'_, Option<NativeFeed>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[pymethods]
impl Feed {
    /// Starts a feed of minibatches of `size` samples (the size of all partitions together, as
    /// `Source.next_minibatch` takes it) for partition `rank` of `workers`, with `source`'s data and
    /// configuration, from the start of its run or from the checkpoint `restore` (`SourceState` JSON).
    /// `threads` assemble batches, `ahead` minibatches are planned or ready ahead.
    #[new]
    #[pyo3(signature = (source, size, workers = 1, rank = 0, threads = 1, ahead = 4, restore = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: PyRef<'_, Source>,
        size: u64,
        workers: u32,
        rank: u32,
        threads: usize,
        ahead: usize,
        restore: Option<String>,
    ) -> PyResult<Feed> {
        let fresh = source.fresh(workers, rank);
        py.detach(move || {
            crate::pool::run(move || -> Result<Feed, Error> {
                let mut src = fresh?;
                if let Some(s) = restore {
                    src.restore(&SourceState::from_json(&s)?)?;
                }
                let feed = NativeFeed::start(src, FeedConfig { size, threads, ahead })?;
                Ok(Feed { inner: Mutex::new(Some(feed)) })
            })
        })
        .map_err(py_err)
    }

    /// The next minibatch as `(keys, lengths, streams, end_of_sweep, end_of_run, state, bptt)` (see
    /// `Source.next_minibatch`; `state` is the checkpoint after it, JSON), or None when the run is over or
    /// the feed was closed. The arrays view memory that goes back to the feed when Python drops them.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let got = py.detach(|| {
            let mut g = lock(&self.inner);
            match g.as_mut() {
                None => Ok(None),
                Some(f) => f.next_batch().map(|o| o.map(|fed| (fed, f.recycler()))),
            }
        });
        let Some((fed, recycler)) = got.map_err(py_err)? else { return Ok(None) };
        let (eos, eor) = (fed.batch.end_of_sweep, fed.batch.end_of_run);
        let bptt = bptt_to_py(py, fed.batch.bptt.as_ref())?;
        let owner = Bound::new(py, BatchMemory { batch: Some(fed.batch), recycler })?;
        let data = batch_to_py(py, &owner)?;
        let (keys, lengths, streams) = (data.get_item(0)?, data.get_item(1)?, data.get_item(2)?);
        let state = fed.state.to_json();
        Ok(Some((keys, lengths, streams, eos, eor, state, bptt).into_pyobject(py)?))
    }

    /// Stops the feed's threads (waiting for them); `next` then returns None.
    fn close(&self, py: Python<'_>) {
        let f = lock(&self.inner).take();
        py.detach(move || drop(f));
    }
}
