//! Which of a CBF file's sequences CNTK delivers, read in file order (CBF.md §3, zero meta counts).

use super::CbfFile;
use crate::{ChunkData, Error, ErrorKind};

/// CNTK's delivery of a CBF file's sequences in file order: a sweep ends once the samples delivered, counted
/// by the sequences' meta counts, reach the chunk table's total, so sequences of meta count 0 after the last
/// counted sample are never delivered; a delivered sequence with an empty record (no sample in some
/// stream) stops the reading with [`ErrorKind::EmptySequenceStream`], as CNTK's packer does.
#[derive(Debug, Clone)]
pub struct Delivery {
    total: u64,
    delivered: u64,
    streams: Vec<String>,
}

impl Delivery {
    /// The delivery of `file`'s sequences (one sweep).
    pub fn new(file: &CbfFile) -> Delivery {
        Delivery {
            total: file.chunks().iter().map(|c| u64::from(c.num_samples)).sum(),
            delivered: 0,
            streams: file.streams().iter().map(|s| s.name.clone()).collect(),
        }
    }

    /// Whether the sweep is over: nothing after this is delivered.
    pub fn is_done(&self) -> bool {
        self.delivered >= self.total
    }

    /// How many of `data`'s first sequences (the next chunk's, in order) are delivered, and the error of the
    /// sequence after them when it is one CNTK fails on.
    pub fn take(&mut self, data: &ChunkData) -> (usize, Option<Error>) {
        for s in 0..data.num_sequences() {
            if self.is_done() {
                return (s, None);
            }
            let empty = data.streams.iter().position(|d| d.sequence_samples(s).is_empty());
            if let Some(i) = empty {
                let key = data.keys.get(s);
                let stream = self.streams.get(i).cloned().unwrap_or_default();
                return (
                    s,
                    Some(Error::new(ErrorKind::EmptySequenceStream { sequence: key, stream }).with_sequence(key)),
                );
            }
            self.delivered += u64::from(data.num_samples.get(s));
        }
        (data.num_sequences(), None)
    }
}
