//! Building the index of a CTF file: streaming (for one pass over the data) or whole (for random access),
//! with the block scans spread over threads.

use crate::input::InputFile;
use crate::Error;
use cntkio_core::ctf::index::{ChunkDesc, IndexMode};
use cntkio_core::ctf::SequenceDesc;
use cntkio_core::internal::{
    bom_len, check_first_id, is_utf16_bom, select_mode, skip_space, BlockScan, Chunker, RowScanner, SequenceAssembler,
};
use cntkio_core::ErrorKind;
use rayon::prelude::*;

/// Size of the block one thread scans at a time.
pub(crate) const SCAN_BLOCK: usize = 4 << 20;

/// What shapes an index: everything else (values, dims) does not matter to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IndexConfig {
    /// Line mode for every file (`skipSequenceIds`).
    pub skip_sequence_ids: bool,
    /// Alias of the `definesMBSize` stream.
    pub main_alias: Option<String>,
    /// `chunkSizeInBytes`.
    pub chunk_size: u64,
}

/// The whole index of a CTF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtfIndex {
    /// Id or line mode.
    pub mode: IndexMode,
    /// Chunks in file order.
    pub chunks: Vec<ChunkDesc>,
    /// File length when indexed.
    pub file_len: u64,
}

impl CtfIndex {
    /// Number of sequences.
    pub fn num_sequences(&self) -> u64 {
        self.chunks.iter().map(|c| c.sequences.len() as u64).sum()
    }
    /// Sum of declared sequence lengths (CNTK's sweep size).
    pub fn num_samples(&self) -> u64 {
        self.chunks.iter().map(|c| c.num_samples).sum()
    }
}

/// Where the data starts and how it is grouped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    pub offset: u64,
    pub line: u64,
    pub mode: IndexMode,
}

/// Checks the file's first bytes (BOMs, leading whitespace) and selects the mode.
pub(crate) fn find_start(file: &InputFile, skip_sequence_ids: bool) -> Result<Start, Error> {
    // The first row is usually in the first bytes: blocks of 64 KiB, not of SCAN_BLOCK (whose fresh
    // zeroed memory would cost more than the search).
    // The length is not asked for: a gzip stream's is known only once it is decompressed.
    const BLOCK: usize = 64 << 10;
    let mut head = vec![0u8; BLOCK];
    let n = file.read_some(0, &mut head)?;
    head.truncate(n);
    if is_utf16_bom(&head) {
        return Err(Error::at(ErrorKind::Utf16Bom, 0));
    }
    let mut pos = bom_len(&head) as u64;
    let mut line = 0;
    let mut block = head;
    let mut block_off = 0u64;
    loop {
        let a = (pos - block_off) as usize;
        let (k, nl) = skip_space(&block[a..]);
        pos += k as u64;
        line += nl;
        if a + k < block.len() {
            let mode = select_mode(block[a + k], skip_sequence_ids, pos)?;
            if mode == IndexMode::Ids {
                first_id_ends(file, pos)?;
            }
            return Ok(Start { offset: pos, line, mode });
        }
        block.resize(BLOCK, 0);
        let n = file.read_some(pos, &mut block)?;
        if n == 0 {
            return Err(Error::at(ErrorKind::EmptyFile, 0));
        }
        block.truncate(n);
        block_off = pos;
    }
}

/// Fails as CNTK does when the file ends inside its first sequence id.
fn first_id_ends(file: &InputFile, mut pos: u64) -> Result<(), Error> {
    let start = pos;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read_some(pos, &mut buf)?;
        if n == 0 {
            return check_first_id(&[], start);
        }
        if buf[..n].iter().any(|c| !c.is_ascii_digit()) {
            return Ok(());
        }
        pos += n as u64;
    }
}

