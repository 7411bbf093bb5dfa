//! Errors: data first. Each kind has a stable code (`E0005`), a category (whose fault), and fields.

use std::fmt;

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Reading or writing a file failed.
    Io,
    /// The input is wrong.
    Format,
    /// The caller is wrong (options, schema, arguments).
    Usage,
    /// The input asks for more than the limits allow.
    Limit,
    /// cntkio broke one of its own invariants: a bug, to be reported.
    Internal,
}

impl Category {
    /// The category's name in reports and Python (`io`, `format`, `usage`, `limit`, `internal`).
    pub fn name(self) -> &'static str {
        match self {
            Category::Io => "io",
            Category::Format => "format",
            Category::Usage => "usage",
            Category::Limit => "limit",
            Category::Internal => "internal",
        }
    }
}

/// Where in an input an error was found. All fields are optional; `line` and `column` are 1-based,
/// `byte` is a 0-based offset in the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    /// The input's path, as given.
    pub path: Option<String>,
    /// Byte offset from the start of the file.
    pub byte: Option<u64>,
    /// 1-based line.
    pub line: Option<u64>,
    /// 1-based column, in bytes.
    pub column: Option<u64>,
    /// Key of the sequence being read.
    pub sequence_id: Option<u64>,
}

impl Position {
    /// Moves a position in a CTF file in line mode `by` lines down: its line and its sequence's key (the
    /// key of a line-mode sequence is its line); its byte offset stays.
    pub fn shift_lines(&mut self, by: u64) {
        for v in [&mut self.line, &mut self.sequence_id].into_iter().flatten() {
            *v += by;
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if let Some(p) = &self.path {
            write!(f, "{p}")?;
            sep = ":";
        }
        match (self.line, self.column, self.byte) {
            (Some(l), Some(c), _) => write!(f, "{sep}{l}:{c}"),
            (Some(l), None, _) => write!(f, "{sep}{l}"),
            (None, _, Some(b)) => write!(f, "{sep}byte {b}"),
            _ => Ok(()),
        }
    }
}

/// Shows a byte the way a person can read it.
pub(crate) fn show_byte(b: Option<u8>) -> String {
    match b {
        None => "end of input".to_string(),
        Some(b'\n') => "end of line".to_string(),
        Some(b'\r') => "'\\r'".to_string(),
        Some(b'\t') => "tab".to_string(),
        Some(b' ') => "space".to_string(),
        Some(b) if (0x21..0x7f).contains(&b) => format!("'{}'", b as char),
        Some(b) => format!("byte 0x{b:02X}"),
    }
}

/// The message of [`ErrorKind::WorkerOutOfRange`].
fn worker_problem(rank: u64, workers: u64) -> String {
    if workers == 0 {
        "the number of workers must be at least 1".to_string()
    } else {
        format!("worker rank {rank} is out of range for {workers} workers (ranks are 0-based)")
    }
}

struct B(Option<u8>);
impl fmt::Display for B {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&show_byte(self.0))
    }
}

