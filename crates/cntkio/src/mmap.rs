//! The one audited `unsafe` module: memory-mapping an input file.

#![allow(unsafe_code)]

use std::fs::File;

/// Maps `file` read-only. Safe to call, but only on the caller's explicit opt-in ([`crate::Access::Mmap`]).
///
/// # Safety
/// The file must not be modified or truncated while it is mapped: a truncation makes later reads of the
/// mapping fault (SIGBUS) and a modification changes bytes under a `&[u8]`. Callers opt in to mapping
/// (cntkio's default is to read with `pread`), and cntkio's writers never truncate a file that may be
/// mapped (they write a temporary file and rename it).
pub(crate) fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only and cntkio never writes or truncates an input file; a change made
    // by another process while mapped is the risk the caller accepted by choosing `Access::Mmap`.
    let m = unsafe { memmap2::Mmap::map(file)? };
    #[cfg(unix)]
    {
        // Sequential scans dominate; a failed hint is harmless.
        let _ = m.advise(memmap2::Advice::Sequential);
    }
    Ok(m)
}
