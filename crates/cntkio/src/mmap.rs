//! The one module of cntkio with `unsafe` code: mapping a file read-only into memory.
//!
//! Mapping is only used when the caller opts in (`CbfOptions::mmap`, `Access::Mmap`); positional
//! `read`s are the default and the fallback.
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