/// What went wrong. `#[non_exhaustive]`: new kinds may be added.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    // ---- CTF: file level (fatal) -------------------------------------------------------------
    /// The file starts with a UTF-16 little-endian byte order mark.
    #[error("found a UTF-16 BOM at the beginning of the input file; UTF-16 encoding is not supported (CTF is read as bytes, save the file as UTF-8 or ASCII)")]
    Utf16Bom,
    /// The file has no bytes other than a UTF-8 BOM and whitespace.
    #[error("input file is empty")]
    EmptyFile,
    /// In id mode (the first row starts with a digit... or should), the first non-blank byte is neither a digit nor `|`.
    #[error("expected a sequence id (digits followed by samples) or '|' at the start of the first row, found {}", B(*found))]
    MissingSequenceId {
        /// The byte found (`None`: the file ends inside the first id).
        found: Option<u8>,
    },
    /// A sequence id does not fit in 64 bits.
    #[error("sequence id overflows a 64-bit unsigned integer")]
    SequenceIdOverflow,

    // ---- CTF: sample level (counted against maxErrors) ---------------------------------------
    /// A byte other than `|`, whitespace or a control byte where a sample should start.
    #[error("unexpected {} where a sample should start; expected '|' followed by an input name", B(Some(*found)))]
    ExpectedNamePrefix {
        /// The byte found.
        found: u8,
    },
    /// `|` followed by whitespace, `|` or a control byte.
    #[error("input name prefix '|' is followed by {}; expected an input name", B(*found))]
    EmptyName {
        /// The byte after `|`.
        found: Option<u8>,
    },
    /// An input name runs into the end of the file.
    #[error("the file ends inside an input name; expected values after the name")]
    NameAtEnd,
    /// A byte that cannot start a number where a number should start.
    #[error("unexpected {} in a number of stream \"{stream}\"; expected a digit, '+' or '-'", B(*found))]
    InvalidNumber {
        /// The stream being read.
        stream: String,
        /// The byte found.
        found: Option<u8>,
    },
    /// A sign not followed by a digit.
    #[error("a sign in a number of stream \"{stream}\" is followed by {}; expected a digit", B(*found))]
    SignWithoutDigits {
        /// The stream being read.
        stream: String,
        /// The byte found.
        found: Option<u8>,
    },
    /// `e`/`E` not followed by a digit or sign.
    #[error("an exponent mark in a number of stream \"{stream}\" is followed by {}; expected a digit, '+' or '-'", B(*found))]
    ExponentWithoutDigits {
        /// The stream being read.
        stream: String,
        /// The byte found.
        found: Option<u8>,
    },
    /// A dense sample has more values than the stream's dimension.
    #[error("dense sample of stream \"{stream}\" has {count} values, more than its dim {dim}")]
    DenseTooManyValues {
        /// The stream.
        stream: String,
        /// Number of values found.
        count: u64,
        /// The stream's dim.
        dim: usize,
    },
    /// A dense sample with no values on a last row that has no newline.
    #[error("dense sample of stream \"{stream}\" has no values at the end of the file (CNTK rejects this only without a final newline)")]
    EmptyDenseAtEnd {
        /// The stream.
        stream: String,
    },
    /// A sparse entry does not start with an index.
    #[error("expected a sparse index (digits) in stream \"{stream}\", found {}", B(*found))]
    SparseIndexExpected {
        /// The stream.
        stream: String,
        /// The byte found.
        found: Option<u8>,
    },
    /// A sparse index does not fit in 64 bits.
    #[error("sparse index in stream \"{stream}\" overflows a 64-bit unsigned integer")]
    SparseIndexOverflow {
        /// The stream.
        stream: String,
    },
    /// A sparse index is not below the stream's dimension.
    #[error("sparse index {index} >= dim {dim} in stream \"{stream}\"")]
    SparseIndexOutOfRange {
        /// The stream.
        stream: String,
        /// The index found.
        index: u64,
        /// The stream's dim.
        dim: usize,
    },
    /// A sparse index not followed by `:`.
    #[error("expected ':' after sparse index {index} in stream \"{stream}\", found {}", B(*found))]
    SparseMissingColon {
        /// The stream.
        stream: String,
        /// The index read.
        index: u64,
        /// The byte found.
        found: Option<u8>,
    },
    /// The file ends inside a sparse sample in a way CNTK rejects.
    #[error("the file ends inside sparse sample of stream \"{stream}\" (no final newline)")]
    SparseAtEnd {
        /// The stream.
        stream: String,
    },
    /// A row with no sample read successfully (blank, comment-only, unknown names only, or all samples bad).
    #[error("row has no valid sample (blank, comment-only, only unknown inputs or only bad samples)")]
    EmptyRow,
    /// The length-defining stream has more samples than the sequence has rows mentioning it.
    #[error("stream \"{stream}\" has {found} samples in sequence {sequence}, more than the {expected} expected (the same input twice on one row?)")]
    TooManySamples {
        /// The stream.
        stream: String,
        /// Key of the sequence.
        sequence: u64,
        /// Samples read.
        found: u64,
        /// Samples expected.
        expected: u64,
    },
    /// The length-defining streams have fewer samples than the sequence's declared length.
    #[error("sequence {sequence} has {found} samples, fewer than the {expected} rows expected (a row without samples, or a stream on a line of its own without definesMBSize?)")]
    TooFewSamples {
        /// Key of the sequence.
        sequence: u64,
        /// Maximum sample count over the length-defining streams.
        found: u64,
        /// Declared count.
        expected: u64,
    },
    /// A configured stream has no sample at all in a sequence: always fatal in CNTK.
    #[error("stream(s) {} empty in sequence {sequence}; every sequence needs at least one sample of every configured stream", .streams.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", "))]
    EmptyStream {
        /// Key of the sequence.
        sequence: u64,
        /// Names of the empty streams.
        streams: Vec<String>,
    },
    /// The number of tolerated errors (`maxErrors`) was exceeded.
    #[error("too many errors (maxErrors = {max_errors}); the one over the limit: [{}] {}", last.code(), last.kind())]
    MaxErrorsReached {
        /// The budget.
        max_errors: u64,
        /// The error that exceeded it.
        last: Box<Error>,
    },

    /// A chunk of a CTF file failed to parse, and no row of it up to the error has an input of the schema
    /// while those rows have inputs the schema lacks: the likely cause (a misspelled stream name or alias),
    /// named before the error it caused.
    #[error(
        "input |{alias} of the schema is in no row up to here; the rows have {}{}; this caused: [{}] {}",
        found.iter().map(|n| format!("|{n}")).collect::<Vec<_>>().join(", "),
        suggestion.as_ref().map(|s| format!(": did you mean |{s}?")).unwrap_or_default(),
        caused.code(),
        caused.kind()
    )]
    MissingInput {
        /// The input name the schema looks for (the stream's alias).
        alias: String,
        /// The input names the rows have that the schema lacks.
        found: Vec<String>,
        /// The closest of them, if one is close.
        suggestion: Option<String>,
        /// The error the parse stopped at.
        caused: Box<Error>,
    },

    // ---- Minibatches: sequences the packer refuses (CNTK 2.7's messages) ---------------------
    /// In frame mode, a delivered sequence has more than one sample in some stream.
    #[error(
        "Detected a non-frame sequence of size {samples} in frame mode (stream \"{stream}\" of sequence {sequence})."
    )]
    NonFrameSequence {
        /// Key of the sequence.
        sequence: u64,
        /// The stream with several samples.
        stream: String,
        /// Its number of samples.
        samples: u64,
    },
    /// A delivered sequence has no sample in some stream.
    #[error(
        "AddSequence: Sequences must be a least one frame long (stream \"{stream}\" of sequence {sequence} is empty)."
    )]
    EmptySequenceStream {
        /// Key of the sequence.
        sequence: u64,
        /// The empty stream.
        stream: String,
    },
    /// With truncated BPTT, a delivered sequence's streams have different numbers of samples.
    #[error("For BPTT sequences between different input stream should have the same length (sequence {sequence}: stream \"{stream}\" has {samples} samples, the first stream {expected}).")]
    UnequalStreamLengths {
        /// Key of the sequence.
        sequence: u64,
        /// The stream whose length differs.
        stream: String,
        /// Its number of samples.
        samples: u64,
        /// The first stream's number of samples.
        expected: u64,
    },

    // ---- CBF ------------------------------------------------------------------------------
    /// A CBF file is malformed: a field's value is impossible, or points outside the file or chunk.
    #[error("invalid CBF file: {field} at byte {offset}: {problem}")]
    CbfFormat {
        /// The field being read.
        field: String,
        /// Its absolute offset.
        offset: u64,
        /// The value read (or, for a size, the bytes it needs), where the field is a number.
        found: Option<u64>,
        /// The values the field may take, where they form a range.
        expected: Option<std::ops::RangeInclusive<u64>>,
        /// What is wrong and what was expected, in words.
        problem: String,
    },

    // ---- Compressed input -------------------------------------------------------------------
    /// A gzip or zstd file's compressed data is damaged or ends early, or a size it declares is impossible.
    #[error("invalid {format} data{}: {problem}", .offset.map(|o| format!(" at byte {o} of the compressed file")).unwrap_or_default())]
    CompressedData {
        /// The compression: `gzip`, `BGZF`, `zstd`, `seekable zstd`.
        format: String,
        /// Offset in the compressed file of the damaged block or frame, where it is known.
        offset: Option<u64>,
        /// What is wrong, in words.
        problem: String,
    },

    // ---- Parquet and Arrow IPC ------------------------------------------------------------
    /// A Parquet or Arrow IPC file cannot be decoded, or does not say that it holds cntkio's Arrow mapping
    /// (its schema lacks the mapping's metadata, or the metadata is unreadable or of another version).
    #[error("{problem}")]
    ArrowFormat {
        /// What is wrong, in words.
        problem: String,
    },
    /// A column of a Parquet or Arrow IPC file does not have the type, or holds values, that cntkio's
    /// Arrow mapping gives it.
    #[error("column \"{column}\": expected {expected}, found {found}")]
    ArrowColumn {
        /// The column's name.
        column: String,
        /// What the mapping asks for there.
        expected: String,
        /// What the file has.
        found: String,
    },

    // ---- Data (found while opening, randomizing or packing the input) ---------------------
    /// Data delivered by a deserializer has no chunks, samples or sequences.
    #[error("the data has no {missing}")]
    EmptyData {
        /// What it lacks: `chunks`, `samples (the sweep size is 0)`, `sequences`.
        missing: String,
    },
    /// Every sequence of the data has length 0, although its chunk table declares samples.
    #[error("the data has no samples: all {sequences} of its sequences have length 0, although the chunk table declares {declared} samples")]
    ZeroLengthSequences {
        /// The number of sequences.
        sequences: u64,
        /// The samples the chunk table declares.
        declared: u64,
    },
    /// A chunk's sequence list has another length than its chunk table entry declares.
    #[error("chunk {chunk} has {found} sequences, but the chunk table says {declared}")]
    ChunkSequenceCount {
        /// The chunk.
        chunk: u64,
        /// The sequences the chunk table declares.
        declared: u64,
        /// The sequences the chunk holds.
        found: u64,
    },
    /// A CTF input holds no sequence with a sample of the configured streams, so a conversion has nothing to write.
    #[error(
        "the input holds no sequence for this schema (no row mentions the definesMBSize stream?); no output written"
    )]
    NoSequences,
    /// More errors than were kept were found in a chunk (what a `maxErrors` budget exceeded by them names).
    #[error("{num_errors} errors in chunk {chunk}")]
    ChunkErrors {
        /// The chunk's errors.
        num_errors: u64,
        /// The chunk.
        chunk: u64,
    },
    /// Deserializers joined by key do not hold the same sequence keys.
    #[error("Could not reconcile data between different deserializers. Keys of logical sequences do not match.")]
    KeysDoNotMatch,

    // ---- Usage ----------------------------------------------------------------------------
    /// No streams configured.
    #[error("no streams configured; give at least one --stream NAME:DIM:dense|sparse or a --config file{}", suggested(.suggestion))]
    NoStreams {
        /// The flags of the schema the input's first rows suggest (`--stream x:3:dense …`), where one input
        /// was at hand.
        suggestion: Option<String>,
    },
    /// A stream definition is invalid.
    #[error("stream \"{stream}\": {reason}")]
    InvalidStream {
        /// The stream.
        stream: String,
        /// What is wrong.
        reason: String,
    },
    /// Two streams share an alias.
    #[error("alias \"{alias}\" is used by both stream \"{first}\" and stream \"{second}\"")]
    DuplicateAlias {
        /// The alias.
        alias: String,
        /// First stream.
        first: String,
        /// Second stream.
        second: String,
    },
    /// More than one stream has `definesMBSize`.
    #[error("Only a single stream is allowed to define the minibatch size, but {} found: {}", .streams.len(), .streams.join(", "))]
    SeveralMainStreams {
        /// The streams marked.
        streams: Vec<String>,
    },
    /// A configuration or argument is invalid in a way no more specific kind describes (the syntax of a
    /// CNTK config file, a missing input file argument).
    #[error("{0}")]
    Config(String),
    /// An option, argument or config key has a value it may not have, or one that conflicts with another.
    #[error("{key}{}: {problem}", .value.as_ref().map(|v| format!(" {v:?}")).unwrap_or_default())]
    InvalidOption {
        /// The option as the caller wrote it: a CLI option (`--stream`), a Python keyword
        /// (`partition_index`), a field of a library config (`MinibatchConfig::workers`) or the path of a
        /// CNTK config key (`Train.reader.deserializers[0].input.features.dim`).
        key: String,
        /// The value given, where it is shown.
        value: Option<String>,
        /// What is wrong with its value and what was expected.
        problem: String,
    },
    /// A saved minibatch source state does not fit the source it is restored into, or is not a state.
    #[error("{problem}")]
    InvalidState {
        /// What does not fit.
        problem: String,
    },
    /// A chunk number is not below the number of chunks.
    #[error("chunk {chunk} does not exist; the data has {num_chunks} chunks")]
    ChunkOutOfRange {
        /// The chunk asked for.
        chunk: u64,
        /// The number of chunks.
        num_chunks: u64,
    },
    /// A sequence number is not below the number of sequences.
    #[error("sequence {sequence} does not exist; the data has {num_sequences}")]
    SequenceOutOfRange {
        /// The sequence asked for (0-based, in the data given).
        sequence: u64,
        /// The number of sequences.
        num_sequences: u64,
    },
    /// A worker rank is not below the number of workers, or there are no workers.
    #[error("{}", worker_problem(*.rank, *.workers))]
    WorkerOutOfRange {
        /// The worker's rank (0-based).
        rank: u64,
        /// The number of workers.
        workers: u64,
    },
    /// Columnar data handed to a writer or encoder does not fit its schema or is inconsistent.
    #[error("chunk data{}: {problem}", .sequence.map(|s| format!(", sequence {s}")).unwrap_or_default())]
    InvalidChunkData {
        /// The sequence (0-based, in the data given), where one is at fault.
        sequence: Option<u64>,
        /// What is inconsistent.
        problem: String,
    },
    /// The files of a multi-file source do not have the same streams.
    #[error("file {part} of a multi-file source has streams [{streams}], but the first file has [{first}]")]
    StreamsDiffer {
        /// The file (1-based).
        part: u64,
        /// Its streams, described.
        streams: String,
        /// The first file's streams, described.
        first: String,
    },
    /// A CBF writer is used after one of its writes failed.
    #[error("the writer failed earlier; its output is incomplete")]
    WriterFailed,

    // ---- Limits ---------------------------------------------------------------------------
    /// A sequence is 4 GiB or larger (CNTK's limit).
    #[error("sequence {sequence} is {len_bytes} bytes long; sequences must be smaller than 4 GiB")]
    SequenceTooLarge {
        /// Key.
        sequence: u64,
        /// Size.
        len_bytes: u64,
    },
    /// A limit was exceeded.
    #[error("{what} ({value}) exceeds the limit of {limit}")]
    Limit {
        /// What.
        what: String,
        /// The value asked for.
        value: u64,
        /// The limit.
        limit: u64,
    },

    // ---- Bugs -----------------------------------------------------------------------------
    /// cntkio broke one of its own invariants (a thread panicked, a buffer does not have the length it was
    /// made with): a bug in cntkio, never the input's or the caller's fault.
    #[error("internal error: {problem}; this is a bug in cntkio, please report it")]
    Internal {
        /// What went wrong.
        problem: String,
    },

    // ---- I/O ------------------------------------------------------------------------------
    /// An I/O operation failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
}

