//! The index cache (`cacheIndex`): cntkio's own file beside the input; for an object in an object store,
//! in a local directory (see [`objects_cache_dir`]), named after the object's URL, and keyed on its ETag
//! (an object whose store gives no ETag gets no cache and is indexed each time).
//!
//! **Format, version 4** (little-endian). Name: `<input>.cntkio-<hash>.idx`, `<hash>` = 8 hex digits of a
//! CRC-32 of the options that shape the index (mode selection, main-stream alias); for an object,
//! `<last part of its key>-<8 hex digits of a CRC-32 of its URL>.cntkio-<hash>.idx` in
//! [`objects_cache_dir`]. Content: magic `CNTKIOIX`, `u32` version = 4, `u64` input length
//! (decompressed, for a compressed input), `u8` compression (0 none, 1 gzip, 2 BGZF, 3 zstd, 4 seekable
//! zstd), then the file's identity: `u64` length of the file on disk, `i64` mtime seconds, `u32` mtime
//! nanoseconds, `i64` ctime seconds, `i64` ctime nanoseconds, `u64` inode, `u64` device (the change time
//! cannot be set back, so a file rewritten with its length and modification time restored is still told
//! apart; zeros where the system has none), `u32` CRC-32 of a content sample of the file as stored
//! (compressed, for a compressed input: its first and last 64 KiB and 64 bytes at 62 evenly spaced
//! offsets; for an object, of its ETag instead: an object's modification time is its `Last-Modified`, and
//! the change time, inode and device are zeros); then `u8` skipSequenceIds, `u8` mode (0 ids, 1 lines),
//! `u32` alias length + alias bytes, `u64` sequence count, then one 32-byte record per sequence (`u64`
//! key, `u64` offset, `u32` length, `u32` declared samples, `u64` 0-based line), then a `u32` CRC-32 of
//! everything before it. The cache is used only if every field matches the input and the options, and
//! every record is consistent (offsets increasing, inside the file, non-zero lengths and samples);
//! anything else is silently rebuilt. Chunks are recomputed from the records with the current
//! `chunkSizeInBytes`. This format changes only with a new version number.
//!
//! A plain gzip input also keeps its seek points, in `<input>.cntkio-points.idx` ([`points_path`]; format
//! in `compress::kept`), keyed on the same identity: a later opening reads them instead of decompressing
//! the whole stream to learn its length, and reads chunks from them.

use super::index::{index_streaming_bytes, IndexConfig};
use crate::input::InputFile;
use crate::Error;
use cntkio_core::ctf::index::ChunkDesc;
use cntkio_core::ctf::index::IndexMode;
use cntkio_core::ctf::SequenceDesc;
use cntkio_core::internal::Chunker;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

const MAGIC: &[u8; 8] = b"CNTKIOIX";
const VERSION: u32 = 4;
const RECORD: usize = 32;
/// Where the file's identity starts in the header: after the magic, version, length and compression.
const IDENTITY_AT: usize = 8 + 4 + 8 + 1;

/// The cache file used for `input` with these options.
pub fn cache_path(input: &Path, cfg: &IndexConfig) -> PathBuf {
    let mut h = crc32fast::Hasher::new();
    h.update(&[u8::from(cfg.skip_sequence_ids)]);
    h.update(cfg.main_alias.as_deref().unwrap_or("\u{0}").as_bytes());
    cache_file(input, &format!(".cntkio-{:08x}.idx", h.finalize()))
}

/// The file that keeps the seek points of `input`, a plain gzip file (see `compress::kept`):
/// `<input>.cntkio-points.idx`, or for an object, named as its index caches are.
pub fn points_path(input: &Path) -> PathBuf {
    cache_file(input, ".cntkio-points.idx")
}

