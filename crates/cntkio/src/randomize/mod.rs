//! Sequence randomization and epochs, bit-for-bit as CNTK 2.7 (READER.md §1–§4, §6, §8).
//!
//! This module decides *which* sequence comes next; it reads no files, starts no threads, reads no clock
//! and has no global random state. Its output is a pure function of the chunk/sequence structure exposed
//! by a [`SequenceSource`], the configuration (window, seed, epoch, workers) and the calls made. The order
//! is a public contract: it matches CNTK 2.7 and the model in `testdata/model/readerref.py`,
//! and `tests/shuffle.rs` pins it with golden and differential fixtures.
//!
//! * [`BlockRandomizer`] — randomization on: chunks are permuted every sweep ([`ChunkRandomizer`]) and
//!   sequences are shuffled within a rolling window of chunks ([`SequenceRandomizer`]).
//! * [`NoRandomizer`] — randomization off: chunks and sequences in file order.
//!
//! Both implement [`SequenceEnumerator`]: [`start_epoch`](SequenceEnumerator::start_epoch),
//! [`get_next`](SequenceEnumerator::get_next), [`get_state`](SequenceEnumerator::get_state) and
//! [`set_state`](SequenceEnumerator::set_state).
//!
//! ```
//! use cntkio::randomize::{
//!     BlockRandomizer, ChunkInfo, EpochConfig, SequenceEnumerator, SequenceInfo, SequenceSource, Window,
//! };
//! use cntkio::Error;
//!
//! /// Three chunks of three one-sample sequences with keys 0..9.
//! struct Toy(Vec<ChunkInfo>);
//! impl SequenceSource for Toy {
//!     fn chunks(&self) -> &[ChunkInfo] {
//!         &self.0
//!     }
//!     fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
//!         out.extend((0..3).map(|i| SequenceInfo { num_samples: 1, key: u64::from(chunk) * 3 + i }));
//!         Ok(())
//!     }
//! }
//!
//! let toy = Toy(vec![ChunkInfo { num_samples: 3, num_sequences: 3 }; 3]);
//! let mut r = BlockRandomizer::new(toy, Window::Chunks(128), 0)?;
//! r.start_epoch(&EpochConfig { sweeps: Some(1), ..EpochConfig::default() })?;
//! let mut keys = Vec::new();
//! loop {
//!     let mb = r.get_next(u64::MAX, 4)?;
//!     keys.extend(mb.picks.iter().map(|p| p.key));
//!     if mb.end_of_epoch {
//!         break;
//!     }
//! }
//! keys.sort();
//! assert_eq!(keys, (0..9).collect::<Vec<u64>>());
//! # Ok::<(), Error>(())
//! ```

mod block;
mod chunk;
mod elastic;
mod mt;
mod no_randomizer;
mod sequence;

pub(crate) use block::elastic_needs_balanced;
pub use block::BlockRandomizer;
pub use chunk::{ChunkRandomizer, RandomizedChunk};
pub use elastic::ElasticResume;
pub use mt::Mt19937_64;
pub use no_randomizer::NoRandomizer;
pub use sequence::{RandomizedSequence, SequenceRandomizer};

use crate::Error;

/// CNTK's `requestDataSize` (`SIZE_MAX >> 2`): as an epoch size it means "one sweep" (READER.md §4.5).
pub const REQUEST_DATA_SIZE: u64 = u64::MAX >> 2;

/// Python's `INFINITELY_REPEAT` (`2^64 − 1`): an epoch that never ends.
pub const INFINITELY_REPEAT: u64 = u64::MAX;

/// What a deserializer tells the randomizer about one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ChunkInfo {
    /// Σ of the declared lengths of the chunk's sequences (READER.md §1).
    ///
    /// Not checked (CNTK does not check it either, and CBF files can disagree). The chunk table alone
    /// places the sweeps on the timeline; if it declares more samples than the sequences have, a sweep
    /// ends when its sequences are over and the rest of it is skipped (CNTK would stall there or hand the
    /// same sequences out again). Sequences that all have length 0 are an
    /// [`ErrorKind::ZeroLengthSequences`](crate::ErrorKind::ZeroLengthSequences) error when found.
    pub num_samples: u64,
    /// Number of sequences in the chunk; [`SequenceSource::sequences`] must return exactly this many.
    pub num_sequences: u32,
}

/// What a deserializer tells the randomizer about one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SequenceInfo {
    /// Declared length: the number of samples used for all minibatch and epoch accounting.
    pub num_samples: u32,
    /// The sequence key (CTF: the numeric id; CBF: the global sequence index).
    pub key: u64,
}

