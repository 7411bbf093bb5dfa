//! What becomes of a command the process cannot finish: a conversion interrupted (`SIGINT`, `SIGTERM`),
//! or a conversion or validation stopped by `SIGBUS` because a memory-mapped input shrank (or the disk
//! could not deliver it) while it was read.
//!
//! Without help, such a signal kills the process without a word ("Bus error", or nothing at all), and a
//! conversion leaves its temporary output file behind, a hidden file as large as the part already
//! written. The `cntkio` binary installs handlers (`main.rs`) that call [`explain_interrupt`] and
//! [`explain_sigbus`]: they remove a conversion's temporary output file and say what happened.
//! Everything they use is prepared beforehand here, so that a handler only reads atomics and memory
//! that is never freed (values set once) and makes system calls that are safe in a signal handler
//! (`write`, `unlink`).

use std::ffi::{CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The output of the conversion under way, for the messages.
static OUTPUT: OnceLock<Box<[u8]>> = OnceLock::new();
/// Its temporary file's names as noted: a name is noted before the file is made, and a name found taken
/// is followed by another. Each is set once and never freed; [`LAST_TEMPORARY`] says which is current.
static TEMPORARY: [OnceLock<CString>; 8] = [const { OnceLock::new() }; 8];
/// The index in [`TEMPORARY`] of the name noted last; `usize::MAX` for none (also when more names were
/// tried than there are places: the handlers then remove nothing rather than a file of another name).
static LAST_TEMPORARY: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Names noted so far.
static NOTED: AtomicUsize = AtomicUsize::new(0);
/// A conversion is under way (from [`begin_conversion`] until [`end_conversion`]).
static CONVERTING: AtomicBool = AtomicBool::new(false);
/// The `SIGBUS` messages, one per input the command may map ([`prepare_for_maps`]).
static MAPPED: OnceLock<Vec<Mapped>> = OnceLock::new();
/// Which of them is being read through a map ([`reading_mapped`]); `usize::MAX` for none.
static READING: AtomicUsize = AtomicUsize::new(usize::MAX);
/// A handler is ending the process ([`first_to_end`]).
static ENDING: AtomicBool = AtomicBool::new(false);
/// The conversion under way writes an object: an interrupt asks it to stop ([`ask_to_stop`]).
static TO_OBJECT: AtomicBool = AtomicBool::new(false);
/// The signal that asked the conversion to stop; 0 for none.
static STOP: AtomicI32 = AtomicI32::new(0);

/// `true` for the first handler to ask, which goes on to explain and end the process; `false` for any
/// other, which must wait for the end without a word. Two threads reading a truncated map both get a
/// `SIGBUS`: without this, both said so, and one's message cut into the other's. Safe in a signal handler
/// (an atomic swap).
pub fn first_to_end() -> bool {
    !ENDING.swap(true, Ordering::SeqCst)
}

/// A `SIGBUS` message's parts.
struct Mapped {
    /// The error line.
    head: Box<[u8]>,
    /// The `help:` line.
    help: Box<[u8]>,
}

/// What a command does with the inputs it maps, for the messages.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Task {
    Conversion,
    Validation,
}

/// Prepares the `SIGBUS` messages for `inputs` (once per process: a command calls it before reading),
/// each with how to read it without a map (say "pass --no-mmap").
pub(crate) fn prepare_for_maps(task: Task, inputs: &[(&Path, &str)]) {
    let (noun, again) = match task {
        Task::Conversion => ("conversion", "convert"),
        Task::Validation => ("validation", "validate"),
    };
    let messages = inputs
        .iter()
        .map(|(input, no_map)| Mapped {
            head: format!(
                "error[E2001]: cannot read {}: it became shorter or unreadable while it was memory-mapped, so the \
                 {noun} stopped (SIGBUS)\n",
                input.display()
            )
            .into_bytes()
            .into(),
            help: format!("  = help: {again} again once the file is complete, or {no_map} to read it without a map\n")
                .into_bytes()
                .into(),
        })
        .collect();
    let _ = MAPPED.set(messages);
}

