//! Fault injection into everything that writes or reads a file: conversions killed at random moments, a
//! full disk, inputs truncated or failing while they are read, damaged index caches. Whatever happens, the
//! output path holds the old file, no file, or a complete conversion; nothing partial is left but a
//! recognisable temporary file after a `SIGKILL`; errors name the file and exit with the I/O status (2).

#[macro_use]
mod common;

use common::*;
use std::path::Path;

/// The schema of [`sparse_ctf`]'s files.
#[cfg(target_os = "linux")]
const SCHEMA: [&str; 4] = ["-s", "x:1000:sparse", "-s", "y:10:sparse"];

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod killed {
    use super::*;
    use cntkio::randomize::Mt19937_64;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    /// Whether `name` is a temporary file of the output `target` (`.<target>.<6 characters>.tmp`, see
    /// `cntkio::output`).
    fn is_temporary_of(name: &str, target: &str) -> bool {
        let random = name.strip_prefix(&format!(".{target}.")).and_then(|r| r.strip_suffix(".tmp"));
        random.is_some_and(|r| r.len() == 6 && r.bytes().all(|b| b.is_ascii_alphanumeric()))
    }

    /// The names in `dir` other than `keep` and those in `before`.
    fn others(dir: &Path, keep: &str, before: &[String]) -> Vec<String> {
        dir_names(dir).into_iter().filter(|n| n != keep && !before.contains(n)).collect()
    }

    /// What an output held before the conversion, in the rounds that have one.
    const OLD: &[u8] = b"an older output, to be replaced whole or kept whole\n";

    /// Killed (`SIGKILL`) or interrupted (`SIGINT`, `SIGTERM`) after a random delay, from before the
    /// conversion starts until after it ends, a conversion in either direction leaves at its output path
    /// the file that was there before (or none) or the complete conversion, byte for byte; never a part.
    /// After `SIGKILL` only temporary files named after the output may remain (nothing can remove them),
    /// and a later conversion succeeds beside them; a handled signal removes the temporary file and ends
    /// the process by that signal (or the conversion finished first: exit 0).
    #[test]
    fn killed_at_any_moment_a_conversion_leaves_the_old_output_or_a_complete_one() {
        let d = tmp();
        let ctf = d.path().join("in.ctf");
        sparse_ctf(&ctf, 120_000); // 29 MB: a conversion takes a few hundred ms
        let cbf = d.path().join("in.cbf");
        let started = Instant::now();
        run(args!["-q", "convert", &ctf, &cbf, &SCHEMA]).code(0);
        let to_cbf = started.elapsed();
        let back = d.path().join("back.ctf");
        let started = Instant::now();
        run(args!["-q", "convert", &cbf, &back, &SCHEMA]).code(0);
        let to_ctf = started.elapsed();
        let mut rng = Mt19937_64::new(19);
        for (input, name, reference, took) in [(&ctf, "out.cbf", &cbf, to_cbf), (&cbf, "out.ctf", &back, to_ctf)] {
            let reference = std::fs::read(reference).unwrap();
            let dir = d.path().join(format!("into-{name}"));
            std::fs::create_dir(&dir).unwrap();
            let out = dir.join(name);
            let convert = || cmd(args!["-q", "convert", input, &out, &SCHEMA]);
            let (mut outcomes, mut left) = (Vec::new(), Vec::new());
            for round in 0..3 {
                for (signal, number) in [("KILL", 9), ("INT", 2), ("TERM", 15)] {
                    let old = round % 2 == 0;
                    if old {
                        std::fs::write(&out, OLD).unwrap();
                    } else if out.exists() {
                        std::fs::remove_file(&out).unwrap();
                    }
                    // From the start of the process to 30 % past the end of a conversion.
                    let delay = Duration::from_micros(rng.next_in(0, took.as_micros() as u64 * 13 / 10));
                    let before = others(&dir, name, &[]);
                    let child = convert().stderr(Stdio::piped()).spawn().expect("run cntkio");
                    std::thread::sleep(delay);
                    // A child that has ended is a zombie until it is waited for: the signal still finds it.
                    kill(signal, child.id());
                    let o = child.wait_with_output().unwrap();
                    let stderr = String::from_utf8_lossy(&o.stderr);
                    let case = format!("{name}, SIG{signal} after {delay:?} (round {round}): {stderr}");
                    assert!(o.status.success() || o.status.signal() == Some(number), "{case}: {:?}", o.status);
                    let outcome = match std::fs::read(&out) {
                        Ok(b) if b == reference => "complete",
                        Ok(b) if old && b == OLD => "old",
                        Ok(b) => panic!("{case}: the output holds {} bytes, neither old nor complete", b.len()),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !old => "none",
                        Err(e) => panic!("{case}: the output: {e}"),
                    };
                    outcomes.push(outcome);
                    let rest = others(&dir, name, &before);
                    assert!(rest.iter().all(|n| is_temporary_of(n, name)), "{case}: left {rest:?}");
                    if signal == "KILL" {
                        left.extend(rest);
                    } else {
                        assert!(rest.is_empty(), "{case}: a handled signal removes the temporary file: {rest:?}");
                        let said = format!(
                            "\ncntkio: interrupted: {} was not written; its partial temporary file was removed\n",
                            out.display()
                        );
                        // Stopped after the conversion began but before its temporary file was made.
                        let early = format!("\ncntkio: interrupted: {} was not written\n", out.display());
                        assert!(stderr.is_empty() || stderr == said || stderr == early, "{case}");
                    }
                }
            }
            eprintln!("{name}: outputs {outcomes:?}; temporary files left by SIGKILL: {left:?}");
            // Whatever the killed conversions left, the next one succeeds (beside their temporary files).
            run_cmd(convert()).code(0);
            assert!(std::fs::read(&out).unwrap() == reference, "{name}: a conversion after the kills");
            assert_eq!(others(&dir, name, &left), Vec::<String>::new(), "{name}: only the killed ones' files remain");
        }
    }
}

