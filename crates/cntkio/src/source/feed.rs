//! Minibatches assembled ahead on several threads: the feed of a training loop.
//!
//! A [`Feed`] takes a [`MinibatchSource`] and runs it on threads of its own: one thread plans the
//! minibatches in the source's order ([`MinibatchSource::next_planned`]: which sequences, their chunks
//! loaded, the packer's checks made), and [`FeedConfig::threads`] threads copy the planned sequences into
//! batches, several at once. [`Feed::next_batch`] hands the batches out in order, each holding
//! [`FeedConfig::group`] consecutive minibatches one after another (fewer at the end of the run), with the
//! source's checkpoint after each. They are exactly the minibatches that [`MinibatchSource::next_minibatch`]
//! returns with the same size, whatever the number of threads, batches ahead and minibatches per batch.
//!
//! Batches are recycled: the buffers of a batch given back ([`Feed::recycle`], or a [`Recycler`] from
//! another thread) are reused by a later one, so that a steady run allocates nothing and touches no fresh
//! memory. The buffers wait in a [`BatchPool`], which a caller may keep across feeds (one per epoch, say).
//! A batch that is not given back is simply dropped.
//!
//! ```
//! use cntkio::source::{Feed, FeedConfig, MinibatchConfig, MinibatchSource, RunLength};
//! use cntkio::{CtfOptions, CtfReader, Schema, StorageFormat, StreamSpec};
//! use std::sync::Arc;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("data.ctf");
//! std::fs::write(&path, "0 |a 0\n1 |a 1\n2 |a 2\n3 |a 3\n").unwrap();
//! let schema = Schema::new(vec![StreamSpec::new("a", 1, StorageFormat::Dense)]).unwrap();
//! let reader = CtfReader::open(&path, &schema, &CtfOptions::default()).unwrap();
//! let config = MinibatchConfig { run_length: RunLength::Sweeps(1), ..MinibatchConfig::default() };
//! let source = MinibatchSource::new(Arc::new(reader), config).unwrap();
//!
//! let mut feed = Feed::start(source, FeedConfig { size: 3, threads: 2, ahead: 4, group: 1 }).unwrap();
//! let mut sequences = 0;
//! while let Some(fed) = feed.next_batch().unwrap() {
//!     sequences += fed.batch.num_sequences();
//!     feed.recycle(fed.batch);
//! }
//! assert_eq!(sequences, 4);
//! ```

use super::{Batch, BatchSizes, MinibatchSource, PlannedBatch, SourceState};
use crate::{Error, StreamSpec};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// How a [`Feed`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FeedConfig {
    /// The minibatch size asked of the source (samples, as [`MinibatchSource::next_minibatch`] takes it).
    pub size: u64,
    /// Threads copying sequences into batches (at least 1 is used).
    pub threads: usize,
    /// Batches planned, being assembled or ready ahead of the one handed out (at least 1 is used).
    pub ahead: usize,
    /// Minibatches per batch (at least 1 is used): consecutive minibatches assembled one after another in
    /// one batch, so that a consumer handles (or copies to a device) several at once. A minibatch of
    /// truncated BPTT is always alone in its batch.
    pub group: usize,
}

/// Page-locks host memory for a device, so that copies from it to the device run asynchronously (CUDA's
/// `cudaHostRegister` / `cudaHostUnregister`). A [`Feed`] started with one ([`Feed::start_pinned`]) pins
/// the buffers of its batches when they are allocated or grown, and unpins them before they are freed or
/// moved; buffers are reused, so a steady run pins nothing new.
pub trait HostPin: Send + Sync {
    /// Locks the `len` bytes at `ptr` (one whole buffer); false if that failed (the buffer then stays
    /// pageable, which changes nothing but the speed of copies from it).
    fn pin(&self, ptr: *const u8, len: usize) -> bool;
    /// Unlocks the buffer at `ptr`, locked by [`pin`](Self::pin), before it is freed or moved.
    fn unpin(&self, ptr: *const u8);
}

/// The pinning of a feed's batches: the hooks and the buffers they locked (by address).
struct Pinning {
    hooks: Arc<dyn HostPin>,
    pinned: Mutex<std::collections::HashSet<usize>>,
}

/// Bytes of spare capacity given to a pinned buffer that grows, in parts of its new size (a batch a little
/// larger than the last then fits without unpinning and pinning again).
const PINNED_HEADROOM: usize = 4;

