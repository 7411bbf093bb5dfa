//! The deserializer interface (READER.md §1): chunks of sequences with declared lengths and keys, and
//! parsed chunk data on demand. Implemented by [`CtfReader`], by [`CbfSource`] (a [`CbfFile`] with its
//! per-sequence meta counts) and by [`MultiSource`] (shards of the same streams, one after another).

use super::SourceChunk;
use crate::cbf::{CbfFile, CbfOptions};
use crate::randomize::{ChunkInfo, SequenceInfo, SequenceSource};
use crate::{ChunkData, CtfReader, ElementType, Error, ErrorKind, StreamSpec};
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

    /// Loads chunk `chunk` as a [`MinibatchSource`](super::MinibatchSource) holds it, possibly reusing the
    /// buffers of `spare` (a chunk no longer needed). The default wraps [`load_chunk`](Self::load_chunk);
    /// [`CbfSource`] keeps the chunk's records undecoded, so that minibatches copy each value once. Must
    /// hold the same sequences as `load_chunk`, and fail exactly when it fails, with the same error.
    fn load_source_chunk(&self, chunk: u32, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
        let _ = spare;
        Ok(SourceChunk::from_data(self.load_chunk(chunk)?))
    }

    /// Whether the order in which chunks are loaded can change what they hold or which fail (a CTF reader
    /// with a `maxErrors` budget shared by its chunks). Such sources are loaded on demand only, in
    /// ascending chunk order, never ahead in the background. Default false.
    fn load_order_matters(&self) -> bool {
        false
    }

    /// The size in bytes of chunk `chunk` in its file (a CTF chunk's text, a CBF chunk's records), if
    /// known: what loading ahead counts against its budget ([`MinibatchConfig::prefetch`]). Default
    /// `None`.
    ///
    /// [`MinibatchConfig::prefetch`]: super::MinibatchConfig::prefetch
    fn chunk_size(&self, chunk: u32) -> Option<u64> {
        let _ = chunk;
        None
    }

    /// An error if a file this source reads through a memory map became shorter (or unreadable) while it
    /// was mapped: chunks loaded from the map ([`load_source_chunk`](Self::load_source_chunk)) may then hold
    /// zeros where the file lost bytes, so what was copied from them must not be used. Checked after each
    /// minibatch is assembled, before it is handed out. Default: never.
    fn check_maps(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl Deserializer for CtfReader {
    fn streams(&self) -> &[StreamSpec] {
        self.schema().streams()
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        CtfReader::load_chunk(self, chunk as usize)
    }
    fn load_order_matters(&self) -> bool {
        self.options().max_errors > 0
    }
    fn chunk_size(&self, chunk: u32) -> Option<u64> {
        self.index().chunks.get(chunk as usize).map(|c| c.len_bytes)
    }
}

impl<T: Deserializer + ?Sized> Deserializer for Arc<T> {
    fn streams(&self) -> &[StreamSpec] {
        (**self).streams()
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        (**self).load_chunk(chunk)
    }
    fn load_source_chunk(&self, chunk: u32, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
        (**self).load_source_chunk(chunk, spare)
    }
    fn load_order_matters(&self) -> bool {
        (**self).load_order_matters()
    }
    fn chunk_size(&self, chunk: u32) -> Option<u64> {
        (**self).chunk_size(chunk)
    }
    fn check_maps(&self) -> Result<(), Error> {
        (**self).check_maps()
    }
}

impl<T: Deserializer + ?Sized> Deserializer for Box<T> {
    fn streams(&self) -> &[StreamSpec] {
        (**self).streams()
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        (**self).load_chunk(chunk)
    }
    fn load_source_chunk(&self, chunk: u32, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
        (**self).load_source_chunk(chunk, spare)
    }
    fn load_order_matters(&self) -> bool {
        (**self).load_order_matters()
    }
    fn chunk_size(&self, chunk: u32) -> Option<u64> {
        (**self).chunk_size(chunk)
    }
    fn check_maps(&self) -> Result<(), Error> {
        (**self).check_maps()
    }
}

/// A CBF file as a deserializer: chunks as in the file, sequence keys = global sequence indices, declared
/// lengths = the file's per-sequence meta counts (CBF.md §2, READER.md §1).
///
/// A chunk's meta counts are read when its sequences are asked for (once per sweep, as the chunk enters
/// the randomization window): nothing is kept per sequence of the file. A chunk's sample count is the
/// chunk table's, as CNTK's randomizer uses it.
#[derive(Debug)]
pub struct CbfSource {
    file: Arc<CbfFile>,
    chunks: Vec<ChunkInfo>,
    streams: Vec<StreamSpec>,
    /// Every stream delivered as this element type (None: the file's).
    precision: Option<ElementType>,
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

    /// Wraps an open file.
    pub fn new(file: CbfFile) -> Result<CbfSource, Error> {
        let chunks = file
            .chunks()
            .iter()
            .map(|e| ChunkInfo { num_samples: u64::from(e.num_samples), num_sequences: e.num_sequences })
            .collect();
        let streams = file.streams().iter().map(|s| s.to_spec()).collect();
        Ok(CbfSource { file: Arc::new(file), chunks, streams, precision: None })
    }

    /// Delivers every stream as element type `t` (CNTK's `precision`), converted as the records are
    /// decoded; `None` keeps the file's types.
    pub fn with_precision(mut self, t: Option<ElementType>) -> CbfSource {
        self.precision = t;
        self.streams = self.file.streams().iter().map(|s| s.to_spec()).collect();
        set_element_types(&mut self.streams, t);
        self
    }

    /// The file.
    pub fn file(&self) -> &CbfFile {
        &self.file
    }

    /// The key of chunk `chunk`'s first sequence (keys are global sequence indices).
    fn first_key(&self, chunk: u32) -> Result<u64, Error> {
        self.file
            .header()
            .first_sequence(chunk as usize)
            .ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.chunks.len()))
    }
}