/// The end of [`ErrorKind::NoStreams`]'s message: the schema suggested, if any.
fn suggested(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(flags) => {
            format!("; the file's first rows suggest {flags} (each dim the largest seen there: use your model's)")
        }
        None => String::new(),
    }
}

impl ErrorKind {
    /// The stable short code and the variant's name (`("E0015", "SparseIndexOutOfRange")`). The code's
    /// first digit is its category: 0 format, 1 usage, 2 I/O, 3 limit, 9 internal.
    fn code_and_name(&self) -> (&'static str, &'static str) {
        use ErrorKind::*;
        match self {
            Utf16Bom => ("E0001", "Utf16Bom"),
            EmptyFile => ("E0002", "EmptyFile"),
            MissingSequenceId { .. } => ("E0003", "MissingSequenceId"),
            SequenceIdOverflow => ("E0004", "SequenceIdOverflow"),
            ExpectedNamePrefix { .. } => ("E0005", "ExpectedNamePrefix"),
            EmptyName { .. } => ("E0006", "EmptyName"),
            NameAtEnd => ("E0007", "NameAtEnd"),
            InvalidNumber { .. } => ("E0008", "InvalidNumber"),
            SignWithoutDigits { .. } => ("E0009", "SignWithoutDigits"),
            ExponentWithoutDigits { .. } => ("E0010", "ExponentWithoutDigits"),
            DenseTooManyValues { .. } => ("E0011", "DenseTooManyValues"),
            EmptyDenseAtEnd { .. } => ("E0012", "EmptyDenseAtEnd"),
            SparseIndexExpected { .. } => ("E0013", "SparseIndexExpected"),
            SparseIndexOverflow { .. } => ("E0014", "SparseIndexOverflow"),
            SparseIndexOutOfRange { .. } => ("E0015", "SparseIndexOutOfRange"),
            SparseMissingColon { .. } => ("E0016", "SparseMissingColon"),
            SparseAtEnd { .. } => ("E0017", "SparseAtEnd"),
            EmptyRow => ("E0018", "EmptyRow"),
            TooManySamples { .. } => ("E0019", "TooManySamples"),
            TooFewSamples { .. } => ("E0020", "TooFewSamples"),
            EmptyStream { .. } => ("E0021", "EmptyStream"),
            MaxErrorsReached { .. } => ("E0022", "MaxErrorsReached"),
            NonFrameSequence { .. } => ("E0023", "NonFrameSequence"),
            EmptySequenceStream { .. } => ("E0024", "EmptySequenceStream"),
            UnequalStreamLengths { .. } => ("E0025", "UnequalStreamLengths"),
            EmptyData { .. } => ("E0026", "EmptyData"),
            ZeroLengthSequences { .. } => ("E0027", "ZeroLengthSequences"),
            ChunkSequenceCount { .. } => ("E0028", "ChunkSequenceCount"),
            NoSequences => ("E0029", "NoSequences"),
            KeysDoNotMatch => ("E0030", "KeysDoNotMatch"),
            ChunkErrors { .. } => ("E0031", "ChunkErrors"),
            MissingInput { .. } => ("E0032", "MissingInput"),
            CbfFormat { .. } => ("E0100", "CbfFormat"),
            CompressedData { .. } => ("E0101", "CompressedData"),
            ArrowFormat { .. } => ("E0102", "ArrowFormat"),
            ArrowColumn { .. } => ("E0103", "ArrowColumn"),
            NoStreams { .. } => ("E1001", "NoStreams"),
            InvalidStream { .. } => ("E1002", "InvalidStream"),
            DuplicateAlias { .. } => ("E1003", "DuplicateAlias"),
            SeveralMainStreams { .. } => ("E1004", "SeveralMainStreams"),
            Config(_) => ("E1005", "Config"),
            InvalidOption { .. } => ("E1006", "InvalidOption"),
            InvalidState { .. } => ("E1007", "InvalidState"),
            ChunkOutOfRange { .. } => ("E1008", "ChunkOutOfRange"),
            SequenceOutOfRange { .. } => ("E1009", "SequenceOutOfRange"),
            WorkerOutOfRange { .. } => ("E1010", "WorkerOutOfRange"),
            InvalidChunkData { .. } => ("E1011", "InvalidChunkData"),
            StreamsDiffer { .. } => ("E1012", "StreamsDiffer"),
            WriterFailed => ("E1013", "WriterFailed"),
            SequenceTooLarge { .. } => ("E3001", "SequenceTooLarge"),
            Limit { .. } => ("E3002", "Limit"),
            Io { .. } => ("E2001", "Io"),
            Internal { .. } => ("E9001", "Internal"),
        }
    }

