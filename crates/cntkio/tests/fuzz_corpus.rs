//! The committed fuzz corpora (`fuzz/corpus/<target>/`), replayed through the fuzz targets' own checks
//! (`fuzz/src/lib.rs`, included here), so that every input a fuzzer kept, crashes fixed included, stays
//! tested without cargo-fuzz.

#[path = "../../../fuzz/src/lib.rs"]
mod checks;

use std::path::PathBuf;

/// Runs `check` on every file of `fuzz/corpus/<target>/`, which must hold some.
fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    paths.sort();
    for path in &paths {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // A failing check names its input.
        let r = std::panic::catch_unwind(|| check(&data));
        assert!(r.is_ok(), "{target}: the check fails on {}", path.display());
    }
    assert!(!paths.is_empty(), "{}: an empty corpus", dir.display());
}

/// One test per target, named after it.
macro_rules! replay_tests {
    ($($target:ident),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                replay(stringify!($target), checks::$target);
            }
        )*
    };
}

replay_tests!(
    ctf_parse,
    cbf_read,
    ctf_cbf_roundtrip,
    config_parse,
    checkpoint_restore,
    index_cache,
    compressed_read,
    feed,
    arrow_read,
    cbf_feed
);
