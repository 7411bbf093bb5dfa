//! What reading compressed input leaves in the temporary directory: nothing for gzip, read through seek
//! points, and one unlinked file for a zstd stream without declared sizes, spooled. A test binary of its
//! own: it points `TMPDIR` at a directory of its own and looks at the process's open files, which other
//! tests running beside it would change.
#![cfg(target_os = "linux")]

#[path = "common/compress.rs"]
mod compress;

use cntkio::{Access, Compression, InputFile};
use std::io::Write;
use std::path::Path;

/// The open files of this process inside `dir` (an unlinked temporary file shows as `dir/#123 (deleted)`).
fn open_inside(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(target) = std::fs::read_link(e.path()) {
            if target.starts_with(dir) {
                out.push(target.display().to_string());
            }
        }
    }
    out
}

/// Text of `n` bytes, compressible as CTF is, from a generator.
fn text(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 40);
    let mut x = 1u64;
    while out.len() < n {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        writeln!(out, "{} |x {} {}.{}", (x >> 60) % 7, (x >> 40) % 1000, (x >> 20) % 100, (x >> 8) % 1000).unwrap();
    }
    out.truncate(n);
    out
}

#[test]
fn a_gzip_stream_read_at_random_writes_no_temporary_file_and_a_spooled_zstd_stream_does() {
    let inputs = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::env::set_var("TMPDIR", tmp.path());
    std::env::set_var("CNTKIO_TMPDIR", tmp.path());
    // Longer than the window of memory that the first pass keeps (48 MiB), so that reads behind it start
    // from seek points.
    let data = text(80 << 20);
    let gz = inputs.path().join("data.ctf.gz");
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(&data).unwrap();
    std::fs::write(&gz, e.finish().unwrap()).unwrap();
    let zst = inputs.path().join("data.ctf.zst");
    std::fs::write(&zst, compress::zstd_streamed(&data[..1 << 20])).unwrap();

    let f = InputFile::open(&gz, Access::Read).unwrap();
    assert_eq!(f.compression(), Some(Compression::Gzip));
    assert!(!f.is_direct());
    let mut buf = vec![0u8; 100_000];
    let mut x = 99u64;
    for k in 0..40 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let at = (x >> 16) % (data.len() - buf.len()) as u64;
        f.read_exact(at, &mut buf).unwrap();
        assert!(buf == data[at as usize..at as usize + buf.len()], "read {k} at {at}");
        assert_eq!(open_inside(tmp.path()), Vec::<String>::new(), "read {k}");
        if k == 10 {
            assert_eq!(f.len(), data.len() as u64);
        }
    }
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);

    // The check sees a spool's file.
    let z = InputFile::open(&zst, Access::Read).unwrap();
    z.read_exact(5, &mut buf[..10]).unwrap();
    assert_eq!(open_inside(tmp.path()).len(), 1, "the spool's unlinked file");
    drop(z);
    drop(f);
}
