//! The configuration of a minibatch source: its run length and options (READER.md §9.1).

use crate::randomize::{ElasticResume, EpochConfig, Window};

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
    /// loading thread, as many of them as fit in [`PREFETCH_BYTES_PER_THREAD`] of file per thread, one at
    /// least). Chunks held:
    /// the window's plus these (READER.md §3.5). Never changes a minibatch.
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

/// By default, the chunks loaded ahead beyond the randomization window hold at most this many bytes of
/// their files (a CTF chunk's text, a CBF chunk's records) per loading thread, beyond the first of them:
/// with CNTK's chunks of 32 MiB, one per thread.
pub const PREFETCH_BYTES_PER_THREAD: u64 = 32 << 20;

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
                .unwrap_or_else(|| crate::threads_or_cores(None))
        })
    }

    /// The prefetch depth in chunks: [`prefetch`](Self::prefetch), else 2 per loading thread.
    pub fn prefetch_depth(&self) -> usize {
        self.prefetch.unwrap_or_else(|| 2 * self.loader_threads())
    }

    /// The most bytes of file loaded ahead beyond the first chunk: [`PREFETCH_BYTES_PER_THREAD`] per
    /// loading thread, unless [`prefetch`](Self::prefetch) is given.
    pub fn prefetch_bytes(&self) -> u64 {
        match self.prefetch {
            Some(_) => u64::MAX,
            None => PREFETCH_BYTES_PER_THREAD.saturating_mul(self.loader_threads().max(1) as u64),
        }
    }

    /// The run's end on the global timeline, for a sweep of `sweep_size` samples.
    pub(super) fn run_end(&self, sweep_size: u64) -> u64 {
        match self.run_length.normalized() {
            RunLength::Infinite => u64::MAX / 2,
            RunLength::Samples(n) => n,
            RunLength::Sweeps(k) => sweep_size.saturating_mul(k),
        }
    }

    /// The V2 run as an epoch: epoch 0 crossing sweeps (READER.md §4.5).
    pub(super) fn epoch(&self) -> EpochConfig {
        let (epoch_size, sweeps) = match self.run_length.normalized() {
            RunLength::Infinite => (u64::MAX / 2, None),
            RunLength::Samples(n) => (n, None),
            RunLength::Sweeps(k) => (u64::MAX / 2, Some(k)),
        };
        EpochConfig { epoch_size, epoch_index: 0, workers: self.workers, rank: self.rank, sweeps, cross_sweeps: true }
    }
}