impl Pinning {
    fn pinned(&self) -> MutexGuard<'_, std::collections::HashSet<usize>> {
        self.pinned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The buffers of `b` that leave the library (keys, declared lengths, values, sequence offsets and sparse
    /// indices): their addresses and capacities in bytes.
    fn buffers(b: &Batch) -> Vec<(usize, usize)> {
        fn of<T>(v: &Vec<T>) -> (usize, usize) {
            (v.as_ptr() as usize, v.capacity() * std::mem::size_of::<T>())
        }
        // A batch's keys and lengths are lists (`Batch::new`).
        let mut out: Vec<(usize, usize)> =
            [b.data.keys.as_list().map(of), b.data.num_samples.as_list().map(of)].into_iter().flatten().collect();
        for s in &b.data.streams {
            out.push(match &s.values {
                crate::Values::F32(v) => of(v),
                crate::Values::F64(v) => of(v),
            });
            out.push(of(&s.sequence_offsets));
            if let crate::Layout::Sparse { indices, .. } = &s.layout {
                out.push(of(indices));
            }
        }
        out.retain(|&(_, len)| len > 0);
        out
    }

    fn pin_all(&self, b: &Batch) {
        for (ptr, len) in Self::buffers(b) {
            let mut pinned = self.pinned();
            if !pinned.contains(&ptr) && self.hooks.pin(ptr as *const u8, len) {
                pinned.insert(ptr);
            }
        }
    }

    /// Unpins every pinned buffer of `b` (before it is dropped or its buffers move).
    fn unpin_all(&self, b: &Batch) {
        for (ptr, _) in Self::buffers(b) {
            if self.pinned().remove(&ptr) {
                self.hooks.unpin(ptr as *const u8);
            }
        }
    }

    /// Gives the buffers of `b` (emptied) room for a minibatch of `sizes` (with headroom), so that
    /// assembling it moves no pinned buffer; a buffer that must grow is unpinned first and pinned again
    /// after.
    fn make_room(&self, b: &mut Batch, sizes: &super::BatchSizes) {
        b.data.clear();
        let grow = |cap: usize, need: usize| cap < need;
        let mut moved =
            grow(b.data.keys.capacity(), sizes.sequences) || grow(b.data.num_samples.capacity(), sizes.sequences);
        // Dense values get at least the room `fill` reserves before copying, so that it moves nothing.
        let values = |s: &crate::StreamData, entries: usize| match s.layout {
            crate::Layout::Dense => entries.max(super::dense_reserve(sizes.declared, s.dim)),
            crate::Layout::Sparse { .. } => entries,
        };
        for (s, &(entries, _)) in b.data.streams.iter().zip(&sizes.streams) {
            moved |= grow(s.values.capacity(), values(s, entries));
            moved |= grow(s.sequence_offsets.capacity(), sizes.sequences + 1);
            if let crate::Layout::Sparse { indices, .. } = &s.layout {
                moved |= grow(indices.capacity(), entries);
            }
        }
        if !moved {
            return;
        }
        self.unpin_all(b);
        let room = |n: usize| n + n / PINNED_HEADROOM;
        b.data.keys.reserve_exact(room(sizes.sequences));
        b.data.num_samples.reserve_exact(room(sizes.sequences));
        for (s, &(entries, samples)) in b.data.streams.iter_mut().zip(&sizes.streams) {
            let n = values(s, entries);
            s.values.reserve_exact(room(n));
            s.sequence_offsets.reserve_exact(room(sizes.sequences + 1));
            if let crate::Layout::Sparse { indices, sample_offsets } = &mut s.layout {
                indices.reserve_exact(room(entries));
                sample_offsets.reserve(room(samples + 1));
            }
        }
        self.pin_all(b);
    }
}

/// One minibatch of a [`FedBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FedPart {
    /// Its sequences: the next `sequences` of the batch, after those of the parts before it.
    pub sequences: usize,
    /// The minibatch reached or crossed the end of a sweep.
    pub end_of_sweep: bool,
    /// The minibatch reached the end of the run.
    pub end_of_run: bool,
    /// The source's checkpoint after this minibatch ([`MinibatchSource::state`]): restoring it continues
    /// with the next one.
    pub state: SourceState,
}

