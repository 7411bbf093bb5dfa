//! Validation: read a whole file and report every problem CNTK would trip over, not only the first — what
//! `cntkio validate` and Python's `cntkio.validate` show.
//!
//! A CTF file is parsed with CNTK's rules and every error is counted (none stops the pass); the file is
//! valid when CNTK 2.7 could read it: no fatal error, no sequence lacking a configured stream, at most
//! `maxErrors` errors, and at least one sequence. A CBF file is decoded chunk by chunk and checked for what
//! CNTK's reader fails on (streams of mixed precision, sequences with an empty stream) or miscounts (a
//! chunk table disagreeing with the sequences' lengths: a warning).
//!
//! ```
//! use cntkio::validate::{validate_ctf, ValidateOptions};
//! use cntkio::{Access, CtfOptions, InputFile, Schema, StorageFormat, StreamSpec};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("data.ctf");
//! // sequence 1: a bad value (a row without a valid sample, one sample for two rows: three errors)
//! std::fs::write(&path, "0 |a 1\n1 |a x\n1 |a 2\n2 |a 3\n").unwrap();
//! let schema = Schema::new(vec![StreamSpec::new("a", 1, StorageFormat::Dense)]).unwrap();
//! let file = InputFile::open(&path, Access::Read).unwrap();
//! let opts = CtfOptions { max_errors: 3, ..CtfOptions::default() };
//! let r = validate_ctf(&file, &schema, &opts, &ValidateOptions::default(), &mut |_| {}, &mut |_| {}).unwrap();
//! assert_eq!((r.sequences, r.errors, r.valid()), (3, 3, true));
//! assert_eq!(r.verdict(), "readable: 3 error(s) tolerated by maxErrors = 3");
//! assert_eq!((r.shown[0].code(), r.shown[0].position().line), ("E0008", Some(2)));
//! ```

mod summary;

pub use summary::{shell_word, stream_arg, stream_flag, Problem, Summary, SummaryOptions, SHAPE_VERSION};

use crate::cbf::{CbfFile, CbfOptions};
use crate::convert::Format;
use crate::ctf::parse::Tally;
use crate::ctf::{scan_file, ScanOptions};
use crate::input::{Access, InputFile};
use crate::InputSpec;
use crate::{ChunkData, CtfOptions, Error, ErrorKind, Position, Schema, WarningKind};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

/// How to validate.
#[derive(Debug, Clone, Copy)]
pub struct ValidateOptions {
    /// CTF parser threads (1: the calling thread only).
    pub threads: usize,
    /// Errors (and warnings) kept in the report; every one is counted.
    pub limit: usize,
    /// Collect CTF warnings (samples zero-filled, unknown names…).
    pub warnings: bool,
    /// Asked between chunks whether to stop: `true` ends the validation with the
    /// [`interrupted`](crate::interrupted) error (say when the user pressed Ctrl-C in a host that handles
    /// signals itself, such as Python).
    pub cancel: Option<fn() -> bool>,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions { threads: 1, limit: 1000, warnings: false, cancel: None }
    }
}

/// A problem as it is found (CTF: in file order, a chunk's errors before its warnings).
#[derive(Debug, Clone, Copy)]
pub enum Finding<'a> {
    /// An error (one of those kept: at most [`ValidateOptions::limit`] per chunk).
    Error(&'a Error),
    /// A warning, where it is.
    Warning(&'a WarningKind, &'a Position),
}

/// A problem of a CBF file.
#[derive(Debug, Clone)]
pub struct CbfProblem {
    /// CNTK cannot read the file because of it (else it is a warning).
    pub fatal: bool,
    /// What and where ([`ErrorKind::CbfFormat`], with the file's path and the chunk's byte offset).
    pub error: Error,
    /// For a sequence with an empty stream: its key.
    pub empty_sequence: Option<u64>,
}

