//! Elastic resume (`MinibatchConfig::elastic_resume`, balanced dealing): old workers read part of a sweep,
//! new workers of another number read the rest. On random data (varied sequence lengths, several chunks,
//! windows, seeds, minibatch sizes): every sequence of the sweep is read exactly once across the runs, the
//! new workers get the rest of the sweep's order dealt in turn, the next sweep is dealt as usual, and
//! `sequences_delivered` counts exactly, also across restores. With as many workers as before, the resume
//! is today's exact continuation. Other dealings are refused with a clear error.

mod common;

use cntkio::randomize::{ElasticResume, Window};
use cntkio::source::{Deserializer, MinibatchConfig, MinibatchSource, RunLength};
use common::Mem;
use std::collections::BTreeMap;
use std::sync::Arc;

/// SplitMix64, for the random cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One random case: the data and a configuration with balanced dealing.
struct Case {
    data: Arc<dyn Deserializer>,
    conf: MinibatchConfig,
    sequences: u64,
}

fn random_case(rng: &mut Rng) -> Case {
    let lens: Vec<Vec<u32>> =
        (0..rng.range(1, 8)).map(|_| (0..rng.range(0, 12)).map(|_| rng.range(1, 5) as u32).collect()).collect();
    let lens = if lens.iter().all(|c| c.is_empty()) { vec![vec![1, 2, 3]] } else { lens };
    let sequences = lens.iter().map(|c| c.len() as u64).sum();
    let window = if rng.range(0, 1) == 0 { Window::Chunks(rng.range(1, 4)) } else { Window::Samples(rng.range(1, 40)) };
    let conf = MinibatchConfig {
        window,
        seed: rng.range(0, 5),
        balanced_workers: true,
        run_length: RunLength::Sweeps(1),
        threads: if rng.range(0, 1) == 0 { Some(0) } else { None },
        ..MinibatchConfig::default()
    };
    Case { data: Arc::new(Mem::new(lens)), conf, sequences }
}

fn source(c: &Case, conf: MinibatchConfig) -> MinibatchSource {
    MinibatchSource::new(c.data.clone(), conf).unwrap()
}

/// The keys of the next `limit` minibatches of `size` (fewer at the end of the run).
fn read(src: &mut MinibatchSource, size: u64, limit: usize) -> Vec<Vec<u64>> {
    let mut out = Vec::new();
    while out.len() < limit {
        match src.next_minibatch(size).unwrap() {
            Some(b) => out.push(b.data.keys.to_vec()),
            None => break,
        }
    }
    out
}

/// The single worker's order of the first `sweeps` sweeps.
fn order(c: &Case, sweeps: u64) -> Vec<u64> {
    let conf = MinibatchConfig { run_length: RunLength::Sweeps(sweeps), ..c.conf.clone() };
    read(&mut source(c, conf), 1000, usize::MAX).concat()
}

/// Old workers `0..workers` each read a random number of minibatches of sweep 0 (of random sizes); returns
/// their keys and their sources (where they stopped).
fn old_run(
    c: &Case,
    rng: &mut Rng,
    workers: u32,
    base: Option<&ElasticResume>,
) -> (Vec<Vec<u64>>, Vec<MinibatchSource>) {
    let mut keys = Vec::new();
    let mut sources = Vec::new();
    for rank in 0..workers {
        let conf = MinibatchConfig { workers, rank, elastic_resume: base.cloned(), ..c.conf.clone() };
        let mut src = source(c, conf);
        let size = rng.range(1, 12) * u64::from(workers);
        let k = rng.range(0, 6) as usize;
        let got: Vec<u64> = read(&mut src, size, k).concat();
        assert_eq!(src.sequences_delivered(0).unwrap(), got.len() as u64, "worker {rank}/{workers}");
        keys.push(got);
        sources.push(src);
    }
    (keys, sources)
}