/// Minibatches handed out by [`Feed::next_batch`].
#[derive(Debug)]
pub struct FedBatch {
    /// The minibatches' sequences, one minibatch after another ([`parts`](Self::parts) delimits them); the
    /// batch's flags are those of the last.
    pub batch: Batch,
    /// The minibatches, in order (one unless [`FeedConfig::group`] is larger).
    pub parts: Vec<FedPart>,
    /// The number of the first minibatch in the source's run (0-based, counting from where the source was
    /// when the feed started).
    pub index: u64,
}

impl FedBatch {
    /// The source's checkpoint after the last minibatch of the batch.
    pub fn state(&self) -> &SourceState {
        &self.parts.last().expect("a fed batch holds at least one minibatch").state
    }
}

/// Batches waiting for reuse, shared by the feeds that take from it and the [`Recycler`]s that give back
/// to it; with [`HostPin`] hooks, their buffers stay page-locked while they wait. Dropping the pool drops
/// the batches (unpinned first).
pub struct BatchPool {
    free: Mutex<Vec<Batch>>,
    /// At most this many batches are kept.
    cap: usize,
    pinning: Option<Pinning>,
}

impl std::fmt::Debug for BatchPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchPool").field("cap", &self.cap).field("pinned", &self.pinning.is_some()).finish()
    }
}

impl BatchPool {
    /// A pool keeping at most `cap` batches, their buffers page-locked by `pin` if given.
    pub fn new(cap: usize, pin: Option<Arc<dyn HostPin>>) -> Arc<BatchPool> {
        Arc::new(BatchPool {
            free: Mutex::new(Vec::new()),
            cap,
            pinning: pin.map(|hooks| Pinning { hooks, pinned: Mutex::default() }),
        })
    }

    fn free(&self) -> MutexGuard<'_, Vec<Batch>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> Option<Batch> {
        self.free().pop()
    }

    /// Keeps `batch` for reuse, or drops it (its buffers unpinned) when the pool is full.
    fn give(&self, batch: Batch) {
        let mut free = self.free();
        if free.len() < self.cap {
            free.push(batch);
            return;
        }
        drop(free);
        if let Some(p) = &self.pinning {
            p.unpin_all(&batch);
        }
    }
}

impl Drop for BatchPool {
    fn drop(&mut self) {
        if let Some(p) = &self.pinning {
            for b in self.free.get_mut().unwrap_or_else(|e| e.into_inner()).iter() {
                p.unpin_all(b);
            }
        }
    }
}

/// Gives batches back to a [`BatchPool`] from any thread, also after the feed is gone.
#[derive(Clone, Debug)]
pub struct Recycler(Arc<BatchPool>);

impl Recycler {
    /// Gives `batch` back for reuse by a later minibatch (dropped if the pool is full).
    pub fn recycle(&self, batch: Batch) {
        self.0.give(batch);
    }
}

/// Planned minibatches waiting for an assembling thread, with their checkpoints.
struct Job {
    index: u64,
    plans: Vec<(PlannedBatch, SourceState)>,
}

/// An assembled batch and its minibatches.
type Assembled = (Batch, Vec<FedPart>);

#[derive(Default)]
struct State {
    /// Plans waiting for an assembling thread.
    queue: VecDeque<Job>,
    /// Assembled batches (and the planner's error) by number.
    ready: BTreeMap<u64, Result<Assembled, Error>>,
    /// Batches planned (the number of the next).
    planned: u64,
    /// Batches handed out (the number of the next).
    taken: u64,
    /// The number at which the run ends (no batch there or after it).
    end: Option<u64>,
    /// The feed is being dropped.
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    pool: Arc<BatchPool>,
    /// Signalled when a plan is queued, and at the end or stop: assembling threads wait on it.
    work: Condvar,
    /// Signalled when a batch is handed out, and at stop: the planning thread waits on it for room.
    room: Condvar,
    /// Signalled when a batch is ready or the run ends: the consumer waits on it.
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No thread panics while holding the lock (assembling runs outside it); the state stays consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Batches assembled but never handed out go back to the pool.
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, r) in std::mem::take(&mut st.ready) {
            if let Ok((b, _)) = r {
                self.pool.give(b);
            }
        }
    }
}

/// Minibatches of a [`MinibatchSource`] planned and assembled ahead on threads of their own (see the
/// module docs).
pub struct Feed {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    streams: Vec<StreamSpec>,
    /// The source's data, whose maps are checked as each batch is handed out.
    data: Arc<dyn super::Deserializer>,
    /// The process that started the threads (a forked child has none and must not join them).
    pid: u32,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Feed").field("threads", &self.handles.len()).field("taken", &st.taken).finish()
    }
}

