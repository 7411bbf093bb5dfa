//! Building the index of a CTF file: streaming (for one pass over the data) or whole (for random access),
//! with the block scans spread over threads.

use crate::input::InputFile;
use crate::Error;
use cntkio_core::ctf::index::{
    bom_len, check_first_id, is_utf16_bom, select_mode, skip_space, BlockScan, ChunkDesc, Chunker, IndexMode,
    RowScanner, SequenceAssembler,
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
    let len = file.len();
    let mut head = vec![0u8; (len as usize).min(SCAN_BLOCK)];
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
        if pos >= len {
            return Err(Error::at(ErrorKind::EmptyFile, 0));
        }
        block.resize(SCAN_BLOCK, 0);
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
    let len = file.len();
    if len == 0 {
        return Err(Error::at(ErrorKind::EmptyFile, 0));
    }
    let start = find_start(file, cfg.skip_sequence_ids)?;
    let scanner = RowScanner::new(start.mode, cfg.main_alias.as_deref());
    let mut asm = SequenceAssembler::new(start.mode, start.line);
    let mut chunker = Chunker::new(cfg.chunk_size, len);
    let mut seqs = Vec::new();
    let threads = threads.max(1);
    let window = SCAN_BLOCK * threads;
    let mut buf: Vec<u8> = Vec::new();
    let mut off = start.offset; // file offset of the bytes being scanned
    let mapped = file.mapped();
    loop {
        // The bytes to scan: a window of the map, or of `buf` (carry + newly read).
        let (bytes, at_eof, cut): (&[u8], bool, usize) = match mapped {
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
                (&m[a..a + cut], at_eof, cut)
            }
            None => {
                let have = buf.len();
                let want = window.max(have + SCAN_BLOCK);
                buf.resize(want, 0);
                let n = file.read_some(off + have as u64, &mut buf[have..])?;
                buf.truncate(have + n);
                let at_eof = off + buf.len() as u64 >= len;
                let cut = if at_eof {
                    buf.len()
                } else {
                    match memchr::memrchr(b'\n', &buf[have..]) {
                        Some(k) => have + k + 1,
                        None => continue, // one row longer than the buffer: read more
                    }
                };
                (&buf[..cut], at_eof, cut)
            }
        };
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
                    on_chunk(c)?;
                }
            }
        }
        progress(off + cut as u64);
        if at_eof {
            break;
        }
        if mapped.is_none() {
            buf.drain(..cut);
        }
        off += cut as u64;
    }
    asm.finish_file(len, &mut seqs)?;
    for (seq, line) in seqs.drain(..) {
        if let Some(c) = chunker.push(seq, line)? {
            on_chunk(c)?;
        }
    }
    if let Some(c) = chunker.finish() {
        on_chunk(c)?;
    }
    Ok(start.mode)
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
