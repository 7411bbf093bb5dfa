//! The CTF writer: [`ChunkData`] → CNTK Text Format that CNTK's reader (and [`super::parse`]) reads back
//! as the same sequences, samples and value bits.
//!
//! Layout: one row per sample index of a sequence, every row starting with the sequence's key,
//! `key |alias v v v |alias i:v i:v`, `\n`-terminated. Row `r` of a sequence holds sample `r` of every
//! stream that has more than `r` samples in it (a stream with fewer samples is simply absent from
//! later rows). Dense samples are written in full (`dim` values); an empty sparse sample is written as
//! `|alias` with nothing after it (CNTK reads that as a sample without entries). Sparse entries keep
//! their order. Streams appear on a row in schema order.
//!
//! What the reader gets back: the same keys, samples, indices and value bits. The declared length of
//! a sequence ([`ChunkData::num_samples`]) is *not* written — CTF has no field for it: the reader
//! recomputes it as the number of rows (= the longest stream), or, with a `definesMBSize` stream, as
//! that stream's row count.
//!
//! Numbers: CNTK's parser is not correctly rounded ([`crate::number`]), so the shortest decimal (ryu)
//! does not always read back as the same bits. Every number is therefore checked with
//! [`parse_number`] (then `as f32` for float streams) and, if it does not come back, other texts are
//! tried — more digits, other decimal-point positions and exponents, and finally a binary search over
//! the last digits of a fixed-width form — until one does. Infinities are written as `1e400` / `-1e400`
//! (CNTK's parser overflows to ±inf). A NaN is written as `0e400` or `-0e400` only if its bits are
//! exactly the NaN those produce; any other NaN is an error naming the stream and sequence.
//!
//! ```
//! use cntkio_core::ctf::{parse::{parse_bytes, FailFast}, write::write_chunk};
//! use cntkio_core::{Schema, StreamSpec, StorageFormat};
//! let schema = Schema::new(vec![
//!     StreamSpec::new("features", 2, StorageFormat::Dense).alias("x"),
//!     StreamSpec::new("labels", 4, StorageFormat::Sparse).alias("y"),
//! ]).unwrap();
//! let data = parse_bytes(b"7 |x 0.1 2 |y 3:1\n7 |x -1e-7 3\n", &schema, false, &mut FailFast).unwrap();
//! let mut text = Vec::new();
//! write_chunk(&data, &schema, &mut text).unwrap();
//! assert_eq!(text, b"7 |x 0.1 2 |y 3:1\n7 |x -0.0000001 3\n");
//! assert_eq!(parse_bytes(&text, &schema, false, &mut FailFast).unwrap(), data);
//! ```

use crate::data::{ChunkData, Layout, StreamData, Values};
use crate::error::{Error, ErrorKind};
use crate::number::parse_number;
use crate::schema::Schema;
use std::cmp::Ordering;
use std::io::Write as _;

/// A value that has no CTF text CNTK reads back as the same bits (a NaN other than the one `0e400`
/// produces; in theory a finite value for which every candidate text failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unrepresentable;

/// Appends a text of `x` that CNTK's parser reads back as exactly `x` (for a `double` stream).
pub(crate) fn format_f64(x: f64, out: &mut Vec<u8>) -> Result<(), Unrepresentable> {
    format_with(x, &T64(x.abs()), |v| v.to_bits() == x.to_bits(), out)
}

/// Appends a text of `x` that CNTK's parser, followed by the conversion to `float`, reads back as
/// exactly `x` (for a `float` stream).
pub(crate) fn format_f32(x: f32, out: &mut Vec<u8>) -> Result<(), Unrepresentable> {
    format_with(f64::from(x), &T32(x.abs()), |v| (v as f32).to_bits() == x.to_bits(), out)
}

/// How a parsed double compares with the (positive) target, after the stream's conversion.
trait Target {
    fn cmp(&self, parsed: f64) -> Ordering;
    /// Shortest decimal digits of the target, ryu style.
    fn shortest_str<'b>(&self, buf: &'b mut ryu::Buffer) -> &'b str;
    /// [`Target::shortest_str`], owned.
    fn shortest(&self, buf: &mut ryu::Buffer) -> String {
        self.shortest_str(buf).to_string()
    }
}

