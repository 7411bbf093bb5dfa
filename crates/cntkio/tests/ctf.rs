//! The CTF reader as a library: index cache, chunking, maxErrors budget across chunks, mmap vs read.

use cntkio::ctf::cache::cache_path;
use cntkio::ctf::{index_config, scan_file, ScanOptions};
use cntkio::{Access, CtfOptions, CtfReader, ErrorKind, InputFile, Schema, StorageFormat, StreamSpec};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

fn schema() -> Schema {
    Schema::new(vec![StreamSpec::new("a", 2, StorageFormat::Dense), StreamSpec::new("b", 10, StorageFormat::Sparse)])
        .unwrap()
}

fn write_data(path: &Path, n: usize) {
    let mut s = String::new();
    for i in 0..n {
        s += &format!("{i} |a {i} -{i}.5 |b {}:1\n{i} |a 1 2\n", i % 10);
    }
    std::fs::write(path, s).unwrap();
}

/// `n` sequences of [`write_data`] in a fresh directory, and options that cache the index.
fn data_with_cache_option(n: usize) -> (tempfile::TempDir, PathBuf, CtfOptions) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("data.ctf");
    write_data(&p, n);
    (dir, p, CtfOptions { cache_index: true, ..CtfOptions::default() })
}

/// Changes the index cache at `path` with `edit` (the CRC-32 at its end excluded) and makes its CRC right.
fn edit_cache(path: &Path, edit: impl FnOnce(&mut [u8])) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = bytes.len();
    edit(&mut bytes[..n - 4]);
    let crc = crc32fast::hash(&bytes[..n - 4]);
    bytes[n - 4..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(path, &bytes).unwrap();
}

fn keys(r: &CtfReader) -> Vec<u64> {
    r.index().chunks.iter().flat_map(|c| c.sequences.iter().map(|s| s.key)).collect()
}

#[test]
fn index_cache_is_not_used_for_a_file_rewritten_with_its_size_and_mtime_restored() {
    // A sequence id changed in the middle of a 20,000-row file, between the places the content sample reads,
    // with the length kept and the modification time set back (as `cp -p`, `rsync -t` or some editors do):
    // the change time tells the file apart.
    let (_dir, p, opts) = data_with_cache_option(10_000);
    let before = keys(&CtfReader::open(&p, &schema(), &opts).unwrap());
    assert!(cache_path(&p, &index_config(&schema(), &opts)).exists());
    let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
    let text = std::fs::read_to_string(&p).unwrap();
    let at = text.find("\n5123 |a").unwrap() + 1;
    let end = text[at..].find("\n5124 |a").unwrap() + at;
    // Sequence 5123's two rows become sequences 5123 and 5129 (same digits, same length).
    let second = text[at..end].find("\n5123 |a").unwrap() + at + 1;
    let changed = format!("{}5129{}", &text[..second], &text[second + 4..]);
    assert_eq!(changed.len(), text.len());
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&p, changed).unwrap();
    std::fs::File::options().write(true).open(&p).unwrap().set_modified(mtime).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len() as usize, text.len());
    let after = keys(&CtfReader::open(&p, &schema(), &opts).unwrap());
    assert_eq!(after.len(), before.len() + 1, "the rewritten file's index, not the stale cache");
    assert!(after.windows(3).any(|w| w == [5123, 5129, 5124]));
}

