//! Statistics of every stream's values (`cntkio stats`, Python `cntkio.stats`): per dimension the mean,
//! standard deviation, minimum and maximum of the values as a model sees them — sparse streams dense, an
//! index a sample leaves out holding 0 and an index it repeats the sum of its entries (as the loaders'
//! dense form holds) — and for sparse streams the samples with an entry at each index: the numbers a
//! training run normalizes its inputs and weighs its classes with.
//!
//! Each chunk is summarized on its own (two passes over its values: the mean, then the squared deviations
//! from it), and the summaries are merged in chunk order with Chan et al.'s pairwise formulas, so the
//! figures are accurate for any number of samples and the same whatever the number of threads.

use crate::source::Deserializer;
use crate::Error;
use cntkio_core::{ChunkData, Layout, StreamData, Values};
use rayon::prelude::*;
use serde::Serialize;

/// Count, mean, sum of squared deviations from the mean, minimum and maximum of some values.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Moments {
    n: u64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
}

impl Default for Moments {
    fn default() -> Moments {
        Moments { n: 0, mean: 0.0, m2: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY }
    }
}

impl Moments {
    /// Adds `b`'s values (Chan, Golub and LeVeque's pairwise update).
    fn merge(&mut self, b: &Moments) {
        if b.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *b;
            return;
        }
        let (na, nb) = (self.n as f64, b.n as f64);
        let n = na + nb;
        let delta = b.mean - self.mean;
        self.mean += delta * (nb / n);
        self.m2 += b.m2 + delta * delta * (na * nb / n);
        self.n += b.n;
        self.min = self.min.min(b.min);
        self.max = self.max.max(b.max);
    }

    /// Adds `zeros` values 0.
    fn add_zeros(&mut self, zeros: u64) {
        self.merge(&Moments { n: zeros, mean: 0.0, m2: 0.0, min: 0.0, max: 0.0 });
    }
}

/// Statistics of one stream so far: per dimension (dense) or per index (sparse: of its entries only).
#[derive(Debug, Clone)]
struct StreamAcc {
    samples: u64,
    entries: u64,
    nan: u64,
    infinite: u64,
    per_dim: Vec<Moments>,
}

impl StreamAcc {
    fn new(dim: usize) -> StreamAcc {
        StreamAcc { samples: 0, entries: 0, nan: 0, infinite: 0, per_dim: vec![Moments::default(); dim] }
    }

    fn merge(&mut self, b: &StreamAcc) {
        self.samples += b.samples;
        self.entries += b.entries;
        self.nan += b.nan;
        self.infinite += b.infinite;
        for (a, b) in self.per_dim.iter_mut().zip(&b.per_dim) {
            a.merge(b);
        }
    }
}

/// The summary of one chunk's stream: a dense stream's moments per dimension, or a sparse stream's per
/// index it touches (sorted by index), so that a chunk of a wide sparse stream costs its entries, not its
/// dimension.
enum ChunkPart {
    Dense(StreamAcc),
    Sparse { samples: u64, entries: u64, nan: u64, infinite: u64, touched: Vec<(usize, Moments)> },
}

fn counts<T: Copy + Into<f64>>(values: &[T]) -> (u64, u64) {
    let mut nan = 0;
    let mut infinite = 0;
    for &v in values {
        let x: f64 = v.into();
        nan += u64::from(x.is_nan());
        infinite += u64::from(x.is_infinite());
    }
    (nan, infinite)
}

fn dense_part<T: Copy + Into<f64>>(values: &[T], dim: usize, samples: u64) -> StreamAcc {
    let mut acc = StreamAcc::new(dim);
    acc.samples = samples;
    if dim == 0 || values.is_empty() {
        return acc;
    }
    let samples = values.len() / dim;
    let mut sum = vec![0.0f64; dim];
    for row in values.chunks_exact(dim) {
        for ((s, m), &v) in sum.iter_mut().zip(acc.per_dim.iter_mut()).zip(row) {
            let x: f64 = v.into();
            *s += x;
            m.min = m.min.min(x);
            m.max = m.max.max(x);
        }
    }
    for (m, s) in acc.per_dim.iter_mut().zip(&sum) {
        m.n = samples as u64;
        m.mean = s / samples as f64;
    }
    for row in values.chunks_exact(dim) {
        for (m, &v) in acc.per_dim.iter_mut().zip(row) {
            let d = v.into() - m.mean;
            m.m2 += d * d;
        }
    }
    (acc.nan, acc.infinite) = counts(values);
    acc
}

