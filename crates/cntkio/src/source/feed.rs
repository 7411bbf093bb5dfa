//! Minibatches assembled ahead on several threads: the feed of a training loop.
//!
//! A [`Feed`] takes a [`MinibatchSource`] and runs it on threads of its own: one thread plans the
//! minibatches in the source's order ([`MinibatchSource::next_planned`]: which sequences, their chunks
//! loaded, the packer's checks made), and [`FeedConfig::threads`] threads copy the planned sequences into
//! batches, several minibatches at once. [`Feed::next_batch`] hands the batches out in order, each with the
//! source's checkpoint after it. They are exactly the minibatches that [`MinibatchSource::next_minibatch`]
//! returns with the same size, whatever the number of threads and batches ahead.
//!
//! Batches are recycled: the buffers of a batch given back ([`Feed::recycle`], or a [`Recycler`] from
//! another thread) are reused by a later one, so that a steady run allocates nothing and touches no fresh
//! memory. A batch that is not given back is simply dropped.
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
//! let mut feed = Feed::start(source, FeedConfig { size: 3, threads: 2, ahead: 4 }).unwrap();
//! let mut sequences = 0;
//! while let Some(fed) = feed.next_batch().unwrap() {
//!     sequences += fed.batch.num_sequences();
//!     feed.recycle(fed.batch);
//! }
//! assert_eq!(sequences, 4);
//! ```

use super::{Batch, MinibatchSource, PlannedBatch, SourceState};
use crate::{Error, StreamSpec};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

/// How a [`Feed`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FeedConfig {
    /// The minibatch size asked of the source (samples, as [`MinibatchSource::next_minibatch`] takes it).
    pub size: u64,
    /// Threads copying sequences into batches (at least 1 is used).
    pub threads: usize,
    /// Minibatches planned, being assembled or ready ahead of the one handed out (at least 1 is used).
    pub ahead: usize,
}

/// A minibatch handed out by [`Feed::next_batch`].
#[derive(Debug)]
pub struct FedBatch {
    /// The minibatch.
    pub batch: Batch,
    /// The source's checkpoint after this minibatch ([`MinibatchSource::state`]): restoring it continues
    /// with the next one.
    pub state: SourceState,
    /// The number of the minibatch in the source's run (0-based, counting from where the source was when
    /// the feed started).
    pub index: u64,
}

/// A plan waiting for an assembling thread.
struct Job {
    index: u64,
    plan: PlannedBatch,
    state: SourceState,
}

#[derive(Default)]
struct State {
    /// Plans waiting for an assembling thread.
    queue: VecDeque<Job>,
    /// Assembled minibatches (and the planner's error) by index.
    ready: BTreeMap<u64, Result<(Batch, SourceState), Error>>,
    /// Batches given back, for reuse.
    pool: Vec<Batch>,
    /// At most this many batches are kept in `pool`.
    pool_cap: usize,
    /// Plans made (the index of the next plan).
    planned: u64,
    /// Minibatches handed out (the index of the next one).
    taken: u64,
    /// The index at which the run ends (no minibatch there or after it).
    end: Option<u64>,
    /// The feed is being dropped.
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a plan is queued, and at the end or stop: assembling threads wait on it.
    work: Condvar,
    /// Signalled when a minibatch is handed out, and at stop: the planning thread waits on it for room.
    room: Condvar,
    /// Signalled when a minibatch is ready or the run ends: the consumer waits on it.
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No thread panics while holding the lock (assembling runs outside it); the state stays consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Gives batches back to a [`Feed`]'s pool from any thread, also after the feed is gone (the batch is
/// then dropped).
#[derive(Clone)]
pub struct Recycler(Weak<Shared>);

impl Recycler {
    /// Gives `batch` back for reuse by a later minibatch (dropped if the pool is full or the feed is gone).
    pub fn recycle(&self, batch: Batch) {
        if let Some(shared) = self.0.upgrade() {
            let mut st = shared.lock();
            if st.pool.len() < st.pool_cap {
                st.pool.push(batch);
            }
        }
    }
}

impl std::fmt::Debug for Recycler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recycler")
    }
}

/// Minibatches of a [`MinibatchSource`] planned and assembled ahead on threads of their own (see the
/// module docs).
pub struct Feed {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    streams: Vec<StreamSpec>,
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
    /// Starts planning and assembling minibatches of `config.size` samples from where `source` is.
    ///
    /// Errors: a size of 0, or threads that cannot be started (the operating system's error).
    pub fn start(source: MinibatchSource, config: FeedConfig) -> Result<Feed, Error> {
        if config.size == 0 {
            return Err(Error::config("Requested minibatch size must be > 0."));
        }
        let threads = config.threads.max(1);
        let ahead = config.ahead.max(1);
        let streams = source.streams().to_vec();
        let shared = Arc::new(Shared {
            state: Mutex::new(State { pool_cap: ahead + threads + 2, ..State::default() }),
            work: Condvar::new(),
            room: Condvar::new(),
            ready: Condvar::new(),
        });
        let mut feed =
            Feed { shared: shared.clone(), handles: Vec::new(), streams: streams.clone(), pid: std::process::id() };
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
        let h = spawn("cntkio-feed-plan".into(), Box::new(move || plan(source, size, ahead as u64, &sh)))?;
        feed.handles.push(h);
        Ok(feed)
    }