/// The chunk and sequence structure of a data set. A chunk is identified by its index in [`chunks`],
/// a sequence by its index in the list [`sequences`] returns for its chunk.
///
/// The randomizers ask for a chunk's sequence list only when they need it (the window moves over the
/// chunks), and may ask for the same chunk again after they released it.
///
/// [`chunks`]: SequenceSource::chunks
/// [`sequences`]: SequenceSource::sequences
pub trait SequenceSource {
    /// All chunks in their original order.
    fn chunks(&self) -> &[ChunkInfo];
    /// Appends the sequences of chunk `chunk` (an index into [`chunks`](SequenceSource::chunks)), in
    /// their order inside the chunk, to `out` (which the caller passes empty).
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error>;
    /// `Some((first key, declared length))` when every sequence of chunk `chunk` has that length and the
    /// keys count up by one from the first (as in CBF files), found without listing them: the randomizers
    /// then keep no list for the chunk. `None` (the default) when they must call
    /// [`sequences`](SequenceSource::sequences).
    fn uniform_sequences(&self, chunk: u32) -> Result<Option<(u64, u32)>, Error> {
        let _ = chunk;
        Ok(None)
    }
}

impl<T: SequenceSource + ?Sized> SequenceSource for &T {
    fn chunks(&self) -> &[ChunkInfo] {
        (**self).chunks()
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        (**self).sequences(chunk, out)
    }
    fn uniform_sequences(&self, chunk: u32) -> Result<Option<(u64, u32)>, Error> {
        (**self).uniform_sequences(chunk)
    }
}

impl<T: SequenceSource + ?Sized> SequenceSource for Box<T> {
    fn chunks(&self) -> &[ChunkInfo] {
        (**self).chunks()
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        (**self).sequences(chunk, out)
    }
    fn uniform_sequences(&self, chunk: u32) -> Result<Option<(u64, u32)>, Error> {
        (**self).uniform_sequences(chunk)
    }
}

impl<T: SequenceSource + ?Sized> SequenceSource for std::sync::Arc<T> {
    fn chunks(&self) -> &[ChunkInfo] {
        (**self).chunks()
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        (**self).sequences(chunk, out)
    }
    fn uniform_sequences(&self, chunk: u32) -> Result<Option<(u64, u32)>, Error> {
        (**self).uniform_sequences(chunk)
    }
}

/// One sequence handed out by an enumerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pick {
    /// The chunk, as an index into [`SequenceSource::chunks`].
    pub chunk: u32,
    /// The sequence's index in its chunk's [`SequenceSource::sequences`] list.
    pub index: u32,
    /// Declared length.
    pub num_samples: u32,
    /// Key.
    pub key: u64,
}

/// The result of [`SequenceEnumerator::get_next`]: the sequences of one minibatch for this worker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Minibatch {
    /// The sequences, in delivery order. May be empty (end of the epoch, or nothing local to this worker).
    pub picks: Vec<Pick>,
    /// The request reached or crossed the end of a sweep (Python `MinibatchData.end_of_sweep`).
    pub end_of_sweep: bool,
    /// The request reached the end of the epoch (or of the whole run in the V2 API).
    pub end_of_epoch: bool,
}

/// Size of the randomization window (READER.md §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    /// A window of this many chunks (`randomization_window_in_chunks`; CNTK's default is 128).
    Chunks(u64),
    /// A window of about this many samples (`randomization_window_in_samples`).
    Samples(u64),
}

impl Default for Window {
    /// CNTK's default: 128 chunks.
    fn default() -> Self {
        Window::Chunks(128)
    }
}

/// Where an epoch lies on the global timeline and who reads it ([`SequenceEnumerator::start_epoch`]).
///
/// The V2/Python API runs one epoch (`epoch_index` 0) for the whole run with `cross_sweeps: true`; its
/// size is `max_samples`, or `sweeps: Some(max_sweeps)`, or 2^63 − 1 samples for "infinitely repeat"
/// (READER.md §4.5). The legacy BrainScript path calls `start_epoch` for every epoch *e* with
/// `cross_sweeps: false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpochConfig {
    /// Epoch size in samples; [`REQUEST_DATA_SIZE`] means one sweep. Ignored when `sweeps` is set.
    pub epoch_size: u64,
    /// The epoch starts at `epoch_index × epoch size` on the global timeline.
    pub epoch_index: u64,
    /// Number of workers reading the same data (≥ 1).
    pub workers: u32,
    /// This worker's rank (< `workers`).
    pub rank: u32,
    /// Epoch size in sweeps, overriding `epoch_size` (Python `max_sweeps`).
    pub sweeps: Option<u64>,
    /// A minibatch may continue into the next sweep (true in the V2/Python API, READER.md §4.3).
    pub cross_sweeps: bool,
}

