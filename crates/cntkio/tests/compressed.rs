//! Compressed input: every data file of the test material, compressed in each way cntkio reads (gzip,
//! multi-member gzip, BGZF, zstd streamed, one zstd frame, several, seekable zstd; and with the `gzip` and
//! `zstd` tools when they are installed), reads as the same bytes, the same chunks and the same errors as
//! the plain file, its chunks loaded in an order other than the file's.

mod common;
#[path = "common/compress.rs"]
mod compress;

use cntkio::cbf::CbfFile;
use cntkio::convert::{detect_format, Format};
use cntkio::{Access, Compression, CtfOptions, CtfReader, Error, InputFile};
use common::testdata::{cntk_dir, real_dir};
use compress::{bgzf, compressed_forms, zstd_frames};
use std::path::{Path, PathBuf};

/// The forms the command-line tools make, when they are installed.
fn tool_forms(plain: &Path) -> Vec<(&'static str, Vec<u8>, Compression)> {
    let mut out = Vec::new();
    for (tool, args, c) in [("gzip", &["-c"][..], Compression::Gzip), ("zstd", &["-q", "-c"][..], Compression::Zstd)] {
        match std::process::Command::new(tool).args(args).arg(plain).output() {
            Ok(o) if o.status.success() => out.push((tool, o.stdout, c)),
            Ok(o) => panic!("{tool} failed on {}: {}", plain.display(), String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("skipping the {tool} tool's output: cannot run {tool} ({e})"),
        }
    }
    out
}

/// Every data file of the test material (CNTK's reader test data and the real files).
fn data_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![cntk_dir().join("Data"), real_dir()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if matches!(p.extension().and_then(|x| x.to_str()), Some("ctf" | "txt" | "bin")) {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() > 40, "the test material is missing: {out:?}");
    out
}

/// What a test compares of an error: its code and where it is.
fn gist(e: &Error) -> (String, Option<u64>, Option<u64>, Option<u64>) {
    let p = e.position();
    (e.code().to_string(), p.byte, p.line, p.column)
}

/// Everything read from a file: its bytes, then per chunk (loaded last to first) its data or error.
fn records(path: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let file = InputFile::open(path, Access::Read).unwrap();
    let len = file.len();
    // The bytes, read in pieces of odd sizes from the end back (a random reader's pattern).
    let mut bytes = vec![0u8; len as usize];
    let mut end = len;
    while end > 0 {
        let from = end.saturating_sub(4093);
        file.read_into(from, (end - from) as usize, &mut Vec::new()).unwrap();
        assert_eq!(file.read_some(from, &mut bytes[from as usize..end as usize]).unwrap(), (end - from) as usize);
        end = from;
    }
    out.push(format!("{bytes:?}"));
    match detect_format(path).unwrap() {
        Format::Cbf => match CbfFile::open(path) {
            Ok(f) => {
                for k in (0..f.chunk_count()).rev() {
                    out.push(match f.read_chunk(k) {
                        Ok(d) => format!("{d:?}"),
                        Err(e) => format!("{:?}", gist(&e)),
                    });
                }
            }
            Err(e) => out.push(format!("{:?}", gist(&e))),
        },
        f @ (Format::Parquet | Format::ArrowIpc) => panic!("the test material holds no {f:?} file"),
        Format::Ctf => {
            let schema = match cntkio::ctf::infer_schema(&file, false) {
                Ok((s, _)) => s,
                Err(e) => {
                    out.push(format!("{:?}", gist(&e)));
                    return out;
                }
            };
            let opts = CtfOptions { chunk_size: 64 << 10, max_errors: 1000, ..CtfOptions::default() };
            match CtfReader::open_with(path, &schema, &opts, Access::Read, 2) {
                Ok(r) => {
                    for k in (0..r.index().chunks.len()).rev() {
                        out.push(match r.load_chunk(k) {
                            Ok(d) => format!("{d:?}"),
                            Err(e) => format!("{:?}", gist(&e)),
                        });
                    }
                }
                Err(e) => out.push(format!("{:?}", gist(&e))),
            }
        }
    }
    out
}

#[test]
fn every_data_file_reads_the_same_through_each_compression() {
    let dir = tempfile::tempdir().unwrap();
    let mut read = 0;
    for plain in data_files() {
        let data = std::fs::read(&plain).unwrap();
        let want = records(&plain);
        let mut forms = compressed_forms(&data);
        forms.extend(tool_forms(&plain));
        for (name, bytes, compression) in forms {
            let path = dir.path().join(format!("{}.{read}", plain.file_name().unwrap().to_string_lossy()));
            std::fs::write(&path, &bytes).unwrap();
            let f = InputFile::open(&path, Access::Mmap).unwrap();
            assert_eq!(f.compression(), Some(compression), "{name} of {}", plain.display());
            assert!(!f.is_mapped(), "a compressed file is read, not mapped");
            assert_eq!((f.len(), f.stored_len()), (data.len() as u64, bytes.len() as u64));
            let got = records(&path);
            assert_eq!(got.len(), want.len(), "{name} of {}", plain.display());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g == w, "{name} of {}: record {k} differs", plain.display());
            }
            std::fs::remove_file(&path).unwrap();
            read += 1;
        }
    }
    assert!(read >= 40 * 7);
}

