//! Separator masks: which bytes of a 64-byte window separate values, and the windows of a value list.

/// Bit `i` set iff byte `i` of the window is a value separator (` ` or `\t`).
#[inline(always)]
pub(super) fn separators(win: &[u8; WINDOW]) -> u64 {
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
pub(super) fn separators_sse2(win: &[u8; WINDOW]) -> u64 {
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
pub(super) fn separators_swar(win: &[u8; WINDOW]) -> u64 {
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
pub(super) const WINDOW: usize = 64;

/// `c` separates values (` ` or `\t`).
#[inline(always)]
pub(super) fn is_sep(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

/// Most values a window can hold (a value and its separator take at least two bytes).
pub(super) const PER_WINDOW: usize = WINDOW / 2;

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
pub(super) struct Windows {
    /// Start of the current window.
    pub(super) p: usize,
    /// Bit 0: the byte before `p` is a separator (or `p` is where the value list starts).
    pub(super) carry: u64,
    /// End of the last number taken (starts before it are inside it).
    pub(super) last: usize,
}

impl Windows {
    pub(super) fn new(p: usize) -> Windows {
        Windows { p, carry: 1, last: p }
    }

    /// The next window's separator mask and value starts; `Err(position)` when the fast path stops.
    #[inline(always)]
    pub(super) fn next(&mut self, ext: &[u8], n: usize) -> Result<(u64, u64), usize> {
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
    pub(super) fn advance(&mut self, n: usize) -> Result<(), usize> {
        if n - self.p <= WINDOW {
            // Only separators after the last value (or the last value's end is the stop).
            return Err(n.max(self.last));
        }
        self.p += WINDOW;
        Ok(())
    }
}
