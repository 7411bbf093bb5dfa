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

use crate::arrays::indptr_to_py;
use crate::errors::py_err;
use crate::source::{bptt_to_py, Source};
use cntkio::source::{
    Batch, BatchPool as NativePool, Feed as NativeFeed, FeedConfig, HostPin, MinibatchSource, NextSource as NativeNext,
    PlanNext, Recycler, SourceState,
};
use cntkio::{Column, Entry, Error, Layout, Values};
use numpy::ndarray::{ArrayView1, ArrayView2};
use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

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

/// `(keys u64[S], num_samples u32[S], [(values, sequence_offsets u64[S+1], indices, indptr)…])` of a
/// batch, as `arrays::chunk_to_py` makes them (but for the offsets' type), with the keys, lengths, values,
/// sequence offsets and sparse indices as views of the batch's memory.
fn batch_to_py<'py>(py: Python<'py>, owner: &Bound<'py, BatchMemory>) -> PyResult<Bound<'py, PyTuple>> {
    let b = owner.get().batch.as_ref().expect("a batch memory holds its batch until dropped");
    let out = PyList::empty(py);
    for s in &b.data.streams {
        let offsets = view(&s.sequence_offsets, &[s.sequence_offsets.len()], owner)?;
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
                let indptr = indptr_to_py(py, sample_offsets, indices.len());
                (values, view(indices, &[indices.len()], owner)?, indptr)
            }
        };
        out.append(PyTuple::new(py, [values, offsets, indices, indptr])?)?;
    }
    let keys = column(py, &b.data.keys, owner)?;
    let lengths = column(py, &b.data.num_samples, owner)?;
    PyTuple::new(py, [keys, lengths, out.into_any()])
}

/// A batch's keys or lengths: a view of its list (a batch keeps them in lists), else a copy.
fn column<'py, T: numpy::Element + Entry>(
    py: Python<'py>,
    c: &Column<T>,
    owner: &Bound<'py, BatchMemory>,
) -> PyResult<Bound<'py, PyAny>> {
    match c.as_slice() {
        Some(v) => view(v, &[v.len()], owner),
        None => Ok(c.to_vec().into_pyarray(py).into_any()),
    }
}

/// `cudaHostRegister` / `cudaHostUnregister` of the CUDA runtime the caller uses (PyTorch's), called
/// through their addresses.
struct CudaHostPin {
    register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> c_int,
    unregister: unsafe extern "C" fn(*mut c_void) -> c_int,
}

/// `cudaHostRegisterPortable`: the memory is page-locked for every CUDA context.
const CUDA_HOST_REGISTER_PORTABLE: c_uint = 1;

impl HostPin for CudaHostPin {
    fn pin(&self, ptr: *const u8, len: usize) -> bool {
        // SAFETY: `register` is `cudaHostRegister` (see `Feed::new`), which reads no memory of its own
        // accord: it page-locks the range `ptr..ptr + len`, a live allocation of the feed's batch (the feed
        // unpins it before freeing or moving it), and reports failure by its return value.
        unsafe { (self.register)(ptr as *mut c_void, len, CUDA_HOST_REGISTER_PORTABLE) == 0 }
    }
    fn unpin(&self, ptr: *const u8) {
        // SAFETY: `unregister` is `cudaHostUnregister`, called with an address `register` locked.
        let _ = unsafe { (self.unregister)(ptr as *mut c_void) };
    }
}

/// The batches a loader's feeds reuse (one feed per epoch), their buffers page-locked for CUDA when made
/// with the addresses of `cudaHostRegister` and `cudaHostUnregister`.
#[pyclass(module = "cntkio._native", frozen)]
pub struct BatchPool {
    pool: Arc<NativePool>,
}

#[pymethods]
impl BatchPool {
    /// A pool keeping at most `cap` batches. `cuda_host_register`: the addresses of the CUDA runtime's
    /// `cudaHostRegister` and `cudaHostUnregister` (as the process has them loaded), to page-lock the
    /// batches' buffers.
    #[new]
    #[pyo3(signature = (cap, cuda_host_register = None))]
    fn new(cap: usize, cuda_host_register: Option<(usize, usize)>) -> PyResult<BatchPool> {
        let pin: Option<Arc<dyn HostPin>> = match cuda_host_register {
            None => None,
            Some((r, u)) if r != 0 && u != 0 => {
                // SAFETY: the caller (`cntkio.torch.Loader`) passes the addresses of `cudaHostRegister` and
                // `cudaHostUnregister` taken with ctypes from the CUDA runtime library loaded in this process;
                // these are the C functions `cudaError_t (void*, size_t, unsigned)` and `cudaError_t (void*)`.
                let register = unsafe {
                    std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void, usize, c_uint) -> c_int>(r)
                };
                // SAFETY: as above.
                let unregister = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> c_int>(u) };
                Some(Arc::new(CudaHostPin { register, unregister }))
            }
            Some(_) => return Err(pyo3::exceptions::PyValueError::new_err("null CUDA function address")),
        };
        Ok(BatchPool { pool: NativePool::new(cap, pin) })
    }
}

/// Minibatches of a source's configuration planned and assembled by native threads (`cntkio.Loader`).
#[pyclass(module = "cntkio._native", frozen)]
pub struct Feed {
    inner: Mutex<Option<NativeFeed>>,
    next: Option<Py<NextSource>>,
}

/// The source of the next feed (a training loop's next epoch), planning ahead once the feed it follows has
/// planned its last minibatch (`Feed(then=…)`); given to that next feed as `after`.
#[pyclass(module = "cntkio._native", frozen)]
pub struct NextSource {
    slot: Arc<NativeNext>,
    /// The process whose threads plan (a forked child has none: its copy is never used).
    pid: u32,
}