/// A thread's per-index scratch for summarizing sparse chunks (sized to the widest stream seen; every
/// entry is back to its initial value between two uses).
struct Scratch {
    /// The sample (of the chunk) whose value an index holds, `u64::MAX` for none.
    owner: Vec<u64>,
    /// Where in that sample's list of values (by index) the index's value is.
    at: Vec<usize>,
    count: Vec<u64>,
    sum: Vec<f64>,
    m2: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
    /// Each sample's value at each index it has (an index it repeats: the sum of its entries there).
    kept: Vec<(u32, f64)>,
    touched: Vec<usize>,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            owner: Vec::new(),
            at: Vec::new(),
            count: Vec::new(),
            sum: Vec::new(),
            m2: Vec::new(),
            min: Vec::new(),
            max: Vec::new(),
            kept: Vec::new(),
            touched: Vec::new(),
        }
    }

    fn fit(&mut self, dim: usize) {
        if self.owner.len() < dim {
            self.owner.resize(dim, u64::MAX);
            self.at.resize(dim, 0);
            self.count.resize(dim, 0);
            self.sum.resize(dim, 0.0);
            self.m2.resize(dim, 0.0);
            self.min.resize(dim, f64::INFINITY);
            self.max.resize(dim, f64::NEG_INFINITY);
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const { std::cell::RefCell::new(Scratch::new()) };
}

fn sparse_part<T>(values: &[T], indices: &[i32], sample_offsets: &[u64], dim: usize) -> ChunkPart
where
    T: Copy + Into<f64> + std::ops::Add<Output = T>,
{
    SCRATCH.with_borrow_mut(|sc| {
        sc.fit(dim);
        // A sample's value at an index: the sum of its entries there, in the stream's type, as the dense
        // form of the loaders (`StreamData.todense`) adds them and as CNTK's sparse products see them.
        let mut sample: Vec<(u32, T)> = Vec::new();
        sc.kept.clear();
        for (k, w) in sample_offsets.windows(2).enumerate() {
            let range = w[0] as usize..w[1] as usize;
            let (Some(ix), Some(vs)) = (indices.get(range.clone()), values.get(range)) else {
                continue;
            };
            sample.clear();
            for (&i, &v) in ix.iter().zip(vs) {
                let i = i.max(0) as usize;
                if i >= dim {
                    continue;
                }
                if sc.owner[i] == k as u64 {
                    let e = &mut sample[sc.at[i]];
                    e.1 = e.1 + v;
                } else {
                    sc.owner[i] = k as u64;
                    sc.at[i] = sample.len();
                    sample.push((i as u32, v));
                }
            }
            sc.kept.extend(sample.iter().map(|&(i, v)| (i, v.into())));
        }
        // Two passes over the kept values in file order: sums, then squared deviations from each index's
        // mean.
        let (mut nan, mut infinite) = (0, 0);
        for &(i, x) in &sc.kept {
            let i = i as usize;
            if sc.count[i] == 0 {
                sc.touched.push(i);
            }
            sc.count[i] += 1;
            sc.sum[i] += x;
            sc.min[i] = sc.min[i].min(x);
            sc.max[i] = sc.max[i].max(x);
            nan += u64::from(x.is_nan());
            infinite += u64::from(x.is_infinite());
        }
        for &(i, x) in &sc.kept {
            let i = i as usize;
            let d = x - sc.sum[i] / sc.count[i] as f64;
            sc.m2[i] += d * d;
        }
        sc.touched.sort_unstable();
        let mut touched = Vec::with_capacity(sc.touched.len());
        for &i in &sc.touched {
            let n = sc.count[i];
            touched.push((i, Moments { n, mean: sc.sum[i] / n as f64, m2: sc.m2[i], min: sc.min[i], max: sc.max[i] }));
            (sc.owner[i], sc.count[i], sc.sum[i], sc.m2[i]) = (u64::MAX, 0, 0.0, 0.0);
            (sc.min[i], sc.max[i]) = (f64::INFINITY, f64::NEG_INFINITY);
        }
        sc.touched.clear();
        let samples = sample_offsets.len().saturating_sub(1) as u64;
        ChunkPart::Sparse { samples, entries: values.len() as u64, nan, infinite, touched }
    })
}

fn part_of(s: &StreamData) -> ChunkPart {
    match (&s.layout, &s.values) {
        (Layout::Dense, Values::F32(v)) => ChunkPart::Dense(dense_part(v, s.dim, s.num_samples())),
        (Layout::Dense, Values::F64(v)) => ChunkPart::Dense(dense_part(v, s.dim, s.num_samples())),
        (Layout::Sparse { indices, sample_offsets }, Values::F32(v)) => sparse_part(v, indices, sample_offsets, s.dim),
        (Layout::Sparse { indices, sample_offsets }, Values::F64(v)) => sparse_part(v, indices, sample_offsets, s.dim),
    }
}

/// Statistics accumulated over chunks, merged in the order they are added.
#[derive(Debug, Clone)]
pub struct StatsAccumulator {
    names: Vec<String>,
    sparse: Vec<bool>,
    sequences: u64,
    streams: Vec<StreamAcc>,
}

/// One chunk's summary, made on any thread ([`StatsAccumulator::summarize`]) and added in chunk order
/// ([`StatsAccumulator::add`]).
pub struct ChunkSummary {
    sequences: u64,
    parts: Vec<ChunkPart>,
}

impl StatsAccumulator {
    /// Nothing seen yet of the streams `(name, dim, sparse)`.
    pub fn new(streams: &[(String, usize, bool)]) -> StatsAccumulator {
        StatsAccumulator {
            names: streams.iter().map(|s| s.0.clone()).collect(),
            sparse: streams.iter().map(|s| s.2).collect(),
            sequences: 0,
            streams: streams.iter().map(|s| StreamAcc::new(s.1)).collect(),
        }
    }

    /// The summary of one chunk's data (in the accumulator's stream order).
    pub fn summarize(data: &ChunkData) -> ChunkSummary {
        ChunkSummary { sequences: data.num_sequences() as u64, parts: data.streams.iter().map(part_of).collect() }
    }

    /// Adds a chunk's summary.
    pub fn add(&mut self, c: &ChunkSummary) {
        self.sequences += c.sequences;
        for (acc, part) in self.streams.iter_mut().zip(&c.parts) {
            match part {
                ChunkPart::Dense(b) => acc.merge(b),
                ChunkPart::Sparse { samples, entries, nan, infinite, touched } => {
                    acc.samples += samples;
                    acc.entries += entries;
                    acc.nan += nan;
                    acc.infinite += infinite;
                    for (i, m) in touched {
                        if let Some(a) = acc.per_dim.get_mut(*i) {
                            a.merge(m);
                        }
                    }
                }
            }
        }
    }

    /// The report: sparse streams' figures as their dense form's (each index's entries, then zeros for the
    /// samples without one).
    pub fn report(&self) -> StatsReport {
        let streams = self
            .streams
            .iter()
            .zip(&self.names)
            .zip(&self.sparse)
            .map(|((acc, name), &sparse)| {
                let dims: Vec<Moments> = acc
                    .per_dim
                    .iter()
                    .map(|m| {
                        let mut d = *m;
                        if sparse {
                            d.add_zeros(acc.samples.saturating_sub(m.n));
                        }
                        d
                    })
                    .collect();
                let none = |f: &dyn Fn(&Moments) -> f64| -> Vec<f64> {
                    dims.iter().map(|m| if m.n == 0 { f64::NAN } else { f(m) }).collect()
                };
                StreamStats {
                    name: name.clone(),
                    format: if sparse { "sparse" } else { "dense" },
                    dim: acc.per_dim.len(),
                    samples: acc.samples,
                    entries: sparse.then_some(acc.entries),
                    nan: acc.nan,
                    infinite: acc.infinite,
                    mean: none(&|m| m.mean),
                    std: none(&|m| (m.m2 / m.n as f64).sqrt()),
                    min: none(&|m| m.min),
                    max: none(&|m| m.max),
                    entries_per_index: sparse.then(|| acc.per_dim.iter().map(|m| m.n).collect()),
                }
            })
            .collect();
        StatsReport { version: 1, sequences: self.sequences, streams }
    }
}

/// Writes figures as JSON numbers, and NaN and the infinities as the strings `"nan"`, `"inf"` and `"-inf"`
/// (as `cntkio dump` writes values).
fn figures<S: serde::Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for &x in v {
        match x {
            x if x.is_nan() => seq.serialize_element("nan")?,
            f64::INFINITY => seq.serialize_element("inf")?,
            f64::NEG_INFINITY => seq.serialize_element("-inf")?,
            x => seq.serialize_element(&x)?,
        }
    }
    seq.end()
}

