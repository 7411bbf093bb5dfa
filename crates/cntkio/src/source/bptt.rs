//! Truncated back-propagation through time (CNTK's `TruncatedBPTTPacker`, READER.md §5.3).
//!
//! A worker packs `P` parallel rows (`P = max(1, ⌊M / τ⌋)` for minibatch size `M` and truncation length
//! `τ`, dealt to `W` workers as `P div W`, plus one for ranks below `P mod W`). Each row is a queue of
//! whole sequences. Before every minibatch each row, in order, is refilled while it holds at most `τ`
//! samples not yet delivered, one local sequence per request (global limit ∞, local limit 1), stopping at
//! the end of the run. Each row then delivers its next `min(τ, held)` samples: the rest of a sequence
//! started in an earlier minibatch, then the following sequences of the queue. A minibatch reaches the end
//! of a sweep when a sequence fetched by a request that reached it ends in the minibatch; the run ends
//! when every row is empty. Changing the minibatch size empties the rows, as CNTK does.

use super::chunk::ChunkView;
use crate::randomize::Pick;
use crate::{Error, ErrorKind, Layout, StorageFormat, StreamData, StreamSpec, Values};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Where the sequences of a truncated-BPTT minibatch lie: each sequence of the [`Batch`](super::Batch) is a
/// fragment of a data sequence, placed in a row at a column.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct BpttLayout {
    /// Parallel rows of this worker.
    pub rows: u32,
    /// Columns (time steps) of the minibatch: the truncation length.
    pub columns: u64,
    /// One per sequence of the batch, in the same order (row by row, left to right).
    pub fragments: Vec<Fragment>,
}

/// One fragment of a truncated-BPTT minibatch (CNTK's `MBLayout` entry: the sequence spans columns
/// `column − offset .. column − offset + sequence_len` of its row, clipped to the minibatch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fragment {
    /// The row.
    pub row: u32,
    /// The column of the fragment's first sample.
    pub column: u64,
    /// Samples of its sequence delivered in earlier minibatches (> 0: the sequence started before).
    pub offset: u64,
    /// The whole sequence's length in samples (the fragment ends it iff `offset + its length` equals it).
    pub sequence_len: u64,
}

/// A sequence held in a row, for checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HeldSequence {
    /// Its chunk (an index into the deserializer's chunks).
    pub chunk: u32,
    /// Its index in the chunk.
    pub index: u32,
    /// Its key.
    pub key: u64,
    /// Its declared length.
    pub samples: u32,
    /// It was fetched by a request that reached the end of a sweep.
    pub sweep_end: bool,
}

/// A row, for checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RowState {
    /// Samples of the first sequence already delivered.
    pub cursor: u64,
    /// The sequences, first to last.
    pub sequences: Vec<HeldSequence>,
}

/// The rows of a truncated-BPTT source, for checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BpttState {
    /// The minibatch size the rows were made for.
    pub mb_size: u64,
    /// The rows.
    pub rows: Vec<RowState>,
}

/// A sequence in a row: its locator and its samples (every stream dense).
#[derive(Debug, Clone)]
struct Held {
    pick: Pick,
    len: u64,
    sweep_end: bool,
    data: Vec<Values>,
}

#[derive(Debug, Clone, Default)]
struct Row {
    queue: VecDeque<Held>,
    /// Samples of the front sequence already delivered.
    cursor: u64,
}

impl Row {
    fn available(&self) -> u64 {
        self.queue.iter().map(|h| h.len).sum::<u64>() - self.cursor
    }
}

/// The packer's rows.
#[derive(Debug, Default)]
pub(crate) struct Packer {
    mb_size: Option<u64>,
    rows: Vec<Row>,
    /// Scratch: a sequence in the source's storage formats.
    scratch: Vec<StreamData>,
}

/// The error CNTK gives for more workers than rows.
pub(crate) const TOO_MANY_WORKERS: &str =
    "Too many workers for minibatch size; please increase minibatch size or decrease number of workers.";

impl Packer {
    /// Makes the rows for minibatch size `size` (emptying them if it changed).
    pub(crate) fn configure(&mut self, size: u64, tau: u64, workers: u32, rank: u32) -> Result<(), Error> {
        if self.mb_size == Some(size) {
            return Ok(());
        }
        let p = (size / tau).max(1);
        let w = u64::from(workers);
        if w > p {
            return Err(Error::option("workers", TOO_MANY_WORKERS));
        }
        let local = p / w + u64::from(u64::from(rank) < p % w);
        self.rows = vec![Row::default(); local as usize];
        self.mb_size = Some(size);
        Ok(())
    }