    /// The streams of the batches (the source's [`streams`](MinibatchSource::streams)).
    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }

    /// The next minibatch, waiting for it; `None` when the run is over (and after an error).
    ///
    /// Errors: those of [`MinibatchSource::next_minibatch`], in the place where it would report them (the
    /// minibatches before are handed out first).
    pub fn next_batch(&mut self) -> Result<Option<FedBatch>, Error> {
        let mut st = self.shared.lock();
        loop {
            let taken = st.taken;
            if let Some(r) = st.ready.remove(&taken) {
                st.taken += 1;
                if r.is_err() {
                    st.end = Some(st.taken);
                }
                drop(st);
                self.shared.room.notify_one();
                let (batch, state) = r?;
                return Ok(Some(FedBatch { batch, state, index: taken }));
            }
            if st.end.is_some_and(|e| taken >= e) {
                return Ok(None);
            }
            st = self.shared.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Gives `batch` back for reuse by a later minibatch.
    pub fn recycle(&self, batch: Batch) {
        self.recycler().recycle(batch);
    }

    /// A handle that gives batches back from any thread.
    pub fn recycler(&self) -> Recycler {
        Recycler(Arc::downgrade(&self.shared))
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

/// The planning thread: plans minibatches in order while fewer than `ahead` are not yet handed out.
fn plan(mut source: MinibatchSource, size: u64, ahead: u64, shared: &Shared) {
    loop {
        {
            let mut st = shared.lock();
            while !st.stop && st.planned - st.taken >= ahead {
                st = shared.room.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.stop {
                return;
            }
        }
        let planned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.next_planned(size)))
            .unwrap_or_else(|_| Err(Error::config("internal error: planning a minibatch panicked")));
        let mut st = shared.lock();
        let index = st.planned;
        st.planned += 1;
        match planned {
            Ok(p) if p.is_end() => {
                st.end = Some(index);
                drop(st);
                shared.work.notify_all();
                shared.ready.notify_all();
                return;
            }
            Ok(plan) => {
                st.queue.push_back(Job { index, plan, state: source.state() });
                drop(st);
                shared.work.notify_one();
            }
            Err(e) => {
                st.ready.insert(index, Err(e));
                st.end = Some(index + 1);
                drop(st);
                shared.work.notify_all();
                shared.ready.notify_all();
                return;
            }
        }
    }
}

/// An assembling thread: copies planned minibatches into batches (reused from the pool) until the run
/// ends or the feed stops.
fn assemble(shared: &Shared, streams: &[StreamSpec]) {
    loop {
        let (job, spare) = {
            let mut st = shared.lock();
            loop {
                if st.stop {
                    return;
                }
                if let Some(job) = st.queue.pop_front() {
                    let spare = st.pool.pop();
                    break (job, spare);
                }
                if st.end.is_some() {
                    return;
                }
                st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Job { index, plan, state } = job;
        let mut batch = spare.unwrap_or_else(|| Batch::new(streams));
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            plan.assemble_into(streams, &mut batch);
            batch
        }))
        .map(|b| (b, state))
        .map_err(|_| Error::config("internal error: assembling a minibatch panicked"));
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

    #[test]
    fn feeds_the_minibatches_of_the_source_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut want = Vec::new();
        let mut src = source(dir.path(), 200, config());
        while let Some(b) = src.next_minibatch(17).unwrap() {
            want.push((b, src.state()));
        }
        assert!(want.len() > 20);
        for (threads, ahead) in [(1, 1), (2, 1), (3, 5), (4, 64)] {
            let mut feed =
                Feed::start(source(dir.path(), 200, config()), FeedConfig { size: 17, threads, ahead }).unwrap();
            let mut got = Vec::new();
            while let Some(f) = feed.next_batch().unwrap() {
                assert_eq!(f.index as usize, got.len());
                got.push((f.batch.clone(), f.state));
                // Half the batches go back to the pool: reused buffers must give the same minibatches.
                if got.len() % 2 == 0 {
                    feed.recycle(f.batch);
                }
            }
            assert!(got == want, "threads {threads}, ahead {ahead}");
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
        let mut feed = Feed::start(source(dir.path(), 200, cfg), FeedConfig { size: 1, threads: 3, ahead: 8 }).unwrap();
        for _ in 0..before {
            assert!(feed.next_batch().unwrap().is_some());
        }
        assert_eq!(feed.next_batch().unwrap_err().to_string(), want);
        assert!(feed.next_batch().unwrap().is_none());
    }

    #[test]
    fn a_feed_dropped_early_stops_its_threads() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = MinibatchConfig { run_length: RunLength::Infinite, ..config() };
        let mut feed = Feed::start(source(dir.path(), 50, cfg), FeedConfig { size: 5, threads: 2, ahead: 3 }).unwrap();
        let recycler = feed.recycler();
        let b = feed.next_batch().unwrap().unwrap();
        drop(feed);
        // Giving a batch back after the feed is gone drops it.
        recycler.recycle(b.batch);
    }
}
