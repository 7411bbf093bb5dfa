//! The distribution of a file's sequence lengths in bounded memory, whatever the number of sequences.
//!
//! Count, sum, minimum, maximum and the power-of-two histogram are always exact. Quantiles are exact
//! (nearest rank) as long as the lengths of 4,096 or more take at most [`EXACT_DISTINCT`] distinct values
//! (shorter lengths are counted in a table of their own, so they never use that room); past that, lengths
//! of 4,096 or more are counted in buckets of 1/128 of their power of two, and a quantile that falls among
//! them is its bucket's lower bound, less than 1/128 (0.8 %) below the true value, kept within the exact
//! minimum and maximum. Memory: at most about 2 MiB.

use std::collections::BTreeMap;

/// Lengths below this are counted one by one in a table.
const SMALL: u32 = 4096;
/// Distinct lengths of [`SMALL`] or more counted exactly before they go to buckets.
pub(crate) const EXACT_DISTINCT: usize = 1 << 16;
/// Buckets per power of two once lengths go to buckets (log2).
const SUB_BITS: u32 = 7;

/// Sequence lengths seen so far.
#[derive(Debug, Clone)]
pub(crate) struct LengthStats {
    count: u64,
    sum: u128,
    min: u32,
    max: u32,
    /// Sequences by their length's next power of two (2^i at index i, see [`pow2_class`]).
    pow2: [u64; 33],
    /// Sequences of each length below [`SMALL`].
    small: Vec<u64>,
    large: Large,
}

#[derive(Debug, Clone)]
enum Large {
    /// Each length of [`SMALL`] or more, with its sequences.
    Exact(BTreeMap<u32, u64>),
    /// Sequences by bucket (see [`bucket`]).
    Buckets(Vec<u64>),
}

/// The index i of the smallest power of two 2^i that is at least `len` (0 for 0 and 1).
fn pow2_class(len: u32) -> usize {
    if len <= 1 {
        0
    } else {
        (32 - (len - 1).leading_zeros()) as usize
    }
}