struct T64(f64);
impl Target for T64 {
    fn cmp(&self, p: f64) -> Ordering {
        p.partial_cmp(&self.0).unwrap_or(Ordering::Greater)
    }
    fn shortest_str<'b>(&self, buf: &'b mut ryu::Buffer) -> &'b str {
        buf.format_finite(self.0)
    }
}

struct T32(f32);
impl Target for T32 {
    fn cmp(&self, p: f64) -> Ordering {
        (p as f32).partial_cmp(&self.0).unwrap_or(Ordering::Greater)
    }
    fn shortest_str<'b>(&self, buf: &'b mut ryu::Buffer) -> &'b str {
        buf.format_finite(self.0)
    }
}

/// The whole of `s` as one CNTK number, or `None`.
fn parse_all(s: &[u8]) -> Option<f64> {
    match parse_number(s, 0) {
        Ok((v, end)) if end == s.len() => Some(v),
        _ => None,
    }
}

fn format_with(x: f64, t: &impl Target, exact: impl Fn(f64) -> bool, out: &mut Vec<u8>) -> Result<(), Unrepresentable> {
    let start = out.len();
    let special: Option<&[u8]> = if x == 0.0 {
        Some(if x.is_sign_negative() { b"-0" } else { b"0" })
    } else if x.is_infinite() {
        Some(if x > 0.0 { b"1e400" } else { b"-1e400" })
    } else if x.is_nan() {
        [&b"0e400"[..], b"-0e400"].into_iter().find(|s| parse_all(s).is_some_and(&exact))
    } else {
        None
    };
    if let Some(s) = special {
        if parse_all(s).is_some_and(&exact) {
            out.extend_from_slice(s);
            return Ok(());
        }
        return Err(Unrepresentable);
    }
    if x.is_nan() {
        return Err(Unrepresentable);
    }
    if x < 0.0 {
        out.push(b'-');
    }
    let body = out.len();
    if fast_text(x.abs(), t, out) {
        // For a positive value the fast path has already read back this very text (`exact` and the
        // target's comparison agree on nonzero finite values).
        if x > 0.0 || parse_all(&out[start..]).is_some_and(&exact) {
            return Ok(());
        }
    } else if find_text(x.abs(), t, out) && parse_all(&out[start..]).is_some_and(&exact) {
        return Ok(());
    }
    // The sign is symmetric in CNTK's arithmetic, so this is not expected; stay safe anyway.
    out.truncate(body);
    out.truncate(start);
    Err(Unrepresentable)
}

/// Decimal digits (ASCII, no leading or trailing zeros) and the scientific exponent:
/// value = `d1.d2d3… × 10^exp`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dec {
    digits: Vec<u8>,
    exp: i32,
}

/// Reads a decimal as Rust or ryu print it (`123.45`, `1e-7`, `1.5e300`, `1.25e-7`), without sign.
fn dec_from(s: &str) -> Option<Dec> {
    let s = s.strip_prefix('-').unwrap_or(s);
    let (m, e) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = match m.find('.') {
        Some(i) => (&m[..i], &m[i + 1..]),
        None => (m, ""),
    };
    let mut pos = int.len() as i32 + e;
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    let lead = digits.iter().take_while(|&&c| c == b'0').count();
    digits.drain(..lead);
    pos -= lead as i32;
    while digits.last() == Some(&b'0') {
        digits.pop();
    }
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(Dec { digits, exp: pos - 1 })
}

/// `0.000123`, `123.45`, `12300`.
fn render_positional(d: &Dec, out: &mut Vec<u8>) {
    let n = d.digits.len();
    if d.exp >= 0 {
        let int_len = d.exp as usize + 1;
        if n <= int_len {
            out.extend_from_slice(&d.digits);
            out.resize(out.len() + int_len - n, b'0');
        } else {
            out.extend_from_slice(&d.digits[..int_len]);
            out.push(b'.');
            out.extend_from_slice(&d.digits[int_len..]);
        }
    } else {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + (-d.exp - 1) as usize, b'0');
        out.extend_from_slice(&d.digits);
    }
}

