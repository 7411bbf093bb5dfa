//! Fault injection into everything that writes or reads a file: conversions killed at random moments, a
//! full disk, inputs truncated or failing while they are read, damaged index caches. Whatever happens, the
//! output path holds the old file, no file, or a complete conversion; nothing partial is left but a
//! recognisable temporary file after a `SIGKILL`; errors name the file and exit with the I/O status (2).

#[macro_use]
mod common;

use common::*;
use std::path::Path;

/// The schema of [`sparse_ctf`]'s files.
const SCHEMA: [&str; 4] = ["-s", "x:1000:sparse", "-s", "y:10:sparse"];

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

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod killed {
    use super::*;
    use cntkio::randomize::Mt19937_64;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

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
                        assert!(stderr.is_empty() || stderr == said, "{case}");
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