/// Sets every stream's element type to `t`, where given (CNTK's `precision`).
pub(crate) fn set_element_types(streams: &mut [StreamSpec], t: Option<ElementType>) {
    if let Some(t) = t {
        for s in streams {
            s.element_type = t;
        }
    }
}

impl SequenceSource for CbfSource {
    fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        let first = self.first_key(chunk)?;
        let mut meta = Vec::new();
        self.file.meta_counts(chunk as usize, &mut meta)?;
        out.extend(meta.iter().enumerate().map(|(i, &n)| SequenceInfo { num_samples: n, key: first + i as u64 }));
        Ok(())
    }
    fn uniform_sequences(&self, chunk: u32) -> Result<Option<(u64, u32)>, Error> {
        let first = self.first_key(chunk)?;
        Ok(self.file.uniform_meta_count(chunk as usize)?.map(|n| (first, n)))
    }
}

impl Deserializer for CbfSource {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        Ok(Arc::new(match self.precision {
            Some(t) => self.file.read_chunk_as(chunk as usize, t)?,
            None => self.file.read_chunk(chunk as usize)?,
        }))
    }
    fn load_source_chunk(&self, chunk: u32, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
        let converted = self.file.streams().iter().zip(&self.streams).any(|(f, s)| f.element_type != s.element_type);
        if converted {
            return Ok(SourceChunk::from_data(self.load_chunk(chunk)?));
        }
        // The file's own element types: the records are kept undecoded and copied once, into the
        // minibatch (decoding the whole chunk first would copy every value twice).
        SourceChunk::load_cbf(&self.file, chunk as usize, spare)
    }
    fn chunk_size(&self, chunk: u32) -> Option<u64> {
        self.file.header().chunk_range(chunk as usize).map(|r| r.end - r.start)
    }
    fn check_maps(&self) -> Result<(), Error> {
        self.file.check_map()
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
    /// Errors: no parts ([`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption)), different streams ([`ErrorKind::StreamsDiffer`](crate::ErrorKind::StreamsDiffer)), or more
    /// than 2^32 − 1 chunks in all ([`ErrorKind::Limit`](crate::ErrorKind::Limit)).
    pub fn new(parts: Vec<Arc<dyn Deserializer>>) -> Result<MultiSource, Error> {
        let first =
            parts.first().ok_or_else(|| Error::option("parts", "a multi-file source needs at least one file"))?;
        let streams = first.streams().to_vec();
        let mut chunks = Vec::new();
        let mut map = Vec::new();
        for (p, part) in parts.iter().enumerate() {
            let same = part.streams().len() == streams.len()
                && part.streams().iter().zip(&streams).all(|(a, b)| {
                    a.name == b.name && a.dim == b.dim && a.format == b.format && a.element_type == b.element_type
                });
            if !same {
                return Err(Error::new(ErrorKind::StreamsDiffer {
                    part: p as u64 + 1,
                    streams: describe(part.streams()),
                    first: describe(&streams),
                }));
            }
            for (c, info) in part.chunks().iter().enumerate() {
                chunks.push(*info);
                map.push((p as u32, c as u32));
            }
        }
        if u32::try_from(chunks.len()).is_err() {
            return Err(Error::limit("number of chunks in all files", chunks.len() as u64, u32::MAX.into()));
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
        let (p, c) = self.locate(chunk).ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.chunks.len()))?;
        self.parts[p].sequences(c, out)
    }
    fn uniform_sequences(&self, chunk: u32) -> Result<Option<(u64, u32)>, Error> {
        let (p, c) = self.locate(chunk).ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.chunks.len()))?;
        self.parts[p].uniform_sequences(c)
    }
}

