//! Chunks as the minibatch source holds them ([`SourceChunk`]): parsed [`ChunkData`], or a CBF chunk's
//! undecoded records (in a reused buffer or in the file's map), from which minibatches copy each
//! sequence's values once.

use super::loader::Spares;
use crate::cbf::CbfFile;
use crate::{ChunkData, ElementType, Error, Layout, StorageFormat, StreamData, Values};
use std::ops::Range;
use std::sync::{Arc, Weak};

/// A loaded chunk, as a [`MinibatchSource`](super::MinibatchSource) holds it between loading and
/// assembling minibatches: sequence `i` is sequence `i` of the chunk's sequence list, with one stream per
/// entry of the deserializer's [`streams`](super::Deserializer::streams).
///
/// Made by [`Deserializer::load_source_chunk`](super::Deserializer::load_source_chunk): parsed data
/// ([`SourceChunk::from_data`]) or, for CBF files, the chunk's records as they are in the file.
#[derive(Debug)]
pub struct SourceChunk {
    repr: Repr,
    /// The longest sequence of any stream (frame mode checks only chunks where this exceeds 1).
    max_len: u64,
    /// Some stream of some sequence has no sample (checked per sequence only in such chunks).
    has_empty: bool,
    /// Where the chunk's buffer goes when it is dropped (a loader's spares).
    recycle: Option<Weak<Spares>>,
}

impl Drop for SourceChunk {
    fn drop(&mut self) {
        if let Repr::Cbf(CbfChunk { bytes: Bytes::Mapped(f, r), .. }) = &self.repr {
            // Out of the process's resident set (the page cache keeps them): memory stays bounded by the
            // chunks held, not the file.
            f.release(r.clone());
        }
        let Some(spares) = self.recycle.take().and_then(|w| w.upgrade()) else { return };
        if let Repr::Cbf(c) = &mut self.repr {
            if matches!(c.bytes, Bytes::Owned(_) | Bytes::Anon(..)) {
                let bytes = std::mem::replace(&mut c.bytes, Bytes::Owned(Vec::new()));
                let repr = Repr::Cbf(CbfChunk { bytes, streams: Vec::new() });
                spares.offer(SourceChunk { repr, max_len: 0, has_empty: false, recycle: None });
            }
        }
    }
}

#[derive(Debug)]
enum Repr {
    /// Parsed data, and per stream the number of samples of every sequence if they all have the same.
    Data(Arc<ChunkData>, Vec<Option<u64>>),
    Cbf(CbfChunk),
}

/// A CBF chunk's records, validated as the decoder validates them.
#[derive(Debug)]
struct CbfChunk {
    bytes: Bytes,
    /// Per stream: the offset (in the chunk's bytes) of each sequence's record.
    streams: Vec<RawStream>,
}

#[derive(Debug)]
enum Bytes {
    /// Read into an owned buffer.
    Owned(Vec<u8>),
    /// Read into the first `len` bytes of an anonymous map (not zero-filled by a `Vec` first; reused
    /// when evicted).
    Anon(memmap2::MmapMut, usize),
    /// The chunk's range of a mapped file.
    Mapped(Arc<CbfFile>, Range<usize>),
}

#[derive(Debug)]
pub(crate) struct RawStream {
    sparse: bool,
    dim: usize,
    f64: bool,
    /// Where each sequence's record starts in the chunk's bytes.
    records: Records,
    /// The number of samples of every sequence, if they all have the same (then a dense sequence's values
    /// are found without reading its record's header).
    same_len: Option<u32>,
}

/// Record offsets of one stream of a chunk (chunks of 4 GiB or more are decoded instead).
#[derive(Debug)]
enum Records {
    /// `count` records of `stride` bytes each from `first` (all of the same shape: e.g. one sample per
    /// sequence), found by arithmetic instead of a table lookup.
    Uniform { first: usize, stride: usize, count: usize },
    /// Each record's offset.
    Listed(Vec<u32>),
}

