//! The commands on compressed input: randomized minibatches, dumps, validation and the index cache give
//! what they give for the plain file; damaged compressed input exits 1 with E0101.

#[path = "../../cntkio/tests/common/compress.rs"]
mod compress;
#[path = "../../cntkio/tests/common/testdata.rs"]
mod testdata;

use std::path::{Path, PathBuf};
use std::process::Command;

fn cntkio(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_cntkio")).args(args).output().expect("run cntkio");
    (o.status.code().unwrap_or(-1), String::from_utf8(o.stdout).unwrap(), String::from_utf8(o.stderr).unwrap())
}

/// Writes every compressed form of `plain` into `dir`: (form, path).
fn forms(dir: &Path, plain: &Path) -> Vec<(&'static str, PathBuf)> {
    let data = std::fs::read(plain).unwrap();
    let stem = plain.file_name().unwrap().to_string_lossy().to_string();
    compress::compressed_forms(&data)
        .into_iter()
        .enumerate()
        .map(|(i, (name, bytes, _))| {
            let p = dir.join(format!("{stem}.{i}"));
            std::fs::write(&p, bytes).unwrap();
            (name, p)
        })
        .collect()
}

const ATIS: [&str; 6] =
    ["-s", "query:943:sparse:S0", "-s", "intentLabels:26:sparse:S1", "-s", "slotLabels:129:sparse:S2"];

/// Randomized minibatches (chunks loaded in shuffled order, two sweeps, two seeds) of each compressed
/// form equal those of the plain file, for CTF and CBF.
#[test]
fn randomized_minibatches_of_compressed_files_equal_the_plain_files() {
    let dir = tempfile::tempdir().unwrap();
    let ctf = testdata::real_dir().join("atis/atis.train.ctf");
    let cbf = testdata::real_dir().join("cbf/50x20_jagged_sequences_sparse.bin");
    let mut ctf_args = vec!["batches", "--mb-size", "256", "--randomize", "--chunk-size", "8192", "--max-sweeps", "2"];
    ctf_args.extend(ATIS);
    let cbf_args = ["batches", "--mb-size", "7", "--randomize", "--max-sweeps", "2"];
    for (plain, args) in [(&ctf, &ctf_args[..]), (&cbf, &cbf_args[..])] {
        for seed in ["1", "7"] {
            let run = |file: &Path| {
                let mut a = args.to_vec();
                a.extend(["--seed", seed, file.to_str().unwrap()]);
                let (code, out, err) = cntkio(&a);
                assert_eq!(code, 0, "{}: {err}", file.display());
                out
            };
            let want = run(plain);
            assert!(want.lines().count() > 10, "{want}");
            for (name, path) in forms(dir.path(), plain) {
                assert!(run(&path) == want, "{name} of {}, seed {seed}: the minibatches differ", plain.display());
            }
        }
    }
}

/// `dump` and `validate` of compressed files print what they print for the plain file (less the path).
#[test]
fn dump_and_validate_read_compressed_files() {
    let dir = tempfile::tempdir().unwrap();
    for (plain, schema) in [
        (testdata::real_dir().join("atis/atis.test.ctf"), &ATIS[..]),
        (testdata::real_dir().join("cbf/10x10_dense.bin"), &[][..]),
    ] {
        let mut dump = vec!["dump"];
        dump.extend(schema);
        let mut validate = vec!["validate", "--json"];
        validate.extend(schema);
        let run = |args: &[&str], file: &Path| {
            let mut a = args.to_vec();
            a.push(file.to_str().unwrap());
            let (code, out, err) = cntkio(&a);
            assert_eq!(code, 0, "{args:?} {}: {err}", file.display());
            out.replace(file.to_str().unwrap(), "FILE")
        };
        let (want_dump, want_validate) = (run(&dump, &plain), run(&validate, &plain));
        for (name, path) in forms(dir.path(), &plain) {
            assert!(run(&dump, &path) == want_dump, "dump of {name} of {}", plain.display());
            assert_eq!(run(&validate, &path), want_validate, "validate of {name} of {}", plain.display());
        }
    }
}