/// Damage the decoders find: a truncated file and a flipped byte, in each form (every form checks its
/// data: gzip and BGZF by CRC-32, zstd by its frames' checksums, which the `zstd` tool writes by default;
/// zstd frames without one cannot tell every damaged byte). Reading the whole
/// file fails with E0101, never a panic, and never delivers wrong bytes silently.
#[test]
fn truncated_and_damaged_compressed_files_fail_with_compressed_data_errors() {
    let dir = tempfile::tempdir().unwrap();
    let plain = real_dir().join("atis/atis.test.ctf");
    let data = std::fs::read(&plain).unwrap();
    for (name, bytes, _) in compressed_forms(&data) {
        let cut = bytes[..bytes.len() * 2 / 3].to_vec();
        let mut flipped = bytes.clone();
        let at = bytes.len() / 2;
        flipped[at] ^= 0x55;
        for (how, bad) in [("truncated", cut), ("damaged", flipped)] {
            let path = dir.path().join("bad.ctf");
            std::fs::write(&path, &bad).unwrap();
            let read = InputFile::open(&path, Access::Read).and_then(|f| {
                let mut all = Vec::new();
                f.read_into(0, f.len() as usize, &mut all)?;
                Ok(all)
            });
            match read {
                Ok(all) => panic!("{how} {name}: read {} bytes without an error (equal: {})", all.len(), all == data),
                Err(e) => assert_eq!(e.code(), "E0101", "{how} {name}: {e}"),
            }
        }
    }
}

/// Sizes a file declares are checked before anything is allocated for them: a zstd frame that declares
/// 1 TiB, a seek table that lists more frames than the file could hold, a BGZF block that declares more
/// than 64 KiB. Each is read correctly (the bad table ignored), refused with E0101 by the decoder, or,
/// for a stream declaring more than the temporary directory can hold, refused as such.
#[test]
fn impossible_declared_sizes_are_refused_without_allocating_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = b"|x 1 2\n|x 3 4\n".repeat(100);
    // A zstd frame header declaring 1 TiB (8-byte content size), then a raw block with the real data.
    let mut big = 0xFD2F_B528u32.to_le_bytes().to_vec();
    big.push(0xC0 | 0x20); // 8-byte size, single segment
    big.extend_from_slice(&(1u64 << 40).to_le_bytes());
    let raw_block = ((data.len() as u32) << 3) | 1; // last, raw
    big.extend_from_slice(&raw_block.to_le_bytes()[..3]);
    big.extend_from_slice(&data);
    // A seek table claiming 2^32 - 1 frames.
    let mut table = zstd_frames(&data, 100, true);
    let n = table.len();
    table[n - 9..n - 5].copy_from_slice(&u32::MAX.to_le_bytes());
    // A BGZF block whose size field says 1 MiB.
    let mut block = bgzf(&data, 1 << 20);
    let bsize = u16::from_le_bytes([block[16], block[17]]) as usize + 1;
    block[bsize - 4..bsize].copy_from_slice(&(1u32 << 20).to_le_bytes());
    for (name, bytes) in [("zstd 1 TiB", big), ("seek table", table), ("BGZF size", block)] {
        let path = dir.path().join("bad.ctf");
        std::fs::write(&path, &bytes).unwrap();
        let read = InputFile::open(&path, Access::Read).and_then(|f| {
            let mut all = Vec::new();
            f.read_into(0, f.len().min(1 << 20) as usize, &mut all)?;
            Ok(all)
        });
        match read {
            Ok(all) => assert_eq!(all, data, "{name}: read without an error, so it must be the data"),
            Err(e) => {
                assert!(e.code() == "E0101" || (e.is_io() && e.to_string().contains("set TMPDIR")), "{name}: {e}")
            }
        }
    }
}

