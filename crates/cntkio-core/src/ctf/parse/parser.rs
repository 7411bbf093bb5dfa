//! The parser proper: sequences and rows, the stream names of a row, and each sample handed to the
//! dense or sparse reader.

use super::dense::read_dense;
use super::outcome::{skip_to_next, DenseNote};
use super::sink::ErrorSink;
use super::sparse::read_sparse;
use crate::ctf::simd;
use crate::ctf::{is_non_printable, SequenceDesc};
use crate::data::{ChunkData, Layout, Values};
use crate::error::{Error, ErrorKind, WarningKind};
use crate::schema::Schema;

/// Per-stream lookup data.
#[derive(Debug, Clone)]
pub(super) struct StreamInfo {
    alias: Box<[u8]>,
    /// The alias's bytes as a little-endian word, when it has 1–8 of them (else `None`).
    alias_word: Option<u64>,
    name: String,
    dim: usize,
    defines_length: bool,
}

/// Parses sequences of one schema. Cheap to clone; holds no buffers.
#[derive(Debug, Clone)]
pub struct CtfParser {
    schema: Schema,
    streams: Vec<StreamInfo>,
    max_alias_len: usize,
    /// The vector paths may be used (the processor has them; see [`CtfParser::set_vector_paths`]).
    vector: Option<simd::Vector>,
}

/// `bytes` (1–8 of them) as a little-endian word, zero above.
pub(super) fn short_word(bytes: &[u8]) -> Option<u64> {
    if !(1..=8).contains(&bytes.len()) {
        return None;
    }
    let mut w = [0u8; 8];
    w[..bytes.len()].copy_from_slice(bytes);
    Some(u64::from_le_bytes(w))
}

/// The vector instruction set the parser uses on this processor (`"AVX-512"`), if any: the vector
/// paths are taken unless `CNTKIO_SIMD=0` is set. The data are the same either way.
pub fn vector_paths() -> Option<&'static str> {
    simd::available().map(|_| "AVX-512")
}

/// Outcome of reading one sample.
pub(super) enum Sample {
    /// Read; the row continues at this position.
    Ok(usize),
    /// Failed or skipped: continue at this position (the next `|` or `\n` is searched from there).
    Skip(usize),
}

impl CtfParser {
    /// A parser for this schema (aliases are what the file mentions).
    pub fn new(schema: &Schema) -> CtfParser {
        let main = schema.main_stream();
        let streams: Vec<StreamInfo> = schema
            .streams()
            .iter()
            .enumerate()
            .map(|(i, s)| StreamInfo {
                alias: s.alias.as_bytes().into(),
                alias_word: short_word(s.alias.as_bytes()),
                name: s.name.clone(),
                dim: s.dim,
                defines_length: main.is_none_or(|m| m == i),
            })
            .collect();
        let max_alias_len = streams.iter().map(|s| s.alias.len()).max().unwrap_or(0);
        CtfParser { schema: schema.clone(), streams, max_alias_len, vector: simd::available() }
    }

