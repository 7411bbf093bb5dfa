//! Reading in file order (CNTK `NoRandomizer`, READER.md §4.4, §6, §8.2).

use super::{
    check_chunks, no_samples, ChunkInfo, ChunkSequences, EpochConfig, Minibatch, Pick, SequenceEnumerator,
    SequenceInfo, SequenceSource, INFINITELY_REPEAT,
};
use crate::Error;

/// Sequence enumerator with randomization off, bit-for-bit as CNTK 2.7's `NoRandomizer`.
///
/// Chunks and sequences come in file order, sweep after sweep. Sequences are dealt to workers round
/// robin: sequence number `gs` goes to worker `gs mod workers`, where `gs` counts across sweeps during a
/// run but restarts at the index within the sweep after [`set_state`](SequenceEnumerator::set_state)
/// (READER.md §8.2).
#[derive(Debug, Clone)]
pub struct NoRandomizer<S> {
    source: S,
    chunks: Vec<ChunkInfo>,
    /// Sample offset of each chunk in the sweep.
    sample_offsets: Vec<u64>,
    /// Sequence offset of each chunk in the sweep.
    sequence_offsets: Vec<u64>,
    sweep_size: u64,
    total_sequences: u64,
    /// The loaded chunk and its sequences.
    cur_chunk: Option<usize>,
    sequences: ChunkSequences,
    /// A buffer for listing a chunk's sequences.
    scratch: Vec<SequenceInfo>,
    /// Index of the cursor in `sequences`.
    cur_index: usize,
    pos: u64,
    /// Round-robin sequence counter.
    global_sequence: u64,
    /// The sweep in which the cursor's current round over the sequences began.
    round_sweep: u64,
    epoch_size: u64,
    epoch_index: u64,
    workers: u32,
    rank: u32,
    cross_sweeps: bool,
}

impl<S: SequenceSource> NoRandomizer<S> {
    /// An enumerator over `source` in file order.
    ///
    /// Until [`start_epoch`](SequenceEnumerator::start_epoch) is called the epoch is endless, with one
    /// worker and no sweep crossing.
    ///
    /// Errors: no chunks, no samples (CNTK: `NoRandomizer: Expected input to contain samples…`) or no
    /// sequences ([`ErrorKind::EmptyData`](crate::ErrorKind::EmptyData)), more than `u32::MAX` chunks or a sample count overflowing `u64`
    /// ([`ErrorKind::Limit`](crate::ErrorKind::Limit)).
    pub fn new(source: S) -> Result<NoRandomizer<S>, Error> {
        let (sweep_size, total_sequences) = check_chunks(source.chunks())?;
        let chunks = source.chunks().to_vec();
        let mut sample_offsets = Vec::with_capacity(chunks.len());
        let mut sequence_offsets = Vec::with_capacity(chunks.len());
        let (mut samples, mut sequences) = (0u64, 0u64);
        for c in &chunks {
            sample_offsets.push(samples);
            sequence_offsets.push(sequences);
            samples += c.num_samples;
            sequences += u64::from(c.num_sequences);
        }
        Ok(NoRandomizer {
            source,
            chunks,
            sample_offsets,
            sequence_offsets,
            sweep_size,
            total_sequences,
            cur_chunk: None,
            sequences: ChunkSequences::default(),
            scratch: Vec::new(),
            cur_index: 0,
            pos: 0,
            global_sequence: 0,
            round_sweep: 0,
            epoch_size: INFINITELY_REPEAT,
            epoch_index: 0,
            workers: 1,
            rank: 0,
            cross_sweeps: false,
        })
    }

    /// The source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Gives the source back.
    pub fn into_source(self) -> S {
        self.source
    }

    /// Loads chunk `c`, or the next chunk after it (wrapping) that has sequences.
    fn load(&mut self, mut c: usize) -> Result<(), Error> {
        // `check_chunks` guarantees some chunk has sequences, so this stops within one round.
        while self.chunks[c].num_sequences == 0 {
            c = (c + 1) % self.chunks.len();
        }
        self.cur_chunk = None;
        if let ChunkSequences::Listed(v) = std::mem::take(&mut self.sequences) {
            self.scratch = v;
        }
        self.sequences = ChunkSequences::load(&self.source, c as u32, self.chunks[c].num_sequences, &mut self.scratch)?;
        self.cur_chunk = Some(c);
        Ok(())
    }

    /// Moves the cursor to the next sequence, wrapping to chunk 0 after the last chunk. True when it
    /// wrapped: the round over the sequences is over and the cursor is back at the first sequence.
    fn advance(&mut self) -> Result<bool, Error> {
        match self.cur_chunk {
            Some(c) if self.cur_index + 1 < self.chunks[c].num_sequences as usize => {
                self.cur_index += 1;
                Ok(false)
            }
            Some(c) => {
                self.load((c + 1) % self.chunks.len())?;
                self.cur_index = 0;
                Ok(self.cur_chunk.is_some_and(|n| n <= c))
            }
            None => {
                self.load(0)?;
                self.cur_index = 0;
                Ok(false)
            }
        }
    }
}

impl<S: SequenceSource> SequenceEnumerator for NoRandomizer<S> {
    fn start_epoch(&mut self, config: &EpochConfig) -> Result<(), Error> {
        config.validate()?;
        self.workers = config.workers;
        self.rank = config.rank;
        self.cross_sweeps = config.cross_sweeps;
        self.epoch_size = config.size_in_samples(self.sweep_size);
        self.epoch_index = config.epoch_index;
        self.set_state(self.epoch_size.saturating_mul(config.epoch_index))
    }

