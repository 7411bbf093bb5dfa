//! The one module of cntkio with `unsafe` code: mapping a file read-only into memory, and guarding the
//! maps of CBF files against the file shrinking while they are read ([`MapGuard`]).
//!
//! Mapping is only used when the caller asks for it (`CbfOptions::mmap`, `Access::Mmap`); positional
//! `read`s are the fallback.
#![allow(unsafe_code)]

use memmap2::Mmap;
use std::fs::File;
use std::io;

/// Maps the whole of `file` read-only.
///
/// This is a safe function because opting in to memory mapping is the caller's promise (documented on
/// `CbfOptions::mmap`); the promise is what makes the `unsafe` call below sound.
///
/// # Safety
///
/// The file must not be modified or truncated, by this process or any other, while the map (or any
/// slice borrowed from it) is alive. Modifying it makes the mapped bytes change under Rust references
/// that assume they are immutable (undefined behaviour); truncating it makes reads of the lost pages
/// raise `SIGBUS`. cntkio's own writers never modify a file in place: they write a temporary file and
/// rename it over the target, which leaves an existing map of the old file intact.
pub(crate) fn map_readonly(file: &File) -> io::Result<Mmap> {
    let len_before = file.metadata()?.len();
    // SAFETY: the map is read-only and private to this process's address space; the caller opted in
    // and promised (see `# Safety`) that nothing modifies or truncates the file while it is mapped.
    // Every read of the map goes through bounds-checked slices of `Mmap`'s `Deref<Target = [u8]>`.
    let map = unsafe { Mmap::map(file) }?;
    debug_assert_eq!(map.len() as u64, len_before, "the file changed size while it was being mapped");
    #[cfg(unix)]
    {
        // Mostly sequential scans; a failed hint is harmless.
        let _ = map.advise(memmap2::Advice::Sequential);
    }
    Ok(map)
}

