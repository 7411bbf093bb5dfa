//! The CTF parser (CTF.md §4–§7): the bytes of whole sequences → columnar [`ChunkData`].
//!
//! Recoverable problems go to an [`ErrorSink`], which decides whether to go on (that is how `maxErrors`
//! works); fatal ones (a stream empty in a sequence) are returned. Positions are absolute byte offsets.

use super::simd::{self, SimdValue};
use super::{cntk_u64, is_non_printable, SequenceDesc};
use crate::data::{ChunkData, Layout, StreamData, Values};
use crate::error::{Error, ErrorKind, WarningKind};
use crate::number::{
    leading_digits, parse_number, parse_number_words, short_digit_run, swar_value, NumberError, NumberErrorKind,
};
use crate::schema::Schema;

/// Receives recoverable errors and warnings while a chunk is parsed.
pub trait ErrorSink {
    /// A counted error. Return `Err` to stop parsing (the error is then returned by the parser).
    fn error(&mut self, e: Error) -> Result<(), Error>;
    /// Whether warnings should be built at all (they cost an allocation each).
    fn wants_warnings(&self) -> bool {
        false
    }
    /// A warning (not counted) at an absolute byte offset.
    fn warning(&mut self, _w: WarningKind, _byte: u64) {}
    /// An error CNTK always treats as fatal (a stream empty in a sequence). Return `Ok` to drop the
    /// sequence and go on (cntkio's `skip_bad_sequences`), `Err` to stop (CNTK's behaviour, the default).
    fn fatal(&mut self, e: Error) -> Result<(), Error> {
        Err(e)
    }
}

/// A sink that fails on the first error (CNTK's default `maxErrors = 0`).
#[derive(Debug, Default)]
pub struct FailFast;

impl ErrorSink for FailFast {
    fn error(&mut self, e: Error) -> Result<(), Error> {
        Err(Error::new(ErrorKind::MaxErrorsReached { max_errors: 0, last: Box::new(e) }))
    }
}

/// A sink that records up to `cap` errors (then stops) and, if asked, warnings.
#[derive(Debug, Default)]
pub struct Collect {
    /// Errors so far, in order.
    pub errors: Vec<Error>,
    /// Warnings so far (when enabled), with their byte offsets.
    pub warnings: Vec<(WarningKind, u64)>,
    /// Stop after this many errors.
    pub cap: usize,
    /// Record warnings.
    pub keep_warnings: bool,
    /// Set when the cap was reached.
    pub capped: bool,
}

impl Collect {
    /// Records up to `cap` errors.
    pub fn new(cap: usize, keep_warnings: bool) -> Collect {
        Collect { cap, keep_warnings, ..Collect::default() }
    }
}

impl ErrorSink for Collect {
    fn error(&mut self, e: Error) -> Result<(), Error> {
        self.errors.push(e);
        if self.errors.len() >= self.cap {
            self.capped = true;
            // The caller looks at `capped`; this value is only a marker.
            return Err(Error::new(ErrorKind::Limit {
                what: "errors recorded in one chunk".into(),
                value: self.errors.len() as u64,
                limit: self.cap as u64,
            }));
        }
        Ok(())
    }
    fn wants_warnings(&self) -> bool {
        self.keep_warnings
    }
    fn warning(&mut self, w: WarningKind, byte: u64) {
        if self.keep_warnings && self.warnings.len() < 10_000 {
            self.warnings.push((w, byte));
        }
    }
}