/// What [`stats`] found. JSON (`cntkio stats --json`), version 1: a NaN or infinite figure (a dimension
/// without samples, or values that are) is the string `"nan"`, `"inf"` or `"-inf"`.
#[derive(Debug, Clone, Serialize)]
pub struct StatsReport {
    /// The layout's version: 1.
    pub version: u32,
    /// Sequences read.
    pub sequences: u64,
    /// One per stream, in the input's stream order.
    pub streams: Vec<StreamStats>,
}

/// One stream's statistics; the per-dimension figures are of the values as a model sees them (a sparse
/// stream dense: 0 where a sample has no entry), NaN for a dimension of a stream without samples.
#[derive(Debug, Clone, Serialize)]
pub struct StreamStats {
    /// The stream's name.
    pub name: String,
    /// `"dense"` or `"sparse"`.
    pub format: &'static str,
    /// The sample dimension.
    pub dim: usize,
    /// Samples of the stream.
    pub samples: u64,
    /// Sparse: the entries (values written) in all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// NaN values among them.
    pub nan: u64,
    /// Infinite values among them.
    pub infinite: u64,
    /// Per dimension: the mean.
    #[serde(serialize_with = "figures")]
    pub mean: Vec<f64>,
    /// Per dimension: the standard deviation (of the population: divided by the samples).
    #[serde(serialize_with = "figures")]
    pub std: Vec<f64>,
    /// Per dimension: the smallest value.
    #[serde(serialize_with = "figures")]
    pub min: Vec<f64>,
    /// Per dimension: the largest value.
    #[serde(serialize_with = "figures")]
    pub max: Vec<f64>,
    /// Sparse: per index, the samples with an entry there (for one-hot labels, the samples of each class; a
    /// sample that repeats an index counts once, the sum of its entries there being its value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries_per_index: Option<Vec<u64>>,
}

