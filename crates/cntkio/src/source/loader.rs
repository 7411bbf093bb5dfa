//! The chunk loader of a [`MinibatchSource`](super::MinibatchSource): a cache of loaded chunks, and a
//! small pool of background threads that load the chunks the source will need next.
//!
//! The source tells the loader which chunks to keep, in priority order ([`Loader::plan`]): chunks not in
//! that list are evicted (their buffers reused), missing ones are queued. It then asks for the chunks of a
//! minibatch ([`Loader::get`]), waiting for chunks being loaded and loading queued or missing ones itself.
//! Which thread loads a chunk, and when, never changes a minibatch: a chunk's data depends only on the
//! chunk, and errors are reported for the lowest failing chunk of a minibatch, when it is needed. Sources
//! whose results depend on the loading order (CTF's `maxErrors` budget) are loaded on demand only, in
//! ascending chunk order, on the caller's thread.
//!
//! Threads start at the first request, never at construction, and stop when the source is dropped.

use super::{Deserializer, SourceChunk};
use crate::Error;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// The state of a chunk in the cache.
enum Slot {
    /// Waiting in the queue.
    Queued,
    /// Being loaded by some thread; `wanted` is false once evicted (the result is then dropped).
    Loading {
        wanted: bool,
    },
    Ready(Arc<SourceChunk>),
    Failed(Error),
}

#[derive(Default)]
struct State {
    slots: HashMap<u32, Slot>,
    queue: VecDeque<u32>,
    /// Evicted chunks whose buffers a load may reuse.
    spare: Vec<SourceChunk>,
    /// At most this many spare chunks are kept, and beyond the first, at most `spare_bytes` of buffers.
    spare_cap: usize,
    spare_bytes: u64,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when work is queued (or at shutdown).
    work: Condvar,
    /// Signalled when a load finishes.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking loader never holds the lock while loading; the state stays consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The cache and its loading threads.
pub(crate) struct Loader {
    source: Arc<dyn Deserializer>,
    shared: Arc<Shared>,
    threads: usize,
    handles: Vec<JoinHandle<()>>,
    /// The process that started the threads (a forked child has none of them).
    pid: u32,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Loader")
            .field("threads", &self.threads)
            .field("started", &self.handles.len())
            .field("cached", &st.slots.len())
            .field("queued", &st.queue.len())
            .finish()
    }
}

/// Loads a chunk, turning a panic of the deserializer into an error (a loader thread must always report
/// back).
fn load(source: &dyn Deserializer, chunk: u32, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.load_source_chunk(chunk, spare))) {
        Ok(r) => r,
        Err(p) => {
            let msg = match crate::panic_message(p.as_ref()) {
                m if m.is_empty() => "unknown panic".to_string(),
                m => m,
            };
            Err(Error::internal(format!("loading chunk {chunk} panicked: {msg}")))
        }
    }
}