    /// Stable short code users can grep for.
    pub fn code(&self) -> &'static str {
        self.code_and_name().0
    }

    /// The kind's name (`"SparseIndexOutOfRange"`), as stable as its code.
    pub fn name(&self) -> &'static str {
        self.code_and_name().1
    }

    /// Whose fault it is: the code's first digit (see [`ErrorKind::code`]).
    pub fn category(&self) -> Category {
        match self.code().as_bytes()[1] {
            b'0' => Category::Format,
            b'1' => Category::Usage,
            b'2' => Category::Io,
            b'3' => Category::Limit,
            _ => Category::Internal,
        }
    }

    /// A hint on how to fix the input, when there is a common cause.
    pub fn help(&self) -> Option<&'static str> {
        use ErrorKind::*;
        Some(match self {
            EmptyRow => "blank and comment-only lines are errors inside CTF data (except at the start of the file); remove them, or raise --max-errors",
            MissingInput { .. } => "check the schema's stream names and aliases against the file's inputs (`cntkio inspect FILE` lists them)",
            ExpectedNamePrefix { found } if found.is_ascii_digit() => {
                "a sequence id must be the very first thing on its line (no leading spaces)"
            }
            ExpectedNamePrefix { .. } => "each sample is written as |name followed by its values",
            TooFewSamples { .. } => {
                "if a stream (a label, say) is written on fewer lines than the others, mark the longest stream with definesMBSize (--defines-mb-size NAME)"
            }
            TooManySamples { .. } => "each input may appear at most once per line",
            EmptyStream { .. } => "CNTK cannot read a sequence that lacks a configured stream; check the aliases, or remove the stream from the schema",
            InvalidNumber { .. } => "numbers are written like 1, -0.5, 2.5e-3 (no leading '.', no 'nan' or 'inf', no ',' as decimal separator)",
            SparseIndexOutOfRange { .. } => "sparse indices are 0-based and must be smaller than the stream's dim",
            SparseMissingColon { .. } => "sparse entries are written index:value with no spaces around ':'",
            MissingSequenceId { .. } => {
                "a CTF file starts either with a sequence id (digits) or with '|'; a CBF file starts with CBF's magic number"
            }
            EmptyDenseAtEnd { .. } | SparseAtEnd { .. } | NameAtEnd => "end the last line with a newline",
            NonFrameSequence { .. } => {
                "frame mode reads sequences of one sample each; turn frame mode off for sequence data"
            }
            EmptySequenceStream { .. } => {
                "CNTK cannot pack a sequence with an empty stream; remove it, or drop the stream from the schema"
            }
            ArrowFormat { .. } | ArrowColumn { .. } => {
                "cntkio reads Parquet and Arrow IPC files in its Arrow mapping (README: \"Parquet and Arrow\"), as `cntkio convert IN OUT.parquet` writes them"
            }
            UnequalStreamLengths { .. } => {
                "truncated BPTT needs every stream of a sequence to have as many samples as the others"
            }
            _ => return None,
        })
    }
}