/// The sequences of a chunk, found again in its `bytes` (the file's bytes from `desc.offset`, `desc.len_bytes`
/// of them) exactly as the index found them: the same keys, offsets, lengths and declared lengths. Only
/// `desc`'s offset, length and first line are read (its `sequences` may be empty). `file_len`: the file's
/// length (a chunk ending there ends the file). Scans [`SCAN_BLOCK`] bytes at a time, so the scan's own
/// memory stays small whatever the chunk.
pub(crate) fn chunk_sequences(
    bytes: &[u8],
    desc: &ChunkDesc,
    mode: IndexMode,
    main_alias: Option<&str>,
    file_len: u64,
) -> Result<Vec<SequenceDesc>, Error> {
    let scanner = RowScanner::new(mode, main_alias);
    let mut asm = SequenceAssembler::new(mode, desc.first_line);
    let mut found = Vec::new();
    let mut out = Vec::new();
    let parts = bytes.len().div_ceil(SCAN_BLOCK).max(1);
    for (a, b) in split_rows(bytes, parts) {
        let base = desc.offset + a as u64;
        let is_last = desc.offset + b as u64 >= file_len;
        asm.push(&scanner.scan_block(&bytes[a..b], base, is_last)?, &mut found)?;
        out.extend(found.drain(..).map(|(s, _)| s));
    }
    asm.finish_file(desc.offset + bytes.len() as u64, &mut found)?;
    out.extend(found.drain(..).map(|(s, _)| s));
    Ok(out)
}

/// Cuts `bytes` into at most `parts` pieces ending just after a `\n` (the last piece ends at the end).
fn split_rows(bytes: &[u8], parts: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(parts);
    let target = bytes.len().div_ceil(parts.max(1)).max(1);
    let mut a = 0;
    while a < bytes.len() {
        let want = a + target;
        let b = if want >= bytes.len() {
            bytes.len()
        } else {
            match memchr::memchr(b'\n', &bytes[want..]) {
                Some(k) => want + k + 1,
                None => bytes.len(),
            }
        };
        out.push((a, b));
        a = b;
    }
    out
}

/// Streams the chunks of `file` in order to `on_chunk`. `threads > 1` scans blocks in parallel on the
/// current rayon pool. `progress` receives the number of bytes indexed so far.
pub fn index_streaming(
    file: &InputFile,
    cfg: &IndexConfig,
    threads: usize,
    mut on_chunk: impl FnMut(ChunkDesc) -> Result<(), Error>,
    progress: &mut dyn FnMut(u64),
) -> Result<IndexMode, Error> {
    index_streaming_bytes(file, cfg, threads, false, |c, _| on_chunk(c), progress)
}