impl Loader {
    /// A loader with `threads` background threads (0: every chunk is loaded on the caller's thread).
    pub(crate) fn new(source: Arc<dyn Deserializer>, threads: usize) -> Loader {
        let on_demand = source.load_order_matters();
        Loader {
            source,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    spare_cap: threads.max(1),
                    spare_bytes: super::PREFETCH_BYTES_PER_THREAD.saturating_mul(threads.max(1) as u64),
                    ..State::default()
                }),
                work: Condvar::new(),
                done: Condvar::new(),
            }),
            threads: if on_demand { 0 } else { threads },
            handles: Vec::new(),
            pid: 0,
        }
    }

    /// Number of background threads (started or not).
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Number of chunks held or being loaded (for tests of the memory bound).
    pub(crate) fn cached(&self) -> usize {
        self.shared.lock().slots.len()
    }

    fn start(&mut self) {
        if self.handles.len() >= self.threads {
            return;
        }
        for i in self.handles.len()..self.threads {
            let shared = self.shared.clone();
            let source = self.source.clone();
            match std::thread::Builder::new()
                .name(format!("cntkio-loader-{i}"))
                .spawn(move || worker(&shared, &*source))
            {
                Ok(h) => self.handles.push(h),
                Err(e) => {
                    // Fewer threads (none: the caller's thread loads every chunk); never a different minibatch.
                    log::warn!("chunk loader thread {i} could not start ({e}); loading with {i} thread(s)");
                    self.threads = i;
                    break;
                }
            }
        }
        self.pid = std::process::id();
    }

    /// Keeps exactly the chunks of `keep` (distinct; most urgent first) and of `pinned`: evicts the rest
    /// and queues the missing chunks of `keep` for the background threads.
    pub(crate) fn plan(&mut self, keep: &[u32], pinned: &[u32]) {
        let wanted: HashSet<u32> = keep.iter().chain(pinned).copied().collect();
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        let mut evicted = Vec::new();
        st.slots.retain(|c, slot| {
            if wanted.contains(c) {
                return true;
            }
            match slot {
                Slot::Loading { wanted } => {
                    *wanted = false;
                    true
                }
                Slot::Ready(a) => {
                    evicted.push(a.clone());
                    false
                }
                Slot::Queued | Slot::Failed(_) => false,
            }
        });
        for a in evicted {
            if let Ok(c) = Arc::try_unwrap(a) {
                let held: usize = st.spare.iter().map(SourceChunk::buffer_len).sum();
                let fits = st.spare.is_empty() || (held + c.buffer_len()) as u64 <= st.spare_bytes;
                if st.spare.len() < st.spare_cap && c.data().is_none() && fits {
                    st.spare.push(c);
                }
            }
        }
        st.queue.clear();
        if self.threads == 0 {
            return;
        }
        for &c in keep {
            match st.slots.get(&c) {
                None => {
                    st.slots.insert(c, Slot::Queued);
                    st.queue.push_back(c);
                }
                Some(Slot::Queued) => st.queue.push_back(c),
                Some(_) => {}
            }
        }
        if !st.queue.is_empty() {
            drop(guard);
            self.start();
            self.shared.work.notify_all();
        }
    }

    /// The chunks of `needed` (sorted, distinct), loaded, into `out` in the same order. Missing chunks are
    /// queued first; the caller's thread loads queued chunks itself rather than wait. The error of the
    /// lowest failing chunk is returned (and that chunk is forgotten, so that a later call retries it).
    pub(crate) fn get(&mut self, needed: &[u32], out: &mut Vec<Arc<SourceChunk>>) -> Result<(), Error> {
        out.clear();
        if self.threads > 0 {
            let mut st = self.shared.lock();
            let mut front = Vec::new();
            for &c in needed {
                match st.slots.get(&c) {
                    None => {
                        st.slots.insert(c, Slot::Queued);
                        front.push(c);
                    }
                    Some(Slot::Queued) => front.push(c),
                    Some(_) => {}
                }
            }
            if !front.is_empty() {
                st.queue.retain(|c| !front.contains(c));
                for &c in front.iter().rev() {
                    st.queue.push_front(c);
                }
                drop(st);
                self.start();
                self.shared.work.notify_all();
            }
        }
        for &c in needed {
            out.push(self.wait(c)?);
        }
        Ok(())
    }

    /// Chunk `c`, loaded by this thread if nobody has started it.
    fn wait(&mut self, c: u32) -> Result<Arc<SourceChunk>, Error> {
        let mut st = self.shared.lock();
        loop {
            match st.slots.get(&c) {
                Some(Slot::Ready(a)) => return Ok(a.clone()),
                Some(Slot::Failed(_)) => {
                    let Some(Slot::Failed(e)) = st.slots.remove(&c) else { unreachable!() };
                    return Err(e);
                }
                Some(Slot::Loading { wanted }) => {
                    if !wanted {
                        st.slots.insert(c, Slot::Loading { wanted: true });
                    }
                    st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                Some(Slot::Queued) | None => {
                    st.queue.retain(|&q| q != c);
                    st.slots.insert(c, Slot::Loading { wanted: true });
                    let spare = st.spare.pop();
                    drop(st);
                    let r = load(&*self.source, c, spare);
                    st = self.shared.lock();
                    return match r {
                        Ok(chunk) => {
                            let a = Arc::new(chunk);
                            st.slots.insert(c, Slot::Ready(a.clone()));
                            Ok(a)
                        }
                        Err(e) => {
                            st.slots.remove(&c);
                            Err(e)
                        }
                    };
                }
            }
        }
    }
}

/// A background thread: loads queued chunks until shutdown.
fn worker(shared: &Shared, source: &dyn Deserializer) {
    let mut st = shared.lock();
    loop {
        if st.shutdown {
            return;
        }
        let Some(c) = st.queue.pop_front() else {
            st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        st.slots.insert(c, Slot::Loading { wanted: true });
        let spare = st.spare.pop();
        drop(st);
        let r = load(source, c, spare);
        st = shared.lock();
        match st.slots.get(&c) {
            Some(Slot::Loading { wanted: true }) => {
                st.slots.insert(
                    c,
                    match r {
                        Ok(chunk) => Slot::Ready(Arc::new(chunk)),
                        Err(e) => Slot::Failed(e),
                    },
                );
            }
            _ => {
                // Evicted while loading.
                st.slots.remove(&c);
                if let Ok(chunk) = r {
                    if chunk.data().is_none() && st.spare.len() < st.spare_cap {
                        st.spare.push(chunk);
                    }
                }
            }
        }
        shared.done.notify_all();
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_all();
        // In a forked child the threads do not exist: joining them would wait forever. Their handles are
        // let go.
        if std::process::id() == self.pid {
            for h in self.handles.drain(..) {
                let _ = h.join();
            }
        }
    }
}
