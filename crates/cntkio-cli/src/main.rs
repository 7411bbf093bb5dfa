//! The `cntkio` binary.

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    cntkio_cli::run(std::env::args_os())
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