impl Records {
    #[inline]
    fn get(&self, seq: usize) -> usize {
        match self {
            Records::Uniform { first, stride, .. } => first + seq * stride,
            Records::Listed(v) => v[seq] as usize,
        }
    }
    fn len(&self) -> usize {
        match self {
            Records::Uniform { count, .. } => *count,
            Records::Listed(v) => v.len(),
        }
    }
    /// Adds the record at `pos`, keeping the uniform form while the records are evenly spaced.
    fn push(&mut self, pos: usize) {
        match self {
            Records::Uniform { first, stride, count } => {
                if *count == 0 {
                    *first = pos;
                } else if *count == 1 && pos > *first {
                    *stride = pos - *first;
                } else if pos != *first + *count * *stride {
                    let v =
                        (0..*count).map(|i| (*first + i * *stride) as u32).chain(std::iter::once(pos as u32)).collect();
                    *self = Records::Listed(v);
                    return;
                }
                *count += 1;
            }
            Records::Listed(v) => v.push(pos as u32),
        }
    }
}

impl SourceChunk {
    /// A chunk of parsed data.
    pub fn from_data(data: Arc<ChunkData>) -> SourceChunk {
        let mut max_len = 0;
        let mut has_empty = false;
        let mut same_len = Vec::with_capacity(data.streams.len());
        for s in &data.streams {
            let mut same = s.sequence_offsets.get(1).map(|&o| o - s.sequence_offsets[0]);
            for w in s.sequence_offsets.windows(2) {
                let n = w[1] - w[0];
                max_len = max_len.max(n);
                has_empty |= n == 0;
                if same != Some(n) {
                    same = None;
                }
            }
            // Sequence `i` then starts at sample `i * n` (offsets start at 0).
            same_len.push(same.filter(|_| s.sequence_offsets.first() == Some(&0)));
        }
        SourceChunk { repr: Repr::Data(data, same_len), max_len, has_empty, recycle: None }
    }

    /// Number of sequences.
    pub fn num_sequences(&self) -> usize {
        match &self.repr {
            Repr::Data(d, _) => d.num_sequences(),
            Repr::Cbf(c) => c.streams.first().map_or(0, |s| s.records.len()),
        }
    }

    /// The parsed data, if the chunk holds parsed data.
    pub fn data(&self) -> Option<&Arc<ChunkData>> {
        match &self.repr {
            Repr::Data(d, _) => Some(d),
            Repr::Cbf(_) => None,
        }
    }

    /// The longest sequence of any stream, in samples.
    pub(crate) fn max_len(&self) -> u64 {
        self.max_len
    }

    /// Whether some stream of some sequence has no sample.
    pub(crate) fn has_empty(&self) -> bool {
        self.has_empty
    }