impl Feed {
    /// Starts planning and assembling minibatches of `config.size` samples from where `source` is, with a
    /// pool of its own.
    ///
    /// Errors: a size of 0, or threads that cannot be started (the operating system's error).
    pub fn start(source: MinibatchSource, config: FeedConfig) -> Result<Feed, Error> {
        let cap = config.ahead.max(1) + config.threads.max(1) + 2;
        Self::start_with_pool(source, config, BatchPool::new(cap, None))
    }

    /// As [`start`](Self::start), with batches reused from `pool` (and page-locked by its hooks, if any).
    /// With pinning, give every batch back ([`recycle`](Self::recycle) or a [`Recycler`]): that unpins the
    /// buffers of a batch the pool does not keep; a pinned batch dropped otherwise stays locked.
    pub fn start_with_pool(source: MinibatchSource, config: FeedConfig, pool: Arc<BatchPool>) -> Result<Feed, Error> {
        if config.size == 0 {
            return Err(super::zero_minibatch_size());
        }
        let threads = config.threads.max(1);
        let ahead = config.ahead.max(1) as u64;
        let group = config.group.max(1);
        let streams = source.streams().to_vec();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            pool,
            work: Condvar::new(),
            room: Condvar::new(),
            ready: Condvar::new(),
        });
        let mut feed = Feed {
            shared: shared.clone(),
            handles: Vec::new(),
            streams: streams.clone(),
            data: source.deserializer().clone(),
            pid: std::process::id(),
        };
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| Error::io("start a minibatch feed thread".to_string(), e))
        };
        for i in 0..threads {
            let (sh, st) = (shared.clone(), streams.clone());
            let h = spawn(format!("cntkio-feed-{i}"), Box::new(move || assemble(&sh, &st)))?;
            feed.handles.push(h);
        }
        let sh = shared.clone();
        let size = config.size;
        let h = spawn("cntkio-feed-plan".into(), Box::new(move || plan(source, size, ahead, group, &sh)))?;
        feed.handles.push(h);
        Ok(feed)
    }

    /// The streams of the batches (the source's [`streams`](MinibatchSource::streams)).
    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }

    /// The next batch of minibatches, waiting for it; `None` when the run is over (and after an error).
    ///
    /// Errors: those of [`MinibatchSource::next_minibatch`], after the minibatches before the failing one
    /// (a batch then holds fewer than [`FeedConfig::group`]).
    pub fn next_batch(&mut self) -> Result<Option<FedBatch>, Error> {
        let mut st = self.shared.lock();
        loop {
            let taken = st.taken;
            if let Some(r) = st.ready.remove(&taken) {
                // A file that shrank under its map is the cause of whatever the batch holds or failed with.
                let r = self.data.check_maps().and(r);
                st.taken += 1;
                if r.is_err() {
                    st.end = Some(st.taken);
                }
                drop(st);
                self.shared.room.notify_one();
                let (batch, parts) = r?;
                let index = parts[0].state.minibatches - 1;
                return Ok(Some(FedBatch { batch, parts, index }));
            }
            if st.end.is_some_and(|e| taken >= e) {
                return Ok(None);
            }
            st = self.shared.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Gives `batch` back for reuse by a later batch.
    pub fn recycle(&self, batch: Batch) {
        self.shared.pool.give(batch);
    }

    /// A handle that gives batches back from any thread.
    pub fn recycler(&self) -> Recycler {
        Recycler(self.shared.pool.clone())
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        self.shared.room.notify_all();
        if std::process::id() == self.pid {
            for h in self.handles.drain(..) {
                let _ = h.join();
            }
        }
        // In a forked child the threads do not exist: joining them would wait forever.
    }
}

/// The planning thread: plans batches of up to `group` minibatches in order while fewer than `ahead`
/// batches are not yet handed out.
fn plan(mut source: MinibatchSource, size: u64, ahead: u64, group: usize, shared: &Shared) {
    // A minibatch of truncated BPTT planned while a group was being filled: it starts the next batch.
    let mut carried: Option<(PlannedBatch, SourceState)> = None;
    let mut over = false;
    while !over {
        {
            let mut st = shared.lock();
            while !st.stop && st.planned - st.taken >= ahead {
                st = shared.room.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.stop {
                return;
            }
        }
        let mut plans: Vec<(PlannedBatch, SourceState)> = carried.take().into_iter().collect();
        let mut error = None;
        while plans.len() < group && !plans.first().is_some_and(|(p, _)| p.is_ready()) {
            let planned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.next_planned(size)))
                .unwrap_or_else(|_| Err(Error::internal("planning a minibatch panicked")));
            match planned {
                Ok(p) if p.is_end() => {
                    over = true;
                    break;
                }
                Ok(p) if p.is_ready() && !plans.is_empty() => {
                    carried = Some((p, source.state()));
                    break;
                }
                Ok(p) => plans.push((p, source.state())),
                Err(e) => {
                    error = Some(e);
                    over = true;
                    break;
                }
            }
        }
        let mut st = shared.lock();
        if !plans.is_empty() {
            let index = st.planned;
            st.planned += 1;
            st.queue.push_back(Job { index, plans });
        }
        if let Some(e) = error {
            let index = st.planned;
            st.planned += 1;
            st.ready.insert(index, Err(e));
        }
        if over {
            st.end = Some(st.planned);
            drop(st);
            shared.work.notify_all();
            shared.ready.notify_all();
        } else {
            drop(st);
            shared.work.notify_one();
        }
    }
}

