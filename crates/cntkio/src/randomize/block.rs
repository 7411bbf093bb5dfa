//! Randomized reading: sweeps, epochs, minibatch filling and worker decimation (CNTK `BlockRandomizer`,
//! READER.md §3–§4, §6, §8).

use super::elastic::{share, ElasticCursor};
use super::{
    check_chunks, no_samples, ChunkRandomizer, ElasticResume, EpochConfig, Minibatch, Pick, SequenceEnumerator,
    SequenceRandomizer, SequenceSource, Window, INFINITELY_REPEAT,
};
use crate::Error;

/// What one pass inside a sweep produced.
struct Pass {
    end_of_sweep: bool,
    end_of_epoch: bool,
    global: u64,
    local: u64,
}

/// Randomized sequence enumerator (randomization on), bit-for-bit as CNTK 2.7's `BlockRandomizer`.
///
/// Sweep *k* is randomized with seed `seed + k` (wrapping). A sequence is delivered to worker `rank`
/// iff its home chunk position mod `workers` equals `rank` (chunks, not sequences, are dealt to
/// workers; READER.md §6).
///
/// Restoring a position in a sweep whose shuffle must be restarted uses `seed + k` by default, which
/// continues exactly like an uninterrupted run. CNTK 2.7 seeds that restart with the bare sweep number
/// `k` instead; [`with_cntk_seek_quirk(true)`](Self::with_cntk_seek_quirk) reproduces that
/// (READER.md §8.3).
#[derive(Debug, Clone)]
pub struct BlockRandomizer<S> {
    source: S,
    sequences: SequenceRandomizer,
    sweep: Option<u64>,
    seed: u64,
    seek_quirk: bool,
    balanced: bool,
    /// With balanced dealing: the sweep resumed elastically, and the walk over it where `take` left it.
    elastic: Option<ElasticResume>,
    cursor: Option<ElasticCursor>,
    sweep_size: u64,
    num_sequences: u64,
    pos: u64,
    epoch_size: u64,
    epoch_start: u64,
    workers: u32,
    rank: u32,
    cross_sweeps: bool,
}

impl<S: SequenceSource> BlockRandomizer<S> {
    /// A randomizer over `source` with window `window` and randomization seed `seed`
    /// (`randomization_seed`, default 0).
    ///
    /// Until [`start_epoch`](SequenceEnumerator::start_epoch) is called the epoch is endless, with one
    /// worker and no sweep crossing.
    ///
    /// Errors: no chunks, samples or sequences ([`ErrorKind::EmptyData`](crate::ErrorKind::EmptyData)), more than `u32::MAX` chunks or a
    /// sample count overflowing `u64` ([`ErrorKind::Limit`](crate::ErrorKind::Limit)).
    pub fn new(source: S, window: Window, seed: u64) -> Result<BlockRandomizer<S>, Error> {
        let (sweep_size, num_sequences) = check_chunks(source.chunks())?;
        let chunks = ChunkRandomizer::new(source.chunks(), window);
        Ok(BlockRandomizer {
            source,
            sequences: SequenceRandomizer::new(chunks),
            sweep: None,
            seed,
            seek_quirk: false,
            balanced: false,
            elastic: None,
            cursor: None,
            sweep_size,
            num_sequences,
            pos: 0,
            epoch_size: INFINITELY_REPEAT,
            epoch_start: 0,
            workers: 1,
            rank: 0,
            cross_sweeps: false,
        })
    }

    /// Reproduce CNTK 2.7's seek quirk: when a seek restarts a sweep's sequence shuffle, seed it with
    /// the bare sweep number instead of `seed + sweep` (readerref.py `seek_bug`). Off by default.
    pub fn with_cntk_seek_quirk(mut self, on: bool) -> BlockRandomizer<S> {
        self.seek_quirk = on;
        self
    }

    /// Deal sequences, not chunks, to the workers: the sequence at index `t` of the sweep's randomized
    /// order goes to worker `t mod workers` (a deliberate addition, not in CNTK: with CNTK's chunk dealing
    /// workers get as many samples as their chunks hold, and a worker gets nothing when there are fewer
    /// chunks than workers). Off by default. The order of the sequences is the same either way.
    pub fn with_balanced_workers(mut self, on: bool) -> BlockRandomizer<S> {
        self.balanced = on;
        self
    }

