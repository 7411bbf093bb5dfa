//! Minibatches: the batch a source fills, a minibatch planned but not yet copied, and the copy kernels
//! that assemble it from loaded chunks.

use super::chunk::{self, SourceChunk};
use super::BpttLayout;
use crate::randomize::Pick;
use crate::{ChunkData, Keys, Layout, Lengths, StreamData, StreamSpec, Values};
use std::sync::Arc;

/// One minibatch for this worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The sequences in delivery order: keys, declared lengths and, per stream (in the deserializer's
    /// stream order), their samples one sequence after another (`sequence_offsets` delimit them).
    pub data: ChunkData,
    /// The minibatch reached or crossed the end of a sweep (Python `MinibatchData.end_of_sweep`).
    pub end_of_sweep: bool,
    /// The minibatch reached the end of the run; the next call returns nothing.
    pub end_of_run: bool,
    /// With truncated BPTT ([`MinibatchConfig::truncation_length`]): the rows and columns of the
    /// minibatch, and where each of its sequences — then a fragment of a data sequence, whose key it has
    /// and whose `num_samples` entry is the fragment's length — lies. `None` otherwise.
    pub bptt: Option<BpttLayout>,
}

impl Batch {
    /// An empty batch for these streams.
    pub fn new(streams: &[StreamSpec]) -> Batch {
        Batch {
            data: ChunkData {
                // Lists from the start: a batch's keys and lengths are handed out as arrays.
                keys: Keys::new().listed(),
                num_samples: Lengths::new().listed(),
                streams: streams.iter().map(|s| StreamData::new(s.format, s.dim, s.element_type)).collect(),
            },
            end_of_sweep: false,
            end_of_run: false,
            bptt: None,
        }
    }
    /// Number of sequences.
    pub fn num_sequences(&self) -> usize {
        self.data.num_sequences()
    }
    /// Σ of the declared lengths (what the minibatch size counts).
    pub fn num_declared_samples(&self) -> u64 {
        self.data.num_samples.iter().map(u64::from).sum()
    }
}

/// A minibatch planned by [`MinibatchSource::next_planned`]: its sequences chosen, their chunks loaded and
/// held, the packer's checks made; [`assemble_into`](Self::assemble_into) copies the sequences into a batch.
/// Planning is sequential (it is the source's order); assembling plans is independent, so several can be
/// assembled at once on other threads.
#[derive(Debug)]
pub struct PlannedBatch(pub(super) Planned);

#[derive(Debug)]
pub(super) enum Planned {
    /// The run is over (no sequence).
    Empty { end_of_sweep: bool, end_of_run: bool },
    /// Sequences to copy.
    Copy(Plan),
    /// Assembled already (truncated BPTT), and whether it is a minibatch (false: the run is over).
    Ready(Box<Batch>, bool),
}

/// The sizes of an assembled minibatch ([`PlannedBatch::sizes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BatchSizes {
    /// Sequences.
    pub sequences: usize,
    /// Σ of their declared lengths.
    pub declared: usize,
    /// Per stream: entries of `values` (and of `indices` when sparse), and samples.
    pub streams: Vec<(usize, usize)>,
}

impl BatchSizes {
    /// The sizes of `self`'s minibatch followed by `other`'s in one batch.
    pub(crate) fn add(&mut self, other: &BatchSizes) {
        self.sequences += other.sequences;
        self.declared += other.declared;
        if self.streams.len() < other.streams.len() {
            self.streams.resize(other.streams.len(), (0, 0));
        }
        for (a, b) in self.streams.iter_mut().zip(&other.streams) {
            a.0 += b.0;
            a.1 += b.1;
        }
    }
}

/// The sequences of a minibatch and the chunks holding them.
pub(super) struct Plan {
    pub(super) picks: Vec<Pick>,
    /// `slots[i]`: the index in `chunks` of the chunk of `picks[i]`.
    pub(super) slots: Vec<u32>,
    pub(super) chunks: Vec<Arc<SourceChunk>>,
    pub(super) end_of_sweep: bool,
    pub(super) end_of_run: bool,
}

impl Plan {
    /// Appends the sequences to `batch` and sets its flags.
    fn append_to(&self, batch: &mut Batch) {
        batch.end_of_sweep = self.end_of_sweep;
        batch.end_of_run = self.end_of_run;
        batch.data.keys.extend(self.picks.iter().map(|q| q.key));
        batch.data.num_samples.extend(self.picks.iter().map(|q| q.num_samples));
        let views: Vec<chunk::ChunkView<'_>> = self.chunks.iter().map(|c| c.view()).collect();
        fill(&self.picks, &views, &self.slots, &mut batch.data.streams);
    }
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("sequences", &self.picks.len())
            .field("chunks", &self.chunks.len())
            .field("end_of_sweep", &self.end_of_sweep)
            .field("end_of_run", &self.end_of_run)
            .finish()
    }
}

