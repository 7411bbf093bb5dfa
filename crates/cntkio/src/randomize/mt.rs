//! MT19937-64: the 64-bit Mersenne Twister, bit-for-bit as C++ `std::mt19937_64` (READER.md §3.1).
//!
//! CNTK draws every random number of its randomizers from this generator, so cntkio carries its own copy
//! with golden tests instead of depending on a crate whose output might change between versions.

const N: usize = 312;
const M: usize = 156;
const MATRIX_A: u64 = 0xB502_6F5A_A966_19E9;
const UPPER_MASK: u64 = 0xFFFF_FFFF_8000_0000;
const LOWER_MASK: u64 = 0x7FFF_FFFF;

/// The 64-bit Mersenne Twister `std::mt19937_64`, seeded with `seed(value)`.
///
/// ```
/// use cntkio::randomize::Mt19937_64;
/// let mut rng = Mt19937_64::new(5489);
/// assert_eq!(rng.next_u64(), 14514284786278117030);
/// ```
#[derive(Clone)]
pub struct Mt19937_64 {
    state: Box<[u64; N]>,
    index: usize,
}

impl Mt19937_64 {
    /// C++ `std::mt19937_64` default seed.
    pub const DEFAULT_SEED: u64 = 5489;

    /// A generator seeded like `std::mt19937_64::seed(seed)`.
    pub fn new(seed: u64) -> Mt19937_64 {
        let mut rng = Mt19937_64 { state: Box::new([0; N]), index: N };
        rng.seed(seed);
        rng
    }

    /// Re-seeds the generator in place; the next output is the first one for `seed`.
    pub fn seed(&mut self, seed: u64) {
        let mt = &mut *self.state;
        mt[0] = seed;
        for i in 1..N {
            let prev = mt[i - 1];
            mt[i] = 6364136223846793005u64.wrapping_mul(prev ^ (prev >> 62)).wrapping_add(i as u64);
        }
        self.index = N;
    }

    fn twist(&mut self) {
        let mt = &mut *self.state;
        for i in 0..N {
            let x = (mt[i] & UPPER_MASK) | (mt[(i + 1) % N] & LOWER_MASK);
            let mut xa = x >> 1;
            if x & 1 != 0 {
                xa ^= MATRIX_A;
            }
            mt[i] = mt[(i + M) % N] ^ xa;
        }
        self.index = 0;
    }

    /// The next 64-bit output.
    pub fn next_u64(&mut self) -> u64 {
        if self.index >= N {
            self.twist();
        }
        let y = self.state[self.index];
        self.index += 1;
        temper(y)
    }

    /// The output `k` draws ahead (`peek(0)` is what [`next_u64`](Self::next_u64) returns next), without
    /// drawing. `None` when it lies too far ahead: past the first 155 outputs of the next block of 312.
    pub fn peek(&self, k: usize) -> Option<u64> {
        let i = self.index.checked_add(k)?;
        if i < N {
            return Some(temper(self.state[i]));
        }
        // Word `i` of the next block: the twist computes its first N − M words from the current block
        // alone (words i, i + 1 and i + M, none of them rewritten yet).
        let i = i - N;
        if i + 1 >= N - M {
            return None;
        }
        let mt = &*self.state;
        let x = (mt[i] & UPPER_MASK) | (mt[i + 1] & LOWER_MASK);
        let mut xa = x >> 1;
        if x & 1 != 0 {
            xa ^= MATRIX_A;
        }
        Some(temper(mt[i + M] ^ xa))
    }

    /// CNTK's `RandMT(begin, end)`: `begin + next() mod (end − begin)`, no rejection sampling.
    ///
    /// Returns `begin` without drawing when the range is empty (`end <= begin`); CNTK never asks for that.
    pub fn next_in(&mut self, begin: u64, end: u64) -> u64 {
        if end <= begin {
            return begin;
        }
        begin + self.next_u64() % (end - begin)
    }
}

/// MT19937-64's output tempering.
#[inline]
fn temper(mut y: u64) -> u64 {
    y ^= (y >> 29) & 0x5555_5555_5555_5555;
    y ^= (y << 17) & 0x71D6_7FFF_EDA6_0000;
    y ^= (y << 37) & 0xFFF7_EEE0_0000_0000;
    y ^= y >> 43;
    y
}

impl Default for Mt19937_64 {
    fn default() -> Self {
        Mt19937_64::new(Self::DEFAULT_SEED)
    }
}

impl std::fmt::Debug for Mt19937_64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937_64").field("index", &self.index).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_seed_matches_cpp() {
        // The C++ standard requires the 10000th output of a default-constructed mt19937_64 to be this.
        let mut rng = Mt19937_64::default();
        let mut v = 0;
        for _ in 0..10000 {
            v = rng.next_u64();
        }
        assert_eq!(v, 9981545732273789042);
    }

    #[test]
    fn spec_sanity_values() {
        assert_eq!(Mt19937_64::new(5489).next_u64(), 14514284786278117030);
        let mut rng = Mt19937_64::new(0);
        assert_eq!(
            [rng.next_u64(), rng.next_u64(), rng.next_u64()],
            [2947667278772165694, 18301848765998365067, 729919693006235833]
        );
    }

    #[test]
    fn peek_sees_the_next_outputs() {
        let mut rng = Mt19937_64::new(7);
        for _ in 0..1000 {
            let ahead: Vec<Option<u64>> = (0..200).map(|k| rng.peek(k)).collect();
            assert!(ahead[..155].iter().all(|p| p.is_some()));
            for (k, p) in ahead.iter().enumerate() {
                if let Some(p) = p {
                    assert_eq!(*p, rng.clone().nth_output(k));
                }
            }
            rng.next_u64();
        }
    }

    impl Mt19937_64 {
        fn nth_output(mut self, k: usize) -> u64 {
            for _ in 0..k {
                self.next_u64();
            }
            self.next_u64()
        }
    }

    #[test]
    fn reseed_restarts() {
        let mut rng = Mt19937_64::new(7);
        let a: Vec<u64> = (0..400).map(|_| rng.next_u64()).collect();
        rng.seed(7);
        let b: Vec<u64> = (0..400).map(|_| rng.next_u64()).collect();
        assert_eq!(a, b);
    }
}