/// Per-stream lookup data.
#[derive(Debug, Clone)]
struct StreamInfo {
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
fn short_word(bytes: &[u8]) -> Option<u64> {
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
enum Sample {
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
    fn lookup(&self, ext: &[u8], start: usize, len: usize) -> Option<usize> {
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
struct SeqState {
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

#[inline]
fn skip_to_next(s: &[u8], from: usize) -> usize {
    match memchr::memchr2(b'|', b'\n', s.get(from..).unwrap_or(&[])) {
        Some(k) => from + k,
        None => s.len(),
    }
}

#[derive(Debug)]
enum DenseNote {
    None,
    Short(u64),
    LongAtEnd(u64),
}

struct Done {
    end: usize,
    note: DenseNote,
}

enum FailKind {
    Number(NumberError),
    TooMany(u64),
    EmptyDenseAtEnd,
    IndexExpected(Option<u8>),
    IndexOverflow,
    IndexRange(u64),
    Colon(u64, Option<u8>),
    SparseAtEnd,
}

struct Fail {
    at: usize,
    kind: FailKind,
}

impl Fail {
    fn into_kind(self, stream: &str, dim: usize) -> ErrorKind {
        let stream = stream.to_string();
        match self.kind {
            FailKind::Number(e) => match e.kind {
                NumberErrorKind::InvalidStart => ErrorKind::InvalidNumber { stream, found: e.found },
                NumberErrorKind::SignWithoutDigits => ErrorKind::SignWithoutDigits { stream, found: e.found },
                NumberErrorKind::ExponentWithoutDigits => ErrorKind::ExponentWithoutDigits { stream, found: e.found },
            },
            FailKind::TooMany(count) => ErrorKind::DenseTooManyValues { stream, count, dim },
            FailKind::EmptyDenseAtEnd => ErrorKind::EmptyDenseAtEnd { stream },
            FailKind::IndexExpected(found) => ErrorKind::SparseIndexExpected { stream, found },
            FailKind::IndexOverflow => ErrorKind::SparseIndexOverflow { stream },
            FailKind::IndexRange(index) => ErrorKind::SparseIndexOutOfRange { stream, index, dim },
            FailKind::Colon(index, found) => ErrorKind::SparseMissingColon { stream, index, found },
            FailKind::SparseAtEnd => ErrorKind::SparseAtEnd { stream },
        }
    }
}

/// Reads a dense value list starting at `p` (just after the name) in `ext[..n]` (`vector`: the vector
/// path may be used). On failure the values appended for this sample are removed.
#[inline]
fn read_dense<T: SimdValue + Default>(
    vector: Option<simd::Vector>,
    ext: &[u8],
    n: usize,
    mut p: usize,
    dim: usize,
    v: &mut Vec<T>,
    conv: impl Fn(f64) -> T,
) -> Result<Done, Fail> {
    let start = v.len();
    let first = p;
    v.reserve(dim);
    // The common case in bulk; the loop below goes on from where it stops (with everything before
    // read exactly as the loop would have read it).
    p = simd::dense_values(vector, ext, n, p, v);
    p = dense_fast(ext, n, p, v, &conv);
    let s = &ext[..n];
    loop {
        if p >= n {
            // End of the file without a newline (CTF.md §5.1): accepted if it has a value; no dim check in
            // CNTK. cntkio zero-pads a short sample (CNTK delivers zeros from its buffer) and keeps the
            // first `dim` values of a long one (what CNTK's packer reads).
            let cnt = (v.len() - start) as u64;
            if cnt == 0 {
                return Err(Fail { at: p, kind: FailKind::EmptyDenseAtEnd });
            }
            let note = if (cnt as usize) < dim {
                v.resize(start + dim, T::default());
                DenseNote::None
            } else if cnt as usize > dim {
                v.truncate(start + dim);
                DenseNote::LongAtEnd(cnt)
            } else {
                DenseNote::None
            };
            return Ok(Done { end: p, note });
        }
        let c = s[p];
        if c == b' ' || c == b'\t' {
            p += 1;
            continue;
        }
        if c == b'|' || is_non_printable(c) {
            let cnt = (v.len() - start) as u64;
            if cnt as usize > dim {
                v.truncate(start);
                // Point at the first value too many (CNTK reports the end of the sample).
                return Err(Fail { at: nth_number(s, first, dim).unwrap_or(p), kind: FailKind::TooMany(cnt) });
            }
            let note = if (cnt as usize) < dim {
                v.resize(start + dim, T::default());
                DenseNote::Short(cnt)
            } else {
                DenseNote::None
            };
            return Ok(Done { end: p, note });
        }
        match parse_number(s, p) {
            Ok((x, q)) => {
                v.push(conv(x));
                p = q;
            }
            Err(e) => {
                v.truncate(start);
                return Err(Fail { at: e.at, kind: FailKind::Number(e) });
            }
        }
    }
}

/// Bit `i` set iff byte `i` of the window is a value separator (` ` or `\t`).
#[inline(always)]
fn separators(win: &[u8; WINDOW]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        separators_sse2(win)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        separators_swar(win)
    }
}

/// [`separators`] with SSE2 (part of the x86_64 baseline): 16 bytes per compare.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
fn separators_sse2(win: &[u8; WINDOW]) -> u64 {
    use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8};
    let mut m = 0u64;
    for k in 0..WINDOW / 16 {
        // SAFETY: SSE2 is enabled on every x86_64 target; the load reads bytes 16k..16k+16 of the
        // 64-byte array (in bounds), unaligned loads being allowed by `loadu`.
        let bits = unsafe {
            let x = _mm_loadu_si128(win.as_ptr().add(16 * k).cast());
            let sp = _mm_cmpeq_epi8(x, _mm_set1_epi8(b' ' as i8));
            let tab = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\t' as i8));
            _mm_movemask_epi8(_mm_or_si128(sp, tab)) as u32 as u64
        };
        m |= bits << (16 * k);
    }
    m
}

/// [`separators`] in portable code (SWAR, 8 bytes at a time).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
#[inline(always)]
fn separators_swar(win: &[u8; WINDOW]) -> u64 {
    const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut m = 0u64;
    for k in 0..WINDOW / 8 {
        let x = u64::from_le_bytes(win[8 * k..8 * k + 8].try_into().expect("8 bytes"));
        // Exact per-byte zero tests (no borrows between bytes): the high bit of `(b & 0x7f) + 0x7f | b`
        // is set iff b != 0.
        let t1 = x ^ 0x2020_2020_2020_2020;
        let t2 = x ^ 0x0909_0909_0909_0909;
        let nz1 = ((t1 & LO7) + LO7) | t1;
        let nz2 = ((t2 & LO7) + LO7) | t2;
        let hi = !(nz1 & nz2) & HI;
        // Gather the 8 high bits (byte i → bit i); the partial products never overlap.
        m |= (hi.wrapping_mul(0x0002_0408_1020_4081) >> 56) << (8 * k);
    }
    m
}

/// Bytes classified at once by the fast paths.
const WINDOW: usize = 64;

/// `c` separates values (` ` or `\t`).
#[inline(always)]
fn is_sep(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

/// Most values a window can hold (a value and its separator take at least two bytes).
const PER_WINDOW: usize = WINDOW / 2;

/// The windows of a value list, for the fast paths.
///
/// The value starts of a 64-byte window come from its separator mask (a value starts at a non-separator
/// after a separator), so the numbers of a window are converted independently of each other (no serial
/// dependency on where the previous one ended) into a small buffer that is appended once per window.
/// A number is taken only when it ends at a separator before the sequence's end (`n`); then the next
/// start is the next value's start. Anything else (a `|` or control byte, a malformed number, a number
/// ending on something else, the sequence's end, fewer than 64 readable bytes) stops the fast path at
/// the position where the careful loop must go on; everything before it was read exactly as the careful
/// loop reads it.
///
/// Bytes past `n` (the sequence's end) are only classified and read by the number parser while it
/// finds the end of a number; a number is taken only if it ends before `n`, and then its value depends
/// only on its own bytes and the one that ended it.
struct Windows {
    /// Start of the current window.
    p: usize,
    /// Bit 0: the byte before `p` is a separator (or `p` is where the value list starts).
    carry: u64,
    /// End of the last number taken (starts before it are inside it).
    last: usize,
}

impl Windows {
    fn new(p: usize) -> Windows {
        Windows { p, carry: 1, last: p }
    }

    /// The next window's separator mask and value starts; `Err(position)` when the fast path stops.
    #[inline(always)]
    fn next(&mut self, ext: &[u8], n: usize) -> Result<(u64, u64), usize> {
        let p = self.p;
        let resume = p.max(self.last);
        if p >= n {
            return Err(resume);
        }
        let win = ext.get(p..p + WINDOW).ok_or(resume)?;
        let skip = self.last.saturating_sub(p);
        if skip >= WINDOW {
            // A number longer than a window: left to the careful loop.
            return Err(resume);
        }
        let valid = if n - p < WINDOW { (1u64 << (n - p)) - 1 } else { !0 };
        let sep = separators(win.try_into().expect("a window")) & valid;
        let starts = !sep & ((sep << 1) | self.carry) & valid & (!0u64 << skip);
        self.carry = sep >> (WINDOW - 1);
        Ok((sep, starts))
    }

    /// After the window: `Err(position)` if the value list ended in it.
    #[inline(always)]
    fn advance(&mut self, n: usize) -> Result<(), usize> {
        if n - self.p <= WINDOW {
            // Only separators after the last value (or the last value's end is the stop).
            return Err(n.max(self.last));
        }
        self.p += WINDOW;
        Ok(())
    }
}

/// Values buffered by [`dense_fast`] before they are appended (appending once per window would cost
/// a `memcpy` call per window).
const DENSE_BUF: usize = 128;

#[inline(always)]
fn dense_fast<T: Copy + Default>(ext: &[u8], n: usize, p: usize, v: &mut Vec<T>, conv: &impl Fn(f64) -> T) -> usize {
    let mut buf = [T::default(); DENSE_BUF];
    let mut cnt = 0usize;
    let mut w = Windows::new(p);
    loop {
        if cnt > DENSE_BUF - PER_WINDOW {
            v.extend_from_slice(&buf[..cnt]);
            cnt = 0;
        }
        if let Some(at) = dense_window(ext, n, &mut w, &mut buf, &mut cnt, conv) {
            v.extend_from_slice(&buf[..cnt]);
            return at;
        }
    }
}

/// One window of [`dense_fast`]: appends its values to `buf[cnt..]` (room for a window is left) and
/// says where the fast path stops, if it does.
#[inline(always)]
fn dense_window<T>(
    ext: &[u8],
    n: usize,
    w: &mut Windows,
    buf: &mut [T; DENSE_BUF],
    cnt: &mut usize,
    conv: &impl Fn(f64) -> T,
) -> Option<usize> {
    let mut starts = match w.next(ext, n) {
        Ok((_, starts)) => starts,
        Err(at) => return Some(at),
    };
    while starts != 0 {
        let a = w.p + starts.trailing_zeros() as usize;
        starts &= starts - 1;
        // A `|` or control byte fails as a number too.
        let (x, q) = match parse_number_words(ext, a) {
            Ok(r) => r,
            Err(_) => return Some(a),
        };
        if q >= n {
            return Some(a);
        }
        buf[*cnt % DENSE_BUF] = conv(x);
        *cnt += 1;
        w.last = q;
        if !is_sep(ext[q]) {
            // Ended by something else than a separator: the careful loop looks at it.
            return Some(q);
        }
    }
    w.advance(n).err()
}

/// Where the `k`-th (0-based) number of a value list starting at `p` begins (the list is known to be
/// well formed up to there).
fn nth_number(s: &[u8], mut p: usize, k: usize) -> Option<usize> {
    let mut seen = 0;
    loop {
        while matches!(s.get(p), Some(b' ' | b'\t')) {
            p += 1;
        }
        if seen == k {
            return Some(p);
        }
        p = parse_number(s, p).ok()?.1;
        seen += 1;
    }
}

/// Reads a sparse entry list starting at `p` in `ext[..n]` (the vector path also looks at bytes after
/// `n`, but takes nothing from them). `seq_has_values`: this stream already has entries in the current
/// sequence (CNTK's end-of-file rule, CTF.md §5.2). `vector`: the vector path may be used.
#[inline]
#[allow(clippy::too_many_arguments)]
fn read_sparse<T: SimdValue>(
    vector: Option<simd::Vector>,
    ext: &[u8],
    n: usize,
    mut p: usize,
    dim: usize,
    v: &mut Vec<T>,
    idx: &mut Vec<i32>,
    seq_has_values: bool,
    conv: impl Fn(f64) -> T,
) -> Result<Done, Fail> {
    let start = v.len();
    let s = &ext[..n];
    let fail = |v: &mut Vec<T>, idx: &mut Vec<i32>, at, kind| {
        v.truncate(start);
        idx.truncate(start);
        Err(Fail { at, kind })
    };
    loop {
        if p >= n {
            if seq_has_values || v.len() > start {
                return Ok(Done { end: p, note: DenseNote::None });
            }
            return fail(v, idx, p, FailKind::SparseAtEnd);
        }
        let c = s[p];
        if c == b' ' || c == b'\t' {
            p += 1;
            continue;
        }
        if c == b'|' || is_non_printable(c) {
            return Ok(Done { end: p, note: DenseNote::None });
        }
        if !c.is_ascii_digit() {
            return fail(v, idx, p, FailKind::IndexExpected(Some(c)));
        }
        // A row's last entry alone (`index:d\n`, as a row's single label usually is) goes straight to the
        // scalar loop: the vector path would set up and read a window only to stop at the `\n`.
        let q = if ends_row(s, p) { p } else { simd::sparse_entries(vector, ext, n, p, dim, v, idx) };
        let q = sparse_run(s, q, dim, v, idx, &conv);
        if q != p {
            p = q;
            continue;
        }
        let (index, q) = match short_digit_run(s, p) {
            Some(r) => r,
            None => match cntk_u64(s, p) {
                Ok(r) => r,
                Err(at) => return fail(v, idx, at, FailKind::IndexOverflow),
            },
        };
        if q >= n {
            return fail(v, idx, q, FailKind::SparseAtEnd);
        }
        if index >= dim as u64 {
            return fail(v, idx, p, FailKind::IndexRange(index));
        }
        if s[q] != b':' {
            return fail(v, idx, q, FailKind::Colon(index, Some(s[q])));
        }
        match parse_number(s, q + 1) {
            Ok((x, r)) => {
                v.push(conv(x));
                idx.push(index as i32);
                p = r;
            }
            Err(e) => return fail(v, idx, e.at, FailKind::Number(e)),
        }
    }
}

/// Whether the entry at `p` looks like `index:d\n` (1–7 index digits, then the row's end two bytes after
/// the colon's place): a hint, which path reads the entry does not change what is read.
#[inline(always)]
fn ends_row(s: &[u8], p: usize) -> bool {
    let Some(b) = s.get(p..p + 16) else { return false };
    let l = leading_digits(u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))) as usize;
    l < 8 && b[l + 2] == b'\n'
}

/// The common sparse entry `index:d ` (an index of 1–7 digits, a one-digit value, one space; or the
/// `\n` that ends the row instead of the space, as the last label of a row often is) in a tight loop,
/// from `p` (a digit) on, while 16 bytes of the sequence remain. Returns where it stopped: at the `\n`
/// after a row's last entry, or at the first entry of another form (or too close to the end), which the
/// careful loop of [`read_sparse`] then reads. Every entry taken reads as that loop reads it: the index
/// as [`short_digit_run`] (below `dim`), the value as [`parse_number`] reads a digit followed by a space
/// or a `\n`.
#[inline(always)]
fn sparse_run<T: Copy>(
    s: &[u8],
    mut p: usize,
    dim: usize,
    v: &mut Vec<T>,
    idx: &mut Vec<i32>,
    conv: &impl Fn(f64) -> T,
) -> usize {
    while let Some(b) = s.get(p..p + 16) {
        let b: &[u8; 16] = b.try_into().expect("16 bytes");
        let word = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        let len = leading_digits(word);
        if len == 0 || len == 8 {
            break;
        }
        let l = len as usize;
        let d = b[l + 1].wrapping_sub(b'0');
        let end = b[l + 2];
        if b[l] != b':' || d > 9 || (end != b' ' && end != b'\n') {
            break;
        }
        let index = swar_value(word, len);
        if index >= dim as u64 {
            break;
        }
        v.push(conv(f64::from(d)));
        idx.push(index as i32);
        if end == b'\n' {
            // The row's last entry: the caller sees its end.
            return p + l + 2;
        }
        p += l + 3;
    }
    p
}

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

/// Where the name starting at `p` ends: the first space, `|` or non-printable byte at or after `p`, or
/// `n` (the sequence's end) if there is none before it. Eight bytes at a time while `ext` (the bytes
/// from the sequence's start on, possibly past `n`) has them.
#[inline]
fn name_end(ext: &[u8], n: usize, mut p: usize) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;
    use crate::{ElementType, StorageFormat, StreamSpec};

    /// A small deterministic generator for the tests below.
    /// One sparse entry, mostly of the common form `index:d ` (which the fast paths take: an index
    /// below `dim` of at most 7 digits, some with leading zeros), else (`bad`: one in `bad` entries)
    /// one of the forms that must stop them at exactly that entry.
    fn sparse_entry(r: &mut Rng, out: &mut Vec<u8>, bad: u64, dim: usize) {
        let digits = |r: &mut Rng, out: &mut Vec<u8>, n: u64| {
            for _ in 0..n {
                out.push(b'0' + r.below(10) as u8);
            }
        };
        let index = |r: &mut Rng, out: &mut Vec<u8>| {
            let i = r.below(dim.min(10_000_000) as u64).to_string();
            let width = if r.below(8) == 0 { 1 + r.below(7) as usize } else { 0 };
            out.extend_from_slice(format!("{i:0>width$}").as_bytes());
        };
        let common = |r: &mut Rng, out: &mut Vec<u8>| {
            index(r, out);
            out.push(b':');
            digits(r, out, 1);
        };
        let form = if r.below(bad) == 0 { r.below(8) } else { 99 };
        match form {
            0 => {
                let n = 8 + r.below(3);
                digits(r, out, n); // too long an index for the fast paths
                out.extend_from_slice(b":1");
            }
            1 => {
                common(r, out);
                let n = 1 + r.below(2);
                digits(r, out, n); // a longer value
            }
            2 => {
                index(r, out);
                out.extend_from_slice(
                    [&b":-1"[..], b":1.5", b":.5", b":1e3", b"::1", b":", b":a", b":+2"][r.below(8) as usize],
                );
            }
            3 => index(r, out), // no colon
            4 => out.extend_from_slice([&b":1"[..], b"", b"x:1", b"1x:1", b"1:1:1", b"12\r:3"][r.below(6) as usize]),
            5 => {
                // Another end than one space.
                common(r, out);
                out.push([b'\t', b' ', b'|', b'\r', 0x80][r.below(5) as usize]);
            }
            // Out of range, and the last index.
            6 => out.extend_from_slice(format!("{}:1", dim + r.below(2) as usize).as_bytes()),
            7 => out.extend_from_slice(format!("{}:1", dim - 1).as_bytes()),
            _ => common(r, out),
        }
        out.push(b' ');
    }

    /// With `CNTKIO_EXPECT_SIMD` set (by `scripts/test.sh` on processors with AVX-512), the vector
    /// paths must be available: the comparisons below would otherwise test nothing new.
    fn expect_vector_paths() {
        if std::env::var_os("CNTKIO_EXPECT_SIMD").is_some() {
            assert!(simd::available().is_some(), "AVX-512 is expected but the vector paths are not available");
        }
    }

    /// Parses `data` with and without the vector paths, as rows and as indexed sequences, and asserts
    /// the same data, errors, warnings and outcome. Returns how many values the rows gave.
    fn vector_agrees(schema: &Schema, data: &[u8], case: usize) -> usize {
        expect_vector_paths();
        let run = |vector: bool, rows: bool| {
            let mut parser = CtfParser::new(schema);
            parser.set_vector_paths(vector);
            let mut out = ChunkData::new(schema);
            let mut sink = Collect::new(usize::MAX, true);
            let res = if rows {
                let mut seqs = Vec::new();
                parser.parse_rows(data, 0, 0, &mut seqs, &mut out, &mut sink).map(|_| format!("{seqs:?}"))
            } else {
                crate::ctf::index::index_bytes(data, false, None, u64::MAX).and_then(|chunks| {
                    for c in &chunks {
                        parser.parse_sequences(data, 0, &c.sequences, &mut out, &mut sink)?;
                    }
                    Ok(String::new())
                })
            };
            (format!("{res:?}"), out, format!("{:?} {:?}", sink.errors, sink.warnings))
        };
        for rows in [true, false] {
            let scalar = run(false, rows);
            let vector = run(true, rows);
            assert_eq!(vector, scalar, "case {case} rows {rows}: {:?}", String::from_utf8_lossy(data));
            // What the CBF writer trusts in parsed data (`check_parsed_chunk_fast`): every sparse index
            // kept is below the stream's dimension, whatever errors were tolerated around it.
            for d in &vector.1.streams {
                if let crate::Layout::Sparse { indices, sample_offsets } = &d.layout {
                    let used = sample_offsets.last().copied().unwrap_or(0) as usize;
                    assert!(
                        indices[..used].iter().all(|&x| x >= 0 && (x as usize) < d.dim),
                        "case {case} rows {rows}: a sparse index out of range was kept"
                    );
                }
            }
        }
        run(true, true).1.streams.iter().map(|d| d.values.len()).sum()
    }

    /// Random sparse rows (2 streams, dims from 1 to 2^31 - 1, long runs of common entries
    /// with every form that stops the fast paths mixed in, at every offset of a window), parsed with
    /// and without the vector paths, as rows and as indexed sequences, in f32 and f64: the same data,
    /// errors and outcome. (Where the processor lacks AVX-512 both runs take the scalar paths.)
    /// The word-at-a-time name scan stops where the byte loop does, for every byte value, start and
    /// sequence end, near and far from the end of the bytes.
    #[test]
    fn name_end_finds_the_byte_loops_end() {
        let byte_loop = |ext: &[u8], n: usize, mut p: usize| {
            while p < n && !(ext[p] == b' ' || ext[p] == b'|' || is_non_printable(ext[p])) {
                p += 1;
            }
            p
        };
        // Every byte value at every position of a word.
        for b in 0..=255u8 {
            for at in 0..12 {
                let mut ext = vec![b'a'; 20];
                ext[at] = b;
                for n in [ext.len(), 9, 3] {
                    for p in 0..n.min(5) {
                        assert_eq!(name_end(&ext, n, p), byte_loop(&ext, n, p), "byte {b:#x} at {at}, n {n}, p {p}");
                    }
                }
            }
        }
        let mut r = Rng(0x5DEE_CE66_D1CE_4E5B);
        for _ in 0..20_000 {
            let len = r.below(40) as usize + 1;
            // Mostly name bytes, some stops.
            let ext: Vec<u8> = (0..len)
                .map(|_| if r.below(10) == 0 { r.below(256) as u8 } else { b'a' + r.below(26) as u8 })
                .collect();
            let n = r.below(len as u64 + 1) as usize;
            let p = r.below(n as u64 + 1) as usize;
            assert_eq!(name_end(&ext, n, p), byte_loop(&ext, n, p), "{ext:?} n {n} p {p}");
        }
    }

    #[test]
    fn vector_paths_read_as_the_scalar_paths() {
        let mut r = Rng(0x2545_F491_4F6C_DD1D);
        let mut vector_entries = 0usize;
        for case in 0..1000 {
            let dims = [1usize, 7, 10, 100, 1000, 54321, 100_000, 9_999_999, 10_000_000, (1 << 31) - 1];
            let (dx, dy) = (dims[r.below(10) as usize], dims[r.below(10) as usize]);
            // An error drops a row's sample, which leaves its stream empty in the sequence: fatal. So
            // a case ends at its first error, and most entries must be good for the cases to be long.
            let bad = [10, 300, 3000, u64::MAX][r.below(4) as usize];
            let elem = if case % 2 == 0 { ElementType::F32 } else { ElementType::F64 };
            let schema = Schema::new(vec![
                StreamSpec::new("x", dx, StorageFormat::Sparse).element_type(elem),
                StreamSpec::new("y", dy, StorageFormat::Sparse).element_type(elem),
            ])
            .expect("a schema");
            let mut data = Vec::new();
            for _ in 0..1 + r.below(20) {
                if r.below(4) == 0 {
                    data.extend_from_slice(b"7 ");
                }
                for (name, dim) in [(&b"|x"[..], dx), (b"|y", dy)] {
                    if r.below(200) == 0 {
                        continue; // a stream without samples in a sequence is fatal
                    }
                    data.extend_from_slice(name);
                    data.push(b' ');
                    let most = if r.below(3) == 0 { 3 } else { 60 };
                    for _ in 0..1 + r.below(most) {
                        sparse_entry(&mut r, &mut data, bad, dim);
                    }
                    if r.below(2) == 0 {
                        data.pop(); // the sample's last entry ends at `|` or `\n`
                    }
                }
                data.push(b'\n');
            }
            if r.below(3) == 0 {
                data.pop();
            }
            vector_entries += vector_agrees(&schema, &data, case);
        }
        assert!(vector_entries > 10_000, "the cases must hold many entries ({vector_entries})");
    }

    /// `read_sparse` with and without the vector path on entry lists cut at every length `n` (bytes
    /// after `n` are still there, as after a sequence inside a chunk): the same result, values and
    /// indices. The vector path must take nothing that ends at or past `n`.
    #[test]
    fn vector_path_stops_at_the_end_given() {
        expect_vector_paths();
        let mut r = Rng(0x9E37_79B9_7F4A_7C15);
        let mut taken = 0usize;
        for _ in 0..200 {
            let dim = [10usize, 100_000, 10_000_000][r.below(3) as usize];
            let bad = [20, 1000][r.below(2) as usize];
            let mut ext = Vec::new();
            for _ in 0..1 + r.below(40) {
                sparse_entry(&mut r, &mut ext, bad, dim);
            }
            ext.extend_from_slice(b"12:1 34:5 |y 1:1\n");
            for n in 1..=ext.len() {
                let read = |vector: bool| {
                    let (mut v, mut idx) = (Vec::<f32>::new(), Vec::new());
                    let vector = if vector { simd::available() } else { None };
                    let res = read_sparse(vector, &ext, n, 0, dim, &mut v, &mut idx, false, |x| x as f32);
                    let res = res.map(|d| d.end).map_err(|f| (f.at, format!("{:?}", f.into_kind("x", dim))));
                    (res, v, idx)
                };
                let vector = read(true);
                assert_eq!(vector, read(false), "n {n}: {:?}", String::from_utf8_lossy(&ext));
                taken += vector.1.len();
            }
        }
        assert!(taken > 100_000, "the lists must hold many entries ({taken})");
    }

    /// One dense value, mostly of the common forms the fast paths take (an optional sign, 1–7 integer
    /// digits, optionally `.` and 1–7 fraction digits), else (one in `bad`) one that must stop them at
    /// exactly that value; then one or more separators.
    fn dense_value(r: &mut Rng, out: &mut Vec<u8>, bad: u64) {
        let digits = |r: &mut Rng, out: &mut Vec<u8>, n: u64| {
            for _ in 0..n {
                out.push(b'0' + r.below(10) as u8);
            }
        };
        let common = |r: &mut Rng, out: &mut Vec<u8>| {
            match r.below(6) {
                0 => out.push(b'-'),
                1 if r.below(4) == 0 => out.push(b'+'),
                _ => {}
            }
            let n = 1 + r.below(7);
            digits(r, out, n);
            if r.below(5) != 0 {
                out.push(b'.');
                let n = 1 + r.below(7);
                digits(r, out, n);
            }
        };
        let form = if r.below(bad) == 0 { r.below(10) } else { 99 };
        match form {
            0 => {
                // Too many digits in a part.
                let (int, frac) =
                    if r.below(2) == 0 { (8 + r.below(3), r.below(9)) } else { (1 + r.below(7), 8 + r.below(3)) };
                digits(r, out, int);
                if frac > 0 {
                    out.push(b'.');
                    digits(r, out, frac);
                }
            }
            1 => {
                common(r, out);
                out.extend_from_slice([&b"e5"[..], b"E-3", b".", b".5", b"x", b"-"][r.below(6) as usize]);
            }
            2 => out.extend_from_slice(
                [&b"."[..], b"-", b"+", b".5", b"-.5", b"5.", b"-0", b"--1", b"1..2", b"nan"][r.below(10) as usize],
            ),
            3 => {
                common(r, out);
                out.push([b'|', b'\r', 0x80, b':'][r.below(4) as usize]);
            }
            4 => {
                // Longest common forms.
                out.push(b'-');
                digits(r, out, 7);
                out.push(b'.');
                digits(r, out, 7);
            }
            _ => common(r, out),
        }
        for _ in 0..if r.below(8) == 0 { 1 + r.below(3) } else { 1 } {
            out.push(if r.below(10) == 0 { b'\t' } else { b' ' });
        }
    }

    /// Random dense rows (2 streams, dims below, at and above the values given, so with short and
    /// long samples), parsed with and without the vector paths, as rows and as indexed sequences, in
    /// f32 and f64: the same data, errors, warnings and outcome.
    #[test]
    fn dense_vector_path_reads_as_the_scalar_paths() {
        let mut r = Rng(0x1234_5678_9ABC_DEF1);
        let mut entries = 0usize;
        for case in 0..1000 {
            let counts = [1 + r.below(40), 1 + r.below(150)];
            let dims = [counts[0] as usize, (counts[1] as usize + r.below(3) as usize).saturating_sub(1).max(1)];
            let elem = if case % 2 == 0 { ElementType::F32 } else { ElementType::F64 };
            let schema = Schema::new(vec![
                StreamSpec::new("x", dims[0], StorageFormat::Dense).element_type(elem),
                StreamSpec::new("y", dims[1], StorageFormat::Dense).element_type(elem),
            ])
            .expect("a schema");
            let bad = [10, 300, 3000, u64::MAX][r.below(4) as usize];
            let mut data = Vec::new();
            for _ in 0..1 + r.below(20) {
                for (name, count) in [(&b"|x"[..], counts[0]), (b"|y", counts[1])] {
                    data.extend_from_slice(name);
                    data.push(b' ');
                    for _ in 0..count {
                        dense_value(&mut r, &mut data, bad);
                    }
                    if r.below(2) == 0 {
                        data.pop(); // the sample's last value ends at `|` or `\n`
                    }
                }
                data.push(b'\n');
            }
            entries += vector_agrees(&schema, &data, case);
        }
        assert!(entries > 100_000, "the cases must hold many values ({entries})");
    }

    /// `read_dense` with and without the vector path on value lists cut at every length `n`: the same
    /// result and values. The vector path must take nothing that ends at or past `n`.
    #[test]
    fn dense_vector_path_stops_at_the_end_given() {
        expect_vector_paths();
        let mut r = Rng(0x0F1E_2D3C_4B5A_6978);
        let mut taken = 0usize;
        for _ in 0..150 {
            let bad = [20, 1000][r.below(2) as usize];
            let mut ext = Vec::new();
            for _ in 0..1 + r.below(40) {
                dense_value(&mut r, &mut ext, bad);
            }
            ext.extend_from_slice(b"1.5 -2 |y 1\n");
            let dim = 1 + r.below(45) as usize;
            for n in 1..=ext.len() {
                let read = |vector: bool| {
                    let mut v = Vec::<f64>::new();
                    let vector = if vector { simd::available() } else { None };
                    let res = read_dense(vector, &ext, n, 0, dim, &mut v, |x| x);
                    let res = res.map(|d| (d.end, format!("{:?}", d.note)));
                    let res = res.map_err(|f| (f.at, format!("{:?}", f.into_kind("x", dim))));
                    (res, v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                };
                let vector = read(true);
                assert_eq!(vector, read(false), "n {n} dim {dim}: {:?}", String::from_utf8_lossy(&ext));
                taken += vector.1.len();
            }
        }
        assert!(taken > 100_000, "the lists must hold many values ({taken})");
    }

    /// Stream names found by word (up to 8 bytes, read with what follows) and by slice: every alias
    /// and every prefix and extension of one, at the end of the bytes and before more bytes.
    #[test]
    fn lookup_by_word_and_by_slice() {
        let aliases = ["a", "ab", "abcdefg", "abcdefgh", "abcdefghi", "features", "x.y", "0"];
        let schema = Schema::new(
            aliases
                .iter()
                .enumerate()
                .map(|(i, a)| StreamSpec::new(format!("s{i}"), 1, StorageFormat::Dense).alias(*a))
                .collect(),
        )
        .expect("a schema");
        let parser = CtfParser::new(&schema);
        let mut names: Vec<Vec<u8>> = aliases.iter().map(|a| a.as_bytes().to_vec()).collect();
        for a in aliases {
            let b = a.as_bytes();
            names.push(b[..b.len() - 1].to_vec());
            names.push([b, b"z"].concat());
            names.push([b"z", b].concat());
        }
        for name in &names {
            let want = aliases.iter().position(|a| a.as_bytes() == &name[..]);
            for after in [&b""[..], b" ", b"abcdefghijklmnop", b"\0\0\0\0\0\0\0\0"] {
                let ext = [&b"|"[..], name, after].concat();
                assert_eq!(parser.lookup(&ext, 1, name.len()), want, "{name:?} then {after:?}");
            }
        }
    }

    /// The separator masks (SIMD and portable) against a byte loop, on every byte value in every place
    /// and on pseudo-random windows.
    #[test]
    fn separator_masks() {
        let naive = |w: &[u8; WINDOW]| (0..WINDOW).fold(0u64, |m, i| m | (u64::from(is_sep(w[i])) << i));
        let mut windows = Vec::new();
        for b in 0..=255u8 {
            for at in [0, 7, 8, 15, 16, 31, 32, 63] {
                let mut w = [b'1'; WINDOW];
                w[at] = b;
                windows.push(w);
                let mut w = [b' '; WINDOW];
                w[at] = b;
                windows.push(w);
            }
        }
        let mut r = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2000 {
            let mut w = [0u8; WINDOW];
            for c in w.iter_mut() {
                *c = [b' ', b'\t', b'1', b'.', b'|', b'\n', 0x89, 0xa0, 0x20 | 0x80, 0x09 | 0x80][r.below(10) as usize];
            }
            windows.push(w);
        }
        for w in &windows {
            assert_eq!(separators(w), naive(w), "{w:?}");
            assert_eq!(separators_swar(w), naive(w), "{w:?}");
        }
    }
}
