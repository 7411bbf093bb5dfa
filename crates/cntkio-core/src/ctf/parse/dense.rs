//! Dense samples: a list of values, the common forms a window at a time ([`super::masks`]), the rest one
//! value at a time.

use super::masks::{is_sep, Windows, PER_WINDOW};
use super::outcome::{DenseNote, Done, Fail, FailKind};
use crate::ctf::is_non_printable;
use crate::ctf::simd::{self, SimdValue};
use crate::number::{parse_number, parse_number_words};

/// Reads a dense value list starting at `p` (just after the name) in `ext[..n]` (`vector`: the vector
/// path may be used). On failure the values appended for this sample are removed.
#[inline]
pub(super) fn read_dense<T: SimdValue + Default>(
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

/// Values buffered by [`dense_fast`] before they are appended (appending once per window would cost
/// a `memcpy` call per window).
pub(super) const DENSE_BUF: usize = 128;

#[inline(always)]
pub(super) fn dense_fast<T: Copy + Default>(
    ext: &[u8],
    n: usize,
    p: usize,
    v: &mut Vec<T>,
    conv: &impl Fn(f64) -> T,
) -> usize {
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
pub(super) fn dense_window<T>(
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
pub(super) fn nth_number(s: &[u8], mut p: usize, k: usize) -> Option<usize> {
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