/// Input `i` of those prepared is being read through a map (`None`: no mapped input is being read).
pub(crate) fn reading_mapped(i: Option<usize>) {
    READING.store(i.unwrap_or(usize::MAX), Ordering::SeqCst);
}

/// A conversion into `output` begins (a process converts one file: the first call wins).
pub(crate) fn begin_conversion(output: &Path) {
    let _ = OUTPUT.set(output.display().to_string().into_bytes().into());
    TO_OBJECT.store(cntkio::remote::is_url(output), Ordering::SeqCst);
    CONVERTING.store(true, Ordering::SeqCst);
}

/// The conversion ended (its output renamed into place, or removed on an error): nothing to clean up.
pub(crate) fn end_conversion() {
    CONVERTING.store(false, Ordering::SeqCst);
}

/// The conversion's hooks: its temporary output file is noted for the handlers to remove.
pub(crate) fn hooks() -> cntkio::convert::Hooks {
    cntkio::convert::Hooks { on_temporary_file: Some(note_temporary_file), cancel: Some(stop_asked) }
}

/// Whether an interrupt asked the conversion to stop (its [`cntkio::convert::Hooks::cancel`] hook).
fn stop_asked() -> bool {
    STOP.load(Ordering::SeqCst) != 0
}

/// The signal that asked the conversion to stop ([`ask_to_stop`]), once the conversion has stopped: the
/// binary then ends by it, as the signal would have ended it.
pub fn stopped_by() -> Option<i32> {
    Some(STOP.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// What the `SIGINT` and `SIGTERM` handlers do first: the first interrupt of a conversion into an object
/// asks it to stop, and says so, instead of ending the process: the conversion then stops at its next
/// check (a chunk written, a part sent, or within 50 ms during an upload), aborts the upload under way,
/// so that the store keeps neither the object nor the parts sent, and removes its temporary file. Returns
/// `false`, doing nothing, otherwise (no such conversion, or an interrupt already asked): the handler then
/// ends the process at once. Safe in a signal handler as [`explain_sigbus`] is.
pub fn ask_to_stop(sig: i32, write: &mut dyn FnMut(&[u8])) -> bool {
    if !CONVERTING.load(Ordering::SeqCst) || !TO_OBJECT.load(Ordering::SeqCst) {
        return false;
    }
    if STOP.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return false;
    }
    write(b"\ncntkio: interrupted: stopping; ");
    write(output());
    write(b" will not be written (interrupt again to end at once)\n");
    true
}

/// Notes the conversion's temporary output file, for the handlers to remove (a
/// [`cntkio::convert::Hooks::on_temporary_file`] hook).
fn note_temporary_file(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let i = NOTED.fetch_add(1, Ordering::SeqCst);
        let set = match (TEMPORARY.get(i), CString::new(path.as_os_str().as_bytes())) {
            (Some(slot), Ok(c)) => slot.set(c).is_ok(),
            _ => false,
        };
        LAST_TEMPORARY.store(if set { i } else { usize::MAX }, Ordering::SeqCst);
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// The output of the conversion under way, as the messages name it. Safe in a signal handler (a value set
/// once).
fn output() -> &'static [u8] {
    OUTPUT.get().map_or(&b"the output"[..], |o| &**o)
}

/// The temporary file noted last, if any. Safe in a signal handler (an atomic load and reads of values
/// set once).
fn temporary() -> Option<&'static CString> {
    TEMPORARY.get(LAST_TEMPORARY.load(Ordering::SeqCst)).and_then(OnceLock::get)
}

/// [`explain_sigbus`] or [`explain_interrupt`]: given how to write to stderr and how to remove a file
/// (saying whether it is gone), they clean up and say what happened, or return `false`.
pub type Explain = fn(&mut dyn FnMut(&[u8]), &dyn Fn(&CStr) -> bool) -> bool;