/// `1.2345e-7`, `5e300`.
fn render_scientific(d: &Dec, out: &mut Vec<u8>) {
    out.push(d.digits[0]);
    if d.digits.len() > 1 {
        out.push(b'.');
        out.extend_from_slice(&d.digits[1..]);
    }
    if d.exp != 0 {
        let _ = write!(out, "e{}", d.exp);
    }
}

/// Tries `d` in its natural form, then the other one. Leaves the text in `out` on success.
fn try_dec(d: &Dec, t: &impl Target, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    let natural_positional = (-7..=20).contains(&d.exp);
    for positional in [natural_positional, !natural_positional] {
        out.truncate(start);
        if positional {
            render_positional(d, out);
        } else {
            render_scientific(d, out);
        }
        if parse_all(&out[start..]).is_some_and(|v| t.cmp(v) == Ordering::Equal) {
            return true;
        }
    }
    out.truncate(start);
    false
}

/// The text [`find_text`] finds first, for the common values, without its allocations: a small
/// integer's digits, else ryu's shortest digits in their natural form, if that reads back as the target
/// (then it is [`find_text`]'s text too). False, with nothing appended, otherwise.
fn fast_text(x: f64, t: &impl Target, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    // An integer below 2^24 is exact in both precisions, so ryu's shortest digits are its own, and its
    // natural form is positional (exponent below 8): its plain digits.
    if x < 16_777_216.0 && x.fract() == 0.0 {
        out.extend_from_slice(itoa::Buffer::new().format(x as u32).as_bytes());
        if parse_all(&out[start..]).is_some_and(|v| t.cmp(v) == Ordering::Equal) {
            return true;
        }
        out.truncate(start);
        return false;
    }
    let mut buf = ryu::Buffer::new();
    let s = t.shortest_str(&mut buf);
    // What `dec_from` reads, into fixed arrays: digits without leading or trailing zeros, and the
    // exponent of the first.
    let (m, e) = match s.find(['e', 'E']) {
        Some(i) => match s[i + 1..].parse::<i32>() {
            Ok(e) => (&s[..i], e),
            Err(_) => return false,
        },
        None => (s, 0),
    };
    let (int, frac) = m.split_once('.').unwrap_or((m, ""));
    let mut digits = [0u8; 40];
    let mut n = 0;
    let mut pos = int.len() as i32 + e;
    for c in int.bytes().chain(frac.bytes()) {
        if !c.is_ascii_digit() || n == digits.len() {
            return false;
        }
        if n == 0 && c == b'0' {
            pos -= 1;
            continue;
        }
        digits[n] = c;
        n += 1;
    }
    while n > 0 && digits[n - 1] == b'0' {
        n -= 1;
    }
    if n == 0 {
        return false;
    }
    let d = &digits[..n];
    let exp = pos - 1;
    if !(-7..=20).contains(&exp) {
        return false; // the natural form is scientific: left to `find_text`
    }
    // `render_positional`, on the array.
    if exp >= 0 {
        let int_len = exp as usize + 1;
        if n <= int_len {
            out.extend_from_slice(d);
            out.resize(out.len() + int_len - n, b'0');
        } else {
            out.extend_from_slice(&d[..int_len]);
            out.push(b'.');
            out.extend_from_slice(&d[int_len..]);
        }
    } else {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + (-exp - 1) as usize, b'0');
        out.extend_from_slice(d);
    }
    if parse_all(&out[start..]).is_some_and(|v| t.cmp(v) == Ordering::Equal) {
        return true;
    }
    out.truncate(start);
    false
}