/// New workers `0..workers` read the rest of the run; returns their keys.
fn new_run(c: &Case, rng: &mut Rng, workers: u32, resume: &ElasticResume, sweeps: u64) -> Vec<Vec<u64>> {
    (0..workers)
        .map(|rank| {
            let conf = MinibatchConfig {
                workers,
                rank,
                run_length: RunLength::Sweeps(sweeps),
                elastic_resume: Some(resume.clone()),
                ..c.conf.clone()
            };
            // At least the longest sequence per worker: a minibatch that crosses into the next sweep takes its
            // first sequence only if it fits (READER.md §4.3), so a worker with nothing left in this sweep
            // would otherwise get an empty minibatch, which ends the run.
            let size = rng.range(5, 12) * u64::from(workers);
            let mut src = source(c, conf);
            let got = read(&mut src, size, usize::MAX).concat();
            let delivered = src.sequences_delivered(0).unwrap() as usize;
            if sweeps == 1 {
                assert_eq!(delivered, got.len(), "new worker {rank}/{workers}");
            } else {
                assert!(delivered <= got.len(), "new worker {rank}/{workers}");
            }
            got
        })
        .collect()
}

/// Every key of the sweep exactly once among `parts`.
fn assert_exactly_once(parts: &[&[u64]], sequences: u64, what: &str) {
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for p in parts {
        for &k in *p {
            *seen.entry(k).or_default() += 1;
        }
    }
    assert_eq!(seen.len() as u64, sequences, "{what}: not every key read: {seen:?}");
    assert!(seen.values().all(|&n| n == 1), "{what}: a key read twice: {seen:?}");
}

/// The rest of `order` after `consumed` (worker `r` of `consumed.len()` read the indices `t ≡ r` with
/// `t div W < consumed[r]`): the list of the spec.
fn rest(order: &[u64], consumed: &[u64]) -> Vec<u64> {
    let w = consumed.len();
    order.iter().enumerate().filter(|&(t, _)| (t / w) as u64 >= consumed[t % w]).map(|(_, &k)| k).collect()
}

fn dealt(list: &[u64], workers: u32, rank: u32) -> Vec<u64> {
    list.iter().skip(rank as usize).step_by(workers as usize).copied().collect()
}

#[test]
fn resumes_with_other_worker_counts_read_every_sequence_once() {
    let mut rng = Rng(17);
    for case in 0..60 {
        let c = random_case(&mut rng);
        let two = order(&c, 2);
        let (sweep0, sweep1) = two.split_at(c.sequences as usize);
        for (old, new) in [(2u32, 3u32), (4, 2), (3, 1), (1, 4), (5, 2)] {
            let what = format!("case {case} {:?} seed {} {old}→{new}", c.conf.window, c.conf.seed);
            let (old_keys, mut old_sources) = old_run(&c, &mut rng, old, None);
            let consumed: Vec<u64> = old_sources.iter_mut().map(|s| s.sequences_delivered(0).unwrap()).collect();
            for (r, k) in old_keys.iter().enumerate() {
                assert_eq!(k, &dealt(sweep0, old, r as u32)[..k.len()], "{what}: old worker {r}");
            }
            let resume = ElasticResume::new(0, consumed.clone());
            // The rest of the sweep only.
            let new_keys = new_run(&c, &mut rng, new, &resume, 1);
            let left = rest(sweep0, &consumed);
            for (r, k) in new_keys.iter().enumerate() {
                assert_eq!(k, &dealt(&left, new, r as u32), "{what}: new worker {r}");
            }
            let parts: Vec<&[u64]> = old_keys.iter().chain(&new_keys).map(|k| k.as_slice()).collect();
            assert_exactly_once(&parts, c.sequences, &what);
            // Two sweeps: the next one is dealt as usual.
            let both = new_run(&c, &mut rng, new, &resume, 2);
            for (r, k) in both.iter().enumerate() {
                let n = new_keys[r].len();
                assert_eq!(k[..n], new_keys[r][..], "{what}: worker {r}, sweep 0");
                assert_eq!(k[n..], dealt(sweep1, new, r as u32)[..], "{what}: worker {r}, sweep 1");
            }
        }
    }
}

#[test]
fn chained_resumes_read_every_sequence_once() {
    let mut rng = Rng(5);
    for case in 0..40 {
        let c = random_case(&mut rng);
        for (a, b, d) in [(4u32, 3u32, 2u32), (2, 3, 2), (3, 1, 5)] {
            let what = format!("case {case} {a}→{b}→{d}");
            let (first_keys, mut first) = old_run(&c, &mut rng, a, None);
            let r1 = ElasticResume::new(0, first.iter_mut().map(|s| s.sequences_delivered(0).unwrap()).collect());
            let (second_keys, mut second) = old_run(&c, &mut rng, b, Some(&r1));
            let r2 = r1.then(b, second.iter_mut().map(|s| s.sequences_delivered(0).unwrap()).collect());
            let third_keys = new_run(&c, &mut rng, d, &r2, 1);
            let parts: Vec<&[u64]> =
                first_keys.iter().chain(&second_keys).chain(&third_keys).map(|k| k.as_slice()).collect();
            assert_exactly_once(&parts, c.sequences, &what);
        }
    }
}

