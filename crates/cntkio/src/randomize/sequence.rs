//! Incremental sequence shuffle inside the randomization window (CNTK `SequenceRandomizer`,
//! READER.md §3.4, §3.5 and §8.2).

use std::collections::VecDeque;

use super::{ChunkRandomizer, ChunkSequences, Mt19937_64, SequenceInfo, SequenceSource};
use crate::Error;

/// Positions whose likely swap partners are read ahead together (see `touch_partners`).
const TOUCH_BLOCK: u64 = 64;

/// A sequence at a position of the randomized sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RandomizedSequence {
    /// The original chunk (index into [`SequenceSource::chunks`]).
    pub chunk: u32,
    /// The sequence's index in its original chunk.
    pub index: u32,
    /// Declared length.
    pub num_samples: u32,
    /// Key.
    pub key: u64,
    /// Its home: the randomized position of its chunk. Workers are assigned by `home mod workers`.
    pub home: u32,
}

/// A position of the shuffle: the sequence there, as its home (the randomized position of its chunk) and
/// its index in that chunk. 8 bytes, so that the window's positions, which the shuffle reads and writes at
/// random places, take a third of the cache they took as [`RandomizedSequence`]s; the rest of a sequence
/// is found through its home when it is handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    home: u32,
    index: u32,
}

/// A loaded chunk: its original index and sequences.
#[derive(Debug, Clone)]
struct Home {
    original: u32,
    infos: ChunkSequences,
}

/// Whether every chunk of randomized chunk `c`'s window has the same window as `c` (windows begin and end
/// in non-decreasing order, so it is enough that the first and the last do).
#[inline]
fn same_window(r: &[super::RandomizedChunk], c: usize) -> bool {
    let w = (r[c].window_begin, r[c].window_end);
    let first = &r[w.0 as usize];
    let last = &r[w.1 as usize - 1];
    (first.window_begin, first.window_end) == w && (last.window_begin, last.window_end) == w
}

/// Shuffles the sequences of one sweep chunk window by chunk window, as the read cursor advances.
///
/// It owns the [`ChunkRandomizer`] of the sweep. Sequence positions are finalized lazily
/// ("finalize-next", READER.md §3.4), so only the chunks in the current windows are loaded; chunks left
/// behind are released. The source is passed to every call that may load chunks.
#[derive(Debug, Clone)]
pub struct SequenceRandomizer {
    chunks: ChunkRandomizer,
    rng: Mt19937_64,
    /// Sequences at the positions of the randomized chunks `first_retained .. loaded_end`, one after
    /// another: position `t` at index `t - window_base`.
    window: VecDeque<Slot>,
    /// The first position of chunk `first_retained`.
    window_base: u64,
    /// The loaded chunks `first_home .. loaded_end` (by randomized position): what the slots name. A chunk
    /// stays while a retained position may hold one of its sequences (see `release`).
    homes: VecDeque<Home>,
    first_home: usize,
    /// `(start, count)` on the sweep's sample timeline of the finalized chunks
    /// `first_retained .. finalized`.
    ranges: VecDeque<(u64, u64)>,
    /// First randomized chunk still in memory (CNTK `m_chunkWindowBegin`).
    first_retained: usize,
    /// Number of chunks whose positions are final (`m_randomizedWindowEnd`).
    finalized: usize,
    /// Chunks whose positions have been shuffled (`m_randomizationCursor`).
    rand_cursor: usize,
    /// One past the last loaded chunk (`m_chunkWindowEnd`).
    loaded_end: usize,
    /// Randomized chunk of the read cursor (`m_currentChunkCursor`).
    cur_chunk: usize,
    /// Sequence position of the read cursor (`m_currentSequenceCursor`).
    cur_sequence: u64,
    /// Sample position of the read cursor in the sweep (`m_currentSampleCursor`).
    cur_sample: u64,
    scratch: Vec<SequenceInfo>,
}