/// [`index_streaming`] that also hands each chunk's bytes to `on_chunk` when it has them: always for a
/// mapped file; when `keep` is set, for a file read with positional reads too, the indexer then keeping
/// the bytes of the chunk being gathered (up to a chunk and a scan window more in memory) so that they
/// need not be read a second time.
pub(crate) fn index_streaming_bytes(
    file: &InputFile,
    cfg: &IndexConfig,
    threads: usize,
    keep: bool,
    mut on_chunk: impl FnMut(ChunkDesc, Option<&[u8]>) -> Result<(), Error>,
    progress: &mut dyn FnMut(u64),
) -> Result<IndexMode, Error> {
    // A gzip stream's length is known only once it has been decompressed: then the file ends where a read
    // comes back short, and the index is built as the stream is decompressed, not after.
    let known = file.known_len();
    if known == Some(0) {
        return Err(Error::at(ErrorKind::EmptyFile, 0));
    }
    let len = known.unwrap_or(u64::MAX);
    let start = find_start(file, cfg.skip_sequence_ids)?;
    let scanner = RowScanner::new(start.mode, cfg.main_alias.as_deref());
    let mut asm = SequenceAssembler::new(start.mode, start.line);
    let mut chunker = Chunker::new(cfg.chunk_size, len);
    let mut seqs = Vec::new();
    let threads = threads.max(1);
    // Line mode without a definesMBSize stream: every row is a sequence of one sample, so one thread turns
    // rows into sequences directly (the block scans, runs and assembler serve id mode, the main-stream
    // test and parallel scans, and are work this case does not need).
    let direct = threads == 1 && start.mode == IndexMode::Lines && cfg.main_alias.is_none();
    // Line mode: the 0-based line of the next row (its sequence key).
    let mut row_line = start.line;
    let window = SCAN_BLOCK * threads;
    // Positional reads: `buf[..filled]` holds the file's bytes from offset `base` on (the rest of `buf`
    // stays allocated; only its growth is zero-filled, the reads overwrite it).
    let mut buf: Vec<u8> = Vec::new();
    let mut filled = 0usize;
    let mut base = start.offset;
    let mut off = start.offset; // file offset of the bytes being scanned
    let mut emitted = start.offset; // end of the last chunk handed out
    let mapped = file.mapped();
    loop {
        // The bytes to scan: a window of the map, or of `buf` (carry + newly read).
        let (at_eof, cut): (bool, usize) = match mapped {
            Some(m) => {
                let a = off as usize;
                let end = (a + window).min(m.len());
                let at_eof = end == m.len();
                let cut = if at_eof {
                    end - a
                } else {
                    match memchr::memrchr(b'\n', &m[a..end]) {
                        Some(k) => k + 1,
                        None => match memchr::memchr(b'\n', &m[end..]) {
                            Some(k) => end - a + k + 1, // one row longer than the window
                            None => m.len() - a,
                        },
                    }
                };
                let at_eof = at_eof || a + cut == m.len();
                (at_eof, cut)
            }
            None => {
                let a = (off - base) as usize;
                let have = filled - a;
                let want = a + window.max(have + SCAN_BLOCK);
                if buf.len() < want {
                    buf.resize(want, 0);
                }
                let n = file.read_some(base + filled as u64, &mut buf[filled..want])?;
                let short = filled + n < want;
                filled += n;
                let at_eof = if known.is_some() { base + filled as u64 >= len } else { short };
                if n == 0 && !at_eof {
                    return Err(file.short_read(base + filled as u64, want - filled));
                }
                let cut = if at_eof {
                    filled - a
                } else {
                    match memchr::memrchr(b'\n', &buf[a + have..filled]) {
                        Some(k) => have + k + 1,
                        None => continue, // one row longer than the buffer: read more
                    }
                };
                (at_eof, cut)
            }
        };
        let bytes: &[u8] = match mapped {
            Some(m) => &m[off as usize..off as usize + cut],
            None => &buf[(off - base) as usize..(off - base) as usize + cut],
        };
        // Hands a finished chunk on, with its bytes when they are at hand.
        let mut emit = |c: ChunkDesc| -> Result<(), Error> {
            emitted = c.end();
            let b = chunk_bytes(&c, mapped, keep, &buf, base, filled);
            on_chunk(c, b)
        };
        if direct {
            // Rows end at each `\n`; the last row of the file may end at its end instead.
            let mut pos = 0usize;
            let mut rows = memchr::memchr_iter(b'\n', bytes);
            loop {
                let end = match rows.next() {
                    Some(k) => k + 1,
                    None if pos < cut => cut,
                    None => break,
                };
                let offset = off + pos as u64;
                let len = (end - pos) as u64;
                if len >= 1 << 32 {
                    return Err(Error::at(ErrorKind::SequenceTooLarge { sequence: row_line, len_bytes: len }, offset));
                }
                let seq = SequenceDesc { key: row_line, offset, len_bytes: len as u32, num_samples: 1 };
                if let Some(c) = chunker.push(seq, row_line)? {
                    emit(c)?;
                }
                row_line += 1;
                pos = end;
            }
        } else {
            let pieces = if threads > 1 { split_rows(bytes, threads) } else { vec![(0, cut)] };
            let last = pieces.len().saturating_sub(1);
            let scan = |(i, &(a, b)): (usize, &(usize, usize))| -> Result<BlockScan, Error> {
                scanner.scan_block(&bytes[a..b], off + a as u64, at_eof && i == last)
            };
            let scans: Vec<Result<BlockScan, Error>> = if threads > 1 {
                pieces.par_iter().enumerate().map(scan).collect()
            } else {
                pieces.iter().enumerate().map(scan).collect()
            };
            for s in scans {
                asm.push(&s?, &mut seqs)?;
                for (seq, line) in seqs.drain(..) {
                    if let Some(c) = chunker.push(seq, line)? {
                        emit(c)?;
                    }
                }
            }
        }
        progress(off + cut as u64);
        if at_eof {
            break;
        }
        off += cut as u64;
        if mapped.is_none() {
            // Keep the bytes not scanned yet and, if asked, those of the chunk being gathered.
            let from = if keep { emitted.min(off) } else { off };
            let d = (from - base) as usize;
            buf.copy_within(d..filled, 0);
            filled -= d;
            base = from;
        }
    }
    asm.finish_file(known.unwrap_or(base + filled as u64), &mut seqs)?;
    let mut tail = Vec::new();
    for (seq, line) in seqs.drain(..) {
        if let Some(c) = chunker.push(seq, line)? {
            tail.push(c);
        }
    }
    tail.extend(chunker.finish());
    for c in tail {
        let b = chunk_bytes(&c, mapped, keep, &buf, base, filled);
        on_chunk(c, b)?;
    }
    Ok(start.mode)
}