    fn get_next(&mut self, global: u64, local: u64) -> Result<Minibatch, Error> {
        if self.cur_chunk.is_none() {
            self.set_state(self.pos)?;
        }
        let s = self.sweep_size;
        let end = self.epoch_size.saturating_mul(self.epoch_index.saturating_add(1));
        let mut mb = Minibatch::default();
        if self.pos >= end {
            mb.end_of_sweep = self.pos >= s && self.pos.is_multiple_of(s);
            mb.end_of_epoch = true;
            return Ok(mb);
        }
        let global = if self.cross_sweeps { global } else { global.min(s - self.pos % s) };
        let (mut g, mut l, mut one) = (0u64, 0u64, true);
        let sweep = self.pos / s;
        let workers = u64::from(self.workers);
        let rank = u64::from(self.rank);
        // Guard, not in CNTK: after walking workers × (sequences per sweep) sequences without a local
        // sample the pattern repeats forever; only zero-length sequences can cause that.
        let limit = workers.saturating_mul(self.total_sequences).saturating_add(workers);
        let mut idle = 0u64;
        // Sequences of length 0 walked in a row: a whole round of them means that no sequence has samples.
        let mut empty_run = 0u64;
        while g < global && l < local {
            let Some(c) = self.cur_chunk else { break };
            let Some(info) = self.sequences.get(self.cur_index as u32) else {
                // Only with a chunk table that disagrees with the sequence lists; move on.
                self.load((c + 1) % self.chunks.len())?;
                self.cur_index = 0;
                continue;
            };
            let len = u64::from(info.num_samples);
            let is_local = self.global_sequence % workers == rank;
            if !one {
                if g.saturating_add(len) > global {
                    break;
                }
                if is_local && l.saturating_add(len) > local {
                    break;
                }
            }
            if self.pos >= end {
                mb.end_of_epoch = true;
                mb.end_of_sweep = sweep != self.pos / s;
                break;
            }
            if is_local {
                mb.picks.push(Pick {
                    chunk: c as u32,
                    index: self.cur_index as u32,
                    num_samples: info.num_samples,
                    key: info.key,
                });
                l = l.saturating_add(len);
                one = false;
            }
            idle = if is_local && len > 0 { 0 } else { idle + 1 };
            empty_run = if len > 0 { 0 } else { empty_run + 1 };
            if empty_run >= self.total_sequences {
                // Only a chunk table declaring samples the sequences do not have gets here (the sweep size
                // is not 0): the position could never move again.
                return Err(no_samples(self.total_sequences, s));
            }
            g = g.saturating_add(len);
            self.pos = self.pos.saturating_add(len);
            self.global_sequence = self.global_sequence.wrapping_add(1);
            if self.advance()? {
                // The round over the sequences is over. On a consistent chunk table the position is at
                // the end of the sweep the round began in; a table declaring more samples than the
                // sequences have leaves it short of that end (CNTK would hand the sequences out again,
                // within the same sweep). No sequence starts in the rest of the sweep: walk over it.
                let sweep_end = self.round_sweep.saturating_add(1).saturating_mul(s);
                if self.pos < sweep_end {
                    g = g.saturating_add(sweep_end - self.pos);
                    self.pos = sweep_end;
                }
                self.round_sweep = self.pos / s;
            }
            if idle > limit {
                break;
            }
        }
        mb.end_of_epoch |= self.pos >= end;
        mb.end_of_sweep |= sweep != self.pos / s;
        Ok(mb)
    }

    fn get_state(&self) -> u64 {
        self.pos
    }

    fn set_state(&mut self, position: u64) -> Result<(), Error> {
        self.cur_index = 0;
        let s = self.sweep_size;
        let offset = position % s;
        let base = position - offset;
        let ci = self.sample_offsets.partition_point(|&o| o <= offset).saturating_sub(1);
        if self.cur_chunk != Some(ci) {
            self.load(ci)?;
            self.cur_index = 0;
        }
        let c = self.cur_chunk.unwrap_or(ci);
        // `reached`: where the cursor ends up, as a sample offset from the start of the sweep;
        // `wrapped`: it went past the last sequence, so its round over the sequences begins in the next sweep.
        let (reached, wrapped) = if c != ci {
            // Chunk `ci` has no sequences although the chunk table gives it samples (only a malformed
            // table does that): the first sequence at or after `position` is the first of chunk `c`, in
            // this sweep or, if `load` wrapped around, in the next.
            if c > ci {
                (self.sample_offsets[c], false)
            } else {
                (s.saturating_add(self.sample_offsets[c]), true)
            }
        } else {
            // Walk to the first sequence boundary at or after `offset`. On a consistent chunk table it
            // lies in this chunk or at its end. A table declaring more samples than the chunk's sequences
            // have could make CNTK walk on through the following chunks, sweep after sweep (forever if
            // they are all of length 0); the walk stops at the end of the chunk instead.
            let inside = offset - self.sample_offsets[c];
            let n = self.sequences.len() as usize;
            let (mut k, mut walked, mut wrapped) = (0u64, 0usize, false);
            while walked < n && k < inside {
                k = k.saturating_add(u64::from(self.sequences.at(self.cur_index as u32).0));
                walked += 1;
                wrapped = self.advance()?;
            }
            if walked == n {
                // The cursor left the chunk: it is at the next chunk's start, as the table places it.
                (self.sample_offsets[c] + self.chunks[c].num_samples, wrapped)
            } else {
                (self.sample_offsets[c] + k, false)
            }
        };
        self.pos = base.saturating_add(reached);
        // Not `pos / s`: the cursor may still be before zero-length sequences at the end of the sweep.
        self.round_sweep = base / s + u64::from(wrapped);
        let c = self.cur_chunk.unwrap_or(ci);
        self.global_sequence = self.sequence_offsets[c] + self.cur_index as u64;
        Ok(())
    }

    fn sweep_size(&self) -> u64 {
        self.sweep_size
    }
}
