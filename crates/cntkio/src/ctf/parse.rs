//! Parsing one chunk of a CTF file, with errors located at file:line:column.

use crate::input::InputFile;
use crate::Error;
use cntkio_core::ctf::index::ChunkDesc;
use cntkio_core::ctf::parse::{CtfParser, ErrorSink};
use cntkio_core::{ChunkData, ErrorKind, Position, WarningKind};

/// How a chunk is parsed.
#[derive(Debug, Clone, Copy)]
pub struct ParsePolicy {
    /// Stop parsing the chunk after this many errors (`usize::MAX`: never).
    pub stop_after: usize,
    /// Keep at most this many errors (the rest are only counted).
    pub keep: usize,
    /// Record warnings (up to `keep`).
    pub warnings: bool,
    /// Drop a sequence that has an empty stream instead of failing (cntkio's `skip_bad_sequences`).
    pub skip_bad_sequences: bool,
}

/// A parsed chunk and what went wrong in it.
#[derive(Debug)]
pub struct ParsedChunk {
    /// The chunk.
    pub desc: ChunkDesc,
    /// Its data (incomplete when `fatal` is set or parsing stopped early).
    pub data: ChunkData,
    /// Counted errors and dropped-sequence errors (located, in the order found), at most `keep` of them.
    pub errors: Vec<Error>,
    /// Total number of counted errors.
    pub num_errors: u64,
    /// Total number of dropped sequences.
    pub num_dropped: u64,
    /// Warnings (located), when asked for.
    pub warnings: Vec<(WarningKind, Position)>,
    /// Total number of warnings seen (when asked for).
    pub num_warnings: u64,
    /// Every error and warning (when asked for) counted by kind, kept or not.
    pub tally: Tally,
    /// The error that stopped parsing, if any (located).
    pub fatal: Option<Error>,
    /// True if parsing stopped because `stop_after` errors were reached.
    pub stopped: bool,
}

impl ParsedChunk {
    /// Moves a chunk of a line-mode file `by` lines down (its parser counted its lines from an earlier
    /// start than its true one): its first line, its sequences' keys (a line-mode key is the line), and
    /// the lines and keys of its errors and warnings. Its byte offsets stay.
    pub(crate) fn shift_lines(&mut self, by: u64) {
        self.desc.first_line += by;
        for s in &mut self.desc.sequences {
            s.key += by;
        }
        self.data.keys.shift(by);
        let tallied = self.tally.errors.iter_mut().chain(self.tally.drop_causes.iter_mut()).map(|(e, _)| e);
        for e in self.errors.iter_mut().chain(tallied).chain(self.fatal.as_mut()) {
            e.shift_lines(by);
        }
        for (_, pos) in &mut self.warnings {
            pos.shift_lines(by);
        }
    }
}

struct Sink {
    policy: ParsePolicy,
    errors: Vec<Error>,
    num_errors: u64,
    num_dropped: u64,
    warnings: Vec<(WarningKind, u64)>,
    num_warnings: u64,
    tally: Tally,
    stopped: bool,
}

/// Problems counted by kind: errors by code, warnings by class (their kind and stream or input name).
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Counted and dropped-sequence errors per code, with the first of each.
    pub errors: Vec<(Error, u64)>,
    /// The errors found in sequences that were then dropped for lacking a stream (their likely cause),
    /// per code: how many dropped sequences had one.
    pub drop_causes: Vec<(Error, u64)>,
    /// Warnings per class: the first of the class and how many there were.
    pub warnings: Vec<(WarningKind, u64)>,
    /// Warnings beyond [`MAX_CLASSES`] classes (say of many different unknown input names).
    pub other_warnings: u64,
    /// Per stream name: the sequences dropped because that stream was empty in them.
    pub empty_streams: Vec<(String, u64)>,
    /// The errors of the sequence being parsed (its key), until it is dropped or the next one starts.
    current: (Option<u64>, Vec<Error>),
}

/// The classes of warnings a [`Tally`] tells apart (the input names of a damaged file can be many).
pub const MAX_CLASSES: usize = 64;

