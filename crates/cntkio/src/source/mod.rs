//! The minibatch source: CNTK 2.7's V2/Python `MinibatchSource` over any [`Deserializer`]
//! (READER.md §2–§6, §8).
//!
//! A [`MinibatchSource`] walks the sequences of its deserializer in CNTK's order (randomized with a
//! [`BlockRandomizer`] or in file order with a [`NoRandomizer`]), fills minibatches of a requested number
//! of samples (counted with the declared lengths; a sequence is never split; minibatches may cross a sweep
//! boundary) and hands each out as a [`Batch`]: per stream, the samples of its sequences one after
//! another, with sequence offsets, keys and declared lengths — dense values sample-major, sparse values as
//! CSR parts (values, column indices, per-sample offsets), ready to be viewed as NumPy arrays.
//!
//! ```
//! use cntkio::source::{MinibatchConfig, MinibatchSource, RunLength};
//! use cntkio::{CtfOptions, CtfReader, Schema, StorageFormat, StreamSpec};
//! use std::sync::Arc;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("data.ctf");
//! std::fs::write(&path, "0 |a 0\n1 |a 1\n2 |a 2\n3 |a 3\n").unwrap();
//! let schema = Schema::new(vec![StreamSpec::new("a", 1, StorageFormat::Dense)]).unwrap();
//! let reader = CtfReader::open(&path, &schema, &CtfOptions::default()).unwrap();
//!
//! let config = MinibatchConfig { randomize: false, run_length: RunLength::Sweeps(3), ..MinibatchConfig::default() };
//! let mut source = MinibatchSource::new(Arc::new(reader), config).unwrap();
//! let mut sizes = Vec::new();
//! while let Some(mb) = source.next_minibatch(5).unwrap() {
//!     sizes.push((mb.data.num_sequences(), mb.end_of_sweep));
//! }
//! // READER.md §4.3: 4 one-sample sequences, 3 sweeps, size 5.
//! assert_eq!(sizes, [(5, true), (5, true), (2, true)]);
//! ```
//!
//! # Checkpoints
//!
//! [`MinibatchSource::state`] returns a [`SourceState`]; its JSON form (`SourceState::to_json`) is one
//! object, `{"version":1,"position":P,"minibatches":N,"sweep_size":S}`: `position` is CNTK's
//! `minibatchSourcePosition` (the global sample position of the next sequence, READER.md §8.1),
//! `minibatches` the number of minibatches the source had returned, `sweep_size` the data's sweep size in
//! samples (checked on restore, to catch restoring onto other data). With truncated BPTT the state also
//! holds the rows (`"bptt": {"mb_size": M, "rows": [{"cursor": C, "sequences": [{"chunk", "index", "key",
//! "samples", "sweep_end"}, …]}, …]}`: the sequences fetched but not yet wholly delivered) and is version
//! 2. Nothing else is stored: a state is meaningful only with the same data and configuration, as in CNTK.
//! A change of the format's meaning or fields gets a new version number; versions this library does not
//! know are refused with an error, never read differently.
//!
//! [`MinibatchSource::restore`] performs CNTK 2.7's exact call sequence (READER.md §8.3) and then, by
//! default, continues exactly as the uninterrupted run would have. With
//! [`MinibatchConfig::cntk_restore_quirk`] it reproduces CNTK instead, in its two differences: a restored
//! sweep-0 shuffle is seeded with the bare sweep number (randomization on, seed ≠ 0), and with
//! randomization off the round-robin worker assignment restarts at the sequence's index within its sweep.
//! With truncated BPTT the rows are part of the state and come back as they were.
//!
//! # Loading
//!
//! Chunks are loaded by background threads ([`MinibatchConfig::threads`], or `CNTKIO_THREADS`, started at
//! the first minibatch), ahead of need: the chunks of the randomization window of the position being read
//! and [`MinibatchConfig::prefetch`] more, in the order the window reaches them; chunks outside that set
//! are evicted, so memory is bounded by (window + prefetch) chunks plus the index. CBF chunks are kept as
//! their undecoded records and copied once, into the minibatch (asking for the next sequences' memory while
//! copying one). Dense streams are gathered where they can be: every sequence of the minibatch located
//! first (in parsed chunks by their sequence offsets, in CBF chunks whose sequences all have one length by
//! arithmetic), then their values copied with nothing else in the loop. Once the same minibatch size has
//! been asked for twice in a row, the randomization and packing run ahead on a thread of their own (module
//! `ahead`), so that the caller's thread only copies; a call with another size, or a restore, takes the
//! enumerator back (moved back by an exact restore if it ran past the last minibatch handed out). A
//! training loop's next epoch may start planning (its sweep's shuffle) while this one is still read
//! ([`MinibatchSource::then`]). None of this changes a minibatch.