impl Default for EpochConfig {
    /// An endless epoch 0 for a single worker, not crossing sweeps.
    fn default() -> Self {
        EpochConfig {
            epoch_size: INFINITELY_REPEAT,
            epoch_index: 0,
            workers: 1,
            rank: 0,
            sweeps: None,
            cross_sweeps: false,
        }
    }
}

impl EpochConfig {
    /// Checks `workers` and `rank`.
    fn validate(&self) -> Result<(), Error> {
        check_worker(self.rank.into(), self.workers.into())
    }

    /// The epoch size in samples for a sweep of `sweep_size` samples (saturating).
    fn size_in_samples(&self, sweep_size: u64) -> u64 {
        match self.sweeps {
            Some(k) => sweep_size.saturating_mul(k),
            None if self.epoch_size == REQUEST_DATA_SIZE => sweep_size,
            None => self.epoch_size,
        }
    }
}

/// A sequence enumerator: hands out sequences minibatch by minibatch along the global timeline.
///
/// Positions are samples on the global timeline (sweep *k* occupies `[k·S, (k+1)·S)`, S =
/// [`sweep_size`](SequenceEnumerator::sweep_size)). Arithmetic on positions saturates at `u64::MAX`.
///
/// Whatever the data, a call's work is proportional to the sequences it hands out plus a bounded number
/// of passes over the sequences. Where CNTK would loop forever or stall (zero-length sequences, chunk
/// tables that disagree with the sequences), cntkio stops, skips ahead or reports an error instead; see
/// [`ChunkInfo::num_samples`].
pub trait SequenceEnumerator {
    /// Sets the epoch and the worker configuration, and seeks to the start of the epoch.
    ///
    /// Errors: `workers == 0` or `rank >= workers` ([`ErrorKind::WorkerOutOfRange`](crate::ErrorKind::WorkerOutOfRange)),
    /// data without samples (see [`ChunkInfo::num_samples`]), and errors of the [`SequenceSource`].
    fn start_epoch(&mut self, config: &EpochConfig) -> Result<(), Error>;

    /// The next minibatch: at most `global` samples walked on the timeline and at most `local` samples
    /// delivered to this worker, except that the first delivered sequence is always taken
    /// (READER.md §4.2–§4.4).
    ///
    /// Errors: data without samples (see [`ChunkInfo::num_samples`]), and errors of the [`SequenceSource`].
    fn get_next(&mut self, global: u64, local: u64) -> Result<Minibatch, Error>;

    /// The global sample position of the next sequence (`minibatchSourcePosition` of a checkpoint).
    fn get_state(&self) -> u64;

    /// Seeks to `position`: to the first sequence boundary at or after it (READER.md §8.2).
    ///
    /// Errors: data without samples (see [`ChunkInfo::num_samples`]), and errors of the [`SequenceSource`].
    fn set_state(&mut self, position: u64) -> Result<(), Error>;

    /// Sweep size: Σ of the chunks' sample counts.
    fn sweep_size(&self) -> u64;

    /// With balanced dealing ([`BlockRandomizer::with_balanced_workers`]): the number of sequences of sweep
    /// `sweep` dealt to this worker before the current position (0 before the sweep, its whole share after
    /// it; in a sweep resumed elastically, of the sequences left to this run, see [`ElasticResume`]). `None`
    /// where the enumerator does not count them (chunk dealing, no randomization).
    fn sequences_delivered(&self, sweep: u64) -> Option<u64> {
        let _ = sweep;
        None
    }
}

impl<T: SequenceEnumerator + ?Sized> SequenceEnumerator for Box<T> {
    fn start_epoch(&mut self, config: &EpochConfig) -> Result<(), Error> {
        (**self).start_epoch(config)
    }
    fn get_next(&mut self, global: u64, local: u64) -> Result<Minibatch, Error> {
        (**self).get_next(global, local)
    }
    fn get_state(&self) -> u64 {
        (**self).get_state()
    }
    fn set_state(&mut self, position: u64) -> Result<(), Error> {
        (**self).set_state(position)
    }
    fn sweep_size(&self) -> u64 {
        (**self).sweep_size()
    }
    fn sequences_delivered(&self, sweep: u64) -> Option<u64> {
        (**self).sequences_delivered(sweep)
    }
}

/// Checks that there is a worker and that `rank` is one of the `workers`.
pub(crate) fn check_worker(rank: u64, workers: u64) -> Result<(), Error> {
    if rank >= workers {
        return Err(Error::new(crate::ErrorKind::WorkerOutOfRange { rank, workers }));
    }
    Ok(())
}

