//! Which chunks a [`MinibatchSource`](super::MinibatchSource) should hold next (READER.md §3.5): with
//! randomization, the chunks whose randomized positions lie in the window of the chunk being read (only
//! this worker's, §6), then more in the order the window will reach them, continuing into the next sweep's
//! permutation; without randomization, the chunk being read and the chunks after it. How many more: at
//! most [`Prefetch::chunks`], and as many of those as fit in [`Prefetch::bytes`] (one at least).
//!
//! The plan is computed from the global sample position and the chunk table alone (the chunk permutation
//! of sweep *k* is a pure function of `seed + k`), so it never touches the enumerator. It is a forecast:
//! positions inside a randomized chunk are located by the chunk's declared sample range, which is exact
//! for the chunk sequence but may be off by a chunk when sequence lengths vary; a chunk the forecast misses
//! is loaded on demand, with the same result.

use crate::randomize::{ChunkInfo, ChunkRandomizer, Window};

/// How far beyond the chunks being read the plan goes.
#[derive(Debug)]
pub(crate) struct Prefetch {
    /// At most this many chunks.
    pub chunks: usize,
    /// At most this many bytes of chunks (by [`sizes`](Self::sizes)), except for the first chunk.
    pub bytes: u64,
    /// Each chunk's size in bytes (0 where unknown).
    pub sizes: Vec<u64>,
}

impl Prefetch {
    /// Whether chunk `c` may be planned ahead after `extra` chunks of `bytes` bytes.
    fn admits(&self, extra: usize, bytes: u64, c: u32) -> bool {
        extra < self.chunks && (extra == 0 || bytes.saturating_add(self.size(c)) <= self.bytes)
    }

    fn size(&self, c: u32) -> u64 {
        self.sizes.get(c as usize).copied().unwrap_or(0)
    }
}

/// The forecast of needed chunks.
#[derive(Debug)]
pub(crate) struct Planner {
    chunks: Vec<ChunkInfo>,
    randomized: bool,
    seed: u64,
    sweep_size: u64,
    /// The current sweep's permutation and windows (randomization on).
    current: (Option<u64>, ChunkRandomizer),
    /// The next sweep's (randomization on).
    next: (Option<u64>, ChunkRandomizer),
    /// Sample offset of each chunk in file order (randomization off).
    offsets: Vec<u64>,
    workers: u64,
    rank: u64,
    prefetch: Prefetch,
    /// The run's end on the global timeline.
    end: u64,
    /// (sweep, chunk) of the last plan.
    last: Option<(u64, usize)>,
    /// `marks[c] == generation`: chunk `c` is in the plan being built.
    marks: Vec<u32>,
    generation: u32,
}