impl PlannedBatch {
    /// Whether the run is over: this plan holds no minibatch (assembling it empties the batch).
    pub fn is_end(&self) -> bool {
        match &self.0 {
            Planned::Empty { .. } => true,
            Planned::Copy(_) => false,
            Planned::Ready(_, more) => !more,
        }
    }

    /// Whether the minibatch was assembled when it was planned (truncated BPTT): assembling it moves its
    /// buffers into the batch instead of copying into the batch's own.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self.0, Planned::Ready(..))
    }

    /// The sizes of the minibatch's vectors once assembled: per stream the values (entries: samples × dim
    /// when dense, non-zeros when sparse) and samples, and the number of sequences.
    pub(crate) fn sizes(&self) -> BatchSizes {
        match &self.0 {
            Planned::Empty { .. } => BatchSizes::default(),
            Planned::Ready(b, _) => BatchSizes {
                sequences: b.num_sequences(),
                declared: b.data.num_samples.iter().map(|n| n as usize).sum(),
                streams: b.data.streams.iter().map(|s| (s.values.len(), s.num_samples() as usize)).collect(),
            },
            Planned::Copy(p) => {
                let views: Vec<chunk::ChunkView<'_>> = p.chunks.iter().map(|c| c.view()).collect();
                let streams = views.first().map_or(0, |v| v.num_streams());
                let mut sizes = vec![(0usize, 0usize); streams];
                for (q, &slot) in p.picks.iter().zip(&p.slots) {
                    let v = views[slot as usize];
                    for (st, (entries, samples)) in sizes.iter_mut().enumerate() {
                        *entries += v.sequence_entries(st, q.index as usize) as usize;
                        *samples += v.sequence_len(st, q.index as usize) as usize;
                    }
                }
                let declared = p.picks.iter().map(|q| q.num_samples as usize).sum();
                BatchSizes { sequences: p.picks.len(), declared, streams: sizes }
            }
        }
    }

    /// Copies the minibatch into `batch` (emptied first, its allocations reused; `streams` are the
    /// source's [`streams`](MinibatchSource::streams)). Returns false, with `batch` empty, when the run is
    /// over.
    pub fn assemble_into(self, streams: &[StreamSpec], batch: &mut Batch) -> bool {
        match self.0 {
            Planned::Empty { end_of_sweep, end_of_run } => {
                prepare(batch, streams);
                batch.bptt = None;
                batch.end_of_sweep = end_of_sweep;
                batch.end_of_run = end_of_run;
                false
            }
            Planned::Ready(b, more) => {
                *batch = *b;
                more
            }
            Planned::Copy(p) => {
                prepare(batch, streams);
                batch.bptt = None;
                p.append_to(batch);
                true
            }
        }
    }

    /// Appends the minibatch's sequences to `batch` (of the source's streams), after those it holds: several
    /// minibatches in one batch, one after another (their flags are those of the last). Returns false
    /// without appending anything when the run is over. A minibatch of truncated BPTT (assembled already,
    /// [`is_ready`](Self::is_ready)) cannot be appended: it replaces the batch's content when `batch` is
    /// empty and is refused (false) otherwise.
    pub(crate) fn append_to(self, streams: &[StreamSpec], batch: &mut Batch) -> bool {
        match self.0 {
            Planned::Empty { .. } => false,
            Planned::Ready(..) if batch.num_sequences() > 0 => false,
            Planned::Ready(..) => self.assemble_into(streams, batch),
            Planned::Copy(p) => {
                p.append_to(batch);
                true
            }
        }
    }
}

/// How many sequences ahead of the one being copied are asked into the cache.
const PREFETCH_SEQUENCES: usize = 8;

