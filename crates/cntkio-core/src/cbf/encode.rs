//! Encoding: prefix, chunk records, header, trailer — byte for byte as CBF.md §1 and `ctf2bin.py` lay
//! them out (little-endian, no padding).

use super::{ChunkEntry, StreamHeader, MAGIC, VERSION};
use crate::data::{ChunkData, Layout, StreamData, Values};
use crate::error::{Error, ErrorKind};
use crate::schema::StorageFormat;
use std::ops::Range;

/// Appends the 12-byte prefix: magic and version.
pub fn encode_prefix(out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
}

/// Appends the 8-byte trailer: the header's absolute offset.
pub fn encode_trailer(header_offset: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&header_offset.to_le_bytes());
}

/// Appends the header: sentinel, chunk count, stream count, stream headers (storage type, name length,
/// name bytes, element type, dim) and chunk table entries (offset, sequences, samples).
pub fn encode_header(streams: &[StreamHeader], chunks: &[ChunkEntry], out: &mut Vec<u8>) -> Result<(), Error> {
    let c = u32::try_from(chunks.len())
        .map_err(|_| Error::limit("number of chunks (the 32-bit chunk count)", chunks.len() as u64, u32::MAX.into()))?;
    let i = u32::try_from(streams.len()).map_err(|_| {
        Error::limit("number of streams (the 32-bit stream count)", streams.len() as u64, u32::MAX.into())
    })?;
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&c.to_le_bytes());
    out.extend_from_slice(&i.to_le_bytes());
    for s in streams {
        let name = s.name.as_bytes();
        let len = u32::try_from(name.len()).map_err(|_| {
            Error::new(ErrorKind::InvalidStream {
                stream: s.name.clone(),
                reason: "the name is longer than 4 GiB".into(),
            })
        })?;
        if s.format == StorageFormat::Sparse && s.dim > i32::MAX as u32 {
            return Err(Error::new(ErrorKind::InvalidStream {
                stream: s.name.clone(),
                reason: format!("sparse dim {} does not fit a 32-bit signed index", s.dim),
            }));
        }
        out.push(match s.format {
            StorageFormat::Dense => 0,
            StorageFormat::Sparse => 1,
        });
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(name);
        out.push(match s.element_type {
            crate::schema::ElementType::F32 => 0,
            crate::schema::ElementType::F64 => 1,
        });
        out.extend_from_slice(&s.dim.to_le_bytes());
    }
    for ch in chunks {
        out.extend_from_slice(&ch.offset.to_le_bytes());
        out.extend_from_slice(&ch.num_sequences.to_le_bytes());
        out.extend_from_slice(&ch.num_samples.to_le_bytes());
    }
    Ok(())
}

fn bad(seq: usize, what: impl Into<String>) -> Error {
    Error::chunk_data(Some(seq), what)
}

/// Sequence `s`'s sample range of a stream, checked.
fn seq_range(d: &StreamData, s: usize) -> Result<(u64, u64), Error> {
    match (d.sequence_offsets.get(s), d.sequence_offsets.get(s + 1)) {
        (Some(&a), Some(&b)) if a <= b => Ok((a, b)),
        (Some(_), Some(_)) => Err(bad(s, "sequence offsets decrease")),
        _ => Err(bad(s, format!("no such sequence ({} in the stream)", d.sequence_offsets.len().saturating_sub(1)))),
    }
}

/// What a record covers: samples `a..b`, entries/values `e0..e1`.
struct Span {
    n: u32,
    e0: usize,
    e1: usize,
}

fn span(d: &StreamData, s: usize) -> Result<Span, Error> {
    let (a, b) = seq_range(d, s)?;
    let n = u32::try_from(b - a)
        .map_err(|_| Error::limit(format!("samples in sequence {s} (a 32-bit count)"), b - a, u32::MAX.into()))?;
    match &d.layout {
        Layout::Dense => {
            let e = |x: u64| usize::try_from(x).ok().and_then(|x| x.checked_mul(d.dim));
            match (e(a), e(b)) {
                (Some(e0), Some(e1)) if e1 <= d.values.len() => Ok(Span { n, e0, e1 }),
                _ => Err(bad(s, format!("samples {a}..{b} × dim {} exceed the {} values", d.dim, d.values.len()))),
            }
        }
        Layout::Sparse { indices, sample_offsets } => {
            let g = |k: u64| usize::try_from(k).ok().and_then(|k| sample_offsets.get(k).copied());
            match (g(a), g(b)) {
                (Some(e0), Some(e1)) if e0 <= e1 && (e1 as usize) <= d.values.len().min(indices.len()) => {
                    let nnz = e1 - e0;
                    if nnz > i32::MAX as u64 {
                        return Err(Error::limit(
                            format!("entries in sequence {s} (the 31-bit NNZ)"),
                            nnz,
                            i32::MAX as u64,
                        ));
                    }
                    Ok(Span { n, e0: e0 as usize, e1: e1 as usize })
                }
                _ => Err(bad(s, "sample offsets are out of range or decrease")),
            }
        }
    }
}

