//! Elastic resume of a sweep under balanced dealing: earlier runs read part of a sweep with some number of
//! workers; a new run with another number of workers reads exactly the rest of it.
//!
//! With balanced dealing ([`BlockRandomizer::with_balanced_workers`](super::BlockRandomizer::with_balanced_workers))
//! the sequence at index `t` of a sweep's randomized order goes to worker `t mod W`, and the order does not
//! depend on the workers. A worker that has been delivered `n` sequences of the sweep has therefore read the
//! indices `t ≡ r (mod W)` with `t div W < n`, whatever its minibatch sizes were. Given every worker's count,
//! the rest of the sweep is the list `R` of the other indices, in order; a new run with `W'` workers deals
//! `R[i]` to worker `i mod W'` for the rest of the sweep, and later sweeps are dealt as usual (`t mod W'`).
//! Every sequence of the sweep is then read exactly once, by the old runs or the new one.
//!
//! Resumes chain: a run that itself resumed elastically and was interrupted again adds a round of counts
//! (each round's counts are of the list its predecessors left). When the new run has as many workers as
//! the last round, that round is not re-dealt: worker `r'` continues old worker `r'` exactly (it gets the
//! indices `i ≡ r' (mod W')` of the list with `i div W' ≥ n_r'`), which is what restoring each worker's own
//! checkpoint gives.

use crate::Error;

/// The sequences of one sweep already read by earlier runs with balanced dealing (see the module docs).
///
/// `rounds[0][r]` is the number of sequences worker `r` of `rounds[0].len()` was delivered in sweep
/// `sweep`; `rounds[i]` (for a run that resumed elastically itself) counts the sequences worker `r` of
/// `rounds[i].len()` was delivered of those the rounds before it left. No rounds: nothing was read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ElasticResume {
    /// The sweep the earlier runs were reading (0-based, on the run's timeline).
    pub sweep: u64,
    /// Per earlier run (oldest first), the number of sequences each of its workers was delivered.
    pub rounds: Vec<Vec<u64>>,
}

impl ElasticResume {
    /// Resume data for sweep `sweep` after one run whose worker `r` of `consumed.len()` was delivered
    /// `consumed[r]` sequences of it.
    pub fn new(sweep: u64, consumed: Vec<u64>) -> ElasticResume {
        ElasticResume { sweep, rounds: vec![consumed] }
    }

    /// The resume data after a run that resumed with `self` on `workers` workers was interrupted again, its
    /// worker `r` having been delivered `consumed[r]` sequences of the sweep (as
    /// [`MinibatchSource::sequences_delivered`](crate::source::MinibatchSource::sequences_delivered) counts
    /// them): a new round, or, when `workers` equals the last round's (which that run continued), the last
    /// round replaced.
    pub fn then(&self, workers: u32, consumed: Vec<u64>) -> ElasticResume {
        let mut rounds = self.rounds.clone();
        if rounds.last().is_some_and(|last| last.len() as u64 == u64::from(workers)) {
            rounds.pop();
        }
        rounds.push(consumed);
        ElasticResume { sweep: self.sweep, rounds }
    }

    /// Checks the rounds against a sweep of `sequences` sequences and returns how many sequences they
    /// leave.
    ///
    /// Errors ([`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState)): a round with no workers or more than
    /// `u32::MAX`, or a count larger than that worker's share of the sequences left to its round.
    pub fn check(&self, sequences: u64) -> Result<u64, Error> {
        let mut left = sequences;
        for (i, round) in self.rounds.iter().enumerate() {
            let workers = round.len() as u64;
            if workers == 0 || u32::try_from(workers).is_err() {
                return Err(Error::state(format!(
                    "elastic resume of sweep {}: round {i} has {workers} workers; it needs 1 to 2^32 − 1 (one count \
                     per worker)",
                    self.sweep
                )));
            }
            let mut read = 0u64;
            for (r, &n) in round.iter().enumerate() {
                let share = share(left, workers, r as u64);
                if n > share {
                    return Err(Error::state(format!(
                        "elastic resume of sweep {}: worker {r} of {workers} (round {i}) consumed {n} sequences, but \
                         its share of the {left} sequences left to that round is {share}",
                        self.sweep
                    )));
                }
                read += n;
            }
            left -= read;
        }
        Ok(left)
    }
}

