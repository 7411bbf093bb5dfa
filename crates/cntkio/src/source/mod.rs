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
//! enumerator back (moved back by an exact restore if it ran past the last minibatch handed out). None of
//! this changes a minibatch.

mod ahead;
mod bptt;
mod chunk;
mod deserializer;
mod feed;
mod loader;
mod plan;

pub use bptt::{BpttLayout, BpttState, Fragment, HeldSequence, RowState};
pub use chunk::SourceChunk;
pub use deserializer::{CbfSource, Composite, Deserializer, MultiSource};
pub use feed::{BatchPool, FedBatch, FedPart, Feed, FeedConfig, HostPin, Recycler};

use crate::randomize::{
    elastic_needs_balanced, BlockRandomizer, ElasticResume, EpochConfig, NoRandomizer, Pick, SequenceEnumerator, Window,
};
use crate::{ChunkData, Error, ErrorKind, Layout, StreamData, StreamSpec, Values};
use loader::Loader;
use plan::Planner;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// How long a run lasts (Python `max_samples` / `max_sweeps`, READER.md §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RunLength {
    /// Repeat the data forever (`INFINITELY_REPEAT`, CNTK's default).
    #[default]
    Infinite,
    /// Stop at the first sequence boundary at or after this many samples (`max_samples`;
    /// [`FULL_DATA_SWEEP`] means one sweep and [`INFINITELY_REPEAT`] forever, as in CNTK).
    Samples(u64),
    /// Stop after this many sweeps (`max_sweeps`; [`INFINITELY_REPEAT`] means forever).
    Sweeps(u64),
}

/// CNTK's `INFINITELY_REPEAT` (2^64 − 1) as a number of samples or sweeps: no end.
pub const INFINITELY_REPEAT: u64 = u64::MAX;
/// CNTK's `FULL_DATA_SWEEP` (2^64 − 2) as a number of samples: one sweep.
pub const FULL_DATA_SWEEP: u64 = u64::MAX - 1;

impl RunLength {
    /// With CNTK's special values resolved ([`FULL_DATA_SWEEP`], [`INFINITELY_REPEAT`]).
    pub fn normalized(self) -> RunLength {
        match self {
            RunLength::Samples(INFINITELY_REPEAT) | RunLength::Sweeps(INFINITELY_REPEAT) => RunLength::Infinite,
            RunLength::Samples(FULL_DATA_SWEEP) => RunLength::Sweeps(1),
            r => r,
        }
    }
}

/// Configuration of a [`MinibatchSource`] (Python `MinibatchSource` arguments, READER.md §9.1).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MinibatchConfig {
    /// Randomize (`randomize`, default true). A window of 0 chunks or 0 samples also turns it off, as in
    /// CNTK.
    pub randomize: bool,
    /// The randomization window (default 128 chunks).
    pub window: Window,
    /// `randomization_seed` (default 0); sweep *k* is shuffled with `seed + k`.
    pub seed: u64,
    /// Run length (default: infinite).
    pub run_length: RunLength,
    /// Frame mode: every stream of every sequence must have at most one sample (`frame_mode`).
    pub frame_mode: bool,
    /// Number of workers reading the same data (`num_data_partitions`, default 1).
    pub workers: u32,
    /// This worker's rank (`partition_index`, default 0).
    pub rank: u32,
    /// Restore as CNTK 2.7 does, quirks included (see the module docs). Default false: exact
    /// continuation.
    pub cntk_restore_quirk: bool,
    /// With randomization, deal sequences instead of chunks to the workers: the sequence at index `t` of
    /// the sweep's randomized order goes to worker `t mod workers`, so that every worker gets the same
    /// number of sequences (±1) per sweep. A deliberate addition, not in CNTK (whose chunk dealing gives
    /// workers as many samples as their chunks hold, and nothing to a worker beyond the number of chunks).
    /// Default false. Without randomization sequences are dealt round robin anyway (as in CNTK).
    pub balanced_workers: bool,
    /// Background threads loading chunks ahead (`None`: the environment variable `CNTKIO_THREADS` if set,
    /// else the number of cores; `Some(0)`: chunks are loaded on the caller's thread when needed). Threads
    /// start at the first minibatch, not at construction. Never changes a minibatch.
    pub threads: Option<usize>,
    /// How many chunks beyond those the randomization window needs may be loaded ahead (`None`: 2 per
    /// loading thread). Chunks held: the window's plus these (READER.md §3.5). Never changes a minibatch.
    pub prefetch: Option<usize>,
    /// Truncated BPTT with this truncation length in samples (`truncation_length`; 0, the default: off;
    /// READER.md §5.3). Every stream is then delivered dense, as fragments of sequences laid out in
    /// parallel rows ([`Batch::bptt`]). Excludes frame mode.
    pub truncation_length: u64,
    /// Elastic resume (with [`balanced_workers`](Self::balanced_workers) and randomization only): the
    /// sequences of sweep `sweep` that earlier runs, with other numbers of workers, were delivered; this run
    /// reads the rest of that sweep, dealt to its workers in turn ([`ElasticResume`]). The run still starts
    /// at the start of the run: for a sweep after the first, restore a state at `sweep × sweep_size`.
    /// Default `None`.
    pub elastic_resume: Option<ElasticResume>,
}