/// A cntkio error: a kind plus where it happened.
#[derive(Clone)]
pub struct Error(Box<Inner>);

#[derive(Clone)]
struct Inner {
    kind: ErrorKind,
    position: Position,
}

impl Error {
    /// An error with no position.
    pub fn new(kind: ErrorKind) -> Error {
        Error(Box::new(Inner { kind, position: Position::default() }))
    }
    /// An error at a byte offset.
    pub fn at(kind: ErrorKind, byte: u64) -> Error {
        Error(Box::new(Inner { kind, position: Position { byte: Some(byte), ..Position::default() } }))
    }
    /// An I/O error.
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Error {
        Error::new(ErrorKind::Io { op: op.into(), source: std::sync::Arc::new(source) })
    }
    /// A configuration error.
    pub fn config(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Config(msg.into()))
    }
    /// A CBF format error with no number to report.
    pub fn cbf(field: impl Into<String>, offset: u64, problem: impl Into<String>) -> Error {
        let kind =
            ErrorKind::CbfFormat { field: field.into(), offset, found: None, expected: None, problem: problem.into() };
        Error::at(kind, offset)
    }
    /// A CBF format error: the number `found` in the field at `offset` (`None`: it is negative), which
    /// must lie in `expected`.
    pub fn cbf_value(
        field: impl Into<String>,
        offset: u64,
        found: Option<u64>,
        expected: std::ops::RangeInclusive<u64>,
        problem: impl Into<String>,
    ) -> Error {
        let kind = ErrorKind::CbfFormat {
            field: field.into(),
            offset,
            found,
            expected: Some(expected),
            problem: problem.into(),
        };
        Error::at(kind, offset)
    }
    /// Damaged compressed data (see [`ErrorKind::CompressedData`]).
    pub fn compressed(format: impl Into<String>, offset: Option<u64>, problem: impl Into<String>) -> Error {
        Error::new(ErrorKind::CompressedData { format: format.into(), offset, problem: problem.into() })
    }
    /// A bug in cntkio: an invariant of its own that does not hold.
    pub fn internal(problem: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal { problem: problem.into() })
    }
    /// An option, argument or config key with a value it may not have.
    pub fn option(key: impl Into<String>, problem: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidOption { key: key.into(), value: None, problem: problem.into() })
    }
    /// An option given the value `value`, which it may not have.
    pub fn option_value(key: impl Into<String>, value: impl Into<String>, problem: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidOption { key: key.into(), value: Some(value.into()), problem: problem.into() })
    }
    /// Columnar data that is inconsistent, in sequence `sequence` (0-based in the data) or as a whole.
    pub fn chunk_data(sequence: Option<usize>, problem: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidChunkData { sequence: sequence.map(|s| s as u64), problem: problem.into() })
    }
    /// Chunk `chunk` asked for, of data with `num_chunks` chunks.
    pub fn chunk_out_of_range(chunk: u64, num_chunks: usize) -> Error {
        Error::new(ErrorKind::ChunkOutOfRange { chunk, num_chunks: num_chunks as u64 })
    }
    /// A minibatch source state that does not fit.
    pub fn state(problem: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidState { problem: problem.into() })
    }
    /// A limit exceeded: `what` asks for `value`, more than `limit`.
    pub fn limit(what: impl Into<String>, value: u64, limit: u64) -> Error {
        Error::new(ErrorKind::Limit { what: what.into(), value, limit })
    }
    /// The kind.
    pub fn kind(&self) -> &ErrorKind {
        &self.0.kind
    }
    /// The kind, by value.
    pub fn into_kind(self) -> ErrorKind {
        self.0.kind
    }
    /// The position.
    pub fn position(&self) -> &Position {
        &self.0.position
    }
    /// The position, to fill in.
    pub fn position_mut(&mut self) -> &mut Position {
        &mut self.0.position
    }
    /// The kind, to add to (a message's detail that only the caller knows).
    pub fn kind_mut(&mut self) -> &mut ErrorKind {
        &mut self.0.kind
    }
    /// Moves an error of a CTF file in line mode `by` lines down: its line, and the keys it names (a
    /// line-mode sequence's key is its line), for an error found by a parser that counted lines from an
    /// earlier start than the text's true one.
    pub fn shift_lines(&mut self, by: u64) {
        self.0.position.shift_lines(by);
        match &mut self.0.kind {
            ErrorKind::TooManySamples { sequence, .. }
            | ErrorKind::TooFewSamples { sequence, .. }
            | ErrorKind::EmptyStream { sequence, .. } => *sequence += by,
            ErrorKind::MaxErrorsReached { last, .. } => last.shift_lines(by),
            ErrorKind::MissingInput { caused, .. } => caused.shift_lines(by),
            _ => {}
        }
    }
    /// Sets the path.
    pub fn with_path(mut self, path: impl Into<String>) -> Error {
        self.0.position.path = Some(path.into());
        self
    }
    /// Sets the sequence key.
    pub fn with_sequence(mut self, key: u64) -> Error {
        self.0.position.sequence_id = Some(key);
        self
    }
    /// True for I/O errors.
    pub fn is_io(&self) -> bool {
        self.0.kind.category() == Category::Io
    }
    /// Stable short code.
    pub fn code(&self) -> &'static str {
        self.0.kind.code()
    }
    /// Category.
    pub fn category(&self) -> Category {
        self.0.kind.category()
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error").field("kind", &self.0.kind).field("position", &self.0.position).finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.position().to_string();
        if p.is_empty() {
            write!(f, "error[{}]: {}", self.code(), self.kind())
        } else {
            write!(f, "{p}: error[{}]: {}", self.code(), self.kind())
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.kind() {
            ErrorKind::Io { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

/// A warning: something CNTK tolerates without counting an error, reported on request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WarningKind {
    /// A dense sample with fewer values than `dim`, zero-filled.
    ShortDenseSample {
        /// The stream.
        stream: String,
        /// Values found.
        count: u64,
        /// The stream's dim.
        dim: usize,
    },
    /// A dense sample on a final row without newline had more values than `dim`; the extra are dropped.
    LongDenseSampleAtEnd {
        /// The stream.
        stream: String,
        /// Values found.
        count: u64,
        /// The stream's dim.
        dim: usize,
    },
    /// An input name not in the schema; its sample is skipped.
    UnknownInput {
        /// The name found.
        name: String,
    },
    /// The file does not end with a newline.
    MissingFinalNewline,
}

impl fmt::Display for WarningKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WarningKind::ShortDenseSample { stream, count, dim } => write!(
                f,
                "dense sample of stream \"{stream}\" has {count} of {dim} values; the rest are zeros"
            ),
            WarningKind::LongDenseSampleAtEnd { stream, count, dim } => write!(
                f,
                "dense sample of stream \"{stream}\" on the last line has {count} values, more than dim {dim}; the extra values are ignored"
            ),
            WarningKind::UnknownInput { name } => {
                write!(f, "input \"{name}\" is not in the schema; its sample is skipped")
            }
            WarningKind::MissingFinalNewline => write!(f, "the file does not end with a newline"),
        }
    }
}

impl WarningKind {
    /// Stable short code.
    pub fn code(&self) -> &'static str {
        match self {
            WarningKind::ShortDenseSample { .. } => "W0001",
            WarningKind::LongDenseSampleAtEnd { .. } => "W0002",
            WarningKind::UnknownInput { .. } => "W0003",
            WarningKind::MissingFinalNewline => "W0004",
        }
    }
}