    /// Resume sweep `resume.sweep` elastically (module [`elastic`](super::ElasticResume)): the sequences the
    /// earlier runs of `resume` read are left out of it, and the rest are dealt to this run's workers in
    /// turn. Needs balanced dealing ([`with_balanced_workers(true)`](Self::with_balanced_workers), called
    /// first). The run still starts where it always does; restore a position at the start of the sweep
    /// (`sweep × sweep size`) to begin there.
    ///
    /// Errors: chunk dealing ([`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption): CNTK's cannot resume with other workers), or rounds
    /// that [`ElasticResume::check`] refuses for this data.
    pub fn with_elastic_resume(mut self, resume: ElasticResume) -> Result<BlockRandomizer<S>, Error> {
        if !self.balanced {
            return Err(elastic_needs_balanced());
        }
        resume.check(self.num_sequences)?;
        self.elastic = Some(resume);
        self.cursor = None;
        Ok(self)
    }

    /// The elastic resume data, if any.
    pub fn elastic_resume(&self) -> Option<&ElasticResume> {
        self.elastic.as_ref()
    }

    /// The source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Gives the source back.
    pub fn into_source(self) -> S {
        self.source
    }

    /// The randomization seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The sweep currently randomized (`None` before the first read or seek).
    pub fn current_sweep(&self) -> Option<u64> {
        self.sweep
    }

    /// The sequence randomizer of the current sweep (its chunk permutation and windows).
    pub fn sequence_randomizer(&self) -> &SequenceRandomizer {
        &self.sequences
    }

    fn epoch_end(&self) -> u64 {
        self.epoch_start.saturating_add(self.epoch_size)
    }

    /// Makes sure the sweep of position `p` is the randomized one.
    fn prepare(&mut self, p: u64) -> Result<(), Error> {
        let sweep = p / self.sweep_size;
        if self.sweep != Some(sweep) {
            // Set first: if loading fails, the next call retries from a clean reset.
            self.sweep = None;
            self.sequences.start_sweep(self.seed.wrapping_add(sweep), &self.source)?;
            self.sweep = Some(sweep);
        }
        Ok(())
    }

    /// Called when the sweep's sequences are over before its end on the timeline: an error if they have
    /// no samples at all (then no position could ever be reached).
    fn check_samples(&self) -> Result<(), Error> {
        if self.sequences.position() == 0 {
            return Err(no_samples(self.sequences.num_sequences(), self.sweep_size));
        }
        Ok(())
    }

    /// One pass inside the sweep of `pos` (READER.md §4.3 `take`).
    fn take(&mut self, global: u64, local: u64, at_least_one: bool, out: &mut Vec<Pick>) -> Result<Pass, Error> {
        self.prepare(self.pos)?;
        let sweep_size = self.sweep_size;
        let pos = self.pos;
        let sp = pos % sweep_size;
        let end = self.epoch_end();
        if pos >= end {
            return Ok(Pass { end_of_sweep: pos >= sweep_size && sp == 0, end_of_epoch: true, global: 0, local: 0 });
        }
        let global = global.min(sweep_size - sp);
        let workers = self.workers;
        let rank = self.rank;
        let balanced = self.balanced;
        // With balanced dealing: the index in the sweep's order of the sequence offered next.
        let mut t = self.sequences.sequence_position();
        // In a sweep resumed elastically: where `t` lies in the lists of the earlier runs (kept between calls,
        // so that reading on costs O(rounds) per sequence; a seek starts the walk anew).
        let mut elastic = match &self.elastic {
            Some(e) if balanced && self.sweep == Some(e.sweep) => {
                let c = match self.cursor.take() {
                    Some(c) if c.t == t => c,
                    _ => ElasticCursor::at(e, workers, t),
                };
                Some((e, c))
            }
            _ => None,
        };
        let (mut g, mut l, mut one) = (0u64, 0u64, at_least_one);
        let (mut eos, mut eoe) = (false, false);
        self.sequences.next(&self.source, |s| {
            let len = u64::from(s.num_samples);
            let (deal, is_local) = match &elastic {
                Some((e, c)) => {
                    let (d, mine) = c.deal(e, workers, rank);
                    (Some(d), mine)
                }
                None if balanced => (None, t % u64::from(workers) == u64::from(rank)),
                None => (None, s.home % workers == rank),
            };
            if !one {
                if g.saturating_add(len) > global {
                    return false;
                }
                if is_local && l.saturating_add(len) > local {
                    return false;
                }
            }
            if pos.saturating_add(g) >= end {
                eoe = true;
                eos = sp.saturating_add(g) >= sweep_size;
                return false;
            }
            if is_local {
                out.push(Pick { chunk: s.chunk, index: s.index, num_samples: s.num_samples, key: s.key });
                l = l.saturating_add(len);
                one = false;
            }
            g = g.saturating_add(len);
            if let (Some((_, c)), Some(d)) = (&mut elastic, deal) {
                c.step(d);
            }
            t += 1;
            true
        })?;
        if let Some((_, c)) = elastic {
            self.cursor = Some(c);
        }
        if self.sequences.at_end() && sp.saturating_add(g) < sweep_size {
            // The sweep's sequences are over before the sweep ends on the timeline, which only a chunk
            // table declaring more samples than the sequences have can cause (CNTK does not check; it
            // would return empty minibatches from here on, forever). No sequence starts in the rest of the
            // sweep: walk over it, so that the sweep ends here and reading goes on with the next one.
            self.check_samples()?;
            g = sweep_size - sp;
        }
        eos |= sp.saturating_add(g) >= sweep_size;
        eoe |= pos.saturating_add(g) >= end;
        self.pos = pos.saturating_add(g);
        Ok(Pass { end_of_sweep: eos, end_of_epoch: eoe, global: g, local: l })
    }
}

