//! Chunk decoding: a chunk's bytes → [`ChunkData`], validating every record.

use super::{le_u32, Header, StreamHeader};
use crate::data::{ChunkData, Keys, Layout, Lengths, StreamData, Values};
use crate::error::{Error, ErrorKind};
use crate::schema::{ElementType, StorageFormat};
use std::ops::Range;

/// Decodes one chunk of a file whose [`Header`] was parsed.
///
/// Sequence keys are global sequence indices (the first sequence of the file is key 0, CBF.md §4);
/// [`ChunkData::num_samples`] holds the meta counts; streams come in header order.
#[derive(Debug, Clone)]
pub struct ChunkDecoder<'h> {
    header: &'h Header,
    chunk: usize,
    range: Range<u64>,
    first_key: u64,
}

/// What decoding a chunk found besides its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeSummary {
    /// Bytes taken by the meta counts and records.
    pub bytes_used: u64,
    /// Bytes of the chunk's range after its last record (0 in files cntkio and ctf2bin write; CNTK
    /// ignores them).
    pub bytes_unused: u64,
    /// Sum of the meta counts (CNTK does not compare it with the chunk table's sample count).
    pub meta_total: u64,
}

impl<'h> ChunkDecoder<'h> {
    /// A decoder for chunk `chunk`. Fails if there is no such chunk, or if the chunk is larger than the
    /// header's `limits.max_chunk_bytes` (checked before the caller allocates a buffer for it).
    pub fn new(header: &'h Header, chunk: usize) -> Result<ChunkDecoder<'h>, Error> {
        let range =
            header.chunk_range(chunk).ok_or_else(|| Error::chunk_out_of_range(chunk as u64, header.chunks().len()))?;
        let len = range.end - range.start;
        let max = header.limits().max_chunk_bytes;
        if len > max {
            return Err(Error::at(
                ErrorKind::Limit { what: format!("chunk {chunk} size in bytes"), value: len, limit: max },
                range.start,
            ));
        }
        let first_key = header.first_sequence(chunk).unwrap_or(0);
        Ok(ChunkDecoder { header, chunk, range, first_key })
    }

    /// The chunk's bytes in the file: from its offset to the next chunk's (or the header's) offset.
    pub fn byte_range(&self) -> Range<u64> {
        self.range.clone()
    }

    /// Decodes the chunk's bytes (exactly [`ChunkDecoder::byte_range`]).
    pub fn decode(&self, bytes: &[u8]) -> Result<ChunkData, Error> {
        let mut out = ChunkData { keys: Keys::new(), num_samples: Lengths::new(), streams: Vec::new() };
        self.decode_into(bytes, &mut out)?;
        Ok(out)
    }

    /// Decodes into `out`, reusing its allocations when its streams already have the header's layout.
    ///
    /// Every record is validated: dense `N·dim` values and sparse `NNZ·(size+4) + 4·N` bytes must fit
    /// in what is left of the chunk (checked before anything is allocated); `NNZ < 2^31`; every sparse
    /// index lies in `[0, dim)`; per-sample counts are non-negative and sum to `NNZ`; a dense stream of
    /// dim 0 (whose samples take no bytes) has at most as many samples in the chunk as the chunk has bytes,
    /// so that no count in a file asks for more samples than it has bytes. Records with `N = 0` are
    /// accepted (CNTK reads them; its packer then refuses the sequence).
    pub fn decode_into(&self, bytes: &[u8], out: &mut ChunkData) -> Result<DecodeSummary, Error> {
        let len = self.range.end - self.range.start;
        if bytes.len() as u64 != len {
            return Err(Error::option(
                "bytes",
                format!(
                    "chunk {}: {} bytes given, but its range {}..{} has {len}",
                    self.chunk,
                    bytes.len(),
                    self.range.start,
                    self.range.end
                ),
            ));
        }
        prepare(out, self.header.streams());
        let entry = self.header.chunks()[self.chunk];
        let s_count = entry.num_sequences as usize;
        let mut d = Dec { bytes, pos: 0, base: self.range.start, chunk: self.chunk };
        // Header::parse checked that the meta counts fit in the chunk.
        let meta = d.take(4 * s_count).ok_or_else(|| d.past_end("meta counts", 4 * s_count as u64, None))?;
        out.num_samples.extend(meta.chunks_exact(4).map(le_u32));
        let meta_total = out.num_samples.iter().map(u64::from).sum();
        out.keys.extend(self.first_key..self.first_key + s_count as u64);
        for (sh, data) in self.header.streams().iter().zip(out.streams.iter_mut()) {
            data.sequence_offsets.reserve(s_count);
            for s in 0..s_count {
                let key = self.first_key + s as u64;
                match sh.format {
                    StorageFormat::Dense => d.dense(sh, data, key)?,
                    StorageFormat::Sparse => d.sparse(sh, data, key)?,
                }
            }
        }
        Ok(DecodeSummary { bytes_used: d.pos as u64, bytes_unused: len - d.pos as u64, meta_total })
    }
}

/// Makes `out` an empty chunk with the streams' layout, keeping allocations where possible.
fn prepare(out: &mut ChunkData, streams: &[StreamHeader]) {
    let same = out.streams.len() == streams.len()
        && out.streams.iter().zip(streams).all(|(d, h)| {
            d.format() == h.format && d.dim == h.dim as usize && d.values.element_type() == h.element_type
        });
    if same {
        out.clear();
    } else {
        out.keys.clear();
        out.num_samples.clear();
        out.streams = streams.iter().map(|h| StreamData::new(h.format, h.dim as usize, h.element_type)).collect();
    }
}

struct Dec<'a> {
    bytes: &'a [u8],
    pos: usize,
    base: u64,
    chunk: usize,
}