/// Decompresses a whole gzip or zstd file with the crates (not with cntkio).
fn decompressed(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut out).unwrap();
    } else {
        zstd::stream::read::Decoder::new(bytes).unwrap().read_to_end(&mut out).unwrap();
    }
    out
}

/// CBF → CTF written as seekable zstd and BGZF: the standard decoders give the plain conversion's bytes,
/// and cntkio reads the files directly (frames), as the plain text.
#[test]
fn ctf_written_compressed_decompresses_to_the_plain_text_and_is_read_directly() {
    let dir = tempfile::tempdir().unwrap();
    let cbf = real_dir().join("cbf/50x20_jagged_sequences_sparse.bin");
    let how = cntkio::convert::CbfToCtf { threads: 2, ..Default::default() };
    let plain = dir.path().join("out.ctf");
    cntkio::convert::cbf_to_ctf(&cbf, &plain, &how, &mut |_| {}).unwrap();
    let text = std::fs::read(&plain).unwrap();
    for (name, compression) in [("out.ctf.zst", Compression::SeekableZstd), ("out.ctf.gz", Compression::Bgzf)] {
        let path = dir.path().join(name);
        let s = cntkio::convert::cbf_to_ctf(&cbf, &path, &how, &mut |_| {}).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(s.bytes_written, bytes.len() as u64);
        assert!(decompressed(&bytes) == text, "{name}");
        let f = InputFile::open(&path, Access::Read).unwrap();
        assert_eq!((f.compression(), f.is_direct(), f.len()), (Some(compression), true, text.len() as u64));
        let mut back = vec![0u8; text.len()];
        f.read_exact(0, &mut back).unwrap();
        assert!(back == text);
    }
}

/// `recompress`: plain and gzip input → seekable zstd and BGZF of several frames and blocks, read at any
/// offset; a name without .zst or .gz, and a compressed name for CBF output, are refused and write nothing.
#[test]
fn recompress_makes_files_read_at_any_offset() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..9_500_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 27) as u8 + b'0').collect();
    let plain = dir.path().join("data");
    std::fs::write(&plain, &data).unwrap();
    let gz = dir.path().join("data.gz.in");
    std::fs::write(&gz, compress::gzip(&data)).unwrap();
    let hooks = cntkio::convert::Hooks::default();
    for (input, name, compression) in [
        (&plain, "a.zst", Compression::SeekableZstd),
        (&gz, "b.zst", Compression::SeekableZstd),
        (&plain, "c.gz", Compression::Bgzf),
    ] {
        let out = dir.path().join(name);
        let mut last = 0;
        cntkio::convert::recompress(input, &out, 2, hooks, &mut |b| last = b).unwrap();
        assert_eq!(last, std::fs::metadata(input).unwrap().len(), "progress ends at the input's size");
        assert!(decompressed(&std::fs::read(&out).unwrap()) == data, "{name}");
        let f = InputFile::open(&out, Access::Read).unwrap();
        assert_eq!((f.compression(), f.is_direct()), (Some(compression), true));
        for at in [0usize, 65_279, 4 << 20, (4 << 20) - 3, data.len() - 10] {
            let mut buf = vec![0u8; 10];
            f.read_exact(at as u64, &mut buf).unwrap();
            assert!(buf == data[at..at + 10], "{name} at {at}");
        }
    }
    let e = cntkio::convert::recompress(&plain, &dir.path().join("d.txt"), 1, hooks, &mut |_| {}).unwrap_err();
    assert_eq!(e.code(), "E1006", "{e}");
    let ctf = dir.path().join("t.ctf");
    std::fs::write(&ctf, "|a 1\n").unwrap();
    let schema = cntkio::Schema::new(vec![cntkio::StreamSpec::new("a", 1, cntkio::StorageFormat::Dense)]).unwrap();
    let out = dir.path().join("t.cbf.zst");
    let how = cntkio::convert::CtfToCbf {
        ctf: CtfOptions::default(),
        writer: cntkio::cbf::CbfWriterOptions::new(1 << 20),
        scan: Default::default(),
        access: Access::Read,
        hooks,
    };
    let e = cntkio::convert::ctf_to_cbf(&ctf, &out, &schema, &how, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("cntkio recompress"), "{e}");
    assert!(!out.exists());
}