/// The chunks of a line-mode file without a `definesMBSize` stream, for one pass in which the parser
/// finds the rows: every row is a sequence of one sample, so a chunk (the rows that end within
/// `chunk_size` bytes of its start, or its first row alone if that is longer) is found with one
/// backward search for `\n`, with no work per row. `on_chunk` gets each chunk's description with its
/// `index`, `offset`, `len_bytes` and `first_line` (its first row's key) and no sequences, and its bytes;
/// it returns the number of rows the chunk holds (the parser counts them). The chunks are those of
/// [`index_streaming`], read once (the carry between reads is less than one row).
///
/// With `lend` (and a file that is read, not mapped) each chunk's bytes are handed over as a vector of
/// their own instead of borrowed: the reads go into vectors `lend` gives (say, ones given back by the
/// parsers; their length is kept, so their bytes are not cleared again), and only the carry (less than
/// one row) is copied from one to the next.
///
/// Returns `Ok(None)`, having handed out nothing, when the file is not of that kind (id mode, a
/// `definesMBSize` stream, an empty file) or `chunk_size` is 4 GiB or more (where the index's limits on
/// offsets inside a chunk apply): [`index_streaming_bytes`] serves those.
pub(crate) fn index_line_chunks(
    file: &InputFile,
    cfg: &IndexConfig,
    mut lend: Option<&mut dyn FnMut() -> Vec<u8>>,
    mut on_chunk: impl FnMut(ChunkDesc, ChunkBytes<'_>) -> Result<u64, Error>,
    progress: &mut dyn FnMut(u64),
) -> Result<Option<IndexMode>, Error> {
    // As in `index_streaming_bytes`: a gzip stream's length is learnt where a read comes back short.
    let known = file.known_len();
    if known == Some(0) || cfg.main_alias.is_some() || cfg.chunk_size >= 1 << 32 {
        return Ok(None);
    }
    let start = find_start(file, cfg.skip_sequence_ids)?;
    if start.mode != IndexMode::Lines {
        return Ok(None);
    }
    let mut len = known.unwrap_or(u64::MAX);
    let max = cfg.chunk_size.min(len);
    let mapped = file.mapped();
    // Positional reads: `buf[..filled]` holds the file's bytes from offset `base` on.
    let mut buf: Vec<u8> = Vec::new();
    let mut filled = 0usize;
    let mut base = start.offset;
    let mut at = start.offset; // the next chunk's first byte
    let mut line = start.line;
    let mut index = 0u64;
    while at < len {
        // The bytes from `at` to the end of the window, or further when no row ends in the window.
        let wend = at.saturating_add(max).min(len);
        let end = match mapped {
            Some(m) => {
                let (a, w) = (at as usize, wend as usize);
                if w == m.len() {
                    m.len() as u64
                } else {
                    match memchr::memrchr(b'\n', &m[a..w]) {
                        Some(k) => (a + k + 1) as u64,
                        None => memchr::memchr(b'\n', &m[w..]).map_or(m.len(), |k| w + k + 1) as u64,
                    }
                }
            }
            None => {
                // Drop what the last chunk took; keep the carry.
                let d = (at - base) as usize;
                buf.copy_within(d..filled, 0);
                filled -= d;
                base = at;
                let mut need = (wend - base) as usize;
                // Without the length, a byte more tells whether the file ends with the window.
                let probe = need + usize::from(known.is_none());
                if fill_until(file, &mut buf, &mut filled, base, probe, known.is_none())? {
                    len = base + filled as u64;
                    if at == len {
                        break;
                    }
                    need = need.min(filled);
                }
                let wend = base + need as u64;
                if wend == len {
                    len
                } else if let Some(k) = memchr::memrchr(b'\n', &buf[..need]) {
                    base + k as u64 + 1
                } else {
                    // No row ends in the window: the first row is longer than the chunk size and makes
                    // a chunk alone; read on to its end.
                    let mut searched = need;
                    loop {
                        if let Some(k) = memchr::memchr(b'\n', &buf[searched..filled]) {
                            break base + (searched + k) as u64 + 1;
                        }
                        searched = filled;
                        if base + filled as u64 == len {
                            break len;
                        }
                        let want = (filled + SCAN_BLOCK).min(usize::try_from(len - base).unwrap_or(usize::MAX));
                        if fill_until(file, &mut buf, &mut filled, base, want, known.is_none())? {
                            len = base + filled as u64;
                        }
                    }
                }
            }
        };
        if index >= u64::from(u32::MAX) - 1 {
            return Err(Error::at(
                ErrorKind::Limit { what: "number of chunks".into(), value: index + 1, limit: u64::from(u32::MAX) - 1 },
                at,
            ));
        }
        if end - at >= 1 << 32 {
            // Only a row alone is that long (`max` is smaller): the index's error for it.
            return Err(Error::at(ErrorKind::SequenceTooLarge { sequence: line, len_bytes: end - at }, at));
        }
        let desc = ChunkDesc {
            index: index as u32,
            offset: at,
            len_bytes: end - at,
            first_line: line,
            num_samples: 0,
            sequences: Vec::new(),
        };
        let bytes = match (mapped, lend.as_mut()) {
            (Some(m), _) => ChunkBytes::Borrowed(&m[at as usize..end as usize]),
            (None, None) => ChunkBytes::Borrowed(&buf[(at - base) as usize..(end - base) as usize]),
            (None, Some(lend)) => {
                // `at == base` here: the chunk is `buf[..len]`, the carry what follows it.
                let len = (end - base) as usize;
                let mut next = lend();
                let carry = filled - len;
                if next.len() < carry {
                    next.resize(carry, 0);
                }
                next[..carry].copy_from_slice(&buf[len..filled]);
                let mut chunk = std::mem::replace(&mut buf, next);
                chunk.truncate(len);
                (filled, base) = (carry, end);
                ChunkBytes::Owned(chunk)
            }
        };
        line += on_chunk(desc, bytes)?;
        index += 1;
        at = end;
        progress(at);
    }
    Ok(Some(IndexMode::Lines))
}

/// A chunk's bytes as [`index_line_chunks`] hands them over.
pub(crate) enum ChunkBytes<'a> {
    /// In the map or the indexer's buffer.
    Borrowed(&'a [u8]),
    /// In a vector of their own (exactly the chunk's bytes).
    Owned(Vec<u8>),
}

impl ChunkBytes<'_> {
    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            ChunkBytes::Borrowed(b) => b,
            ChunkBytes::Owned(v) => v,
        }
    }
}

