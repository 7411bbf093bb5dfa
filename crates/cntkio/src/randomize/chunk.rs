//! Chunk shuffle and randomization windows (CNTK `ChunkRandomizer`, READER.md §3.2–§3.3).

use super::{ChunkInfo, Mt19937_64, Window};

/// A chunk at its randomized position `p` in a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RandomizedChunk {
    /// The original chunk (index into [`SequenceSource::chunks`](super::SequenceSource::chunks)).
    pub original: u32,
    /// First sample of the chunk in the randomized sweep (`sampleStart(p)`).
    pub sample_start: u64,
    /// One past its last sample (`sampleEnd(p)`).
    pub sample_end: u64,
    /// First sequence position of the chunk in the randomized sweep (`seqStart(p)`).
    pub sequence_start: u64,
    /// One past its last sequence position (`seqEnd(p)`).
    pub sequence_end: u64,
    /// First randomized position of its window (`wb(p)`).
    pub window_begin: u32,
    /// One past the last randomized position of its window (`we(p)`).
    pub window_end: u32,
}

impl RandomizedChunk {
    /// Number of sequences in the chunk.
    pub fn num_sequences(&self) -> u64 {
        self.sequence_end - self.sequence_start
    }
}

/// Permutes the chunks of a sweep and computes each randomized chunk's window.
///
/// The permutation covers all chunks, whatever the window (READER.md §2: "all chunks are shuffled").
#[derive(Debug, Clone)]
pub struct ChunkRandomizer {
    original: Vec<ChunkInfo>,
    window: Window,
    randomized: Vec<RandomizedChunk>,
}

impl ChunkRandomizer {
    /// A randomizer over `chunks` (at most `u32::MAX` of them; [`BlockRandomizer`](super::BlockRandomizer)
    /// checks this). Nothing is randomized until [`randomize`](Self::randomize) is called.
    pub fn new(chunks: &[ChunkInfo], window: Window) -> ChunkRandomizer {
        ChunkRandomizer { original: chunks.to_vec(), window, randomized: Vec::new() }
    }

    /// The window this randomizer was built with.
    pub fn window(&self) -> Window {
        self.window
    }

    /// The original chunks.
    pub fn original(&self) -> &[ChunkInfo] {
        &self.original
    }

    /// The randomized chunks of the last [`randomize`](Self::randomize) call, by randomized position
    /// (empty before the first call).
    pub fn chunks(&self) -> &[RandomizedChunk] {
        &self.randomized
    }

    /// Shuffles the chunks with a fresh generator seeded with `seed` and recomputes the windows.
    pub fn randomize(&mut self, seed: u64) {
        let n = self.original.len();
        let mut perm: Vec<u32> = (0..n as u32).collect();
        let mut rng = Mt19937_64::new(seed);
        for i in 0..n {
            // Note: j ranges over all of [0, n), not [i, n) (CNTK's RandomShuffleMT).
            let j = rng.next_in(0, n as u64) as usize;
            perm.swap(i, j);
        }
        self.randomized.clear();
        self.randomized.reserve(n);
        let (mut samples, mut sequences) = (0u64, 0u64);
        for &o in &perm {
            let c = self.original[o as usize];
            let sample_end = samples.saturating_add(c.num_samples);
            let sequence_end = sequences + u64::from(c.num_sequences);
            self.randomized.push(RandomizedChunk {
                original: o,
                sample_start: samples,
                sample_end,
                sequence_start: sequences,
                sequence_end,
                window_begin: 0,
                window_end: 0,
            });
            samples = sample_end;
            sequences = sequence_end;
        }
        match self.window {
            Window::Chunks(w) => self.windows_in_chunks(w),
            Window::Samples(w) => self.windows_in_samples(w),
        }
    }

    fn windows_in_chunks(&mut self, window: u64) {
        let n = self.randomized.len() as u64;
        let half = window / 2;
        let size = window.max(1);
        for (i, c) in self.randomized.iter_mut().enumerate() {
            let i = i as u64;
            let mut b = i.saturating_sub(half);
            let mut e = b.saturating_add(size);
            if e > n {
                e = n;
                b = n.saturating_sub(size);
            }
            // b <= i < e <= n <= u32::MAX
            c.window_begin = b as u32;
            c.window_end = e as u32;
        }
    }

    fn windows_in_samples(&mut self, window: u64) {
        let half = window / 2;
        let r = &mut self.randomized;
        let n = r.len();
        for cid in 0..n {
            let (mut b, mut e) =
                if cid == 0 { (0, 1) } else { (r[cid - 1].window_begin as usize, r[cid - 1].window_end as usize) };
            let start = r[cid].sample_start;
            // b <= cid here, and sample starts are non-decreasing, so no underflow.
            while start - r[b].sample_start > half {
                b += 1;
            }
            b = b.min(cid);
            e = e.max(cid + 1);
            while e < n && r[e].sample_end - start < half {
                e += 1;
            }
            r[cid].window_begin = b as u32;
            r[cid].window_end = e as u32;
        }
    }

    /// The randomized position of the chunk holding sequence position `t` (the last chunk whose
    /// `sequence_start <= t`), by binary search. Only meaningful for `t` below the total number of
    /// sequences.
    pub fn chunk_of_sequence(&self, t: u64) -> usize {
        self.randomized.partition_point(|c| c.sequence_start <= t).saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worked_example(window: Window) -> ChunkRandomizer {
        let sizes = [3u32, 3, 3, 3, 3, 3, 2];
        let chunks: Vec<ChunkInfo> =
            sizes.iter().map(|&n| ChunkInfo { num_samples: u64::from(n), num_sequences: n }).collect();
        let mut cr = ChunkRandomizer::new(&chunks, window);
        cr.randomize(0);
        cr
    }

    fn windows(cr: &ChunkRandomizer) -> Vec<(u32, u32)> {
        cr.chunks().iter().map(|c| (c.window_begin, c.window_end)).collect()
    }

    #[test]
    fn worked_example_permutation_and_windows() {
        // READER.md §3.6
        let cr = worked_example(Window::Chunks(128));
        let perm: Vec<u32> = cr.chunks().iter().map(|c| c.original).collect();
        assert_eq!(perm, [3, 0, 4, 6, 2, 1, 5]);
        assert_eq!(windows(&cr), vec![(0, 7); 7]);
        let cr = worked_example(Window::Chunks(1));
        assert_eq!(windows(&cr), (0..7).map(|p| (p, p + 1)).collect::<Vec<_>>());
        let cr = worked_example(Window::Chunks(2));
        assert_eq!(windows(&cr), [(0, 2), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7)]);
        let cr = worked_example(Window::Samples(4));
        assert_eq!(windows(&cr), [(0, 1), (1, 2), (2, 3), (3, 4), (3, 5), (5, 6), (6, 7)]);
    }

    #[test]
    fn chunk_of_sequence_skips_empty_chunks() {
        let chunks = [
            ChunkInfo { num_samples: 2, num_sequences: 2 },
            ChunkInfo { num_samples: 0, num_sequences: 0 },
            ChunkInfo { num_samples: 1, num_sequences: 1 },
        ];
        let mut cr = ChunkRandomizer::new(&chunks, Window::Chunks(0));
        cr.randomize(3);
        for t in 0..3 {
            let p = cr.chunk_of_sequence(t);
            let c = cr.chunks()[p];
            assert!(c.sequence_start <= t && t < c.sequence_end);
        }
    }
}