/// Appends a text for the positive finite `x` that reads back as the target; false if none was found.
fn find_text(x: f64, t: &impl Target, out: &mut Vec<u8>) -> bool {
    let mut buf = ryu::Buffer::new();
    let Some(shortest) = dec_from(&t.shortest(&mut buf)) else {
        return false;
    };
    if try_dec(&shortest, t, out) {
        return true;
    }
    // More digits of the exact value, correctly rounded (Rust's `{:e}` is exact).
    let mut tried = vec![shortest.clone()];
    for n in shortest.digits.len() + 1..=17 {
        let Some(d) = dec_from(&format!("{:.*e}", n - 1, x)) else {
            continue;
        };
        if tried.contains(&d) {
            continue;
        }
        if try_dec(&d, t, out) {
            return true;
        }
        tried.push(d);
    }
    // A fixed-width mantissa `M` with `k` fraction digits and exponent `E`: CNTK's value
    // `(I + F/D) · pow(10, E)` is monotone in `M`, so a binary search finds a mantissa that reads back
    // as the target if one exists. Whether one exists depends on `E`: when the binary mantissa of
    // `pow(10, E)` exceeds the target's, consecutive coefficients give consecutive products (no gaps),
    // so those exponents are tried first.
    let e = shortest.exp;
    let mx = mantissa(x);
    let mut exps: Vec<(bool, i32, i32)> = (e - 16..=e + 2)
        .chain([0, -300, -295, -305, -290])
        .filter(|&big_e| (-330..=308).contains(&big_e))
        .filter_map(|big_e| {
            let p = parse_all(format!("1e{big_e}").as_bytes())?;
            let gapless = !p.is_normal() || mantissa(p) > mx;
            Some((!gapless, (big_e - e).abs(), big_e))
        })
        .collect();
    exps.sort_unstable();
    exps.dedup();
    for (_, _, big_e) in exps {
        for extra in [17i32, 18, 16] {
            let k = extra + big_e - e;
            if !(0..=300).contains(&k) {
                continue;
            }
            if search_mantissa(k as usize, big_e, t, out) {
                return true;
            }
        }
    }
    false
}

/// The binary mantissa of a positive normal double, in `[1, 2)`.
fn mantissa(x: f64) -> f64 {
    f64::from_bits((x.to_bits() & ((1u64 << 52) - 1)) | (1023u64 << 52))
}

/// `M` with `k` fraction digits, then `eE` unless `E = 0`.
fn render_fixed(m: u64, k: usize, big_e: i32, out: &mut Vec<u8>) {
    let s = m.to_string();
    let s = s.as_bytes();
    if k == 0 {
        out.extend_from_slice(s);
    } else if s.len() <= k {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + k - s.len(), b'0');
        out.extend_from_slice(s);
    } else {
        out.extend_from_slice(&s[..s.len() - k]);
        out.push(b'.');
        out.extend_from_slice(&s[s.len() - k..]);
    }
    if big_e != 0 {
        let _ = write!(out, "e{big_e}");
    }
}

fn search_mantissa(k: usize, big_e: i32, t: &impl Target, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    let probe = |m: u64, out: &mut Vec<u8>| -> Option<Ordering> {
        out.truncate(start);
        render_fixed(m, k, big_e, out);
        parse_all(&out[start..]).map(|v| t.cmp(v))
    };
    // Smallest M whose value is not below the target.
    let (mut lo, mut hi) = (0u64, 10_000_000_000_000_000_000u64);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match probe(mid, out) {
            Some(Ordering::Less) => lo = mid + 1,
            Some(_) => hi = mid,
            None => {
                out.truncate(start);
                return false;
            }
        }
    }
    // CNTK's accumulation of more than 15 digits is only nearly monotone: look at a few neighbours too.
    for m in lo.saturating_sub(2)..=lo.saturating_add(2) {
        if probe(m, out) == Some(Ordering::Equal) {
            return true;
        }
    }
    out.truncate(start);
    false
}

/// Writes chunks of one schema as CTF, remembering the last key written so that two sequences with the
/// same key never follow each other (CNTK's reader would merge them into one sequence).
#[derive(Debug, Clone)]
pub struct CtfWriter {
    schema: Schema,
    last_key: Option<u64>,
}

impl CtfWriter {
    /// A writer using the schema's aliases (`|alias`) in schema order.
    pub fn new(schema: &Schema) -> CtfWriter {
        CtfWriter { schema: schema.clone(), last_key: None }
    }