#[cfg(target_os = "linux")]
mod full_disk {
    use super::*;
    use std::process::Command;

    /// What a command run in a file system of 2 MiB gave, and the names left in it.
    struct InSmallDisk {
        out: Out,
        left: Vec<String>,
    }

    /// Mounts a 2 MiB tmpfs on `mnt`, writes `files` into it, runs `cntkio args` (with `env`) and lists
    /// what the file system holds afterwards. The mount needs `CAP_SYS_ADMIN`: as root it is made here
    /// (and unmounted after); otherwise in a private mount namespace of an unprivileged user
    /// (`unshare -rm`). `Err` says why neither could be had.
    fn in_small_disk(
        mnt: &Path,
        files: &[(&str, &[u8])],
        env: &[(&str, &str)],
        args: Vec<std::ffi::OsString>,
    ) -> Result<InSmallDisk, String> {
        std::fs::create_dir_all(mnt).unwrap();
        let list = mnt.with_extension("list");
        let seed = mnt.with_extension("files");
        std::fs::create_dir_all(&seed).unwrap();
        for (name, bytes) in files {
            std::fs::write(seed.join(name), bytes).unwrap();
        }
        // $0 the mount point, $1 the listing, $2 the files to put in it, then the command.
        let script = r#"mount -t tmpfs -o size=2m tmpfs "$0" || exit 97
            cp -a "$2/." "$0/"
            shift 2
            "$@"
            rc=$?
            ls -A "$0" > "$LIST"
            umount "$0" 2>/dev/null
            exit $rc"#;
        let mut why = Vec::new();
        for wrap in [&[][..], &["unshare", "-rm"][..]] {
            let c = cmd(args.clone());
            let mut sh = Command::new(wrap.first().copied().unwrap_or("sh"));
            if !wrap.is_empty() {
                sh.args(&wrap[1..]).arg("sh");
            }
            sh.args(["-c", script]).arg(mnt).arg(&list).arg(&seed).arg(c.get_program()).args(c.get_args());
            sh.env("LIST", &list).env_remove("RUST_LOG").env("RUST_BACKTRACE", "0");
            for (k, v) in env {
                sh.env(k, v);
            }
            let o = run_cmd(sh);
            if o.code == 97 || (o.code != 0 && !list.exists()) {
                why.push(format!("{}: {}", if wrap.is_empty() { "mount" } else { "unshare -rm" }, o.stderr.trim()));
                continue;
            }
            let left = std::fs::read_to_string(&list).unwrap().lines().map(str::to_string).collect();
            return Ok(InSmallDisk { out: o, left });
        }
        Err(why.join("; "))
    }