mod ahead;
mod batch;
mod bptt;
mod chunk;
mod config;
mod deserializer;
mod feed;
mod loader;
mod next;
mod plan;
mod state;

pub(crate) use batch::{append_sequence, dense_reserve, BatchSizes};
use batch::{prepare, Plan, Planned};
pub use batch::{Batch, PlannedBatch};
pub use bptt::{BpttLayout, BpttState, Fragment, HeldSequence, RowState};
pub use chunk::SourceChunk;
pub use config::{MinibatchConfig, RunLength, FULL_DATA_SWEEP, INFINITELY_REPEAT, PREFETCH_BYTES_PER_THREAD};
pub(crate) use deserializer::set_element_types;
pub use deserializer::{CbfSource, Composite, Deserializer, MultiSource};
pub use feed::{BatchPool, FedBatch, FedPart, Feed, FeedConfig, HostPin, Recycler};
pub use state::SourceState;

use crate::randomize::{
    elastic_needs_balanced, BlockRandomizer, EpochConfig, NoRandomizer, Pick, SequenceEnumerator, Window,
};
use crate::{Error, ErrorKind, StreamSpec};
pub use loader::ChunkKeep;
use loader::Loader;
use next::{left_core_idle, process_cpu_time};
pub use next::{NextSource, PlanNext};
use plan::{Planner, Prefetch};
use std::sync::Arc;
use std::time::Instant;

type Enumerator = Box<dyn SequenceEnumerator + Send>;

/// CNTK 2.7's V2 minibatch source over a [`Deserializer`], for one worker of `workers`.
pub struct MinibatchSource {
    source: Arc<dyn Deserializer>,
    config: MinibatchConfig,
    enumerator: Enumerator,
    loader: Loader,
    planner: Planner,
    minibatches: u64,
    sweep_size: u64,
    total_sequences: u64,
    /// Scratch: the plan, the chunks of a minibatch, and those chunks loaded.
    keep: Vec<u32>,
    needed: Vec<u32>,
    held: Vec<Arc<SourceChunk>>,
    /// Truncated BPTT: the rows.
    packer: bptt::Packer,
    /// The streams of the minibatches.
    out_streams: Vec<StreamSpec>,
    /// `slot_of[c]`: index of chunk `c` in `needed` (valid for the chunks of the current minibatch).
    slot_of: Vec<u32>,
    /// The enumerator running ahead on a thread (it is then not in `enumerator`), once the same size has
    /// been asked for twice in a row; the size of the last call.
    ahead: Option<ahead::Ahead>,
    last_size: Option<u64>,
    /// Calls in a row with the size of the last one, and how many such calls start planning ahead: 2, doubled
    /// each time plans made ahead were dropped (a size that keeps changing would make the enumerator move
    /// back again and again; moving back across a sweep boundary shuffles the window anew); `u64::MAX` once
    /// a planning thread could not be started or panicked.
    same_size_calls: u64,
    ahead_after: u64,
    /// The run has started (at the first minibatch or restore).
    started: bool,
    /// What the planning thread runs after the last minibatch of the run ([`then`](Self::then)).
    then: Option<ahead::Then>,
}

impl std::fmt::Debug for MinibatchSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MinibatchSource")
            .field("config", &self.config)
            .field("position", &self.position())
            .field("minibatches", &self.minibatches)
            .finish()
    }
}

