//! The index cache (`cacheIndex`): cntkio's own file beside the input; for an object in an object store,
//! in a local directory (see [`objects_cache_dir`]), named after the object's URL, and keyed on its ETag
//! (an object whose store gives no ETag gets no cache and is indexed each time).
//!
//! **Format, version 3** (little-endian). Name: `<input>.cntkio-<hash>.idx`, `<hash>` = 8 hex digits of a
//! CRC-32 of the options that shape the index (mode selection, main-stream alias); for an object,
//! `<last part of its key>-<8 hex digits of a CRC-32 of its URL>.cntkio-<hash>.idx` in
//! [`objects_cache_dir`]. Content: magic
//! `CNTKIOIX`, `u32` version = 3, `u64` input length (decompressed, for a compressed input), `u8`
//! compression (0 none, 1 gzip, 2 BGZF, 3 zstd, 4 seekable zstd), `u64` length of the file on disk,
//! `i64` mtime seconds, `u32` mtime nanoseconds,
//! `i64` ctime seconds, `i64` ctime nanoseconds, `u64` inode, `u64` device (the change time cannot be set
//! back, so a file rewritten with its length and modification time restored is still told apart; zeros where
//! the system has none), `u32` CRC-32 of a content sample of the input (its first and last 64 KiB and 64 bytes at 62 evenly
//! spaced offsets; for an object, of its ETag instead: an object's modification time is its
//! `Last-Modified`, and the change time, inode and device are zeros), `u8` skipSequenceIds, `u8` mode (0 ids, 1 lines), `u32` alias length + alias bytes,
//! `u64` sequence count, then one 32-byte record per sequence (`u64` key, `u64` offset, `u32` length,
//! `u32` declared samples, `u64` 0-based line), then a `u32` CRC-32 of everything before it. The cache is
//! used only if every field matches the input and the options, and every record is consistent (offsets
//! increasing, inside the file, non-zero lengths and samples); anything else is silently rebuilt. Chunks are
//! recomputed from the records with the current `chunkSizeInBytes`. This format changes only with a new
//! version number.

use super::index::{build_index, CtfIndex, IndexConfig};
use crate::input::InputFile;
use crate::Error;
use cntkio_core::ctf::index::IndexMode;
use cntkio_core::ctf::SequenceDesc;
use cntkio_core::internal::Chunker;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

const MAGIC: &[u8; 8] = b"CNTKIOIX";
const VERSION: u32 = 3;
const RECORD: usize = 32;

/// The cache file used for `input` with these options.
pub fn cache_path(input: &Path, cfg: &IndexConfig) -> PathBuf {
    let mut h = crc32fast::Hasher::new();
    h.update(&[u8::from(cfg.skip_sequence_ids)]);
    h.update(cfg.main_alias.as_deref().unwrap_or("\u{0}").as_bytes());
    let suffix = format!(".cntkio-{:08x}.idx", h.finalize());
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

fn content_sample(file: &InputFile) -> Result<u32, Error> {
    if file.is_remote() {
        // The ETag names the object's content: sampling it would fetch a block per sample.
        return Ok(crc32fast::hash(file.etag().unwrap_or_default().as_bytes()));
    }
    let len = file.len();
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 64 << 10];
    let n = file.read_some(0, &mut buf)?;
    h.update(&buf[..n]);
    if len > buf.len() as u64 {
        let n = file.read_some(len - buf.len() as u64, &mut buf)?;
        h.update(&buf[..n]);
    }
    let mut small = [0u8; 64];
    for k in 1..63u64 {
        let n = file.read_some(len / 63 * k, &mut small)?;
        h.update(&small[..n]);
    }
    Ok(h.finalize())
}

fn header(file: &InputFile, cfg: &IndexConfig, mode: IndexMode, count: u64) -> Result<Vec<u8>, Error> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&file.len().to_le_bytes());
    v.push(file.compression().map_or(0, |c| c.code()));
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
    v.push(u8::from(cfg.skip_sequence_ids));
    v.push(match mode {
        IndexMode::Ids => 0,
        IndexMode::Lines => 1,
    });
    let alias = cfg.main_alias.as_deref().unwrap_or("");
    v.extend_from_slice(&(alias.len() as u32).to_le_bytes());
    v.extend_from_slice(alias.as_bytes());
    v.extend_from_slice(&count.to_le_bytes());
    Ok(v)
}

