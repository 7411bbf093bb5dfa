//! Sparse samples: `index:value` entries, the common form by the vector path where it is available.

use super::outcome::{DenseNote, Done, Fail, FailKind};
use crate::ctf::simd::{self, SimdValue};
use crate::ctf::{cntk_u64, is_non_printable};
use crate::number::{leading_digits, parse_number, short_digit_run, swar_value};

/// Reads a sparse entry list starting at `p` in `ext[..n]` (the vector path also looks at bytes after
/// `n`, but takes nothing from them). `seq_has_values`: this stream already has entries in the current
/// sequence (CNTK's end-of-file rule, CTF.md §5.2). `vector`: the vector path may be used.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) fn read_sparse<T: SimdValue>(
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
pub(super) fn ends_row(s: &[u8], p: usize) -> bool {
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
pub(super) fn sparse_run<T: Copy>(
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