impl SequenceRandomizer {
    /// A sequence randomizer over the chunks of `chunks`. Call [`start_sweep`](Self::start_sweep) (or
    /// randomize the chunks and [`reset`](Self::reset)) before reading.
    pub fn new(chunks: ChunkRandomizer) -> SequenceRandomizer {
        SequenceRandomizer {
            chunks,
            rng: Mt19937_64::new(0),
            window: VecDeque::new(),
            window_base: 0,
            homes: VecDeque::new(),
            first_home: 0,
            ranges: VecDeque::new(),
            first_retained: 0,
            finalized: 0,
            rand_cursor: 0,
            loaded_end: 0,
            cur_chunk: 0,
            cur_sequence: 0,
            cur_sample: 0,
            scratch: Vec::new(),
        }
    }

    /// The chunk randomizer (the current sweep's permutation and windows).
    pub fn chunk_randomizer(&self) -> &ChunkRandomizer {
        &self.chunks
    }

    /// Starts a sweep: permutes the chunks and resets the sequence shuffle, both with `seed` (two
    /// independent generators, READER.md §3.1).
    pub fn start_sweep<S: SequenceSource + ?Sized>(&mut self, seed: u64, source: &S) -> Result<(), Error> {
        self.chunks.randomize(seed);
        self.reset(seed, source)
    }

    /// Restarts the sequence shuffle of the current chunk permutation with a generator seeded with
    /// `seed`, and finalizes the first window. The read cursor goes to the start of the sweep.
    pub fn reset<S: SequenceSource + ?Sized>(&mut self, seed: u64, source: &S) -> Result<(), Error> {
        self.rng.seed(seed);
        self.window.clear();
        self.window_base = 0;
        self.homes.clear();
        self.first_home = 0;
        self.ranges.clear();
        self.first_retained = 0;
        self.finalized = 0;
        self.rand_cursor = 0;
        self.loaded_end = 0;
        self.cur_chunk = 0;
        self.cur_sequence = 0;
        self.cur_sample = 0;
        self.randomize_next(source)
    }

    /// Index, in the randomized order of the sweep, of the sequence at the read cursor.
    pub fn sequence_position(&self) -> u64 {
        self.cur_sequence
    }

    /// Sample position of the read cursor inside the sweep.
    pub fn position(&self) -> u64 {
        self.cur_sample
    }

    /// True when the read cursor is past the last sequence of the sweep (all its sequences were handed
    /// out or skipped by a seek).
    pub fn at_end(&self) -> bool {
        self.cur_sequence >= self.num_sequences()
    }

    /// Number of sequences in the sweep (0 before the chunks are randomized).
    pub fn num_sequences(&self) -> u64 {
        self.chunks.chunks().last().map_or(0, |c| c.sequence_end)
    }

    /// The index in `window` of sequence position `t` (of a loaded chunk).
    #[inline]
    fn slot(&self, t: u64) -> usize {
        (t - self.window_base) as usize
    }