impl Default for MinibatchConfig {
    fn default() -> Self {
        MinibatchConfig {
            randomize: true,
            window: Window::Chunks(128),
            seed: 0,
            run_length: RunLength::Infinite,
            frame_mode: false,
            workers: 1,
            rank: 0,
            cntk_restore_quirk: false,
            balanced_workers: false,
            threads: None,
            prefetch: None,
            truncation_length: 0,
            elastic_resume: None,
        }
    }
}

impl MinibatchConfig {
    /// Whether sequences are actually randomized (on, with a non-zero window).
    pub fn randomized(&self) -> bool {
        self.randomize && !matches!(self.window, Window::Chunks(0) | Window::Samples(0))
    }

    /// The number of loading threads: [`threads`](Self::threads), else `CNTKIO_THREADS`, else the number
    /// of cores.
    pub fn loader_threads(&self) -> usize {
        self.threads.unwrap_or_else(|| {
            std::env::var("CNTKIO_THREADS")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        })
    }

    /// The prefetch depth in chunks: [`prefetch`](Self::prefetch), else 2 per loading thread.
    pub fn prefetch_depth(&self) -> usize {
        self.prefetch.unwrap_or_else(|| 2 * self.loader_threads())
    }

    /// The run's end on the global timeline, for a sweep of `sweep_size` samples.
    fn run_end(&self, sweep_size: u64) -> u64 {
        match self.run_length.normalized() {
            RunLength::Infinite => u64::MAX / 2,
            RunLength::Samples(n) => n,
            RunLength::Sweeps(k) => sweep_size.saturating_mul(k),
        }
    }

    /// The V2 run as an epoch: epoch 0 crossing sweeps (READER.md §4.5).
    fn epoch(&self) -> EpochConfig {
        let (epoch_size, sweeps) = match self.run_length.normalized() {
            RunLength::Infinite => (u64::MAX / 2, None),
            RunLength::Samples(n) => (n, None),
            RunLength::Sweeps(k) => (u64::MAX / 2, Some(k)),
        };
        EpochConfig { epoch_size, epoch_index: 0, workers: self.workers, rank: self.rank, sweeps, cross_sweeps: true }
    }
}

/// One minibatch for this worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The sequences in delivery order: keys, declared lengths and, per stream (in the deserializer's
    /// stream order), their samples one sequence after another (`sequence_offsets` delimit them).
    pub data: ChunkData,
    /// The minibatch reached or crossed the end of a sweep (Python `MinibatchData.end_of_sweep`).
    pub end_of_sweep: bool,
    /// The minibatch reached the end of the run; the next call returns nothing.
    pub end_of_run: bool,
    /// With truncated BPTT ([`MinibatchConfig::truncation_length`]): the rows and columns of the
    /// minibatch, and where each of its sequences — then a fragment of a data sequence, whose key it has
    /// and whose `num_samples` entry is the fragment's length — lies. `None` otherwise.
    pub bptt: Option<BpttLayout>,
}