#[test]
fn index_cache_is_written_reused_and_rebuilt_when_stale_or_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("data.ctf");
    write_data(&p, 50);
    let opts = CtfOptions { cache_index: true, chunk_size: 200, ..CtfOptions::default() };
    let cpath = cache_path(&p, &index_config(&schema(), &opts));
    let fresh = CtfReader::open(&p, &schema(), &opts).unwrap();
    assert!(cpath.exists(), "the cache is written");
    let want = keys(&fresh);
    assert_eq!(want, (0..50).collect::<Vec<u64>>());

    // The cache is used: a record changed in it (with a valid checksum) shows up in the index.
    let first_record = std::fs::metadata(&cpath).unwrap().len() as usize - 4 - 50 * 32;
    edit_cache(&cpath, |bytes| bytes[first_record..first_record + 8].copy_from_slice(&777u64.to_le_bytes()));
    let cached = CtfReader::open(&p, &schema(), &opts).unwrap();
    assert_eq!(keys(&cached)[0], 777, "the cache was read");

    // Re-chunked with another chunk size from the cache: same sequences, other chunks, exact lines.
    let small = CtfOptions { chunk_size: 1, ..opts.clone() };
    let r = CtfReader::open(&p, &schema(), &small).unwrap();
    assert_eq!(r.index().chunks.len(), 50);
    assert_eq!(r.index().chunks[3].first_line, 6);

    // A corrupt cache (bad checksum) is ignored and rewritten.
    let mut bytes = std::fs::read(&cpath).unwrap();
    bytes[first_record] ^= 0xFF;
    std::fs::write(&cpath, &bytes).unwrap();
    assert_eq!(keys(&CtfReader::open(&p, &schema(), &opts).unwrap()), want);
    // A foreign file is ignored.
    std::fs::write(&cpath, b"not an index").unwrap();
    assert_eq!(keys(&CtfReader::open(&p, &schema(), &opts).unwrap()), want);

    // A changed input of the same size and mtime is detected by the content sample.
    let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
    let text = std::fs::read_to_string(&p).unwrap().replacen("0 |a", "9 |a", 1);
    std::fs::write(&p, text).unwrap();
    std::fs::File::options().write(true).open(&p).unwrap().set_modified(mtime).unwrap();
    let r = CtfReader::open(&p, &schema(), &opts).unwrap();
    assert_eq!(keys(&r)[0], 9, "the stale cache was not used");
}

#[test]
fn index_cache_with_a_record_offset_near_the_end_of_u64_is_rebuilt() {
    // Fuzzing (index_cache) found that `offset + length` of a record overflowed: a panic with debug
    // assertions, and without them a sum that wrapped to a small end and passed the bounds check.
    let (_dir, p, opts) = data_with_cache_option(3);
    let want = keys(&CtfReader::open(&p, &schema(), &opts).unwrap());
    // The last record's offset 10 bytes short of 2^64 and its length 20: an end that wraps to 10.
    edit_cache(&cache_path(&p, &index_config(&schema(), &opts)), |bytes| {
        let last_record = bytes.len() - 4 - 32;
        bytes[last_record + 8..last_record + 16].copy_from_slice(&(u64::MAX - 9).to_le_bytes());
        bytes[last_record + 16..last_record + 20].copy_from_slice(&20u32.to_le_bytes());
    });
    let r = CtfReader::open(&p, &schema(), &opts).unwrap();
    assert_eq!(keys(&r), want, "the cache was refused and the index rebuilt");
    assert!(r.index().chunks.iter().flat_map(|c| &c.sequences).all(|s| s.offset < 1 << 20));
}

#[test]
fn max_errors_budget_spans_chunks_and_counts_each_chunk_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.ctf");
    // Three bad samples (each costs one error) in three different chunks.
    std::fs::write(
        &p,
        "0 |a 1 2 |b 1:1\n0 |a x |a 3 4\n1 |a 1 2 |b 1:1\n1 |a 1 2 |b 11:1\n2 |a 1 2 |b 1:1\n2 |a 1 2 3 |b 1:1\n",
    )
    .unwrap();
    for (max, ok) in [(2, false), (3, true)] {
        let opts = CtfOptions { max_errors: max, chunk_size: 1, ..CtfOptions::default() };
        let r = CtfReader::open(&p, &schema(), &opts).unwrap();
        let res: Result<Vec<_>, _> = (0..3).map(|i| r.load_chunk(i)).collect();
        assert_eq!(res.is_ok(), ok, "maxErrors {max}");
        if let Err(e) = res {
            assert!(matches!(e.kind(), ErrorKind::MaxErrorsReached { max_errors: 2, .. }), "{e}");
            assert_eq!(e.position().line, Some(6));
        }
        // Loading again does not count again.
        if ok {
            for i in 0..3 {
                r.load_chunk(i).unwrap();
            }
        }
    }
}