    /// Finalize-next: if the read cursor has entered the first non-final chunk, shuffle the positions
    /// needed to make that chunk final (READER.md §3.4).
    fn randomize_next<S: SequenceSource + ?Sized>(&mut self, source: &S) -> Result<(), Error> {
        let r = self.chunks.chunks();
        let n = r.len();
        if self.cur_chunk < self.finalized || self.finalized == n {
            return Ok(());
        }
        let mut next_rand = r[self.finalized].window_end as usize;
        while next_rand < n && r[next_rand].window_begin as usize <= self.finalized {
            next_rand += 1;
        }
        let new_loaded_end = r[next_rand - 1].window_end as usize;
        for (i, c) in r.iter().enumerate().take(new_loaded_end).skip(self.loaded_end) {
            let info = self.chunks.original()[c.original as usize];
            let infos = ChunkSequences::load(source, c.original, info.num_sequences, &mut self.scratch)?;
            let home = i as u32;
            self.window.extend((0..infos.len()).map(|index| Slot { home, index }));
            self.homes.push_back(Home { original: c.original, infos });
        }
        self.loaded_end = new_loaded_end;

        let first = if self.rand_cursor == 0 { 0 } else { r[self.rand_cursor - 1].sequence_end };
        let end = r[next_rand - 1].sequence_end;
        let mut ci = self.chunks.chunk_of_sequence(first);
        for t in first..end {
            if (t - first) % TOUCH_BLOCK == 0 {
                self.touch_partners(t, end.min(t + TOUCH_BLOCK));
            }
            // The chunk of position `t` (the same as `chunk_of_sequence(t)`, found by walking on).
            while r[ci].sequence_end <= t {
                ci += 1;
            }
            let c = r[ci];
            let lo = r[c.window_begin as usize].sequence_start;
            let hi = r[c.window_end as usize - 1].sequence_end;
            let ti = self.slot(t);
            if same_window(r, ci) {
                // Every chunk of the window has this window, and every sequence in it has its home there
                // (the invariant the checks below keep), so no draw is rejected: the checks are skipped.
                let j = self.rng.next_in(lo, hi);
                let ji = self.slot(j);
                self.window.swap(ti, ji);
                continue;
            }
            loop {
                let j = self.rng.next_in(lo, hi);
                let cj = self.chunks.chunk_of_sequence(j);
                let ji = self.slot(j);
                let home_j = self.window[ji].home;
                if !(c.window_begin..c.window_end).contains(&home_j) {
                    continue;
                }
                let home_t = self.window[ti].home;
                let w = r[cj];
                if !(w.window_begin..w.window_end).contains(&home_t) {
                    continue;
                }
                self.window.swap(ti, ji);
                break;
            }
        }

        let f = r[self.finalized];
        let count = self
            .window
            .range(self.slot(f.sequence_start)..self.slot(f.sequence_end))
            .fold(0u64, |acc, &s| acc.saturating_add(u64::from(self.info(s).0)));
        let start = self.ranges.back().map_or(0, |&(s, c)| s.saturating_add(c));
        self.ranges.push_back((start, count));
        self.finalized += 1;
        self.rand_cursor = next_rand;
        Ok(())
    }

    /// Reads the home of the sequence each position of `t0..t1` will most likely be swapped with (one draw
    /// per position, as when no draw is rejected), with independent loads, so that the cache misses of a
    /// block overlap instead of stalling the shuffle one at a time. Reads only: the shuffle is unchanged.
    fn touch_partners(&self, t0: u64, t1: u64) {
        let r = self.chunks.chunks();
        // First the addresses (arithmetic only), then the loads in a tight loop, so that they are all in
        // flight together.
        let mut at = [usize::MAX; TOUCH_BLOCK as usize];
        let mut ci = self.chunks.chunk_of_sequence(t0);
        for (k, t) in (t0..t1).enumerate() {
            let Some(v) = self.rng.peek(k) else { break };
            while r[ci].sequence_end <= t {
                ci += 1;
            }
            let c = r[ci];
            let lo = r[c.window_begin as usize].sequence_start;
            let hi = r[c.window_end as usize - 1].sequence_end;
            if hi > lo {
                let j = lo + v % (hi - lo);
                if let Some(i) = j.checked_sub(self.window_base) {
                    at[k] = i as usize;
                }
            }
        }
        let mut acc = 0u32;
        for &i in &at {
            if let Some(s) = self.window.get(i) {
                acc = acc.wrapping_add(s.home);
            }
        }
        std::hint::black_box(acc);
    }

    /// `(num_samples, key)` of the sequence in `slot`.
    #[inline]
    fn info(&self, slot: Slot) -> (u32, u64) {
        self.homes[slot.home as usize - self.first_home].infos.at(slot.index)
    }

    /// The sequence in `slot`, whole.
    #[inline]
    fn sequence(&self, slot: Slot) -> RandomizedSequence {
        let h = &self.homes[slot.home as usize - self.first_home];
        let (num_samples, key) = h.infos.at(slot.index);
        RandomizedSequence { chunk: h.original, index: slot.index, num_samples, key, home: slot.home }
    }