    /// A borrowed view for reading sequences.
    pub(crate) fn view(&self) -> ChunkView<'_> {
        match &self.repr {
            Repr::Data(d, same) => ChunkView::Data(d, same),
            Repr::Cbf(c) => {
                let bytes = match &c.bytes {
                    Bytes::Owned(v) => &v[..],
                    Bytes::Anon(m, len) => &m[..*len],
                    Bytes::Mapped(f, r) => &f.mapped_bytes().expect("a mapped chunk's file stays mapped")[r.clone()],
                };
                ChunkView::Cbf(bytes, &c.streams)
            }
        }
    }

    /// Number of samples of sequence `seq` in stream `stream`.
    pub fn sequence_len(&self, stream: usize, seq: usize) -> u64 {
        self.view().sequence_len(stream, seq)
    }

    /// Appends sequence `seq` of stream `stream` to `dst` (which has the stream's storage format and
    /// element type).
    pub fn append_sequence(&self, stream: usize, seq: usize, dst: &mut StreamData) {
        self.view().append(stream, seq, dst)
    }

    /// The memory the chunk holds, in bytes (for a mapped CBF chunk, the bytes of the file it reads).
    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.repr {
            Repr::Data(d, _) => d.heap_bytes(),
            Repr::Cbf(c) => {
                let bytes = match &c.bytes {
                    Bytes::Owned(v) => v.capacity(),
                    Bytes::Anon(m, _) => m.len(),
                    Bytes::Mapped(_, r) => r.len(),
                };
                let tables: usize = c
                    .streams
                    .iter()
                    .map(|s| match &s.records {
                        Records::Listed(v) => v.capacity() * 4,
                        Records::Uniform { .. } => 0,
                    })
                    .sum();
                bytes + tables
            }
        }
    }

    /// The bytes of the buffer a load could reuse ([`SourceChunk::load_cbf`]'s `spare`); 0 if none.
    pub(crate) fn buffer_len(&self) -> usize {
        match &self.repr {
            Repr::Cbf(CbfChunk { bytes: Bytes::Owned(v), .. }) => v.capacity(),
            Repr::Cbf(CbfChunk { bytes: Bytes::Anon(m, _), .. }) => m.len(),
            _ => 0,
        }
    }

    fn into_buffer(mut self) -> Option<Bytes> {
        self.recycle = None;
        match &mut self.repr {
            Repr::Cbf(CbfChunk { bytes: b @ (Bytes::Owned(_) | Bytes::Anon(..)), .. }) => {
                Some(std::mem::replace(b, Bytes::Owned(Vec::new())))
            }
            _ => None,
        }
    }

    /// The address of the buffer a load could reuse, if the chunk has one.
    #[cfg(test)]
    pub(crate) fn buffer_addr(&self) -> Option<usize> {
        match &self.repr {
            Repr::Cbf(CbfChunk { bytes: Bytes::Owned(v), .. }) => Some(v.as_ptr() as usize),
            Repr::Cbf(CbfChunk { bytes: Bytes::Anon(m, _), .. }) => Some(m.as_ptr() as usize),
            _ => None,
        }
    }

    /// Gives the chunk's buffer (if it has one a load can reuse) to `spares` when the chunk is dropped.
    pub(crate) fn recycle_into(&mut self, spares: &Arc<Spares>) {
        if self.buffer_len() > 0 {
            self.recycle = Some(Arc::downgrade(spares));
        }
    }

    /// Loads chunk `k` of a CBF file, keeping its records undecoded: borrowed from the map when the file
    /// is mapped, else read into a buffer (`spare`'s if it is large enough). A chunk the decoder would
    /// refuse (or that the fast check does not accept) is decoded instead, so that errors are exactly the
    /// decoder's.
    pub(crate) fn load_cbf(file: &Arc<CbfFile>, k: usize, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
        let walked = if file.is_mapped() {
            let mut unused = Vec::new();
            let bytes = file.chunk_bytes(k, &mut unused)?;
            let walked = walk_cbf(file, k, bytes);
            file.check_map()?;
            walked.map(|w| {
                let r = file.header().chunk_range(k).expect("chunk_bytes checked the chunk");
                (Bytes::Mapped(file.clone(), r.start as usize..r.end as usize), w)
            })
        } else {
            let len = file.chunk_len(k)?;
            let mut buf = match spare.and_then(SourceChunk::into_buffer) {
                Some(Bytes::Anon(m, _)) if m.len() >= len => Bytes::Anon(m, len),
                Some(Bytes::Owned(mut v)) => {
                    v.resize(len, 0);
                    Bytes::Owned(v)
                }
                _ => anon(len).map_or_else(|| Bytes::Owned(vec![0; len]), |m| Bytes::Anon(m, len)),
            };
            let dst = match &mut buf {
                Bytes::Anon(m, len) => &mut m[..*len],
                Bytes::Owned(v) => &mut v[..],
                Bytes::Mapped(..) => unreachable!("not mapped"),
            };
            file.read_chunk_bytes(k, dst)?;
            walk_cbf(file, k, dst).map(|w| (buf, w))
        };
        let Some((bytes, (streams, max_len, has_empty))) = walked else {
            return Ok(SourceChunk::from_data(Arc::new(file.read_chunk(k)?)));
        };
        Ok(SourceChunk { repr: Repr::Cbf(CbfChunk { bytes, streams }), max_len, has_empty, recycle: None })
    }
}

/// An anonymous map of at least `len` bytes (rounded up to 2 MiB, so that maps are reused for chunks of
/// similar sizes); `None` if it cannot be made. No transparent-huge-page hint: asking for huge pages makes
/// the kernel compact memory at fault time, which costs more system time than the pages save.
fn anon(len: usize) -> Option<memmap2::MmapMut> {
    const ROUND: usize = 2 << 20;
    let size = len.checked_add(ROUND - 1)? / ROUND * ROUND;
    memmap2::MmapMut::map_anon(size).ok()
}

