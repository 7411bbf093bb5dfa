//! Input files: positional reads by default, a memory map on request; gzip and zstd files through a
//! decompressed view (see [`crate::compress`]); objects in an object store (`s3://…`, `http(s)://…`) through
//! ranged GETs (see [`crate::remote`]).

use crate::compress::{Compression, Decompressed, Source};
use crate::remote::Remote;
use crate::Error;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// How to access an input file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Positional reads into buffers (memory bounded by the buffers in flight).
    #[default]
    Read,
    /// A read-only memory map: no copies. The file must not be modified or truncated while it is open.
    Mmap,
    /// A memory map as [`Access::Mmap`] (with the same promise) for a regular, non-empty file that the
    /// system agrees to map; positional reads otherwise (a special file, or a file system that refuses
    /// to map it).
    Auto,
}

/// What identifies a file's content beyond its length and modification time, as the system records it at
/// open: its change time (which a user cannot set back: writing the file or setting its times updates it),
/// inode and device. Zero where the system has none of these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    /// Change time, seconds since the epoch.
    pub ctime_secs: i64,
    /// Change time, nanoseconds.
    pub ctime_nanos: i64,
    /// Inode number.
    pub inode: u64,
    /// Device number.
    pub device: u64,
}

impl FileIdentity {
    #[cfg(unix)]
    fn of(meta: &std::fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        FileIdentity { ctime_secs: meta.ctime(), ctime_nanos: meta.ctime_nsec(), inode: meta.ino(), device: meta.dev() }
    }
    #[cfg(not(unix))]
    fn of(_: &std::fs::Metadata) -> FileIdentity {
        FileIdentity::default()
    }
}

/// Why a read found fewer bytes than the file had when it was opened.
pub(crate) const SHORTER: &str = "the file is shorter than when it was opened (was it changed?)";

/// An open input file.
#[derive(Debug)]
pub struct InputFile {
    path: PathBuf,
    /// The local file; `None` for an object in an object store.
    file: Option<File>,
    remote: Option<Arc<Remote>>,
    len: u64,
    modified: Option<SystemTime>,
    identity: FileIdentity,
    map: Option<memmap2::Mmap>,
    /// The map's guard, for a file whose readers check it ([`InputFile::guard_map`]).
    guard: Option<crate::mmap::MapGuard>,
    compressed: Option<Decompressed>,
}