impl<'a> Dec<'a> {
    #[inline]
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }
    #[inline]
    fn abs(&self) -> u64 {
        self.base + self.pos as u64
    }
    #[inline]
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    #[inline]
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(le_u32)
    }
    fn end(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }
    fn past_end(&self, field: &str, need: u64, key: Option<u64>) -> Error {
        let e = Error::cbf_value(
            field,
            self.abs(),
            Some(need),
            0..=self.remaining(),
            format!(
                "needs {need} bytes but chunk {} ends at byte {} ({} bytes left)",
                self.chunk,
                self.end(),
                self.remaining()
            ),
        );
        match key {
            Some(k) => e.with_sequence(k),
            None => e,
        }
    }

    fn dense(&mut self, sh: &StreamHeader, data: &mut StreamData, key: u64) -> Result<(), Error> {
        let at = self.abs();
        let field = || format!("stream \"{}\" sequence {key} N", sh.name);
        let n = self.u32().ok_or_else(|| self.past_end(&field(), 4, Some(key)))?;
        let es = sh.elem_size();
        // u32 × u32 × 8 fits in u128 only; checked multiplication keeps it in u64.
        let nbytes = u64::from(n).checked_mul(u64::from(sh.dim)).and_then(|v| v.checked_mul(es));
        let nbytes = match nbytes {
            Some(b) if b <= self.remaining() => b as usize,
            _ => {
                return Err(Error::cbf_value(
                    field(),
                    at,
                    Some(n.into()),
                    0..=self.remaining() / (u64::from(sh.dim) * es).max(1),
                    format!(
                        "{n} samples × dim {} × {es} bytes do not fit in the {} bytes left in chunk {} (it ends at byte {})",
                        sh.dim,
                        self.remaining(),
                        self.chunk,
                        self.end()
                    ),
                )
                .with_sequence(key))
            }
        };
        let last = *data.sequence_offsets.last().unwrap_or(&0);
        if sh.dim == 0 && last + u64::from(n) > self.bytes.len() as u64 {
            let room = (self.bytes.len() as u64).saturating_sub(last);
            return Err(Error::cbf_value(
                field(),
                at,
                Some(n.into()),
                0..=room,
                format!(
                    "a dense stream of dim 0 takes no bytes a sample, so cntkio allows it at most one sample a byte \
                     of its chunk: {n} more samples would make {} in chunk {} of {} bytes",
                    last + u64::from(n),
                    self.chunk,
                    self.bytes.len()
                ),
            )
            .with_sequence(key));
        }
        let raw = self.take(nbytes).ok_or_else(|| self.past_end(&field(), nbytes as u64, Some(key)))?;
        extend_values(&mut data.values, raw);
        data.sequence_offsets.push(last + u64::from(n));
        Ok(())
    }

    fn sparse(&mut self, sh: &StreamHeader, data: &mut StreamData, key: u64) -> Result<(), Error> {
        let name = &sh.name;
        let n_at = self.abs();
        let n =
            self.u32().ok_or_else(|| self.past_end(&format!("stream \"{name}\" sequence {key} N"), 4, Some(key)))?;
        let nnz_at = self.abs();
        let nnz =
            self.u32().ok_or_else(|| self.past_end(&format!("stream \"{name}\" sequence {key} NNZ"), 4, Some(key)))?;
        if nnz > i32::MAX as u32 {
            return Err(Error::cbf_value(
                format!("stream \"{name}\" sequence {key} NNZ"),
                nnz_at,
                Some(nnz.into()),
                0..=i32::MAX as u64,
                format!("NNZ count {nnz} is too large for a 32-bit signed index (at most {})", i32::MAX),
            )
            .with_sequence(key));
        }
        let es = sh.elem_size();
        let entries = u64::from(nnz) * (es + 4);
        if entries > self.remaining() {
            return Err(Error::cbf_value(
                format!("stream \"{name}\" sequence {key} NNZ"),
                nnz_at,
                Some(nnz.into()),
                0..=self.remaining() / (es + 4),
                format!(
                    "{nnz} entries need {entries} bytes but only {} bytes are left in chunk {} (it ends at byte {})",
                    self.remaining(),
                    self.chunk,
                    self.end()
                ),
            )
            .with_sequence(key));
        }
        let counts = 4 * u64::from(n);
        if entries + counts > self.remaining() {
            return Err(Error::cbf_value(
                format!("stream \"{name}\" sequence {key} N"),
                n_at,
                Some(n.into()),
                0..=(self.remaining() - entries) / 4,
                format!(
                    "{n} samples need {counts} bytes of per-sample counts after {entries} bytes of entries, but only {} bytes are left in chunk {} (it ends at byte {})",
                    self.remaining(),
                    self.chunk,
                    self.end()
                ),
            )
            .with_sequence(key));
        }
        let nnz = nnz as usize;
        let raw_values = self.take(nnz * es as usize).unwrap_or(&[]);
        let idx_at = self.abs();
        let raw_idx = self.take(nnz * 4).unwrap_or(&[]);
        let counts_at = self.abs();
        let raw_counts = self.take(n as usize * 4).unwrap_or(&[]);

        let Layout::Sparse { indices, sample_offsets } = &mut data.layout else {
            return Err(Error::internal("a sparse stream decoded into a dense layout"));
        };
        let idx_start = indices.len();
        extend_le(indices, raw_idx, |c: &[u8; 4]| i32::from_le_bytes(*c));
        let dim = sh.dim;
        // One pass; the exact culprit is looked up only on failure.
        // A fold without early exit vectorizes (`any` does not).
        if indices[idx_start..].iter().fold(false, |bad, &i| bad | (i < 0) | (i as u32 >= dim)) {
            let j = indices[idx_start..].iter().position(|&i| i < 0 || i as u32 >= dim).unwrap_or(0);
            let bad = indices[idx_start + j];
            return Err(Error::cbf_value(
                format!("stream \"{name}\" sequence {key} index"),
                idx_at + 4 * j as u64,
                u64::try_from(bad).ok(),
                0..=u64::from(dim).saturating_sub(1),
                format!("index {bad} of entry {j} is outside [0, {dim})"),
            )
            .with_sequence(key));
        }
        let base = *sample_offsets.last().unwrap_or(&0);
        let mut sum = 0u64;
        sample_offsets.reserve(n as usize);
        for (k, c) in raw_counts.chunks_exact(4).enumerate() {
            let c = le_u32(c) as i32;
            if c < 0 || sum + c as u64 > nnz as u64 {
                return Err(Error::cbf_value(
                    format!("stream \"{name}\" sequence {key} sample count"),
                    counts_at + 4 * k as u64,
                    u64::try_from(c).ok(),
                    0..=nnz as u64 - sum,
                    if c < 0 {
                        format!("sample {k} has a negative entry count {c}")
                    } else {
                        format!(
                            "sample {k} has {c} entries, more than the {} of the NNZ {nnz} left after the previous samples",
                            nnz as u64 - sum
                        )
                    },
                )
                .with_sequence(key));
            }
            sum += c as u64;
            sample_offsets.push(base + sum);
        }
        if sum != nnz as u64 {
            return Err(Error::cbf_value(
                format!("stream \"{name}\" sequence {key} sample count"),
                counts_at,
                Some(sum),
                nnz as u64..=nnz as u64,
                format!("the {n} per-sample counts sum to {sum}, but NNZ is {nnz}"),
            )
            .with_sequence(key));
        }
        extend_values(&mut data.values, raw_values);
        let last = *data.sequence_offsets.last().unwrap_or(&0);
        data.sequence_offsets.push(last + u64::from(n));
        Ok(())
    }
}