#[test]
fn scan_with_one_or_two_threads_and_mmap_or_read_agree() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("data.ctf");
    write_data(&p, 3000);
    let opts = CtfOptions { chunk_size: 4096, ..CtfOptions::default() };
    let mut outs = Vec::new();
    for access in [Access::Read, Access::Mmap] {
        for threads in [1, 2, 3] {
            let f = InputFile::open(&p, access).unwrap();
            let mut got = Vec::new();
            let s = scan_file(
                &f,
                &schema(),
                &opts,
                &ScanOptions { threads, ..ScanOptions::default() },
                |c| {
                    got.push((c.desc.index, c.data.clone()));
                    Ok(ControlFlow::Continue(()))
                },
                &mut |_| {},
            )
            .unwrap();
            assert!(s.chunks > 10);
            outs.push(got);
        }
    }
    for o in &outs[1..] {
        assert_eq!(o, &outs[0]);
    }
}

#[test]
fn a_consumer_can_stop_a_scan_early() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("data.ctf");
    write_data(&p, 2000);
    let opts = CtfOptions { chunk_size: 1024, ..CtfOptions::default() };
    for threads in [1, 2] {
        let f = InputFile::open(&p, Access::Read).unwrap();
        let mut seen = 0;
        let s = scan_file(
            &f,
            &schema(),
            &opts,
            &ScanOptions { threads, ..ScanOptions::default() },
            |_| {
                seen += 1;
                Ok(if seen == 3 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
            },
            &mut |_| {},
        )
        .unwrap();
        assert_eq!((seen, s.chunks), (3, 3));
    }
}

/// Files larger than the indexer's 4 MiB scan window, with chunks that span windows and one row longer
/// than a window: one thread (the indexer keeps each chunk's bytes for the parser), two threads (parsers
/// read their chunks), read or mapped, all deliver the same chunks.
#[test]
fn scans_across_scan_windows_agree() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.ctf");
    let mut s = String::new();
    for i in 0..120_000 {
        s += &format!("{i} |a {i} -{i}.5 |b {}:1\n{i} |a 1 2\n", i % 10);
        if i == 70_000 {
            // A 5 MB row.
            s += &format!("{i} |a 5 6 |b {}\n", "3:1 ".repeat(5 << 18));
        }
    }
    std::fs::write(&p, &s).unwrap();
    assert!(s.len() > 9 << 20);
    for chunk_size in [64 << 10, 3 << 20, 32 << 20] {
        let opts = CtfOptions { chunk_size, ..CtfOptions::default() };
        let mut outs = Vec::new();
        for access in [Access::Read, Access::Mmap] {
            for threads in [1, 2] {
                let f = InputFile::open(&p, access).unwrap();
                let mut got = Vec::new();
                scan_file(
                    &f,
                    &schema(),
                    &opts,
                    &ScanOptions { threads, ..ScanOptions::default() },
                    |c| {
                        assert!(c.fatal.is_none() && c.errors.is_empty(), "{:?}", c.fatal);
                        got.push((c.desc.clone(), c.data.clone()));
                        Ok(ControlFlow::Continue(()))
                    },
                    &mut |_| {},
                )
                .unwrap();
                outs.push(got);
            }
        }
        assert!(outs[0].len() > 1 || chunk_size > 9 << 20);
        let n: usize = outs[0].iter().map(|(_, d)| d.num_sequences()).sum();
        assert_eq!(n, 120_000);
        for o in &outs[1..] {
            assert!(o == &outs[0], "chunk size {chunk_size}");
        }
    }
}

