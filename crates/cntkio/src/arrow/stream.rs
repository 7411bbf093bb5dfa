//! A deserializer's chunks as Arrow record batches in the mapping, one batch per chunk: for front ends that
//! hand CNTK data to Arrow consumers (the Arrow C stream interface, Ray Data's blocks).

use super::{build, Mapping, Rows};
use crate::source::Deserializer;
use crate::{Error, Schema};
use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;

/// Chunks `chunks` of a deserializer, each as one record batch of [`ChunkBatches::schema`] (chunk data
/// moved into the arrays, not copied). As an iterator (and a [`RecordBatchReader`]) it loads one chunk
/// per batch, in ascending order, so memory holds the batch being consumed; [`ChunkBatches::read_all`]
/// loads them all, in parallel where the order of loading cannot change them.
pub struct ChunkBatches {
    source: Arc<dyn Deserializer>,
    mapping: Mapping,
    schema: SchemaRef,
    chunks: Range<u32>,
}

impl std::fmt::Debug for ChunkBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkBatches").field("mapping", &self.mapping).field("chunks", &self.chunks).finish()
    }
}

impl ChunkBatches {
    /// Chunks `chunks` (`None`: all) of `source`, with `rows` per row. Errors:
    /// [`ErrorKind::ChunkOutOfRange`](crate::ErrorKind::ChunkOutOfRange) for a range that is not within
    /// the source's chunks (an empty range at most at their end), and those of [`Mapping::new`].
    pub fn new(source: Arc<dyn Deserializer>, chunks: Option<Range<u32>>, rows: Rows) -> Result<ChunkBatches, Error> {
        let n = source.chunks().len();
        let all = 0..u32::try_from(n).map_err(|_| Error::limit("chunks of one source", n as u64, u32::MAX.into()))?;
        let chunks = chunks.unwrap_or(all.clone());
        if chunks.start > chunks.end || chunks.end > all.end {
            let bad = if chunks.start > all.end { chunks.start } else { chunks.end.max(chunks.start) };
            return Err(Error::chunk_out_of_range(bad.into(), n));
        }
        let mapping = Mapping::new(&Schema::new(source.streams().to_vec())?, rows)?;
        let schema = mapping.arrow_schema()?;
        Ok(ChunkBatches { source, mapping, schema, chunks })
    }

    /// The Arrow schema of the batches (the mapping's, metadata included).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The mapping of the source's streams.
    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The chunks not yet read by the iterator.
    pub fn chunks(&self) -> Range<u32> {
        self.chunks.clone()
    }

    /// Chunk `chunk` of the source as a record batch (the chunk's data is moved into it when the source
    /// does not keep it; otherwise copied once).
    pub fn read(&self, chunk: u32) -> Result<RecordBatch, Error> {
        let data = self.source.load_chunk(chunk)?;
        let data = Arc::try_unwrap(data).unwrap_or_else(|shared| (*shared).clone());
        build::record_batch(data, &self.mapping, &self.schema)
    }

    /// Every remaining chunk, in order: loaded in parallel (rayon's current pool) unless the source's
    /// order of loading matters (a CTF reader's `maxErrors` budget), then one after another.
    pub fn read_all(self) -> Result<Vec<RecordBatch>, Error> {
        if self.source.load_order_matters() {
            return self.chunks.clone().map(|c| self.read(c)).collect();
        }
        self.chunks.clone().into_par_iter().map(|c| self.read(c)).collect()
    }
}

impl Iterator for ChunkBatches {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let c = self.chunks.next()?;
        Some(self.read(c).map_err(|e| {
            // A failed stream ends: consumers see the error once, not one per remaining chunk.
            self.chunks = self.chunks.end..self.chunks.end;
            ArrowError::ExternalError(Box::new(e))
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

impl RecordBatchReader for ChunkBatches {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CtfOptions, CtfReader, StorageFormat, StreamSpec};

    fn reader(dir: &std::path::Path) -> Arc<dyn Deserializer> {
        let path = dir.join("a.ctf");
        let mut text = String::new();
        for i in 0..40 {
            text.push_str(&format!("{i} |x {i} {} |y {}:1\n{i} |x 0 1\n", i + 1, i % 5));
        }
        std::fs::write(&path, text).unwrap();
        let schema = Schema::new(vec![
            StreamSpec::new("x", 2, StorageFormat::Dense),
            StreamSpec::new("y", 5, StorageFormat::Sparse),
        ])
        .unwrap();
        let options = CtfOptions { chunk_size: 64, ..CtfOptions::default() };
        Arc::new(CtfReader::open(&path, &schema, &options).unwrap())
    }

    #[test]
    fn batches_are_the_chunks_in_order_and_read_all_equals_the_iterator() {
        let dir = tempfile::tempdir().unwrap();
        let source = reader(dir.path());
        let n = source.chunks().len() as u32;
        assert!(n > 3, "the test needs several chunks, got {n}");
        let it = ChunkBatches::new(Arc::clone(&source), None, Rows::Sequences).unwrap();
        let streamed: Vec<RecordBatch> = it.collect::<Result<_, _>>().unwrap();
        assert_eq!(streamed.len(), n as usize);
        let rows: usize = streamed.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 40);
        for (c, b) in streamed.iter().enumerate() {
            let back = super::super::from_record_batch(
                b,
                &Mapping::new(&Schema::new(source.streams().to_vec()).unwrap(), Rows::Sequences).unwrap(),
            )
            .unwrap();
            assert_eq!(back, *source.load_chunk(c as u32).unwrap());
        }
        let all = ChunkBatches::new(Arc::clone(&source), Some(1..3), Rows::Sequences).unwrap().read_all().unwrap();
        assert_eq!(all, streamed[1..3].to_vec());
    }

    #[test]
    fn a_range_outside_the_chunks_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let source = reader(dir.path());
        let n = source.chunks().len() as u32;
        assert!(ChunkBatches::new(Arc::clone(&source), Some(n..n), Rows::Sequences).is_ok());
        for bad in [0..n + 1, n + 1..n + 2] {
            let e = ChunkBatches::new(Arc::clone(&source), Some(bad.clone()), Rows::Sequences).unwrap_err();
            assert_eq!(e.code(), "E1008", "{bad:?}: {e}");
        }
    }

    #[test]
    fn flattening_sequences_of_two_samples_fails_in_the_stream_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut it = ChunkBatches::new(reader(dir.path()), None, Rows::Samples).unwrap();
        assert!(matches!(it.next(), Some(Err(ArrowError::ExternalError(_)))));
        assert!(it.next().is_none());
    }
}