    /// Frees the chunks left of both the current chunk's window and the cursor.
    fn release(&mut self) {
        let r = self.chunks.chunks();
        let n = r.len();
        if n == 0 {
            return;
        }
        let cur = self.cur_chunk.min(n - 1);
        let mut cand = self.first_retained;
        while cand < n && cand < r[cur].window_begin as usize && r[cand].window_end as usize <= self.cur_chunk {
            let count = r[cand].num_sequences();
            self.window.drain(..count as usize);
            self.window_base += count;
            self.ranges.pop_front();
            self.first_retained += 1;
            cand += 1;
        }
        // The shuffle keeps every sequence at a position whose chunk's window holds its home, so the
        // retained positions (of chunks from `first_retained` on) hold sequences of chunks from the first
        // retained chunk's window begin on (window begins do not decrease).
        let keep_from = r.get(self.first_retained).map_or(self.first_retained, |c| c.window_begin as usize);
        while self.first_home < keep_from.min(self.first_retained) {
            self.homes.pop_front();
            self.first_home += 1;
        }
    }

    /// Moves the cursor to the next chunk, finalizing and releasing as CNTK does.
    fn advance_chunk<S: SequenceSource + ?Sized>(&mut self, source: &S) -> Result<(), Error> {
        self.cur_chunk += 1;
        self.randomize_next(source)?;
        self.release();
        Ok(())
    }

    /// Hands out sequences from the read cursor on, in position order, while `take` returns true; the
    /// sequence for which it returns false stays at the cursor. Stops at the end of the sweep.
    pub fn next<S, F>(&mut self, source: &S, mut take: F) -> Result<(), Error>
    where
        S: SequenceSource + ?Sized,
        F: FnMut(&RandomizedSequence) -> bool,
    {
        while self.cur_chunk < self.chunks.chunks().len() {
            let c = self.chunks.chunks()[self.cur_chunk];
            if c.sequence_start == c.sequence_end {
                // A chunk without sequences: nothing to hand out (readerref.py would fail here).
                self.advance_chunk(source)?;
                continue;
            }
            let s = self.sequence(self.window[self.slot(self.cur_sequence)]);
            if !take(&s) {
                break;
            }
            self.cur_sequence += 1;
            self.cur_sample = self.cur_sample.saturating_add(u64::from(s.num_samples));
            if self.cur_sequence >= c.sequence_end {
                self.advance_chunk(source)?;
            }
        }
        Ok(())
    }

    /// Seeks to sample offset `offset` of the sweep: to the first sequence boundary at or after it.
    /// Returns the sample position reached.
    ///
    /// If `offset` lies before the earliest retained chunk, the shuffle restarts with `seed_for_reset`
    /// (CNTK passes the bare sweep number there — the quirk of READER.md §8.3).
    pub fn seek<S: SequenceSource + ?Sized>(
        &mut self,
        offset: u64,
        seed_for_reset: u64,
        source: &S,
    ) -> Result<u64, Error> {
        let (begin, end) = match (self.ranges.front(), self.ranges.back()) {
            (Some(&(b, _)), Some(&(s, c))) => (b, s.saturating_add(c)),
            _ => (0, 0),
        };
        if offset < begin {
            self.reset(seed_for_reset, source)?;
        } else if offset < end {
            // The first finalized chunk whose range holds `offset` (ranges are contiguous and sorted).
            let k = self.ranges.partition_point(|&(s, _)| s <= offset).saturating_sub(1);
            self.cur_chunk = self.first_retained + k;
            self.cur_sequence = self.chunks.chunks()[self.cur_chunk].sequence_start;
            self.cur_sample = self.ranges[k].0;
        }
        // Take sequences while the cursor is before `offset` (`next` updates `cur_sample` the same way).
        let mut at = self.cur_sample;
        self.next(source, |s| {
            if at < offset {
                at = at.saturating_add(u64::from(s.num_samples));
                true
            } else {
                false
            }
        })?;
        debug_assert_eq!(at, self.cur_sample);
        Ok(self.cur_sample)
    }
}
