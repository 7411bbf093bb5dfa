//! Vector paths of the CTF parser, chosen at run time: the common sparse entry `index:d ` and the
//! common dense value (`-1.234567`) eight at a time with AVX-512 (the `BW`, `VBMI` and `VBMI2`
//! extensions among others: Intel since Ice Lake, AMD since Zen 4).
//!
//! A vector path takes only entries and values the scalar paths read the same way, with the same
//! values; where it stops, the scalar code goes on. `CNTKIO_SIMD=0` in the environment turns the vector paths off (for
//! comparisons, or if a processor misbehaves).

/// An element type the vector sparse path can store (`f32` or `f64`; sealed).
pub(crate) trait SimdValue: Copy + sealed::Sealed {
    /// `true` for `f64`, `false` for `f32`.
    const IS_F64: bool;
}

impl SimdValue for f32 {
    const IS_F64: bool = false;
}

impl SimdValue for f64 {
    const IS_F64: bool = true;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// Proof that this processor has what the vector paths need: only [`available`] makes one, so the
/// safe functions below that take it can call the `unsafe` vector code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Vector(());

/// [`Vector`] if this processor has what the vector paths need (and the environment does not turn
/// them off). Checked once per parser.
pub(crate) fn available() -> Option<Vector> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("CNTKIO_SIMD").is_some_and(|v| v == "0") {
            return None;
        }
        let all = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vbmi")
            && std::is_x86_feature_detected!("avx512vbmi2")
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512cd")
            && std::is_x86_feature_detected!("bmi1")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("popcnt");
        all.then_some(Vector(()))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Bytes a window of the vector paths reads.
pub(crate) const WINDOW: usize = 64;

/// Reads common sparse entries `index:d ` (1–7 index digits, the index below `dim`, a one-digit
/// value, one space) from `p` (a digit) on, in 64-byte windows of `ext` whose entries end before `n`,
/// appending values and indices. Returns where it stopped: at the first entry of another form, or one
/// not ending before `n`, or where fewer than 64 bytes of `ext` remain. Every entry taken reads as the
/// scalar paths read it (index by its digits, value the digit as `T`).
///
/// With `vector` `None`, nothing is read.
#[inline]
pub(crate) fn sparse_entries<T: SimdValue>(
    vector: Option<Vector>,
    ext: &[u8],
    n: usize,
    p: usize,
    dim: usize,
    v: &mut Vec<T>,
    idx: &mut Vec<i32>,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if vector.is_some() {
        // SAFETY: a `Vector` comes from `available`, which checked that this processor has
        // every feature `avx512::sparse` is compiled for.
        #[allow(unsafe_code)]
        return unsafe { avx512::sparse(ext, n, p, dim as u64, v, idx) };
    }
    let _ = (vector, ext, n, dim, v, idx);
    p
}

/// Reads common dense values (`[+-]d.ddd`: an optional sign, 1–7 integer digits, optionally `.` and
/// up to 7 fraction digits, ended by a space or tab) from `p` (a value's start or a separator) on, in
/// 64-byte windows of `ext` whose values end before `n`, appending them. Returns where it stopped: at
/// the start of the first value of another form, or at a separator (after the last value taken), or
/// where fewer than 64 bytes of `ext` remain. Every value taken is the one the scalar paths compute
/// (`int + frac / 10^k` in `f64`, then `as T`).
///
/// With `vector` `None`, nothing is read.
#[inline]
pub(crate) fn dense_values<T: SimdValue>(
    vector: Option<Vector>,
    ext: &[u8],
    n: usize,
    p: usize,
    v: &mut Vec<T>,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if vector.is_some() {
        // SAFETY: a `Vector` comes from `available`, which checked that this processor has
        // every feature `avx512::dense` is compiled for.
        #[allow(unsafe_code)]
        return unsafe { avx512::dense(ext, n, p, v) };
    }
    let _ = (vector, ext, n, v);
    p
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use super::{SimdValue, WINDOW};
    use std::arch::x86_64::*;

    /// A 64-byte table whose byte `i` is `$e`.
    macro_rules! table {
        (|$i:ident| $e:expr) => {{
            let mut a = [0u8; 64];
            let mut $i = 0;
            while $i < 64 {
                a[$i] = $e;
                $i += 1;
            }
            a
        }};
    }

    /// Byte `i` is `i`.
    const IOTA: [u8; 64] = table!(|i| i as u8);
    /// Byte `8j + i` is `j` (broadcasts byte `j` to the j-th 8-byte lane).
    const LANE: [u8; 64] = table!(|i| (i / 8) as u8);
    /// Byte `i` is `i - 1` (byte 0 is masked off where it is used).
    const PREVIOUS: [u8; 64] = table!(|i| (i as u8).wrapping_sub(1));
    /// Byte `8j + i` is `i - 8` (as a wrapping byte): added to a position broadcast to lane j, the
    /// positions of the 8 bytes before it.
    const BEFORE: [u8; 64] = table!(|i| ((i % 8) as u8).wrapping_sub(8));

    /// The value of each 8-byte lane of digit values (most significant first; zero bytes before).
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn lane_values(digits: __m512i) -> __m512i {
        // Pairs, quads, then the two halves.
        let pairs = _mm512_maddubs_epi16(digits, _mm512_set1_epi16(0x010a));
        let quads = _mm512_madd_epi16(pairs, _mm512_set1_epi32(0x0001_0064));
        _mm512_add_epi64(_mm512_mul_epu32(quads, _mm512_set1_epi64(10_000)), _mm512_srli_epi64::<32>(quads))
    }

    /// How many of the `count` (at most 8) lanes of a window are taken: those before the first that
    /// is not `ok`.
    #[inline]
    fn leading_ok(ok: u8, count: u32) -> usize {
        let lanes = if count >= 8 { 0xff } else { (1u8 << count) - 1 };
        (!(ok & lanes)).trailing_zeros() as usize
    }

    /// Appends the first `taken` (at most 8) of `values` to `v`, as `T`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn push8<T: SimdValue>(v: &mut Vec<T>, values: __m512d, taken: usize) {
        debug_assert!(taken <= 8);
        v.reserve(8);
        let len = v.len();
        // SAFETY: `v` has room for 8 more elements (reserved just above); the store writes 8 elements
        // there (unaligned stores allowed), of which the first `taken` (<= 8) become part of it. `T` is
        // `f64` when `IS_F64` and `f32` otherwise (the trait is sealed), so the stored bits are `T`s.
        unsafe {
            if T::IS_F64 {
                _mm512_storeu_pd(v.as_mut_ptr().add(len).cast(), values);
            } else {
                _mm256_storeu_ps(v.as_mut_ptr().add(len).cast(), _mm512_cvtpd_ps(values));
            }
            v.set_len(len + taken.min(8));
        }
    }

