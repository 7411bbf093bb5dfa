//! The CTF indexer (CTF.md §1–§3): rows → sequences → chunks, over blocks of bytes.
//!
//! The caller cuts the file into blocks that start at a row start and end just after a `\n` (the last
//! block ends at the end of the file), scans each block with [`RowScanner::scan_block`] (blocks are
//! independent, so this can run in parallel), then feeds the scans *in order* to a [`SequenceAssembler`], which joins rows
//! across block borders into sequences, and a [`Chunker`], which groups sequences into chunks exactly as
//! CNTK's `Index::AddSequence` does.

use super::{cntk_u64, is_c_space, is_non_printable, SequenceDesc};
use crate::error::{Error, ErrorKind};
use memchr::memmem;

/// How rows are grouped into sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexMode {
    /// Rows starting with digits carry a sequence id; a new id starts a new sequence (CTF.md §2.2).
    Ids,
    /// Every row is a sequence; its key is its 0-based line number (CTF.md §2.3).
    Lines,
}

/// Length of the UTF-8 BOM prefix CNTK skips: `EF BB BF` consumed byte by byte while they match.
#[doc(hidden)]
pub fn bom_len(start: &[u8]) -> usize {
    start.iter().zip([0xEFu8, 0xBB, 0xBF]).take_while(|(a, b)| *a == b).count()
}

/// True if the file starts with a UTF-16 LE BOM (fatal in CNTK).
#[doc(hidden)]
pub fn is_utf16_bom(start: &[u8]) -> bool {
    start.len() >= 2 && start[0] == 0xFF && start[1] == 0xFE
}

/// Skips C-locale whitespace; returns the bytes consumed and the `\n` among them.
#[doc(hidden)]
pub fn skip_space(s: &[u8]) -> (usize, u64) {
    let n = s.iter().position(|&c| !is_c_space(c)).unwrap_or(s.len());
    (n, memchr::memchr_iter(b'\n', &s[..n]).count() as u64)
}

/// Chooses the mode from the first byte after the BOM and leading whitespace (CTF.md §2.1), or fails as
/// CNTK does when an id is expected but absent.
#[doc(hidden)]
pub fn select_mode(first: u8, skip_sequence_ids: bool, offset: u64) -> Result<IndexMode, Error> {
    if skip_sequence_ids || first == b'|' {
        Ok(IndexMode::Lines)
    } else if first.is_ascii_digit() {
        Ok(IndexMode::Ids)
    } else {
        Err(Error::at(ErrorKind::MissingSequenceId { found: Some(first) }, offset))
    }
}

/// In id mode the first id must end before the end of the file (CNTK: "Expected a sequence id at the
/// offset N, none was found" for a file that is only digits). `rest` is everything from the first id on.
#[doc(hidden)]
pub fn check_first_id(rest: &[u8], offset: u64) -> Result<(), Error> {
    if rest.iter().all(|c| c.is_ascii_digit()) {
        return Err(Error::at(ErrorKind::MissingSequenceId { found: None }, offset));
    }
    Ok(())
}

/// What the indexer needs to know: mode and the alias of the `definesMBSize` stream.
#[derive(Debug, Clone)]
#[doc(hidden)]
pub struct RowScanner {
    mode: IndexMode,
    main: Option<memmem::Finder<'static>>,
}

/// A run of rows inside one block (see [`BlockScan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub struct Run {
    /// Absolute offset of the run's first row.
    pub offset: u64,
    /// End of the row (line mode only: a line-mode sequence is exactly its row).
    pub end: u64,
    /// Number of `\n` in the block before this row (add the block's starting line).
    pub line: u64,
    /// The row's id (id mode) — a line-mode run gets its key from `line`.
    pub id: u64,
    /// Rows of the run that count as samples (mention the main stream, or all rows without one).
    pub count: u32,
}

/// The scan of one block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[doc(hidden)]
pub struct BlockScan {
    /// Counted rows before the first run (id mode: rows continuing the previous block's sequence).
    pub lead_count: u32,
    /// Id mode: runs of rows, each starting at a row whose id differs from the previous id-row of the
    /// block. Line mode: one run per counted row.
    pub runs: Vec<Run>,
    /// Number of `\n` in the block.
    pub newlines: u64,
}