/// The line-mode index (rows made into sequences directly on one thread) against the block scans of two
/// threads and the in-memory indexer: blank rows, CRLF, a BOM, rows longer than a scan window, the last
/// row with and without a newline, tiny and large chunk sizes, read and mmap; and with a definesMBSize
/// stream (which takes the block scans on one thread too).
#[test]
fn line_mode_index_agrees_with_the_block_scans() {
    let dir = tempfile::tempdir().unwrap();
    for (case, p, data) in row_files(dir.path()) {
        let chunk_size = [1u64, 50, 1000, 64 << 20][case % 4];
        for main in [None, Some("a")] {
            let want = cntkio_core::ctf::index::index_bytes(&data, true, main, chunk_size).unwrap();
            let cfg =
                cntkio::ctf::IndexConfig { skip_sequence_ids: true, main_alias: main.map(str::to_string), chunk_size };
            for access in [Access::Read, Access::Mmap] {
                for threads in [1, 2] {
                    let f = InputFile::open(&p, access).unwrap();
                    let got = cntkio::ctf::build_index(&f, &cfg, threads, &mut |_| {}).unwrap();
                    assert_eq!(got.chunks, want, "case {case}, main {main:?}, {access:?}, {threads} thread(s)");
                }
            }
        }
    }
}

/// 40 line-mode files of random rows: blank rows, CRLF, a BOM, a row longer than a scan window (4 MiB),
/// the last row with and without a newline, rows of broken values.
fn row_files(dir: &Path) -> Vec<(usize, std::path::PathBuf, Vec<u8>)> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut files = Vec::new();
    for case in 0..40 {
        let mut data = Vec::new();
        if case % 5 == 0 {
            data.extend_from_slice(b"\xEF\xBB\xBF");
        }
        let rows = 1 + rnd(300) as usize;
        for r in 0..rows {
            // One row longer than a scan window (4 MiB).
            let len = if case == 7 && r == 0 {
                5_000_000
            } else if rnd(20) == 0 {
                0
            } else {
                rnd(300) as usize
            };
            let start = data.len();
            data.extend_from_slice(if rnd(3) == 0 { b"|b 1:1 |a" } else { b"|a" });
            for _ in 0..len {
                data.push(b" 0123456789.|ab:"[rnd(16) as usize]);
            }
            if len == 0 && rnd(2) == 0 {
                data.truncate(start);
            }
            data.extend_from_slice(if rnd(6) == 0 { b"\r\n" } else { b"\n" });
        }
        if case % 2 == 1 {
            data.pop();
        }
        let p = dir.join(format!("rows{case}.ctf"));
        std::fs::write(&p, &data).unwrap();
        files.push((case, p, data));
    }
    files
}