/// Counts `n` errors of `e`'s code in `list`. The example kept is the first, but for sparse indices out of
/// range the largest index (what the stream's dim would have to exceed).
fn add_error(list: &mut Vec<(Error, u64)>, e: &Error, n: u64) {
    let index = |e: &Error| match e.kind() {
        ErrorKind::SparseIndexOutOfRange { index, .. } => Some(*index),
        _ => None,
    };
    match list.iter_mut().find(|(f, _)| f.code() == e.code()) {
        Some((f, m)) => {
            *m += n;
            if index(e) > index(f) {
                *f = e.clone();
            }
        }
        None => list.push((e.clone(), n)),
    }
}

impl Tally {
    fn error(&mut self, e: &Error) {
        add_error(&mut self.errors, e, 1);
        let key = e.position().sequence_id;
        if let ErrorKind::EmptyStream { streams, sequence } = e.kind() {
            for s in streams {
                self.add_empty(s, 1);
            }
            if self.current.0 == Some(*sequence) {
                let mut codes: Vec<&Error> = Vec::new();
                for c in &self.current.1 {
                    if !codes.iter().any(|d| d.code() == c.code()) {
                        codes.push(c);
                    }
                }
                for c in codes {
                    add_error(&mut self.drop_causes, c, 1);
                }
            }
            self.current = (None, Vec::new());
        } else {
            if self.current.0 != key {
                self.current = (key, Vec::new());
            }
            if self.current.1.len() < 8 {
                self.current.1.push(e.clone());
            }
        }
    }

    fn add_empty(&mut self, stream: &str, n: u64) {
        match self.empty_streams.iter_mut().find(|(s, _)| s == stream) {
            Some((_, m)) => *m += n,
            None => self.empty_streams.push((stream.to_string(), n)),
        }
    }

    fn warning(&mut self, w: &WarningKind) {
        self.add_warning(w, 1);
    }

    /// Counts `samples` samples of an input the schema lacks, found other than by parsing.
    pub(crate) fn add_unknown_input(&mut self, name: &str, samples: u64) {
        self.add_warning(&WarningKind::UnknownInput { name: name.to_string() }, samples);
    }

    fn add_warning(&mut self, w: &WarningKind, n: u64) {
        if let Some((_, m)) = self.warnings.iter_mut().find(|(f, _)| same_class(f, w)) {
            *m += n;
        } else if self.warnings.len() < MAX_CLASSES {
            self.warnings.push((w.clone(), n));
        } else {
            self.other_warnings += n;
        }
    }

    /// Adds `other`'s counts (the tally of a later chunk: first examples stay first).
    pub fn merge(&mut self, other: &Tally) {
        for (e, n) in &other.errors {
            add_error(&mut self.errors, e, *n);
        }
        for (e, n) in &other.drop_causes {
            add_error(&mut self.drop_causes, e, *n);
        }
        for (w, n) in &other.warnings {
            self.add_warning(w, *n);
        }
        self.other_warnings += other.other_warnings;
        for (s, n) in &other.empty_streams {
            self.add_empty(s, *n);
        }
    }
}

/// Warnings of one kind about the same stream (or the same unknown input name).
fn same_class(a: &WarningKind, b: &WarningKind) -> bool {
    use WarningKind::*;
    match (a, b) {
        (ShortDenseSample { stream: x, .. }, ShortDenseSample { stream: y, .. })
        | (LongDenseSampleAtEnd { stream: x, .. }, LongDenseSampleAtEnd { stream: y, .. })
        | (UnknownInput { name: x }, UnknownInput { name: y }) => x == y,
        (MissingFinalNewline, MissingFinalNewline) => true,
        _ => false,
    }
}

