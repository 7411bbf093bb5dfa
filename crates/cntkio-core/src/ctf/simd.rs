//! Vector paths of the CTF parser, chosen at run time: the common sparse entry `index:d ` eight at a
//! time with AVX-512 (the `BW`, `VBMI` and `VBMI2` extensions: Intel since Ice Lake, AMD since Zen 4).
//!
//! A vector path takes exactly the entries the scalar fast path takes, with the same values; where it
//! stops, the scalar code goes on. `CNTKIO_SIMD=0` in the environment turns the vector paths off (for
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

/// Whether this processor has what [`sparse_entries`] needs (and the environment does not turn the
/// vector paths off). Checked once per parser.
pub(crate) fn sparse_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("CNTKIO_SIMD").is_some_and(|v| v == "0") {
            return false;
        }
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vbmi")
            && std::is_x86_feature_detected!("avx512vbmi2")
            && std::is_x86_feature_detected!("bmi1")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("popcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Bytes a window of [`sparse_entries`] reads.
pub(crate) const WINDOW: usize = 64;

/// Reads common sparse entries `index:d ` (1–7 index digits, the index below `dim`, a one-digit
/// value, one space) from `p` (a digit) on, in 64-byte windows of `ext` whose entries end before `n`,
/// appending values and indices. Returns where it stopped: at the first entry of another form, or one
/// not ending before `n`, or where fewer than 64 bytes of `ext` remain. Every entry taken reads as the
/// scalar paths read it (index by its digits, value the digit as `T`).
///
/// `available` must be [`sparse_available`]'s answer; when it is `false` nothing is read.
#[inline]
pub(crate) fn sparse_entries<T: SimdValue>(
    available: bool,
    ext: &[u8],
    n: usize,
    p: usize,
    dim: usize,
    v: &mut Vec<T>,
    idx: &mut Vec<i32>,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if available {
        // SAFETY: `available` comes from `sparse_available`, which checked that this processor has
        // every feature `avx512::sparse` is compiled for.
        #[allow(unsafe_code)]
        return unsafe { avx512::sparse(ext, n, p, dim as u64, v, idx) };
    }
    let _ = (available, ext, n, dim, v, idx);
    p
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use super::{SimdValue, WINDOW};
    use std::arch::x86_64::*;

    /// Byte `i` of the result is `i`.
    const IOTA: [u8; 64] = {
        let mut a = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            a[i] = i as u8;
            i += 1;
        }
        a
    };

    /// Byte `8j + i` is `j` (broadcasts byte `j` to the j-th 8-byte lane).
    const LANE: [u8; 64] = {
        let mut a = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            a[i] = (i / 8) as u8;
            i += 1;
        }
        a
    };

    /// Byte `8j + i` is `i - 10` (as a wrapping byte): added to an entry's space position, the
    /// positions of the 8 bytes before its `:`, most significant first (the index digits,
    /// right-aligned in the lane).
    const DIGIT_AT: [u8; 64] = {
        let mut a = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            a[i] = ((i % 8) as u8).wrapping_sub(10);
            i += 1;
        }
        a
    };

    /// Byte `i` is `i - 1` (byte 0 is masked off where it is used).
    const PREVIOUS: [u8; 64] = {
        let mut a = [0u8; 64];
        let mut i = 1;
        while i < 64 {
            a[i] = (i - 1) as u8;
            i += 1;
        }
        a
    };

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
        let digit_at = vector(&DIGIT_AT);
        let previous = vector(&PREVIOUS);
        let space = _mm512_set1_epi8(b' ' as i8);
        let colon = _mm512_set1_epi8(b':' as i8);
        let zero_char = _mm512_set1_epi8(b'0' as i8);
        let nine = _mm512_set1_epi8(9);
        let one = _mm512_set1_epi8(1);
        let two = _mm512_set1_epi8(2);
        let three = _mm512_set1_epi8(3);
        let six = _mm512_set1_epi8(6);
        let tens = _mm512_set1_epi16(0x010a); // bytes 10, 1
        let hundreds = _mm512_set1_epi32(0x0001_0064); // words 100, 1
        let ten_thousand = _mm512_set1_epi64(10_000);
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
            let colon_ok = _mm512_cmpeq_epi8_mask(_mm512_permutexvar_epi8(_mm512_sub_epi8(sp, two), w), colon);
            let value = _mm512_sub_epi8(_mm512_permutexvar_epi8(_mm512_sub_epi8(sp, one), w), zero_char);
            let value_ok = _mm512_cmple_epu8_mask(value, nine);
            // Per 8-byte lane j: the 8 bytes before entry j's `:`, those inside the entry being its
            // index digits (right-aligned), the others zero.
            let pos = _mm512_add_epi8(_mm512_permutexvar_epi8(lane, sp), digit_at);
            let inside = _mm512_cmpge_epi8_mask(pos, _mm512_permutexvar_epi8(lane, st));
            let digits = _mm512_maskz_sub_epi8(inside, _mm512_permutexvar_epi8(pos, w), zero_char);
            let not_digit = inside & !_mm512_cmple_epu8_mask(digits, nine);
            let lane_bad = _mm512_test_epi64_mask(_mm512_movm_epi8(not_digit), _mm512_set1_epi8(-1));
            // Lane values: pairs, quads, then the two halves.
            let pairs = _mm512_maddubs_epi16(digits, tens);
            let quads = _mm512_madd_epi16(pairs, hundreds);
            let index = _mm512_add_epi64(_mm512_mul_epu32(quads, ten_thousand), _mm512_srli_epi64::<32>(quads));
            let index_ok = _mm512_cmplt_epu64_mask(index, dims);
            let ok = (len_ok & colon_ok & value_ok) as u8 & !lane_bad & index_ok;
            let lanes = if count == 8 { 0xff } else { (1u8 << count) - 1 };
            let taken = (!(ok & lanes)).trailing_zeros() as usize;
            if taken == 0 {
                break;
            }
            let indices = _mm512_cvtepi64_epi32(index);
            idx.reserve(8);
            v.reserve(8);
            let (il, vl) = (idx.len(), v.len());
            let values = _mm512_castsi512_si128(value);
            // SAFETY: both vectors have room for 8 more elements (reserved just above); the stores
            // write 8 elements there (unaligned stores allowed), of which the first `taken` (<= 8)
            // become part of the vectors. `T` is `f64` when `IS_F64` and `f32` otherwise (the trait is
            // sealed), so the stored bits are valid `T`s.
            unsafe {
                _mm256_storeu_si256(idx.as_mut_ptr().add(il).cast(), indices);
                if T::IS_F64 {
                    _mm512_storeu_pd(v.as_mut_ptr().add(vl).cast(), _mm512_cvtepi32_pd(_mm256_cvtepu8_epi32(values)));
                } else {
                    _mm256_storeu_ps(v.as_mut_ptr().add(vl).cast(), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(values)));
                }
                idx.set_len(il + taken);
                v.set_len(vl + taken);
            }
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
}
