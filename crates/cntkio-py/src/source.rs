//! CNTK's minibatch source for Python: a [`MinibatchSource`] over opened [`Reader`]s (one, several joined
//! by key as CNTK's composite reader does, or several shards one after another), minibatches handed to
//! NumPy without copying the values, checkpoints as JSON. The GIL is released while reading.

use crate::arrays::chunk_to_py;
use crate::errors::{py_err, usage};
use crate::reader::{stream_info, Reader};
use cntkio::randomize::{ChunkInfo, ElasticResume, SequenceInfo, SequenceSource, Window};
use cntkio::source::{
    Batch, BpttLayout, ChunkKeep, Composite, Deserializer, MinibatchConfig, MinibatchSource, MultiSource, RunLength,
    SourceState,
};
use cntkio::{ChunkData, Error, Layout, StreamSpec, Values};
use numpy::{IntoPyArray, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::{Arc, Mutex, MutexGuard};

/// A truncated-BPTT layout as `(rows, columns, fragments)` (`fragments`: int64 `(sequences, 4)` of `[row,
/// column, offset, sequence_len]`), or None.
pub(crate) fn bptt_to_py<'py>(py: Python<'py>, layout: Option<&BpttLayout>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match layout {
        None => py.None().into_bound(py),
        Some(l) => {
            let flat: Vec<i64> = l
                .fragments
                .iter()
                .flat_map(|f| [i64::from(f.row), f.column as i64, f.offset as i64, f.sequence_len as i64])
                .collect();
            let fragments = flat.into_pyarray(py).reshape([l.fragments.len(), 4])?;
            (l.rows, l.columns, fragments).into_pyobject(py)?.into_any()
        }
    })
}

/// Chunks kept from one source to the next over the same readers (the epochs of a loader): see
/// [`cntkio::source::ChunkKeep`]. Several readers are joined (or concatenated) once, and the next source
/// over the same readers reuses that deserializer, whose chunks the keep holds.
#[pyclass(module = "cntkio._native", frozen)]
pub struct Keep {
    keep: Arc<ChunkKeep>,
    joined: Mutex<Option<Combined>>,
}

/// The readers' deserializers, whether they were joined, and the deserializer made of them.
type Combined = (Vec<Arc<dyn Deserializer>>, bool, Arc<dyn Deserializer>);

#[pymethods]
impl Keep {
    #[new]
    fn new() -> Keep {
        Keep { keep: ChunkKeep::new(), joined: Mutex::new(None) }
    }

    /// Number of chunks kept.
    fn __len__(&self) -> usize {
        self.keep.len()
    }
}

impl Keep {
    /// The deserializer of `parts` (joined by key if `join`, else one after another): the one made for the
    /// last source if it had the same parts, else a new one.
    fn deserializer(&self, parts: Vec<Arc<dyn Deserializer>>, join: bool) -> Result<Arc<dyn Deserializer>, Error> {
        let mut j = self.joined.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((p, jn, d)) = &*j {
            if *jn == join && p.len() == parts.len() && p.iter().zip(&parts).all(|(a, b)| Arc::ptr_eq(a, b)) {
                return Ok(d.clone());
            }
        }
        let d = combine(parts.clone(), join)?;
        *j = Some((parts, join, d.clone()));
        Ok(d)
    }
}

/// A minibatch source over `deserializer` that takes and leaves its chunks in `keep`, if any.
fn source_over(
    deserializer: &Arc<dyn Deserializer>,
    config: MinibatchConfig,
    keep: Option<&Arc<ChunkKeep>>,
) -> Result<MinibatchSource, Error> {
    let mut src = MinibatchSource::new(deserializer.clone(), config)?;
    if let Some(k) = keep {
        src.keep_chunks(k.clone());
    }
    Ok(src)
}

/// One deserializer of `parts`: the only one, or them joined by key (`join`) or one after another.
fn combine(parts: Vec<Arc<dyn Deserializer>>, join: bool) -> Result<Arc<dyn Deserializer>, Error> {
    Ok(match parts.len() {
        0 => return Err(Error::option("deserializers", "a minibatch source needs at least one deserializer")),
        1 => parts.into_iter().next().expect("one part"),
        _ if join => Arc::new(Composite::new(parts)?),
        _ => Arc::new(MultiSource::new(parts)?),
    })
}

/// A deserializer with the chunk and sequence structure of another and no streams: the minibatch source
/// over it walks exactly the same sequences, sweeps and workers' shares without reading any data (used to
/// count minibatches and find positions).
struct Skeleton {
    inner: Arc<dyn Deserializer>,
    empty: Arc<ChunkData>,
}