/// Reads the records of chunk `k` (its `bytes`), checking everything the decoder checks; `None` if
/// anything is amiss.
fn walk_cbf(file: &CbfFile, k: usize, bytes: &[u8]) -> Option<(Vec<RawStream>, u64, bool)> {
    let header = file.header();
    if bytes.len() > u32::MAX as usize {
        return None;
    }
    let s_count = header.chunks().get(k)?.num_sequences as usize;
    let mut pos = s_count.checked_mul(4)?;
    if pos > bytes.len() {
        return None;
    }
    let (mut max_len, mut has_empty) = (0u64, false);
    let mut streams = Vec::with_capacity(header.streams().len());
    for sh in header.streams() {
        let es = sh.elem_size() as usize;
        let dim = sh.dim as usize;
        let sparse = sh.format == StorageFormat::Sparse;
        let mut records = Records::Uniform { first: 0, stride: 0, count: 0 };
        let mut same_len = None;
        // Samples of a dense stream of dim 0 so far: at most one a byte (the decoder's rule).
        let mut empty_samples = 0usize;
        for k in 0..s_count {
            records.push(pos);
            let n = u32_at(bytes, pos)? as usize;
            if sparse {
                let nnz = u32_at(bytes, pos + 4)?;
                if nnz > i32::MAX as u32 {
                    return None;
                }
                let nnz = nnz as usize;
                let values = pos + 8;
                let idx = values.checked_add(nnz.checked_mul(es)?)?;
                let counts = idx.checked_add(nnz.checked_mul(4)?)?;
                let end = counts.checked_add(n.checked_mul(4)?)?;
                if end > bytes.len() {
                    return None;
                }
                for c in bytes[idx..counts].chunks_exact(4) {
                    let i = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    if i < 0 || i as u32 >= sh.dim {
                        return None;
                    }
                }
                let mut sum = 0u64;
                for c in bytes[counts..end].chunks_exact(4) {
                    let c = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    if c < 0 {
                        return None;
                    }
                    sum += c as u64;
                    if sum > nnz as u64 {
                        return None;
                    }
                }
                if sum != nnz as u64 {
                    return None;
                }
                pos = end;
            } else {
                if dim == 0 {
                    empty_samples += n;
                    if empty_samples > bytes.len() {
                        return None;
                    }
                }
                let len = n.checked_mul(dim)?.checked_mul(es)?;
                let end = (pos + 4).checked_add(len)?;
                if end > bytes.len() {
                    return None;
                }
                pos = end;
            }
            max_len = max_len.max(n as u64);
            has_empty |= n == 0;
            if k == 0 {
                same_len = Some(n as u32);
            } else if same_len != Some(n as u32) {
                same_len = None;
            }
        }
        streams.push(RawStream { sparse, dim, f64: sh.element_type == ElementType::F64, records, same_len });
    }
    Some((streams, max_len, has_empty))
}

