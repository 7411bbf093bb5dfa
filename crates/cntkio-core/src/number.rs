//! Numbers exactly as CNTK 2.7 computes them (CTF.md §5.3).
//!
//! CNTK does not round correctly: it accumulates the integer digits `I` and the fraction digits `F` in a
//! double (`x = x*10 + d`), divides by `D = 10^k` built by repeated multiplication, adds, and multiplies by
//! C's `pow(10, ±E)`. The result is converted to the element type afterwards (so `float` values are
//! rounded twice). [`parse_number`] reproduces those bits with a fast path: while a digit run has at most
//! 15 digits its value is below 2^53, so accumulating it in a `u64` and converting gives the same double.

use std::sync::OnceLock;

/// Why a number could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberErrorKind {
    /// The first byte is not a digit or a sign.
    InvalidStart,
    /// A sign is not followed by a digit.
    SignWithoutDigits,
    /// `e`/`E` (or `e+`/`e-`) is not followed by a digit.
    ExponentWithoutDigits,
}

/// A number that could not be read: what, and the offending byte (`None` = end of input) at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumberError {
    /// What went wrong.
    pub kind: NumberErrorKind,
    /// The offending byte.
    pub found: Option<u8>,
    /// Its offset in the input slice.
    pub at: usize,
}

/// `D` for `k` fraction digits as CNTK builds it: 10, then times 10 for each further digit.
fn frac_div(k: usize) -> f64 {
    static TABLE: OnceLock<Vec<f64>> = OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut v = Vec::with_capacity(400);
        let mut d = 1.0f64;
        v.push(d);
        for _ in 1..400 {
            d *= 10.0;
            v.push(d);
        }
        v
    });
    // From 309 digits on D is +inf and stays so.
    t.get(k).copied().unwrap_or(f64::INFINITY)
}

/// C's `pow(10, e)` for an integer exponent, as the platform's libm computes it.
fn pow10(e: i64) -> f64 {
    const LIM: i64 = 400;
    static TABLE: OnceLock<Vec<f64>> = OnceLock::new();
    if e > LIM {
        return f64::INFINITY;
    }
    if e < -LIM {
        return 0.0;
    }
    let t = TABLE.get_or_init(|| (-LIM..=LIM).map(|e| 10f64.powf(e as f64)).collect());
    t[(e + LIM) as usize]
}

#[inline(always)]
fn digits_f64(s: &[u8]) -> f64 {
    let mut v = 0.0f64;
    for &c in s {
        v = v * 10.0 + f64::from(c - b'0');
    }
    v
}

/// Exact powers of ten: `D` for up to 22 fraction digits equals these (all exactly representable).
const POW10_EXACT: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// Number of leading ASCII digits in an 8-byte little-endian word (0..=8).
#[inline(always)]
pub(crate) fn leading_digits(word: u64) -> u32 {
    // `t` holds each byte's value minus '0' when it is a digit: a byte is a digit iff its `t` byte is
    // below 10, i.e. neither its high bit nor that of `t + 0x76` is set. A `t` byte of 0x8A or more
    // carries into the next byte, but only a non-digit does that and only later bytes change, which
    // are not counted.
    let t = word ^ 0x3030_3030_3030_3030;
    let bad = (t.wrapping_add(0x7676_7676_7676_7676) | t) & 0x8080_8080_8080_8080;
    bad.trailing_zeros() / 8
}

/// Value of the first `n` (1..=8) digits of `word` (first digit in the lowest byte).
#[inline(always)]
pub(crate) fn swar_value(word: u64, n: u32) -> u64 {
    // The digits' values (the same `xor` as in `leading_digits`, so the two share it); the bytes after
    // the n-th, whatever they hold, are shifted out below.
    let digits = word ^ 0x3030_3030_3030_3030;
    // Keep n bytes and move them to the top: the zero bytes below act as leading zeros.
    let v = digits << (64 - 8 * n);
    // Combine pairs, then quads, then the halves (first digit most significant).
    let v = (v.wrapping_mul(10)).wrapping_add(v >> 8);
    ((v & 0x0000_00FF_0000_00FF)
        .wrapping_mul(100 + (1_000_000 << 32))
        .wrapping_add(((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32))))
        >> 32
}

/// A run of 1–7 digits at `start` (with 8 bytes readable): its value and end. Longer runs, and the end of
/// the input, return `None` (the caller falls back to a byte loop). No overflow is possible.
#[inline(always)]
pub(crate) fn short_digit_run(s: &[u8], start: usize) -> Option<(u64, usize)> {
    let w = s.get(start..start + 8)?;
    let word = u64::from_le_bytes(w.try_into().expect("8 bytes"));
    let n = leading_digits(word);
    if n == 0 || n == 8 {
        return None;
    }
    Some((swar_value(word, n), start + n as usize))
}