impl<S: SequenceSource> SequenceEnumerator for BlockRandomizer<S> {
    fn start_epoch(&mut self, config: &EpochConfig) -> Result<(), Error> {
        config.validate()?;
        self.workers = config.workers;
        self.rank = config.rank;
        self.cursor = None;
        self.cross_sweeps = config.cross_sweeps;
        self.epoch_size = config.size_in_samples(self.sweep_size);
        self.epoch_start = self.epoch_size.saturating_mul(config.epoch_index);
        self.set_state(self.epoch_start)
    }

    fn get_next(&mut self, global: u64, local: u64) -> Result<Minibatch, Error> {
        let mut mb = Minibatch::default();
        let (mut gl, mut ll) = (0u64, 0u64);
        loop {
            let at_boundary = mb.end_of_sweep;
            let pass = self.take(global.saturating_sub(gl), local.saturating_sub(ll), !at_boundary, &mut mb.picks)?;
            mb.end_of_sweep |= pass.end_of_sweep;
            mb.end_of_epoch |= pass.end_of_epoch;
            if at_boundary && pass.global == 0 {
                break;
            }
            gl = gl.saturating_add(pass.global);
            ll = ll.saturating_add(pass.local);
            // Guard, not in CNTK: a whole sweep walked without a single local sample can only happen with
            // zero-length sequences; CNTK would keep crossing sweeps (for up to 2^64 samples).
            if at_boundary && pass.local == 0 {
                break;
            }
            if !(self.cross_sweeps && !mb.end_of_epoch && mb.end_of_sweep && global > gl && local > ll) {
                break;
            }
        }
        Ok(mb)
    }

    fn get_state(&self) -> u64 {
        self.pos
    }

    fn set_state(&mut self, position: u64) -> Result<(), Error> {
        self.prepare(position)?;
        let sweep = position / self.sweep_size;
        let offset = position % self.sweep_size;
        let reset_seed = if self.seek_quirk { sweep } else { self.seed.wrapping_add(sweep) };
        let mut reached = self.sequences.seek(offset, reset_seed, &self.source)?;
        if self.sequences.at_end() && reached < self.sweep_size {
            // No sequence boundary is left in the sweep (see `take`): the next one starts the next sweep.
            self.check_samples()?;
            reached = self.sweep_size;
        }
        self.pos = (sweep * self.sweep_size).saturating_add(reached);
        if !self.balanced && self.rank as usize >= self.sequences.chunk_randomizer().chunks().len() {
            // CNTK: a worker with no chunk at all is placed at the end of the epoch (READER.md §6).
            self.pos = self.epoch_end();
        }
        Ok(())
    }

    fn sweep_size(&self) -> u64 {
        self.sweep_size
    }

    fn sequences_delivered(&self, sweep: u64) -> Option<u64> {
        if !self.balanced {
            return None;
        }
        let start = sweep.saturating_mul(self.sweep_size);
        let t = if self.pos <= start {
            0
        } else if self.pos >= start.saturating_add(self.sweep_size) {
            self.num_sequences
        } else {
            // Inside the sweep, the randomized one is the position's.
            debug_assert_eq!(self.sweep, Some(sweep));
            self.sequences.sequence_position()
        };
        Some(match self.elastic.as_ref().filter(|e| e.sweep == sweep) {
            Some(e) => ElasticCursor::at(e, self.workers, t).delivered(self.workers, self.rank),
            None => share(t, u64::from(self.workers), u64::from(self.rank)),
        })
    }
}

/// The error for elastic resume without balanced dealing.
pub(crate) fn elastic_needs_balanced() -> Error {
    Error::option(
        "balanced_workers",
        "elastic resume (another number of workers for the rest of a sweep) needs balanced dealing with \
         randomization (balanced_workers=True and shuffle=True); CNTK's chunk dealing cannot do it",
    )
}