    /// Converting into a full file system (a 2 MiB tmpfs; the outputs are 10 MB) fails with an I/O error
    /// (exit 2) that names the output and the space its file system had, and leaves nothing behind: no
    /// temporary file, and an older output as it was. CBF output asks for direct I/O, which tmpfs may
    /// refuse (then it goes through the page cache): with and without `CNTKIO_DIRECT_IO=0`, and for CTF
    /// output too.
    #[test]
    fn a_full_disk_fails_the_conversion_with_the_path_and_the_free_space_and_leaves_nothing() {
        let d = tmp();
        let ctf = d.path().join("in.ctf");
        sparse_ctf(&ctf, 40_000);
        let cbf = d.path().join("in.cbf");
        run(args!["-q", "convert", &ctf, &cbf, &SCHEMA]).code(0);
        let old: &[u8] = b"an older output\n";
        let cases = [
            (&ctf, "out.cbf", &[][..], None),
            (&ctf, "out.cbf", &[("CNTKIO_DIRECT_IO", "0")][..], Some(old)),
            (&cbf, "out.ctf", &[][..], Some(old)),
            (&cbf, "out.ctf", &[("CNTKIO_DIRECT_IO", "0")][..], None),
        ];
        for (k, (input, name, env, before)) in cases.into_iter().enumerate() {
            let mnt = d.path().join(format!("disk{k}"));
            let out = mnt.join(name);
            let files: Vec<(&str, &[u8])> = before.map(|b| (name, b)).into_iter().collect();
            let r = match in_small_disk(&mnt, &files, env, args!["-q", "convert", input, &out, &SCHEMA]) {
                Ok(r) => r,
                Err(why) => {
                    eprintln!("skipped: no file system of 2 MiB can be mounted here ({why})");
                    return;
                }
            };
            let case = format!("{name} {env:?}");
            r.out.code(2);
            let said = format!(
                "error[E2001]: cannot write {}: its file system is full (2.0 MiB free when writing began): No \
                 space left on device (os error 28)\n",
                out.display()
            );
            assert_eq!(r.out.stderr, said, "{case}");
            let expect: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
            assert_eq!(r.left, expect, "{case}: nothing left behind but the older output");
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod failing_reads {
    use super::*;
    use std::ffi::OsString;
    use std::path::PathBuf;

    /// What each case converts: a CTF input read without a map, and a CBF one (read by default) of 1 MiB
    /// chunks.
    fn inputs(d: &Path) -> [(PathBuf, &'static str, Vec<OsString>); 2] {
        let ctf = d.join("in.ctf");
        sparse_ctf(&ctf, 120_000);
        let cbf = d.join("in.cbf");
        run(args!["-q", "convert", &ctf, &cbf, &SCHEMA, "--chunk-size", "1048576"]).code(0);
        [
            (ctf, "out.cbf", args!["--no-mmap", "--chunk-size", "1048576", &SCHEMA]),
            (cbf, "out.ctf", args!["--no-mmap", &SCHEMA]),
        ]
    }

    /// `cntkio -q convert input out extra…`.
    fn convert(input: &Path, out: &Path, extra: Vec<OsString>) -> Vec<OsString> {
        let mut a = args!["-q", "convert", input, out];
        a.extend(extra);
        a
    }

    /// An input truncated to half while it is read (the conversion stopped with `SIGSTOP` once it has
    /// created its temporary output, which it does after opening its input and before reading its data,
    /// then continued) stops the conversion with an I/O error that names the input: exit 2, no
    /// panic, no output, no temporary file. So does a CBF input read through its (guarded) map, the default.
    #[test]
    fn an_input_truncated_while_it_is_read_is_named_in_the_error() {
        let d = tmp();
        let [ctf, cbf] = inputs(d.path());
        let copy = d.path().join("mapped.cbf");
        std::fs::copy(&cbf.0, &copy).unwrap();
        let mapped = (copy, cbf.1, args![&SCHEMA]);
        for (input, name, extra) in [ctf, cbf, mapped] {
            let read = extra.iter().any(|a| a == "--no-mmap");
            let out = d.path().join(name);
            let before = dir_names(d.path());
            let len = std::fs::metadata(&input).unwrap().len();
            let (status, stderr) = act_while_running(
                convert(&input, &out, extra),
                |_| dir_names(d.path()).iter().any(|n| n.starts_with(&format!(".{name}."))),
                |pid| {
                    kill("STOP", pid);
                    std::fs::OpenOptions::new().write(true).open(&input).unwrap().set_len(len / 2).unwrap();
                    kill("CONT", pid);
                },
            );
            let case = format!("{}: {stderr}", input.display());
            assert_eq!(status.code(), Some(2), "{case}");
            assert!(stderr.contains("error[E2001]: ") && stderr.contains(&input.display().to_string()), "{case}");
            let why = if read { "the file is shorter than when it was opened" } else { "while it was memory-mapped" };
            assert!(stderr.contains(why), "{case}");
            assert!(!stderr.contains("panicked"), "{case}");
            assert_eq!(dir_names(d.path()), before, "{case}: no output, no temporary file");
        }
    }

    /// A shim preloaded into the binary: `pread`/`pread64` of the file named by `CNTKIO_TEST_EIO_PATH`
    /// (as `/proc/self/fd` shows it) fail with `EIO` for any byte from `CNTKIO_TEST_EIO_FROM` on, as a
    /// failing disk's reads do (no device-mapper `error` target or failing disk is needed).
    const EIO_SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int failing(int fd, size_t n, off_t off) {
    const char *path = getenv("CNTKIO_TEST_EIO_PATH"), *from = getenv("CNTKIO_TEST_EIO_FROM");
    char link[64], target[4096];
    if (!path || !from || n == 0) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, target, sizeof target - 1);
    if (k < 0) return 0;
    target[k] = 0;
    return strcmp(target, path) == 0 && (long long)off + (long long)n > atoll(from);
}

#define SHIM(name)                                                                    \
    ssize_t name(int fd, void *buf, size_t n, off_t off) {                            \
        static ssize_t (*real)(int, void *, size_t, off_t);                           \
        if (!real) real = (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, #name); \
        if (failing(fd, n, off)) { errno = EIO; return -1; }                          \
        return real(fd, buf, n, off);                                                 \
    }
SHIM(pread)
SHIM(pread64)
"#;

    /// Builds [`EIO_SHIM`] with the C compiler Rust links with; `Err` says why it could not.
    fn eio_shim(dir: &Path) -> Result<PathBuf, String> {
        let src = dir.join("eio.c");
        let lib = dir.join("libeio.so");
        std::fs::write(&src, EIO_SHIM).unwrap();
        let o = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .arg("-ldl")
            .output()
            .map_err(|e| format!("cannot run cc: {e}"))?;
        if !o.status.success() {
            return Err(format!("cc failed: {}", String::from_utf8_lossy(&o.stderr)));
        }
        Ok(lib)
    }

    /// Reads failing with `EIO` in the middle of an input (a preloaded shim fails them, see [`EIO_SHIM`])
    /// stop the conversion with an I/O error that names the input and the system's error: exit 2, no
    /// panic, no output, no temporary file.
    #[test]
    fn reads_failing_with_eio_are_named_in_the_error() {
        let d = tmp();
        let lib = match eio_shim(d.path()) {
            Ok(lib) => lib,
            Err(why) => {
                eprintln!("skipped: no shim to fail reads ({why})");
                return;
            }
        };
        for (input, name, extra) in inputs(d.path()) {
            let out = d.path().join(name);
            let before = dir_names(d.path());
            let len = std::fs::metadata(&input).unwrap().len();
            let mut c = cmd(convert(&input, &out, extra));
            c.env("LD_PRELOAD", &lib)
                .env("CNTKIO_TEST_EIO_PATH", std::fs::canonicalize(&input).unwrap())
                .env("CNTKIO_TEST_EIO_FROM", (len / 2).to_string());
            let o = run_cmd(c);
            let case = format!("{}: {}", input.display(), o.stderr);
            o.code(2);
            assert!(o.stderr.contains("error[E2001]: ") && o.stderr.contains(&input.display().to_string()), "{case}");
            assert!(o.stderr.contains("Input/output error (os error 5)"), "{case}");
            assert!(!o.stderr.contains("panicked"), "{case}");
            assert_eq!(dir_names(d.path()), before, "{case}: no output, no temporary file");
        }
    }
}

mod index_cache {
    use super::*;
    use std::path::PathBuf;

    /// A CTF file of `n` sequences with ids, of 1 to 3 rows each.
    fn ctf_with_ids(n: usize) -> String {
        (0..n).flat_map(|i| (0..1 + i % 3).map(move |r| format!("{i} |a {}.5 {} |b {}:1\n", i + r, r, i % 7))).collect()
    }

    /// Dumps `input` (in chunks of 4 KiB), with the index cache or without.
    fn dump(input: &Path, cached: bool) -> String {
        let mut a = args!["dump", input, "-s", "a:2:dense", "-s", "b:7:sparse", "--chunk-size", "4096"];
        if cached {
            a.push("--cache-index".into());
        }
        run(a).code(0).stdout()
    }

    /// The index cache of `input` (`<input>.cntkio-<hash>.idx`), the only one beside it.
    fn cache_of(input: &Path) -> PathBuf {
        let dir = input.parent().unwrap();
        let prefix = format!("{}.cntkio-", input.file_name().unwrap().to_str().unwrap());
        let found: Vec<String> =
            dir_names(dir).into_iter().filter(|n| n.starts_with(&prefix) && n.ends_with(".idx")).collect();
        assert_eq!(found.len(), 1, "{found:?}");
        dir.join(&found[0])
    }

    /// An index cache that does not belong to the file as it is now is never used: truncated, with bytes
    /// flipped, another file's copied over it, or stale (the file rewritten with its size and
    /// modification time restored). A dump with `--cache-index` then equals one without, and the cache is
    /// rebuilt: it becomes what a run without any cache writes.
    #[test]
    fn a_damaged_foreign_or_stale_index_cache_is_never_used_and_is_rebuilt() {
        let d = tmp();
        let input = write(d.path(), "in.ctf", ctf_with_ids(3000));
        let expect = dump(&input, false);
        assert_eq!(dump(&input, true), expect, "a fresh cache");
        let cache = cache_of(&input);
        let good = std::fs::read(&cache).unwrap();
        assert_eq!(dump(&input, true), expect, "the cache used");
        let rebuilt = |case: &str, damaged: &[u8]| {
            std::fs::write(&cache, damaged).unwrap();
            assert_eq!(dump(&input, true), expect, "{case}");
            assert!(std::fs::read(&cache).unwrap() == good, "{case}: the cache is rebuilt");
            assert_eq!(dir_names(d.path()).len(), 2, "{case}: the input and its cache, no temporary file");
        };
        for len in [0, 3, 8, 40, good.len() / 2, good.len() - 4, good.len() - 1] {
            rebuilt(&format!("truncated to {len} bytes"), &good[..len]);
        }
        rebuilt("one byte more", &[&good[..], &[0]].concat());
        for at in [0, 9, 20, 70, good.len() / 2, good.len() - 30, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            rebuilt(&format!("byte {at} flipped"), &bad);
        }

        // Another file's cache: of the same length and modification time, with the same first sequences.
        let other = write(d.path(), "other.ctf", ctf_with_ids(3000).replace("2999 |a", "2998 |a"));
        let t = std::fs::metadata(&input).unwrap().modified().unwrap();
        std::fs::File::options().write(true).open(&other).unwrap().set_modified(t).unwrap();
        dump(&other, true);
        let foreign = std::fs::read(cache_of(&other)).unwrap();
        std::fs::remove_file(cache_of(&other)).unwrap();
        std::fs::remove_file(&other).unwrap();
        assert!(foreign != good);
        rebuilt("another file's cache", &foreign);

        // Stale: the input rewritten (two sequences merged: the index changes) with its size and
        // modification time restored, after the cache was written. Change times have a clock tick's
        // resolution: a tick passes first.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let len = std::fs::metadata(&input).unwrap().len();
        let text = std::fs::read_to_string(&input).unwrap().replacen("\n1501 |a", "\n1500 |a", 1);
        std::fs::write(&input, &text).unwrap();
        std::fs::File::options().write(true).open(&input).unwrap().set_modified(t).unwrap();
        let meta = std::fs::metadata(&input).unwrap();
        assert_eq!((meta.len(), meta.modified().unwrap()), (len, t));
        let stale = std::fs::read(&cache).unwrap();
        std::fs::remove_file(&cache).unwrap();
        let now = dump(&input, false);
        assert_ne!(now, expect, "the rewritten file has other sequences");
        std::fs::write(&cache, &stale).unwrap();
        assert_eq!(dump(&input, true), now, "a stale cache");
        let fresh = std::fs::read(&cache).unwrap();
        assert!(fresh != stale, "the stale cache is rebuilt");
        std::fs::remove_file(&cache).unwrap();
        dump(&input, true);
        assert!(std::fs::read(&cache).unwrap() == fresh, "as a run without a cache writes it");
    }
}