/// During a conversion: removes the temporary output (with `remove`, which says whether it is gone) and
/// writes what became of the output after `lead`. Returns whether a conversion was under way.
fn clean_up(lead: &[u8], write: &mut dyn FnMut(&[u8]), remove: &dyn Fn(&CStr) -> bool) -> bool {
    if !CONVERTING.load(Ordering::SeqCst) {
        return false;
    }
    write(lead);
    write(output());
    match temporary() {
        Some(t) if remove(t) => write(b" was not written; its partial temporary file was removed\n"),
        Some(t) => {
            write(b" was not written; its partial temporary file remains: ");
            write(t.to_bytes());
            write(b"\n");
        }
        None => write(b" was not written\n"),
    }
    true
}

/// What the `SIGBUS` handler does while an input is read through a map: during a conversion, removes
/// the temporary output file noted (with `remove`, which says whether it is gone); writes the message
/// (with `write`). Returns `false`, doing nothing, otherwise: the signal is then not cntkio's to explain.
///
/// Safe to call in a signal handler when `write` and `remove` are: it allocates nothing and only reads
/// atomics and values set once and never freed.
pub fn explain_sigbus(write: &mut dyn FnMut(&[u8]), remove: &dyn Fn(&CStr) -> bool) -> bool {
    let Some(m) = MAPPED.get().and_then(|all| all.get(READING.load(Ordering::SeqCst))) else { return false };
    write(&m.head);
    clean_up(b"  = note: ", write, remove);
    write(&m.help);
    true
}

/// What the `SIGINT` and `SIGTERM` handlers do during a conversion: remove the temporary output file
/// noted and say so. Returns `false`, doing nothing, when no conversion is under way. Safe in a signal
/// handler as [`explain_sigbus`] is.
pub fn explain_interrupt(write: &mut dyn FnMut(&[u8]), remove: &dyn Fn(&CStr) -> bool) -> bool {
    clean_up(b"\ncntkio: interrupted: ", write, remove)
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

    /// Only the first handler to ask ends the process; every later one (another thread's `SIGBUS` at the
    /// same time) is told to wait.
    #[test]
    fn one_handler_ends_the_process() {
        assert!(first_to_end());
        assert!(!first_to_end());
        assert!(!first_to_end());
    }

    // One test: the state is the process's.
    #[test]
    fn handlers_say_what_became_of_the_output_and_remove_its_temporary_file() {
        let nothing = (false, String::new(), None);
        for explain in [explain_sigbus as Explain, explain_interrupt] {
            assert_eq!(said(explain, true), nothing, "no command under way, nothing said");
        }

        let inputs = [(Path::new("in.ctf"), "pass --no-mmap"), (Path::new("other.ctf"), "leave out --mmap")];
        prepare_for_maps(Task::Conversion, &inputs);
        assert_eq!(said(explain_sigbus, true), nothing, "no input read through a map yet");
        begin_conversion(Path::new("out/x.cbf"));
        let (r, text, asked) = said(explain_interrupt, true);
        assert!(r && asked.is_none(), "no temporary file noted yet: nothing to remove");
        assert_eq!(text, "\ncntkio: interrupted: out/x.cbf was not written\n");

        note_temporary_file(Path::new("out/.x.cbf.abc.tmp"));
        reading_mapped(Some(0));
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
        // A name found taken is followed by another: the one noted last is removed.
        note_temporary_file(Path::new("out/.x.cbf.def.tmp"));
        let (_, _, asked) = said(explain_interrupt, true);
        assert_eq!(asked.as_deref(), Some(c"out/.x.cbf.def.tmp"));

        // Not converting (say validating): the input is named, there is no output to speak of.
        end_conversion();
        reading_mapped(Some(1));
        let (r, text, asked) = said(explain_sigbus, true);
        assert!(r && asked.is_none());
        assert!(text.starts_with("error[E2001]: cannot read other.ctf: it became shorter"), "{text}");
        assert!(!text.contains("note:") && text.ends_with("or leave out --mmap to read it without a map\n"), "{text}");
        assert_eq!(said(explain_interrupt, true), nothing, "no conversion: the default action only");

        reading_mapped(None);
        for explain in [explain_sigbus as Explain, explain_interrupt] {
            assert_eq!(said(explain, true), nothing, "nothing under way");
        }
    }
}
