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
//!
//! A loader may be given a [`ChunkKeep`], where the chunks it lets go of wait for the next source over the
//! same deserializer (the next epoch of a training loop) instead of being freed.

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
    shutdown: bool,
    /// Bytes of the `Ready` chunks.
    live: u64,
    keep: Option<Arc<ChunkKeep>>,
}

impl State {
    /// Records chunk `c`, loaded (or taken from the keep), as ready.
    fn ready(&mut self, c: u32, chunk: Arc<SourceChunk>) {
        self.live += chunk.heap_bytes() as u64;
        self.slots.insert(c, Slot::Ready(chunk));
        if let Some(keep) = &self.keep {
            // Dropped here, they give their buffers to the spares (if nothing else holds them).
            drop(keep.lock().grown(self.live));
        }
    }

    /// The chunk `c` from the keep, if it has it, recorded as ready.
    fn take_kept(&mut self, c: u32) -> Option<Arc<SourceChunk>> {
        let chunk = self.keep.as_ref()?.lock().take(c)?;
        self.ready(c, chunk.clone());
        Some(chunk)
    }

    /// Whether chunk `c` goes into the queue: queued already, or neither held, being loaded nor kept (a
    /// kept one is taken from the keep instead). Marks it queued.
    fn needs_queueing(&mut self, c: u32) -> bool {
        let queue = match self.slots.get(&c) {
            None => self.take_kept(c).is_none(),
            Some(Slot::Queued) => true,
            Some(_) => false,
        };
        if queue {
            self.slots.insert(c, Slot::Queued);
        }
        queue
    }

    /// Chunk `chunk`, evicted: into the keep, or its buffer kept for a later load if nothing else holds it.
    fn evicted(&mut self, c: u32, chunk: Arc<SourceChunk>) {
        self.live = self.live.saturating_sub(chunk.heap_bytes() as u64);
        match &self.keep {
            Some(keep) => keep.lock().put(c, chunk),
            // Its buffer goes to the spares when the last holder (perhaps a minibatch being assembled)
            // lets go of it.
            None => drop(chunk),
        }
    }
}

/// Buffers of chunks no longer needed, for later loads to read into: memory already faulted in, where a
/// fresh buffer would take a page fault (and a zeroed page) every 4 KiB. A chunk of a loader gives its
/// buffer here when it is dropped, by whoever held it last: often a minibatch assembled after the chunk
/// left the window.
pub(crate) struct Spares {
    chunks: Mutex<Vec<SourceChunk>>,
    /// At most this many spare chunks are kept, and beyond the first, at most `bytes` of buffers.
    cap: usize,
    bytes: u64,
}

impl Spares {
    fn lock(&self) -> MutexGuard<'_, Vec<SourceChunk>> {
        self.chunks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `chunk`'s buffer if there is room (else it is freed).
    pub(crate) fn offer(&self, chunk: SourceChunk) {
        let mut spare = self.lock();
        let held: usize = spare.iter().map(SourceChunk::buffer_len).sum();
        let fits = spare.is_empty() || (held + chunk.buffer_len()) as u64 <= self.bytes;
        if spare.len() < self.cap && chunk.buffer_len() > 0 && fits {
            spare.push(chunk);
        }
    }

    fn take(&self) -> Option<SourceChunk> {
        self.lock().pop()
    }
}

/// Chunks kept from one minibatch source to the next over the same deserializer, so that the epochs of a
/// training loop — each a source of its own — load a chunk once rather than once per epoch.
///
/// A source that uses a keep ([`MinibatchSource::keep_chunks`](super::MinibatchSource::keep_chunks)) takes a
/// chunk from it rather than load it, puts there the chunks it evicts, and leaves there all it holds when it
/// is dropped. The chunks kept and those a source holds never add up to more bytes than the most any source
/// of this keep held at once (the oldest kept go first), so that every chunk of a data set that a window
/// covers stays loaded from one epoch to the next, and memory stays at an epoch's peak. A keep holds the
/// chunks of one deserializer (one `Arc`): given to a source over another, it lets go of its chunks first. A
/// chunk's data depends only on the chunk, so a keep never changes a minibatch.
#[derive(Default)]
pub struct ChunkKeep {
    state: Mutex<Kept>,
}

impl std::fmt::Debug for ChunkKeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let k = self.lock();
        f.debug_struct("ChunkKeep").field("chunks", &k.chunks.len()).field("bytes", &k.bytes).finish()
    }
}

#[derive(Default)]
struct Kept {
    /// The deserializer whose chunks these are (held, so that no other takes its address).
    owner: Option<Arc<dyn Deserializer>>,
    /// Chunk → (chunk, its bytes, when it was kept).
    chunks: HashMap<u32, (Arc<SourceChunk>, u64, u64)>,
    /// `(chunk, when it was kept)`, oldest first; entries no longer in `chunks` are skipped.
    order: VecDeque<(u32, u64)>,
    clock: u64,
    bytes: u64,
    /// The most bytes of chunks a source of this keep has held at once.
    peak: u64,
}