impl ErrorSink for Sink {
    fn error(&mut self, e: Error) -> Result<(), Error> {
        self.num_errors += 1;
        self.tally.error(&e);
        if self.errors.len() < self.policy.keep {
            self.errors.push(e);
        }
        if self.num_errors >= self.policy.stop_after as u64 {
            self.stopped = true;
            // A marker, never reported: `parse_chunk` sees `stopped` and drops it.
            return Err(Error::internal("the error budget stopped the parse"));
        }
        Ok(())
    }
    fn wants_warnings(&self) -> bool {
        self.policy.warnings
    }
    fn warning(&mut self, w: WarningKind, byte: u64) {
        self.num_warnings += 1;
        self.tally.warning(&w);
        if self.warnings.len() < self.policy.keep {
            self.warnings.push((w, byte));
        }
    }
    fn fatal(&mut self, e: Error) -> Result<(), Error> {
        if self.policy.skip_bad_sequences {
            self.num_dropped += 1;
            self.tally.error(&e);
            if self.errors.len() < self.policy.keep {
                self.errors.push(e);
            }
            Ok(())
        } else {
            Err(e)
        }
    }
}

/// Parses one chunk of `file`. I/O errors are returned; data errors are in the result.
pub(crate) fn parse_chunk(
    file: &InputFile,
    parser: &CtfParser,
    desc: ChunkDesc,
    policy: ParsePolicy,
    buf: &mut Vec<u8>,
    data: ChunkData,
) -> Result<ParsedChunk, Error> {
    parse_file_chunk(file, parser, desc, policy, buf, data, false)
}

/// [`parse_chunk`]; with `find_rows`, for a chunk of [`index_line_chunks`](super::index::index_line_chunks)
/// (see [`parse_bytes`]).
pub(crate) fn parse_file_chunk(
    file: &InputFile,
    parser: &CtfParser,
    desc: ChunkDesc,
    policy: ParsePolicy,
    buf: &mut Vec<u8>,
    data: ChunkData,
    find_rows: bool,
) -> Result<ParsedChunk, Error> {
    let len = usize::try_from(desc.len_bytes).map_err(|_| {
        Error::new(ErrorKind::Limit { what: "chunk size".into(), value: desc.len_bytes, limit: usize::MAX as u64 })
    })?;
    let path = file.path().display().to_string();
    file.with_bytes(desc.offset, len, buf, |bytes| parse_bytes(bytes, &path, parser, desc, policy, data, find_rows))
}

/// Parses one chunk whose bytes (`desc.len_bytes` of them, from `desc.offset` of the file at `path`)
/// are at hand. Data errors are in the result.
pub(crate) fn parse_chunk_bytes(
    bytes: &[u8],
    path: &str,
    parser: &CtfParser,
    desc: ChunkDesc,
    policy: ParsePolicy,
    data: ChunkData,
) -> ParsedChunk {
    parse_bytes(bytes, path, parser, desc, policy, data, false)
}

/// [`parse_chunk_bytes`]; with `find_rows`, for a chunk of
/// [`index_line_chunks`](super::index::index_line_chunks) (no sequences yet; every row a sequence of one
/// sample): the parser finds the rows, and the result's `desc` has them as the index would have made
/// them. Data errors are in the result.
pub(crate) fn parse_bytes(
    bytes: &[u8],
    path: &str,
    parser: &CtfParser,
    mut desc: ChunkDesc,
    policy: ParsePolicy,
    mut data: ChunkData,
    find_rows: bool,
) -> ParsedChunk {
    data.clear();
    let mut sink = Sink {
        policy,
        errors: Vec::new(),
        num_errors: 0,
        num_dropped: 0,
        warnings: Vec::new(),
        num_warnings: 0,
        tally: Tally::default(),
        stopped: false,
    };
    let r = if let Err(e) = check_decoded_size(bytes, parser, &desc) {
        Err(e)
    } else if find_rows {
        let r = parser.parse_rows(bytes, desc.offset, desc.first_line, &mut desc.sequences, &mut data, &mut sink);
        desc.num_samples = desc.sequences.len() as u64;
        r
    } else {
        parser.parse_sequences(bytes, desc.offset, &desc.sequences, &mut data, &mut sink)
    };
    let fatal = match r {
        Ok(()) => None,
        Err(_) if sink.stopped => None,
        Err(e) => Some(e),
    };
    let mut loc = Locator::new(bytes, desc.offset, desc.first_line, path);
    let errors = sink.errors.into_iter().map(|e| loc.locate(e)).collect();
    let fatal = fatal.map(|e| loc.locate(e));
    let warnings = sink.warnings.into_iter().map(|(w, b)| (w, loc.position(b))).collect();
    ParsedChunk {
        desc,
        data,
        errors,
        num_errors: sink.num_errors,
        num_dropped: sink.num_dropped,
        warnings,
        num_warnings: sink.num_warnings,
        tally: sink.tally,
        fatal,
        stopped: sink.stopped,
    }
}