#[inline]
fn u32_at(bytes: &[u8], pos: usize) -> Option<u32> {
    let b = bytes.get(pos..pos.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

#[inline]
fn u32_le(bytes: &[u8], pos: usize) -> u32 {
    u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes"))
}

/// A loaded chunk, borrowed for one minibatch.
#[derive(Clone, Copy)]
pub(crate) enum ChunkView<'a> {
    Data(&'a ChunkData, &'a [Option<u64>]),
    Cbf(&'a [u8], &'a [RawStream]),
}

impl<'a> ChunkView<'a> {
    /// Number of sequences.
    pub(crate) fn num_sequences(&self) -> usize {
        match self {
            ChunkView::Data(d, _) => d.num_sequences(),
            ChunkView::Cbf(_, s) => s.first().map_or(0, |s| s.records.len()),
        }
    }

    /// Number of streams.
    pub(crate) fn num_streams(&self) -> usize {
        match self {
            ChunkView::Data(d, _) => d.streams.len(),
            ChunkView::Cbf(_, s) => s.len(),
        }
    }

    /// Number of samples of sequence `seq` in stream `stream`.
    #[inline]
    pub(crate) fn sequence_len(&self, stream: usize, seq: usize) -> u64 {
        match self {
            ChunkView::Data(d, _) => d.streams[stream].sequence_len(seq),
            ChunkView::Cbf(b, s) => u64::from(u32_le(b, s[stream].records.get(seq))),
        }
    }

    /// Number of stored entries of sequence `seq` in stream `stream`: values of all its samples (samples ×
    /// dim when dense, non-zeros when sparse).
    #[inline]
    pub(crate) fn sequence_entries(&self, stream: usize, seq: usize) -> u64 {
        match self {
            ChunkView::Data(d, _) => {
                let s = &d.streams[stream];
                let r = s.sequence_samples(seq);
                match &s.layout {
                    Layout::Dense => (r.end - r.start) * s.dim as u64,
                    Layout::Sparse { sample_offsets, .. } => {
                        sample_offsets[r.end as usize] - sample_offsets[r.start as usize]
                    }
                }
            }
            ChunkView::Cbf(b, s) => {
                let st = &s[stream];
                let rec = st.records.get(seq);
                if st.sparse {
                    u64::from(u32_le(b, rec + 4))
                } else {
                    u64::from(u32_le(b, rec)) * st.dim as u64
                }
            }
        }
    }

    /// Asks the processor to bring the table entry that locates sequence `seq` of stream `stream` into the
    /// cache (parsed data: its sequence offsets; CBF: its record offset, unless records are located by
    /// arithmetic), so that a later [`prefetch`](Self::prefetch) does not wait for it. Changes nothing but
    /// timing.
    #[inline]
    pub(crate) fn prefetch_locator(&self, stream: usize, seq: usize) {
        match self {
            ChunkView::Data(d, same) => {
                if same[stream].is_some() {
                    return;
                }
                let o = &d.streams[stream].sequence_offsets;
                crate::hint::prefetch(o.get(seq..(seq + 2).min(o.len())).unwrap_or_default());
            }
            ChunkView::Cbf(_, streams) => {
                if let Records::Listed(v) = &streams[stream].records {
                    crate::hint::prefetch(v.get(seq..(seq + 2).min(v.len())).unwrap_or_default());
                }
            }
        }
    }

    /// Asks the processor to bring sequence `seq` of stream `stream` into the cache (its record, or its
    /// values), so that a later [`append`](Self::append) finds it there. Changes nothing but timing.
    #[inline]
    pub(crate) fn prefetch(&self, stream: usize, seq: usize) {
        match self {
            ChunkView::Data(d, _) => {
                let s = &d.streams[stream];
                let (Some(&a), Some(&b)) = (s.sequence_offsets.get(seq), s.sequence_offsets.get(seq + 1)) else {
                    return;
                };
                let (a, b) = match &s.layout {
                    Layout::Dense => (a as usize * s.dim, b as usize * s.dim),
                    Layout::Sparse { sample_offsets, .. } => {
                        match (sample_offsets.get(a as usize), sample_offsets.get(b as usize)) {
                            (Some(&a), Some(&b)) => (a as usize, b as usize),
                            _ => return,
                        }
                    }
                };
                match &s.values {
                    Values::F32(v) => crate::hint::prefetch(v.get(a..b).unwrap_or_default()),
                    Values::F64(v) => crate::hint::prefetch(v.get(a..b).unwrap_or_default()),
                }
            }
            ChunkView::Cbf(b, streams) => {
                let r = &streams[stream].records;
                let start = r.get(seq);
                let end = match r {
                    Records::Uniform { stride, .. } => start + stride,
                    Records::Listed(v) => v.get(seq + 1).map_or(start + 64, |&e| e as usize),
                };
                crate::hint::prefetch(b.get(start..end.min(b.len())).unwrap_or_default());
            }
        }
    }

    /// The values of sequence `seq` of dense stream `stream` and its number of samples, when they are found
    /// without reading a CBF chunk's bytes: parsed data (its sequence offsets locate them), or a CBF chunk
    /// whose sequences all have the same length in this stream. `None` otherwise (then
    /// [`append`](Self::append) copies the sequence).
    #[inline]
    pub(crate) fn dense_values(self, stream: usize, seq: usize) -> Option<(DenseValues<'a>, u32)> {
        match self {
            ChunkView::Cbf(b, streams) => {
                let s = &streams[stream];
                let n = s.same_len?;
                if s.sparse {
                    return None;
                }
                let start = s.records.get(seq) + 4;
                let len = n as usize * s.dim * if s.f64 { 8 } else { 4 };
                // In range: `walk_cbf` checked every record.
                Some((DenseValues::Le(&b[start..start + len]), n))
            }
            ChunkView::Data(d, same) => {
                let s = &d.streams[stream];
                if !matches!(s.layout, Layout::Dense) {
                    return None;
                }
                let (a, e) = match same[stream] {
                    // Without reading the offsets (a random place in memory).
                    Some(n) => (seq * n as usize, (seq + 1) * n as usize),
                    None => (s.sequence_offsets[seq] as usize, s.sequence_offsets[seq + 1] as usize),
                };
                let n = u32::try_from(e - a).ok()?;
                Some((DenseValues::Parsed(&s.values, a * s.dim, e * s.dim), n))
            }
        }
    }

    /// Appends sequence `seq` of stream `stream` to `dst` (same storage format and element type).
    #[inline]
    pub(crate) fn append(&self, stream: usize, seq: usize, dst: &mut StreamData) {
        match self {
            ChunkView::Data(d, _) => super::append_sequence(dst, &d.streams[stream], seq),
            ChunkView::Cbf(b, streams) => {
                let s = &streams[stream];
                let rec = s.records.get(seq);
                let n = u32_le(b, rec) as usize;
                let es = if s.f64 { 8 } else { 4 };
                if s.sparse {
                    let nnz = u32_le(b, rec + 4) as usize;
                    let values = rec + 8;
                    let idx = values + nnz * es;
                    let counts = idx + nnz * 4;
                    extend_le(&mut dst.values, &b[values..idx]);
                    let Layout::Sparse { indices, sample_offsets } = &mut dst.layout else {
                        unreachable!("a deserializer's chunks have its streams' storage formats")
                    };
                    indices
                        .extend(b[idx..counts].chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])));
                    let mut o = *sample_offsets.last().expect("starts with 0");
                    sample_offsets.extend(b[counts..counts + 4 * n].chunks_exact(4).map(|c| {
                        o += u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                        o
                    }));
                } else {
                    let start = rec + 4;
                    extend_le(&mut dst.values, &b[start..start + n * s.dim * es]);
                }
                let last = *dst.sequence_offsets.last().expect("starts with 0");
                dst.sequence_offsets.push(last + n as u64);
            }
        }
    }
}