#[pymethods]
impl NextSource {
    /// Whether a source waits here (or is being started): the feed it follows planned its last minibatch.
    #[getter]
    fn waiting(&self) -> bool {
        self.pid == std::process::id() && self.slot.is_waiting()
    }
}

impl Drop for NextSource {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child's copy (a dataset copied into a DataLoader worker): the source's threads do not
            // exist here, and a lock one of them held at the fork stays held, so the source's destructor
            // (which stops its planning thread under that lock) must not run. The copy is let go unfreed.
            std::mem::forget(self.slot.clone());
        }
    }
}

impl NextSource {
    /// The source waiting here, if it is there, was made in this process, and is `fresh`'s configuration
    /// over the same data.
    fn take_matching(&self, source: &Source, workers: u32, rank: u32) -> Option<MinibatchSource> {
        if self.pid != std::process::id() {
            return None;
        }
        let next = self.slot.take()?;
        source.same_as(&next, workers, rank).then_some(next)
    }
}

fn lock(m: &Mutex<Option<NativeFeed>>) -> MutexGuard<'_, Option<NativeFeed>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[pymethods]
impl Feed {
    /// Starts a feed of minibatches of `size` samples (the size of all partitions together, as
    /// `Source.next_minibatch` takes it) for partition `rank` of `workers`, with `source`'s data and
    /// configuration, from the start of its run or from the checkpoint `restore` (`SourceState` JSON).
    /// `threads` assemble batches, `ahead` batches are planned or ready ahead, each of `group` consecutive
    /// minibatches; batches are reused from `pool` (else a pool of the feed's own). `after`: the
    /// `next_source()` of an earlier feed, whose source (already planning) this feed reads if it is there
    /// and has this configuration (without `restore`). `then`: the source of the next feed (the next
    /// epoch), which starts planning when this feed has planned its last minibatch (if the process left a
    /// core idle meanwhile, or always with `then_always`): `next_source()`.
    #[new]
    #[pyo3(signature = (source, size, workers = 1, rank = 0, threads = 1, ahead = 4, restore = None, group = 1, pool = None, after = None, then = None, then_always = false))]
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
        group: usize,
        pool: Option<PyRef<'_, BatchPool>>,
        after: Option<PyRef<'_, NextSource>>,
        then: Option<PyRef<'_, Source>>,
        then_always: bool,
    ) -> PyResult<Feed> {
        let pool = pool.map(|p| p.pool.clone());
        let prepared = after.filter(|_| restore.is_none()).and_then(|a| a.take_matching(&source, workers, rank));
        let fresh = match prepared {
            Some(p) => Ok(p),
            None => source.fresh(workers, rank),
        };
        let following = then.map(|t| t.fresh(workers, rank)).transpose().map_err(py_err)?;
        let (feed, slot) = py
            .detach(move || {
                crate::pool::run(move || -> Result<_, Error> {
                    let mut src = fresh?;
                    if let Some(s) = restore {
                        src.restore(&SourceState::from_json(&s)?)?;
                    }
                    let when = if then_always { PlanNext::Always } else { PlanNext::WhenCoreIdle };
                    let slot = following.map(|n| src.then(n, size, when));
                    let config = FeedConfig { size, threads, ahead, group };
                    let feed = match pool {
                        None => NativeFeed::start(src, config)?,
                        Some(p) => NativeFeed::start_with_pool(src, config, p)?,
                    };
                    Ok((feed, slot))
                })
            })
            .map_err(py_err)?;
        let next = slot.map(|slot| Py::new(py, NextSource { slot, pid: std::process::id() })).transpose()?;
        Ok(Feed { inner: Mutex::new(Some(feed)), next })
    }

    /// Where the source given as `then` waits (None without `then`): pass it as `after` to the next feed.
    fn next_source(&self, py: Python<'_>) -> Option<Py<NextSource>> {
        self.next.as_ref().map(|n| n.clone_ref(py))
    }

    /// The next batch of minibatches as `(keys, lengths, streams, parts, bptt)` (see
    /// `Source.next_minibatch`; the arrays hold the minibatches one after another), `parts` a list of
    /// `(sequences, end_of_sweep, end_of_run, state)` per minibatch (`state`: the checkpoint after it,
    /// JSON), or None when the run is over or the feed was closed. The arrays view memory that goes back to
    /// the pool when Python drops them.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let got = py.detach(|| {
            let mut g = lock(&self.inner);
            match g.as_mut() {
                None => Ok(None),
                Some(f) => f.next_batch().map(|o| o.map(|fed| (fed, f.recycler()))),
            }
        });
        let Some((fed, recycler)) = got.map_err(py_err)? else { return Ok(None) };
        let bptt = bptt_to_py(py, fed.batch.bptt.as_ref())?;
        let parts = PyList::empty(py);
        for p in &fed.parts {
            parts.append((p.sequences, p.end_of_sweep, p.end_of_run, p.state.to_json()))?;
        }
        let owner = Bound::new(py, BatchMemory { batch: Some(fed.batch), recycler })?;
        let data = batch_to_py(py, &owner)?;
        let (keys, lengths, streams) = (data.get_item(0)?, data.get_item(1)?, data.get_item(2)?);
        Ok(Some((keys, lengths, streams, parts, bptt).into_pyobject(py)?))
    }

    /// Stops the feed's threads (waiting for them); `next` then returns None.
    fn close(&self, py: Python<'_>) {
        let f = lock(&self.inner).take();
        py.detach(move || drop(f));
    }
}