/// Passes in which the parsers find the rows (the indexer only cuts chunks; with two threads the keys are
/// set when the chunks are delivered, or the chunk parsed again when it has errors) against the indexed
/// pass (sequences from the index, here from its cache): the same chunks, sequences, values, errors,
/// warnings and outcome, on the files of `row_files`, read and mapped, one and two threads, with tiny to
/// large chunks, with and without an error budget, and in validation.
#[test]
fn passes_finding_rows_agree_with_the_indexed_pass() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new(vec![
        StreamSpec::new("a", 3, StorageFormat::Dense),
        StreamSpec::new("b", 20, StorageFormat::Sparse),
    ])
    .unwrap();
    let mut delivered = 0;
    for (case, p, _) in row_files(dir.path()) {
        for chunk_size in [1u64, 50, 1000, 64 << 20] {
            // CNTK's budget of none; a budget with sequences lacking a stream dropped; validation (no budget:
            // every chunk delivered, a sequence lacking a stream stops its chunk's parse, the pass goes on).
            for (max_errors, enforce) in [(0, true), (1 << 40, true), (0, false)] {
                let opts = CtfOptions { chunk_size, max_errors, skip_sequence_ids: true, ..CtfOptions::default() };
                let mut outs = Vec::new();
                // The indexed pass first: with the index's cache (written by the first run, read by the
                // second), the chunks come with their sequences.
                for (access, threads, cache) in [
                    (Access::Read, 2, true),
                    (Access::Read, 2, true),
                    (Access::Read, 1, false),
                    (Access::Read, 2, false),
                    (Access::Mmap, 1, false),
                    (Access::Mmap, 2, false),
                ] {
                    let opts = CtfOptions { cache_index: cache, ..opts.clone() };
                    {
                        let f = InputFile::open(&p, access).unwrap();
                        let mut got = Vec::new();
                        // With a budget, sequences without some stream are dropped rather than fatal.
                        let scan = ScanOptions {
                            threads,
                            warnings: true,
                            skip_bad_sequences: max_errors > 0,
                            enforce_max_errors: enforce,
                            ..ScanOptions::default()
                        };
                        let r = scan_file(
                            &f,
                            &schema,
                            &opts,
                            &scan,
                            |c| {
                                got.push(format!(
                                    "{:?} {:?} {:?} {:?} {:?} {} {}",
                                    c.desc, c.data, c.errors, c.fatal, c.warnings, c.num_errors, c.num_dropped
                                ));
                                Ok(ControlFlow::Continue(()))
                            },
                            &mut |_| {},
                        );
                        got.push(match r {
                            Ok(s) => format!("ok {:?} {} {}", s.mode, s.chunks, s.errors),
                            Err(e) => format!("error {e:?}"),
                        });
                        outs.push((access, threads, got));
                    }
                }
                let (_, _, want) = &outs[0];
                if (max_errors > 0 || !enforce) && want.len() > 1 {
                    delivered += 1;
                }
                for (access, threads, got) in &outs {
                    assert!(
                        got == want,
                        "case {case}, chunk size {chunk_size}, max errors {max_errors} ({enforce}), {access:?}, {threads} thread(s)"
                    );
                }
            }
        }
    }
    // With a budget, and in validation, every file delivers chunks.
    assert_eq!(delivered, 2 * 40 * 4);
}

/// Resident kilobytes of this process's maps of `path` (Linux's `/proc/self/smaps`).
#[cfg(target_os = "linux")]
fn resident_kib_of(path: &Path) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let name = path.to_str().unwrap();
    let mut inside = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let is_range = line.split_whitespace().next().is_some_and(|w| w.contains('-') && !w.ends_with(':'));
        if is_range {
            inside = line.ends_with(name);
        } else if inside {
            if let Some(v) = line.strip_prefix("Rss:") {
                kib += v.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap();
            }
        }
    }
    kib
}

#[test]
#[cfg(target_os = "linux")]
fn a_mapped_scan_keeps_little_of_the_file_resident() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("data.ctf");
    write_data(&p, 400_000);
    let size = std::fs::metadata(&p).unwrap().len();
    assert!(size > 16 << 20, "{size}");
    let opts = CtfOptions { chunk_size: 1 << 20, ..CtfOptions::default() };
    for threads in [1, 2] {
        let f = InputFile::open(&p, Access::Mmap).unwrap();
        let mut chunks = 0;
        scan_file(
            &f,
            &schema(),
            &opts,
            &ScanOptions { threads, ..ScanOptions::default() },
            |_| {
                chunks += 1;
                Ok(ControlFlow::Continue(()))
            },
            &mut |_| {},
        )
        .unwrap();
        assert!(chunks > 16);
        // The map is still there; only pages the pass has not released (or that a later fault mapped
        // again) are resident: a few, not the file.
        let kib = resident_kib_of(&p);
        assert!(kib < 2048, "{threads} thread(s): {kib} KiB of a {size}-byte file are still resident");
        drop(f);
        assert_eq!(resident_kib_of(&p), 0);
    }
}