impl RowScanner {
    /// A scanner for a mode and an optional main-stream alias.
    pub fn new(mode: IndexMode, main_alias: Option<&str>) -> RowScanner {
        let main = main_alias.map(|a| {
            let mut pat = Vec::with_capacity(a.len() + 1);
            pat.push(b'|');
            pat.extend_from_slice(a.as_bytes());
            memmem::Finder::new(&pat).into_owned()
        });
        RowScanner { mode, main }
    }

    /// The mode.
    pub fn mode(&self) -> IndexMode {
        self.mode
    }

    /// Next position `>= from` where the main alias occurs followed by whitespace, `|`, a control byte,
    /// a byte ≥ 0x80 or the end of the file (CTF.md §2.4).
    fn next_main(&self, block: &[u8], from: usize, is_last: bool) -> usize {
        let f = match &self.main {
            Some(f) => f,
            None => return 0,
        };
        let plen = f.needle().len();
        let mut q = from;
        while let Some(k) = f.find(&block[q..]) {
            let at = q + k;
            match block.get(at + plen) {
                None if is_last => return at,
                None => {}
                Some(&c) if is_c_space(c) || c == b'|' || is_non_printable(c) => return at,
                Some(_) => {}
            }
            q = at + 1;
        }
        usize::MAX
    }

    /// Scans one block that starts at a row start (`base` = its absolute offset). `is_last` marks the
    /// block that ends the file (a digit run reaching its end is then not an id).
    pub fn scan_block(&self, block: &[u8], base: u64, is_last: bool) -> Result<BlockScan, Error> {
        let mut out = BlockScan::default();
        let mut pos = 0usize;
        let mut line = 0u64;
        let mut hit = if self.main.is_some() { self.next_main(block, 0, is_last) } else { 0 };
        let n = block.len();
        while pos < n {
            let row = pos;
            let nl = memchr::memchr(b'\n', &block[pos..]);
            let end = match nl {
                Some(k) => pos + k + 1,
                None => n,
            };
            let counted = if self.main.is_some() {
                if hit < end {
                    hit = self.next_main(block, end, is_last);
                    true
                } else {
                    false
                }
            } else {
                true
            };
            match self.mode {
                IndexMode::Lines => {
                    if counted {
                        out.runs.push(Run { offset: base + row as u64, end: base + end as u64, line, id: 0, count: 1 });
                    }
                }
                IndexMode::Ids => {
                    let id = if block[row].is_ascii_digit() {
                        match cntk_u64(block, row) {
                            Ok((v, q)) if q < n || !is_last => Some(v),
                            // Digits up to the end of the file: CNTK's index loop stops while reading the
                            // id, so this is not a row at all (it stays inside the last sequence's bytes).
                            Ok(_) => break,
                            Err(at) => return Err(Error::at(ErrorKind::SequenceIdOverflow, base + at as u64)),
                        }
                    } else {
                        None
                    };
                    let c = u32::from(counted);
                    match (id, out.runs.last_mut()) {
                        (Some(id), Some(r)) if r.id == id => r.count += c,
                        (Some(id), _) => out.runs.push(Run { offset: base + row as u64, end: 0, line, id, count: c }),
                        (None, Some(r)) => r.count += c,
                        (None, None) => out.lead_count += c,
                    }
                }
            }
            if nl.is_some() {
                line += 1;
            }
            pos = end;
        }
        out.newlines = line;
        Ok(out)
    }
}

/// Joins block scans into sequences (in file order).
#[derive(Debug)]
#[doc(hidden)]
pub struct SequenceAssembler {
    mode: IndexMode,
    /// Line number (0-based) at the start of the next block.
    line: u64,
    /// Id mode: the sequence being built, with the line of its first row.
    cur: Option<(SequenceDesc, u64, u64)>, // (desc with num_samples as count, count as u64, line)
}