impl Deserializer for MultiSource {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        let (p, c) = self.locate(chunk).ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.chunks.len()))?;
        self.parts[p].load_chunk(c)
    }
    fn load_source_chunk(&self, chunk: u32, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
        let (p, c) = self.locate(chunk).ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.chunks.len()))?;
        self.parts[p].load_source_chunk(c, spare)
    }
    fn load_order_matters(&self) -> bool {
        self.parts.iter().any(|p| p.load_order_matters())
    }
    fn chunk_size(&self, chunk: u32) -> Option<u64> {
        let (p, c) = self.locate(chunk)?;
        self.parts[p].chunk_size(c)
    }
    fn check_maps(&self) -> Result<(), Error> {
        self.parts.iter().try_for_each(|p| p.check_maps())
    }
}

/// Where a joined sequence's data lives: per part, (chunk, index in the chunk).
type JoinedSequence = (SequenceInfo, Vec<(u32, u32)>);

/// Several deserializers joined by sequence key, as CNTK's composite reader (Bundler) does (READER.md §7):
/// different streams of the same sequences from different files.
///
/// The first part is the primary: it defines the chunks, the order of sequences within them and which
/// keys exist. A primary sequence whose key is missing in another part is dropped, and so are chunks left
/// without sequences. A joined sequence's declared length is that of the part with a `definesMBSize`
/// stream (at most one part may have one), else the maximum over the parts. The streams are those of the
/// first part, then those of the second, and so on.
pub struct Composite {
    parts: Vec<Arc<dyn Deserializer>>,
    chunks: Vec<ChunkInfo>,
    /// Per joined chunk: the primary chunk and the joined sequences.
    map: Vec<(u32, Vec<JoinedSequence>)>,
    streams: Vec<StreamSpec>,
}

impl std::fmt::Debug for Composite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Composite").field("parts", &self.parts.len()).field("chunks", &self.chunks.len()).finish()
    }
}