/// Chunks summarized at once, per thread (their summaries wait to be added in order).
const AHEAD_PER_THREAD: usize = 2;

/// The statistics of every stream of `source`, reading its chunks on `threads` threads (in order, one at
/// a time, where the order of loading matters: a CTF `maxErrors` budget). `progress(done, total)` is called
/// after each group of chunks; `cancel`, asked before each group, stops the pass with an "interrupted"
/// I/O error when it returns true.
pub fn stats(
    source: &dyn Deserializer,
    threads: usize,
    progress: &mut dyn FnMut(usize, usize),
    cancel: Option<fn() -> bool>,
) -> Result<StatsReport, Error> {
    let streams: Vec<(String, usize, bool)> = source
        .streams()
        .iter()
        .map(|s| (s.name.clone(), s.dim, matches!(s.format, cntkio_core::StorageFormat::Sparse)))
        .collect();
    let mut acc = StatsAccumulator::new(&streams);
    let total = source.chunks().len();
    let threads = if source.load_order_matters() { 1 } else { threads.max(1) };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::internal(format!("cannot start {threads} threads: {e}")))?;
    let group = threads * AHEAD_PER_THREAD;
    let mut first = 0;
    while first < total {
        crate::check_cancel(cancel)?;
        let end = (first + group).min(total);
        let summaries: Vec<Result<ChunkSummary, Error>> = pool.install(|| {
            (first..end)
                .into_par_iter()
                .map(|k| Ok(StatsAccumulator::summarize(&*source.load_chunk(k as u32)?)))
                .collect()
        });
        for s in summaries {
            acc.add(&s?);
        }
        first = end;
        progress(first, total);
    }
    Ok(acc.report())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cntkio_core::{ElementType, StorageFormat};

    /// Mean, population standard deviation, min and max of `xs`, the obvious way.
    fn naive(xs: &[f64]) -> (f64, f64, f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        (
            mean,
            var.sqrt(),
            xs.iter().copied().fold(f64::INFINITY, f64::min),
            xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    fn dense_chunk(rows: &[[f32; 2]]) -> ChunkData {
        let mut s = StreamData::new(StorageFormat::Dense, 2, ElementType::F32);
        s.values = Values::F32(rows.iter().flatten().copied().collect());
        s.sequence_offsets = (0..=rows.len() as u64).collect();
        ChunkData {
            keys: (0..rows.len() as u64).collect(),
            num_samples: rows.iter().map(|_| 1).collect(),
            streams: vec![s],
        }
    }

    fn sparse_chunk(samples: &[&[(i32, f32)]]) -> ChunkData {
        let mut s = StreamData::new(StorageFormat::Sparse, 4, ElementType::F32);
        let mut offsets = vec![0u64];
        let mut indices = Vec::new();
        let mut values = Vec::new();
        for sample in samples {
            for &(i, v) in *sample {
                indices.push(i);
                values.push(v);
            }
            offsets.push(indices.len() as u64);
        }
        s.layout = Layout::Sparse { indices, sample_offsets: offsets };
        s.values = Values::F32(values);
        s.sequence_offsets = (0..=samples.len() as u64).collect();
        ChunkData {
            keys: (0..samples.len() as u64).collect(),
            num_samples: samples.iter().map(|_| 1).collect(),
            streams: vec![s],
        }
    }

    #[test]
    fn chunks_merged_in_any_split_give_the_figures_of_all_values() {
        // Values far from 0 with a small spread: where a one-pass sum of squares loses every digit.
        let rows: Vec<[f32; 2]> =
            (0..1000).map(|i| [1.0e6 + (i % 7) as f32 * 0.25, -3.0 + ((i * 13) % 11) as f32]).collect();
        let want: Vec<_> = (0..2).map(|d| naive(&rows.iter().map(|r| f64::from(r[d])).collect::<Vec<_>>())).collect();
        for split in [1, 3, 250, 999, 1000] {
            let mut acc = StatsAccumulator::new(&[("x".into(), 2, false)]);
            for part in rows.chunks(split) {
                acc.add(&StatsAccumulator::summarize(&dense_chunk(part)));
            }
            let r = acc.report();
            let s = &r.streams[0];
            assert_eq!((r.sequences, s.samples, s.entries), (1000, 1000, None));
            for (d, (mean, std, min, max)) in want.iter().enumerate() {
                assert!(close(s.mean[d], *mean) && close(s.std[d], *std), "split {split} dim {d}: {s:?}");
                assert_eq!((s.min[d], s.max[d]), (*min, *max));
            }
        }
    }

    #[test]
    fn sparse_streams_count_as_their_dense_form_with_entries_per_index() {
        // Index 1 twice in the first sample: the sum of its entries is the sample's value (as the dense form).
        let a: &[(i32, f32)] = &[(1, 0.5), (3, -1.0), (1, 1.5)];
        let b: &[(i32, f32)] = &[(1, 4.0)];
        let c: &[(i32, f32)] = &[];
        let mut acc = StatsAccumulator::new(&[("y".into(), 4, true)]);
        acc.add(&StatsAccumulator::summarize(&sparse_chunk(&[a, b])));
        acc.add(&StatsAccumulator::summarize(&sparse_chunk(&[c])));
        let s = &acc.report().streams[0];
        assert_eq!((s.samples, s.entries), (3, Some(4)));
        assert_eq!(s.entries_per_index.as_deref(), Some(&[0, 2, 0, 1][..]));
        // The dense form: index 1 holds 2, 4, 0; index 3 holds -1, 0, 0; indices 0 and 2 only zeros.
        let dense = [[0.0, 2.0, 0.0, -1.0], [0.0, 4.0, 0.0, 0.0], [0.0; 4]];
        for d in 0..4 {
            let (mean, std, min, max) = naive(&dense.iter().map(|r| r[d]).collect::<Vec<_>>());
            assert!(close(s.mean[d], mean) && close(s.std[d], std), "dim {d}: {s:?}");
            assert_eq!((s.min[d], s.max[d]), (min, max), "dim {d}");
        }
    }

    #[test]
    fn empty_streams_and_non_finite_values_are_reported_not_hidden() {
        let mut acc = StatsAccumulator::new(&[("x".into(), 2, false)]);
        let r = acc.report();
        assert!(r.streams[0].mean.iter().all(|m| m.is_nan()));
        assert_eq!(serde_json::to_value(&r).unwrap()["streams"][0]["mean"], serde_json::json!(["nan", "nan"]));
        acc.add(&StatsAccumulator::summarize(&dense_chunk(&[[f32::NAN, 1.0], [f32::INFINITY, 2.0]])));
        let s = &acc.report().streams[0];
        assert_eq!((s.nan, s.infinite), (1, 1));
        assert!(s.mean[0].is_nan() && close(s.mean[1], 1.5) && s.max[0] == f64::INFINITY);
        let json = serde_json::to_value(acc.report()).unwrap();
        assert_eq!(json["streams"][0]["max"], serde_json::json!(["inf", 2.0]));
        // A dense stream of dim 0 has samples, and no dimension.
        let mut empty = StreamData::new(StorageFormat::Dense, 0, ElementType::F32);
        empty.sequence_offsets = vec![0, 3];
        let data =
            ChunkData { keys: [7].into_iter().collect(), num_samples: [3].into_iter().collect(), streams: vec![empty] };
        let mut acc = StatsAccumulator::new(&[("z".into(), 0, false)]);
        acc.add(&StatsAccumulator::summarize(&data));
        let s = &acc.report().streams[0];
        assert_eq!((s.samples, s.mean.len()), (3, 0));
    }
}