    /// Number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Whether row `r` needs another sequence (it holds at most `tau` undelivered samples).
    pub(crate) fn wants(&self, r: usize, tau: u64) -> bool {
        self.rows[r].available() <= tau
    }

    /// Whether every row is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.iter().all(|r| r.queue.is_empty())
    }

    /// Appends the sequence `pick` (its data in `view`) to row `r`. Errors: streams of different lengths,
    /// or an empty one.
    pub(crate) fn push(
        &mut self,
        r: usize,
        pick: Pick,
        view: ChunkView<'_>,
        streams: &[StreamSpec],
        sweep_end: bool,
    ) -> Result<(), Error> {
        let held = self.hold(pick, view, streams, sweep_end)?;
        self.rows[r].queue.push_back(held);
        Ok(())
    }

    fn hold(
        &mut self,
        pick: Pick,
        view: ChunkView<'_>,
        streams: &[StreamSpec],
        sweep_end: bool,
    ) -> Result<Held, Error> {
        let i = pick.index as usize;
        let len = view.sequence_len(0, i);
        for (st, spec) in streams.iter().enumerate() {
            let n = view.sequence_len(st, i);
            if n != len {
                let (stream, samples, expected) = (spec.name.clone(), n, len);
                return Err(Error::new(ErrorKind::UnequalStreamLengths {
                    sequence: pick.key,
                    stream,
                    samples,
                    expected,
                })
                .with_sequence(pick.key));
            }
            if n == 0 {
                return Err(Error::new(ErrorKind::EmptySequenceStream {
                    sequence: pick.key,
                    stream: spec.name.clone(),
                })
                .with_sequence(pick.key));
            }
        }
        check_dense(|| format!("sequence {}", pick.key), len, streams).map_err(|e| e.with_sequence(pick.key))?;
        if self.scratch.len() != streams.len() {
            self.scratch = streams.iter().map(|s| StreamData::new(s.format, s.dim, s.element_type)).collect();
        }
        let mut data = Vec::with_capacity(streams.len());
        for (st, s) in self.scratch.iter_mut().enumerate() {
            s.clear();
            view.append(st, i, s);
            data.push(densify(s));
        }
        Ok(Held { pick, len, sweep_end, data })
    }

    /// Delivers the next minibatch into `out` (dense streams, prepared empty) and `layout`; returns whether
    /// it reaches the end of a sweep.
    pub(crate) fn pack(&mut self, tau: u64, out: &mut super::Batch, layout: &mut BpttLayout) -> bool {
        layout.rows = self.rows.len() as u32;
        layout.columns = tau;
        layout.fragments.clear();
        let mut sweep_end = false;
        for (r, row) in self.rows.iter_mut().enumerate() {
            let mut column = 0u64;
            let n = tau.min(row.available());
            while column < n {
                let front = row.queue.front().expect("samples are available");
                let take = (front.len - row.cursor).min(n - column);
                layout.fragments.push(Fragment { row: r as u32, column, offset: row.cursor, sequence_len: front.len });
                out.data.keys.push(front.pick.key);
                out.data.num_samples.push(take as u32);
                for (dst, src) in out.data.streams.iter_mut().zip(&front.data) {
                    let dim = dst.dim;
                    dst.values.extend_from(src, row.cursor as usize * dim..(row.cursor + take) as usize * dim);
                    let last = *dst.sequence_offsets.last().expect("starts with 0");
                    dst.sequence_offsets.push(last + take);
                }
                column += take;
                row.cursor += take;
                if row.cursor == front.len {
                    sweep_end |= front.sweep_end;
                    row.queue.pop_front();
                    row.cursor = 0;
                }
            }
        }
        sweep_end
    }

    /// The rows, for a checkpoint (`None` before the first minibatch).
    pub(crate) fn state(&self) -> Option<BpttState> {
        let mb_size = self.mb_size?;
        Some(BpttState {
            mb_size,
            rows: self
                .rows
                .iter()
                .map(|r| RowState {
                    cursor: r.cursor,
                    sequences: r
                        .queue
                        .iter()
                        .map(|h| HeldSequence {
                            chunk: h.pick.chunk,
                            index: h.pick.index,
                            key: h.pick.key,
                            samples: h.pick.num_samples,
                            sweep_end: h.sweep_end,
                        })
                        .collect(),
                })
                .collect(),
        })
    }

    /// Empties the rows (the next minibatch makes them anew).
    pub(crate) fn reset(&mut self) {
        self.mb_size = None;
        self.rows.clear();
    }

    /// Restores rows from a checkpoint: `load(chunk)` gives a chunk's view.
    pub(crate) fn restore<'a>(
        &mut self,
        state: &BpttState,
        streams: &[StreamSpec],
        mut view_of: impl FnMut(u32) -> Result<ChunkView<'a>, Error>,
    ) -> Result<(), Error> {
        let mut rows = Vec::with_capacity(state.rows.len());
        for rs in &state.rows {
            let mut row = Row { queue: VecDeque::new(), cursor: rs.cursor };
            for h in &rs.sequences {
                let pick = Pick { chunk: h.chunk, index: h.index, num_samples: h.samples, key: h.key };
                let view = view_of(h.chunk)?;
                if h.index as usize >= view.num_sequences() {
                    return Err(Error::state(format!(
                        "the state names sequence {} of chunk {}, which does not exist",
                        h.index, h.chunk
                    )));
                }
                row.queue.push_back(self.hold(pick, view, streams, h.sweep_end)?);
            }
            if row.queue.front().is_some_and(|f| f.len <= row.cursor) || (row.queue.is_empty() && row.cursor > 0) {
                return Err(Error::state("the state's row cursor lies outside its first sequence"));
            }
            rows.push(row);
        }
        self.rows = rows;
        self.mb_size = Some(state.mb_size);
        Ok(())
    }
}