impl Planner {
    /// A planner for a source over `chunks`; `end` is the run's end position.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        chunks: &[ChunkInfo],
        randomized: bool,
        window: Window,
        seed: u64,
        workers: u32,
        rank: u32,
        prefetch: Prefetch,
        end: u64,
    ) -> Planner {
        let mut offsets = Vec::with_capacity(chunks.len());
        let mut s = 0u64;
        for c in chunks {
            offsets.push(s);
            s = s.saturating_add(c.num_samples);
        }
        Planner {
            chunks: chunks.to_vec(),
            randomized,
            seed,
            sweep_size: s.max(1),
            current: (None, ChunkRandomizer::new(chunks, window)),
            next: (None, ChunkRandomizer::new(chunks, window)),
            offsets,
            workers: u64::from(workers.max(1)),
            rank: u64::from(rank),
            prefetch,
            end,
            last: None,
            marks: Vec::new(),
            generation: 0,
        }
    }

    /// Forgets the last plan (after a restore), so that the next call plans again.
    pub(crate) fn reset(&mut self) {
        self.last = None;
    }

    /// Plans for the sequence at global position `pos`: fills `keep` (most urgent first) and returns true,
    /// or returns false if the plan is the same as the last one.
    pub(crate) fn plan(&mut self, pos: u64, keep: &mut Vec<u32>) -> bool {
        let n = self.chunks.len();
        let key = if pos >= self.end || n == 0 {
            (u64::MAX, 0)
        } else {
            let sweep = pos / self.sweep_size;
            let off = pos % self.sweep_size;
            if self.randomized {
                let cr = randomized(&mut self.current, sweep, self.seed);
                (sweep, cr.chunks().partition_point(|c| c.sample_end <= off).min(n - 1))
            } else {
                (sweep, self.offsets.partition_point(|&o| o <= off).saturating_sub(1))
            }
        };
        if self.last == Some(key) {
            return false;
        }
        self.last = Some(key);
        keep.clear();
        if key.0 == u64::MAX {
            return true;
        }
        if self.marks.len() != n {
            self.marks = vec![0; n];
        }
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.marks.iter_mut().for_each(|m| *m = 0);
            self.generation = 1;
        }
        let (sweep, p) = key;
        let next_sweep_in_run = (sweep + 1).saturating_mul(self.sweep_size) < self.end;
        if self.randomized {
            let (workers, rank, generation) = (self.workers, self.rank, self.generation);
            let prefetch = &self.prefetch;
            let local = |h: usize| (h as u64) % workers == rank;
            let chunks = self.current.1.chunks();
            let rc = chunks[p];
            let (mut extra, mut bytes) = (0, 0);
            let mut admitted = true;
            for (h, c) in chunks.iter().enumerate().skip(rc.window_begin as usize) {
                let ahead = h >= rc.window_end as usize;
                if ahead && !prefetch.admits(extra, bytes, c.original) {
                    admitted = false;
                    break;
                }
                if local(h) && mark(&mut self.marks, generation, c.original, keep) && ahead {
                    extra += 1;
                    bytes += prefetch.size(c.original);
                }
            }
            if admitted && next_sweep_in_run {
                let cr = randomized(&mut self.next, sweep + 1, self.seed);
                for (h, c) in cr.chunks().iter().enumerate() {
                    if !prefetch.admits(extra, bytes, c.original) {
                        break;
                    }
                    if local(h) && mark(&mut self.marks, generation, c.original, keep) {
                        extra += 1;
                        bytes += prefetch.size(c.original);
                    }
                }
            }
        } else {
            let mut c = p;
            let (mut extra, mut bytes) = (0, 0);
            let mut wrapped = false;
            loop {
                if self.chunks[c].num_sequences > 0 {
                    if !keep.is_empty() {
                        if !self.prefetch.admits(extra, bytes, c as u32) {
                            break;
                        }
                        extra += 1;
                        bytes += self.prefetch.size(c as u32);
                    }
                    if !mark(&mut self.marks, self.generation, c as u32, keep) {
                        break;
                    }
                }
                c += 1;
                if c == n {
                    if wrapped || !next_sweep_in_run {
                        break;
                    }
                    wrapped = true;
                    c = 0;
                }
            }
        }
        true
    }
}

/// Adds chunk `c` to the plan unless it is in it already; false if it was.
fn mark(marks: &mut [u32], generation: u32, c: u32, keep: &mut Vec<u32>) -> bool {
    let m = &mut marks[c as usize];
    if *m == generation {
        return false;
    }
    *m = generation;
    keep.push(c);
    true
}

/// The chunk randomizer of `slot` randomized for `sweep`.
fn randomized(slot: &mut (Option<u64>, ChunkRandomizer), sweep: u64, seed: u64) -> &ChunkRandomizer {
    if slot.0 != Some(sweep) {
        slot.1.randomize(seed.wrapping_add(sweep));
        slot.0 = Some(sweep);
    }
    &slot.1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plans for position 0 of ten chunks of 10 samples and 10 bytes each, with `chunks` ahead at most and a
    /// budget of `bytes`.
    fn plan(randomized: bool, chunks: usize, bytes: u64, sizes: Vec<u64>) -> Vec<u32> {
        let table = vec![ChunkInfo { num_samples: 10, num_sequences: 10 }; 10];
        let prefetch = Prefetch { chunks, bytes, sizes };
        let mut p = Planner::new(&table, randomized, Window::Chunks(1), 5, 1, 0, prefetch, u64::MAX);
        let mut keep = Vec::new();
        assert!(p.plan(0, &mut keep));
        keep
    }

    #[test]
    fn chunks_ahead_stop_at_the_byte_budget_but_one_is_always_planned() {
        for randomized in [false, true] {
            // The chunk being read (its window is itself), then chunks ahead.
            assert_eq!(plan(randomized, 4, u64::MAX, vec![10; 10]).len(), 5, "{randomized}");
            assert_eq!(plan(randomized, 4, 25, vec![10; 10]).len(), 3, "{randomized}");
            assert_eq!(plan(randomized, 4, 1, vec![10; 10]).len(), 2, "{randomized}");
            assert_eq!(plan(randomized, 0, u64::MAX, vec![10; 10]).len(), 1, "{randomized}");
            // Sizes unknown: the number of chunks alone.
            assert_eq!(plan(randomized, 4, 1, Vec::new()).len(), 5, "{randomized}");
        }
        // The same chunks in the same order, however many the budget admits.
        let all = plan(true, 4, u64::MAX, vec![10; 10]);
        assert_eq!(plan(true, 4, 25, vec![10; 10]), all[..3]);
    }
}