impl Batch {
    /// An empty batch for these streams.
    pub fn new(streams: &[StreamSpec]) -> Batch {
        Batch {
            data: ChunkData {
                keys: Vec::new(),
                num_samples: Vec::new(),
                streams: streams.iter().map(|s| StreamData::new(s.format, s.dim, s.element_type)).collect(),
            },
            end_of_sweep: false,
            end_of_run: false,
            bptt: None,
        }
    }
    /// Number of sequences.
    pub fn num_sequences(&self) -> usize {
        self.data.num_sequences()
    }
    /// Σ of the declared lengths (what the minibatch size counts).
    pub fn num_declared_samples(&self) -> u64 {
        self.data.num_samples.iter().map(|&n| u64::from(n)).sum()
    }
}

/// A minibatch planned by [`MinibatchSource::next_planned`]: its sequences chosen, their chunks loaded and
/// held, the packer's checks made; [`assemble_into`](Self::assemble_into) copies the sequences into a batch.
/// Planning is sequential (it is the source's order); assembling plans is independent, so several can be
/// assembled at once on other threads.
#[derive(Debug)]
pub struct PlannedBatch(Planned);

#[derive(Debug)]
enum Planned {
    /// The run is over (no sequence).
    Empty { end_of_sweep: bool, end_of_run: bool },
    /// Sequences to copy.
    Copy(Plan),
    /// Assembled already (truncated BPTT), and whether it is a minibatch (false: the run is over).
    Ready(Box<Batch>, bool),
}

/// The sizes of an assembled minibatch ([`PlannedBatch::sizes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BatchSizes {
    /// Sequences.
    pub sequences: usize,
    /// Σ of their declared lengths.
    pub declared: usize,
    /// Per stream: entries of `values` (and of `indices` when sparse), and samples.
    pub streams: Vec<(usize, usize)>,
}

impl BatchSizes {
    /// The sizes of `self`'s minibatch followed by `other`'s in one batch.
    pub(crate) fn add(&mut self, other: &BatchSizes) {
        self.sequences += other.sequences;
        self.declared += other.declared;
        if self.streams.len() < other.streams.len() {
            self.streams.resize(other.streams.len(), (0, 0));
        }
        for (a, b) in self.streams.iter_mut().zip(&other.streams) {
            a.0 += b.0;
            a.1 += b.1;
        }
    }
}

/// The sequences of a minibatch and the chunks holding them.
struct Plan {
    picks: Vec<Pick>,
    /// `slots[i]`: the index in `chunks` of the chunk of `picks[i]`.
    slots: Vec<u32>,
    chunks: Vec<Arc<SourceChunk>>,
    end_of_sweep: bool,
    end_of_run: bool,
}

impl Plan {
    /// Appends the sequences to `batch` and sets its flags.
    fn append_to(&self, batch: &mut Batch) {
        batch.end_of_sweep = self.end_of_sweep;
        batch.end_of_run = self.end_of_run;
        batch.data.keys.extend(self.picks.iter().map(|q| q.key));
        batch.data.num_samples.extend(self.picks.iter().map(|q| q.num_samples));
        let views: Vec<chunk::ChunkView<'_>> = self.chunks.iter().map(|c| c.view()).collect();
        fill(&self.picks, &views, &self.slots, &mut batch.data.streams);
    }
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("sequences", &self.picks.len())
            .field("chunks", &self.chunks.len())
            .field("end_of_sweep", &self.end_of_sweep)
            .field("end_of_run", &self.end_of_run)
            .finish()
    }
}

impl PlannedBatch {
    /// Whether the run is over: this plan holds no minibatch (assembling it empties the batch).
    pub fn is_end(&self) -> bool {
        match &self.0 {
            Planned::Empty { .. } => true,
            Planned::Copy(_) => false,
            Planned::Ready(_, more) => !more,
        }
    }