/// Reads until `buf[..want]` holds the file's bytes from `base` on (`buf[..filled]` has them already); at
/// the end of the file first, an error, or when `may_end` (a file whose length is not known yet) true.
fn fill_until(
    file: &InputFile,
    buf: &mut Vec<u8>,
    filled: &mut usize,
    base: u64,
    want: usize,
    may_end: bool,
) -> Result<bool, Error> {
    if buf.len() < want {
        buf.resize(want, 0);
    }
    while *filled < want {
        let n = file.read_some(base + *filled as u64, &mut buf[*filled..want])?;
        if n == 0 {
            if may_end {
                return Ok(true);
            }
            return Err(file.short_read(base + *filled as u64, want - *filled));
        }
        *filled += n;
    }
    Ok(false)
}

/// A chunk's bytes, when they are at hand: in the map, or (with `keep`) in `buf`, which holds the file's
/// bytes from offset `base` on up to `filled` (a chunk always ends at or before the bytes scanned).
fn chunk_bytes<'a>(
    c: &ChunkDesc,
    mapped: Option<&'a [u8]>,
    keep: bool,
    buf: &'a [u8],
    base: u64,
    filled: usize,
) -> Option<&'a [u8]> {
    match mapped {
        Some(m) => m.get(c.offset as usize..c.end() as usize),
        None if keep => {
            let a = usize::try_from(c.offset.checked_sub(base)?).ok()?;
            let b = a.checked_add(usize::try_from(c.len_bytes).ok()?)?;
            buf.get(a..b).filter(|_| b <= filled)
        }
        None => None,
    }
}

