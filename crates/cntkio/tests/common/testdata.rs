//! The test material (`testdata/README.md`): CNTK's reader tests, real CNTK data and the Python model of
//! CNTK 2.7's readers. It ships in the repository's `testdata/`; when `$CNTKIO_SHARED_DIR` is set, it is
//! read from that folder instead, in the project's `shared/` layout (`conformance/cntk`, `data/real`,
//! `conformance/tools`). Every crate's tests use this one file (`#[path]` from outside `cntkio`); it needs
//! nothing but `std`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// `testdata/IN_REPO`, or `$CNTKIO_SHARED_DIR/IN_SHARED`. Panics with the path and the remedy if the folder
/// is missing. (Every crate of the workspace lies two levels below the repository.)
fn material(in_repo: &str, in_shared: &str) -> PathBuf {
    let dir = match std::env::var_os("CNTKIO_SHARED_DIR") {
        Some(shared) => PathBuf::from(shared).join(in_shared),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(in_repo),
    };
    assert!(
        dir.is_dir(),
        "the test material is missing: {} is not a folder (it ships in the repository's testdata/; \
         $CNTKIO_SHARED_DIR, when set, must hold conformance/ and data/ as shared/ does)",
        dir.display()
    );
    dir
}

/// CNTK's own reader tests: `Config/`, `Data/` and `Control/` (`testdata/cntk`).
pub fn cntk_dir() -> PathBuf {
    material("cntk", "conformance/cntk")
}

/// Real CNTK data: `atis/`, `cbf/`, `edge/`, … with their streams in `README.md` (`testdata/real`).
pub fn real_dir() -> PathBuf {
    material("real", "data/real")
}

/// The Python model of CNTK 2.7's readers: `ctfref.py`, `v2model.py`, … (`testdata/model`).
pub fn model_dir() -> PathBuf {
    material("model", "conformance/tools")
}

/// True if the differential tests can run `file` of the Python model: it must be in [`model_dir`], and
/// without `python3` they print a note and pass.
pub fn python_model_runs(file: &str) -> bool {
    let model = model_dir().join(file);
    assert!(model.is_file(), "the Python model is missing: {}", model.display());
    match std::process::Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            eprintln!("note: python3 is not available; skipping the differential against {file}.");
            false
        }
    }
}

/// The bytes of a file (of the material, or one a test wrote); panics with its path if it cannot be read.
pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// [`read`] as text.
pub fn read_to_string(path: &Path) -> String {
    String::from_utf8(read(path)).unwrap_or_else(|e| panic!("{} is not UTF-8: {e}", path.display()))
}