/// An integer below 2^52 as f64 (exact), by placing it in the mantissa of 2^52 and subtracting 2^52.
/// Unlike `cvtsi2sd`, which merges into its destination register (a false dependency that LLVM does not
/// always break, and that chains the conversions of consecutive values), this writes whole registers.
#[inline(always)]
fn small_to_f64(v: u64) -> f64 {
    debug_assert!(v < 1 << 52);
    const TWO52: u64 = 0x4330_0000_0000_0000;
    f64::from_bits(v | TWO52) - f64::from_bits(TWO52)
}

/// Reads the digit run starting at `start`; returns its end and the value CNTK accumulates.
#[inline(always)]
fn digit_run(s: &[u8], start: usize) -> (usize, f64) {
    let mut i = start;
    let mut m: u64 = 0;
    // Whole words while 8 bytes remain: at most two words stay exact (16 digits) but only <= 15 digits
    // are taken on this path; longer runs go to the double accumulation below.
    while let Some(w) = s.get(i..i + 8) {
        let word = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        let n = leading_digits(word);
        if n == 0 {
            break;
        }
        let v = swar_value(word, n);
        m = m.wrapping_mul(POW10_U64[n as usize]).wrapping_add(v);
        i += n as usize;
        if n < 8 {
            break;
        }
    }
    while let Some(&c) = s.get(i) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        m = m.wrapping_mul(10).wrapping_add(u64::from(d));
        i += 1;
    }
    if i - start <= 15 {
        (i, m as i64 as f64)
    } else {
        (i, digits_f64(&s[start..i]))
    }
}

const POW10_U64: [u64; 9] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];

/// Reads one number starting at `s[i]`, as CNTK's state machine does (CTF.md §5.3).
///
/// On success returns the value (as a double; convert with `as f32` for float streams) and the offset
/// of the byte that ended it (not consumed; `s.len()` at the end of input).
#[inline(always)]
pub fn parse_number(s: &[u8], start: usize) -> Result<(f64, usize), NumberError> {
    match parse_short(s, start) {
        Some(r) => Ok(r),
        None => parse_number_general(s, start),
    }
}

/// The common case without loops: an optional sign, 1–7 integer digits, optionally `.` and up to 7
/// fraction digits, no exponent, with 18 bytes readable from `start`. Everything else returns `None`
/// (and goes through the general path). Bit-identical to the general path: with at most 7 digits per
/// part every accumulation is exact.
#[inline(always)]
fn parse_short(s: &[u8], start: usize) -> Option<(f64, usize)> {
    // One digit alone (the `1` of one-hot data): no word loads at all.
    if let Some(&[d, next]) = s.get(start..start + 2) {
        let v = d.wrapping_sub(b'0');
        if v <= 9 && !next.is_ascii_digit() && !matches!(next, b'.' | b'e' | b'E') {
            return Some((f64::from(v), start + 1));
        }
    }
    parse_words(s, start)
}

/// [`parse_number`] without the one-digit test of the short path (whose branch mispredicts on values
/// with random signs). For the structural fast paths, which nearly always have 18 bytes readable.
#[inline(always)]
pub(crate) fn parse_number_words(s: &[u8], start: usize) -> Result<(f64, usize), NumberError> {
    match parse_words(s, start) {
        Some(r) => Ok(r),
        None => parse_number_general(s, start),
    }
}

/// [`parse_short`] after its one-digit test: only word loads.
#[inline(always)]
fn parse_words(s: &[u8], start: usize) -> Option<(f64, usize)> {
    let w = s.get(start..start + 18)?;
    let b0 = w[0];
    let neg = b0 == b'-';
    let off = usize::from(neg | (b0 == b'+'));
    let w1 = u64::from_le_bytes(w[off..off + 8].try_into().expect("8 bytes"));
    let n1 = leading_digits(w1);
    if n1 == 0 || n1 == 8 {
        return None;
    }
    // Below 2^53, so the i64 → f64 conversion is exact (and a single instruction, unlike u64 → f64).
    let int = small_to_f64(swar_value(w1, n1));
    let p = off + n1 as usize;
    // The sign is applied by setting the sign bit: the magnitude is non-negative, -0 included.
    let sign = u64::from(neg) << 63;
    match w[p] {
        b'.' => {
            let w2 = u64::from_le_bytes(w[p + 1..p + 9].try_into().expect("8 bytes"));
            let n2 = leading_digits(w2);
            if n2 == 0 {
                // "5." is 5; whatever follows ends the number.
                return Some((f64::from_bits(int.to_bits() | sign), start + p + 1));
            }
            let e = p + 1 + n2 as usize;
            if n2 == 8 || matches!(w[e], b'e' | b'E') {
                return None;
            }
            let frac = small_to_f64(swar_value(w2, n2));
            let coef = int + frac / POW10_EXACT[n2 as usize];
            Some((f64::from_bits(coef.to_bits() | sign), start + e))
        }
        b'e' | b'E' => None,
        _ => Some((f64::from_bits(int.to_bits() | sign), start + p)),
    }
}

