//! The `cntkio` binary.

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    explain_sigbus();
    cntkio_cli::run(std::env::args_os())
}

/// A memory-mapped input truncated while it is read raises `SIGBUS`; this handler removes the
/// conversion's temporary output and says what happened (see `cntkio_cli::explain_sigbus`), then exits
/// as for an I/O error, instead of the shell's bare "Bus error".
fn explain_sigbus() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `sa` is fully initialised (zeroed, then the fields set); the handler installed only makes
    // async-signal-safe calls (see `on_sigbus`). Called before any other thread exists.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

/// The `SIGBUS` handler. A fault (a positive `si_code`, set by the kernel) during an armed conversion
/// is explained and ends the process with the I/O error code; anything else gets the default action,
/// as without a handler.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to a handler installed with `SA_SIGINFO`.
    let fault = !info.is_null() && unsafe { (*info).si_code } > 0;
    // SAFETY (both closures): `write` and `unlink` are async-signal-safe; the slices and the C string
    // are valid for the calls (`explain_sigbus` hands out memory that is never freed).
    let mut write = |b: &[u8]| unsafe {
        libc::write(2, b.as_ptr().cast(), b.len());
    };
    let remove = |p: &std::ffi::CStr| unsafe { libc::unlink(p.as_ptr()) == 0 };
    if fault && cntkio_cli::explain_sigbus(&mut write, &remove) {
        // SAFETY: `_exit` is async-signal-safe and ends the process at once.
        unsafe { libc::_exit(libc::c_int::from(cntkio_cli::EXIT_USAGE)) }
    }
    // SAFETY: `signal` and `raise` are async-signal-safe. The signal is blocked while its handler runs,
    // so the raised one is delivered on return, with the default action restored.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// glibc's allocator maps each large buffer (a parsed chunk's arrays) afresh and unmaps it when freed,
/// so every chunk pays for new zero-filled pages (page faults and clearing: 8–15 % of a sparse parse).
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