/// Maps the pages of `[offset, offset + len)` in one system call before they are read (cheaper than one
/// page fault per 4 KiB). A hint: failure (old kernels, other systems) changes nothing.
pub(crate) fn prefault(map: &Mmap, offset: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let page = 4096;
        let start = offset / page * page;
        let end = offset.saturating_add(len).min(map.len());
        if end > start {
            let _ = map.advise_range(memmap2::Advice::PopulateRead, start, end - start);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (map, offset, len);
}

/// Takes the whole pages inside `[offset, offset + len)` out of this process's resident set
/// (`MADV_DONTNEED`), for a pass that is done with them: a streaming pass over a mapped file then
/// keeps its memory bounded by what it has in flight instead of growing to the file's size. The page
/// cache keeps the pages, so a later read of them is a cheap minor fault. A hint: failure (other
/// systems, another page size) changes nothing.
pub(crate) fn release(map: &Mmap, offset: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let page = 4096;
        let start = offset.div_ceil(page).saturating_mul(page);
        let end = offset.saturating_add(len).min(map.len()) / page * page;
        if end > start {
            // SAFETY: `Mmap::map` makes a read-only *shared* mapping of a file. Dropping its pages only
            // unmaps them from this process: the next access maps the same file page again from the
            // page cache (or the disk), so every byte read through the map, including through slices
            // borrowed from it, stays what the file holds; nothing reverts, as it would for a private or
            // anonymous mapping. The range is inside the map.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (map, offset, len);
}

/// Maps whose file may shrink while they are read: a read of a page the file lost raises `SIGBUS`, which
/// would end the process. For a guarded map, this module's handler instead puts zero pages in place of
/// the rest of the map (so the read that faulted, and any later one, completes) and marks the map lost;
/// the readers of a guarded map check the mark after they copy from it ([`MapGuard::lost`]) and fail with
/// an I/O error, so the zeros never pass for data. A `SIGBUS` outside every guarded map goes to the
/// handler that was installed before (the `cntkio` command's, Python's `faulthandler`, or the default
/// action).
#[cfg(target_os = "linux")]
mod guard {
    use std::ffi::{c_int, c_void};
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
    use std::sync::OnceLock;

    /// Guarded maps alive at once, at most; a map beyond them is not guarded (its file is read instead).
    const SLOTS: usize = 1024;

    struct Slot {
        used: AtomicBool,
        /// The map's first byte; 0 while the slot is free. Set after `len`, cleared first.
        start: AtomicUsize,
        len: AtomicUsize,
        lost: AtomicBool,
    }

    static TABLE: [Slot; SLOTS] = [const {
        Slot {
            used: AtomicBool::new(false),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            lost: AtomicBool::new(false),
        }
    }; SLOTS];
    /// The `SIGBUS` action this module's hands other faults to: its handler (or `SIG_DFL`, `SIG_IGN`) and
    /// flags, set before this module's handler is installed.
    static PREVIOUS_ACTION: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
    static PREVIOUS_FLAGS: AtomicI32 = AtomicI32::new(0);
    /// The handler is installed (at the first guarded map).
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    static PAGE: AtomicUsize = AtomicUsize::new(4096);

    /// A registered map (see the module); unregistered when dropped.
    #[derive(Debug)]
    pub(crate) struct MapGuard {
        slot: usize,
    }

    impl MapGuard {
        /// Guards the `len` bytes mapped at `start`; `None` if the handler cannot be installed or every
        /// slot is taken.
        pub(crate) fn new(start: *const u8, len: usize) -> Option<MapGuard> {
            if len == 0 || !install() {
                return None;
            }
            let slot = TABLE
                .iter()
                .position(|s| s.used.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok())?;
            let s = &TABLE[slot];
            s.lost.store(false, Ordering::SeqCst);
            s.len.store(len, Ordering::SeqCst);
            s.start.store(start as usize, Ordering::SeqCst);
            Some(MapGuard { slot })
        }

        /// Whether a read found the file shorter than the map (the map reads zeros from there on).
        pub(crate) fn lost(&self) -> bool {
            TABLE[self.slot].lost.load(Ordering::SeqCst)
        }
    }

    impl Drop for MapGuard {
        fn drop(&mut self) {
            let s = &TABLE[self.slot];
            s.start.store(0, Ordering::SeqCst);
            s.len.store(0, Ordering::SeqCst);
            s.used.store(false, Ordering::Release);
        }
    }

    /// Installs the handler once; whether it is installed.
    fn install() -> bool {
        *INSTALLED.get_or_init(|| {
            #[allow(unsafe_code)]
            // SAFETY: `sysconf` has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if page > 0 {
                PAGE.store(page as usize, Ordering::SeqCst);
            }
            arm()
        })
    }

    /// Makes this module's handler the `SIGBUS` action again if another replaced it since it was installed
    /// (PyTorch's DataLoader workers install a handler of their own, which ends the process), handing
    /// other faults to that one; whether it is the action. Only where the handler that replaced it does not
    /// hand faults back to this one (which would make a fault outside the maps go round for ever). Nothing
    /// happens before the first guarded map.
    pub(crate) fn rearm() {
        if INSTALLED.get() == Some(&true) {
            arm();
        }
    }

    fn arm() -> bool {
        #[allow(unsafe_code)]
        // SAFETY: each `sigaction` struct is zeroed and then set field by field; `sigaction` reads the new
        // action and writes the current one into valid memory. The handler only makes calls that are safe
        // in a signal handler (see `on_sigbus`).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return false;
            }
            let ours = on_sigbus as *const () as libc::sighandler_t;
            if old.sa_sigaction == ours {
                return true;
            }
            PREVIOUS_FLAGS.store(old.sa_flags, Ordering::SeqCst);
            PREVIOUS_ACTION.store(old.sa_sigaction, Ordering::SeqCst);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ours;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) == 0
        }
    }

    #[allow(unsafe_code)]
    extern "C" fn on_sigbus(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        // SAFETY: the kernel passes a valid `siginfo_t` to an `SA_SIGINFO` handler; `si_addr` is the
        // faulting address for a fault (`si_code` > 0).
        let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
        if code > 0 {
            for s in &TABLE {
                let start = s.start.load(Ordering::SeqCst);
                let len = s.len.load(Ordering::SeqCst);
                if start == 0 || addr.wrapping_sub(start) >= len {
                    continue;
                }
                // Marked before the zero pages exist: whoever reads a zero checks the mark after.
                s.lost.store(true, Ordering::SeqCst);
                let page = PAGE.load(Ordering::SeqCst);
                let from = addr & !(page - 1);
                let end = (start + len).div_ceil(page) * page;
                // SAFETY: `[from, end)` lies in the map registered in this slot (its pages, rounded to
                // whole pages): the map is alive, since a thread was reading it, and stays registered until
                // it is unmapped. Zero pages, read-only, replace the file's there; `munmap` of the map later
                // removes them with the rest. `mmap` is a plain system call, safe in a signal handler.
                let r = unsafe {
                    libc::mmap(
                        from as *mut c_void,
                        end - from,
                        libc::PROT_READ,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                        -1,
                        0,
                    )
                };
                if r != libc::MAP_FAILED {
                    return; // the read is retried, and finds zeros
                }
                break;
            }
        }
        previous(sig, info, ctx);
    }

    /// Hands the signal to the action installed before this module's.
    #[allow(unsafe_code)]
    fn previous(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let action = PREVIOUS_ACTION.load(Ordering::SeqCst);
        let flags = PREVIOUS_FLAGS.load(Ordering::SeqCst);
        // SAFETY: the previous action is either SIG_DFL, SIG_IGN or a handler of the kind its flags say
        // (`SA_SIGINFO`: three arguments), as whoever installed it declared it; calling it with this
        // signal's arguments is what the kernel would have done. `signal` and `raise` are safe in a signal
        // handler.
        unsafe {
            if action == libc::SIG_DFL || action == libc::SIG_IGN {
                // The default action, as without this handler: a fault is retried on return and ends the
                // process; a signal sent by `kill` is raised again (it is delivered on return).
                libc::signal(sig, libc::SIG_DFL);
                let code = (*info).si_code;
                if code <= 0 {
                    libc::raise(sig);
                }
            } else if flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = std::mem::transmute(action);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(c_int) = std::mem::transmute(action);
                f(sig);
            }
        }
    }
}

#[cfg(target_os = "linux")]
pub(crate) use guard::MapGuard;

/// Makes the handler that guards memory-mapped CBF files (`CbfOptions::mmap`) the `SIGBUS` action again,
/// if another replaced it since the first such map was made: PyTorch's DataLoader workers install a
/// handler of their own, which ends the worker (with a message about shared memory) when a mapped file
/// shrinks, where the guard would have given an error naming the file. The replaced handler still gets
/// every other `SIGBUS`. Call it where the handler that replaced it is known not to hand faults back to
/// the guard's (`cntkio.torch` calls it as a worker starts to read).
pub fn rearm_map_guard() {
    #[cfg(target_os = "linux")]
    guard::rearm();
}

/// No guard off Linux (the handler is Linux's): `InputFile::guard_map` then reads the file instead of
/// mapping it.
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
pub(crate) struct MapGuard;

#[cfg(not(target_os = "linux"))]
impl MapGuard {
    pub(crate) fn new(_start: *const u8, _len: usize) -> Option<MapGuard> {
        None
    }
    pub(crate) fn lost(&self) -> bool {
        false
    }
}