/// A sequence and the 0-based line of its first row.
#[doc(hidden)]
pub type LocatedSequence = (SequenceDesc, u64);

impl SequenceAssembler {
    /// Starts at the first data byte, which lies on 0-based line `first_line`.
    pub fn new(mode: IndexMode, first_line: u64) -> SequenceAssembler {
        SequenceAssembler { mode, line: first_line, cur: None }
    }

    fn finish(&mut self, end: u64, out: &mut Vec<LocatedSequence>) -> Result<(), Error> {
        if let Some((mut d, count, line)) = self.cur.take() {
            if count > 0 {
                let len = end - d.offset;
                if len >= 1 << 32 {
                    return Err(Error::at(ErrorKind::SequenceTooLarge { sequence: d.key, len_bytes: len }, d.offset));
                }
                d.len_bytes = len as u32;
                d.num_samples = u32::try_from(count).map_err(|_| {
                    Error::at(
                        ErrorKind::Limit { what: "rows in one sequence".into(), value: count, limit: u32::MAX.into() },
                        d.offset,
                    )
                })?;
                out.push((d, line));
            }
        }
        Ok(())
    }

    /// Adds the next block's scan; completed sequences are appended to `out`.
    pub fn push(&mut self, scan: &BlockScan, out: &mut Vec<LocatedSequence>) -> Result<(), Error> {
        let base_line = self.line;
        match self.mode {
            IndexMode::Lines => {
                for r in &scan.runs {
                    let len = r.end - r.offset;
                    if len >= 1 << 32 {
                        return Err(Error::at(
                            ErrorKind::SequenceTooLarge { sequence: base_line + r.line, len_bytes: len },
                            r.offset,
                        ));
                    }
                    let key = base_line + r.line;
                    out.push((SequenceDesc { key, offset: r.offset, len_bytes: len as u32, num_samples: 1 }, key));
                }
            }
            IndexMode::Ids => {
                if let Some(c) = &mut self.cur {
                    c.1 += u64::from(scan.lead_count);
                }
                for r in &scan.runs {
                    if let Some(c) = &mut self.cur {
                        if c.0.key == r.id {
                            c.1 += u64::from(r.count);
                            continue;
                        }
                    }
                    self.finish(r.offset, out)?;
                    self.cur = Some((
                        SequenceDesc { key: r.id, offset: r.offset, len_bytes: 0, num_samples: 0 },
                        u64::from(r.count),
                        base_line + r.line,
                    ));
                }
            }
        }
        self.line = base_line + scan.newlines;
        Ok(())
    }

    /// Ends the file at `file_len`.
    pub fn finish_file(&mut self, file_len: u64, out: &mut Vec<LocatedSequence>) -> Result<(), Error> {
        self.finish(file_len, out)
    }
}

/// A chunk of whole sequences (CTF.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChunkDesc {
    /// 0-based chunk number.
    pub index: u32,
    /// Absolute offset of its first sequence.
    pub offset: u64,
    /// Byte span, from its first sequence's start to its last sequence's end.
    pub len_bytes: u64,
    /// 0-based line of its first byte.
    pub first_line: u64,
    /// Sum of its sequences' declared lengths.
    pub num_samples: u64,
    /// Its sequences, in file order.
    pub sequences: Vec<SequenceDesc>,
}

impl ChunkDesc {
    /// One past its last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len_bytes
    }
}

/// Groups sequences into chunks exactly as CNTK's `Index::AddSequence`.
#[derive(Debug)]
#[doc(hidden)]
pub struct Chunker {
    max: u64,
    next_index: u64,
    cur: Option<ChunkDesc>,
}

impl Chunker {
    /// `max = min(chunk_size, file_size)`.
    pub fn new(chunk_size: u64, file_size: u64) -> Chunker {
        Chunker { max: chunk_size.min(file_size), next_index: 0, cur: None }
    }