/// Appends the sequences of `picks` to `dst` (one entry per stream), stream by stream, asking for the
/// sequences a few places ahead while copying (they lie at random places of the chunks).
/// `slots[i]`: the index in `views` of the chunk of `picks[i]`.
pub(super) fn fill(picks: &[Pick], views: &[chunk::ChunkView<'_>], slots: &[u32], dst: &mut [StreamData]) {
    let view = |i: usize| views[slots[i] as usize];
    // Dense values: room for the declared samples at once (a fresh batch would otherwise grow, and copy,
    // several times). A hint, capped at 4 Mi values (declared lengths come from the file): a stream longer
    // than that still grows as needed.
    let declared: usize = picks.iter().map(|p| p.num_samples as usize).sum();
    for d in dst.iter_mut().filter(|d| matches!(d.layout, Layout::Dense)) {
        let want = dense_reserve(declared, d.dim);
        match &mut d.values {
            Values::F32(v) => v.reserve(want.saturating_sub(v.len())),
            Values::F64(v) => v.reserve(want.saturating_sub(v.len())),
        }
    }
    let mut gathered = Vec::new();
    for (st, d) in dst.iter_mut().enumerate() {
        if gather_dense(picks, &view, st, d, &mut gathered) {
            continue;
        }
        // Two stages: the tables that locate a sequence twice as far ahead, its values once as far ahead.
        for (i, p) in picks.iter().enumerate().take(2 * PREFETCH_SEQUENCES) {
            view(i).prefetch_locator(st, p.index as usize);
        }
        for (i, p) in picks.iter().enumerate().take(PREFETCH_SEQUENCES) {
            view(i).prefetch(st, p.index as usize);
        }
        for (i, p) in picks.iter().enumerate() {
            if let Some(q) = picks.get(i + 2 * PREFETCH_SEQUENCES) {
                view(i + 2 * PREFETCH_SEQUENCES).prefetch_locator(st, q.index as usize);
            }
            if let Some(q) = picks.get(i + PREFETCH_SEQUENCES) {
                view(i + PREFETCH_SEQUENCES).prefetch(st, q.index as usize);
            }
            view(i).append(st, p.index as usize, d);
        }
    }
}

/// The room [`fill`] asks for in a dense stream's values before copying: `declared` samples of `dim`
/// values, at most 4 Mi values (a hint: declared lengths come from the file).
pub(crate) fn dense_reserve(declared: usize, dim: usize) -> usize {
    declared.saturating_mul(dim).min(1 << 22)
}

/// How many sequences ahead of the one being copied are asked into the cache by [`gather_dense`].
const GATHER_AHEAD: usize = 8;

/// Appends the values of dense stream `st` of the sequences of `picks` to `d` when every one of them is
/// located without reading a CBF chunk ([`ChunkView::dense_values`](chunk::ChunkView::dense_values));
/// returns false, with `d` unchanged, if some is not. First where each sequence lies (parsed data: reading
/// its sequence offsets, asked for a few places ahead), then the copies, asking for the sequences' values a
/// few places ahead: with nothing but the copy and the hint in the loop, more of the misses are in flight
/// at once.
fn gather_dense<'a>(
    picks: &[Pick],
    view: &impl Fn(usize) -> chunk::ChunkView<'a>,
    st: usize,
    d: &mut StreamData,
    gathered: &mut Vec<(chunk::DenseValues<'a>, u32)>,
) -> bool {
    if !matches!(d.layout, Layout::Dense) {
        return false;
    }
    gathered.clear();
    for (i, p) in picks.iter().enumerate().take(GATHER_AHEAD) {
        view(i).prefetch_locator(st, p.index as usize);
    }
    for (i, p) in picks.iter().enumerate() {
        if let Some(q) = picks.get(i + GATHER_AHEAD) {
            view(i + GATHER_AHEAD).prefetch_locator(st, q.index as usize);
        }
        match view(i).dense_values(st, p.index as usize) {
            Some(g) => gathered.push(g),
            None => return false,
        }
    }
    for (v, _) in gathered.iter().take(GATHER_AHEAD) {
        v.prefetch();
    }
    let mut last = *d.sequence_offsets.last().expect("starts with 0");
    for (i, &(v, n)) in gathered.iter().enumerate() {
        if let Some((q, _)) = gathered.get(i + GATHER_AHEAD) {
            q.prefetch();
        }
        v.append_to(&mut d.values);
        last += u64::from(n);
        d.sequence_offsets.push(last);
    }
    true
}

/// Makes `batch` empty with the streams' layout, keeping allocations.
pub(super) fn prepare(batch: &mut Batch, streams: &[StreamSpec]) {
    let same = batch.data.streams.len() == streams.len()
        && batch
            .data
            .streams
            .iter()
            .zip(streams)
            .all(|(d, s)| d.format() == s.format && d.dim == s.dim && d.values.element_type() == s.element_type);
    if same {
        batch.data.clear();
    } else {
        *batch = Batch::new(streams);
    }
    batch.end_of_sweep = false;
    batch.end_of_run = false;
}

/// Appends sequence `i` of `src` to `dst` (same storage format).
pub(crate) fn append_sequence(dst: &mut StreamData, src: &StreamData, i: usize) {
    let samples = src.sequence_samples(i);
    let n = samples.end - samples.start;
    match (&mut dst.layout, &src.layout) {
        (Layout::Dense, Layout::Dense) => {
            let dim = src.dim;
            dst.values.extend_from(&src.values, samples.start as usize * dim..samples.end as usize * dim);
        }
        (Layout::Sparse { indices, sample_offsets }, Layout::Sparse { indices: si, sample_offsets: so }) => {
            let a = so[samples.start as usize] as usize;
            let b = so[samples.end as usize] as usize;
            dst.values.extend_from(&src.values, a..b);
            indices.extend_from_slice(&si[a..b]);
            let base = *sample_offsets.last().expect("starts with 0");
            sample_offsets
                .extend(so[samples.start as usize + 1..=samples.end as usize].iter().map(|&o| o - a as u64 + base));
        }
        _ => unreachable!("a deserializer's chunks have its streams' storage formats"),
    }
    let last = *dst.sequence_offsets.last().expect("starts with 0");
    dst.sequence_offsets.push(last + n);
}