    /// Turns the vector paths (AVX-512, where the processor has it) off or back on. They are on by
    /// default, unless `CNTKIO_SIMD=0` is set; the data are the same either way. For comparisons.
    pub fn set_vector_paths(&mut self, on: bool) {
        self.vector = if on { simd::available() } else { None };
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The stream named `name`, which is `ext[start..start + len]`.
    #[inline]
    pub(super) fn lookup(&self, ext: &[u8], start: usize, len: usize) -> Option<usize> {
        // Names of up to 8 bytes are compared as words (read with the bytes after them, masked off),
        // without a `memcmp` call per stream.
        if (1..=8).contains(&len) {
            if let Some(w) = ext.get(start..start + 8) {
                let word = u64::from_le_bytes(w.try_into().expect("8 bytes")) & (!0u64 >> (64 - 8 * len));
                return self.streams.iter().position(|s| s.alias_word == Some(word) && s.alias.len() == len);
            }
        }
        let name = &ext[start..start + len];
        self.streams.iter().position(|s| &*s.alias == name)
    }

    /// Parses `seqs`, whose bytes lie in `bytes` (which starts at absolute offset `base`), appending them
    /// to `out`. A sequence's bytes end either with `\n` or at the end of the file.
    pub fn parse_sequences(
        &self,
        bytes: &[u8],
        base: u64,
        seqs: &[SequenceDesc],
        out: &mut ChunkData,
        sink: &mut dyn ErrorSink,
    ) -> Result<(), Error> {
        let mut st = SeqState::new(self.streams.len());
        for seq in seqs {
            let a = seq
                .offset
                .checked_sub(base)
                .and_then(|a| usize::try_from(a).ok())
                .filter(|&a| a <= bytes.len() && bytes.len() - a >= seq.len_bytes as usize)
                .ok_or_else(|| {
                    Error::option(
                        "bytes",
                        format!(
                            "sequence {} at byte {} is outside the {} bytes given from byte {}",
                            seq.key,
                            seq.offset,
                            bytes.len(),
                            base
                        ),
                    )
                })?;
            // The fast paths may look past the sequence's end (never using what they see there).
            let ext = &bytes[a..];
            self.parse_sequence(ext, seq.len_bytes as usize, false, seq.offset, seq, out, &mut st, sink)?;
        }
        Ok(())
    }

    /// Parses the rows of a line-mode file without a `definesMBSize` stream, where every row is a
    /// sequence of one sample: `bytes` (from absolute offset `base`, starting at a row) are cut into rows
    /// at each `\n` (the last may end at the end of `bytes`), which are keyed `first_key`, `first_key + 1`,
    /// …, appended to `seqs` and parsed. This is what [`CtfParser::parse_sequences`] does with the
    /// sequences the line-mode index makes of the same rows, in one pass over the bytes. When the parse
    /// stops at an error, `seqs` still gets every row.
    pub fn parse_rows(
        &self,
        bytes: &[u8],
        base: u64,
        first_key: u64,
        seqs: &mut Vec<SequenceDesc>,
        out: &mut ChunkData,
        sink: &mut dyn ErrorSink,
    ) -> Result<(), Error> {
        let mut st = SeqState::new(self.streams.len());
        let mut pos = 0usize;
        let mut key = first_key;
        while pos < bytes.len() {
            // The row's end is found by parsing it, with the end of the chunk as the bound: every scan
            // stops at the row's `\n`, so the result is that of parsing the row's bytes alone.
            let ext = &bytes[pos..];
            let offset = base + pos as u64;
            let mut seq = SequenceDesc { key, offset, len_bytes: 0, num_samples: 1 };
            let r = self.parse_sequence(ext, ext.len(), true, offset, &seq, out, &mut st, sink);
            let len = match r {
                Ok(end) => end,
                // The parse stopped inside the row: its end is the next `\n`.
                Err(_) => memchr::memchr(b'\n', ext).map_or(ext.len(), |k| k + 1),
            };
            seq.len_bytes = u32::try_from(len)
                .map_err(|_| Error::at(ErrorKind::SequenceTooLarge { sequence: key, len_bytes: len as u64 }, offset))?;
            seqs.push(seq);
            key += 1;
            pos += len;
            if let Err(e) = r {
                // The parse stops here; the rows after it are listed all the same, as the index lists
                // them.
                while pos < bytes.len() {
                    let ext = &bytes[pos..];
                    let len = memchr::memchr(b'\n', ext).map_or(ext.len(), |k| k + 1);
                    let len_bytes = u32::try_from(len).unwrap_or(u32::MAX);
                    seqs.push(SequenceDesc { key, offset: base + pos as u64, len_bytes, num_samples: 1 });
                    key += 1;
                    pos += len;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Parses a sequence whose bytes are `ext[..len]`; with `one_row`, only its first row (a line-mode
    /// sequence whose end is not known yet: `len` is then where the bytes given end). Returns where the
    /// sequence ended: `len`, or with `one_row` just after the row's `\n` (or `len` without one).
    #[allow(clippy::too_many_arguments)]
    fn parse_sequence(
        &self,
        ext: &[u8],
        len: usize,
        one_row: bool,
        base: u64,
        seq: &SequenceDesc,
        out: &mut ChunkData,
        st: &mut SeqState,
        sink: &mut dyn ErrorSink,
    ) -> Result<usize, Error> {
        for (i, d) in out.streams.iter().enumerate() {
            st.counts[i] = 0;
            st.value_start[i] = d.values.len();
            if let Layout::Sparse { sample_offsets, .. } = &d.layout {
                st.offsets_start[i] = sample_offsets.len();
            }
        }
        let s = &ext[..len];
        let n = s.len();
        let mut p = 0usize;
        while p < n {
            let row_start = p;
            while p < n && s[p].is_ascii_digit() {
                p += 1;
            }
            let mut nread = 0usize;
            let row_ok;
            loop {
                if p >= n {
                    // End of the sequence's bytes without `\n`: the row counts as read (CTF.md §4.1.4).
                    if sink.wants_warnings() {
                        sink.warning(WarningKind::MissingFinalNewline, base + n as u64);
                    }
                    row_ok = true;
                    break;
                }
                let c = s[p];
                if c == b'\n' {
                    p += 1;
                    row_ok = nread > 0;
                    break;
                }
                if c == b'|' {
                    match self.read_sample(ext, n, p + 1, base, seq, out, st, sink)? {
                        Sample::Ok(q) => {
                            nread += 1;
                            p = q;
                        }
                        Sample::Skip(q) => p = skip_to_next(s, q),
                    }
                } else if c == b' ' || is_non_printable(c) {
                    p += 1;
                } else {
                    sink.error(
                        Error::at(ErrorKind::ExpectedNamePrefix { found: c }, base + p as u64).with_sequence(seq.key),
                    )?;
                    p = skip_to_next(s, p);
                }
            }
            if !row_ok {
                sink.error(Error::at(ErrorKind::EmptyRow, base + row_start as u64).with_sequence(seq.key))?;
            }
            if one_row {
                break;
            }
        }
        self.finish_sequence(base, seq, out, st, sink)?;
        Ok(p)
    }

    fn finish_sequence(
        &self,
        base: u64,
        seq: &SequenceDesc,
        out: &mut ChunkData,
        st: &mut SeqState,
        sink: &mut dyn ErrorSink,
    ) -> Result<(), Error> {
        if st.counts.contains(&0) {
            let empty: Vec<String> =
                self.streams.iter().zip(&st.counts).filter(|(_, &c)| c == 0).map(|(s, _)| s.name.clone()).collect();
            sink.fatal(
                Error::at(ErrorKind::EmptyStream { sequence: seq.key, streams: empty }, base).with_sequence(seq.key),
            )?;
            // The sink chose to drop the sequence: undo what was read of it.
            for (i, d) in out.streams.iter_mut().enumerate() {
                d.values.truncate(st.value_start[i]);
                if let Layout::Sparse { indices, sample_offsets } = &mut d.layout {
                    indices.truncate(st.value_start[i]);
                    sample_offsets.truncate(st.offsets_start[i]);
                }
            }
            return Ok(());
        }
        let expected = u64::from(seq.num_samples);
        let mut overall = 0u64;
        let mut too_many = None;
        for (i, info) in self.streams.iter().enumerate() {
            if !info.defines_length {
                continue;
            }
            overall = overall.max(st.counts[i]);
            if st.counts[i] > expected && too_many.is_none() {
                too_many = Some(i);
            }
        }
        if let Some(i) = too_many {
            sink.error(
                Error::at(
                    ErrorKind::TooManySamples {
                        stream: self.streams[i].name.clone(),
                        sequence: seq.key,
                        found: st.counts[i],
                        expected,
                    },
                    base,
                )
                .with_sequence(seq.key),
            )?;
        } else if overall < expected {
            sink.error(
                Error::at(ErrorKind::TooFewSamples { sequence: seq.key, found: overall, expected }, base)
                    .with_sequence(seq.key),
            )?;
        }
        out.keys.push(seq.key);
        out.num_samples.push(seq.num_samples);
        for (d, &c) in out.streams.iter_mut().zip(&st.counts) {
            let last = *d.sequence_offsets.last().unwrap_or(&0);
            d.sequence_offsets.push(last + c);
        }
        Ok(())
    }

    /// Reads `|name values` with `p` just after the `|`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn read_sample(
        &self,
        ext: &[u8],
        n: usize,
        mut p: usize,
        base: u64,
        seq: &SequenceDesc,
        out: &mut ChunkData,
        st: &mut SeqState,
        sink: &mut dyn ErrorSink,
    ) -> Result<Sample, Error> {
        let s = &ext[..n];
        if p < n && s[p] == b'#' {
            return Ok(Sample::Skip(p + 1)); // a comment: skipped to the next `|` or `\n`
        }
        let ns = p;
        p = name_end(ext, n, p);
        let name = &s[ns..p];
        if name.len() > self.max_alias_len {
            if sink.wants_warnings() {
                sink.warning(
                    WarningKind::UnknownInput { name: String::from_utf8_lossy(name).into_owned() },
                    base + ns as u64,
                );
            }
            return Ok(Sample::Skip(p));
        }
        if p >= n {
            sink.error(Error::at(ErrorKind::NameAtEnd, base + ns as u64).with_sequence(seq.key))?;
            return Ok(Sample::Skip(p));
        }
        if name.is_empty() {
            sink.error(Error::at(ErrorKind::EmptyName { found: Some(s[p]) }, base + p as u64).with_sequence(seq.key))?;
            return Ok(Sample::Skip(p));
        }
        let i = match self.lookup(ext, ns, name.len()) {
            Some(i) => i,
            None => {
                if sink.wants_warnings() {
                    sink.warning(
                        WarningKind::UnknownInput { name: String::from_utf8_lossy(name).into_owned() },
                        base + ns as u64,
                    );
                }
                return Ok(Sample::Skip(p));
            }
        };
        let info = &self.streams[i];
        let data = &mut out.streams[i];
        let res = match &mut data.layout {
            Layout::Dense => match &mut data.values {
                Values::F32(v) => read_dense(self.vector, ext, n, p, info.dim, v, |x| x as f32),
                Values::F64(v) => read_dense(self.vector, ext, n, p, info.dim, v, |x| x),
            },
            Layout::Sparse { indices, sample_offsets } => {
                let seq_has_values = data.values.len() > st.value_start[i];
                let r = match &mut data.values {
                    Values::F32(v) => {
                        read_sparse(self.vector, ext, n, p, info.dim, v, indices, seq_has_values, |x| x as f32)
                    }
                    Values::F64(v) => read_sparse(self.vector, ext, n, p, info.dim, v, indices, seq_has_values, |x| x),
                };
                if r.is_ok() {
                    sample_offsets.push(indices.len() as u64);
                }
                r
            }
        };
        match res {
            Ok(done) => {
                st.counts[i] += 1;
                match done.note {
                    DenseNote::None => {}
                    DenseNote::Short(count) => {
                        if sink.wants_warnings() {
                            sink.warning(
                                WarningKind::ShortDenseSample { stream: info.name.clone(), count, dim: info.dim },
                                base + done.end as u64,
                            );
                        }
                    }
                    DenseNote::LongAtEnd(count) => {
                        if sink.wants_warnings() {
                            sink.warning(
                                WarningKind::LongDenseSampleAtEnd { stream: info.name.clone(), count, dim: info.dim },
                                base + done.end as u64,
                            );
                        }
                    }
                }
                Ok(Sample::Ok(done.end))
            }
            Err(fail) => {
                let at = fail.at;
                let kind = fail.into_kind(&info.name, info.dim);
                sink.error(Error::at(kind, base + at as u64).with_sequence(seq.key))?;
                Ok(Sample::Skip(at))
            }
        }
    }
}

/// Per-sequence scratch state.
pub(super) struct SeqState {
    /// Samples read per stream in the current sequence.
    counts: Vec<u64>,
    /// Length of each stream's values at the start of the current sequence.
    value_start: Vec<usize>,
    /// Length of each sparse stream's `sample_offsets` at the start of the current sequence.
    offsets_start: Vec<usize>,
}

impl SeqState {
    fn new(streams: usize) -> SeqState {
        SeqState { counts: vec![0; streams], value_start: vec![0; streams], offsets_start: vec![0; streams] }
    }
}

/// Where the name starting at `p` ends: the first space, `|` or non-printable byte at or after `p`, or
/// `n` (the sequence's end) if there is none before it. Eight bytes at a time while `ext` (the bytes
/// from the sequence's start on, possibly past `n`) has them.
#[inline]
pub(super) fn name_end(ext: &[u8], n: usize, mut p: usize) -> usize {
    const LOW: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const ONES: u64 = 0x0101_0101_0101_0101;
    while p < n {
        let Some(w) = ext.get(p..p + 8) else { break };
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        // Per byte, with no carry between bytes (each sum stays below 0x100): the high bit of
        // `(b & 0x7f) + 0x5f` is set iff `b & 0x7f >= 0x21`, and that of `(x & 0x7f) + 0x7f` iff the
        // low seven bits of `x` are not all zero.
        let below = !((w & LOW) + 0x5f * ONES) & !w & HIGH; // b <= 0x20
        let x = w ^ (u64::from(b'|') * ONES);
        let bar = !(((x & LOW) + LOW) | x) & HIGH; // b == b'|'
        let stop = (w & HIGH) | below | bar; // b >= 0x80, or either of the above
        if stop != 0 {
            return (p + (stop.trailing_zeros() / 8) as usize).min(n);
        }
        p += 8;
    }
    while p < n {
        let c = ext[p];
        if c == b' ' || c == b'|' || is_non_printable(c) {
            break;
        }
        p += 1;
    }
    p.min(n)
}