/// Number of indices `t < n` with `t ≡ r (mod w)` (`r < w`).
#[inline]
pub(crate) fn share(n: u64, w: u64, r: u64) -> u64 {
    n / w + u64::from(r < n % w)
}

/// Number of indices `j' < j` that `round` consumed (`j' div W < round[j' mod W]`, `W = round.len()`).
fn consumed_before(round: &[u64], j: u64) -> u64 {
    let w = round.len() as u64;
    round.iter().enumerate().map(|(o, &n)| n.min(share(j, w, o as u64))).sum()
}

/// How the sequence at one index of an elastic sweep is dealt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deal {
    /// Read by round `round` of the earlier runs.
    Consumed {
        /// The round.
        round: usize,
    },
    /// Left to this run, at index `index` of the list it deals (`mod workers`).
    Left {
        /// Its index in the list this run deals.
        index: u64,
    },
}

/// A walk over the indices of an elastic sweep for `workers` workers: where index `t` lies in each
/// round's list. Moving to the next index costs O(rounds); starting at any index O(Σ workers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ElasticCursor {
    /// The index of the sequence offered next.
    pub t: u64,
    /// Per round applied: the sequences before `t` (of those reaching the round) that it consumed.
    before: Vec<u64>,
    /// The rounds applied (all, or all but a last round with `workers` workers, which this run continues).
    applied: usize,
}

impl ElasticCursor {
    /// The walk of `resume` (already checked) by `workers` workers, at index `t`.
    pub fn at(resume: &ElasticResume, workers: u32, t: u64) -> ElasticCursor {
        let k = resume.rounds.len();
        let applied =
            if resume.rounds.last().is_some_and(|l| l.len() as u64 == u64::from(workers)) { k - 1 } else { k };
        let mut before = Vec::with_capacity(applied);
        let mut j = t;
        for round in &resume.rounds[..applied] {
            let c = consumed_before(round, j);
            before.push(c);
            j -= c;
        }
        ElasticCursor { t, before, applied }
    }

    /// The deal of index `self.t`, and, for a sequence left to this run, whether this run's `rank` of
    /// `workers` gets it.
    #[inline]
    pub fn deal(&self, resume: &ElasticResume, workers: u32, rank: u32) -> (Deal, bool) {
        let mut j = self.t;
        for (i, round) in resume.rounds[..self.applied].iter().enumerate() {
            let w = round.len() as u64;
            if j / w < round[(j % w) as usize] {
                return (Deal::Consumed { round: i }, false);
            }
            j -= self.before[i];
        }
        let w = u64::from(workers);
        let owner = j % w;
        if let Some(last) = resume.rounds.get(self.applied) {
            // The continued round: its workers' first indices are theirs already.
            if j / w < last[owner as usize] {
                return (Deal::Consumed { round: self.applied }, false);
            }
        }
        (Deal::Left { index: j }, owner == u64::from(rank))
    }

    /// Moves to the next index, `deal` being the deal of this one.
    #[inline]
    pub fn step(&mut self, deal: Deal) {
        if let Deal::Consumed { round } = deal {
            if round < self.applied {
                self.before[round] += 1;
            }
        }
        self.t += 1;
    }