impl Composite {
    /// Joins `parts` (the first is the primary) by key.
    ///
    /// Errors: no parts ([`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption)); two parts with a `definesMBSize` stream
    /// ([`ErrorKind::SeveralMainStreams`](crate::ErrorKind::SeveralMainStreams)); no primary sequence whose key every part has
    /// ([`ErrorKind::KeysDoNotMatch`](crate::ErrorKind::KeysDoNotMatch), CNTK's `Could not reconcile data between different deserializers. Keys of
    /// logical sequences do not match.`); and errors of the parts.
    pub fn new(parts: Vec<Arc<dyn Deserializer>>) -> Result<Composite, Error> {
        if parts.is_empty() {
            return Err(Error::option("parts", "a composite source needs at least one deserializer"));
        }
        let definers: Vec<usize> =
            (0..parts.len()).filter(|&p| parts[p].streams().iter().any(|s| s.defines_mb_size)).collect();
        if definers.len() > 1 {
            let streams = definers
                .iter()
                .flat_map(|&p| parts[p].streams().iter().filter(|s| s.defines_mb_size).map(|s| s.name.clone()))
                .collect();
            return Err(Error::new(ErrorKind::SeveralMainStreams { streams }));
        }
        let mut where_: Vec<std::collections::HashMap<u64, (u32, u32, u32)>> = Vec::new();
        let mut buf = Vec::new();
        for part in &parts[1..] {
            let mut m = std::collections::HashMap::new();
            for c in 0..part.chunks().len() as u32 {
                buf.clear();
                part.sequences(c, &mut buf)?;
                for (i, s) in buf.iter().enumerate() {
                    m.entry(s.key).or_insert((c, i as u32, s.num_samples));
                }
            }
            where_.push(m);
        }
        let mut chunks = Vec::new();
        let mut map = Vec::new();
        for c in 0..parts[0].chunks().len() as u32 {
            buf.clear();
            parts[0].sequences(c, &mut buf)?;
            let mut joined = Vec::new();
            'seq: for (i, s) in buf.iter().enumerate() {
                let mut locs = vec![(c, i as u32)];
                let mut lens = vec![s.num_samples];
                for m in &where_ {
                    match m.get(&s.key) {
                        Some(&(oc, oi, n)) => {
                            locs.push((oc, oi));
                            lens.push(n);
                        }
                        None => continue 'seq,
                    }
                }
                let len = match definers.first() {
                    Some(&p) => lens[p],
                    None => lens.iter().copied().max().unwrap_or(0),
                };
                joined.push((SequenceInfo { num_samples: len, key: s.key }, locs));
            }
            if joined.is_empty() {
                continue;
            }
            chunks.push(ChunkInfo {
                num_samples: joined.iter().map(|j| u64::from(j.0.num_samples)).sum(),
                num_sequences: joined.len() as u32,
            });
            map.push((c, joined));
        }
        if chunks.is_empty() {
            return Err(Error::new(ErrorKind::KeysDoNotMatch));
        }
        let streams = parts.iter().flat_map(|p| p.streams().iter().cloned()).collect();
        Ok(Composite { parts, chunks, map, streams })
    }
}

impl SequenceSource for Composite {
    fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        let (_, joined) =
            self.map.get(chunk as usize).ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.map.len()))?;
        out.extend(joined.iter().map(|j| j.0));
        Ok(())
    }
}

impl Deserializer for Composite {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        let (_, joined) =
            self.map.get(chunk as usize).ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.map.len()))?;
        let mut out = ChunkData {
            keys: joined.iter().map(|j| j.0.key).collect(),
            num_samples: joined.iter().map(|j| j.0.num_samples).collect(),
            streams: self.streams.iter().map(|s| crate::StreamData::new(s.format, s.dim, s.element_type)).collect(),
        };
        let mut first_stream = 0;
        for (p, part) in self.parts.iter().enumerate() {
            let n = part.streams().len();
            let mut loaded: std::collections::HashMap<u32, Arc<ChunkData>> = std::collections::HashMap::new();
            for (_, locs) in joined {
                let (c, i) = locs[p];
                let data = match loaded.get(&c) {
                    Some(d) => d.clone(),
                    None => {
                        let d = part.load_chunk(c)?;
                        loaded.insert(c, d.clone());
                        d
                    }
                };
                for k in 0..n {
                    super::append_sequence(&mut out.streams[first_stream + k], &data.streams[k], i as usize);
                }
            }
            first_stream += n;
        }
        Ok(Arc::new(out))
    }
    fn load_order_matters(&self) -> bool {
        self.parts.iter().any(|p| p.load_order_matters())
    }
    fn check_maps(&self) -> Result<(), Error> {
        self.parts.iter().try_for_each(|p| p.check_maps())
    }
}