/// What a validation found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The file.
    pub path: PathBuf,
    /// Its format.
    pub format: Format,
    /// Sequences read (CBF: before a fatal error).
    pub sequences: u64,
    /// Σ of their declared lengths.
    pub samples: u64,
    /// CTF: samples read per configured stream, in schema order (empty for CBF).
    pub stream_samples: Vec<u64>,
    /// CTF: errors counted against `maxErrors`. CBF: fatal problems (see [`problems`](Self::problems)).
    pub errors: u64,
    /// Sequences lacking a configured stream (CTF) or with an empty stream (CBF): always fatal in CNTK.
    pub dropped: u64,
    /// Warnings counted (CTF: with [`ValidateOptions::warnings`]; CBF: non-fatal problems).
    pub warnings: u64,
    /// CTF: the `maxErrors` budget (0 for CBF).
    pub max_errors: u64,
    /// The error that stopped the pass (the file cannot be read), as the library gave it.
    pub fatal: Option<Error>,
    /// CTF: the first errors, at most [`ValidateOptions::limit`] (the fatal one is not among them).
    pub shown: Vec<Error>,
    /// CTF: the first warnings, at most [`ValidateOptions::limit`].
    pub shown_warnings: Vec<(WarningKind, Position)>,
    /// CBF: every problem found, in file order.
    pub problems: Vec<CbfProblem>,
    /// CTF: the alias of the `definesMBSize` stream, if any (named by the verdict of a file without
    /// sequences).
    pub main_alias: Option<String>,
    /// CTF: the schema's streams, `(name, alias)`, in schema order.
    pub streams: Vec<(String, String)>,
    /// CTF: every error and warning counted by kind (warnings are counted whether or not they are
    /// [shown](ValidateOptions::warnings)).
    pub tally: Tally,
}

/// A stream of the schema whose input name no row of the file has: the usual cause of a file where every
/// sequence lacks a stream (a misspelled `--stream` name or alias).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingInput {
    /// The stream's name.
    pub stream: String,
    /// The input name looked for (its alias).
    pub alias: String,
    /// The input names the rows have that the schema lacks, with how many samples each, most first.
    pub found: Vec<(String, u64)>,
    /// The closest of the names the file has, if one is close (a likely misspelling).
    pub suggestion: Option<String>,
}

impl std::fmt::Display for MissingInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "input |{} of the schema (stream \"{}\") never appears in the file", self.alias, self.stream)?;
        if !self.found.is_empty() {
            let names: Vec<String> = self.found.iter().map(|(n, c)| format!("|{n} ({c} samples)")).collect();
            write!(f, "; its rows have {}, which the schema lacks", names.join(", "))?;
        }
        if let Some(s) = &self.suggestion {
            write!(f, ": did you mean |{s}?")?;
        }
        Ok(())
    }
}

/// What the warnings of a class mean, counted (one line of the summary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarningNote {
    /// The warnings' code (`W0001`…).
    pub code: &'static str,
    /// How many there were.
    pub count: u64,
    /// What they were and what was done about them.
    pub text: String,
}

impl Report {
    fn new(path: &Path, format: Format) -> Report {
        Report {
            path: path.to_path_buf(),
            format,
            sequences: 0,
            samples: 0,
            stream_samples: Vec::new(),
            errors: 0,
            dropped: 0,
            warnings: 0,
            max_errors: 0,
            fatal: None,
            shown: Vec::new(),
            shown_warnings: Vec::new(),
            problems: Vec::new(),
            main_alias: None,
            streams: Vec::new(),
            tally: Tally::default(),
        }
    }

