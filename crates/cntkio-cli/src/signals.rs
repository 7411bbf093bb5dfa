//! What becomes of a conversion the process cannot finish: interrupted (`SIGINT`, `SIGTERM`), or stopped by
//! `SIGBUS` because a memory-mapped input shrank (or the disk could not deliver it) while it was read.
//!
//! Without help, such a signal kills the process without a word ("Bus error", or nothing at all) and leaves
//! the conversion's temporary output file behind, a hidden file as large as the part already written. The
//! `cntkio` binary installs handlers (`main.rs`) that call [`explain_interrupt`] and [`explain_sigbus`]:
//! during a conversion, they remove the temporary output file and say what happened. Everything they use
//! is prepared beforehand here, so that a handler only reads memory that is never freed (values set once)
//! and makes system calls that are safe in a signal handler (`write`, `unlink`).

use std::ffi::{CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The output of the conversion under way, for the messages.
static OUTPUT: OnceLock<Box<[u8]>> = OnceLock::new();
/// Its temporary file.
static TEMPORARY: OnceLock<CString> = OnceLock::new();
/// A conversion is under way (from [`begin_conversion`] until [`end_conversion`]).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The `SIGBUS` message's parts, when the input is mapped.
static MAPPED: OnceLock<Mapped> = OnceLock::new();

struct Mapped {
    /// The error line.
    head: Box<[u8]>,
    /// The `help:` line.
    help: Box<[u8]>,
}

/// A conversion into `output` begins (a process converts one file: the first call wins).
pub(crate) fn begin_conversion(output: &Path) {
    let _ = OUTPUT.set(output.display().to_string().into_bytes().into());
    ACTIVE.store(true, Ordering::SeqCst);
}

/// The conversion ended (its output renamed into place, or removed on an error): nothing to clean up.
pub(crate) fn end_conversion() {
    ACTIVE.store(false, Ordering::SeqCst);
}

/// The conversion's hooks: its temporary output file is noted for the handlers to remove.
pub(crate) fn hooks() -> cntkio::convert::Hooks {
    cntkio::convert::Hooks { on_temporary_file: Some(note_temporary_file), cancel: None }
}

/// Notes the conversion's temporary output file, for the handlers to remove (a
/// [`cntkio::convert::Hooks::on_temporary_file`] hook).
fn note_temporary_file(path: &Path) {
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

/// The conversion reads `input` through a memory map: a `SIGBUS` is then explained. `no_map` is how to
/// read without a map (a flag to add or to leave out).
pub(crate) fn input_is_mapped(input: &Path, no_map: &str) {
    let head = format!(
        "error[E2001]: cannot read {}: it became shorter or unreadable while it was memory-mapped, so the \
         conversion stopped (SIGBUS)\n",
        input.display()
    );
    let help = format!("  = help: convert again once the file is complete, or {no_map} to read it without a map\n");
    let _ = MAPPED.set(Mapped { head: head.into_bytes().into(), help: help.into_bytes().into() });
}

/// [`explain_sigbus`] or [`explain_interrupt`]: given how to write to stderr and how to remove a file
/// (saying whether it is gone), they clean up and say what happened, or return `false`.
pub type Explain = fn(&mut dyn FnMut(&[u8]), &dyn Fn(&CStr) -> bool) -> bool;

/// Removes the temporary output (with `remove`, which says whether it is gone) and writes what became of
/// the output after `lead`.
fn clean_up(lead: &[u8], write: &mut dyn FnMut(&[u8]), remove: &dyn Fn(&CStr) -> bool) {
    write(lead);
    write(OUTPUT.get().map_or(&b"the output"[..], |o| &**o));
    match TEMPORARY.get() {
        Some(t) if remove(t) => write(b" was not written; its partial temporary file was removed\n"),
        Some(t) => {
            write(b" was not written; its partial temporary file remains: ");
            write(t.to_bytes());
            write(b"\n");
        }
        None => write(b" was not written\n"),
    }
}

/// What the `SIGBUS` handler does during a conversion that maps its input: removes the temporary output
/// file noted (with `remove`, which says whether it is gone) and writes the message (with `write`).
/// Returns `false`, doing nothing, otherwise: the signal is then not cntkio's to explain.
///
/// Safe to call in a signal handler when `write` and `remove` are: it allocates nothing and only reads
/// atomics and values set once and never freed.
pub fn explain_sigbus(write: &mut dyn FnMut(&[u8]), remove: &dyn Fn(&CStr) -> bool) -> bool {
    let Some(m) = MAPPED.get() else { return false };
    if !ACTIVE.load(Ordering::SeqCst) {
        return false;
    }
    write(&m.head);
    clean_up(b"  = note: ", write, remove);
    write(&m.help);
    true
}

/// What the `SIGINT` and `SIGTERM` handlers do during a conversion: remove the temporary output file
/// noted and say so. Returns `false`, doing nothing, when no conversion is under way. Safe in a signal
/// handler as [`explain_sigbus`] is.
pub fn explain_interrupt(write: &mut dyn FnMut(&[u8]), remove: &dyn Fn(&CStr) -> bool) -> bool {
    if !ACTIVE.load(Ordering::SeqCst) {
        return false;
    }
    clean_up(b"\ncntkio: interrupted: ", write, remove);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// What a handler would say and remove, with `remove` succeeding or not.
    fn said(explain: Explain, removed: bool) -> (bool, String, Option<CString>) {
        let mut out = Vec::new();
        let asked = RefCell::new(None);
        let r = explain(&mut |b| out.extend_from_slice(b), &|p| {
            *asked.borrow_mut() = Some(p.to_owned());
            removed
        });
        (r, String::from_utf8(out).unwrap(), asked.into_inner())
    }

    // One test: the state is the process's.
    #[test]
    fn handlers_say_what_became_of_the_output_and_remove_its_temporary_file() {
        for explain in [explain_sigbus as Explain, explain_interrupt] {
            assert_eq!(said(explain, true), (false, String::new(), None), "no conversion, nothing said");
        }

        begin_conversion(Path::new("out/x.cbf"));
        assert!(!said(explain_sigbus, true).0, "the input is not mapped: SIGBUS is not explained");
        let (r, text, asked) = said(explain_interrupt, true);
        assert!(r && asked.is_none(), "no temporary file noted yet: nothing to remove");
        assert_eq!(text, "\ncntkio: interrupted: out/x.cbf was not written\n");

        input_is_mapped(Path::new("in.ctf"), "pass --no-mmap");
        note_temporary_file(Path::new("out/.x.cbf.abc.tmp"));
        let (r, text, asked) = said(explain_sigbus, true);
        assert!(r);
        assert_eq!(asked.as_deref(), Some(c"out/.x.cbf.abc.tmp"));
        assert_eq!(
            text,
            "error[E2001]: cannot read in.ctf: it became shorter or unreadable while it was memory-mapped, so the \
             conversion stopped (SIGBUS)\n  \
             = note: out/x.cbf was not written; its partial temporary file was removed\n  \
             = help: convert again once the file is complete, or pass --no-mmap to read it without a map\n"
        );
        let (_, text, _) = said(explain_interrupt, false);
        assert_eq!(
            text,
            "\ncntkio: interrupted: out/x.cbf was not written; its partial temporary file remains: \
             out/.x.cbf.abc.tmp\n"
        );

        end_conversion();
        for explain in [explain_sigbus as Explain, explain_interrupt] {
            assert_eq!(said(explain, true), (false, String::new(), None), "the conversion is over");
        }
    }
}