/// Builds the whole index in memory.
pub fn build_index(
    file: &InputFile,
    cfg: &IndexConfig,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<CtfIndex, Error> {
    let mut chunks = Vec::new();
    let mode = index_streaming(
        file,
        cfg,
        threads,
        |c| {
            chunks.push(c);
            Ok(())
        },
        progress,
    )?;
    Ok(CtfIndex { mode, chunks, file_len: file.len() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Access;

    /// Every chunk `index_line_chunks` hands over: its description and bytes. They must be in vectors
    /// of their own exactly when vectors are lent for a file that is read.
    fn chunks(
        file: &InputFile,
        cfg: &IndexConfig,
        lend: Option<&mut dyn FnMut() -> Vec<u8>>,
    ) -> Vec<(ChunkDesc, Vec<u8>)> {
        let lent = lend.is_some() && !file.is_mapped();
        let mut got = Vec::new();
        let mode = index_line_chunks(
            file,
            cfg,
            lend,
            |d, b| {
                assert_eq!(matches!(b, ChunkBytes::Owned(_)), lent);
                let rows = b.bytes().iter().filter(|&&c| c == b'\n').count() as u64;
                got.push((d, b.bytes().to_vec()));
                Ok(rows.max(1))
            },
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(mode, Some(IndexMode::Lines));
        got
    }

    /// Chunks read into lent vectors (recycled ones of any length, holding stale bytes) are the chunks
    /// borrowed from the indexer's buffer or the map: same cuts, same bytes, rows longer than a chunk
    /// included.
    #[test]
    fn lent_vectors_hold_the_same_chunks_as_borrowed_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.ctf");
        let mut text = Vec::new();
        let mut k = 7u32;
        for r in 0..3000u32 {
            k = k.wrapping_mul(1_103_515_245).wrapping_add(12345);
            // Mostly short rows, some longer than the chunk size.
            let n = if r % 500 == 3 { 900 } else { (k >> 16) as usize % 40 };
            text.extend_from_slice(b"|a");
            for j in 0..n {
                text.extend_from_slice(format!(" {}", (j as u32 ^ k) % 1000).as_bytes());
            }
            text.push(b'\n');
        }
        std::fs::write(&path, &text).unwrap();
        for chunk_size in [64u64, 700, 4096, 1 << 20] {
            let cfg = IndexConfig { skip_sequence_ids: false, main_alias: None, chunk_size };
            let read = InputFile::open(&path, Access::Read).unwrap();
            let mapped = InputFile::open(&path, Access::Mmap).unwrap();
            let want = chunks(&read, &cfg, None);
            assert_eq!(want.iter().map(|(_, b)| b.len()).sum::<usize>(), text.len());
            assert_eq!(chunks(&mapped, &cfg, None), want);
            // Recycled vectors: stale bytes, lengths from empty to larger than any chunk.
            let mut pool: Vec<Vec<u8>> = (0..50).map(|i| vec![b'\n' ^ (i as u8); (i * 97) % 3000]).collect();
            let mut lend = || pool.pop().unwrap_or_default();
            assert_eq!(chunks(&read, &cfg, Some(&mut lend)), want, "chunk size {chunk_size}");
            // A mapped file's chunks stay borrowed from the map.
            assert_eq!(chunks(&mapped, &cfg, Some(&mut || Vec::new())), want);
        }
    }

    /// A gzip file, whose length is learnt only at its end, is cut into the plain file's chunks by both
    /// indexers: files with and without a last newline, ending in a row longer than a chunk, with chunk
    /// sizes that end a chunk exactly at the end of the file, one byte before and after it.
    #[test]
    fn a_gzip_file_is_indexed_as_the_plain_file_without_its_length() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let mut rows = Vec::new();
        for r in 0..2000u32 {
            rows.extend_from_slice(format!("|a {} {}\n", r % 17, r * 31 % 1000).as_bytes());
        }
        let long = [&rows[..], b"|a", &b" 7".repeat(600), b"\n"].concat();
        for (name, text) in
            [("rows", rows.clone()), ("no last newline", rows[..rows.len() - 1].to_vec()), ("long last row", long)]
        {
            let (plain, gz) = (dir.path().join("t.ctf"), dir.path().join("t.ctf.gz"));
            std::fs::write(&plain, &text).unwrap();
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(&text).unwrap();
            std::fs::write(&gz, e.finish().unwrap()).unwrap();
            let n = text.len() as u64;
            for chunk_size in [64u64, 700, 4096, n - 1, n, n + 1, 1 << 20] {
                let cfg = IndexConfig { skip_sequence_ids: false, main_alias: None, chunk_size };
                let open = |p: &std::path::Path| InputFile::open(p, Access::Read).unwrap();
                let compressed = open(&gz);
                assert_eq!(compressed.known_len(), None, "{name}");
                let brief = |v: Vec<(ChunkDesc, Vec<u8>)>| -> Vec<(ChunkDesc, u32)> {
                    v.into_iter().map(|(d, b)| (d, crc32fast::hash(&b))).collect()
                };
                let want = brief(chunks(&open(&plain), &cfg, None));
                assert_eq!(brief(chunks(&compressed, &cfg, None)), want, "{name}, {chunk_size}");
                let mut lend = Vec::new;
                assert_eq!(brief(chunks(&open(&gz), &cfg, Some(&mut lend))), want, "{name}, {chunk_size}, lent");
                let streamed = |f: &InputFile| {
                    let mut got = Vec::new();
                    let mode = index_streaming_bytes(
                        f,
                        &cfg,
                        2,
                        true,
                        |c, b| {
                            got.push((c, b.map(crc32fast::hash)));
                            Ok(())
                        },
                        &mut |_| {},
                    );
                    (mode.unwrap(), got)
                };
                let compressed = open(&gz);
                assert_eq!(streamed(&compressed), streamed(&open(&plain)), "{name}, {chunk_size}");
                assert_eq!(compressed.known_len(), Some(n));
            }
        }
    }
}