    /// CTF: the schema's streams that no row of the file has, with the input names the rows have instead
    /// (empty when the file has no rows, or when it could not be read).
    pub fn missing_inputs(&self) -> Vec<MissingInput> {
        if self.format != Format::Ctf || self.fatal.is_some() {
            return Vec::new();
        }
        let mut found: Vec<(String, u64)> = self
            .tally
            .warnings
            .iter()
            .filter_map(|(w, n)| match w {
                WarningKind::UnknownInput { name } => Some((name.clone(), *n)),
                _ => None,
            })
            .collect();
        found.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        // A stream no row has: no sample delivered, and empty in every sequence dropped; in a file without
        // sequences, the main stream (whose samples make them).
        let empty_in = |name: &str| self.tally.empty_streams.iter().find(|(s, _)| s == name).map_or(0, |e| e.1);
        let empty = self.is_empty();
        self.streams
            .iter()
            .zip(&self.stream_samples)
            .filter(|&((name, alias), &n)| match empty {
                true => self.main_alias.as_ref() == Some(alias),
                false => n == 0 && empty_in(name) == self.dropped && self.sequences + self.dropped > 0,
            })
            .map(|((stream, alias), _)| MissingInput {
                stream: stream.clone(),
                alias: alias.clone(),
                suggestion: crate::suggest::closest(alias, found.iter().map(|(n, _)| n.as_str())).map(str::to_string),
                found: found.clone(),
            })
            .collect()
    }

    /// CTF: what the warnings meant, a line per class (the most frequent first).
    pub fn warning_notes(&self) -> Vec<WarningNote> {
        let mut notes: Vec<WarningNote> = self
            .tally
            .warnings
            .iter()
            .map(|(w, n)| WarningNote { code: w.code(), count: *n, text: warning_note(w, *n) })
            .collect();
        if self.tally.other_warnings > 0 {
            notes.push(WarningNote {
                code: "W0000",
                count: self.tally.other_warnings,
                text: format!("{} more warning(s) of other kinds or input names", self.tally.other_warnings),
            });
        }
        notes.sort_by_key(|n| std::cmp::Reverse(n.count));
        notes
    }

    /// Every error: counted ones, sequences lacking a stream (CTF; for CBF they are among the fatal
    /// problems) and the fatal one.
    pub fn total_errors(&self) -> u64 {
        let dropped = if self.format == Format::Ctf { self.dropped } else { 0 };
        self.errors + dropped + u64::from(self.fatal.is_some())
    }

    /// A CTF file without any sequence (and no other problem): nothing mentions the main stream.
    pub fn is_empty(&self) -> bool {
        self.format == Format::Ctf && self.fatal.is_none() && self.sequences == 0 && self.dropped == 0
    }

    /// CNTK 2.7 can read the file.
    pub fn valid(&self) -> bool {
        let tolerated = match self.format {
            Format::Ctf => self.errors <= self.max_errors,
            Format::Cbf | Format::Parquet | Format::ArrowIpc => self.errors == 0,
        };
        self.fatal.is_none() && self.dropped == 0 && tolerated && !self.is_empty()
    }

    /// One line saying why the file is valid or not.
    pub fn verdict(&self) -> String {
        let valid = self.valid();
        if valid && self.errors == 0 {
            "valid".to_string()
        } else if valid {
            format!("readable: {} error(s) tolerated by maxErrors = {}", self.errors, self.max_errors)
        } else if self.fatal.is_some() {
            "invalid: the file cannot be read".to_string()
        } else if self.is_empty() {
            match &self.main_alias {
                Some(a) => {
                    let hint = match self.missing_inputs().first().and_then(|m| m.suggestion.clone()) {
                        Some(s) => format!(": did you mean |{s}?"),
                        None => "; check the alias".to_string(),
                    };
                    format!("invalid: no sequence found: no row mentions |{a} (the definesMBSize stream){hint}")
                }
                None => "invalid: no sequence found".to_string(),
            }
        } else if self.dropped > 0 {
            self.dropped_verdict()
        } else if self.format == Format::Cbf {
            "invalid: CNTK cannot read this file".to_string()
        } else {
            format!("invalid: {} error(s), more than maxErrors = {}", self.errors, self.max_errors)
        }
    }
}