    /// Adds a sequence; returns the chunk it closed, if any.
    pub fn push(&mut self, seq: SequenceDesc, line: u64) -> Result<Option<ChunkDesc>, Error> {
        let start_new = match &self.cur {
            None => true,
            Some(c) => c.len_bytes == 0 || c.len_bytes + u64::from(seq.len_bytes) > self.max,
        };
        let mut done = None;
        if start_new {
            done = self.cur.take();
            if self.next_index >= u64::from(u32::MAX) - 1 {
                return Err(Error::at(
                    ErrorKind::Limit {
                        what: "number of chunks".into(),
                        value: self.next_index + 1,
                        limit: u64::from(u32::MAX) - 1,
                    },
                    seq.offset,
                ));
            }
            self.cur = Some(ChunkDesc {
                index: self.next_index as u32,
                offset: seq.offset,
                len_bytes: 0,
                first_line: line,
                num_samples: 0,
                sequences: Vec::new(),
            });
            self.next_index += 1;
        }
        let c = self.cur.as_mut().expect("a current chunk");
        if seq.offset - c.offset >= 1 << 32 || c.sequences.len() >= u32::MAX as usize {
            return Err(Error::at(
                ErrorKind::Limit {
                    what: "offset of a sequence inside its chunk".into(),
                    value: seq.offset - c.offset,
                    limit: 1 << 32,
                },
                seq.offset,
            ));
        }
        c.sequences.push(seq);
        c.num_samples += u64::from(seq.num_samples);
        c.len_bytes = seq.end() - c.offset;
        Ok(done)
    }

    /// Closes the last chunk.
    pub fn finish(&mut self) -> Option<ChunkDesc> {
        self.cur.take()
    }

    /// Number of chunks started so far.
    pub fn chunks_started(&self) -> u64 {
        self.next_index
    }
}