impl InputFile {
    /// Opens `path` for reading: a local file, or an object named by a URL (`s3://bucket/key`,
    /// `http(s)://host/path`), which is read and never mapped.
    pub fn open(path: &Path, access: Access) -> Result<InputFile, Error> {
        let shown = path.display().to_string();
        if crate::remote::is_url(path) {
            return InputFile::open_remote(path, &shown, access);
        }
        let file = File::open(path).map_err(|e| Error::io(format!("cannot open {shown}"), e))?;
        let meta = file.metadata().map_err(|e| Error::io(format!("cannot stat {shown}"), e))?;
        if meta.is_dir() {
            return Err(Error::io(
                format!("cannot read {shown}"),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "it is a directory"),
            ));
        }
        let len = meta.len();
        // Compression is told by the first bytes of regular files (other files cannot be read at an offset).
        let compressed = if meta.is_file() && len >= 4 {
            let mut head = [0u8; 5];
            let n = if len >= 5 { 5 } else { 4 };
            read_exact_at(&file, &mut head[..n], 0).map_err(|e| Error::io(format!("cannot read {shown}"), e))?;
            match crate::compress::detect(&head[..n]) {
                Some(codec) => {
                    let own = file.try_clone().map_err(|e| Error::io(format!("cannot open {shown}"), e))?;
                    Some(Decompressed::open(Source::File(Arc::new(own)), len, codec, path)?)
                }
                None => None,
            }
        } else {
            None
        };
        if compressed.is_some() && access == Access::Mmap {
            log::debug!("{shown} is compressed: reading it instead of mapping it");
        }
        let map = match access {
            _ if compressed.is_some() => None,
            Access::Mmap if len > 0 && meta.is_file() => {
                Some(crate::mmap::map_readonly(&file).map_err(|e| Error::io(format!("cannot map {shown}"), e))?)
            }
            Access::Auto if len > 0 && meta.is_file() => match crate::mmap::map_readonly(&file) {
                Ok(m) => Some(m),
                Err(e) => {
                    log::debug!("cannot map {shown} ({e}); reading it instead");
                    None
                }
            },
            Access::Read | Access::Mmap | Access::Auto => None,
        };
        let identity = FileIdentity::of(&meta);
        Ok(InputFile {
            path: path.to_path_buf(),
            file: Some(file),
            remote: None,
            len,
            modified: meta.modified().ok(),
            identity,
            map,
            guard: None,
            compressed,
        })
    }

    fn open_remote(path: &Path, url: &str, access: Access) -> Result<InputFile, Error> {
        InputFile::of_remote(path, Remote::open(url)?, access)
    }

    /// An object opened as `remote`, shown as `path`: read through its decompressed view when its first
    /// bytes say it is compressed.
    fn of_remote(path: &Path, remote: Remote, access: Access) -> Result<InputFile, Error> {
        let remote = Arc::new(remote);
        let len = remote.len();
        let compressed = if len >= 4 {
            let mut head = [0u8; 5];
            let n = remote.read_some(0, &mut head)?;
            match crate::compress::detect(&head[..n]) {
                Some(codec) => Some(Decompressed::open(Source::Object(remote.clone()), len, codec, path)?),
                None => None,
            }
        } else {
            None
        };
        if access == Access::Mmap {
            log::debug!("{} is an object in an object store: reading it instead of mapping it", path.display());
        }
        Ok(InputFile {
            path: path.to_path_buf(),
            file: None,
            modified: remote.modified(),
            remote: Some(remote),
            len,
            identity: FileIdentity::default(),
            map: None,
            guard: None,
            compressed,
        })
    }

    /// The length, if it is known without decompressing the whole file: `None` for a plain gzip stream
    /// before its first pass has ended (see [`len`](Self::len)).
    pub fn known_len(&self) -> Option<u64> {
        match &self.compressed {
            Some(c) => c.known_len(),
            None => Some(self.len),
        }
    }

    /// For a plain gzip input, keeps its seek points in the file at `path`, for the content that `key`
    /// names: read from there when they are there (the length known without decompressing the whole
    /// stream first), else written there when the first pass ends. Call before reading. Nothing for other
    /// inputs.
    pub(crate) fn keep_seek_points(&self, path: &Path, key: Vec<u8>) {
        if let Some(c) = &self.compressed {
            c.keep_seek_points(path, key);
        }
    }

    /// Reads up to `buf.len()` bytes of the file as stored (compressed, for a compressed file) at
    /// `offset`; fewer only at its end.
    pub(crate) fn read_stored(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        let shown = || format!("cannot read {}", self.path.display());
        match (&self.file, &self.remote) {
            (Some(f), _) => {
                let n = (self.len.saturating_sub(offset)).min(buf.len() as u64) as usize;
                read_exact_at(f, &mut buf[..n], offset).map_err(|e| Error::io(shown(), e))?;
                Ok(n)
            }
            (None, Some(r)) => r.read_some(offset, buf),
            (None, None) => Err(Error::internal("an input with neither file nor object")),
        }
    }

    /// True for an object in an object store (opened from an `s3://` or `http(s)://` URL).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The ETag of an object in an object store as it was at open, if the store gives one.
    pub fn etag(&self) -> Option<&str> {
        self.remote.as_deref().and_then(Remote::etag)
    }

    /// The local file, when it is read as it is (not compressed, not an object).
    fn plain_file(&self) -> Option<&File> {
        match self.compressed {
            Some(_) => None,
            None => self.file.as_ref(),
        }
    }

    /// Says that the file will be read once, from front to back (a few MiB back and forth, as parallel
    /// parsing does): a zstd stream that would be spooled (see [`is_direct`](Self::is_direct)) and declares
    /// its length is then decompressed into a small window of memory rather than into a temporary file
    /// (reads that go back further are served all the same, after decompressing the stream again). Only
    /// before the first read; no effect on other files (gzip never needs a temporary file).
    pub fn read_in_order(&self) {
        if let Some(c) = &self.compressed {
            c.read_in_order();
        }
    }

    /// The path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Length in bytes at open time; for a compressed file, the decompressed length (for a gzip stream,
    /// known once it has been decompressed to its end, which this waits for).
    pub fn len(&self) -> u64 {
        match &self.compressed {
            Some(c) => c.len(),
            None => self.len,
        }
    }
    /// True for an empty file (for a compressed file: empty once decompressed).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The length of the file on disk (the compressed length of a compressed file).
    pub fn stored_len(&self) -> u64 {
        self.len
    }
    /// How the file is compressed, if it is.
    pub fn compression(&self) -> Option<Compression> {
        self.compressed.as_ref().map(Decompressed::compression)
    }
    /// False for a compressed file whose byte ranges cannot be decompressed on their own (plain gzip,
    /// zstd frames without declared sizes): its data is first decompressed once, in order (a gzip stream
    /// noting seek points to decompress from later, zstd into a temporary file).
    pub fn is_direct(&self) -> bool {
        self.compressed.as_ref().is_none_or(Decompressed::is_direct)
    }
    /// Modification time at open time.
    pub fn modified(&self) -> Option<SystemTime> {
        self.modified
    }
    /// Change time, inode and device at open time.
    pub fn identity(&self) -> FileIdentity {
        self.identity
    }
    /// True if the file is memory-mapped.
    pub fn is_mapped(&self) -> bool {
        self.map.is_some()
    }

    /// Guards the map against the file shrinking while it is read (see `mmap::guard`): a read of a lost
    /// page then finds zeros instead of ending the process, and [`InputFile::check_map`] fails from then
    /// on. This file's own reads check it; a caller that reads [`InputFile::mapped`] bytes itself must
    /// call `check_map` after it has copied them, before it uses them. Where the map cannot be guarded,
    /// the file is read instead of mapped.
    pub(crate) fn guard_map(&mut self) {
        if let Some(m) = &self.map {
            self.guard = crate::mmap::MapGuard::new(m.as_ptr(), m.len());
            if self.guard.is_none() {
                log::debug!("cannot guard the map of {}; reading it instead", self.path.display());
                self.map = None;
            }
        }
    }

    /// An error if the file lost bytes while they were read through its guarded map (whatever was read
    /// from the map since must not be used).
    pub fn check_map(&self) -> Result<(), Error> {
        match &self.guard {
            Some(g) if g.lost() => Err(Error::io(
                format!("cannot read {}", self.path.display()),
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "it became shorter or unreadable while it was memory-mapped (read it again once it is \
                     complete, or read it without a map)",
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The whole file, when it is memory-mapped.
    pub fn mapped(&self) -> Option<&[u8]> {
        self.map.as_deref()
    }

    /// Reads exactly `len` bytes at `offset` into `buf` (replacing its content).
    pub fn read_into(&self, offset: u64, len: usize, buf: &mut Vec<u8>) -> Result<(), Error> {
        if let Some(m) = &self.map {
            buf.clear();
            let r = usize::try_from(offset).ok().and_then(|a| m.get(a..a.checked_add(len)?));
            match r {
                Some(s) => {
                    buf.extend_from_slice(s);
                    return self.check_map();
                }
                None => return Err(self.short_read(offset, len)),
            }
        }
        // Only the growth is zero-filled: the bytes are overwritten by the read anyway.
        if buf.len() > len {
            buf.truncate(len);
        } else {
            buf.resize(len, 0);
        }
        let Some(file) = self.plain_file() else {
            return match self.read_some(offset, buf)? {
                n if n == len => Ok(()),
                _ => Err(self.short_read(offset, len)),
            };
        };
        read_exact_at(file, buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.short_read(offset, len)
            } else {
                Error::io(format!("cannot read {} at byte {offset}", self.path.display()), e)
            }
        })
    }

    /// The error for `len` bytes at `offset` that the file no longer has.
    pub(crate) fn short_read(&self, offset: u64, len: usize) -> Error {
        if let Some(c) = self.compression() {
            return Error::compressed(
                c.name(),
                None,
                format!("the data ends before the {len} bytes at decompressed byte {offset}"),
            )
            .with_path(self.path.display().to_string());
        }
        Error::io(
            format!("cannot read {} bytes at byte {offset} of {}", len, self.path.display()),
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, SHORTER),
        )
    }

    /// Runs `f` on the bytes `[offset, offset+len)`: borrowed from the map, or read into `buf`.
    pub fn with_bytes<R>(
        &self,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, Error> {
        if let Some(m) = &self.map {
            if let Ok(a) = usize::try_from(offset) {
                crate::mmap::prefault(m, a, len);
            }
            let r = usize::try_from(offset).ok().and_then(|a| m.get(a..a.checked_add(len)?));
            return match r {
                Some(s) => {
                    let r = f(s);
                    self.check_map().map(|()| r)
                }
                None => Err(self.short_read(offset, len)),
            };
        }
        self.read_into(offset, len, buf)?;
        Ok(f(buf))
    }

    /// Reads exactly `buf.len()` bytes at `offset`.
    pub fn read_exact(&self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        if let Some(m) = &self.map {
            let r = usize::try_from(offset).ok().and_then(|a| m.get(a..a.checked_add(buf.len())?));
            return match r {
                Some(s) => {
                    buf.copy_from_slice(s);
                    self.check_map()
                }
                None => Err(self.short_read(offset, buf.len())),
            };
        }
        let Some(file) = self.plain_file() else {
            return match self.read_some(offset, buf)? {
                n if n == buf.len() => Ok(()),
                _ => Err(self.short_read(offset, buf.len())),
            };
        };
        read_exact_at(file, buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.short_read(offset, buf.len())
            } else {
                Error::io(format!("cannot read {} at byte {offset}", self.path.display()), e)
            }
        })
    }

    /// Maps the pages of `[offset, offset + len)` of a mapped file ahead of reading them (a hint).
    pub(crate) fn prefault(&self, offset: u64, len: usize) {
        if let (Some(m), Ok(a)) = (&self.map, usize::try_from(offset)) {
            crate::mmap::prefault(m, a, len);
        }
    }

    /// A streaming pass is done with `[offset, offset + len)`: takes its mapped pages out of the
    /// process's resident set (see `mmap::release`). Nothing happens for a file that is read, not mapped.
    pub(crate) fn release(&self, offset: u64, len: u64) {
        if let (Some(m), Ok(a), Ok(n)) = (&self.map, usize::try_from(offset), usize::try_from(len)) {
            crate::mmap::release(m, a, n);
        }
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at the end).
    pub fn read_some(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        if let Some(m) = &self.map {
            let a = usize::try_from(offset).unwrap_or(usize::MAX).min(m.len());
            let n = buf.len().min(m.len() - a);
            buf[..n].copy_from_slice(&m[a..a + n]);
            return self.check_map().map(|()| n);
        }
        if let Some(c) = &self.compressed {
            return c.read_some(offset, buf);
        }
        let file = match (&self.remote, &self.file) {
            (Some(r), _) => return r.read_some(offset, buf),
            (None, Some(f)) => f,
            (None, None) => return Ok(0),
        };
        let mut done = 0;
        while done < buf.len() {
            match read_at(file, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(format!("cannot read {} at byte {offset}", self.path.display()), e)),
            }
        }
        Ok(done)
    }
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, off)
}