impl Report {
    /// The verdict of a file where sequences lack a configured stream: the cause first (an input name the
    /// file never has, or the errors that emptied the stream), then the consequence.
    fn dropped_verdict(&self) -> String {
        let lack = format!("{} sequence(s) lack", self.dropped);
        if let Some(m) = self.missing_inputs().first() {
            let hint = m.suggestion.as_ref().map(|s| format!(" (did you mean |{s}?)")).unwrap_or_default();
            return format!(
                "invalid: input |{} of the schema never appears in the file{hint}, so {lack} stream \"{}\" \
                 (always fatal in CNTK)",
                m.alias, m.stream
            );
        }
        // The most frequent, the first found on a tie (`max_by_key` keeps the last of equals).
        let cause = self.tally.drop_causes.iter().rev().max_by_key(|(_, n)| *n);
        let consequence = format!("{lack} a configured stream (always fatal in CNTK)");
        match cause {
            Some((e, n)) if *n == self.dropped => {
                format!("invalid: {} dropped samples, so {consequence}", error_cause(e))
            }
            Some((e, n)) => format!("invalid: {consequence}; in {n} of them, {} dropped samples", error_cause(e)),
            None => format!("invalid: {consequence}"),
        }
    }
}

/// Errors of `e`'s code as the cause of a verdict: for a sparse index out of range, the largest index and
/// the dim it needs; else an example.
fn error_cause(e: &Error) -> String {
    match e.kind() {
        ErrorKind::SparseIndexOutOfRange { stream, index, dim } => format!(
            "[{}] sparse index {index} >= dim {dim} in stream \"{stream}\" (the largest index found: the dim must \
             be at least {})",
            e.code(),
            index.saturating_add(1)
        ),
        k => format!("[{}] errors (such as: {k})", e.code()),
    }
}

/// What `n` warnings like `w` mean, in a sentence.
fn warning_note(w: &WarningKind, n: u64) -> String {
    match w {
        WarningKind::ShortDenseSample { stream, count, dim } => format!(
            "{n} sample(s) of stream \"{stream}\" had fewer than {dim} values (the first: {count}) and were \
             zero-filled, as CNTK does; check the stream's dim"
        ),
        WarningKind::LongDenseSampleAtEnd { stream, count, dim } => format!(
            "{n} sample(s) of stream \"{stream}\" on the last line had more than {dim} values (the first: \
             {count}); CNTK ignores the extra values"
        ),
        WarningKind::UnknownInput { name } => {
            format!("{n} sample(s) of input |{name}, which the schema lacks, were skipped, as CNTK does")
        }
        WarningKind::MissingFinalNewline => "the file does not end with a newline (CNTK reads it all the same)".into(),
        w => format!("{n} × {w}"),
    }
}

/// The most bytes of CTF text a validation parses at once (see [`validate_ctf`]).
const PARSE_UNIT: u64 = 4 << 20;

