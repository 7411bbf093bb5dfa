//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The `shared/` folder beside the repository (or `$CNTKIO_SHARED_DIR`). The conformance material lives
/// there; tests that need it fail loudly when it is missing.
pub fn shared_dir() -> PathBuf {
    if let Ok(d) = std::env::var("CNTKIO_SHARED_DIR") {
        return PathBuf::from(d);
    }
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    assert!(
        d.join("conformance").is_dir(),
        "the conformance material is missing: expected {} (or set CNTKIO_SHARED_DIR)",
        d.display()
    );
    d
}

/// C's `printf("%g", v)`: 6 significant digits, trailing zeros removed, exponent with at least 2 digits.
pub fn fmt_g(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let sci = format!("{v:.5e}");
    let (mant, exp) = sci.split_once('e').expect("an exponent");
    let x: i32 = exp.parse().expect("an integer exponent");
    if !(-4..6).contains(&x) {
        let m = strip_zeros(mant);
        format!("{m}e{}{:02}", if x < 0 { '-' } else { '+' }, x.abs())
    } else {
        let decimals = (5 - x) as usize;
        strip_zeros(&format!("{v:.decimals$}")).to_string()
    }
}

fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// CNTK's first-fit packing of sequences into parallel rows (READER.md §5.1): returns the width, the
/// number of rows, and for each sequence its (row, start column).
pub fn layout_packed(lengths: &[u64]) -> (u64, usize, Vec<(usize, u64)>) {
    let width = lengths.iter().copied().max().unwrap_or(0);
    let mut rows: Vec<u64> = Vec::new();
    let mut place = Vec::with_capacity(lengths.len());
    for &l in lengths {
        let r = match rows.iter().position(|&used| used + l <= width) {
            Some(r) => r,
            None => {
                rows.push(0);
                rows.len() - 1
            }
        };
        place.push((r, rows[r]));
        rows[r] += l;
    }
    (width, rows.len(), place)
}

#[test]
fn printf_g() {
    for (v, s) in [
        (1.0, "1"),
        (0.5, "0.5"),
        (-6.4265e20, "-6.4265e+20"),
        (1e-5, "1e-05"),
        (-1.15459e-9, "-1.15459e-09"),
        (123456.0, "123456"),
        (1234567.0, "1.23457e+06"),
        (0.0001, "0.0001"),
        (0.000123456789, "0.000123457"),
        (-0.0, "-0"),
        (100.0, "100"),
        (999999.5, "1e+06"),
    ] {
        assert_eq!(fmt_g(v), s, "{v}");
    }
}