    /// Appends every sequence of `data` (see the module docs for the layout). Errors, with nothing of
    /// the failing sequence left in `out`: the data do not match the schema (stream count, storage,
    /// dim); a sequence lacks samples of some stream ([`ErrorKind::EmptyStream`]: CNTK cannot read
    /// that); a key equals the previous sequence's key; a value cannot be written
    /// ([`ErrorKind::InvalidStream`] naming the stream, with the sequence key as position).
    pub fn write_chunk(&mut self, data: &ChunkData, out: &mut Vec<u8>) -> Result<(), Error> {
        self.write_sequences(data, 0..data.keys.len(), out)
    }

    /// [`CtfWriter::write_chunk`] for sequences `seqs` of `data` only (a range of its sequences).
    pub fn write_sequences(
        &mut self,
        data: &ChunkData,
        seqs: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let specs = self.schema.streams();
        if data.streams.len() != specs.len() {
            return Err(Error::chunk_data(None, format!("{} streams, the schema {}", data.streams.len(), specs.len())));
        }
        for (d, s) in data.streams.iter().zip(specs) {
            if d.format() != s.format || d.dim != s.dim {
                return Err(Error::chunk_data(
                    None,
                    format!(
                        "stream \"{}\" is {} with dim {} in the schema but {} with dim {} in the data",
                        s.name,
                        s.format.name(),
                        s.dim,
                        d.format().name(),
                        d.dim
                    ),
                ));
            }
            if d.num_sequences() != data.keys.len() {
                return Err(Error::chunk_data(
                    None,
                    format!("stream \"{}\" has {} sequences, the chunk {}", s.name, d.num_sequences(), data.keys.len()),
                ));
            }
        }
        let mut ranges = vec![(0u64, 0u64); specs.len()];
        if seqs.start > seqs.end || seqs.end > data.keys.len() {
            return Err(Error::new(ErrorKind::SequenceOutOfRange {
                sequence: seqs.end.saturating_sub(1) as u64,
                num_sequences: data.keys.len() as u64,
            }));
        }
        for (s, key) in seqs.clone().zip(data.keys.range(seqs)) {
            if self.last_key == Some(key) {
                return Err(Error::chunk_data(
                    Some(s),
                    format!("key {key} is the key of the sequence before it too; CTF would merge the two"),
                )
                .with_sequence(key));
            }
            let seq_start = out.len();
            let mut empty = Vec::new();
            let mut rows = 0u64;
            for (i, d) in data.streams.iter().enumerate() {
                let r = match (d.sequence_offsets.get(s), d.sequence_offsets.get(s + 1)) {
                    (Some(&a), Some(&b)) if a <= b => (a, b),
                    _ => {
                        return Err(Error::chunk_data(
                            Some(s),
                            format!("stream \"{}\": bad sequence offsets", specs[i].name),
                        ))
                    }
                };
                if r.0 == r.1 {
                    empty.push(specs[i].name.clone());
                }
                rows = rows.max(r.1 - r.0);
                ranges[i] = r;
            }
            if !empty.is_empty() {
                return Err(Error::new(ErrorKind::EmptyStream { sequence: key, streams: empty }).with_sequence(key));
            }
            let mut key_text = itoa::Buffer::new();
            let key_text = key_text.format(key).as_bytes();
            for r in 0..rows {
                out.extend_from_slice(key_text);
                for (i, d) in data.streams.iter().enumerate() {
                    let (a, b) = ranges[i];
                    if a + r >= b {
                        continue;
                    }
                    out.extend_from_slice(b" |");
                    out.extend_from_slice(specs[i].alias.as_bytes());
                    if let Err(e) = write_sample(d, a + r, out) {
                        out.truncate(seq_start);
                        let reason = match e {
                            SampleError::Value(v) => format!(
                                "value {v:?} (sample {r} of sequence {key}) cannot be written in CTF: CNTK's parser produces no other NaN than the one of 0e400"
                            ),
                            SampleError::Layout => "inconsistent sample offsets or values".to_string(),
                            SampleError::Index(ix) => format!("sparse index {ix} is outside [0, {})", d.dim),
                        };
                        return Err(Error::new(ErrorKind::InvalidStream { stream: specs[i].name.clone(), reason })
                            .with_sequence(key));
                    }
                }
                out.push(b'\n');
            }
            self.last_key = Some(key);
        }
        Ok(())
    }
}