/// Appends little-endian values (4 or 8 bytes each, as `v`'s type says).
#[inline]
fn extend_values(v: &mut Values, raw: &[u8]) {
    match v {
        Values::F32(v) => extend_le(v, raw, |c: &[u8; 4]| f32::from_le_bytes(*c)),
        Values::F64(v) => extend_le(v, raw, |c: &[u8; 8]| f64::from_le_bytes(*c)),
    }
}

/// Appends `raw` read as little-endian `T`s (`raw.len()` a multiple of `size_of::<T>()`): the vector
/// grows once (a small zero-fill, in cache) and a fixed-width loop the compiler turns into a copy fills
/// it (a generic `extend` over `chunks_exact` stays one element per iteration).
#[inline]
fn extend_le<T: Copy + Default, const N: usize>(v: &mut Vec<T>, raw: &[u8], conv: impl Fn(&[u8; N]) -> T) {
    let start = v.len();
    v.resize(start + raw.len() / N, T::default());
    for (d, c) in v[start..].iter_mut().zip(raw.chunks_exact(N)) {
        if let Ok(c) = <&[u8; N]>::try_from(c) {
            *d = conv(c);
        }
    }
}

/// Converts every stream's values to `t` (f32 → f64 is exact; f64 → f32 rounds to nearest). Streams
/// already of type `t` are left alone. This is the lenient alternative to CNTK's rule that the file's
/// element types equal the reader precision ([`Header::check_precision`]).
pub fn convert_element_type(data: &mut ChunkData, t: ElementType) {
    for s in &mut data.streams {
        match (&s.values, t) {
            (Values::F32(v), ElementType::F64) => s.values = Values::F64(v.iter().map(|&x| f64::from(x)).collect()),
            (Values::F64(v), ElementType::F32) => s.values = Values::F32(v.iter().map(|&x| x as f32).collect()),
            _ => {}
        }
    }
}