/// Validates a CTF file: parses every chunk with CNTK's rules, counting every error. `progress` gets the
/// bytes done; `each` every error and warning kept, as found. Errors: I/O errors only (a file that cannot
/// be parsed is reported in [`Report::fatal`]).
pub fn validate_ctf(
    file: &InputFile,
    schema: &Schema,
    opts: &CtfOptions,
    vo: &ValidateOptions,
    progress: &mut dyn FnMut(u64),
    each: &mut dyn FnMut(Finding<'_>),
) -> Result<Report, Error> {
    // A validation's findings do not depend on how the file is cut into chunks (errors are kept per chunk
    // up to the limit, which is at least the first `limit` of the file), so it parses in pieces no larger
    // than PARSE_UNIT: memory is the pieces in flight, whatever CNTK's chunk size (a 32 MiB chunk of tiny
    // sequences takes ten times its size parsed), and the parsers reuse memory still in cache.
    let opts = &CtfOptions { chunk_size: opts.chunk_size.min(PARSE_UNIT), ..opts.clone() };
    // One pass, in order: a compressed stream is decompressed into memory as it is parsed.
    file.read_in_order();
    let scan = ScanOptions {
        threads: vo.threads.max(1),
        enforce_max_errors: false,
        keep: vo.limit,
        // Always counted, for the summary; shown only when asked for.
        warnings: true,
        skip_bad_sequences: true,
    };
    let mut r = Report::new(file.path(), Format::Ctf);
    r.max_errors = opts.max_errors;
    r.stream_samples = vec![0; schema.len()];
    r.main_alias = schema.main_stream().map(|m| schema.streams()[m].alias.clone());
    r.streams = schema.streams().iter().map(|s| (s.name.clone(), s.alias.clone())).collect();
    let limit = vo.limit;
    let res = scan_file(
        file,
        schema,
        opts,
        &scan,
        |p| {
            crate::check_cancel(vo.cancel)?;
            if let Some(f) = &p.fatal {
                return Err(f.clone());
            }
            r.sequences += p.data.num_sequences() as u64;
            r.samples += p.data.num_samples.iter().map(u64::from).sum::<u64>();
            for (t, d) in r.stream_samples.iter_mut().zip(&p.data.streams) {
                *t += d.num_samples();
            }
            r.errors += p.num_errors;
            r.dropped += p.num_dropped;
            r.warnings += p.num_warnings;
            r.tally.merge(&p.tally);
            for e in &p.errors {
                if r.shown.len() < limit {
                    r.shown.push(e.clone());
                }
                each(Finding::Error(e));
            }
            for (w, pos) in p.warnings.iter().filter(|_| vo.warnings) {
                if r.shown_warnings.len() < limit {
                    r.shown_warnings.push((w.clone(), pos.clone()));
                }
                each(Finding::Warning(w, pos));
            }
            Ok(ControlFlow::Continue(()))
        },
        progress,
    );
    match res {
        Ok(_) => {}
        Err(e) if e.is_io() => return Err(e),
        Err(e) => r.fatal = Some(e),
    }
    if r.is_empty() {
        // No row has the main stream, so no row was parsed: the inputs the rows do have, for the verdict.
        match crate::ctf::infer_schema(file, opts.skip_sequence_ids) {
            Ok((_, inf)) => {
                for s in inf.streams.iter().filter(|s| !r.streams.iter().any(|(_, a)| a == &s.alias)) {
                    r.tally.add_unknown_input(&s.alias, s.samples());
                }
            }
            Err(e) if e.is_io() => return Err(e),
            Err(_) => {} // no input name at all
        }
    }
    Ok(r)
}

/// Validates a CBF file: decodes every chunk and checks what CNTK's reader fails on. `progress` gets the
/// byte offset of each chunk done. Of `vo`, only `cancel` applies (asked before each chunk). Errors: I/O
/// errors only (a damaged file is reported in [`Report::fatal`], with the path).
pub fn validate_cbf(
    path: &Path,
    options: &CbfOptions,
    vo: &ValidateOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<Report, Error> {
    let mut r = Report::new(path, Format::Cbf);
    let res = check_cbf(path, options, vo.cancel, &mut r, progress);
    r.errors = r.problems.iter().filter(|p| p.fatal).count() as u64;
    r.warnings = r.problems.len() as u64 - r.errors;
    match res {
        Ok(()) => {}
        Err(e) if e.is_io() => return Err(e),
        Err(e) => r.fatal = Some(e.with_path(path.display().to_string())),
    }
    Ok(r)
}

fn check_cbf(
    path: &Path,
    options: &CbfOptions,
    cancel: Option<fn() -> bool>,
    r: &mut Report,
    progress: &mut dyn FnMut(u64),
) -> Result<(), Error> {
    let f = CbfFile::open_with(path, options)?;
    let problem = |fatal: bool, message: String, offset: Option<u64>, empty_sequence: Option<u64>| {
        let mut e = Error::cbf("data", offset.unwrap_or(0), message);
        e.position_mut().byte = offset;
        CbfProblem { fatal, error: e.with_path(path.display().to_string()), empty_sequence }
    };
    let types: std::collections::BTreeSet<&str> = f.streams().iter().map(|s| s.element_type.cntk_name()).collect();
    if types.len() > 1 {
        r.problems.push(problem(
            true,
            "streams mix float and double; CNTK requires every stream to match the reader's single precision".into(),
            None,
            None,
        ));
    }
    let mut buf = Vec::new();
    let mut data = ChunkData::new(&f.schema()?);
    let mut empty = Vec::new();
    for (k, c) in f.chunks().iter().enumerate() {
        crate::check_cancel(cancel)?;
        let s = f.read_chunk_into(k, &mut buf, &mut data)?;
        if s.meta_total != u64::from(c.num_samples) {
            r.problems.push(problem(
                false,
                format!(
                    "chunk {k}: the chunk table says {} samples but the sequences' meta counts sum to {} (sweep sizes \
                     and epochs will disagree with the data)",
                    c.num_samples, s.meta_total
                ),
                Some(c.offset),
                None,
            ));
        }
        empty.clear();
        empty.resize(data.num_sequences(), false);
        for (si, st) in data.streams.iter().enumerate() {
            for (q, e) in empty.iter_mut().enumerate().take(st.num_sequences()) {
                if st.sequence_len(q) == 0 {
                    *e = true;
                    r.problems.push(problem(
                        true,
                        format!(
                            "chunk {k}, sequence {}: stream \"{}\" has no sample; CNTK fails on such sequences \
                             (\"Sequences must be a least one frame long\")",
                            data.keys.get(q),
                            f.streams()[si].name
                        ),
                        Some(c.offset),
                        Some(data.keys.get(q)),
                    ));
                }
            }
        }
        r.dropped += empty.iter().filter(|&&e| e).count() as u64;
        r.sequences += data.num_sequences() as u64;
        r.samples += data.num_samples.iter().map(u64::from).sum::<u64>();
        progress(c.offset);
    }
    Ok(())
}

/// Validates one input, whatever its format: a CTF file against its schema and options ([`validate_ctf`],
/// read with `access`; `each` sees its errors and warnings as they are found), a CBF file's structure and
/// every record ([`validate_cbf`], mapped when `access` is [`Access::Mmap`]), a Parquet or Arrow IPC file
/// ([`validate_arrow`]). `progress` gets what each of them reports.
pub fn validate_input(
    input: &InputSpec,
    access: Access,
    vo: &ValidateOptions,
    progress: &mut dyn FnMut(u64),
    each: &mut dyn FnMut(Finding<'_>),
) -> Result<Report, Error> {
    match input {
        InputSpec::Ctf(i) => {
            let file = InputFile::open(&i.path, access)?;
            validate_ctf(&file, &i.schema, &i.options, vo, progress, each)
        }
        InputSpec::Cbf(i) => validate_cbf(&i.path, &i.options.clone().mmap(access == Access::Mmap), vo, progress),
        InputSpec::Arrow(i) => validate_arrow(&i.path, vo, progress),
    }
}

/// Validates a Parquet or Arrow IPC file in cntkio's [Arrow mapping](crate::arrow): opens it (its mapping
/// and column types checked) and decodes every chunk. The file is valid when every chunk decodes; a
/// failure is [`Report::fatal`]. `progress` gets the number of chunks done. Of `vo`, only `cancel`
/// applies. Errors: I/O errors only.
pub fn validate_arrow(path: &Path, vo: &ValidateOptions, progress: &mut dyn FnMut(u64)) -> Result<Report, Error> {
    let format = crate::convert::detect_format(path)?;
    let mut r = Report::new(path, format);
    let res = (|| -> Result<(), Error> {
        let f = crate::arrow::ArrowFile::open(path)?;
        r.streams = f.schema().streams().iter().map(|s| (s.name.clone(), s.alias.clone())).collect();
        let mut data = ChunkData::new(f.schema());
        for k in 0..f.chunk_count() {
            crate::check_cancel(vo.cancel)?;
            f.read_chunk_into(k, &mut data)?;
            r.sequences += data.num_sequences() as u64;
            r.samples += data.num_samples.iter().map(u64::from).sum::<u64>();
            progress(k as u64 + 1);
        }
        Ok(())
    })();
    match res {
        Ok(()) => {}
        Err(e) if e.is_io() => return Err(e),
        Err(e) => {
            r.errors = 1;
            r.fatal = Some(if e.position().path.is_none() { e.with_path(path.display().to_string()) } else { e });
        }
    }
    Ok(r)
}