impl SequenceSource for Skeleton {
    fn chunks(&self) -> &[ChunkInfo] {
        self.inner.chunks()
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        self.inner.sequences(chunk, out)
    }
    fn uniform_sequences(&self, chunk: u32) -> Result<Option<(u64, u32)>, Error> {
        self.inner.uniform_sequences(chunk)
    }
}

impl Deserializer for Skeleton {
    fn streams(&self) -> &[StreamSpec] {
        &[]
    }
    fn load_chunk(&self, _chunk: u32) -> Result<Arc<ChunkData>, Error> {
        Ok(self.empty.clone())
    }
}

/// The minibatch source of one Python `MinibatchSource`.
#[pyclass(module = "cntkio._native", frozen)]
pub struct Source {
    deserializer: Arc<dyn Deserializer>,
    /// Where its minibatch sources (this one's, and those made for feeds or other partitions) take and
    /// leave chunks.
    keep: Option<Arc<ChunkKeep>>,
    /// The streams of the minibatches (every one dense with truncated BPTT).
    streams: Vec<StreamSpec>,
    inner: Mutex<MinibatchSource>,
    /// The array sizes of the last minibatch.
    hint: Mutex<Sizes>,
}

/// Per stream: values, sequence offsets, sparse indices and sample offsets; and the sequences.
#[derive(Debug, Default, Clone)]
struct Sizes {
    streams: Vec<[usize; 4]>,
    sequences: usize,
}

fn lock_hint(m: &Mutex<Sizes>) -> MutexGuard<'_, Sizes> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn sizes(b: &Batch) -> Sizes {
    Sizes {
        streams: b
            .data
            .streams
            .iter()
            .map(|s| {
                let (i, o) = match &s.layout {
                    Layout::Sparse { indices, sample_offsets } => (indices.len(), sample_offsets.len()),
                    Layout::Dense => (0, 0),
                };
                [s.values.len(), s.sequence_offsets.len(), i, o]
            })
            .collect(),
        sequences: b.data.keys.len(),
    }
}

fn reserve(b: &mut Batch, hint: &Sizes) {
    b.data.keys.reserve_exact(hint.sequences);
    b.data.num_samples.reserve_exact(hint.sequences);
    for (s, h) in b.data.streams.iter_mut().zip(&hint.streams) {
        match &mut s.values {
            Values::F32(v) => v.reserve(h[0]),
            Values::F64(v) => v.reserve(h[0]),
        }
        s.sequence_offsets.reserve(h[1]);
        if let Layout::Sparse { indices, sample_offsets } = &mut s.layout {
            indices.reserve(h[2]);
            sample_offsets.reserve(h[3]);
        }
    }
}

fn lock(m: &Mutex<MinibatchSource>) -> MutexGuard<'_, MinibatchSource> {
    // A panic while reading leaves the source at a minibatch boundary or mid-way; either way the next call
    // reports errors of its own, so a poisoned lock is taken over.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Checks a partition: `rank` is one of `workers`, and there is at least one.
fn check_partition(rank: u32, workers: u32) -> Result<(), Error> {
    if workers == 0 || rank >= workers {
        let problem = format!("{rank} is not below num_data_partitions {workers} (which must be > 0)");
        return Err(Error::option("partition_index", problem));
    }
    Ok(())
}

/// Switches `src` to `workers`/`rank` at its current position (CNTK reconfigures in place when
/// `num_data_partitions` or `partition_index` change between calls, READER.md §6).
fn repartition(
    deserializer: &Arc<dyn Deserializer>,
    keep: Option<&Arc<ChunkKeep>>,
    src: &mut MinibatchSource,
    workers: u32,
    rank: u32,
) -> Result<(), Error> {
    let c = src.config();
    if c.workers == workers && c.rank == rank {
        return Ok(());
    }
    check_partition(rank, workers)?;
    let state = src.state();
    let mut next = source_over(deserializer, MinibatchConfig { workers, rank, ..c.clone() }, keep)?;
    next.restore(&state)?;
    *src = next;
    Ok(())
}