impl MinibatchSource {
    /// A source over `source`, positioned at the start of the run. Nothing is loaded and no thread starts
    /// here: the run starts (sweep 0 is shuffled, while the first chunks load) at the first minibatch or
    /// [`restore`](Self::restore), where errors of the deserializer's sequence lists surface.
    ///
    /// Errors: no chunks, samples or sequences in the data ([`ErrorKind::EmptyData`](crate::ErrorKind::EmptyData)), `workers == 0` or
    /// `rank >= workers` ([`ErrorKind::WorkerOutOfRange`](crate::ErrorKind::WorkerOutOfRange)).
    pub fn new(source: Arc<dyn Deserializer>, config: MinibatchConfig) -> Result<MinibatchSource, Error> {
        let chunks = source.chunks();
        let total_sequences = chunks.iter().map(|c| u64::from(c.num_sequences)).sum();
        let enumerator = Self::enumerator(&source, &config)?;
        let sweep_size = enumerator.sweep_size();
        let threads = config.loader_threads();
        let planner = Planner::new(
            chunks,
            config.randomized(),
            config.window,
            config.seed,
            // Balanced dealing takes sequences from every chunk: the loader plans them all.
            if config.balanced_workers { 1 } else { config.workers },
            if config.balanced_workers { 0 } else { config.rank },
            Prefetch {
                chunks: config.prefetch_depth(),
                bytes: config.prefetch_bytes(),
                sizes: (0..chunks.len() as u32).map(|c| source.chunk_size(c).unwrap_or(0)).collect(),
            },
            config.run_end(sweep_size),
        );
        let out_streams = if config.truncation_length > 0 {
            bptt::dense_streams(source.streams())
        } else {
            source.streams().to_vec()
        };
        let s = MinibatchSource {
            packer: bptt::Packer::default(),
            out_streams,
            loader: Loader::new(source.clone(), threads),
            planner,
            source,
            config,
            enumerator,
            minibatches: 0,
            sweep_size,
            total_sequences,
            keep: Vec::new(),
            needed: Vec::new(),
            held: Vec::new(),
            slot_of: Vec::new(),
            ahead: None,
            last_size: None,
            same_size_calls: 0,
            ahead_after: 2,
            started: false,
            then: None,
        };
        // The run starts (and sweep 0 is shuffled) at the first minibatch, so that loading the first
        // window's chunks overlaps the shuffle; the worker configuration is checked here.
        crate::randomize::check_worker(s.config.rank.into(), s.config.workers.into())?;
        if s.config.elastic_resume.is_some() && (s.config.cntk_restore_quirk || s.config.truncation_length > 0) {
            return Err(Error::option(
                "elastic_resume",
                "elastic resume needs exact restores and whole sequences: it excludes cntk_restore_quirk and \
                 truncated BPTT",
            ));
        }
        if s.config.frame_mode && s.config.truncation_length > 0 {
            return Err(Error::option(
                "truncation_length",
                "MinibatchSourceConfig: truncation and frame mode are mutually exclusive options.",
            ));
        }
        Ok(s)
    }

    /// Starts the run if it has not started: the position goes to the start of the run (READER.md §4.5),
    /// after asking for the chunks read first (when `prefetch`).
    fn start(&mut self, prefetch: bool) -> Result<(), Error> {
        if !self.started {
            if prefetch {
                self.planner.reset();
                if self.planner.plan(self.position(), &mut self.keep) {
                    self.loader.plan(&self.keep, &[]);
                }
            }
            self.enumerator.start_epoch(&self.config.epoch())?;
            self.started = true;
            self.planner.reset();
        }
        Ok(())
    }

    /// The global sample position of the next sequence (before the run starts: where it will start).
    fn position(&self) -> u64 {
        if let Some(a) = &self.ahead {
            a.position
        } else if self.started {
            self.enumerator.get_state()
        } else if self.config.randomized()
            && !self.config.balanced_workers
            && self.config.rank as usize >= self.source.chunks().len()
        {
            // A worker without chunks starts at the end (READER.md §6).
            self.config.run_end(self.sweep_size)
        } else {
            0
        }
    }