/// Loads the cached index if it is valid for `file` and `cfg`, else builds it and writes the cache.
pub(crate) fn load_or_build(
    file: &InputFile,
    cfg: &IndexConfig,
    threads: usize,
) -> Result<Result<CtfIndex, Error>, Error> {
    let path = cache_path(file.path(), cfg);
    if file.is_remote() {
        let dir = path.parent().unwrap_or(Path::new("."));
        let no_cache = if file.etag().is_none() {
            Some("its store gives no ETag".to_owned())
        } else {
            std::fs::create_dir_all(dir).err().map(|e| format!("cannot create {}: {e}", dir.display()))
        };
        if let Some(why) = no_cache {
            log::debug!("no index cache for {}: {why}", file.path().display());
            return Ok(build_index(file, cfg, threads, &mut |_| {}));
        }
    }
    match try_load(file, cfg, &path) {
        Ok(Some(index)) => {
            log::debug!("using the index cache {}", path.display());
            return Ok(Ok(index));
        }
        Ok(None) => {}
        Err(e) => log::debug!("ignoring the index cache {}: {e}", path.display()),
    }
    let index = match build_index(file, cfg, threads, &mut |_| {}) {
        Ok(i) => i,
        Err(e) => return Ok(Err(e)),
    };
    if let Err(e) = write(file, cfg, &index, &path) {
        log::warn!("could not write the index cache {}: {e}", path.display());
    }
    Ok(Ok(index))
}

/// Writes the cache for `index` (to a temporary file, then renamed).
pub fn write(file: &InputFile, cfg: &IndexConfig, index: &CtfIndex, path: &Path) -> Result<(), Error> {
    let count = index.num_sequences();
    let mut v = header(file, cfg, index.mode, count)?;
    v.reserve(count as usize * RECORD + 4);
    // Lines of every sequence (the in-memory index keeps only each chunk's first line): one counting pass.
    let mut counter = LineCounter::new(file);
    for c in &index.chunks {
        for s in &c.sequences {
            let line = counter.line_at(s.offset)?;
            v.extend_from_slice(&s.key.to_le_bytes());
            v.extend_from_slice(&s.offset.to_le_bytes());
            v.extend_from_slice(&s.len_bytes.to_le_bytes());
            v.extend_from_slice(&s.num_samples.to_le_bytes());
            v.extend_from_slice(&line.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    let mut tmp = crate::output::temporary(path)?;
    let target = crate::output::Target::new(path, tmp.as_file());
    tmp.write_all(&v).map_err(|e| target.error(e))?;
    crate::output::persist(tmp, path, None)
}

fn try_load(file: &InputFile, cfg: &IndexConfig, path: &Path) -> Result<Option<CtfIndex>, Error> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(_) => return Ok(None),
    };
    if bytes.len() < 4 || bytes.get(..8) != Some(&MAGIC[..]) {
        return Ok(None);
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Ok(None);
    }
    for mode in [IndexMode::Ids, IndexMode::Lines] {
        let count_guess = 0;
        let h = header(file, cfg, mode, count_guess)?;
        let fixed = h.len() - 8;
        if body.len() < h.len() || body[..fixed] != h[..fixed] {
            continue;
        }
        let count = u64::from_le_bytes(body[fixed..fixed + 8].try_into().expect("8 bytes"));
        let recs = &body[h.len()..];
        if count.checked_mul(RECORD as u64) != Some(recs.len() as u64) {
            return Ok(None);
        }
        let mut chunker = Chunker::new(cfg.chunk_size, file.len());
        let mut chunks = Vec::new();
        let mut prev_end = 0u64;
        let mut prev_line = 0u64;
        for r in recs.chunks_exact(RECORD) {
            let u64at = |a: usize| u64::from_le_bytes(r[a..a + 8].try_into().expect("8 bytes"));
            let u32at = |a: usize| u32::from_le_bytes(r[a..a + 4].try_into().expect("4 bytes"));
            let s = SequenceDesc { key: u64at(0), offset: u64at(8), len_bytes: u32at(16), num_samples: u32at(20) };
            let line = u64at(24);
            // The end is computed with a check: a record's offset is any number the file holds.
            let end = s.offset.checked_add(u64::from(s.len_bytes)).filter(|&e| e <= file.len());
            // Lines only grow, and a file has no more lines than bytes.
            let line_ok = line >= prev_line && line <= file.len();
            let Some(end) = end.filter(|_| s.offset >= prev_end && s.len_bytes > 0 && s.num_samples > 0 && line_ok)
            else {
                return Ok(None);
            };
            prev_end = end;
            prev_line = line;
            if let Some(c) = chunker.push(s, line)? {
                chunks.push(c);
            }
        }
        chunks.extend(chunker.finish());
        return Ok(Some(CtfIndex { mode, chunks, file_len: file.len() }));
    }
    Ok(None)
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