/// [`parse_number`] without the short-form fast path.
#[inline]
fn parse_number_general(s: &[u8], start: usize) -> Result<(f64, usize), NumberError> {
    let mut i = start;
    // Branch-free sign: random signs in real data would otherwise cost a misprediction per value.
    let first = match s.get(i) {
        Some(&c) => c,
        None => return Err(NumberError { kind: NumberErrorKind::InvalidStart, found: None, at: i }),
    };
    let neg = first == b'-';
    let signed = neg | (first == b'+');
    i += usize::from(signed);
    match s.get(i) {
        Some(d) if d.is_ascii_digit() => {}
        other => {
            let kind = if signed { NumberErrorKind::SignWithoutDigits } else { NumberErrorKind::InvalidStart };
            return Err(NumberError { kind, found: other.copied(), at: i });
        }
    }
    let (j, int_val) = digit_run(s, i);
    i = j;
    let coef = match s.get(i) {
        Some(b'.') => {
            i += 1;
            let (j, frac) = digit_run(s, i);
            let k = j - i;
            i = j;
            if k == 0 {
                // "period" state: `5.` is 5; whatever follows ends the number.
                return Ok((if neg { -int_val } else { int_val }, i));
            }
            let div = if k < POW10_EXACT.len() { POW10_EXACT[k] } else { frac_div(k) };
            let coef = int_val + frac / div;
            match s.get(i) {
                Some(b'e' | b'E') => {
                    i += 1;
                    coef
                }
                _ => return Ok((if neg { -coef } else { coef }, i)),
            }
        }
        Some(b'e' | b'E') => {
            i += 1;
            int_val
        }
        _ => return Ok((if neg { -int_val } else { int_val }, i)),
    };
    // Exponent: after the mark.
    let mut eneg = false;
    match s.get(i) {
        Some(c) if c.is_ascii_digit() => {}
        Some(&c) if c == b'-' || c == b'+' => {
            eneg = c == b'-';
            i += 1;
            match s.get(i) {
                Some(d) if d.is_ascii_digit() => {}
                other => {
                    return Err(NumberError {
                        kind: NumberErrorKind::ExponentWithoutDigits,
                        found: other.copied(),
                        at: i,
                    })
                }
            }
        }
        other => {
            return Err(NumberError { kind: NumberErrorKind::ExponentWithoutDigits, found: other.copied(), at: i })
        }
    }
    let mut e: i64 = 0;
    while let Some(&c) = s.get(i) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        // Saturate: pow(10, ±E) is already inf / 0 long before this.
        e = (e * 10 + i64::from(d)).min(1_000_000);
        i += 1;
    }
    // CNTK applies the sign to the coefficient before multiplying (this matters for the NaN of -0e400).
    let c = if neg { -coef } else { coef };
    Ok((c * pow10(if eneg { -e } else { e }), i))
}