enum SampleError {
    Value(f64),
    Layout,
    Index(i32),
}

/// Appends ` v v v` (dense) or ` i:v i:v` (sparse) for global sample `k`.
fn write_sample(d: &StreamData, k: u64, out: &mut Vec<u8>) -> Result<(), SampleError> {
    let k = usize::try_from(k).map_err(|_| SampleError::Layout)?;
    let range = match &d.layout {
        Layout::Dense => {
            let a = k.checked_mul(d.dim).ok_or(SampleError::Layout)?;
            a..a.checked_add(d.dim).ok_or(SampleError::Layout)?
        }
        Layout::Sparse { sample_offsets, .. } => match (sample_offsets.get(k), sample_offsets.get(k + 1)) {
            (Some(&a), Some(&b)) if a <= b => a as usize..b as usize,
            _ => return Err(SampleError::Layout),
        },
    };
    if range.end > d.values.len() {
        return Err(SampleError::Layout);
    }
    for j in range {
        out.push(b' ');
        if let Layout::Sparse { indices, .. } = &d.layout {
            let ix = *indices.get(j).ok_or(SampleError::Layout)?;
            if ix < 0 || ix as usize >= d.dim {
                return Err(SampleError::Index(ix));
            }
            out.extend_from_slice(itoa::Buffer::new().format(ix).as_bytes());
            out.push(b':');
        }
        let r = match &d.values {
            Values::F32(v) => format_f32(v[j], out).map_err(|_| SampleError::Value(f64::from(v[j]))),
            Values::F64(v) => format_f64(v[j], out).map_err(|_| SampleError::Value(v[j])),
        };
        r?;
    }
    Ok(())
}