/// The index cache of a compressed file is written beside it and reused; a cache made for the plain
/// file is not taken for the compressed one's, though the decompressed bytes are the same.
#[test]
fn the_index_cache_tells_a_compressed_file_from_its_plain_twin() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("atis.ctf");
    std::fs::copy(testdata::real_dir().join("atis/atis.test.ctf"), &plain).unwrap();
    let zst = dir.path().join("atis.zst");
    std::fs::write(&zst, compress::zstd_frames(&std::fs::read(&plain).unwrap(), 5000, true)).unwrap();
    let batches = |file: &Path| {
        let mut a = vec!["batches", "--mb-size", "64", "--randomize", "--cache-index", "--chunk-size", "4096"];
        a.extend(ATIS);
        a.push(file.to_str().unwrap());
        let (code, out, err) = cntkio(&a);
        assert_eq!(code, 0, "{err}");
        out
    };
    let want = batches(&plain);
    let caches = || {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".idx"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(caches().len(), 1);
    // The plain file's cache, copied to the compressed file's cache name, must be refused (rebuilt).
    let plain_cache = dir.path().join(&caches()[0]);
    let zst_cache = dir.path().join(caches()[0].replacen("atis.ctf", "atis.zst", 1));
    std::fs::copy(&plain_cache, &zst_cache).unwrap();
    assert_eq!(batches(&zst), want);
    assert_ne!(std::fs::read(&zst_cache).unwrap(), std::fs::read(&plain_cache).unwrap(), "the cache was rebuilt");
    let rebuilt = std::fs::read(&zst_cache).unwrap();
    assert_eq!(batches(&zst), want, "from the compressed file's own cache");
    assert_eq!(std::fs::read(&zst_cache).unwrap(), rebuilt, "the cache was reused");
}

/// Truncated and damaged compressed input: exit 1, E0101, no panic, for every command that reads data.
#[test]
fn damaged_compressed_input_exits_1_with_a_compressed_data_error() {
    let dir = tempfile::tempdir().unwrap();
    let plain = testdata::real_dir().join("atis/atis.test.ctf");
    for (name, path) in forms(dir.path(), &plain) {
        let bytes = std::fs::read(&path).unwrap();
        let mut flipped = bytes.clone();
        flipped[bytes.len() / 2] ^= 0x55;
        for (how, bad) in [("truncated", bytes[..bytes.len() * 2 / 3].to_vec()), ("damaged", flipped)] {
            std::fs::write(&path, &bad).unwrap();
            let p = path.to_str().unwrap();
            let mut runs: Vec<Vec<&str>> = vec![vec!["validate", p], vec!["inspect", p]];
            for cmd in ["dump", "validate", "bench"] {
                let mut a = vec![cmd, p];
                a.extend(ATIS);
                runs.push(a);
            }
            let mut b = vec!["batches", p, "--mb-size", "64", "--randomize", "--chunk-size", "4096"];
            b.extend(ATIS);
            runs.push(b);
            for a in runs {
                let (code, _, err) = cntkio(&a);
                assert!(!err.contains("panicked"), "{how} {name}, {a:?}: {err}");
                assert_eq!(code, 1, "{how} {name}, {a:?}: {err}");
                assert!(err.contains("E0101"), "{how} {name}, {a:?}: {err}");
            }
        }
    }
}