    /// Whether the minibatch was assembled when it was planned (truncated BPTT): assembling it moves its
    /// buffers into the batch instead of copying into the batch's own.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self.0, Planned::Ready(..))
    }

    /// The sizes of the minibatch's vectors once assembled: per stream the values (entries: samples × dim
    /// when dense, non-zeros when sparse) and samples, and the number of sequences.
    pub(crate) fn sizes(&self) -> BatchSizes {
        match &self.0 {
            Planned::Empty { .. } => BatchSizes::default(),
            Planned::Ready(b, _) => BatchSizes {
                sequences: b.num_sequences(),
                declared: b.data.num_samples.iter().map(|&n| n as usize).sum(),
                streams: b.data.streams.iter().map(|s| (s.values.len(), s.num_samples() as usize)).collect(),
            },
            Planned::Copy(p) => {
                let views: Vec<chunk::ChunkView<'_>> = p.chunks.iter().map(|c| c.view()).collect();
                let streams = views.first().map_or(0, |v| v.num_streams());
                let mut sizes = vec![(0usize, 0usize); streams];
                for (q, &slot) in p.picks.iter().zip(&p.slots) {
                    let v = views[slot as usize];
                    for (st, (entries, samples)) in sizes.iter_mut().enumerate() {
                        *entries += v.sequence_entries(st, q.index as usize) as usize;
                        *samples += v.sequence_len(st, q.index as usize) as usize;
                    }
                }
                let declared = p.picks.iter().map(|q| q.num_samples as usize).sum();
                BatchSizes { sequences: p.picks.len(), declared, streams: sizes }
            }
        }
    }

    /// Copies the minibatch into `batch` (emptied first, its allocations reused; `streams` are the
    /// source's [`streams`](MinibatchSource::streams)). Returns false, with `batch` empty, when the run is
    /// over.
    pub fn assemble_into(self, streams: &[StreamSpec], batch: &mut Batch) -> bool {
        match self.0 {
            Planned::Empty { end_of_sweep, end_of_run } => {
                prepare(batch, streams);
                batch.bptt = None;
                batch.end_of_sweep = end_of_sweep;
                batch.end_of_run = end_of_run;
                false
            }
            Planned::Ready(b, more) => {
                *batch = *b;
                more
            }
            Planned::Copy(p) => {
                prepare(batch, streams);
                batch.bptt = None;
                p.append_to(batch);
                true
            }
        }
    }

    /// Appends the minibatch's sequences to `batch` (of the source's streams), after those it holds: several
    /// minibatches in one batch, one after another (their flags are those of the last). Returns false
    /// without appending anything when the run is over. A minibatch of truncated BPTT (assembled already,
    /// [`is_ready`](Self::is_ready)) cannot be appended: it replaces the batch's content when `batch` is
    /// empty and is refused (false) otherwise.
    pub(crate) fn append_to(self, streams: &[StreamSpec], batch: &mut Batch) -> bool {
        match self.0 {
            Planned::Empty { .. } => false,
            Planned::Ready(..) if batch.num_sequences() > 0 => false,
            Planned::Ready(..) => self.assemble_into(streams, batch),
            Planned::Copy(p) => {
                p.append_to(batch);
                true
            }
        }
    }
}

/// A checkpoint of a [`MinibatchSource`]; see the module docs for its JSON form (version 1, or 2 with the
/// rows of truncated BPTT).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceState {
    /// Format version: [`SourceState::VERSION`], or [`SourceState::VERSION_BPTT`] with `bptt`.
    pub version: u32,
    /// Global sample position of the next sequence (CNTK's `minibatchSourcePosition`).
    pub position: u64,
    /// Minibatches returned before the checkpoint.
    pub minibatches: u64,
    /// The data's sweep size in samples.
    pub sweep_size: u64,
    /// Truncated BPTT: the sequences held in the rows (fetched, not yet wholly delivered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bptt: Option<BpttState>,
}

impl SourceState {
    /// The version of states without BPTT rows.
    pub const VERSION: u32 = 1;
    /// The version of states with BPTT rows.
    pub const VERSION_BPTT: u32 = 2;