/// Writes one chunk with a fresh [`CtfWriter`].
pub fn write_chunk(data: &ChunkData, schema: &Schema, out: &mut Vec<u8>) -> Result<(), Error> {
    CtfWriter::new(schema).write_chunk(data, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text64(x: f64) -> String {
        let mut v = Vec::new();
        format_f64(x, &mut v).unwrap();
        String::from_utf8(v).unwrap()
    }
    fn text32(x: f32) -> String {
        let mut v = Vec::new();
        format_f32(x, &mut v).unwrap();
        String::from_utf8(v).unwrap()
    }
    fn back64(s: &str) -> u64 {
        parse_all(s.as_bytes()).unwrap().to_bits()
    }
    fn back32(s: &str) -> u32 {
        (parse_all(s.as_bytes()).unwrap() as f32).to_bits()
    }

    #[test]
    fn short_forms() {
        assert_eq!(text64(1.0), "1");
        assert_eq!(text64(-2.5), "-2.5");
        assert_eq!(text64(0.0), "0");
        assert_eq!(text64(-0.0), "-0");
        assert_eq!(text32(0.1), "0.1");
        assert_eq!(text32(1e-7), "0.0000001");
        assert_eq!(text32(45345.1), "45345.1");
        assert_eq!(text64(1e300), "1e300");
        assert_eq!(text64(f64::INFINITY), "1e400");
        assert_eq!(text32(f32::NEG_INFINITY), "-1e400");
        assert_eq!(text64(123456789012.0), "123456789012");
    }

    #[test]
    fn extremes_round_trip() {
        for x in [
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            f64::from_bits(0x000f_ffff_ffff_ffff),
            1.7976931348623155e308,
            0.1 + 0.2,
        ] {
            for y in [x, -x] {
                let s = text64(y);
                assert_eq!(back64(&s), y.to_bits(), "{y:e} -> {s}");
            }
        }
        for x in [f32::MAX, f32::MIN_POSITIVE, 1e-45, 1.1754942e-38, 16777217.0, 3.4028233e38] {
            for y in [x, -x] {
                let s = text32(y);
                assert_eq!(back32(&s), y.to_bits(), "{y:e} -> {s}");
            }
        }
    }

    #[test]
    fn top_binade_needs_a_gapless_exponent() {
        // Found by proptest: 1e308's binary mantissa is below this value's, so `c · 1e308` skips it.
        let x = f64::from_bits((0x7feu64 << 52) | 3858447290168274);
        assert_eq!(back64(&text64(x)), x.to_bits());
    }

    #[test]
    fn nan_only_when_cntk_makes_it() {
        let cntk_nan = parse_all(b"0e400").unwrap();
        let mut v = Vec::new();
        format_f64(cntk_nan, &mut v).unwrap();
        assert_eq!(back64(std::str::from_utf8(&v).unwrap()), cntk_nan.to_bits());
        let other = f64::from_bits(cntk_nan.to_bits() ^ 1);
        assert_eq!(format_f64(other, &mut Vec::new()), Err(Unrepresentable));
    }

    #[test]
    fn a_value_that_needs_the_fallback() {
        // Search a few thousand random-ish doubles for one whose shortest text fails, and check that
        // it is still written exactly.
        let mut found = 0;
        let mut x = 0x3ff0_0000_0000_0001u64;
        for _ in 0..20_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = f64::from_bits((x >> 2) | 0x3000_0000_0000_0000);
            if !v.is_finite() {
                continue;
            }
            let mut b = ryu::Buffer::new();
            let s = b.format_finite(v).to_string();
            if parse_all(s.as_bytes()).map(f64::to_bits) != Some(v.to_bits()) {
                found += 1;
                assert_eq!(back64(&text64(v)), v.to_bits());
            }
        }
        assert!(found > 0, "expected CNTK's parser to misread some shortest texts");
    }

    #[test]
    fn writer_errors_name_stream_and_sequence() {
        use crate::ctf::parse::{parse_bytes, FailFast};
        use crate::schema::{StorageFormat, StreamSpec};
        let schema = Schema::new(vec![
            StreamSpec::new("features", 2, StorageFormat::Dense).alias("x"),
            StreamSpec::new("labels", 3, StorageFormat::Sparse).alias("y"),
        ])
        .unwrap();
        let good = parse_bytes(b"4 |x 1 2 |y 0:1\n5 |x 3 4 |y\n5 |x 5 6\n", &schema, false, &mut FailFast).unwrap();
        let mut text = Vec::new();
        write_chunk(&good, &schema, &mut text).unwrap();
        assert_eq!(text, b"4 |x 1 2 |y 0:1\n5 |x 3 4 |y\n5 |x 5 6\n");

        // A NaN CNTK's parser cannot produce.
        let mut bad = good.clone();
        if let Values::F32(v) = &mut bad.streams[0].values {
            v[3] = f32::from_bits(0x7fc0_1234);
        }
        let mut out = b"kept".to_vec();
        let e = write_chunk(&bad, &schema, &mut out).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::InvalidStream { stream, .. } if stream == "features"), "{e}");
        assert_eq!(e.position().sequence_id, Some(5));
        assert_eq!(out, b"kept4 |x 1 2 |y 0:1\n", "the failing sequence is not left half-written");

        // Two sequences with one key would merge.
        let mut dup = good.clone();
        dup.keys = good.keys.iter().enumerate().map(|(i, k)| if i == 1 { 4 } else { k }).collect();
        assert!(write_chunk(&dup, &schema, &mut Vec::new()).is_err());
        let mut w = CtfWriter::new(&schema);
        w.write_chunk(&good, &mut Vec::new()).unwrap();
        assert!(w.write_chunk(&good, &mut Vec::new()).is_ok(), "key 5 then 4 is fine");
        let mut w2 = CtfWriter::new(&schema);
        let mut tail = good.clone();
        tail.keys = [5, 6].into_iter().collect();
        w2.write_chunk(&good, &mut Vec::new()).unwrap();
        assert!(w2.write_chunk(&tail, &mut Vec::new()).is_err(), "key 5 right after key 5");

        // A stream without samples in a sequence: CNTK cannot read that.
        let mut empty = good;
        empty.streams[1].sequence_offsets = vec![0, 2, 2];
        let e = write_chunk(&empty, &schema, &mut Vec::new()).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::EmptyStream { sequence: 5, .. }), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]
        #[test]
        fn every_finite_f64_round_trips(bits in any::<u64>()) {
            // Non-finite patterns become finite ones (no rejects, so any case count works).
            let bits = if f64::from_bits(bits).is_finite() { bits } else { bits & !(1u64 << 62) };
            let x = f64::from_bits(bits);
            let s = text64(x);
            prop_assert_eq!(back64(&s), bits, "{:e} -> {}", x, s);
        }

        #[test]
        fn every_finite_f32_round_trips(bits in any::<u32>()) {
            let bits = if f32::from_bits(bits).is_finite() { bits } else { bits & !(1u32 << 30) };
            let x = f32::from_bits(bits);
            let s = text32(x);
            prop_assert_eq!(back32(&s), bits, "{:e} -> {}", x, s);
        }

        /// Whenever the fast path gives a text, it is the one `find_text` gives: random bits, short
        /// decimals such as data files hold, and integers around the 2^24 limit.
        #[test]
        fn the_fast_path_writes_what_find_text_writes(
            bits in any::<u64>(),
            short in 0u32..100_000_000,
            scale in 0i32..12,
            int in 0u32..(1 << 25),
        ) {
            let as64 = f64::from_bits(bits & !(1u64 << 63));
            let decimal = f64::from(short) / 10f64.powi(scale);
            for x in [as64, decimal, f64::from(int), f64::from(int) + 0.5] {
                let x32 = x as f32;
                if x.is_finite() && x > 0.0 {
                    let (mut fast, mut full) = (Vec::new(), Vec::new());
                    if fast_text(x, &T64(x), &mut fast) {
                        prop_assert!(find_text(x, &T64(x), &mut full));
                        prop_assert_eq!(&fast, &full, "f64 {:e}", x);
                    } else {
                        prop_assert!(fast.is_empty());
                    }
                }
                if x32.is_finite() && x32 > 0.0 {
                    let (mut fast, mut full) = (Vec::new(), Vec::new());
                    if fast_text(f64::from(x32), &T32(x32), &mut fast) {
                        prop_assert!(find_text(f64::from(x32), &T32(x32), &mut full));
                        prop_assert_eq!(&fast, &full, "f32 {:e}", x32);
                    } else {
                        prop_assert!(fast.is_empty());
                    }
                }
            }
        }

        #[test]
        fn subnormals_and_extremes(m in 1u64..(1u64 << 52), neg: bool, big: bool) {
            // Subnormal doubles and the largest binade.
            let bits = if big { (0x7feu64 << 52) | m } else { m };
            let x = if neg { -f64::from_bits(bits) } else { f64::from_bits(bits) };
            prop_assert_eq!(back64(&text64(x)), x.to_bits());
            let y = f32::from_bits((m as u32) & 0x007f_ffff | if big { 0x7f00_0000 } else { 0 });
            if y.is_finite() && y != 0.0 {
                prop_assert_eq!(back32(&text32(y)), y.to_bits());
            }
        }
    }
}
#[cfg(test)]
mod sweep {
    use super::*;
    /// Every f32 bit pattern at a stride (set `STRIDE=1` for all 2^32 of them; 13 was run: no failure).
    #[test]
    fn sweep_f32() {
        let stride: u64 = std::env::var("STRIDE").ok().and_then(|s| s.parse().ok()).unwrap_or(65_537);
        let mut bad = 0;
        let mut b = 0u64;
        while b < (1u64 << 32) {
            let x = f32::from_bits(b as u32);
            if x.is_finite() {
                let mut v = Vec::new();
                let ok = format_f32(x, &mut v).is_ok() && (parse_all(&v).unwrap() as f32).to_bits() == x.to_bits();
                if !ok {
                    bad += 1;
                    if bad < 20 {
                        println!("FAIL {:#x} {:e}", b, x);
                    }
                }
            }
            b += stride;
        }
        println!("bad = {bad}");
        assert_eq!(bad, 0);
    }
}