/// Assembles the minibatches of `plans` one after another into `batch` (emptied first).
fn assemble_job(
    pool: &BatchPool,
    streams: &[StreamSpec],
    plans: Vec<(PlannedBatch, SourceState)>,
    batch: &mut Batch,
) -> Vec<FedPart> {
    match &pool.pinning {
        Some(p) if plans.iter().any(|(q, _)| q.is_ready()) => {
            // Assembled already (truncated BPTT, alone in its batch): its buffers replace the batch's.
            p.unpin_all(batch);
        }
        Some(p) => {
            let mut sizes = BatchSizes::default();
            for (q, _) in &plans {
                sizes.add(&q.sizes());
            }
            p.make_room(batch, &sizes);
        }
        None => {}
    }
    let mut parts = Vec::with_capacity(plans.len());
    let mut first = true;
    for (q, state) in plans {
        let before = if first { 0 } else { batch.num_sequences() };
        if first {
            q.assemble_into(streams, batch);
            first = false;
        } else {
            let appended = q.append_to(streams, batch);
            debug_assert!(appended, "a group holds minibatches that can be appended");
        }
        parts.push(FedPart {
            sequences: batch.num_sequences() - before,
            end_of_sweep: batch.end_of_sweep,
            end_of_run: batch.end_of_run,
            state,
        });
    }
    if let Some(p) = pool.pinning.as_ref().filter(|_| batch.bptt.is_some()) {
        // The buffers of a minibatch assembled already (those made room for are pinned).
        p.pin_all(batch);
    }
    parts
}