    /// The state as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a state serializes")
    }

    /// Parses the JSON form. Errors: not JSON of this shape, or a version this library does not read
    /// (1 without BPTT rows, 2 with them).
    pub fn from_json(s: &str) -> Result<SourceState, Error> {
        let st: SourceState =
            serde_json::from_str(s).map_err(|e| Error::state(format!("not a minibatch source state: {e}")))?;
        st.check_version()?;
        Ok(st)
    }

    fn check_version(&self) -> Result<(), Error> {
        let want = if self.bptt.is_some() { Self::VERSION_BPTT } else { Self::VERSION };
        if self.version != want {
            return Err(Error::state(format!(
                "minibatch source state version {} is not supported (this library reads version {} and, with BPTT rows, {})",
                self.version,
                Self::VERSION,
                Self::VERSION_BPTT
            )));
        }
        Ok(())
    }
}

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
            config.prefetch_depth(),
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
        if self.config.truncation_length > 0 {
            self.check_size(size)?;
            return self.next_bptt(size, batch);
        }
        Ok(PlannedBatch(self.plan_next(size)?).assemble_into(&self.out_streams, batch))
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
        let workers = u64::from(self.config.workers);
        let mut local = size / workers + u64::from(u64::from(self.config.rank) < size % workers);
        if local == 0 {
            log::warn!(
                "The minibatch size '{size}' is too small to be used with {workers} workers, adjusting to \
                 minibatch size of 1 sample per worker"
            );
            local = 1;
        }
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
            let e = std::mem::replace(&mut self.enumerator, Box::new(Parked));
            let position = e.get_state();
            match ahead::Ahead::start(e, size, local, position) {
                Ok(a) => self.ahead = Some(a),
                Err(e) => {
                    self.enumerator = e;
                    self.ahead_after = u64::MAX;
                }
            }
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

    /// A truncated-BPTT minibatch (module `bptt`).
    fn next_bptt(&mut self, size: u64, batch: &mut Batch) -> Result<bool, Error> {
        let tau = self.config.truncation_length;
        self.packer.configure(size, tau, self.config.workers, self.config.rank)?;
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

/// How many sequences ahead of the one being copied are asked into the cache.
const PREFETCH_SEQUENCES: usize = 8;

/// Appends the sequences of `picks` to `dst` (one entry per stream), stream by stream, asking for the
/// sequences a few places ahead while copying (they lie at random places of the chunks).
/// `slots[i]`: the index in `views` of the chunk of `picks[i]`.
fn fill(picks: &[Pick], views: &[chunk::ChunkView<'_>], slots: &[u32], dst: &mut [StreamData]) {
    let view = |i: usize| views[slots[i] as usize];
    // Dense values: room for the declared samples at once (a fresh batch would otherwise grow, and copy,
    // several times). A hint, capped at 4 Mi values (declared lengths come from the file): a stream longer
    // than that still grows as needed.
    let declared: usize = picks.iter().map(|p| p.num_samples as usize).sum();
    for d in dst.iter_mut().filter(|d| matches!(d.layout, Layout::Dense)) {
        let want = dense_reserve(declared, d.dim);
        match &mut d.values {
            Values::F32(v) => v.reserve(want.saturating_sub(v.len())),
            Values::F64(v) => v.reserve(want.saturating_sub(v.len())),
        }
    }
    let mut gathered = Vec::new();
    for (st, d) in dst.iter_mut().enumerate() {
        if gather_dense(picks, &view, st, d, &mut gathered) {
            continue;
        }
        // Two stages: the tables that locate a sequence twice as far ahead, its values once as far ahead.
        for (i, p) in picks.iter().enumerate().take(2 * PREFETCH_SEQUENCES) {
            view(i).prefetch_locator(st, p.index as usize);
        }
        for (i, p) in picks.iter().enumerate().take(PREFETCH_SEQUENCES) {
            view(i).prefetch(st, p.index as usize);
        }
        for (i, p) in picks.iter().enumerate() {
            if let Some(q) = picks.get(i + 2 * PREFETCH_SEQUENCES) {
                view(i + 2 * PREFETCH_SEQUENCES).prefetch_locator(st, q.index as usize);
            }
            if let Some(q) = picks.get(i + PREFETCH_SEQUENCES) {
                view(i + PREFETCH_SEQUENCES).prefetch(st, q.index as usize);
            }
            view(i).append(st, p.index as usize, d);
        }
    }
}

/// The room [`fill`] asks for in a dense stream's values before copying: `declared` samples of `dim`
/// values, at most 4 Mi values (a hint: declared lengths come from the file).
pub(crate) fn dense_reserve(declared: usize, dim: usize) -> usize {
    declared.saturating_mul(dim).min(1 << 22)
}

/// How many sequences ahead of the one being copied are asked into the cache by [`gather_dense`].
const GATHER_AHEAD: usize = 8;

/// Appends the values of dense stream `st` of the sequences of `picks` to `d` when every one of them is
/// located without reading a CBF chunk ([`ChunkView::dense_values`](chunk::ChunkView::dense_values));
/// returns false, with `d` unchanged, if some is not. First where each sequence lies (parsed data: reading
/// its sequence offsets, asked for a few places ahead), then the copies, asking for the sequences' values a
/// few places ahead: with nothing but the copy and the hint in the loop, more of the misses are in flight
/// at once.
fn gather_dense<'a>(
    picks: &[Pick],
    view: &impl Fn(usize) -> chunk::ChunkView<'a>,
    st: usize,
    d: &mut StreamData,
    gathered: &mut Vec<(chunk::DenseValues<'a>, u32)>,
) -> bool {
    if !matches!(d.layout, Layout::Dense) {
        return false;
    }
    gathered.clear();
    for (i, p) in picks.iter().enumerate().take(GATHER_AHEAD) {
        view(i).prefetch_locator(st, p.index as usize);
    }
    for (i, p) in picks.iter().enumerate() {
        if let Some(q) = picks.get(i + GATHER_AHEAD) {
            view(i + GATHER_AHEAD).prefetch_locator(st, q.index as usize);
        }
        match view(i).dense_values(st, p.index as usize) {
            Some(g) => gathered.push(g),
            None => return false,
        }
    }
    for (v, _) in gathered.iter().take(GATHER_AHEAD) {
        v.prefetch();
    }
    let mut last = *d.sequence_offsets.last().expect("starts with 0");
    for (i, &(v, n)) in gathered.iter().enumerate() {
        if let Some((q, _)) = gathered.get(i + GATHER_AHEAD) {
            q.prefetch();
        }
        v.append_to(&mut d.values);
        last += u64::from(n);
        d.sequence_offsets.push(last);
    }
    true
}

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

/// Makes `batch` empty with the streams' layout, keeping allocations.
fn prepare(batch: &mut Batch, streams: &[StreamSpec]) {
    let same = batch.data.streams.len() == streams.len()
        && batch
            .data
            .streams
            .iter()
            .zip(streams)
            .all(|(d, s)| d.format() == s.format && d.dim == s.dim && d.values.element_type() == s.element_type);
    if same {
        batch.data.clear();
    } else {
        *batch = Batch::new(streams);
    }
    batch.end_of_sweep = false;
    batch.end_of_run = false;
}

/// Appends sequence `i` of `src` to `dst` (same storage format).
pub(crate) fn append_sequence(dst: &mut StreamData, src: &StreamData, i: usize) {
    let samples = src.sequence_samples(i);
    let n = samples.end - samples.start;
    match (&mut dst.layout, &src.layout) {
        (Layout::Dense, Layout::Dense) => {
            let dim = src.dim;
            dst.values.extend_from(&src.values, samples.start as usize * dim..samples.end as usize * dim);
        }
        (Layout::Sparse { indices, sample_offsets }, Layout::Sparse { indices: si, sample_offsets: so }) => {
            let a = so[samples.start as usize] as usize;
            let b = so[samples.end as usize] as usize;
            dst.values.extend_from(&src.values, a..b);
            indices.extend_from_slice(&si[a..b]);
            let base = *sample_offsets.last().expect("starts with 0");
            sample_offsets
                .extend(so[samples.start as usize + 1..=samples.end as usize].iter().map(|&o| o - a as u64 + base));
        }
        _ => unreachable!("a deserializer's chunks have its streams' storage formats"),
    }
    let last = *dst.sequence_offsets.last().expect("starts with 0");
    dst.sequence_offsets.push(last + n);
}