impl ChunkKeep {
    /// An empty keep.
    pub fn new() -> Arc<ChunkKeep> {
        Arc::new(ChunkKeep::default())
    }

    fn lock(&self) -> MutexGuard<'_, Kept> {
        // Nothing panics while holding the lock; the state stays consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of chunks kept.
    pub fn len(&self) -> usize {
        self.lock().chunks.len()
    }

    /// Whether no chunk is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the chunks kept.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// The most bytes of chunks a source of this keep has held at once: what the keep and a source hold
    /// together never exceed.
    pub fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// Makes the keep hold chunks of `source`: emptied if it held another deserializer's.
    pub(crate) fn bind(&self, source: &Arc<dyn Deserializer>) {
        let mut k = self.lock();
        if !k.owner.as_ref().is_some_and(|o| Arc::ptr_eq(o, source)) {
            *k = Kept { owner: Some(source.clone()), ..Kept::default() };
        }
    }
}

impl Kept {
    fn take(&mut self, c: u32) -> Option<Arc<SourceChunk>> {
        let (chunk, bytes, _) = self.chunks.remove(&c)?;
        self.bytes -= bytes;
        Some(chunk)
    }

    fn put(&mut self, c: u32, chunk: Arc<SourceChunk>) {
        let bytes = chunk.heap_bytes() as u64;
        self.clock += 1;
        if let Some((_, old, _)) = self.chunks.insert(c, (chunk, bytes, self.clock)) {
            self.bytes -= old;
        }
        self.order.push_back((c, self.clock));
        self.bytes += bytes;
        if self.order.len() > 2 * self.chunks.len() + 16 {
            // Entries of chunks taken back out: dropped, so that epochs of taking and putting do not grow it.
            let chunks = &self.chunks;
            self.order.retain(|(c, when)| chunks.get(c).is_some_and(|e| e.2 == *when));
        }
    }

    /// A source now holds `live` bytes of chunks: the peak grows to that, or the oldest chunks kept go until
    /// the keep and the source hold no more than the peak together. Returns the chunks let go of.
    fn grown(&mut self, live: u64) -> Vec<Arc<SourceChunk>> {
        self.peak = self.peak.max(live);
        let mut dropped = Vec::new();
        while live + self.bytes > self.peak {
            let Some((c, when)) = self.order.pop_front() else { break };
            if self.chunks.get(&c).is_some_and(|e| e.2 == when) {
                let (chunk, bytes, _) = self.chunks.remove(&c).expect("just seen");
                self.bytes -= bytes;
                dropped.push(chunk);
            }
        }
        dropped
    }
}