/// An assembling thread: copies planned minibatches into batches (reused from the pool) until the run
/// ends or the feed stops.
fn assemble(shared: &Shared, streams: &[StreamSpec]) {
    loop {
        let job = {
            let mut st = shared.lock();
            loop {
                if st.stop {
                    return;
                }
                if let Some(job) = st.queue.pop_front() {
                    break job;
                }
                if st.end.is_some() {
                    return;
                }
                st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Job { index, plans } = job;
        let mut batch = shared.pool.take().unwrap_or_else(|| Batch::new(streams));
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let parts = assemble_job(&shared.pool, streams, plans, &mut batch);
            (batch, parts)
        }))
        .map_err(|_| Error::internal("assembling a minibatch panicked"));
        let mut st = shared.lock();
        st.ready.insert(index, done);
        drop(st);
        shared.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{MinibatchConfig, RunLength};
    use crate::{CtfOptions, CtfReader, Schema, StorageFormat, StreamSpec};

    fn source(dir: &std::path::Path, rows: usize, config: MinibatchConfig) -> MinibatchSource {
        let path = dir.join("data.ctf");
        let mut text = String::new();
        for i in 0..rows {
            // Sequences of 1–3 rows.
            for r in 0..=(i % 3) {
                text.push_str(&format!("{i} |a {} {} |b {}:1\n", i, r, (i * 7 + r) % 5));
            }
        }
        std::fs::write(&path, text).unwrap();
        let schema = Schema::new(vec![
            StreamSpec::new("a", 2, StorageFormat::Dense),
            StreamSpec::new("b", 5, StorageFormat::Sparse),
        ])
        .unwrap();
        let options = CtfOptions { chunk_size: 256, ..CtfOptions::default() };
        let reader = CtfReader::open(&path, &schema, &options).unwrap();
        MinibatchSource::new(Arc::new(reader), config).unwrap()
    }

    fn config() -> MinibatchConfig {
        MinibatchConfig {
            run_length: RunLength::Sweeps(2),
            window: crate::randomize::Window::Chunks(3),
            seed: 7,
            ..MinibatchConfig::default()
        }
    }

    /// The minibatches of `batches` one after another in one batch, with the flags of the last.
    fn concat(streams: &[StreamSpec], batches: &[Batch]) -> Batch {
        let mut out = Batch::new(streams);
        for b in batches {
            out.data.keys.extend(b.data.keys.iter());
            out.data.num_samples.extend(b.data.num_samples.iter());
            for (d, s) in out.data.streams.iter_mut().zip(&b.data.streams) {
                for i in 0..s.num_sequences() {
                    crate::source::append_sequence(d, s, i);
                }
            }
            out.end_of_sweep = b.end_of_sweep;
            out.end_of_run = b.end_of_run;
        }
        out
    }

    #[test]
    fn feeds_the_minibatches_of_the_source_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut want = Vec::new();
        let mut src = source(dir.path(), 200, config());
        let streams = src.streams().to_vec();
        while let Some(b) = src.next_minibatch(17).unwrap() {
            want.push((b, src.state()));
        }
        assert!(want.len() > 20);
        for (threads, ahead, group) in [(1, 1, 1), (2, 1, 1), (3, 5, 1), (4, 64, 1), (2, 3, 4), (3, 2, 7)] {
            let config = FeedConfig { size: 17, threads, ahead, group };
            let mut feed = Feed::start(source(dir.path(), 200, self::config()), config).unwrap();
            let mut next = 0;
            while let Some(f) = feed.next_batch().unwrap() {
                assert_eq!(f.index as usize, next);
                let n = f.parts.len();
                assert!(n == group || next + n == want.len(), "{n} minibatches in a batch of up to {group}");
                let parts = &want[next..next + n];
                let wanted: Vec<Batch> = parts.iter().map(|(b, _)| b.clone()).collect();
                assert!(f.batch == concat(&streams, &wanted), "threads {threads}, ahead {ahead}, batch at {next}");
                for (p, (b, st)) in f.parts.iter().zip(parts) {
                    assert_eq!(
                        (p.sequences, p.end_of_sweep, p.end_of_run),
                        (b.num_sequences(), b.end_of_sweep, b.end_of_run)
                    );
                    assert_eq!(&p.state, st);
                }
                next += n;
                // Half the batches go back to the pool: reused buffers must give the same minibatches.
                if next % 2 == 0 {
                    feed.recycle(f.batch);
                }
            }
            assert_eq!(next, want.len());
            assert!(feed.next_batch().unwrap().is_none(), "the end stays the end");
        }
    }

    #[test]
    fn reports_an_error_after_the_minibatches_before_it() {
        let dir = tempfile::tempdir().unwrap();
        // Frame mode with sequences of up to 3 samples: the first minibatch holding a longer one fails.
        let cfg = MinibatchConfig { frame_mode: true, randomize: false, ..config() };
        let mut src = source(dir.path(), 200, cfg.clone());
        let mut before = 0;
        let want = loop {
            match src.next_minibatch(1) {
                Ok(Some(_)) => before += 1,
                Ok(None) => panic!("no error"),
                Err(e) => break e.to_string(),
            }
        };
        for group in [1, 3] {
            let config = FeedConfig { size: 1, threads: 3, ahead: 8, group };
            let mut feed = Feed::start(source(dir.path(), 200, cfg.clone()), config).unwrap();
            let mut got = 0;
            let err = loop {
                match feed.next_batch() {
                    Ok(Some(f)) => got += f.parts.len(),
                    Ok(None) => panic!("no error"),
                    Err(e) => break e.to_string(),
                }
            };
            assert_eq!((got, err), (before, want.clone()));
            assert!(feed.next_batch().unwrap().is_none());
        }
    }

    /// Pins by recording addresses; fails the test on a double pin or an unpin of what is not pinned.
    #[derive(Default)]
    struct Recorder {
        pinned: Mutex<std::collections::HashMap<usize, usize>>,
        pins: std::sync::atomic::AtomicUsize,
        errors: Mutex<Vec<String>>,
    }

    impl HostPin for Recorder {
        fn pin(&self, ptr: *const u8, len: usize) -> bool {
            self.pins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.pinned.lock().unwrap().insert(ptr as usize, len).is_some() {
                self.errors.lock().unwrap().push(format!("{ptr:?} pinned twice"));
            }
            true
        }
        fn unpin(&self, ptr: *const u8) {
            if self.pinned.lock().unwrap().remove(&(ptr as usize)).is_none() {
                self.errors.lock().unwrap().push(format!("{ptr:?} unpinned but not pinned"));
            }
        }
    }

    #[test]
    fn pinned_batches_keep_their_buffers_pinned_until_freed() {
        let dir = tempfile::tempdir().unwrap();
        let mut want = Vec::new();
        let mut src = source(dir.path(), 300, config());
        while let Some(b) = src.next_minibatch(23).unwrap() {
            want.push(b);
        }
        let rec = Arc::new(Recorder::default());
        let mut kept = Vec::new();
        {
            let feed_source = source(dir.path(), 300, config());
            let config = FeedConfig { size: 23, threads: 3, ahead: 4, group: 2 };
            let pool = BatchPool::new(6, Some(rec.clone()));
            let mut feed = Feed::start_with_pool(feed_source, config, pool).unwrap();
            let recycler = feed.recycler();
            let mut got = 0;
            let streams = feed.streams().to_vec();
            while let Some(f) = feed.next_batch().unwrap() {
                let n = f.parts.len();
                assert!(f.batch == concat(&streams, &want[got..got + n]), "batch at {got}");
                let pinned = rec.pinned.lock().unwrap().clone();
                for (ptr, len) in Pinning::buffers(&f.batch) {
                    assert_eq!(pinned.get(&ptr), Some(&len), "batch {got}: a buffer is not pinned as it is");
                }
                got += n;
                // Keep some batches past the feed's end; give the rest back.
                if got % 4 == 0 {
                    kept.push(f.batch);
                } else {
                    feed.recycle(f.batch);
                }
            }
            assert_eq!(got, want.len());
            drop(feed);
            for b in kept.drain(..) {
                recycler.recycle(b);
            }
        }
        assert!(rec.errors.lock().unwrap().is_empty(), "{:?}", rec.errors.lock().unwrap());
        assert!(rec.pinned.lock().unwrap().is_empty(), "every pinned buffer is unpinned once freed");
        // Reused buffers are not pinned again: far fewer pins than buffers handed out.
        let pins = rec.pins.load(std::sync::atomic::Ordering::Relaxed);
        assert!(pins < want.len() * 4, "{pins} pins for {} batches", want.len());
    }

    #[test]
    fn truncated_bptt_minibatches_come_one_per_batch() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = MinibatchConfig { truncation_length: 2, ..config() };
        let mut want = Vec::new();
        let mut src = source(dir.path(), 120, cfg.clone());
        while let Some(b) = src.next_minibatch(6).unwrap() {
            want.push((b, src.state()));
        }
        let rec = Arc::new(Recorder::default());
        {
            let pool = BatchPool::new(4, Some(rec.clone()));
            let config = FeedConfig { size: 6, threads: 2, ahead: 3, group: 3 };
            let mut feed = Feed::start_with_pool(source(dir.path(), 120, cfg), config, pool).unwrap();
            let mut got = 0;
            while let Some(f) = feed.next_batch().unwrap() {
                assert_eq!(f.parts.len(), 1);
                assert!(f.batch == want[got].0 && f.state() == &want[got].1, "minibatch {got}");
                got += 1;
                feed.recycle(f.batch);
            }
            assert_eq!(got, want.len());
        }
        assert!(rec.errors.lock().unwrap().is_empty(), "{:?}", rec.errors.lock().unwrap());
        assert!(rec.pinned.lock().unwrap().is_empty());
    }

    #[test]
    fn a_feed_dropped_early_stops_its_threads() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = MinibatchConfig { run_length: RunLength::Infinite, ..config() };
        let config = FeedConfig { size: 5, threads: 2, ahead: 3, group: 2 };
        let mut feed = Feed::start(source(dir.path(), 50, cfg), config).unwrap();
        let recycler = feed.recycler();
        let b = feed.next_batch().unwrap().unwrap();
        drop(feed);
        // Giving a batch back after the feed is gone drops it.
        recycler.recycle(b.batch);
    }
}