    /// The 64 bytes as a vector.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn vector(bytes: &[u8; 64]) -> __m512i {
        // SAFETY: the load reads the 64 bytes of the array; `loadu` allows any alignment.
        unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
    }

    /// See [`super::sparse_entries`].
    ///
    /// # Safety
    /// The processor must have the features this function is compiled for.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,bmi1,bmi2,popcnt")]
    pub(super) unsafe fn sparse<T: SimdValue>(
        ext: &[u8],
        n: usize,
        mut p: usize,
        dim: u64,
        v: &mut Vec<T>,
        idx: &mut Vec<i32>,
    ) -> usize {
        let iota = vector(&IOTA);
        let lane = vector(&LANE);
        let before = vector(&BEFORE);
        let previous = vector(&PREVIOUS);
        let space = _mm512_set1_epi8(b' ' as i8);
        let colon = _mm512_set1_epi8(b':' as i8);
        let zero_char = _mm512_set1_epi8(b'0' as i8);
        let nine = _mm512_set1_epi8(9);
        let one = _mm512_set1_epi8(1);
        let two = _mm512_set1_epi8(2);
        let three = _mm512_set1_epi8(3);
        let six = _mm512_set1_epi8(6);
        let dims = _mm512_set1_epi64(dim as i64);
        while p < n {
            let Some(bytes) = ext.get(p..p + WINDOW) else { break };
            let w = vector(bytes.try_into().expect("a window"));
            let valid = if n - p < WINDOW { (1u64 << (n - p)) - 1 } else { !0 };
            // Entry j runs from st_j (0, or after the previous space) to its space sp_j.
            let spaces = _mm512_cmpeq_epi8_mask(w, space) & valid;
            if spaces == 0 {
                break;
            }
            let count = spaces.count_ones().min(8);
            // Where the next window starts if every entry is taken (the end of the last counted
            // entry), found from the space mask alone: the windows then follow each other without
            // waiting for the checks, which only decide whether the loop stops.
            let last = if count == 8 { _pdep_u64(1 << 7, spaces) } else { 1 << (63 - spaces.leading_zeros()) };
            let next = p + last.trailing_zeros() as usize + 1;
            let sp = _mm512_maskz_compress_epi8(spaces, iota);
            let st = _mm512_maskz_add_epi8(!1, _mm512_permutexvar_epi8(previous, sp), one);
            // Per entry (byte j): `index_len` = sp - st - 2 in 1..=7, a `:` before the value digit
            // before the space.
            let len_ok = _mm512_cmple_epu8_mask(_mm512_sub_epi8(_mm512_sub_epi8(sp, st), three), six);
            let colon_at = _mm512_sub_epi8(sp, two);
            let colon_ok = _mm512_cmpeq_epi8_mask(_mm512_permutexvar_epi8(colon_at, w), colon);
            let value = _mm512_sub_epi8(_mm512_permutexvar_epi8(_mm512_sub_epi8(sp, one), w), zero_char);
            let value_ok = _mm512_cmple_epu8_mask(value, nine);
            // Per 8-byte lane j: the 8 bytes before entry j's `:`, those inside the entry being its
            // index digits (right-aligned), the others zero.
            let pos = _mm512_add_epi8(_mm512_permutexvar_epi8(lane, colon_at), before);
            let inside = _mm512_cmpge_epi8_mask(pos, _mm512_permutexvar_epi8(lane, st));
            let digits = _mm512_maskz_sub_epi8(inside, _mm512_permutexvar_epi8(pos, w), zero_char);
            let not_digit = inside & !_mm512_cmple_epu8_mask(digits, nine);
            let lane_bad = _mm512_test_epi64_mask(_mm512_movm_epi8(not_digit), _mm512_set1_epi8(-1));
            let index = lane_values(digits);
            let index_ok = _mm512_cmplt_epu64_mask(index, dims);
            let ok = (len_ok & colon_ok & value_ok) as u8 & !lane_bad & index_ok;
            let taken = leading_ok(ok, count);
            if taken == 0 {
                break;
            }
            idx.reserve(8);
            let il = idx.len();
            // SAFETY: `idx` has room for 8 more elements (reserved just above); the store writes 8
            // there (unaligned stores allowed), of which the first `taken` (<= 8) become part of it.
            unsafe {
                _mm256_storeu_si256(idx.as_mut_ptr().add(il).cast(), _mm512_cvtepi64_epi32(index));
                idx.set_len(il + taken);
            }
            let digit_values = _mm256_cvtepu8_epi32(_mm512_castsi512_si128(value));
            push8(v, _mm512_cvtepi32_pd(digit_values), taken);
            if taken < count as usize {
                // Entry `taken` is of another form: the scalar code reads it. It starts after the
                // taken-th space.
                p += _pdep_u64(1 << (taken - 1), spaces).trailing_zeros() as usize + 1;
                break;
            }
            p = next;
        }
        p
    }

    /// The exact powers of ten a fraction of 0–7 digits is divided by (as in `number::parse_words`).
    const POW10: [f64; 8] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7];

    /// See [`super::dense_values`].
    ///
    /// Value j of a window runs from its j-th start (a non-separator after a separator, or the
    /// window's first byte) to its j-th end (a separator after a non-separator). Its trailing digits
    /// are counted in the 8 bytes before its end; the byte before them is its `.` if it has a
    /// fraction, and otherwise the integer is those digits. The integer digits are the up to 8 bytes
    /// before the `.` (or the end) from the start on, after the sign.
    ///
    /// # Safety
    /// The processor must have the features this function is compiled for.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512vbmi,avx512vbmi2,bmi1,popcnt")]
    pub(super) unsafe fn dense<T: SimdValue>(ext: &[u8], n: usize, mut p: usize, v: &mut Vec<T>) -> usize {
        let iota = vector(&IOTA);
        let lane = vector(&LANE);
        let before = vector(&BEFORE);
        let pow10 = _mm512_loadu_pd(POW10.as_ptr());
        let zero_char = _mm512_set1_epi8(b'0' as i8);
        let nine = _mm512_set1_epi8(9);
        let one = _mm512_set1_epi8(1);
        let six = _mm512_set1_epi8(6);
        let seven = _mm512_set1_epi8(7);
        let all = _mm512_set1_epi8(-1);
        let sign_bit = _mm512_set1_epi64(i64::MIN);
        while p < n {
            let Some(bytes) = ext.get(p..p + WINDOW) else { break };
            let w = vector(bytes.try_into().expect("a window"));
            let valid = if n - p < WINDOW { (1u64 << (n - p)) - 1 } else { !0 };
            let sep = _mm512_cmpeq_epi8_mask(w, _mm512_set1_epi8(b' ' as i8))
                | _mm512_cmpeq_epi8_mask(w, _mm512_set1_epi8(b'\t' as i8));
            let starts = !sep & ((sep << 1) | 1) & valid;
            let ends = sep & (!sep << 1) & valid;
            if ends == 0 {
                break;
            }
            let count = ends.count_ones().min(8);
            let last = if count == 8 { _pdep_u64(1 << 7, ends) } else { 1 << (63 - ends.leading_zeros()) };
            let next = p + last.trailing_zeros() as usize;
            let st = _mm512_maskz_compress_epi8(starts, iota);
            let en = _mm512_maskz_compress_epi8(ends, iota);
            // Per value (byte j): its sign, and where its digits start.
            let first = _mm512_permutexvar_epi8(st, w);
            let minus = _mm512_cmpeq_epi8_mask(first, _mm512_set1_epi8(b'-' as i8));
            let signed = minus | _mm512_cmpeq_epi8_mask(first, _mm512_set1_epi8(b'+' as i8));
            let ds = _mm512_mask_add_epi8(st, signed, st, one);
            let ds_lanes = _mm512_permutexvar_epi8(lane, ds);
            // The 8 bytes before the end, those from `ds` on: the trailing digits, counted from the
            // end (a lane's leading zero bytes, where non-digits are 0xff).
            let tail_pos = _mm512_add_epi8(_mm512_permutexvar_epi8(lane, en), before);
            let tail = _mm512_permutexvar_epi8(tail_pos, w);
            let tail_in = _mm512_cmpge_epi8_mask(tail_pos, ds_lanes);
            let tail_digit = tail_in & _mm512_cmple_epu8_mask(_mm512_sub_epi8(tail, zero_char), nine);
            let trailing = _mm512_srli_epi64::<3>(_mm512_lzcnt_epi64(_mm512_movm_epi8(!tail_digit)));
            let trailing = _mm512_castsi128_si512(_mm512_cvtepi64_epi8(trailing));
            // A `.` before the trailing digits starts the fraction.
            let dot_at = _mm512_sub_epi8(_mm512_sub_epi8(en, one), trailing);
            // (With none, `5.` is 5, as in the scalar paths.)
            let dot = _mm512_cmpeq_epi8_mask(_mm512_permutexvar_epi8(dot_at, w), _mm512_set1_epi8(b'.' as i8));
            let int_end = _mm512_mask_blend_epi8(dot, en, dot_at);
            let frac_len = _mm512_maskz_mov_epi8(dot, trailing);
            // 1-7 integer digits, at most 7 fraction digits.
            let int_len_ok = _mm512_cmple_epu8_mask(_mm512_sub_epi8(_mm512_sub_epi8(int_end, ds), one), six);
            let frac_len_ok = _mm512_cmple_epu8_mask(frac_len, seven);
            // The integer digits: the 8 bytes before its end, those from `ds` on.
            let int_end_lanes = _mm512_permutexvar_epi8(lane, int_end);
            let int_pos = _mm512_add_epi8(int_end_lanes, before);
            let int_in = _mm512_cmpge_epi8_mask(int_pos, ds_lanes);
            let int_digits = _mm512_maskz_sub_epi8(int_in, _mm512_permutexvar_epi8(int_pos, w), zero_char);
            let int_bad = int_in & !_mm512_cmple_epu8_mask(int_digits, nine);
            let int_bad = _mm512_test_epi64_mask(_mm512_movm_epi8(int_bad), all);
            // The fraction digits: the tail after the `.` (none without one).
            let frac_in = _mm512_cmpgt_epi8_mask(tail_pos, int_end_lanes);
            let frac_digits = _mm512_maskz_sub_epi8(frac_in, tail, zero_char);
            let int = _mm512_cvtepu64_pd(lane_values(int_digits));
            let frac = _mm512_cvtepu64_pd(lane_values(frac_digits));
            let div = _mm512_permutexvar_pd(_mm512_cvtepu8_epi64(_mm512_castsi512_si128(frac_len)), pow10);
            let coef = _mm512_add_pd(int, _mm512_div_pd(frac, div));
            let minus_lanes = minus as u8;
            let value = _mm512_castsi512_pd(_mm512_mask_or_epi64(
                _mm512_castpd_si512(coef),
                minus_lanes,
                _mm512_castpd_si512(coef),
                sign_bit,
            ));
            let ok = (int_len_ok & frac_len_ok) as u8 & !int_bad;
            let taken = leading_ok(ok, count);
            if taken == 0 {
                break;
            }
            push8(v, value, taken);
            if taken < count as usize {
                // Value `taken` is of another form: the scalar code reads it from its start.
                p += _pdep_u64(1 << taken, starts).trailing_zeros() as usize;
                break;
            }
            p = next;
        }
        p
    }
}