/// The cache file of `input` that ends with `suffix`: beside it, or for an object in
/// [`objects_cache_dir`].
fn cache_file(input: &Path, suffix: &str) -> PathBuf {
    if crate::remote::is_url(input) {
        let url = input.to_string_lossy();
        let last = url.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
        // Only characters that every file system takes, and a bounded length.
        let last: String = last
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' })
            .take(100)
            .collect();
        return objects_cache_dir().join(format!("{last}-{:08x}{suffix}", crc32fast::hash(url.as_bytes())));
    }
    let mut name = input.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The variable naming the directory of the index caches of objects in object stores.
pub const CACHE_DIR_VAR: &str = "CNTKIO_CACHE_DIR";

/// The directory of the index caches of objects in object stores: `CNTKIO_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/cntkio`, else `$HOME/.cache/cntkio`, else `cntkio-cache` in the temporary directory.
pub fn objects_cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var(CACHE_DIR_VAR)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("cntkio")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("cntkio")))
        .unwrap_or_else(|| std::env::temp_dir().join("cntkio-cache"))
}

/// A CRC-32 of the file as stored (compressed, for a compressed file): its first and last 64 KiB and 64
/// bytes at 62 evenly spaced offsets; for an object, of its ETag.
fn content_sample(file: &InputFile) -> Result<u32, Error> {
    if file.is_remote() {
        // The ETag names the object's content: sampling it would fetch a block per sample.
        return Ok(crc32fast::hash(file.etag().unwrap_or_default().as_bytes()));
    }
    let len = file.stored_len();
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 64 << 10];
    let n = file.read_stored(0, &mut buf)?;
    h.update(&buf[..n]);
    if len > buf.len() as u64 {
        let n = file.read_stored(len - buf.len() as u64, &mut buf)?;
        h.update(&buf[..n]);
    }
    let mut small = [0u8; 64];
    for k in 1..63u64 {
        let n = file.read_stored(len / 63 * k, &mut small)?;
        h.update(&small[..n]);
    }
    Ok(h.finalize())
}

/// The fields that name the content of `file` as stored: its length, modification and change times,
/// inode, device and [`content_sample`].
fn identity(file: &InputFile) -> Result<Vec<u8>, Error> {
    let mut v = Vec::with_capacity(52);
    v.extend_from_slice(&file.stored_len().to_le_bytes());
    let (secs, nanos) = match file.modified().and_then(|t| t.duration_since(UNIX_EPOCH).ok()) {
        Some(d) => (d.as_secs() as i64, d.subsec_nanos()),
        None => (-1, 0),
    };
    v.extend_from_slice(&secs.to_le_bytes());
    v.extend_from_slice(&nanos.to_le_bytes());
    let id = file.identity();
    v.extend_from_slice(&id.ctime_secs.to_le_bytes());
    v.extend_from_slice(&id.ctime_nanos.to_le_bytes());
    v.extend_from_slice(&id.inode.to_le_bytes());
    v.extend_from_slice(&id.device.to_le_bytes());
    v.extend_from_slice(&content_sample(file)?.to_le_bytes());
    Ok(v)
}

/// The cache's header for `file` of decompressed length `len` and [`identity`] `id`.
fn header(file: &InputFile, len: u64, id: &[u8], cfg: &IndexConfig, mode: IndexMode, count: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v.push(file.compression().map_or(0, |c| c.code()));
    v.extend_from_slice(id);
    v.push(u8::from(cfg.skip_sequence_ids));
    v.push(match mode {
        IndexMode::Ids => 0,
        IndexMode::Lines => 1,
    });
    let alias = cfg.main_alias.as_deref().unwrap_or("");
    v.extend_from_slice(&(alias.len() as u32).to_le_bytes());
    v.extend_from_slice(alias.as_bytes());
    v.extend_from_slice(&count.to_le_bytes());
    v
}