/// The bucket of a length of [`SMALL`] or more: its power of two and the next [`SUB_BITS`] bits.
fn bucket(len: u32) -> usize {
    let e = 31 - len.leading_zeros();
    let m = (len >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    ((e - SMALL.trailing_zeros()) << SUB_BITS | m) as usize
}

/// The smallest length of bucket `b`.
fn bucket_floor(b: usize) -> u32 {
    let e = (b >> SUB_BITS) as u32 + SMALL.trailing_zeros();
    let m = (b & ((1 << SUB_BITS) - 1)) as u32;
    ((1 << SUB_BITS) | m) << (e - SUB_BITS)
}

const BUCKETS: usize = ((32 - SMALL.trailing_zeros()) << SUB_BITS) as usize;

impl Default for LengthStats {
    fn default() -> Self {
        LengthStats {
            count: 0,
            sum: 0,
            min: u32::MAX,
            max: 0,
            pow2: [0; 33],
            small: vec![0; SMALL as usize],
            large: Large::Exact(BTreeMap::new()),
        }
    }
}

impl LengthStats {
    /// Counts a sequence of `len` samples.
    #[inline]
    pub(crate) fn add(&mut self, len: u32) {
        self.count += 1;
        self.sum += u128::from(len);
        self.min = self.min.min(len);
        self.max = self.max.max(len);
        self.pow2[pow2_class(len)] += 1;
        match self.small.get_mut(len as usize) {
            Some(c) => *c += 1,
            None => self.add_large(len),
        }
    }

    fn add_large(&mut self, len: u32) {
        match &mut self.large {
            Large::Exact(m) => {
                *m.entry(len).or_insert(0) += 1;
                if m.len() > EXACT_DISTINCT {
                    let mut buckets = vec![0u64; BUCKETS];
                    for (&l, &n) in m.iter() {
                        buckets[bucket(l)] += n;
                    }
                    self.large = Large::Buckets(buckets);
                }
            }
            Large::Buckets(b) => b[bucket(len)] += 1,
        }
    }

    /// Sequences counted.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Σ of the lengths.
    pub(crate) fn sum(&self) -> u128 {
        self.sum
    }

    /// Whether [`quantile`](Self::quantile) is exact.
    pub(crate) fn is_exact(&self) -> bool {
        matches!(self.large, Large::Exact(_))
    }

    /// The mean length (0 without sequences).
    pub(crate) fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The nearest-rank quantile `f` (0 ≤ f ≤ 1) of the lengths: the length at rank
    /// `round((count - 1) × f)` of the sorted lengths; 0 without sequences. See the module docs for when
    /// it is approximate.
    pub(crate) fn quantile(&self, f: f64) -> u32 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((self.count - 1) as f64 * f.clamp(0.0, 1.0)).round() as u64;
        if rank == 0 {
            return self.min;
        }
        if rank == self.count - 1 {
            return self.max;
        }
        let mut seen = 0u64;
        for (len, &n) in self.small.iter().enumerate() {
            seen += n;
            if seen > rank {
                return len as u32;
            }
        }
        let found = match &self.large {
            Large::Exact(m) => m.iter().find_map(|(&len, &n)| {
                seen += n;
                (seen > rank).then_some(len)
            }),
            Large::Buckets(b) => b.iter().enumerate().find_map(|(i, &n)| {
                seen += n;
                (seen > rank).then(|| bucket_floor(i))
            }),
        };
        found.unwrap_or(self.max).clamp(self.min, self.max)
    }

    /// `(next power of two, sequences)` of every non-empty class, ascending: the class of 2^k holds the
    /// lengths above 2^(k-1) up to 2^k (0 and 1 are in the class of 1).
    pub(crate) fn pow2_classes(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.pow2.iter().enumerate().filter(|(_, &n)| n > 0).map(|(i, &n)| (1u64 << i, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nearest_rank(sorted: &[u32], f: f64) -> u32 {
        sorted.get(((sorted.len() as f64 - 1.0) * f).round() as usize).copied().unwrap_or(0)
    }

    const QS: [f64; 7] = [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0];

    proptest! {
        /// Exact quantiles, mean and classes for lengths of any size while they fit.
        #[test]
        fn exact_while_distinct_lengths_fit(mut v in proptest::collection::vec(
            prop_oneof![0u32..10, 0u32..5000, any::<u32>()], 0..2000)) {
            let mut s = LengthStats::default();
            for &x in &v {
                s.add(x);
            }
            v.sort_unstable();
            prop_assert!(s.is_exact());
            for f in QS {
                prop_assert_eq!(s.quantile(f), nearest_rank(&v, f));
            }
            prop_assert_eq!(s.count(), v.len() as u64);
            prop_assert_eq!(s.sum(), v.iter().map(|&x| u128::from(x)).sum::<u128>());
            let mut classes: Vec<(u64, u64)> = Vec::new();
            for &x in &v {
                let up = u64::from(x).next_power_of_two();
                match classes.last_mut() {
                    Some(c) if c.0 == up => c.1 += 1,
                    _ => classes.push((up, 1)),
                }
            }
            prop_assert_eq!(s.pow2_classes().collect::<Vec<_>>(), classes);
        }
    }

    #[test]
    fn beyond_the_exact_room_quantiles_stay_within_a_bucket() {
        let mut s = LengthStats::default();
        let mut v = Vec::new();
        // 3 × EXACT_DISTINCT distinct large lengths, plus short ones.
        let mut x: u64 = 12345;
        for i in 0..(3 * EXACT_DISTINCT as u64) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = if i % 3 == 0 { (x >> 60) as u32 } else { SMALL + (x >> 40) as u32 % 50_000_000 };
            s.add(len);
            v.push(len);
        }
        v.sort_unstable();
        assert!(!s.is_exact());
        assert_eq!(s.quantile(0.0), v[0]);
        assert_eq!(s.quantile(1.0), *v.last().unwrap());
        for f in QS {
            let (got, want) = (s.quantile(f), nearest_rank(&v, f));
            assert!(
                got == want || (got < want && u64::from(want - got) * 128 < u64::from(want)),
                "q{f}: {got} against {want}"
            );
        }
        assert_eq!(s.mean(), v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64);
    }

    #[test]
    fn buckets_tile_the_large_lengths() {
        for len in [SMALL, SMALL + 1, 8191, 8192, 1 << 20, (1 << 20) + 12345, u32::MAX] {
            let b = bucket(len);
            assert!(b < BUCKETS);
            assert!(bucket_floor(b) <= len);
            assert!(b + 1 == BUCKETS || bucket_floor(b + 1) > len);
        }
        assert_eq!(bucket_floor(0), SMALL);
    }
}