/// With as many workers as the old run, each new worker continues its old namesake exactly: the same
/// minibatches as restoring that worker's own checkpoint (today's exact continuation).
#[test]
fn same_worker_count_is_the_exact_continuation() {
    let mut rng = Rng(99);
    for case in 0..40 {
        let c = random_case(&mut rng);
        let workers = rng.range(1, 4) as u32;
        let (old_keys, mut old_sources) = old_run(&c, &mut rng, workers, None);
        let consumed: Vec<u64> = old_sources.iter_mut().map(|s| s.sequences_delivered(0).unwrap()).collect();
        let resume = ElasticResume::new(0, consumed.clone());
        let mut all = old_keys.clone();
        for rank in 0..workers {
            let conf = MinibatchConfig { workers, rank, ..c.conf.clone() };
            let size = rng.range(1, 9) * u64::from(workers);
            let mut exact = source(&c, conf.clone());
            exact.restore(&old_sources[rank as usize].state()).unwrap();
            let want = read(&mut exact, size, usize::MAX);
            let mut elastic = source(&c, MinibatchConfig { elastic_resume: Some(resume.clone()), ..conf });
            let got = read(&mut elastic, size, usize::MAX);
            assert_eq!(got, want, "case {case} worker {rank}/{workers}");
            // Counted as the uninterrupted run counts: the old minibatches included.
            assert_eq!(
                elastic.sequences_delivered(0).unwrap(),
                (consumed[rank as usize] + want.concat().len() as u64),
                "case {case}"
            );
            all[rank as usize].extend(got.concat());
        }
        let parts: Vec<&[u64]> = all.iter().map(|k| k.as_slice()).collect();
        assert_exactly_once(&parts, c.sequences, &format!("case {case}"));
    }
}

/// A new worker interrupted in the resumed sweep continues exactly from its checkpoint (a seek inside the
/// elastic sweep), and its count is the same after the restore.
#[test]
fn restores_inside_a_resumed_sweep_continue_exactly() {
    let mut rng = Rng(3);
    for case in 0..60 {
        let c = random_case(&mut rng);
        let (old, new) = (rng.range(1, 4) as u32, rng.range(1, 4) as u32);
        let (_, mut old_sources) = old_run(&c, &mut rng, old, None);
        let resume = ElasticResume::new(0, old_sources.iter_mut().map(|s| s.sequences_delivered(0).unwrap()).collect());
        for rank in 0..new {
            let conf = MinibatchConfig {
                workers: new,
                rank,
                run_length: RunLength::Sweeps(2),
                elastic_resume: Some(resume.clone()),
                ..c.conf.clone()
            };
            let size = rng.range(5, 9) * u64::from(new);
            let all = read(&mut source(&c, conf.clone()), size, usize::MAX);
            let cut = rng.range(0, all.len() as u64) as usize;
            let mut first = source(&c, conf.clone());
            assert_eq!(read(&mut first, size, cut), all[..cut], "case {case}");
            let count = first.sequences_delivered(0).unwrap();
            let mut second = source(&c, conf);
            second.restore(&first.state()).unwrap();
            assert_eq!(second.sequences_delivered(0).unwrap(), count, "case {case} worker {rank}: count restored");
            assert_eq!(read(&mut second, size, usize::MAX), all[cut..], "case {case} worker {rank}/{new} at {cut}");
        }
    }
}