#[cfg(windows)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, off)
}

fn read_exact_at(f: &File, mut buf: &mut [u8], mut off: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match read_at(f, buf, off) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_maps_regular_files_and_reads_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.ctf");
        std::fs::write(&p, b"|x 1 2\n|x 3 4\n").unwrap();
        let auto = InputFile::open(&p, Access::Auto).unwrap();
        assert!(auto.is_mapped(), "a regular file is mapped");
        let read = InputFile::open(&p, Access::Read).unwrap();
        assert!(!read.is_mapped());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        auto.read_into(1, 10, &mut a).unwrap();
        read.read_into(1, 10, &mut b).unwrap();
        assert_eq!(a, b"x 1 2\n|x 3");
        assert_eq!(a, b);

        // An empty file has nothing to map; reading it is the same either way.
        let e = dir.path().join("empty.ctf");
        std::fs::write(&e, b"").unwrap();
        let f = InputFile::open(&e, Access::Auto).unwrap();
        assert!(!f.is_mapped() && f.is_empty());
        #[cfg(unix)]
        {
            // Not a regular file: read, never mapped.
            let f = InputFile::open(Path::new("/dev/null"), Access::Auto).unwrap();
            assert!(!f.is_mapped());
        }
    }

    /// Objects compressed every way cntkio reads are read through their decompressed view, as local files
    /// are: gzip (plain, several members, BGZF) and zstd (one frame, the seekable format).
    #[test]
    fn compressed_objects_read_as_their_decompressed_bytes() {
        use crate::compress::OutputCompression;
        use object_store::{memory::InMemory, path::Path as ObjectPath, ObjectStore, ObjectStoreExt, PutPayload};
        use std::io::Write;
        let data: Vec<u8> = (0..300_000u32).flat_map(|i| format!("{i} |a {}\n", i % 97).into_bytes()).collect();
        let gzip = |parts: &[&[u8]]| {
            let mut out = Vec::new();
            for p in parts {
                let mut e = flate2::write::GzEncoder::new(&mut out, flate2::Compression::fast());
                e.write_all(p).unwrap();
                e.finish().unwrap();
            }
            out
        };
        let framed = |c: OutputCompression| {
            let (mut out, mut sizes) = (Vec::new(), Vec::new());
            c.compress(&data, &mut out, &mut sizes).unwrap();
            out.extend(c.trailer(&sizes).unwrap());
            out
        };
        let (a, b) = data.split_at(1_234_567);
        let cases = [
            (gzip(&[&data]), Compression::Gzip),
            (gzip(&[a, b]), Compression::Gzip),
            (framed(OutputCompression::Bgzf), Compression::Bgzf),
            (zstd::encode_all(&data[..], 3).unwrap(), Compression::Zstd),
            (framed(OutputCompression::SeekableZstd), Compression::SeekableZstd),
        ];
        let rt = crate::remote::runtime().unwrap();
        for (i, (bytes, compression)) in cases.into_iter().enumerate() {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let location = ObjectPath::from(format!("data/{i}"));
            rt.block_on(store.put(&location, PutPayload::from(bytes))).unwrap();
            let url = format!("memory:///data/{i}");
            let remote = Remote::with_store(&url, store, location).unwrap();
            let f = InputFile::of_remote(Path::new(&url), remote, Access::Mmap).unwrap();
            assert!(f.is_remote() && !f.is_mapped());
            assert_eq!(f.compression(), Some(compression), "case {i}");
            assert_eq!(f.len(), data.len() as u64, "case {i}");
            let mut all = Vec::new();
            f.read_into(0, data.len(), &mut all).unwrap();
            assert!(all == data, "case {i}: the decompressed bytes");
            let mut piece = vec![0u8; 1000];
            f.read_exact(2_000_000, &mut piece).unwrap();
            assert!(piece[..] == data[2_000_000..2_001_000], "case {i}: a read at an offset");
        }
    }
}