/// Size in bytes of sequence `s`'s record of this stream: `4 + N·dim·size` (dense) or
/// `8 + NNZ·(size + 4) + 4·N` (sparse).
pub fn record_len(d: &StreamData, s: usize) -> Result<u64, Error> {
    let sp = span(d, s)?;
    let es = d.values.element_type().size_bytes() as u64;
    let nv = (sp.e1 - sp.e0) as u64;
    Ok(match d.layout {
        Layout::Dense => 4 + nv * es,
        Layout::Sparse { .. } => 8 + nv * (es + 4) + 4 * u64::from(sp.n),
    })
}

/// Size in bytes sequence `s` takes in a chunk: its 4-byte meta count plus one record per stream.
pub fn sequence_len_bytes(data: &ChunkData, s: usize) -> Result<u64, Error> {
    let mut n = 4u64;
    for d in &data.streams {
        n += record_len(d, s)?;
    }
    Ok(n)
}

/// Appends sequence `s`'s record of a stream (CBF.md §1.7/§1.8). Sparse entries are written in the
/// order they have in `d` (not sorted); per-sample counts are the differences of `sample_offsets`.
/// Fails (writing nothing) if the data are inconsistent, a count does not fit its field, or a sparse
/// index lies outside `[0, dim)`.
pub fn encode_record(d: &StreamData, s: usize, out: &mut Vec<u8>) -> Result<(), Error> {
    let len = usize::try_from(record_len(d, s)?).map_err(|_| bad(s, "record too large for memory"))?;
    let start = out.len();
    out.resize(start + len, 0);
    match encode_record_to(d, s, &mut out[start..]) {
        Ok(()) => Ok(()),
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Writes sequence `s`'s record of a stream into `dst`, which must be exactly [`record_len`] bytes
/// long: the same bytes as [`encode_record`], checked the same way. On error `dst`'s contents are
/// unspecified.
pub(crate) fn encode_record_to(d: &StreamData, s: usize, dst: &mut [u8]) -> Result<(), Error> {
    let len = record_len(d, s)?;
    if dst.len() as u64 != len {
        let kind = if matches!(d.layout, Layout::Dense) { "dense" } else { "sparse" };
        return Err(bad(s, format!("a {kind} record of {len} bytes given {} bytes", dst.len())));
    }
    check_sparse_entries(d, s)?;
    encode_checked_record_to(d, s, dst)
}

/// For a sparse stream, what [`record_len`] does not check of sequence `s`: its indices lie in
/// `[0, dim)` and its per-sample counts do not decrease and fit 31 bits. Nothing to check for a dense one.
fn check_sparse_entries(d: &StreamData, s: usize) -> Result<(), Error> {
    if let Layout::Sparse { indices, sample_offsets } = &d.layout {
        let sp = span(d, s)?;
        let dim = d.dim;
        if let Some(&x) = indices[sp.e0..sp.e1].iter().find(|&&x| x < 0 || x as usize >= dim) {
            return Err(bad(s, format!("sparse index {x} is outside [0, {dim})")));
        }
        let (a, b) = seq_range(d, s)?;
        if sample_offsets[a as usize..=b as usize].windows(2).any(|w| w[1] < w[0] || w[1] - w[0] > i32::MAX as u64) {
            return Err(bad(s, "sample offsets decrease"));
        }
    }
    Ok(())
}

/// [`encode_record_to`] for a sequence already found encodable (its chunk passed [`check_chunk_fast`], or
/// it passed [`check_sequence`]): the same bytes without repeating those checks (index ranges, count
/// limits, decreasing offsets), which cost as much as the copy on short records; [`encode_record_to`] is
/// those checks and then this. What is read is still
/// looked up safely: data that break the promise get an error (or wrong bytes), never a panic.
#[doc(hidden)]
pub fn encode_checked_record_to(d: &StreamData, s: usize, dst: &mut [u8]) -> Result<(), Error> {
    match encode_checked_records_to(d, s..s + 1, dst)? {
        (1, len) if len == dst.len() => Ok(()),
        _ => Err(bad(s, format!("a record given {} bytes, not its length", dst.len()))),
    }
}

/// [`encode_checked_record_to`] for the sequences `run` one after the other, into the front of `dst`:
/// as many whole records as fit. Returns how many sequences were encoded and their bytes (none when the
/// first record does not fit). The same bytes as one record at a time, without the per-record calls and
/// length checks: a sparse gigabyte has millions of records of a hundred bytes or less.
#[doc(hidden)]
pub fn encode_checked_records_to(d: &StreamData, run: Range<usize>, dst: &mut [u8]) -> Result<(usize, usize), Error> {
    let seqs = d
        .sequence_offsets
        .get(run.start..run.end.max(run.start).saturating_add(1))
        .ok_or_else(|| bad(run.start, "no such sequences"))?;
    let r = match (&d.layout, &d.values) {
        (Layout::Dense, Values::F32(v)) => dense_records(seqs, d.dim, v, dst),
        (Layout::Dense, Values::F64(v)) => dense_records(seqs, d.dim, v, dst),
        (Layout::Sparse { indices, sample_offsets }, Values::F32(v)) => {
            sparse_records(seqs, sample_offsets, v, indices, dst)
        }
        (Layout::Sparse { indices, sample_offsets }, Values::F64(v)) => {
            sparse_records(seqs, sample_offsets, v, indices, dst)
        }
    };
    r.map_err(|k| bad(run.start + k, "the data changed after they were checked"))
}

/// Dense records of the sequences whose sample offsets are `seqs` (see [`encode_checked_records_to`]);
/// `Err(k)`: the `k`-th sequence's offsets are inconsistent.
fn dense_records<T: Le>(seqs: &[u64], dim: usize, v: &[T], dst: &mut [u8]) -> Result<(usize, usize), usize> {
    let mut out = 0usize;
    for (k, w) in seqs.windows(2).enumerate() {
        let (a, b) = (w[0] as usize, w[1] as usize);
        if a > b || b - a > u32::MAX as usize {
            return Err(k);
        }
        let vals = a.checked_mul(dim).zip(b.checked_mul(dim)).and_then(|(e0, e1)| v.get(e0..e1)).ok_or(k)?;
        let len = 4 + vals.len() * T::SIZE;
        let Some(rec) = out.checked_add(len).and_then(|end| dst.get_mut(out..end)) else {
            return Ok((k, out));
        };
        let (head, rest) = rec.split_at_mut(4);
        head.copy_from_slice(&((b - a) as u32).to_le_bytes());
        T::put(rest, vals);
        out += len;
    }
    Ok((seqs.len().saturating_sub(1), out))
}

/// Sparse records of the sequences whose sample offsets are `seqs` (see [`encode_checked_records_to`]);
/// `Err(k)`: the `k`-th sequence's offsets are inconsistent.
fn sparse_records<T: Le>(
    seqs: &[u64],
    sample_offsets: &[u64],
    v: &[T],
    indices: &[i32],
    dst: &mut [u8],
) -> Result<(usize, usize), usize> {
    let mut out = 0usize;
    for (k, w) in seqs.windows(2).enumerate() {
        let (a, b) = (w[0] as usize, w[1] as usize);
        let offs = sample_offsets.get(a..b.saturating_add(1)).filter(|_| a <= b).ok_or(k)?;
        let (e0, e1) = (offs[0] as usize, offs[b - a] as usize);
        let (Some(vals), Some(idx)) = (v.get(e0..e1), indices.get(e0..e1)) else { return Err(k) };
        let (n, nv) = (b - a, e1 - e0);
        let len = 8 + nv * (T::SIZE + 4) + 4 * n;
        let Some(rec) = out.checked_add(len).and_then(|end| dst.get_mut(out..end)) else {
            return Ok((k, out));
        };
        let (head, rest) = rec.split_at_mut(8);
        head[..4].copy_from_slice(&(n as u32).to_le_bytes());
        head[4..].copy_from_slice(&(nv as u32).to_le_bytes());
        let (val_out, rest) = rest.split_at_mut(nv * T::SIZE);
        let (idx_out, counts) = rest.split_at_mut(nv * 4);
        T::put(val_out, vals);
        i32::put(idx_out, idx);
        for (o, w) in counts.chunks_exact_mut(4).zip(offs.windows(2)) {
            o.copy_from_slice(&(w[1].wrapping_sub(w[0]) as u32).to_le_bytes());
        }
        out += len;
    }
    Ok((seqs.len().saturating_sub(1), out))
}

/// A number written little-endian into records.
trait Le: Copy {
    /// Bytes of one.
    const SIZE: usize;
    /// Writes `src` into `dst` (exactly as long): a loop the compiler turns into a copy on little-endian
    /// targets.
    fn put(dst: &mut [u8], src: &[Self]);
}

macro_rules! le {
    ($($t:ty),*) => {$(
        impl Le for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn put(dst: &mut [u8], src: &[$t]) {
                for (d, x) in dst.chunks_exact_mut(Self::SIZE).zip(src) {
                    d.copy_from_slice(&x.to_le_bytes());
                }
            }
        }
    )*};
}
le!(f32, f64, i32);

/// Checks that sequence `s` of every stream can be encoded (what [`encode_record`] checks, without
/// writing anything) and returns its size in a chunk, as [`sequence_len_bytes`].
pub fn check_sequence(data: &ChunkData, s: usize) -> Result<u64, Error> {
    let mut total = 4u64;
    for d in &data.streams {
        total += record_len(d, s)?;
        check_sparse_entries(d, s)?;
    }
    Ok(total)
}

/// Checks every sequence of `data` at once (one vectorizable pass per array, for the common case of
/// valid data): `true` when each sequence passes [`check_sequence`]. `false` means some sequence may
/// not; the caller then checks them one by one.
#[doc(hidden)]
pub fn check_chunk_fast(data: &ChunkData) -> bool {
    check_chunk(data, true)
}

/// [`check_chunk_fast`] for data the CTF parser made, whose sparse indices it compared with the stream's
/// dimension as it read them: the pass over every index is left out (it would run on the thread that hands
/// chunks to the writer, which a conversion keeps busy).
#[doc(hidden)]
pub fn check_parsed_chunk_fast(data: &ChunkData) -> bool {
    let ok = check_chunk(data, false);
    debug_assert!(!ok || check_chunk(data, true), "parsed data with a sparse index out of range");
    ok
}

/// Whether `offsets` never decrease and no step exceeds `max` (below 2^63: a decrease wraps to a step
/// above it): without a branch per element, so that it vectorizes (a sparse gigabyte has millions of
/// offsets per stream), in blocks that stop early.
fn steps_within(offsets: &[u64], max: u64) -> bool {
    debug_assert!(max < 1 << 63);
    let next = offsets.get(1..).unwrap_or_default();
    offsets
        .chunks(4096)
        .zip(next.chunks(4096))
        .all(|(a, b)| a.iter().zip(b).fold(true, |ok, (&x, &y)| ok & (y.wrapping_sub(x) <= max)))
}

fn check_chunk(data: &ChunkData, check_indices: bool) -> bool {
    let n = data.num_samples.len();
    if data.keys.len() != n {
        return false;
    }
    for d in &data.streams {
        if d.sequence_offsets.len() != n + 1 || d.sequence_offsets.first() != Some(&0) {
            return false;
        }
        if !steps_within(&d.sequence_offsets, u64::from(u32::MAX)) {
            return false;
        }
        let samples = d.num_samples();
        match &d.layout {
            Layout::Dense => {
                let need = usize::try_from(samples).ok().and_then(|x| x.checked_mul(d.dim));
                match need {
                    Some(need) if need <= d.values.len() => {}
                    _ => return false,
                }
            }
            Layout::Sparse { indices, sample_offsets } => {
                let Some(offs) = usize::try_from(samples).ok().and_then(|k| sample_offsets.get(..=k)) else {
                    return false;
                };
                let entries = offs.last().copied().unwrap_or(0);
                if offs.first() != Some(&0)
                    || entries > d.values.len().min(indices.len()) as u64
                    || !steps_within(offs, i32::MAX as u64)
                {
                    return false;
                }
                // In 32-bit lanes, so that it vectorizes on any x86-64: a non-negative `x` is below `dim`
                // iff `x as u32 < lim` (`lim` is `dim` capped at `u32::MAX`, above every `i32`).
                let lim = u32::try_from(d.dim).unwrap_or(u32::MAX);
                let used = &indices[..entries as usize];
                if check_indices && used.iter().fold(false, |acc, &x| acc | (x < 0) | (x as u32 >= lim)) {
                    return false;
                }
                // Each sequence's NNZ must fit 31 bits (the offsets do not decrease, so none is above the
                // total).
                if entries > i32::MAX as u64
                    && d.sequence_offsets
                        .windows(2)
                        .any(|w| offs[w[1] as usize] - offs[w[0] as usize] > i32::MAX as u64)
                {
                    return false;
                }
            }
        }
    }
    true
}

/// Appends a whole chunk: the meta counts (`data.num_samples`, one per sequence) then, stream after
/// stream, each sequence's record. Fails if the streams' sequence counts differ from `data.keys` and
/// `data.num_samples`, or a record cannot be encoded (see [`encode_record`]); `out` is then left as it
/// was.
pub fn encode_chunk(data: &ChunkData, out: &mut Vec<u8>) -> Result<(), Error> {
    let n = data.num_samples.len();
    if data.keys.len() != n {
        return Err(Error::chunk_data(None, format!("{} keys but {} sample counts", data.keys.len(), n)));
    }
    if let Some((i, d)) = data.streams.iter().enumerate().find(|(_, d)| d.num_sequences() != n) {
        return Err(Error::chunk_data(None, format!("stream {i} has {} sequences, the chunk {n}", d.num_sequences())));
    }
    let start = out.len();
    let mut total = 4 * n as u64;
    for d in &data.streams {
        for s in 0..n {
            total += record_len(d, s)?;
        }
    }
    out.reserve(usize::try_from(total).map_err(|_| Error::limit("chunk size in bytes", total, usize::MAX as u64))?);
    put_u32s(out, data.num_samples.iter());
    for d in &data.streams {
        for s in 0..n {
            if let Err(e) = encode_record(d, s, out) {
                out.truncate(start);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Encodes a whole file: prefix, the chunks in order, header, trailer. Each chunk table entry's sample
/// count is the sum of that chunk's `num_samples` (meta counts). The element type written for each
/// stream is `streams[i].element_type`; each chunk's values must be of that type.
pub fn encode_file(streams: &[StreamHeader], chunks: &[ChunkData]) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    encode_prefix(&mut out);
    let mut table = Vec::with_capacity(chunks.len());
    for (k, c) in chunks.iter().enumerate() {
        if c.streams.len() != streams.len()
            || c.streams.iter().zip(streams).any(|(d, h)| {
                d.format() != h.format || d.dim != h.dim as usize || d.values.element_type() != h.element_type
            })
        {
            return Err(Error::chunk_data(None, format!("chunk {k}'s streams do not match the stream headers")));
        }
        let offset = out.len() as u64;
        encode_chunk(c, &mut out)?;
        let samples: u64 = c.num_samples.iter().map(u64::from).sum();
        table.push(ChunkEntry {
            offset,
            num_sequences: u32::try_from(c.num_sequences()).map_err(|_| {
                Error::limit(format!("sequences in chunk {k}"), c.num_sequences() as u64, u32::MAX.into())
            })?,
            num_samples: u32::try_from(samples)
                .map_err(|_| Error::limit(format!("sum of chunk {k}'s meta counts"), samples, u32::MAX.into()))?,
        });
    }
    let header_offset = out.len() as u64;
    encode_header(streams, &table, &mut out)?;
    encode_trailer(header_offset, &mut out);
    Ok(out)
}

#[inline]
pub(crate) fn put_u32s(out: &mut Vec<u8>, v: impl ExactSizeIterator<Item = u32>) {
    let start = out.len();
    out.resize(start + 4 * v.len(), 0);
    for (dst, x) in out[start..].chunks_exact_mut(4).zip(v) {
        dst.copy_from_slice(&x.to_le_bytes());
    }
}