/// `convert CBF OUT.ctf.zst|.gz` and `recompress` write files read at any offset: randomized minibatches of
/// them equal the plain file's; names that ask for what is not written exit 2 and write nothing.
#[test]
fn compressed_outputs_give_the_same_minibatches() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let cbf = testdata::real_dir().join("cbf/50x20_jagged_sequences_sparse.bin");
    let cbf = cbf.to_str().unwrap();
    for out in ["t.ctf", "t.ctf.zst", "t.ctf.gz"] {
        let (code, _, err) = cntkio(&["-q", "convert", cbf, &d(out)]);
        assert_eq!(code, 0, "{err}");
    }
    for (input, out) in [(cbf, "r.cbf.zst"), (cbf, "r.cbf.gz"), (&d("t.ctf.gz")[..], "t2.ctf.zst")] {
        let (code, _, err) = cntkio(&["-q", "recompress", input, &d(out)]);
        assert_eq!(code, 0, "{err}");
    }
    let batches = |file: &str, ctf: bool| {
        let mut a = vec!["batches", "--mb-size", "7", "--randomize", "--seed", "3", "--max-sweeps", "2", file];
        if ctf {
            a.extend(["--chunk-size", "2000", "--stream", "features:100:sparse"]);
        }
        let (code, out, err) = cntkio(&a);
        assert_eq!(code, 0, "{file}: {err}");
        out
    };
    let want = batches(cbf, false);
    assert!(want.lines().count() > 10);
    assert!(batches(&d("r.cbf.zst"), false) == want && batches(&d("r.cbf.gz"), false) == want);
    let want = batches(&d("t.ctf"), true);
    for f in ["t.ctf.zst", "t.ctf.gz", "t2.ctf.zst"] {
        assert!(batches(&d(f), true) == want, "{f}");
    }
    let (code, _, err) = cntkio(&["recompress", cbf, &d("x.txt")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(".zst") && !dir.path().join("x.txt").exists(), "{err}");
    let (code, _, err) = cntkio(&["convert", &d("t.ctf"), &d("x.cbf.zst"), "-s", "features:100:sparse"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("recompress") && !dir.path().join("x.cbf.zst").exists(), "{err}");
}

/// With `--cache-index`, a plain gzip file's seek points are kept beside it (CTF and CBF) and a later run
/// starts from them: the same minibatches, the file not decompressed to its end first (a CBF file's
/// first run does that, for its trailer). A points file
/// of other content (the gzip file replaced) is not used, and is written again.
#[test]
fn the_seek_points_of_a_gzip_file_are_kept_with_cache_index() {
    let dir = tempfile::tempdir().unwrap();
    // Some 12 MB of CTF: several seek points (every 4 MiB or more).
    let mut text = String::new();
    for k in 0..240_000u64 {
        text.push_str(&format!("|a {} {} {} |b {}:1\n", k % 97, k * 7 % 1013, k as f64 / 3.0, k % 10));
    }
    let ctf_gz = dir.path().join("data.ctf.gz");
    std::fs::write(&ctf_gz, compress::gzip(text.as_bytes())).unwrap();
    let cbf = dir.path().join("data.cbf");
    let ctf = dir.path().join("data.ctf");
    std::fs::write(&ctf, &text).unwrap();
    let streams = ["-s", "a:3:dense", "-s", "b:10:sparse"];
    let mut convert = vec!["convert", ctf.to_str().unwrap(), cbf.to_str().unwrap()];
    convert.extend(streams);
    assert_eq!(cntkio(&convert).0, 0);
    let cbf_gz = dir.path().join("data.cbf.gz");
    std::fs::write(&cbf_gz, compress::gzip(&std::fs::read(&cbf).unwrap())).unwrap();

    for (plain, gz, is_ctf) in [(&ctf, &ctf_gz, true), (&cbf, &cbf_gz, false)] {
        let run = |file: &Path, cache: bool| {
            let mut a = vec!["batches", "--mb-size", "5000", "--randomize", "--seed", "3", "--chunk-size", "1000000"];
            if is_ctf {
                a.extend(streams);
            }
            if cache {
                a.push("--cache-index");
            }
            a.push(file.to_str().unwrap());
            let o = Command::new(env!("CARGO_BIN_EXE_cntkio"))
                .args(&a)
                .env("RUST_LOG", "cntkio::compress=debug")
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            (String::from_utf8(o.stdout).unwrap(), String::from_utf8(o.stderr).unwrap())
        };
        let (want, _) = run(plain, false);
        let points = PathBuf::from(format!("{}.cntkio-points.idx", gz.display()));
        let (first, log) = run(gz, true);
        assert!(first == want, "{}", gz.display());
        // The CTF index is built as the stream is decompressed; a CBF file's trailer is at its end.
        assert_eq!(log.contains("decompressing to the end"), !is_ctf, "{log}");
        let kept = std::fs::read(&points).unwrap();
        assert!(log.contains("seek points kept in"), "{log}");

        let (second, log) = run(gz, true);
        assert!(second == want, "{}", gz.display());
        assert!(log.contains("seek points from") && !log.contains("decompressing to the end"), "{log}");
        assert_eq!(std::fs::read(&points).unwrap(), kept, "used as it is");

        // Without the flag the file is not read.
        let (third, log) = run(gz, false);
        assert!(third == want && !log.contains("seek points from"), "{log}");

        // The gzip file replaced by another compression of the same data: other points.
        std::fs::write(gz, compress::gzip_level(&std::fs::read(plain).unwrap(), 1)).unwrap();
        let (fourth, log) = run(gz, true);
        assert!(fourth == want, "{}", gz.display());
        assert!(!log.contains("seek points from") && log.contains("seek points kept in"), "{log}");
        assert_ne!(std::fs::read(&points).unwrap(), kept, "written again");
    }
}