/// Streams the index of `file` to `on_chunk`, chunk by chunk in file order (chunks of `cfg.chunk_size`):
/// read from the index cache when it is valid for the file and the options, else built by
/// [`index_streaming_bytes`] (which hands over the chunks' bytes as it describes there, with `keep`) while
/// the cache is written, record by record. Memory does not grow with the number of sequences either way:
/// the cache is read through twice (checked whole, then used), never held. The outer error is the input's
/// (I/O); the inner one the index's or `on_chunk`'s.
pub(crate) fn index_cached(
    file: &InputFile,
    cfg: &IndexConfig,
    threads: usize,
    keep: bool,
    mut on_chunk: impl FnMut(ChunkDesc, Option<&[u8]>) -> Result<(), Error>,
    progress: &mut dyn FnMut(u64),
) -> Result<Result<IndexMode, Error>, Error> {
    let path = cache_path(file.path(), cfg);
    if let Err(why) = cache_dir_ready(file, &path) {
        log::debug!("no index cache for {}: {why}", file.path().display());
        return Ok(index_streaming_bytes(file, cfg, threads, keep, on_chunk, progress));
    }
    let id = identity(file)?;
    keep_points_with(file, &id);
    match check(file, &id, cfg, &path) {
        Ok(Some(found)) => {
            log::debug!("using the index cache {}", path.display());
            return replay(file, cfg, &path, found, on_chunk, progress).map(Ok);
        }
        Ok(None) => {}
        Err(e) => log::debug!("ignoring the index cache {}: {e}", path.display()),
    }
    let mut writer = match CacheWriter::new(file, id, cfg, &path) {
        Ok(w) => Some(w),
        Err(e) => {
            log::warn!("could not write the index cache {}: {e}", path.display());
            None
        }
    };
    let built = index_streaming_bytes(
        file,
        cfg,
        threads,
        keep,
        |c, bytes| {
            if let Some(Err(e)) = writer.as_mut().map(|w| w.add(&c)) {
                log::warn!("could not write the index cache {}: {e}", path.display());
                writer = None;
            }
            on_chunk(c, bytes)
        },
        progress,
    );
    if let (Ok(mode), Some(w)) = (&built, writer) {
        if let Err(e) = w.finish(*mode) {
            log::warn!("could not write the index cache {}: {e}", path.display());
        }
    }
    Ok(built)
}

/// Keeps the seek points of `file`, a plain gzip input, in [`points_path`]: a later opening starts from
/// them instead of decompressing the whole stream to learn its length.
pub(crate) fn keep_seek_points(file: &InputFile) -> Result<(), Error> {
    if file.compression() == Some(crate::compress::Compression::Gzip) {
        keep_points_with(file, &identity(file)?);
    }
    Ok(())
}

/// [`keep_seek_points`] for a file whose [`identity`] is `id`.
fn keep_points_with(file: &InputFile, id: &[u8]) {
    if file.compression() != Some(crate::compress::Compression::Gzip) {
        return;
    }
    let path = points_path(file.path());
    match cache_dir_ready(file, &path) {
        Ok(()) => file.keep_seek_points(&path, id.to_vec()),
        Err(why) => log::debug!("the seek points of {} are not kept: {why}", file.path().display()),
    }
}

