//! A clear error instead of "Bus error" when a memory-mapped input shrinks while it is read.
//!
//! Reading a page of a mapped file that was truncated after it was mapped (or that the disk cannot
//! deliver) raises `SIGBUS`, whose default action kills the process without a word and leaves the
//! conversion's temporary file behind. The `cntkio` binary installs a handler (`main.rs`) that calls
//! [`explain_sigbus`]: with a conversion armed, it removes the temporary output file, says what
//! happened, and the process exits as for other I/O errors. Everything here is prepared beforehand, so
//! that the handler only reads memory that is never freed or changed and makes system calls that are
//! safe in a signal handler (`write`, `unlink`).

use std::ffi::{CStr, CString};
use std::path::Path;
use std::sync::OnceLock;

/// The message's parts, made when a conversion is armed.
struct Armed {
    /// The error line.
    head: Box<[u8]>,
    /// The output's name, for the notes.
    output: Box<[u8]>,
    /// The `help:` line.
    help: Box<[u8]>,
}

static ARMED: OnceLock<Armed> = OnceLock::new();
static TEMPORARY: OnceLock<CString> = OnceLock::new();

/// Arms the message for a conversion of `input`, mapped into memory, into `output` (the first call of
/// a process wins: a command converts one file). `no_map` is how to read without a map (a flag to add
/// or to leave out).
pub(crate) fn arm(input: &Path, output: &Path, no_map: &str) {
    let head = format!(
        "error[E2001]: cannot read {}: it became shorter or unreadable while it was memory-mapped, so the \
         conversion stopped (SIGBUS)\n",
        input.display()
    );
    let help = format!("  = help: convert again once the file is complete, or {no_map} to read it without a map\n");
    let _ = ARMED.set(Armed {
        head: head.into_bytes().into(),
        output: output.display().to_string().into_bytes().into(),
        help: help.into_bytes().into(),
    });
}

/// Notes the conversion's temporary output file, for [`explain_sigbus`] to remove (a
/// [`cntkio::convert::CtfToCbf::on_temporary_file`] hook).
pub(crate) fn note_temporary_file(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
            let _ = TEMPORARY.set(c);
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// What the `SIGBUS` handler does once a conversion is armed: removes the temporary output file noted
/// (with `remove`, which says whether it succeeded) and writes the message (with `write`). Returns
/// `false`, doing nothing, when nothing is armed: the signal is then not cntkio's to explain.
///
/// Safe to call in a signal handler when `write` and `remove` are: it allocates nothing and only reads
/// values set once and never freed.
pub fn explain_sigbus(write: &mut dyn FnMut(&[u8]), remove: &dyn Fn(&CStr) -> bool) -> bool {
    let Some(a) = ARMED.get() else { return false };
    write(&a.head);
    write(b"  = note: ");
    write(&a.output);
    match TEMPORARY.get() {
        Some(t) if remove(t) => write(b" was not written; its partial temporary file was removed\n"),
        Some(t) => {
            write(b" was not written; its partial temporary file remains: ");
            write(t.to_bytes());
            write(b"\n");
        }
        None => write(b" was not written; a partial temporary file whose name starts with '.' may remain beside it\n"),
    }
    write(&a.help);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_says_what_happened_and_what_became_of_the_output() {
        let mut out = Vec::new();
        assert!(!explain_sigbus(&mut |b| out.extend_from_slice(b), &|_| true), "nothing armed, nothing said");
        assert!(out.is_empty());

        arm(Path::new("in.ctf"), Path::new("out/x.cbf"), "pass --no-mmap");
        let said = |removed: bool| {
            let mut out = Vec::new();
            let mut asked = None;
            let seen = std::cell::RefCell::new(&mut asked);
            assert!(explain_sigbus(&mut |b| out.extend_from_slice(b), &|p| {
                **seen.borrow_mut() = Some(p.to_owned());
                removed
            }));
            (String::from_utf8(out).unwrap(), asked)
        };
        let (before, asked) = said(true);
        assert!(asked.is_none(), "no temporary file noted yet: nothing to remove");
        assert!(before.starts_with("error[E2001]: cannot read in.ctf: it became shorter"), "{before}");
        assert!(
            before.contains("  = note: out/x.cbf was not written; a partial temporary file whose name"),
            "{before}"
        );
        assert!(before.ends_with(
            "  = help: convert again once the file is complete, or pass --no-mmap to read it without a map\n"
        ));

        note_temporary_file(Path::new("out/.x.cbf.abc.tmp"));
        let (removed, asked) = said(true);
        assert_eq!(asked.as_deref(), Some(c"out/.x.cbf.abc.tmp"));
        assert!(removed.contains("  = note: out/x.cbf was not written; its partial temporary file was removed\n"));
        let (kept, _) = said(false);
        assert!(kept.contains("its partial temporary file remains: out/.x.cbf.abc.tmp\n"), "{kept}");
    }
}