/// Checks a chunk list; returns `(sweep size, total number of sequences)`.
fn check_chunks(chunks: &[ChunkInfo]) -> Result<(u64, u64), Error> {
    if chunks.is_empty() {
        return Err(empty_data("chunks"));
    }
    if u32::try_from(chunks.len()).is_err() {
        return Err(Error::limit("number of chunks", chunks.len() as u64, u32::MAX.into()));
    }
    let mut samples = 0u64;
    let mut sequences = 0u64;
    for c in chunks {
        samples = samples
            .checked_add(c.num_samples)
            .ok_or_else(|| Error::limit("total number of samples, a sum that overflows 64 bits", u64::MAX, u64::MAX))?;
        sequences += u64::from(c.num_sequences);
    }
    if samples == 0 {
        return Err(empty_data("samples (the sweep size is 0)"));
    }
    if sequences == 0 {
        return Err(empty_data("sequences"));
    }
    Ok((samples, sequences))
}

fn empty_data(missing: &str) -> Error {
    Error::new(crate::ErrorKind::EmptyData { missing: missing.to_string() })
}

/// The error for data whose `sequences` all have length 0 although the chunk table declares `declared`
/// samples: no position on the timeline can ever be reached, so no epoch could end.
fn no_samples(sequences: u64, declared: u64) -> Error {
    Error::new(crate::ErrorKind::ZeroLengthSequences { sequences, declared })
}

/// The sequences of one chunk, by index in the chunk.
#[derive(Debug, Clone, Default)]
pub(crate) enum ChunkSequences {
    /// None.
    #[default]
    Empty,
    /// All of length `num_samples`, with keys `first_key`, `first_key + 1`, … (as in CBF files, and CTF
    /// files with consecutive ids): found by arithmetic, with no table to read.
    Uniform { first_key: u64, num_samples: u32, count: u32 },
    /// As listed by the source.
    Listed(Vec<SequenceInfo>),
}

impl ChunkSequences {
    /// The sequences of `chunk`, which the chunk table says has `expected`: told by the source as uniform
    /// when it can ([`SequenceSource::uniform_sequences`]), else listed through `scratch` (a reusable
    /// buffer) and kept as uniform when they are. Errors: the source's, or a list of another length.
    pub(crate) fn load<S: SequenceSource + ?Sized>(
        source: &S,
        chunk: u32,
        expected: u32,
        scratch: &mut Vec<SequenceInfo>,
    ) -> Result<ChunkSequences, Error> {
        if expected > 0 {
            if let Some((first_key, num_samples)) = source.uniform_sequences(chunk)? {
                if first_key.checked_add(u64::from(expected - 1)).is_some() {
                    return Ok(ChunkSequences::Uniform { first_key, num_samples, count: expected });
                }
            }
        }
        scratch.clear();
        source.sequences(chunk, scratch)?;
        if scratch.len() != expected as usize {
            let (declared, found) = (expected.into(), scratch.len() as u64);
            return Err(Error::new(crate::ErrorKind::ChunkSequenceCount { chunk: chunk.into(), declared, found }));
        }
        let first_key = scratch.first().map_or(0, |s| s.key);
        let num_samples = scratch.first().map_or(0, |s| s.num_samples);
        let uniform = scratch
            .iter()
            .enumerate()
            .all(|(k, s)| s.num_samples == num_samples && first_key.checked_add(k as u64) == Some(s.key));
        Ok(if uniform {
            ChunkSequences::Uniform { first_key, num_samples, count: expected }
        } else {
            ChunkSequences::Listed(std::mem::take(scratch))
        })
    }

    /// Number of sequences.
    pub(crate) fn len(&self) -> u32 {
        match self {
            ChunkSequences::Empty => 0,
            ChunkSequences::Uniform { count, .. } => *count,
            ChunkSequences::Listed(v) => v.len() as u32,
        }
    }

    /// `(num_samples, key)` of sequence `index`, which must exist (a window slot's).
    #[inline]
    pub(crate) fn at(&self, index: u32) -> (u32, u64) {
        match self {
            ChunkSequences::Uniform { first_key, num_samples, count } => {
                debug_assert!(index < *count);
                (*num_samples, first_key + u64::from(index))
            }
            ChunkSequences::Listed(v) => {
                let s = v[index as usize];
                (s.num_samples, s.key)
            }
            ChunkSequences::Empty => unreachable!("a slot of a chunk without sequences"),
        }
    }

    /// Sequence `index`, if there is one.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<SequenceInfo> {
        match self {
            ChunkSequences::Empty => None,
            ChunkSequences::Uniform { first_key, num_samples, count } => {
                (index < *count).then(|| SequenceInfo { num_samples: *num_samples, key: first_key + u64::from(index) })
            }
            ChunkSequences::Listed(v) => v.get(index as usize).copied(),
        }
    }
}
