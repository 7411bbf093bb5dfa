//! The deserializer interface (READER.md §1): chunks of sequences with declared lengths and keys, and
//! parsed chunk data on demand. Implemented by [`CtfReader`], by [`CbfSource`] (a [`CbfFile`] with its
//! per-sequence meta counts) and by [`MultiSource`] (shards of the same streams, one after another).

use crate::cbf::{CbfFile, CbfOptions};
use crate::randomize::{ChunkInfo, SequenceInfo, SequenceSource};
use crate::{ChunkData, CtfReader, Error, StreamSpec};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

/// A source of chunks of sequences, as CNTK's deserializers are.
///
/// The chunk and sequence structure ([`SequenceSource::chunks`], [`SequenceSource::sequences`]) is what the
/// randomizers walk; [`load_chunk`](Deserializer::load_chunk) parses a chunk into columnar data whose
/// sequence `i` is sequence `i` of the chunk's sequence list, with one stream per entry of
/// [`streams`](Deserializer::streams), in that order.
pub trait Deserializer: SequenceSource + Send + Sync {
    /// The streams, in the order of [`ChunkData::streams`].
    fn streams(&self) -> &[StreamSpec];
    /// Loads and parses chunk `chunk` (an index into [`SequenceSource::chunks`]).
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error>;
}

impl Deserializer for CtfReader {
    fn streams(&self) -> &[StreamSpec] {
        self.schema().streams()
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        CtfReader::load_chunk(self, chunk as usize)
    }
}

impl<T: Deserializer + ?Sized> Deserializer for Arc<T> {
    fn streams(&self) -> &[StreamSpec] {
        (**self).streams()
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        (**self).load_chunk(chunk)
    }
}

impl<T: Deserializer + ?Sized> Deserializer for Box<T> {
    fn streams(&self) -> &[StreamSpec] {
        (**self).streams()
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        (**self).load_chunk(chunk)
    }
}

/// A CBF file as a deserializer: chunks as in the file, sequence keys = global sequence indices, declared
/// lengths = the file's per-sequence meta counts (CBF.md §2, READER.md §1).
///
/// The meta counts of every chunk are read when the source is opened (4 bytes per sequence); a chunk's
/// sample count is the chunk table's, as CNTK's randomizer uses it.
#[derive(Debug)]
pub struct CbfSource {
    file: CbfFile,
    chunks: Vec<ChunkInfo>,
    /// `meta[meta_offsets[c]..meta_offsets[c+1]]` are chunk `c`'s meta counts.
    meta: Vec<u32>,
    meta_offsets: Vec<usize>,
    streams: Vec<StreamSpec>,
}

impl CbfSource {
    /// Opens `path` with default [`CbfOptions`].
    pub fn open(path: impl AsRef<Path>) -> Result<CbfSource, Error> {
        CbfSource::new(CbfFile::open(path)?)
    }

    /// Opens `path` with `options`.
    pub fn open_with(path: impl AsRef<Path>, options: &CbfOptions) -> Result<CbfSource, Error> {
        CbfSource::new(CbfFile::open_with(path, options)?)
    }

    /// Wraps an open file, reading its meta counts.
    pub fn new(file: CbfFile) -> Result<CbfSource, Error> {
        let p = file.path().display().to_string();
        let io = |e: std::io::Error| Error::io(format!("read meta counts of {p}"), e).with_path(p.clone());
        let mut f = std::fs::File::open(file.path()).map_err(io)?;
        let mut meta = Vec::with_capacity(file.header().num_sequences() as usize);
        let mut meta_offsets = vec![0];
        let mut buf = Vec::new();
        for e in file.chunks() {
            buf.resize(4 * e.num_sequences as usize, 0);
            f.seek(SeekFrom::Start(e.offset)).map_err(io)?;
            f.read_exact(&mut buf).map_err(io)?;
            meta.extend(buf.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
            meta_offsets.push(meta.len());
        }
        let chunks = file
            .chunks()
            .iter()
            .map(|e| ChunkInfo { num_samples: u64::from(e.num_samples), num_sequences: e.num_sequences })
            .collect();
        let streams = file.streams().iter().map(|s| s.to_spec()).collect();
        Ok(CbfSource { file, chunks, meta, meta_offsets, streams })
    }

    /// The file.
    pub fn file(&self) -> &CbfFile {
        &self.file
    }
}

impl SequenceSource for CbfSource {
    fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        let c = chunk as usize;
        let first = self
            .file
            .header()
            .first_sequence(c)
            .ok_or_else(|| Error::config(format!("chunk {chunk} does not exist")))?;
        let meta = &self.meta[self.meta_offsets[c]..self.meta_offsets[c + 1]];
        out.extend(meta.iter().enumerate().map(|(i, &n)| SequenceInfo { num_samples: n, key: first + i as u64 }));
        Ok(())
    }
}