#[pymethods]
impl Source {
    /// A source over `readers`: one, several joined by key (`join`, CNTK's composite reader) or several
    /// shards with the same streams read one after another. `max_samples` / `max_sweeps` (at most one):
    /// the run length, none = infinite. `window_samples > 0` selects a window in samples.
    /// `truncation_length > 0`: truncated BPTT (every stream dense, fragments in parallel rows). `threads`:
    /// background chunk loaders (None: `CNTKIO_THREADS` or one per core; 0: load on the calling thread).
    /// `elastic_resume = (sweep, rounds)`: resume sweep `sweep` elastically with balanced dealing, `rounds`
    /// the sequences each worker of each earlier run was delivered of it (`cntkio::randomize::ElasticResume`).
    /// `keep`: a `Keep` whose chunks the source takes rather than load, and where it leaves those it lets go
    /// of.
    #[new]
    #[pyo3(signature = (readers, join = true, randomize = true, window_chunks = 128, window_samples = 0, seed = 0, max_samples = None, max_sweeps = None, frame_mode = false, cntk_restore_quirk = false, truncation_length = 0, threads = None, balanced_workers = false, elastic_resume = None, keep = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        readers: Vec<PyRef<'_, Reader>>,
        join: bool,
        randomize: bool,
        window_chunks: u64,
        window_samples: u64,
        seed: u64,
        max_samples: Option<u64>,
        max_sweeps: Option<u64>,
        frame_mode: bool,
        cntk_restore_quirk: bool,
        truncation_length: u64,
        threads: Option<usize>,
        balanced_workers: bool,
        elastic_resume: Option<(u64, Vec<Vec<u64>>)>,
        keep: Option<Py<Keep>>,
    ) -> PyResult<Source> {
        let parts: Vec<Arc<dyn Deserializer>> = readers.iter().map(|r| r.deserializer()).collect();
        let run_length = match (max_samples, max_sweeps) {
            (None, None) => RunLength::Infinite,
            (Some(n), None) => RunLength::Samples(n),
            (None, Some(k)) => RunLength::Sweeps(k),
            (Some(_), Some(_)) => return Err(usage("max samples and max sweeps are mutually exclusive options")),
        };
        let window = if window_samples > 0 { Window::Samples(window_samples) } else { Window::Chunks(window_chunks) };
        let config = MinibatchConfig {
            randomize,
            window,
            seed,
            run_length,
            frame_mode,
            workers: 1,
            rank: 0,
            cntk_restore_quirk,
            balanced_workers,
            truncation_length,
            threads,
            elastic_resume: elastic_resume.map(|(sweep, rounds)| ElasticResume { sweep, rounds }),
            ..MinibatchConfig::default()
        };
        py.detach(move || {
            crate::pool::run(move || -> Result<Source, Error> {
                let deserializer = match keep.as_ref().map(Py::get) {
                    Some(k) => k.deserializer(parts, join)?,
                    None => combine(parts, join)?,
                };
                let keep = keep.as_ref().map(|k| k.get().keep.clone());
                let src = source_over(&deserializer, config, keep.as_ref())?;
                let streams = src.streams().to_vec();
                let (inner, hint) = (Mutex::new(src), Mutex::new(Sizes::default()));
                Ok(Source { deserializer, keep, streams, inner, hint })
            })
        })
        .map_err(py_err)
    }

    /// `(name, alias, dim, is_sparse, dtype, defines_mb_size)` of each stream, in delivery order (with
    /// truncated BPTT every stream is dense).
    fn stream_infos<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.streams.iter().map(|s| stream_info(py, s)).collect()
    }

    /// Sweep size in samples (Σ of the declared sequence lengths).
    fn sweep_size(&self, py: Python<'_>) -> u64 {
        py.detach(|| lock(&self.inner).sweep_size())
    }

    /// Number of sequences in one sweep.
    fn num_sequences(&self, py: Python<'_>) -> u64 {
        py.detach(|| lock(&self.inner).num_sequences())
    }

    /// Background threads loading chunks (started at the first minibatch; 0: loaded on the calling thread).
    fn loader_threads(&self, py: Python<'_>) -> usize {
        py.detach(|| lock(&self.inner).loader_threads())
    }

    /// Number of chunks of the (joined) data.
    fn num_chunks(&self) -> usize {
        self.deserializer.chunks().len()
    }

    /// The next minibatch of about `size` samples for partition `rank` of `workers`, as
    /// `(keys, lengths, streams, end_of_sweep, end_of_run, bptt)` (see `arrays::chunk_to_py` for `keys`,
    /// `lengths` and `streams`), or None when the run is over. `bptt` is None, or with truncated BPTT
    /// `(rows, columns, fragments)`: `fragments` an int64 array `(sequences, 4)` of `[row, column, offset,
    /// sequence_len]` per sequence of the minibatch (each then a fragment of the sequence with its key).
    #[pyo3(signature = (size, workers = 1, rank = 0))]
    fn next_minibatch<'py>(
        &self,
        py: Python<'py>,
        size: u64,
        workers: u32,
        rank: u32,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let batch = py
            .detach(|| {
                crate::pool::run(|| -> Result<Option<Batch>, Error> {
                    let mut src = lock(&self.inner);
                    repartition(&self.deserializer, self.keep.as_ref(), &mut src, workers, rank)?;
                    // The arrays move to NumPy; the next batch is allocated at the size of the last one
                    // (one allocation per array instead of a doubling series).
                    let mut hint = lock_hint(&self.hint);
                    let mut batch = Batch::new(&self.streams);
                    reserve(&mut batch, &hint);
                    let more = src.next_minibatch_into(size, &mut batch)?;
                    *hint = sizes(&batch);
                    Ok(more.then_some(batch))
                })
            })
            .map_err(py_err)?;
        let Some(batch) = batch else { return Ok(None) };
        let (eos, eor) = (batch.end_of_sweep, batch.end_of_run);
        let bptt = bptt_to_py(py, batch.bptt.as_ref())?;
        let data = chunk_to_py(py, batch.data)?;
        let (keys, lengths, streams) = (data.get_item(0)?, data.get_item(1)?, data.get_item(2)?);
        Ok(Some((keys, lengths, streams, eos, eor, bptt).into_pyobject(py)?))
    }

    /// With balanced dealing: the number of sequences of sweep `sweep` this source has delivered (for its
    /// last partition; see `MinibatchSource::sequences_delivered`).
    #[pyo3(signature = (sweep = 0))]
    fn sequences_delivered(&self, py: Python<'_>, sweep: u64) -> PyResult<u64> {
        py.detach(|| crate::pool::run(|| lock(&self.inner).sequences_delivered(sweep))).map_err(py_err)
    }

    /// The checkpoint of the current position (`SourceState` JSON: version 1, or 2 with the rows of
    /// truncated BPTT).
    fn state(&self, py: Python<'_>) -> String {
        py.detach(|| lock(&self.inner).state().to_json())
    }

    /// Continues from a checkpoint (`SourceState` JSON) taken with the same data and configuration.
    fn restore(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        py.detach(|| {
            crate::pool::run(|| -> Result<(), Error> {
                let st = SourceState::from_json(state)?;
                lock(&self.inner).restore(&st)
            })
        })
        .map_err(py_err)
    }

    /// The checkpoints after each minibatch of a whole run of this source's configuration for partition
    /// `rank` of `workers` and minibatch size `size`, found by walking the sequences without reading any
    /// data, each with the number of sequences of sweep `sweep` the partition was delivered until then
    /// (with balanced dealing; None otherwise): `(SourceState JSON, count)`; the number of minibatches of
    /// the run is the length of the list. At most `limit` are returned (required for an infinite run).
    #[pyo3(signature = (size, workers = 1, rank = 0, limit = None, sweep = 0))]
    fn plan(
        &self,
        py: Python<'_>,
        size: u64,
        workers: u32,
        rank: u32,
        limit: Option<usize>,
        sweep: u64,
    ) -> PyResult<Vec<(String, Option<u64>)>> {
        py.detach(|| {
            crate::pool::run(|| -> Result<Vec<(String, Option<u64>)>, Error> {
                let config = lock(&self.inner).config().clone();
                if config.truncation_length > 0 {
                    return Err(Error::option(
                        "truncation_length",
                        "cannot plan a truncated-BPTT run (its minibatches depend on the sequences' data layout)",
                    ));
                }
                if config.run_length == RunLength::Infinite && limit.is_none() {
                    return Err(Error::option("limit", "cannot plan an infinite run without a limit"));
                }
                check_partition(rank, workers)?;
                let skeleton: Arc<dyn Deserializer> =
                    Arc::new(Skeleton { inner: self.deserializer.clone(), empty: Arc::new(ChunkData::default()) });
                // No planning thread: the counts are read from the enumerator after every minibatch.
                let config = MinibatchConfig { workers, rank, frame_mode: false, threads: Some(0), ..config };
                let counted = config.randomized() && config.balanced_workers;
                let mut src = MinibatchSource::new(skeleton, config)?;
                let mut batch = Batch::new(&[]);
                let mut out = Vec::new();
                while out.len() < limit.unwrap_or(usize::MAX) && src.next_minibatch_into(size, &mut batch)? {
                    let count = if counted { Some(src.sequences_delivered(sweep)?) } else { None };
                    out.push((src.state().to_json(), count));
                }
                Ok(out)
            })
        })
        .map_err(py_err)
    }
}

impl Source {
    /// A new minibatch source with this one's data and configuration for partition `rank` of `workers`,
    /// at the start of the run.
    pub(crate) fn fresh(&self, workers: u32, rank: u32) -> Result<MinibatchSource, Error> {
        let config = lock(&self.inner).config().clone();
        source_over(&self.deserializer, MinibatchConfig { workers, rank, ..config }, self.keep.as_ref())
    }

    /// Whether `other` reads this source's data with its configuration for partition `rank` of `workers`
    /// (what [`fresh`](Self::fresh) would make).
    pub(crate) fn same_as(&self, other: &MinibatchSource, workers: u32, rank: u32) -> bool {
        let config = lock(&self.inner).config().clone();
        Arc::ptr_eq(other.deserializer(), &self.deserializer)
            && *other.config() == MinibatchConfig { workers, rank, ..config }
    }
}