/// Indexes a whole in-memory file in one go (for tests and small inputs): returns the chunks.
pub fn index_bytes(
    data: &[u8],
    skip_sequence_ids: bool,
    main_alias: Option<&str>,
    chunk_size: u64,
) -> Result<Vec<ChunkDesc>, Error> {
    if is_utf16_bom(data) {
        return Err(Error::at(ErrorKind::Utf16Bom, 0));
    }
    let bom = bom_len(data);
    let (ws, lines) = skip_space(&data[bom..]);
    let start = bom + ws;
    if start >= data.len() {
        return Err(Error::at(ErrorKind::EmptyFile, 0));
    }
    let mode = select_mode(data[start], skip_sequence_ids, start as u64)?;
    if mode == IndexMode::Ids {
        check_first_id(&data[start..], start as u64)?;
    }
    let scanner = RowScanner::new(mode, main_alias);
    let scan = scanner.scan_block(&data[start..], start as u64, true)?;
    let mut asm = SequenceAssembler::new(mode, lines);
    let mut seqs = Vec::new();
    asm.push(&scan, &mut seqs)?;
    asm.finish_file(data.len() as u64, &mut seqs)?;
    let mut chunker = Chunker::new(chunk_size, data.len() as u64);
    let mut chunks = Vec::new();
    for (s, line) in seqs {
        if let Some(c) = chunker.push(s, line)? {
            chunks.push(c);
        }
    }
    chunks.extend(chunker.finish());
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(chunks: &[ChunkDesc]) -> Vec<Vec<u64>> {
        chunks.iter().map(|c| c.sequences.iter().map(|s| s.key).collect()).collect()
    }

    #[test]
    fn worked_example_of_the_spec() {
        let mut data = String::new();
        for i in 0..20i64 {
            data += &format!("{i} |a {i} {} |b {}:1\n", -i, i % 4);
        }
        let c = index_bytes(data.as_bytes(), false, None, 64).unwrap();
        assert_eq!(
            keys(&c),
            vec![
                vec![0, 1, 2],
                vec![3, 4, 5],
                vec![6, 7, 8],
                vec![9, 10, 11],
                vec![12, 13, 14],
                vec![15, 16, 17],
                vec![18, 19]
            ]
        );
        let spans: Vec<(u64, u64)> = c.iter().map(|c| (c.offset, c.end())).collect();
        assert_eq!(spans, vec![(0, 50), (50, 101), (101, 152), (152, 209), (209, 269), (269, 329), (329, 369)]);
    }

    #[test]
    fn id_mode_grouping() {
        let c = index_bytes(b"5 |a 1\n|a 2\n5 |a 3\n6 |a 4\n", false, None, 1 << 20).unwrap();
        let s = &c[0].sequences;
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].key, s[0].num_samples, s[0].len_bytes), (5, 3, 19));
        assert_eq!((s[1].key, s[1].num_samples), (6, 1));
        let c = index_bytes(b"0 |a 1\n1 |a 1\n0 |a 1\n", false, None, 1 << 20).unwrap();
        assert_eq!(keys(&c), vec![vec![0, 1, 0]]);
    }

    #[test]
    fn line_mode_keys_count_leading_blank_lines() {
        let c = index_bytes(b"\xEF\xBB\xBF\n\n|a 1\n|a 2", false, None, 1 << 20).unwrap();
        assert_eq!(keys(&c), vec![vec![2, 3]]);
        assert_eq!(c[0].first_line, 2);
    }

    #[test]
    fn main_stream_counts_and_drops() {
        // Sequence 1 never mentions |a (only |ab): dropped; sequence 2 has 2 counted rows of 3.
        let d = b"1 |ab 1\n2 |a 1\n2 |b 1\n2 |a\t2\n";
        let c = index_bytes(d, false, Some("a"), 1 << 20).unwrap();
        let s = &c[0].sequences;
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].key, s[0].num_samples, s[0].offset), (2, 2, 8));
        // Line mode: rows without the main stream are invisible.
        let c = index_bytes(b"|a 1\n\n|a 2\n", true, Some("a"), 1 << 20).unwrap();
        assert_eq!(keys(&c), vec![vec![0, 2]]);
    }

    #[test]
    fn file_level_errors() {
        assert_eq!(index_bytes(b"", false, None, 10).unwrap_err().code(), "E0002");
        assert_eq!(index_bytes(b"\xEF\xBB\xBF \n\t", false, None, 10).unwrap_err().code(), "E0002");
        assert_eq!(index_bytes(b"\xFF\xFE|a", false, None, 10).unwrap_err().code(), "E0001");
        let e = index_bytes(b"\n abc |a 1", false, None, 10).unwrap_err();
        assert_eq!((e.code(), e.position().byte), ("E0003", Some(2)));
        assert_eq!(index_bytes(b"99999999999999999999 |a 1", false, None, 10).unwrap_err().code(), "E0004");
    }

    #[test]
    fn digits_at_end_of_file_are_no_row() {
        let c = index_bytes(b"1 |a 1\n2", false, None, 1 << 20).unwrap();
        assert_eq!(keys(&c), vec![vec![1]]);
        // CNTK's loop stops inside the id: the digits are not a row (but stay in the sequence's bytes).
        assert_eq!((c[0].sequences[0].num_samples, c[0].sequences[0].len_bytes), (1, 8));
        let e = index_bytes(b"\n007", false, None, 1 << 20).unwrap_err();
        assert_eq!((e.code(), e.position().byte), ("E0003", Some(1)));
    }

    #[test]
    fn blocks_give_the_same_index_as_one_pass() {
        let data = b"3 |a 1\n3 |a 2\n|a 3\n4 |a 1\n4 |a 1\n5 |a 9\n";
        let whole = index_bytes(data, false, None, 1 << 20).unwrap();
        // Split after every row.
        let scanner = RowScanner::new(IndexMode::Ids, None);
        let mut asm = SequenceAssembler::new(IndexMode::Ids, 0);
        let mut seqs = Vec::new();
        let mut start = 0;
        for (i, &c) in data.iter().enumerate() {
            if c == b'\n' {
                let scan = scanner.scan_block(&data[start..=i], start as u64, i + 1 == data.len()).unwrap();
                asm.push(&scan, &mut seqs).unwrap();
                start = i + 1;
            }
        }
        asm.finish_file(data.len() as u64, &mut seqs).unwrap();
        let got: Vec<SequenceDesc> = seqs.into_iter().map(|(s, _)| s).collect();
        assert_eq!(got, whole[0].sequences);
    }
}
