//! Which chunks a [`MinibatchSource`](super::MinibatchSource) should hold next (READER.md §3.5): with
//! randomization, the chunks whose randomized positions lie in the window of the chunk being read (only
//! this worker's, §6), then `depth` more in the order the window will reach them, continuing into the
//! next sweep's permutation; without randomization, the chunk being read and the `depth` chunks after it.
//!
//! The plan is computed from the global sample position and the chunk table alone (the chunk permutation
//! of sweep *k* is a pure function of `seed + k`), so it never touches the enumerator. It is a forecast:
//! positions inside a randomized chunk are located by the chunk's declared sample range, which is exact
//! for the chunk sequence but may be off by a chunk when sequence lengths vary; a chunk the forecast misses
//! is loaded on demand, with the same result.

use crate::randomize::{ChunkInfo, ChunkRandomizer, Window};

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
    depth: usize,
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
        depth: usize,
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
            depth,
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
            let (workers, rank, depth, generation) = (self.workers, self.rank, self.depth, self.generation);
            let local = |h: usize| (h as u64) % workers == rank;
            let chunks = self.current.1.chunks();
            let rc = chunks[p];
            let mut extra = 0;
            for (h, c) in chunks.iter().enumerate().skip(rc.window_begin as usize) {
                let ahead = h >= rc.window_end as usize;
                if ahead && extra >= depth {
                    break;
                }
                if local(h) && mark(&mut self.marks, generation, c.original, keep) && ahead {
                    extra += 1;
                }
            }
            if extra < depth && next_sweep_in_run {
                let cr = randomized(&mut self.next, sweep + 1, self.seed);
                for (h, c) in cr.chunks().iter().enumerate() {
                    if extra >= depth {
                        break;
                    }
                    if local(h) && mark(&mut self.marks, generation, c.original, keep) {
                        extra += 1;
                    }
                }
            }
        } else {
            let mut c = p;
            let mut extra = 0;
            let mut wrapped = false;
            loop {
                if self.chunks[c].num_sequences > 0 {
                    if !keep.is_empty() {
                        if extra >= self.depth {
                            break;
                        }
                        extra += 1;
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