/// A stream's samples as dense values (sparse entries placed at their indices, a later duplicate index
/// overwriting an earlier one, as CNTK's `PackSparseSampleAsDense` does).
fn densify(s: &StreamData) -> Values {
    match &s.layout {
        Layout::Dense => s.values.clone(),
        Layout::Sparse { indices, sample_offsets } => {
            let samples = sample_offsets.len() - 1;
            let mut v = Values::new(s.values.element_type());
            v.push_zeros(samples * s.dim);
            for k in 0..samples {
                for e in sample_offsets[k] as usize..sample_offsets[k + 1] as usize {
                    let at = k * s.dim + indices[e] as usize;
                    match (&mut v, &s.values) {
                        (Values::F32(d), Values::F32(x)) => d[at] = x[e],
                        (Values::F64(d), Values::F64(x)) => d[at] = x[e],
                        (d, x) => {
                            let t = x.get_f64(e);
                            match d {
                                Values::F32(d) => d[at] = t as f32,
                                Values::F64(d) => d[at] = t,
                            }
                        }
                    }
                }
            }
            v
        }
    }
}

/// The most values, all streams together, that a truncated-BPTT minibatch or one sequence held for it may
/// take once dense (2^30: 4 GiB of float32). BPTT delivers every stream dense, and a sparse stream's
/// dimension (a number in the file) times its samples could otherwise ask for any amount of memory.
pub(crate) const MAX_DENSE_VALUES: u64 = 1 << 30;

/// Errors when `samples` samples of `streams`, dense, would take more than [`MAX_DENSE_VALUES`] values;
/// `what` names them ("a minibatch of …").
pub(crate) fn check_dense(what: impl FnOnce() -> String, samples: u64, streams: &[StreamSpec]) -> Result<(), Error> {
    let per_sample = streams.iter().map(|s| s.dim as u64).fold(0u64, u64::saturating_add);
    let values = samples.saturating_mul(per_sample);
    if values > MAX_DENSE_VALUES {
        let what = format!(
            "truncated BPTT delivers every stream dense: {} of {samples} samples × {per_sample} values a sample",
            what()
        );
        return Err(Error::limit(what, values, MAX_DENSE_VALUES));
    }
    Ok(())
}

/// The streams of a truncated-BPTT minibatch: every stream dense.
pub(crate) fn dense_streams(streams: &[StreamSpec]) -> Vec<StreamSpec> {
    streams.iter().map(|s| StreamSpec { format: StorageFormat::Dense, ..s.clone() }).collect()
}