    /// The sequences before index `self.t` that `rank` of `workers` is (or, for a continued round, was)
    /// delivered: the indices `i ≡ rank (mod workers)` below `t`'s index in the list this run deals.
    pub fn delivered(&self, workers: u32, rank: u32) -> u64 {
        let j = self.t - self.before.iter().sum::<u64>();
        share(j, u64::from(workers), u64::from(rank))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deal of every index by brute force, from the lists of the module docs: per index, the worker
    /// of this run that gets it, and whether it is one a continued round had already delivered to it.
    fn reference(resume: &ElasticResume, total: u64, workers: u32) -> Vec<Option<(u32, bool)>> {
        let mut left: Vec<u64> = (0..total).collect();
        let k = resume.rounds.len();
        let continued = resume.rounds.last().is_some_and(|l| l.len() as u64 == u64::from(workers));
        let applied = if continued { k - 1 } else { k };
        for round in &resume.rounds[..applied] {
            let w = round.len() as u64;
            left = left
                .iter()
                .enumerate()
                .filter(|&(i, _)| (i as u64) / w >= round[(i as u64 % w) as usize])
                .map(|(_, &t)| t)
                .collect();
        }
        let mut owner = vec![None; total as usize];
        let w = u64::from(workers);
        for (i, &t) in left.iter().enumerate() {
            let i = i as u64;
            let before = continued && i / w < resume.rounds[k - 1][(i % w) as usize];
            owner[t as usize] = Some(((i % w) as u32, before));
        }
        owner
    }

    #[test]
    fn cursor_matches_the_lists() {
        let cases: Vec<(u64, Vec<Vec<u64>>, u32)> = vec![
            (10, vec![vec![2, 1]], 3),
            (10, vec![vec![2, 1]], 2),
            (11, vec![vec![1, 3, 0, 2]], 2),
            (9, vec![vec![3, 2, 1]], 1),
            (13, vec![vec![2, 1], vec![1, 0, 2]], 2),
            (13, vec![vec![2, 1], vec![1, 0, 2]], 3),
            (7, vec![], 2),
            (5, vec![vec![3, 2]], 4),
        ];
        for (total, rounds, workers) in cases {
            let resume = ElasticResume { sweep: 0, rounds };
            let left = resume.check(total).unwrap();
            let want = reference(&resume, total, workers);
            let dealt = want.iter().filter(|o| matches!(o, Some((_, false)))).count() as u64;
            assert_eq!(dealt, left, "{resume:?}");
            for rank in 0..workers {
                let mut c = ElasticCursor::at(&resume, workers, 0);
                let mut got = Vec::new();
                for t in 0..total {
                    // Starting anywhere gives the same walk.
                    assert_eq!(ElasticCursor::at(&resume, workers, t), c, "{resume:?} t {t}");
                    let delivered =
                        want[..t as usize].iter().filter(|o| matches!(o, Some((r, _)) if *r == rank)).count();
                    assert_eq!(c.delivered(workers, rank), delivered as u64, "{resume:?} t {t} rank {rank}");
                    let (d, mine) = c.deal(&resume, workers, rank);
                    got.push(mine);
                    c.step(d);
                }
                let want_mine: Vec<bool> = want.iter().map(|&o| o == Some((rank, false))).collect();
                assert_eq!(got, want_mine, "{resume:?} workers {workers} rank {rank}");
            }
        }
    }

    #[test]
    fn counts_beyond_a_share_and_empty_rounds_are_errors() {
        assert_eq!(ElasticResume::new(0, vec![3, 2]).check(5).unwrap(), 0);
        let e = ElasticResume::new(0, vec![2, 3]).check(5).unwrap_err();
        assert!(e.to_string().contains("worker 1 of 2 (round 0) consumed 3 sequences"), "{e}");
        assert!(e.to_string().contains("its share of the 5 sequences left to that round is 2"), "{e}");
        let e = ElasticResume::new(4, vec![]).check(5).unwrap_err();
        assert!(e.to_string().contains("sweep 4: round 0 has 0 workers"), "{e}");
        let two = ElasticResume { sweep: 0, rounds: vec![vec![1, 1], vec![2]] };
        assert_eq!(two.check(5).unwrap(), 1);
        assert!(ElasticResume { sweep: 0, rounds: vec![vec![1, 1], vec![4]] }.check(5).is_err());
    }

    #[test]
    fn then_adds_a_round_or_replaces_a_continued_one() {
        let r = ElasticResume::new(2, vec![3, 2]);
        assert_eq!(r.then(3, vec![1, 1, 1]).rounds, vec![vec![3, 2], vec![1, 1, 1]]);
        assert_eq!(r.then(2, vec![5, 4]).rounds, vec![vec![5, 4]]);
        assert_eq!(r.then(2, vec![5, 4]).sweep, 2);
    }
}
