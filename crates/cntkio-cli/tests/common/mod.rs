//! Running the `cntkio` binary from integration tests, shared by the test files (each uses a part of it).
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What one run of the binary gave.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Out {
    pub fn stdout(&self) -> String {
        String::from_utf8(self.stdout.clone()).expect("stdout is UTF-8")
    }
    /// Asserts the exit code, showing the output when it differs.
    pub fn code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            code,
            "exit code; stderr:\n{}\nstdout (first 2000 bytes):\n{}",
            self.stderr,
            String::from_utf8_lossy(&self.stdout[..self.stdout.len().min(2000)])
        );
        self
    }
    pub fn err_has(&self, needle: &str) -> &Self {
        assert!(self.stderr.contains(needle), "stderr lacks {needle:?}:\n{}", self.stderr);
        self
    }
    pub fn out_has(&self, needle: &str) -> &Self {
        assert!(self.stdout().contains(needle), "stdout lacks {needle:?}:\n{}", self.stdout());
        self
    }
}

pub fn cmd<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = Command::new(env!("CARGO_BIN_EXE_cntkio"));
    c.args(args).env_remove("RUST_LOG").env("RUST_BACKTRACE", "0").stdin(Stdio::null());
    c
}

pub fn run_cmd(mut c: Command) -> Out {
    let o = c.output().expect("run cntkio");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: o.stdout,
        stderr: String::from_utf8(o.stderr).expect("stderr is UTF-8"),
    }
}

pub fn run<I, S>(args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    run_cmd(cmd(args))
}

pub fn run_in<I, S>(dir: &Path, args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = cmd(args);
    c.current_dir(dir);
    run_cmd(c)
}

/// Builds an argument list from string-like pieces and paths.
macro_rules! args {
    ($($a:expr),* $(,)?) => {{
        let mut v: Vec<std::ffi::OsString> = Vec::new();
        $( $crate::common::push_arg(&mut v, $a); )*
        v
    }};
}

pub trait ArgPiece {
    fn push_to(self, v: &mut Vec<std::ffi::OsString>);
}
impl ArgPiece for &str {
    fn push_to(self, v: &mut Vec<std::ffi::OsString>) {
        v.push(self.into());
    }
}
impl ArgPiece for &String {
    fn push_to(self, v: &mut Vec<std::ffi::OsString>) {
        v.push(self.into());
    }
}
impl ArgPiece for &PathBuf {
    fn push_to(self, v: &mut Vec<std::ffi::OsString>) {
        v.push(self.into());
    }
}
impl ArgPiece for &Path {
    fn push_to(self, v: &mut Vec<std::ffi::OsString>) {
        v.push(self.into());
    }
}
impl ArgPiece for &[&str] {
    fn push_to(self, v: &mut Vec<std::ffi::OsString>) {
        v.extend(self.iter().map(|s| s.into()));
    }
}
impl<const N: usize> ArgPiece for &[&str; N] {
    fn push_to(self, v: &mut Vec<std::ffi::OsString>) {
        v.extend(self.iter().map(|s| s.into()));
    }
}
pub fn push_arg(v: &mut Vec<std::ffi::OsString>, a: impl ArgPiece) {
    a.push_to(v);
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

pub fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write fixture");
    p
}

/// The names in `dir`.
pub fn dir_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// Writes a sparse CTF file of 72 MB (`-s x:1000:sparse -s y:10:sparse`): long enough to convert that a
/// test can act while the conversion runs.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn big_sparse_ctf(path: &Path) {
    sparse_ctf(path, 300_000);
}

/// Writes a sparse CTF file of `rows` sequences of 243 bytes each (`-s x:1000:sparse -s y:10:sparse`).
pub fn sparse_ctf(path: &Path, rows: usize) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let row: String = (0..40).map(|k| format!("{}:1 ", k * 97 % 1000)).collect();
    for i in 0..rows {
        writeln!(f, "|x {row}|y {}:1", i % 10).unwrap();
    }
    f.flush().unwrap();
}

/// Starts `cntkio args`, waits until `ready` holds (checked against the child's pid, in a loop), runs
/// `act`, and returns how the child ended and its stderr.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn act_while_running(
    args: Vec<std::ffi::OsString>,
    ready: impl Fn(u32) -> bool,
    act: impl FnOnce(u32),
) -> (std::process::ExitStatus, String) {
    let child = cmd(args).stderr(Stdio::piped()).spawn().expect("run cntkio");
    let t = std::time::Instant::now();
    while !ready(child.id()) {
        assert!(t.elapsed().as_secs() < 60, "the conversion never got there");
    }
    act(child.id());
    let o = child.wait_with_output().unwrap();
    (o.status, String::from_utf8(o.stderr).unwrap())
}

/// A temporary output file (its name starts with '.') in `dir` has bytes: the conversion is past
/// creating it (and noting it for the signal handlers), and writing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn writes_temporary(dir: &Path) -> bool {
    dir_names(dir).iter().any(|n| n.starts_with('.') && std::fs::metadata(dir.join(n)).is_ok_and(|m| m.len() > 0))
}

/// Sends `signal` to `pid` with kill(1).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn kill(signal: &str, pid: u32) {
    let ok = Command::new("kill").args([format!("-{signal}"), pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill -{signal} {pid}");
}
