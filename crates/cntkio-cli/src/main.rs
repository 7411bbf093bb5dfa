//! The `cntkio` binary.

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    handle_signals();
    let code = cntkio_cli::run(std::env::args_os());
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Some(sig) = cntkio_cli::stopped_by() {
        // A conversion stopped by an interrupt (see `on_interrupt`) ends as the signal would have ended it.
        default_action(sig);
    }
    code
}

/// Signals that end a conversion: `SIGBUS` (a memory-mapped input truncated while it is read), `SIGINT`
/// and `SIGTERM`. Their handlers remove the conversion's temporary output and say what happened (see
/// `cntkio_cli::explain_sigbus` and `explain_interrupt`), instead of the shell's bare "Bus error" or
/// nothing, with a hidden partial file left behind.
fn handle_signals() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: each `sa` is fully initialised (zeroed, then the fields set); the handlers installed only
    // make async-signal-safe calls (see them). Called before any other thread exists.
    unsafe {
        let handlers: [(libc::c_int, usize); 3] = [
            (libc::SIGBUS, on_sigbus as *const () as usize),
            (libc::SIGINT, on_interrupt as *const () as usize),
            (libc::SIGTERM, on_interrupt as *const () as usize),
        ];
        for (sig, handler) in handlers {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Writes to stderr and removes a file, as the handlers' `explain_*` calls need (async-signal-safe).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn explain(f: cntkio_cli::Explain) -> bool {
    // SAFETY (both closures): `write` and `unlink` are async-signal-safe; the slices and the C string are
    // valid for the calls (`explain_*` hand out memory that is never freed). A file already gone counts
    // as removed.
    let mut write = |b: &[u8]| unsafe {
        libc::write(2, b.as_ptr().cast(), b.len());
    };
    let remove =
        |p: &std::ffi::CStr| unsafe { libc::unlink(p.as_ptr()) == 0 || *libc::__errno_location() == libc::ENOENT };
    f(&mut write, &remove)
}

/// Ends the process by `sig` with its default action, as if no handler had been installed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn default_action(sig: libc::c_int) {
    // SAFETY: `signal` and `raise` are async-signal-safe. The signal is blocked while its handler runs,
    // so the raised one is delivered on return, with the default action restored.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// In a handler that is not the first (see `first_to_end`): the first is explaining and ending the
/// process (every handler ends it), so this thread waits for that without a word.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn wait_for_the_end() -> ! {
    loop {
        // SAFETY: `pause` is async-signal-safe; it only suspends this thread until a signal arrives.
        unsafe {
            libc::pause();
        }
    }
}

/// The `SIGBUS` handler. A fault (a positive `si_code`, set by the kernel) during a conversion that maps
/// its input is explained and ends the process with the I/O error code; anything else gets the default
/// action.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    if !cntkio_cli::first_to_end() {
        wait_for_the_end();
    }
    // SAFETY: the kernel passes a valid `siginfo_t` to a handler installed with `SA_SIGINFO`.
    let fault = !info.is_null() && unsafe { (*info).si_code } > 0;
    if fault && explain(cntkio_cli::explain_sigbus) {
        // SAFETY: `_exit` is async-signal-safe and ends the process at once.
        unsafe { libc::_exit(libc::c_int::from(cntkio_cli::EXIT_USAGE)) }
    }
    default_action(sig);
}

/// The `SIGINT` and `SIGTERM` handler: the first interrupt of a conversion into an object asks it to stop
/// (it aborts its upload; `main` then ends by the signal); otherwise, during a conversion, removes its
/// temporary output and says so, then the signal ends the process as it would have (the shell sees it).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn on_interrupt(sig: libc::c_int, _info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    #[allow(unsafe_code)]
    // SAFETY: `write` is async-signal-safe; the slices are valid for the call.
    let mut write = |b: &[u8]| unsafe {
        libc::write(2, b.as_ptr().cast(), b.len());
    };
    if cntkio_cli::ask_to_stop(sig, &mut write) {
        return;
    }
    if !cntkio_cli::first_to_end() {
        wait_for_the_end();
    }
    explain(cntkio_cli::explain_interrupt);
    default_action(sig);
}

/// glibc's allocator maps each large buffer (a parsed chunk's arrays) afresh and unmaps it when freed,
/// so every chunk pays for new zero-filled pages (page faults and clearing, a large share of a sparse parse).
/// Raising the thresholds lets freed buffers be reused by the next chunks; the peak memory is the same.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `mallopt` only sets allocator parameters; it is called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}
