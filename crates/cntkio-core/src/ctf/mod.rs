//! The CNTK Text Format: byte classes, the indexer (rows → sequences → chunks) and the parser
//! (a sequence's bytes → samples). Pure: no files, no threads.

pub mod index;
pub mod infer;
pub mod parse;
mod simd;
pub mod write;

/// CNTK's "non-printable" test on a signed x86 `char`: control bytes and every byte ≥ 0x80.
#[inline(always)]
pub(crate) fn is_non_printable(c: u8) -> bool {
    !(0x20..0x80).contains(&c)
}

/// `isspace` of the C locale: space, `\t`, `\n`, `\v`, `\f`, `\r`.
#[inline(always)]
pub(crate) fn is_c_space(c: u8) -> bool {
    c == b' ' || (0x09..=0x0d).contains(&c)
}

/// CNTK's unsigned 64-bit digit accumulation, including its incomplete overflow test (`new < old`):
/// some 20-digit numbers wrap instead of failing, exactly as in CNTK. Returns the value and the end of
/// the digit run, or `Err(position of the digit that overflowed)`.
#[inline]
pub(crate) fn cntk_u64(s: &[u8], start: usize) -> Result<(u64, usize), usize> {
    let mut v: u64 = 0;
    let mut i = start;
    while let Some(&c) = s.get(i) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        let t = v;
        v = v.wrapping_mul(10).wrapping_add(u64::from(d));
        if t > v {
            return Err(i);
        }
        i += 1;
    }
    Ok((v, i))
}

/// A sequence as the indexer found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SequenceDesc {
    /// The sequence key (numeric id in id mode, 0-based line number in line mode).
    pub key: u64,
    /// Absolute byte offset of its first row.
    pub offset: u64,
    /// Size in bytes (from its first row to the start of the next sequence, or its one row in line mode).
    pub len_bytes: u32,
    /// Declared length in samples (CTF.md §2.4).
    pub num_samples: u32,
}

impl SequenceDesc {
    /// One past its last byte.
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_classes() {
        assert!(is_non_printable(b'\r') && is_non_printable(0x80) && is_non_printable(0));
        assert!(!is_non_printable(b' ') && !is_non_printable(0x7f) && !is_non_printable(b'|'));
        assert!(is_c_space(0x0b) && is_c_space(0x0c) && !is_c_space(0));
    }

    #[test]
    fn u64_overflow_is_detected_as_cntk_does() {
        assert_eq!(cntk_u64(b"007|", 0), Ok((7, 3)));
        assert_eq!(cntk_u64(b"18446744073709551615", 0), Ok((u64::MAX, 20)));
        assert_eq!(cntk_u64(b"18446744073709551616", 0), Err(19));
        // CNTK's `new < old` test misses this one: 3e19 wraps.
        let (v, _) = cntk_u64(b"30000000000000000000", 0).unwrap();
        assert_eq!(v, 30000000000000000000u128.wrapping_rem(1u128 << 64) as u64);
    }
}