/// The most a chunk's dense samples may decode to: half the machine's memory (8 GiB where it is not known).
/// Dense samples are zero-filled to their stream's dim, so a few bytes of text (`|a` on a line) become `dim`
/// values: with a dim far larger than the data (a typo in a schema), a chunk would ask for more memory than the
/// machine has.
pub(crate) fn max_decoded_chunk_bytes() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        // `MemTotal:    24596444 kB` (Linux); elsewhere, or unreadable, the fallback.
        let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()?.checked_mul(1024)
        });
        total.map_or(8 << 30, |t| t / 2)
    })
}

/// Refuses a chunk whose dense samples alone would decode to more than [`max_decoded_chunk_bytes`]: its rows
/// (the index's count, or an upper bound from the bytes when rows are found while parsing) times the bytes
/// of a sample of every dense stream.
fn check_decoded_size(bytes: &[u8], parser: &CtfParser, desc: &ChunkDesc) -> Result<(), Error> {
    let per_row: u64 = parser
        .schema()
        .streams()
        .iter()
        .filter(|s| s.format == cntkio_core::StorageFormat::Dense)
        .map(|s| (s.dim as u64).saturating_mul(s.element_type.size_bytes() as u64))
        .sum();
    let limit = max_decoded_chunk_bytes();
    // A row with a dense sample has at least 3 bytes (`|a` and its end of line).
    let mut rows = if desc.num_samples > 0 { desc.num_samples } else { bytes.len() as u64 / 3 + 1 };
    if rows.saturating_mul(per_row) > limit && desc.num_samples == 0 {
        rows = memchr::memchr_iter(b'\n', bytes).count() as u64 + 1;
    }
    let need = rows.saturating_mul(per_row);
    if need > limit {
        return Err(Error::at(
            ErrorKind::Limit {
                what: format!(
                    "decoded size of this chunk's dense samples (up to {rows} rows × {per_row} bytes, zero-filled to the \
                     dims; the limit is half the machine's memory)"
                ),
                value: need,
                limit,
            },
            0,
        ));
    }
    Ok(())
}

/// Turns byte offsets inside a chunk into lines and columns.
pub(crate) struct Locator<'a> {
    bytes: &'a [u8],
    base: u64,
    first_line: u64,
    path: &'a str,
}

impl<'a> Locator<'a> {
    pub(crate) fn new(bytes: &'a [u8], base: u64, first_line: u64, path: &'a str) -> Self {
        Locator { bytes, base, first_line, path }
    }

    pub(crate) fn position(&mut self, byte: u64) -> Position {
        let mut p = Position { path: Some(self.path.to_string()), byte: Some(byte), ..Position::default() };
        if let Some(rel) = byte.checked_sub(self.base).and_then(|r| usize::try_from(r).ok()) {
            let rel = rel.min(self.bytes.len());
            let before = &self.bytes[..rel];
            let lines = memchr::memchr_iter(b'\n', before).count() as u64;
            let line_start = memchr::memrchr(b'\n', before).map_or(0, |k| k + 1);
            // A chunk starts at a row start, so its first line starts at column 1.
            p.line = Some(self.first_line.saturating_add(lines).saturating_add(1));
            p.column = Some((rel - line_start) as u64 + 1);
        }
        p
    }

    pub(crate) fn locate(&mut self, mut e: Error) -> Error {
        if let Some(b) = e.position().byte {
            let p = self.position(b);
            let pos = e.position_mut();
            pos.path = p.path;
            pos.line = p.line;
            pos.column = p.column;
        } else {
            e.position_mut().path = Some(self.path.to_string());
        }
        e
    }
}