/// A direct, slow transcription of CNTK's state machine (every digit through a double), used to check
/// [`parse_number`] in tests. Same contract.
#[cfg(test)]
fn parse_number_reference(s: &[u8], start: usize) -> Result<(f64, usize), NumberError> {
    #[derive(PartialEq)]
    enum St {
        Init,
        Sign,
        Int,
        Period,
        Frac,
        Exp,
        ExpSign,
        ExpDigits,
    }
    let (mut st, mut coef, mut num, mut div, mut neg) = (St::Init, 0.0f64, 0.0f64, 0.0f64, false);
    let mut i = start;
    let err = |kind, i: usize| Err(NumberError { kind, found: s.get(i).copied(), at: i });
    loop {
        let c = s.get(i).copied();
        let dig = c.map(|c| c.is_ascii_digit()).unwrap_or(false);
        let d = c.map(|c| f64::from(c.wrapping_sub(b'0'))).unwrap_or(0.0);
        match st {
            St::Init => match c {
                _ if dig => {
                    st = St::Int;
                    num = d
                }
                Some(b'+') | Some(b'-') => {
                    st = St::Sign;
                    neg = c == Some(b'-')
                }
                _ => return err(NumberErrorKind::InvalidStart, i),
            },
            St::Sign => {
                if dig {
                    st = St::Int;
                    num = d
                } else {
                    return err(NumberErrorKind::SignWithoutDigits, i);
                }
            }
            St::Int => match c {
                _ if dig => num = num * 10.0 + d,
                Some(b'.') => st = St::Period,
                Some(b'e') | Some(b'E') => {
                    st = St::Exp;
                    coef = if neg { -num } else { num };
                    num = 0.0
                }
                _ => return Ok((if neg { -num } else { num }, i)),
            },
            St::Period => {
                if dig {
                    st = St::Frac;
                    coef = num;
                    num = d;
                    div = 10.0
                } else {
                    return Ok((if neg { -num } else { num }, i));
                }
            }
            St::Frac => match c {
                _ if dig => {
                    num = num * 10.0 + d;
                    div *= 10.0
                }
                Some(b'e') | Some(b'E') => {
                    st = St::Exp;
                    coef += num / div;
                    if neg {
                        coef = -coef
                    }
                }
                _ => {
                    coef += num / div;
                    return Ok((if neg { -coef } else { coef }, i));
                }
            },
            St::Exp => match c {
                _ if dig => {
                    st = St::ExpDigits;
                    neg = false;
                    num = d
                }
                Some(b'+') | Some(b'-') => {
                    st = St::ExpSign;
                    neg = c == Some(b'-')
                }
                _ => return err(NumberErrorKind::ExponentWithoutDigits, i),
            },
            St::ExpSign => {
                if dig {
                    st = St::ExpDigits;
                    num = d
                } else {
                    return err(NumberErrorKind::ExponentWithoutDigits, i);
                }
            }
            St::ExpDigits => {
                if dig {
                    num = num * 10.0 + d
                } else {
                    let e = if neg { -num } else { num };
                    return Ok((coef * 10f64.powf(e), i));
                }
            }
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<(f64, usize), NumberError> {
        parse_number(s.as_bytes(), 0)
    }
    fn v(s: &str) -> f64 {
        p(s).unwrap().0
    }

    #[test]
    fn swar_digits() {
        for t in ["0", "7", "12", "12345678", "123456789", "1234567890123456", "99999999999999999999", "00000000001"] {
            for tail in ["", " ", "x", ".5", "|a"] {
                let s = format!("{t}{tail}");
                let (end, v) = digit_run(s.as_bytes(), 0);
                assert_eq!(end, t.len(), "{s}");
                assert_eq!(v.to_bits(), digits_f64(t.as_bytes()).to_bits(), "{s}");
            }
        }
        assert_eq!(leading_digits(u64::from_le_bytes(*b"\xFA9999999")), 0);
        assert_eq!(leading_digits(u64::from_le_bytes(*b"9\xFA999999")), 1);
        assert_eq!(leading_digits(u64::from_le_bytes(*b"1234:/;9")), 4);
        // Every byte value at every position after digits, and random words, against a byte loop.
        let naive = |w: [u8; 8]| w.iter().take_while(|c| c.is_ascii_digit()).count() as u32;
        let mut r = crate::test_rng::Rng(0x9E37_79B9_7F4A_7C15);
        for at in 0..8 {
            for b in 0..=255u8 {
                for fill in [b'7', b'\xFF', b'0', b' '] {
                    let mut w = [b'5'; 8];
                    w[at] = b;
                    for c in w.iter_mut().skip(at + 1) {
                        *c = fill;
                    }
                    assert_eq!(leading_digits(u64::from_le_bytes(w)), naive(w), "{w:?}");
                }
            }
        }
        for _ in 0..100_000 {
            let mut w = r.next().to_le_bytes();
            for c in w.iter_mut() {
                if *c & 1 == 0 {
                    *c = b'0' + *c % 10;
                }
            }
            let n = naive(w);
            assert_eq!(leading_digits(u64::from_le_bytes(w)), n, "{w:?}");
            if n > 0 {
                let want = w[..n as usize].iter().fold(0u64, |a, &c| a * 10 + u64::from(c - b'0'));
                assert_eq!(swar_value(u64::from_le_bytes(w), n), want, "{w:?}");
            }
        }
    }

    #[test]
    fn short_path_equals_general_path() {
        let mut n = 0;
        for int in ["0", "7", "12", "123", "1234567", "12345678", "00"] {
            for frac in ["", ".", ".5", ".25", ".1234567", ".12345678", ".0000001", ".9999999"] {
                for exp in ["", "e5", "E-3"] {
                    for sign in ["", "-", "+"] {
                        for tail in [" ", "|", "\n", "x", ".5", "-1", "e"] {
                            let t = format!("{sign}{int}{frac}{exp}{tail}                  ");
                            let bits = |r: Result<(f64, usize), NumberError>| r.map(|(v, i)| (v.to_bits(), i));
                            let a = bits(parse_number(t.as_bytes(), 0));
                            assert_eq!(a, bits(parse_number_general(t.as_bytes(), 0)), "{t:?}");
                            assert_eq!(a, bits(parse_number_words(t.as_bytes(), 0)), "{t:?}");
                            assert_eq!(a, bits(parse_number_reference(t.as_bytes(), 0)), "{t:?}");
                            n += usize::from(parse_short(t.as_bytes(), 0).is_some());
                        }
                    }
                }
            }
        }
        assert!(n > 1000, "the short path was taken {n} times");
    }

    #[test]
    fn small_integers_convert_exactly() {
        for v in [0u64, 1, 9, 10, 99_999_999, 123_456_789_012_345, (1 << 52) - 1] {
            assert_eq!(small_to_f64(v).to_bits(), (v as f64).to_bits(), "{v}");
        }
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(v("1"), 1.0);
        assert_eq!(v("+2.5"), 2.5);
        assert_eq!(v("007"), 7.0);
        assert_eq!(v("5."), 5.0);
        assert_eq!(v("1e3"), 1000.0);
        assert_eq!(v("1E-3"), 1.0 * 10f64.powf(-3.0));
        assert_eq!(v("1.5e+2"), 150.0);
        assert!(v("-0").is_sign_negative() && v("-0") == 0.0);
        assert_eq!(v("123456789012345678901234567890"), digits_f64(b"123456789012345678901234567890"));
        assert_eq!(v("1e400"), f64::INFINITY);
        assert_eq!(v("-1e400"), f64::NEG_INFINITY);
        assert!(v("0e400").is_nan());
        assert_eq!(v("1e-400"), 0.0);
    }

    #[test]
    fn where_numbers_end() {
        assert_eq!(p("1-2").unwrap().1, 1);
        assert_eq!(p("1+2").unwrap().1, 1);
        assert_eq!(p("2,5").unwrap().1, 1);
        assert_eq!(p("1.5.5").unwrap(), (1.5, 3));
        assert_eq!(p("1.e5").unwrap(), (1.0, 2));
        assert_eq!(p("12abc").unwrap(), (12.0, 2));
        assert_eq!(p("0x1").unwrap(), (0.0, 1));
        assert_eq!(p("1e5e5").unwrap(), (1e5, 3));
    }

    #[test]
    fn rejected_forms() {
        for (s, kind, at) in [
            (".5", NumberErrorKind::InvalidStart, 0),
            ("-.25", NumberErrorKind::SignWithoutDigits, 1),
            ("nan", NumberErrorKind::InvalidStart, 0),
            ("--1", NumberErrorKind::SignWithoutDigits, 1),
            ("+-1", NumberErrorKind::SignWithoutDigits, 1),
            ("1e", NumberErrorKind::ExponentWithoutDigits, 2),
            ("1e+", NumberErrorKind::ExponentWithoutDigits, 3),
            ("-", NumberErrorKind::SignWithoutDigits, 1),
            ("", NumberErrorKind::InvalidStart, 0),
        ] {
            let e = p(s).unwrap_err();
            assert_eq!((e.kind, e.at), (kind, at), "{s}");
            let r = parse_number_reference(s.as_bytes(), 0).unwrap_err();
            assert_eq!((r.kind, r.at), (kind, at), "{s}");
        }
    }

    #[test]
    fn not_correctly_rounded_like_cntk() {
        // 0.1 + 0.2 style: I + F/D with F/D rounded, then the sum rounded.
        let s = "1.0000000000000002220446049250313";
        let (a, _) = p(s).unwrap();
        let (b, _) = parse_number_reference(s.as_bytes(), 0).unwrap();
        assert_eq!(a.to_bits(), b.to_bits());
        // 17 integer digits accumulate with rounding at each step.
        let s = "98765432109876543.25e-3";
        assert_eq!(p(s).unwrap().0.to_bits(), parse_number_reference(s.as_bytes(), 0).unwrap().0.to_bits());
    }

    #[test]
    fn negative_zero_times_infinity_keeps_cntk_nan_bits() {
        let a = p("-0e400").unwrap().0;
        let b = parse_number_reference(b"-0e400", 0).unwrap().0;
        assert_eq!(a.to_bits(), b.to_bits());
    }
}