/// The count is exact at every minibatch, before, inside and after the sweep (also while planning ahead).
#[test]
fn sequences_delivered_counts_every_minibatch() {
    let mut rng = Rng(11);
    for case in 0..30 {
        let c = random_case(&mut rng);
        let workers = rng.range(1, 4) as u32;
        for rank in 0..workers {
            let conf =
                MinibatchConfig { workers, rank, run_length: RunLength::Sweeps(3), threads: None, ..c.conf.clone() };
            let mut src = source(&c, conf);
            assert_eq!(src.sequences_delivered(0).unwrap(), 0);
            let share = (c.sequences + u64::from(workers - 1 - rank)) / u64::from(workers);
            let size = rng.range(5, 8) * u64::from(workers);
            let mut total = 0u64;
            while let Some(b) = src.next_minibatch(size).unwrap() {
                total += b.data.keys.len() as u64;
                let (s0, s1) = (src.sequences_delivered(0).unwrap(), src.sequences_delivered(1).unwrap());
                let s2 = src.sequences_delivered(2).unwrap();
                assert_eq!(s0 + s1 + s2, total, "case {case} worker {rank}/{workers}");
                assert!(s0 <= share && s1 <= share && (s1 == 0 || s0 == share), "case {case}: {s0} {s1}");
            }
            assert_eq!(src.sequences_delivered(1).unwrap(), share, "case {case}");
        }
    }
}

fn small() -> Case {
    Case {
        data: Arc::new(Mem::new(vec![vec![1, 2], vec![3, 1, 1], vec![2]])),
        conf: MinibatchConfig::default(),
        sequences: 6,
    }
}

fn error(c: &Case, conf: MinibatchConfig) -> String {
    match MinibatchSource::new(c.data.clone(), conf) {
        Ok(_) => panic!("accepted"),
        Err(e) => {
            // The caller's fault: an option (E1006) or a state (E1007) that does not fit.
            assert!(["E1006", "E1007"].contains(&e.code()), "{e}");
            assert_eq!(e.category(), cntkio::Category::Usage, "{e}");
            e.to_string()
        }
    }
}

#[test]
fn unsupported_dealings_and_bad_counts_are_errors() {
    let c = small();
    let resume = Some(ElasticResume::new(0, vec![1, 1]));
    let balanced = MinibatchConfig { balanced_workers: true, ..MinibatchConfig::default() };
    let needs = "needs balanced dealing with randomization (balanced_workers=True and shuffle=True); CNTK's chunk \
                 dealing cannot do it";
    // CNTK's chunk dealing.
    let e = error(&c, MinibatchConfig { elastic_resume: resume.clone(), ..MinibatchConfig::default() });
    assert!(e.contains(needs), "{e}");
    // No randomization, balanced or not.
    for window in [Window::Chunks(0), Window::Samples(0)] {
        let e = error(&c, MinibatchConfig { window, elastic_resume: resume.clone(), ..balanced.clone() });
        assert!(e.contains(needs), "{e}");
    }
    let e = error(&c, MinibatchConfig { randomize: false, elastic_resume: resume.clone(), ..balanced.clone() });
    assert!(e.contains(needs), "{e}");
    // A count beyond the worker's share (6 sequences, 2 workers: 3 each).
    let e = error(&c, MinibatchConfig { elastic_resume: Some(ElasticResume::new(0, vec![3, 4])), ..balanced.clone() });
    assert!(e.contains("worker 1 of 2 (round 0) consumed 4 sequences, but its share of the 6 sequences left"), "{e}");
    // No workers.
    let e = error(&c, MinibatchConfig { elastic_resume: Some(ElasticResume::new(2, vec![])), ..balanced.clone() });
    assert!(e.contains("elastic resume of sweep 2: round 0 has 0 workers"), "{e}");
    // CNTK's restore quirk and truncated BPTT.
    for conf in [
        MinibatchConfig { cntk_restore_quirk: true, elastic_resume: resume.clone(), ..balanced.clone() },
        MinibatchConfig { truncation_length: 2, elastic_resume: resume.clone(), ..balanced.clone() },
    ] {
        let e = error(&c, conf);
        assert!(e.contains("elastic resume needs exact restores and whole sequences"), "{e}");
    }
    // Counting needs balanced dealing.
    let mut chunks = MinibatchSource::new(c.data.clone(), MinibatchConfig::default()).unwrap();
    let e = chunks.sequences_delivered(0).unwrap_err();
    assert!(e.to_string().contains("only with balanced dealing"), "{e}");
    // The exact counts are accepted, and leave nothing.
    let mut done = MinibatchSource::new(
        c.data.clone(),
        MinibatchConfig {
            elastic_resume: Some(ElasticResume::new(0, vec![3, 3])),
            run_length: RunLength::Sweeps(1),
            ..balanced
        },
    )
    .unwrap();
    assert!(done.next_minibatch(4).unwrap().is_none());
}