    fn enumerator(source: &Arc<dyn Deserializer>, config: &MinibatchConfig) -> Result<Enumerator, Error> {
        Ok(if config.randomized() {
            let mut r = BlockRandomizer::new(source.clone(), config.window, config.seed)?
                .with_cntk_seek_quirk(config.cntk_restore_quirk)
                .with_balanced_workers(config.balanced_workers);
            if let Some(e) = &config.elastic_resume {
                r = r.with_elastic_resume(e.clone())?;
            }
            Box::new(r)
        } else if config.elastic_resume.is_some() {
            return Err(elastic_needs_balanced());
        } else {
            Box::new(NoRandomizer::new(source.clone())?)
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MinibatchConfig {
        &self.config
    }
    /// The deserializer.
    pub fn deserializer(&self) -> &Arc<dyn Deserializer> {
        &self.source
    }
    /// The streams of every [`Batch`]: the deserializer's, all dense with truncated BPTT.
    pub fn streams(&self) -> &[StreamSpec] {
        &self.out_streams
    }
    /// Sweep size: Σ of the declared lengths of all sequences.
    pub fn sweep_size(&self) -> u64 {
        self.sweep_size
    }
    /// Number of sequences in one sweep.
    pub fn num_sequences(&self) -> u64 {
        self.total_sequences
    }
    /// Number of minibatches returned so far (continued by [`restore`](Self::restore)).
    pub fn minibatches(&self) -> u64 {
        self.minibatches
    }

    /// With balanced dealing (and randomization, without truncated BPTT): the number of sequences of sweep
    /// `sweep` this worker has been delivered — 0 before the sweep, its whole share after it, the same after a
    /// [`restore`](Self::restore) as in the uninterrupted run. In a sweep resumed elastically
    /// ([`MinibatchConfig::elastic_resume`]) it counts the sequences of those left to this run (the counts an
    /// [`ElasticResume`] round of a later resume takes). Takes the enumerator back from the planning thread
    /// when minibatches are planned ahead (which resumes with the next minibatch).
    ///
    /// Errors: another dealing ([`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption)), and errors of the
    /// deserializer while moving the enumerator back to the last minibatch handed out.
    pub fn sequences_delivered(&mut self, sweep: u64) -> Result<u64, Error> {
        if !(self.config.randomized() && self.config.balanced_workers) || self.config.truncation_length > 0 {
            return Err(Error::option(
                "balanced_workers",
                "sequences are counted per worker only with balanced dealing (balanced_workers with randomization, \
                 without truncated BPTT)",
            ));
        }
        if let Some(position) = self.take_back() {
            self.rewind(position)?;
        }
        if !self.started {
            return Ok(0);
        }
        self.enumerator
            .sequences_delivered(sweep)
            .ok_or_else(|| Error::internal("the balanced enumerator does not count its sequences"))
    }

    /// The next minibatch of about `size` samples for this worker, or `None` when the run is over.
    ///
    /// This worker's share of `size` is `⌊size / workers⌋`, plus one for ranks below `size mod workers`
    /// (at least 1), counted with the declared lengths (READER.md §4.2).
    ///
    /// With truncated BPTT, `size` sets the number of parallel rows instead (READER.md §5.3, module
    /// `bptt`): `max(1, ⌊size / truncation_length⌋)`, dealt to the workers.
    ///
    /// Errors: `size == 0`; a delivered sequence with no sample in some stream (CNTK: `Sequences must be
    /// a least one frame long`); in frame mode a sequence with more than one sample in some stream; with
    /// BPTT, more workers than rows, or a sequence whose streams have different lengths; and errors of the
    /// deserializer.
    pub fn next_minibatch(&mut self, size: u64) -> Result<Option<Batch>, Error> {
        let mut b = Batch::new(&self.out_streams);
        Ok(if self.next_minibatch_into(size, &mut b)? { Some(b) } else { None })
    }

    /// As [`next_minibatch`](Self::next_minibatch), into `batch` (reusing its allocations); returns false
    /// (with `batch` empty) when the run is over.
    pub fn next_minibatch_into(&mut self, size: u64, batch: &mut Batch) -> Result<bool, Error> {
        let r = if self.config.truncation_length > 0 {
            self.check_size(size).and_then(|()| self.next_bptt(size, batch))
        } else {
            self.plan_next(size).map(|p| PlannedBatch(p).assemble_into(&self.out_streams, batch))
        };
        // A file that shrank under its map is the cause of whatever the minibatch holds or failed with.
        self.source.check_maps()?;
        r
    }

    /// The next minibatch of about `size` samples, its sequences chosen and their chunks loaded but not yet
    /// copied: [`PlannedBatch::assemble_into`] copies them, on any thread, while this source plans the next
    /// ones. The same minibatches as [`next_minibatch`](Self::next_minibatch), whose errors it reports
    /// (every check of a minibatch's sequences is made here). With truncated BPTT (whose rows are
    /// filled as they are packed) the minibatch is assembled here.
    pub fn next_planned(&mut self, size: u64) -> Result<PlannedBatch, Error> {
        if self.config.truncation_length > 0 {
            self.check_size(size)?;
            let mut batch = Batch::new(&self.out_streams);
            let more = self.next_bptt(size, &mut batch)?;
            return Ok(PlannedBatch(Planned::Ready(Box::new(batch), more)));
        }
        Ok(PlannedBatch(self.plan_next(size)?))
    }

    /// Errors for a minibatch size no minibatch can have.
    fn check_size(&self, size: u64) -> Result<(), Error> {
        if size == 0 {
            return Err(zero_minibatch_size());
        }
        if size > MAX_ENDLESS_MINIBATCH && self.config.run_length.normalized() == RunLength::Infinite {
            // Guard, not in CNTK (which would gather sweep after sweep until memory runs out).
            return Err(Error::option(
                "minibatch_size_in_samples",
                format!(
                    "a minibatch of {size} samples from an endless run (no max_samples or max_sweeps) would never be \
                 complete; ask for at most {MAX_ENDLESS_MINIBATCH} samples, or end the run"
                ),
            ));
        }
        Ok(())
    }

    /// Plans the next minibatch (without truncated BPTT, which its callers take elsewhere).
    fn plan_next(&mut self, size: u64) -> Result<Planned, Error> {
        self.check_size(size)?;
        let local = self.local_size(size, true);
        if self.ahead.as_ref().is_some_and(|a| a.size != size) {
            self.settle()?;
        }
        let pos = self.position();
        if self.started
            && self.ahead.is_none()
            && !self.config.cntk_restore_quirk
            && pos >= self.config.run_end(self.sweep_size)
        {
            // The run is over: the enumerator's answer (READER.md §4.3), without letting it shuffle the next
            // sweep's window first. (With CNTK's restore quirk it is asked, as in CNTK: where a later restore
            // lands depends on the sweep it has prepared.)
            let end_of_sweep = pos >= self.sweep_size && pos.is_multiple_of(self.sweep_size);
            return Ok(Planned::Empty { end_of_sweep, end_of_run: true });
        }
        let plan_ahead = self.started
            && self.ahead.is_none()
            && self.same_size_calls + 1 >= self.ahead_after
            && self.last_size == Some(size)
            && !self.config.cntk_restore_quirk
            && self.loader.threads() > 0;
        self.same_size_calls = if self.last_size == Some(size) { self.same_size_calls + 1 } else { 1 };
        self.last_size = Some(size);
        if plan_ahead {
            self.start_ahead(size, local);
        }
        self.start(true)?;
        self.prefetch();
        let planned = self.ahead.as_mut().map(|a| a.next());
        let mb = match planned {
            Some(Some(p)) => {
                if p.result.as_ref().map_or(true, |m| m.end_of_epoch || m.picks.is_empty()) {
                    // The thread has stopped after this plan: the enumerator comes back where it is.
                    self.settle()?;
                }
                p.result?
            }
            Some(None) => {
                self.settle()?;
                self.enumerator.get_next(u64::MAX, local)?
            }
            None => self.enumerator.get_next(u64::MAX, local)?,
        };
        if mb.picks.is_empty() {
            return Ok(Planned::Empty { end_of_sweep: mb.end_of_sweep, end_of_run: mb.end_of_epoch });
        }
        let r = self.locate(mb.picks);
        self.held.clear();
        let mut plan = r?;
        plan.end_of_sweep = mb.end_of_sweep;
        plan.end_of_run = mb.end_of_epoch;
        self.minibatches += 1;
        self.prefetch();
        Ok(Planned::Copy(plan))
    }

    /// This worker's share of a minibatch of `size` samples (CNTK's warning, when `warn`, if it is 0: then 1).
    fn local_size(&self, size: u64, warn: bool) -> u64 {
        let workers = u64::from(self.config.workers);
        let local = size / workers + u64::from(u64::from(self.config.rank) < size % workers);
        if local == 0 && warn {
            log::warn!(
                "The minibatch size '{size}' is too small to be used with {workers} workers, adjusting to \
                 minibatch size of 1 sample per worker"
            );
        }
        local.max(1)
    }

    /// Hands the enumerator to a planning thread for minibatches of `size` samples (`local` of them this
    /// worker's), with the [`then`](Self::then) hook; keeps it (and plans on the caller's thread from now
    /// on) if no thread can be started.
    fn start_ahead(&mut self, size: u64, local: u64) {
        let e = std::mem::replace(&mut self.enumerator, Box::new(Parked));
        let position = e.get_state();
        match ahead::Ahead::start(e, size, local, position) {
            Ok(a) => {
                if let Some(f) = self.then.take() {
                    a.then(f);
                }
                self.ahead = Some(a);
            }
            Err(e) => {
                self.enumerator = e;
                self.ahead_after = u64::MAX;
            }
        }
    }

    /// Starts the run and plans minibatches of `size` samples on a thread of their own now, before the
    /// first is asked for, as the source would from its second call with that size on (READER.md §3: the
    /// shuffle of the first window is most of the first minibatch's wait). Nothing is loaded: the chunks are
    /// asked for when the minibatches are. Does nothing once the run has started, with truncated BPTT or
    /// CNTK's restore quirk, or without loading threads (sources that plan on the caller's thread only).
    /// Never changes a minibatch; a first call with another size moves the enumerator back to the start.
    ///
    /// Errors: a size no minibatch can have (as [`next_minibatch`](Self::next_minibatch)), the shuffle's
    /// errors of the deserializer's sequence lists.
    pub fn plan_ahead(&mut self, size: u64) -> Result<(), Error> {
        if self.started
            || self.config.truncation_length > 0
            || self.config.cntk_restore_quirk
            || self.loader.threads() == 0
            || self.ahead_after == u64::MAX
        {
            return Ok(());
        }
        self.check_size(size)?;
        self.start(false)?;
        self.last_size = Some(size);
        self.same_size_calls = 1;
        let local = self.local_size(size, false);
        self.start_ahead(size, local);
        Ok(())
    }

    /// Makes `next` (the source of a training loop's next epoch, say) start planning minibatches of `size`
    /// samples ([`plan_ahead`](Self::plan_ahead)) as soon as this source's planning thread has planned its
    /// last minibatch (as `when` says), so that the shuffle of `next`'s first window runs while this
    /// source's last minibatches are still being copied rather than before `next`'s first. `next` then waits
    /// in the returned [`NextSource`]. If this source's last minibatch is not planned on a planning thread
    /// (see [`NextSource::take`]), or `when` says no, `next` is dropped and the slot stays empty. Replaces
    /// an earlier `next`.
    pub fn then(&mut self, next: MinibatchSource, size: u64, when: PlanNext) -> Arc<NextSource> {
        let slot = Arc::new(NextSource::default());
        let to = slot.clone();
        let (since, cpu) = (Instant::now(), process_cpu_time());
        let hook: ahead::Then = Box::new(move || {
            let idle = match (cpu, process_cpu_time()) {
                (Some(a), Some(b)) => {
                    left_core_idle(b.saturating_sub(a), since.elapsed(), crate::threads_or_cores(None))
                }
                _ => true,
            };
            if when == PlanNext::Always || idle {
                to.start(next, size);
            }
        });
        match &self.ahead {
            Some(a) => a.then(hook),
            None => self.then = Some(hook),
        }
        slot
    }

    /// A truncated-BPTT minibatch (module `bptt`).
    fn next_bptt(&mut self, size: u64, batch: &mut Batch) -> Result<bool, Error> {
        let tau = self.config.truncation_length;
        self.packer.configure(size, tau, self.config.workers, self.config.rank)?;
        bptt::check_dense(|| "a minibatch".to_string(), size.max(tau), self.source.streams())?;
        self.start(true)?;
        for r in 0..self.packer.rows() {
            while self.packer.wants(r, tau) {
                self.prefetch();
                let mb = self.enumerator.get_next(u64::MAX, 1)?;
                for p in &mb.picks {
                    self.loader.get(&[p.chunk], &mut self.held)?;
                    let view = self.held[0].view();
                    let r = self.packer.push(r, *p, view, self.source.streams(), mb.end_of_sweep);
                    self.held.clear();
                    r?;
                }
                // Guard, not in CNTK: a request delivering nothing before the end of the run cannot refill.
                if mb.end_of_epoch || mb.picks.is_empty() {
                    break;
                }
            }
        }
        let mut layout = batch.bptt.take().unwrap_or_default();
        prepare(batch, &self.out_streams);
        if self.packer.is_empty() {
            batch.end_of_run = true;
            return Ok(false);
        }
        batch.end_of_sweep = self.packer.pack(tau, batch, &mut layout);
        batch.end_of_run = self.packer.is_empty();
        batch.bptt = Some(layout);
        self.minibatches += 1;
        self.prefetch();
        Ok(true)
    }

    /// Takes chunks from `keep` rather than load them, and leaves there the chunks it lets go of, for the
    /// next source over the same deserializer (see [`ChunkKeep`]). Only a randomized source whose window
    /// covers the data uses it — the next epoch, shuffled anew, then wants every chunk at once, which this
    /// one held at its start anyway — not a source in file order or with a smaller window, which would hold
    /// memory between epochs for few of the chunks the next one starts with; nor a source whose loading
    /// order matters (a CTF reader with a `maxErrors` budget). Never changes a minibatch.
    pub fn keep_chunks(&mut self, keep: Arc<ChunkKeep>) {
        let covers = match self.config.window {
            Window::Chunks(w) => w >= self.source.chunks().len() as u64,
            Window::Samples(s) => s >= self.sweep_size,
        };
        if self.config.randomized() && covers {
            self.loader.keep_in(keep);
        }
    }

    /// Number of background threads loading chunks (started at the first minibatch).
    pub fn loader_threads(&self) -> usize {
        self.loader.threads()
    }

    /// Whether minibatches are being planned ahead on a thread now (after the same size was asked for
    /// twice in a row, with loading threads). Never changes a minibatch.
    pub fn plans_ahead(&self) -> bool {
        self.ahead.is_some()
    }

    /// Number of chunks currently held or being loaded (bounded by the window's chunks plus the prefetch
    /// depth, plus the chunks of the last minibatch).
    pub fn chunks_held(&self) -> usize {
        self.loader.cached()
    }

    /// Tells the loader which chunks to hold from the current position on (when that changes).
    fn prefetch(&mut self) {
        if self.planner.plan(self.position(), &mut self.keep) {
            self.loader.plan(&self.keep, &[]);
        }
    }

    /// Loads the chunks of `picks` and makes CNTK's packer checks: the plan of a minibatch.
    fn locate(&mut self, picks: Vec<Pick>) -> Result<Plan, Error> {
        self.needed.clear();
        self.needed.extend(picks.iter().map(|p| p.chunk));
        self.needed.sort_unstable();
        self.needed.dedup();
        self.loader.get(&self.needed, &mut self.held)?;
        let n = self.source.chunks().len();
        if self.slot_of.len() != n {
            self.slot_of = vec![0; n];
        }
        for (i, &c) in self.needed.iter().enumerate() {
            self.slot_of[c as usize] = i as u32;
        }
        let slots: Vec<u32> = picks.iter().map(|p| self.slot_of[p.chunk as usize]).collect();
        let views: Vec<chunk::ChunkView<'_>> = self.held.iter().map(|c| c.view()).collect();
        let view = |i: usize| views[slots[i] as usize];
        if self.config.frame_mode && self.held.iter().any(|c| c.max_len() > 1) {
            for (i, p) in picks.iter().enumerate() {
                let v = view(i);
                for st in 0..self.source.streams().len() {
                    let n = v.sequence_len(st, p.index as usize);
                    if n > 1 {
                        let stream = self.source.streams()[st].name.clone();
                        return Err(Error::new(ErrorKind::NonFrameSequence { sequence: p.key, stream, samples: n })
                            .with_sequence(p.key));
                    }
                }
            }
        }
        if self.held.iter().any(|c| c.has_empty()) {
            for (i, p) in picks.iter().enumerate() {
                let v = view(i);
                if let Some(st) = (0..self.source.streams().len()).find(|&st| v.sequence_len(st, p.index as usize) == 0)
                {
                    let stream = self.source.streams()[st].name.clone();
                    return Err(
                        Error::new(ErrorKind::EmptySequenceStream { sequence: p.key, stream }).with_sequence(p.key)
                    );
                }
            }
        }
        drop(views);
        Ok(Plan { picks, slots, chunks: std::mem::take(&mut self.held), end_of_sweep: false, end_of_run: false })
    }

    /// Takes the enumerator back from the planning thread, if it runs; the enumerator is then where the
    /// last minibatch handed out ended (moved back there if plans were made ahead).
    fn settle(&mut self) -> Result<(), Error> {
        if let Some(position) = self.take_back() {
            if self.ahead_after != u64::MAX {
                self.ahead_after = (self.ahead_after * 2).min(1 << 12);
            }
            self.rewind(position)?;
        }
        Ok(())
    }

    /// Takes the enumerator back from the planning thread, if it runs. Returns the position it must be
    /// moved back to, if it has moved past it (or was lost with a panicking thread and made anew).
    fn take_back(&mut self) -> Option<u64> {
        let a = self.ahead.take()?;
        let position = a.position;
        match a.finish() {
            Ok((e, moved)) => {
                self.enumerator = e;
                moved.then_some(position)
            }
            Err(err) => {
                log::warn!("{err}; minibatches are planned on the caller's thread from now on");
                self.ahead_after = u64::MAX;
                match Self::enumerator(&self.source, &self.config) {
                    Ok(e) => self.enumerator = e,
                    Err(e) => log::warn!("{e}"),
                }
                self.started = false;
                Some(position)
            }
        }
    }

    /// Moves the enumerator to `position` by an exact restore (the uninterrupted run's continuation).
    fn rewind(&mut self, position: u64) -> Result<(), Error> {
        let state = SourceState {
            version: SourceState::VERSION,
            position,
            minibatches: self.minibatches,
            sweep_size: self.sweep_size,
            bptt: None,
        };
        self.restore(&state)
    }

    /// A checkpoint of the current position (READER.md §8.1).
    pub fn state(&self) -> SourceState {
        let bptt = self.packer.state();
        SourceState {
            version: if bptt.is_some() { SourceState::VERSION_BPTT } else { SourceState::VERSION },
            position: self.position(),
            minibatches: self.minibatches,
            sweep_size: self.sweep_size,
            bptt,
        }
    }

    /// Continues from a checkpoint taken from a source with the same data and configuration (see the
    /// module docs for exact continuation and CNTK's quirks).
    ///
    /// With truncated BPTT the rows are restored too (the held sequences are loaded again), so that the
    /// run continues exactly.
    ///
    /// Errors: another state version, a sweep size that is not this data's, BPTT rows for a source without
    /// BPTT, held sequences that do not exist, and errors of the deserializer.
    pub fn restore(&mut self, state: &SourceState) -> Result<(), Error> {
        state.check_version()?;
        if state.bptt.is_some() && self.config.truncation_length == 0 {
            return Err(Error::state(
                "the state holds truncated-BPTT rows, but this source does not use truncated BPTT",
            ));
        }
        if state.sweep_size != self.sweep_size {
            return Err(Error::state(format!(
                "the state is of data with {} samples per sweep, but this data has {}",
                state.sweep_size, self.sweep_size
            )));
        }
        // A planning thread's plans are dropped: the position is set anew below.
        let _ = self.take_back();
        self.start(false)?;
        let p = state.position;
        let epoch = self.config.epoch();
        // CNTK 2.7 (READER.md §8.3): RestoreFromCheckpoint seeks; the next GetNextMinibatch restarts the run
        // (seek to 0), seeks again, and a configuration update seeks to the current position once more.
        if p != self.enumerator.get_state() {
            self.enumerator.set_state(p)?;
        }
        self.enumerator.start_epoch(&epoch)?;
        if self.enumerator.get_state() != p {
            self.enumerator.set_state(p)?;
        }
        let cur = self.enumerator.get_state();
        self.enumerator.set_state(cur)?;
        if !self.config.randomized() && !self.config.cntk_restore_quirk && self.config.workers > 1 {
            // NoRandomizer deals sequence `gs` to worker `gs mod W`, with `gs` counting across sweeps; a seek
            // restarts `gs` at the index within the sweep, k·T short (k = sweep, T = sequences per sweep).
            // Dealing with the rank shifted by k·T mod W gives the uninterrupted run's assignment.
            let w = u64::from(self.config.workers);
            let k = cur / self.sweep_size;
            let shift = ((k % w) * (self.total_sequences % w)) % w;
            let rank = ((u64::from(self.config.rank) + w - shift) % w) as u32;
            self.enumerator.start_epoch(&EpochConfig { rank, ..epoch })?;
            self.enumerator.set_state(cur)?;
        }
        self.minibatches = state.minibatches;
        self.planner.reset();
        self.packer.reset();
        if let Some(b) = &state.bptt {
            let mut chunks: Vec<u32> = b.rows.iter().flat_map(|r| r.sequences.iter().map(|h| h.chunk)).collect();
            chunks.sort_unstable();
            chunks.dedup();
            if let Some(&c) = chunks.last().filter(|&&c| c as usize >= self.source.chunks().len()) {
                return Err(Error::state(format!("the state names chunk {c}, which does not exist")));
            }
            self.loader.get(&chunks, &mut self.held)?;
            let views: Vec<chunk::ChunkView<'_>> = self.held.iter().map(|c| c.view()).collect();
            let r =
                self.packer.restore(b, self.source.streams(), |c| Ok(views[chunks.binary_search(&c).expect("loaded")]));
            drop(views);
            self.held.clear();
            r?;
        }
        Ok(())
    }
}

/// The largest minibatch (in samples) asked of an endless run: a larger one would gather sweep after sweep
/// (2^40 samples: terabytes of data).
pub const MAX_ENDLESS_MINIBATCH: u64 = 1 << 40;

/// The error for a minibatch size of 0 (CNTK's message).
pub(crate) fn zero_minibatch_size() -> Error {
    Error::option("minibatch_size_in_samples", "Requested minibatch size must be > 0.")
}

/// The error for a use of the enumerator while it is parked: every use takes it back first.
fn on_planning_thread() -> Error {
    Error::internal("the enumerator is on the planning thread")
}

/// The enumerator's place while it runs on the planning thread: never asked anything (every use of the
/// enumerator takes it back first).
struct Parked;

impl SequenceEnumerator for Parked {
    fn start_epoch(&mut self, _: &EpochConfig) -> Result<(), Error> {
        Err(on_planning_thread())
    }
    fn get_next(&mut self, _: u64, _: u64) -> Result<crate::randomize::Minibatch, Error> {
        Err(on_planning_thread())
    }
    fn get_state(&self) -> u64 {
        0
    }
    fn set_state(&mut self, _: u64) -> Result<(), Error> {
        Err(on_planning_thread())
    }
    fn sweep_size(&self) -> u64 {
        0
    }
}