impl Deserializer for CbfSource {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        Ok(Arc::new(self.file.read_chunk(chunk as usize)?))
    }
}

/// Several deserializers with the same streams read as one data set: the chunks of the first, then those
/// of the second, and so on (a concatenation of shards, which CNTK's composite reader cannot do: it joins
/// deserializers by key, READER.md §7).
///
/// Sequence keys are passed through unchanged, so two shards may hand out the same key (CBF keys restart
/// at 0 in every file).
pub struct MultiSource {
    parts: Vec<Arc<dyn Deserializer>>,
    chunks: Vec<ChunkInfo>,
    /// Per chunk: (part, chunk in the part).
    map: Vec<(u32, u32)>,
    streams: Vec<StreamSpec>,
}

impl std::fmt::Debug for MultiSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiSource").field("parts", &self.parts.len()).field("chunks", &self.chunks.len()).finish()
    }
}

impl MultiSource {
    /// Concatenates `parts`. Every part must have the same streams (names, dims, storage formats and
    /// element types, in the same order); aliases may differ.
    ///
    /// Errors ([`ErrorKind::Config`](crate::ErrorKind::Config)): no parts, different streams, or more than
    /// 2^32 − 1 chunks in all.
    pub fn new(parts: Vec<Arc<dyn Deserializer>>) -> Result<MultiSource, Error> {
        let first = parts.first().ok_or_else(|| Error::config("a multi-file source needs at least one file"))?;
        let streams = first.streams().to_vec();
        let mut chunks = Vec::new();
        let mut map = Vec::new();
        for (p, part) in parts.iter().enumerate() {
            let same = part.streams().len() == streams.len()
                && part.streams().iter().zip(&streams).all(|(a, b)| {
                    a.name == b.name && a.dim == b.dim && a.format == b.format && a.element_type == b.element_type
                });
            if !same {
                return Err(Error::config(format!(
                    "file {} of a multi-file source has streams [{}], but the first file has [{}]",
                    p + 1,
                    describe(part.streams()),
                    describe(&streams)
                )));
            }
            for (c, info) in part.chunks().iter().enumerate() {
                chunks.push(*info);
                map.push((p as u32, c as u32));
            }
        }
        if u32::try_from(chunks.len()).is_err() {
            return Err(Error::config(format!("{} chunks in all; at most 2^32 − 1 are supported", chunks.len())));
        }
        Ok(MultiSource { parts, chunks, map, streams })
    }

    /// The parts.
    pub fn parts(&self) -> &[Arc<dyn Deserializer>] {
        &self.parts
    }

    /// The part and its chunk index holding chunk `chunk` of the whole.
    pub fn locate(&self, chunk: u32) -> Option<(usize, u32)> {
        self.map.get(chunk as usize).map(|&(p, c)| (p as usize, c))
    }
}

fn describe(streams: &[StreamSpec]) -> String {
    streams
        .iter()
        .map(|s| format!("{}:{}:{:?}:{:?}", s.name, s.dim, s.format, s.element_type))
        .collect::<Vec<_>>()
        .join(", ")
}

impl SequenceSource for MultiSource {
    fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        let (p, c) = self.locate(chunk).ok_or_else(|| Error::config(format!("chunk {chunk} does not exist")))?;
        self.parts[p].sequences(c, out)
    }
}

impl Deserializer for MultiSource {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        let (p, c) = self.locate(chunk).ok_or_else(|| Error::config(format!("chunk {chunk} does not exist")))?;
        self.parts[p].load_chunk(c)
    }
}