struct Shared {
    state: Mutex<State>,
    /// Taken with `state` held or alone, never the other way round (a chunk dropped under `state` locks
    /// it).
    spares: Arc<Spares>,
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

/// Loads a chunk into a spare buffer if there is one, turning a panic of the deserializer into an error
/// (a loader thread must always report back). The chunk gives its buffer to `spares` when dropped.
fn load(source: &dyn Deserializer, chunk: u32, spares: &Arc<Spares>) -> Result<SourceChunk, Error> {
    let spare = spares.take();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.load_source_chunk(chunk, spare))) {
        Ok(r) => r.map(|mut c| {
            c.recycle_into(spares);
            c
        }),
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
                state: Mutex::new(State::default()),
                spares: Arc::new(Spares {
                    chunks: Mutex::new(Vec::new()),
                    cap: threads.max(1),
                    bytes: super::PREFETCH_BYTES_PER_THREAD.saturating_mul(threads.max(1) as u64),
                }),
                work: Condvar::new(),
                done: Condvar::new(),
            }),
            threads: if on_demand { 0 } else { threads },
            handles: Vec::new(),
            pid: 0,
        }
    }

    /// Takes chunks from `keep` before loading them and leaves there those it lets go of (not for a
    /// source whose loading order matters).
    pub(crate) fn keep_in(&mut self, keep: Arc<ChunkKeep>) {
        if self.source.load_order_matters() {
            return;
        }
        keep.bind(&self.source);
        self.shared.lock().keep = Some(keep);
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
                    evicted.push((*c, a.clone()));
                    false
                }
                Slot::Queued | Slot::Failed(_) => false,
            }
        });
        for (c, a) in evicted {
            st.evicted(c, a);
        }
        st.queue.clear();
        if self.threads == 0 {
            return;
        }
        for &c in keep {
            if st.needs_queueing(c) {
                st.queue.push_back(c);
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
                if st.needs_queueing(c) {
                    front.push(c);
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
                    if let Some(a) = st.take_kept(c) {
                        return Ok(a);
                    }
                    st.slots.insert(c, Slot::Loading { wanted: true });
                    drop(st);
                    let r = load(&*self.source, c, &self.shared.spares);
                    st = self.shared.lock();
                    return match r {
                        Ok(chunk) => {
                            let a = Arc::new(chunk);
                            st.ready(c, a.clone());
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
        drop(st);
        let r = load(source, c, &shared.spares);
        st = shared.lock();
        match st.slots.get(&c) {
            Some(Slot::Loading { wanted: true }) => match r {
                Ok(chunk) => st.ready(c, Arc::new(chunk)),
                Err(e) => {
                    st.slots.insert(c, Slot::Failed(e));
                }
            },
            _ => {
                // Evicted while loading (dropped, a chunk gives its buffer to the spares).
                st.slots.remove(&c);
                drop(r);
            }
        }
        shared.done.notify_all();
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.shutdown = true;
        if let Some(keep) = st.keep.take() {
            let mut k = keep.lock();
            for (c, slot) in st.slots.drain() {
                if let Slot::Ready(a) = slot {
                    k.put(c, a);
                }
            }
        }
        drop(st);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChunkData, Schema, StorageFormat, StreamSpec};

    fn chunk(values: usize) -> Arc<SourceChunk> {
        let schema = Schema::new(vec![StreamSpec::new("a", 1, StorageFormat::Dense)]).unwrap();
        let mut d = ChunkData::new(&schema);
        if let crate::Values::F32(v) = &mut d.streams[0].values {
            v.reserve_exact(values);
        }
        Arc::new(SourceChunk::from_data(Arc::new(d)))
    }

    /// A chunk evicted while something else (a minibatch being assembled) still holds it gives its buffer
    /// to the spares when that lets go, and the next load reads into it instead of fresh memory.
    #[test]
    fn an_evicted_chunk_gives_its_buffer_to_the_next_load_when_its_last_holder_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.cbf");
        let schema = Schema::new(vec![StreamSpec::new("a", 64, StorageFormat::Dense)]).unwrap();
        let mut data = ChunkData::new(&schema);
        for i in 0..400u64 {
            data.keys.push(i);
            data.num_samples.push(1);
            let a = &mut data.streams[0];
            (0..64).for_each(|_| a.values.push_f64(1.5));
            a.sequence_offsets.push(i + 1);
        }
        let mut w = crate::cbf::CbfWriter::create(&path, &schema, 16 << 10).unwrap();
        w.write(&data).unwrap();
        w.finish().unwrap();
        let source: Arc<dyn Deserializer> = Arc::new(super::super::CbfSource::open(&path).unwrap());
        assert!(source.chunks().len() >= 3);
        let mut loader = Loader::new(source, 0);
        let mut out = Vec::new();
        loader.plan(&[0], &[]);
        loader.get(&[0], &mut out).unwrap();
        let held = out.pop().unwrap();
        let addr = held.buffer_addr().expect("a chunk read into a buffer");
        // Evicted while held: nothing to reuse yet.
        loader.plan(&[1], &[]);
        assert!(loader.shared.spares.lock().is_empty());
        drop(held);
        assert_eq!(loader.shared.spares.lock().len(), 1);
        loader.get(&[1], &mut out).unwrap();
        assert_eq!(out[0].buffer_addr(), Some(addr), "chunk 1 read into chunk 0's buffer");
        assert!(loader.shared.spares.lock().is_empty());
    }

    /// The keep and a source never hold more than the peak together; the oldest kept go first; taking
    /// and putting back for many epochs leaves the order list bounded.
    #[test]
    fn kept_bytes_stay_within_the_peak() {
        let mut k = Kept::default();
        let sizes: Vec<u64> = (0..4).map(|i| chunk(1000 * (i + 1)).heap_bytes() as u64).collect();
        assert!(k.grown(sizes.iter().sum()).is_empty());
        for c in 0..4 {
            k.put(c, chunk(1000 * (c as usize + 1)));
        }
        assert_eq!(k.bytes, sizes.iter().sum::<u64>());
        // A source holding the smallest chunk's bytes anew: the oldest kept (that one) goes.
        let dropped = k.grown(sizes[0]);
        assert_eq!(dropped.len(), 1);
        assert!(!k.chunks.contains_key(&0) && k.chunks.contains_key(&1));
        assert!(k.bytes + sizes[0] <= k.peak);
        // Then the largest one's: the oldest go until both fit.
        assert_eq!(k.grown(sizes[3]).len(), 2);
        assert!(k.chunks.contains_key(&3) && k.bytes + sizes[3] <= k.peak);
        k.put(1, chunk(2000));
        k.put(2, chunk(3000));
        for _ in 0..1000 {
            let c = k.take(2).unwrap();
            k.put(2, c);
        }
        assert!(k.order.len() <= 2 * k.chunks.len() + 17, "{}", k.order.len());
        assert_eq!(k.bytes, sizes[1] + sizes[2] + sizes[3]);
    }
}
