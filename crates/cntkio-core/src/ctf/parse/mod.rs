//! The CTF parser (CTF.md §4–§7): the bytes of whole sequences → columnar [`ChunkData`].
//!
//! Recoverable problems go to an [`ErrorSink`], which decides whether to go on (that is how `maxErrors`
//! works); fatal ones (a stream empty in a sequence) are returned. Positions are absolute byte offsets.
//!
//! `parser` walks sequences, rows and stream names and hands each sample to `dense` or `sparse`, which
//! report through `outcome`; `masks` classifies 64-byte windows for the dense fast path; `sink` holds the
//! error sinks.

mod dense;
mod masks;
mod outcome;
mod parser;
mod sink;
mod sparse;
#[cfg(test)]
mod tests;

pub use parser::{vector_paths, CtfParser};
pub use sink::{Collect, ErrorSink, FailFast};

use crate::data::{ChunkData, Layout, StreamData};
use crate::error::Error;
use crate::schema::Schema;

/// Parses a whole in-memory file with a schema (tests and small inputs): index, then every chunk.
pub fn parse_bytes(
    data: &[u8],
    schema: &Schema,
    skip_sequence_ids: bool,
    sink: &mut dyn ErrorSink,
) -> Result<ChunkData, Error> {
    let main = schema.main_stream().map(|i| schema.streams()[i].alias.as_str());
    let chunks = super::index::index_bytes(data, skip_sequence_ids, main, u64::MAX)?;
    let parser = CtfParser::new(schema);
    let mut out = ChunkData::new(schema);
    for c in &chunks {
        parser.parse_sequences(data, 0, &c.sequences, &mut out, sink)?;
    }
    Ok(out)
}

/// Collects one sequence's samples of stream `i` as `(index, value)` lists (sparse) or value lists
/// (dense, as `(position, value)`), widened to f64. For tests and dumps.
pub fn sequence_samples(d: &StreamData, seq: usize) -> Vec<Vec<(usize, f64)>> {
    d.sequence_samples(seq)
        .map(|k| {
            let r = d.sample_value_range(k);
            match &d.layout {
                Layout::Dense => r.clone().enumerate().map(|(j, x)| (j, d.values.get_f64(x))).collect(),
                Layout::Sparse { indices, .. } => r.map(|x| (indices[x] as usize, d.values.get_f64(x))).collect(),
            }
        })
        .collect()
}