/// The values of a dense sequence in a loaded chunk ([`ChunkView::dense_values`]).
#[derive(Clone, Copy)]
pub(crate) enum DenseValues<'a> {
    /// Little-endian, of the stream's element type (CBF).
    Le(&'a [u8]),
    /// Values `start..end` of parsed data.
    Parsed(&'a Values, usize, usize),
}

impl DenseValues<'_> {
    /// Asks for the values' memory ([`crate::hint::prefetch`]).
    #[inline]
    pub(crate) fn prefetch(self) {
        match self {
            DenseValues::Le(b) => crate::hint::prefetch(b),
            DenseValues::Parsed(Values::F32(v), a, e) => crate::hint::prefetch(&v[a..e]),
            DenseValues::Parsed(Values::F64(v), a, e) => crate::hint::prefetch(&v[a..e]),
        }
    }

    /// Appends the values to `v` (which has the stream's element type).
    #[inline]
    pub(crate) fn append_to(self, v: &mut Values) {
        match self {
            DenseValues::Le(b) => extend_le(v, b),
            DenseValues::Parsed(src, a, e) => v.extend_from(src, a..e),
        }
    }
}

/// Appends little-endian values of `v`'s element type.
#[inline]
fn extend_le(v: &mut Values, raw: &[u8]) {
    match v {
        Values::F32(v) => crate::hint::extend_f32_le(v, raw),
        Values::F64(v) => crate::hint::extend_f64_le(v, raw),
    }
}