/// For an object, whether a cache file at `path` can name its content (its store gives an ETag) and the
/// cache directory is there (made if not); a local file's caches sit beside it.
fn cache_dir_ready(file: &InputFile, path: &Path) -> Result<(), String> {
    if !file.is_remote() {
        return Ok(());
    }
    if file.etag().is_none() {
        return Err("its store gives no ETag".into());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// What [`check`] found in a valid cache.
struct Found {
    mode: IndexMode,
    /// Bytes before the records.
    head: usize,
    count: u64,
}

/// Records read at a time.
const RECORDS_AT_ONCE: usize = 1 << 15;

/// Reads the `count` records after the first `head` bytes of the cache at `path`, `RECORDS_AT_ONCE` at a
/// time, adding their bytes to `crc` and handing each to `each`, then the CRC-32 stored after them. `each`
/// returns `false` to stop: then so does this, with `None`.
fn records(
    path: &Path,
    head: usize,
    count: u64,
    crc: &mut crc32fast::Hasher,
    mut each: impl FnMut(SequenceDesc, u64) -> Result<bool, Error>,
) -> Result<Option<[u8; 4]>, Error> {
    use std::io::{Read, Seek};
    let io = |e| Error::io(format!("cannot read the index cache {}", path.display()), e);
    let mut f = std::fs::File::open(path).map_err(io)?;
    f.seek(std::io::SeekFrom::Start(head as u64)).map_err(io)?;
    let mut buf = vec![0u8; RECORDS_AT_ONCE * RECORD];
    let mut left = count;
    while left > 0 {
        let n = left.min(RECORDS_AT_ONCE as u64) as usize;
        let block = &mut buf[..n * RECORD];
        f.read_exact(block).map_err(io)?;
        crc.update(block);
        for r in block.chunks_exact(RECORD) {
            let u64at = |a: usize| u64::from_le_bytes(r[a..a + 8].try_into().expect("8 bytes"));
            let u32at = |a: usize| u32::from_le_bytes(r[a..a + 4].try_into().expect("4 bytes"));
            let s = SequenceDesc { key: u64at(0), offset: u64at(8), len_bytes: u32at(16), num_samples: u32at(20) };
            if !each(s, u64at(24))? {
                return Ok(None);
            }
        }
        left -= n as u64;
    }
    let mut stored = [0u8; 4];
    f.read_exact(&mut stored).map_err(io)?;
    Ok(Some(stored))
}

/// The cache at `path`, if it is valid for `file` and `cfg`: every header field matches the input and the
/// options, the records are consistent (offsets increasing, inside the file, non-zero lengths and samples,
/// lines not decreasing) and chunk without error, and the CRC-32 is right. Reads it through once.
fn check(file: &InputFile, id: &[u8], cfg: &IndexConfig, path: &Path) -> Result<Option<Found>, Error> {
    use std::io::Read;
    let Ok(meta) = std::fs::metadata(path) else { return Ok(None) };
    let len = meta.len();
    let mut start = Vec::new();
    let Ok(f) = std::fs::File::open(path) else { return Ok(None) };
    f.take(512).read_to_end(&mut start).map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    if start.get(..8) != Some(&MAGIC[..]) {
        return Ok(None);
    }
    // A gzip stream's length is known only once it is decompressed: a cache of another version or of
    // other content is told without it.
    if start.get(8..12) != Some(&VERSION.to_le_bytes()[..])
        || start.get(IDENTITY_AT..IDENTITY_AT + id.len()) != Some(id)
    {
        return Ok(None);
    }
    for mode in [IndexMode::Ids, IndexMode::Lines] {
        let h = header(file, file.len(), id, cfg, mode, 0);
        let fixed = h.len() - 8;
        if start.len() < h.len() || start[..fixed] != h[..fixed] {
            continue;
        }
        let count = u64::from_le_bytes(start[fixed..h.len()].try_into().expect("8 bytes"));
        let expected = count.checked_mul(RECORD as u64).and_then(|r| r.checked_add(h.len() as u64 + 4));
        if expected != Some(len) {
            return Ok(None);
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&start[..h.len()]);
        let mut chunker = Chunker::new(cfg.chunk_size, file.len());
        let (mut prev_end, mut prev_line) = (0u64, 0u64);
        let stored = records(path, h.len(), count, &mut crc, |s, line| {
            // The end is computed with a check: a record's offset is any number the file holds.
            let end = s.offset.checked_add(u64::from(s.len_bytes)).filter(|&e| e <= file.len());
            // Lines only grow, and a file has no more lines than bytes.
            let line_ok = line >= prev_line && line <= file.len();
            let Some(end) = end.filter(|_| s.offset >= prev_end && s.len_bytes > 0 && s.num_samples > 0 && line_ok)
            else {
                return Ok(false);
            };
            (prev_end, prev_line) = (end, line);
            Ok(chunker.push(s, line).is_ok())
        })?;
        if stored != Some(crc.finalize().to_le_bytes()) {
            return Ok(None);
        }
        return Ok(Some(Found { mode, head: h.len(), count }));
    }
    Ok(None)
}

/// Hands the chunks of the cache [`check`] found valid to `on_chunk` (with no bytes), re-chunked with the
/// current chunk size.
fn replay(
    file: &InputFile,
    cfg: &IndexConfig,
    path: &Path,
    found: Found,
    mut on_chunk: impl FnMut(ChunkDesc, Option<&[u8]>) -> Result<(), Error>,
    progress: &mut dyn FnMut(u64),
) -> Result<IndexMode, Error> {
    let mut chunker = Chunker::new(cfg.chunk_size, file.len());
    let mut deliver = |c: ChunkDesc| {
        let end = c.end();
        on_chunk(c, None)?;
        progress(end);
        Ok::<(), Error>(())
    };
    records(path, found.head, found.count, &mut crc32fast::Hasher::new(), |s, line| {
        if let Some(c) = chunker.push(s, line)? {
            deliver(c)?;
        }
        Ok(true)
    })?;
    if let Some(c) = chunker.finish() {
        deliver(c)?;
    }
    Ok(found.mode)
}

/// The 32-byte record of sequence `s` on line `line`.
fn encode(s: &SequenceDesc, line: u64, out: &mut [u8; RECORD]) {
    out[..8].copy_from_slice(&s.key.to_le_bytes());
    out[8..16].copy_from_slice(&s.offset.to_le_bytes());
    out[16..20].copy_from_slice(&s.len_bytes.to_le_bytes());
    out[20..24].copy_from_slice(&s.num_samples.to_le_bytes());
    out[24..].copy_from_slice(&line.to_le_bytes());
}

/// A cache being written as the index is built: a temporary file beside it holding a header to be
/// completed, then the records as chunks come; renamed into place by [`CacheWriter::finish`] (dropped
/// unfinished, it is removed).
struct CacheWriter<'a> {
    file: &'a InputFile,
    /// The file's [`identity`] as it was before the index was built.
    id: Vec<u8>,
    cfg: &'a IndexConfig,
    path: &'a Path,
    tmp: tempfile::NamedTempFile,
    head: usize,
    count: u64,
    /// The CRC-32 of the records.
    crc: crc32fast::Hasher,
    /// Records not written yet.
    buf: Vec<u8>,
    /// Lines of every sequence (the index keeps only each chunk's first line): one counting pass.
    lines: LineCounter<'a>,
}

impl<'a> CacheWriter<'a> {
    fn new(file: &'a InputFile, id: Vec<u8>, cfg: &'a IndexConfig, path: &'a Path) -> Result<CacheWriter<'a>, Error> {
        // The header's size does not depend on the length, the mode or the count, which are written at
        // the end (the length of a gzip stream is known only once it is decompressed).
        let head = header(file, 0, &id, cfg, IndexMode::Ids, 0);
        let mut tmp = crate::output::temporary(path)?;
        let target = crate::output::Target::new(path, tmp.as_file());
        tmp.write_all(&head).map_err(|e| target.error(e))?;
        let (crc, lines) = (crc32fast::Hasher::new(), LineCounter::new(file));
        Ok(CacheWriter { file, id, cfg, path, tmp, head: head.len(), count: 0, crc, buf: Vec::new(), lines })
    }

    /// Adds the records of chunk `c`'s sequences.
    fn add(&mut self, c: &ChunkDesc) -> Result<(), Error> {
        for s in &c.sequences {
            let mut r = [0u8; RECORD];
            encode(s, self.lines.line_at(s.offset)?, &mut r);
            self.buf.extend_from_slice(&r);
        }
        self.count += c.sequences.len() as u64;
        if self.buf.len() >= RECORDS_AT_ONCE * RECORD {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        self.crc.update(&self.buf);
        let target = crate::output::Target::new(self.path, self.tmp.as_file());
        self.tmp.write_all(&self.buf).map_err(|e| target.error(e))?;
        self.buf.clear();
        Ok(())
    }

    /// Completes the header with the index's `mode` and the count, appends the CRC-32, and renames the
    /// file into place.
    fn finish(mut self, mode: IndexMode) -> Result<(), Error> {
        use std::io::Seek;
        self.flush()?;
        let head = header(self.file, self.file.len(), &self.id, self.cfg, mode, self.count);
        let target = crate::output::Target::new(self.path, self.tmp.as_file());
        if head.len() != self.head {
            return Err(Error::internal("the index cache's header changed size"));
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        crc.combine(&self.crc);
        let f = self.tmp.as_file_mut();
        f.seek(std::io::SeekFrom::Start(0)).map_err(|e| target.error(e))?;
        f.write_all(&head).map_err(|e| target.error(e))?;
        f.seek(std::io::SeekFrom::End(0)).map_err(|e| target.error(e))?;
        f.write_all(&crc.finalize().to_le_bytes()).map_err(|e| target.error(e))?;
        crate::output::persist(self.tmp, self.path, None)
    }
}

/// Counts `\n` from the start of a file up to increasing offsets.
struct LineCounter<'a> {
    file: &'a InputFile,
    pos: u64,
    line: u64,
    buf: Vec<u8>,
}

impl<'a> LineCounter<'a> {
    fn new(file: &'a InputFile) -> Self {
        LineCounter { file, pos: 0, line: 0, buf: vec![0; 1 << 20] }
    }
    /// 0-based line of the byte at `offset` (offsets must not decrease).
    fn line_at(&mut self, offset: u64) -> Result<u64, Error> {
        while self.pos < offset {
            let want = ((offset - self.pos) as usize).min(self.buf.len());
            let n = self.file.read_some(self.pos, &mut self.buf[..want])?;
            if n == 0 {
                break;
            }
            self.line += memchr::memchr_iter(b'\n', &self.buf[..n]).count() as u64;
            self.pos += n as u64;
        }
        Ok(self.line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Access;

    /// A cache of a gzip file made by another version, or for other content, is refused before the
    /// stream's length is asked (which would decompress it all first); a valid one is used.
    #[test]
    fn a_stale_cache_of_a_gzip_file_is_refused_before_its_length_is_known() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let gz = dir.path().join("t.ctf.gz");
        let text: Vec<u8> = (0..50_000u32).flat_map(|k| format!("|a {}\n", k % 10).into_bytes()).collect();
        let write = |level: u32| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
            e.write_all(&text).unwrap();
            std::fs::write(&gz, e.finish().unwrap()).unwrap();
        };
        write(6);
        let cfg = IndexConfig { skip_sequence_ids: false, main_alias: None, chunk_size: 100_000 };
        let index = |f: &InputFile| {
            let mut chunks = 0;
            let count = |_, _: Option<&[u8]>| {
                chunks += 1;
                Ok(())
            };
            index_cached(f, &cfg, 1, false, count, &mut |_| {}).unwrap().unwrap();
            chunks
        };
        let chunks = index(&InputFile::open(&gz, Access::Read).unwrap());
        let path = cache_path(&gz, &cfg);
        let open = || InputFile::open(&gz, Access::Read).unwrap();
        assert!(check(&open(), &identity(&open()).unwrap(), &cfg, &path).unwrap().is_some(), "a valid cache is used");
        let good = std::fs::read(&path).unwrap();

        let mut old = good.clone();
        old[8..12].copy_from_slice(&3u32.to_le_bytes());
        std::fs::write(&path, &old).unwrap();
        let f = open();
        assert!(check(&f, &identity(&f).unwrap(), &cfg, &path).unwrap().is_none());
        assert_eq!(f.known_len(), None, "another version: the length was not asked");

        std::fs::write(&path, &good).unwrap();
        write(1);
        let f = open();
        assert!(check(&f, &identity(&f).unwrap(), &cfg, &path).unwrap().is_none());
        assert_eq!(f.known_len(), None, "other content: the length was not asked");
        assert_eq!(index(&f), chunks);
        assert!(
            check(&open(), &identity(&open()).unwrap(), &cfg, &path).unwrap().is_some(),
            "rebuilt for the new content"
        );
    }
}
