//! A validation's result as data: what `cntkio validate --json` prints for each file and what Python's
//! `cntkio.validate` returns — one shape for both ([`SHAPE_VERSION`]).

use super::{MissingInput, Report, WarningNote};
use crate::convert::Format;
use crate::{Error, Position, Schema, StreamSpec, WarningKind};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// The version of the JSON shape of [`Summary`] (`"version"` of `cntkio validate --json`).
pub const SHAPE_VERSION: u32 = 2;

/// One file's validation: the verdict, the totals and the problems kept.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The file, as given.
    pub path: String,
    /// `ctf`, `cbf`, `parquet` or `arrow`.
    pub format: &'static str,
    /// CTF: the schema was not given but taken from what the rows suggest.
    pub schema_inferred: bool,
    /// CTF: the schema checked against, each stream as `--stream` takes it (`NAME:DIM:dense|sparse[:ALIAS]`).
    pub schema: Vec<String>,
    /// CNTK 2.7 can read the file.
    pub valid: bool,
    /// Why the file is valid or not, in one line.
    pub verdict: String,
    /// Sequences read (a CBF file that cannot be read: 0).
    pub sequences: u64,
    /// Σ of their declared lengths.
    pub samples: u64,
    /// CTF: samples read per stream of the schema, by stream name (in schema order).
    #[serde(serialize_with = "as_map")]
    pub stream_samples: Vec<(String, u64)>,
    /// Every error counted (more than [`errors`](Self::errors) holds when there were more than the limit).
    pub num_errors: u64,
    /// Sequences dropped for lacking a stream (always fatal in CNTK).
    pub dropped_sequences: u64,
    /// Every warning counted.
    pub num_warnings: u64,
    /// CTF: the `maxErrors` budget (0 otherwise).
    pub max_errors: u64,
    /// The first errors, at most the limit, the one that stopped the pass (if any) last.
    pub errors: Vec<Problem>,
    /// The first warnings, at most the limit.
    pub warnings: Vec<Problem>,
    /// CTF: the schema's inputs no row has, with the names the rows have instead.
    pub missing_inputs: Vec<MissingInput>,
    /// CTF: what each class of warnings meant, counted (the most frequent first).
    pub warning_notes: Vec<WarningNote>,
}

/// One error or warning, every field of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// `error` or `warning`.
    pub severity: &'static str,
    /// Whose fault: `format`, `io`, `usage`, `limit` or `internal` (warnings: `format`).
    pub category: &'static str,
    /// The stable code (`E0008`, `W0001`…).
    pub code: &'static str,
    /// The kind's name (`BadNumber`…; `Warning` for warnings).
    pub kind: &'static str,
    /// What is wrong, without the place.
    pub message: String,
    /// The whole one-line message with its place, as the command line prints it.
    pub display: String,
    /// What to do about it, where there is advice.
    pub help: Option<&'static str>,
    /// The file.
    pub path: Option<String>,
    /// Byte offset in the file.
    pub byte: Option<u64>,
    /// 1-based line (CTF).
    pub line: Option<u64>,
    /// 1-based column in bytes (CTF).
    pub column: Option<u64>,
    /// The key of the sequence being read.
    pub sequence_id: Option<u64>,
}

impl Problem {
    /// An error, its path set to `path` where the error has none.
    pub fn error(e: &Error, path: &str) -> Problem {
        let mut p = Problem::of(e);
        p.path.get_or_insert_with(|| path.to_string());
        p
    }

    /// An error, every field as the error has it.
    pub fn of(e: &Error) -> Problem {
        let p = e.position();
        Problem {
            severity: "error",
            category: e.category().name(),
            code: e.code(),
            kind: e.kind().name(),
            message: e.kind().to_string(),
            display: e.to_string(),
            help: e.kind().help(),
            path: p.path.clone(),
            byte: p.byte,
            line: p.line,
            column: p.column,
            sequence_id: p.sequence_id,
        }
    }

    /// A CTF warning found at `pos` (its path set to `path` where the position has none).
    pub fn warning(w: &WarningKind, pos: &Position, path: &str) -> Problem {
        Problem {
            severity: "warning",
            category: "format",
            code: w.code(),
            kind: "Warning",
            message: w.to_string(),
            display: format!("{pos}: warning[{}]: {w}", w.code()),
            help: None,
            path: Some(pos.path.clone().unwrap_or_else(|| path.to_string())),
            byte: pos.byte,
            line: pos.line,
            column: pos.column,
            sequence_id: pos.sequence_id,
        }
    }

    /// A CBF problem that CNTK reads past, as a warning.
    fn into_warning(mut self) -> Problem {
        self.severity = "warning";
        self
    }
}

/// A stream as `--stream` takes it: `NAME:DIM:dense|sparse[:ALIAS]` (the alias only where it differs). A
/// CTF name may hold any printable byte but `|`; one with a `:` becomes the alias (which `--stream` reads
/// to the end of the value), after a NAME with `_` in place of each `:`.
pub fn stream_flag(s: &StreamSpec) -> String {
    let name = s.name.replace(':', "_");
    let alias = if s.alias == name { String::new() } else { format!(":{}", s.alias) };
    format!("{name}:{}:{}{alias}", s.dim, s.format.name())
}

/// `--stream VALUE` for `s` (see [`stream_flag`]), quoted for a POSIX shell where the value needs it, so
/// that a suggested command line can be pasted as it is.
pub fn stream_arg(s: &StreamSpec) -> String {
    format!("--stream {}", shell_word(&stream_flag(s)))
}

/// `w` as one word of a POSIX shell command line: as it is when it holds only characters no shell
/// treats specially, else in single quotes.
pub fn shell_word(w: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-.,:/=+@%".contains(c);
    if !w.is_empty() && w.chars().all(plain) {
        return w.to_string();
    }
    format!("'{}'", w.replace('\'', r"'\''"))
}

/// What [`Report::summary`] needs beyond the report.
#[derive(Debug, Clone, Copy)]
pub struct SummaryOptions<'a> {
    /// CTF: the schema the file was checked with.
    pub schema: Option<&'a Schema>,
    /// The schema was inferred from the rows.
    pub schema_inferred: bool,
    /// Errors and warnings kept, each (every one is counted).
    pub limit: usize,
}

impl Report {
    /// The report as data, the errors and warnings cut to `o.limit` each. A CBF file that cannot be read
    /// is summarised without what was found before the failure: no sequences, only the fatal error.
    pub fn summary(&self, o: &SummaryOptions<'_>) -> Summary {
        let path = self.path.display().to_string();
        let cbf_unreadable = self.format == Format::Cbf && self.fatal.is_some();
        let mut errors: Vec<Problem> = Vec::new();
        let mut warnings: Vec<Problem> = Vec::new();
        // Room for the fatal error: it is the one that matters most.
        let room = o.limit.saturating_sub(usize::from(self.fatal.is_some()));
        errors.extend(self.shown.iter().take(room).map(|e| Problem::error(e, &path)));
        if !cbf_unreadable {
            for p in &self.problems {
                let problem = Problem::error(&p.error, &path);
                match p.fatal {
                    true if errors.len() < room => errors.push(problem),
                    false if warnings.len() < o.limit => warnings.push(problem.into_warning()),
                    _ => {}
                }
            }
        }
        if let Some(e) = self.fatal.as_ref().filter(|_| o.limit > 0) {
            errors.push(Problem::error(e, &path));
        }
        let room = o.limit.saturating_sub(warnings.len());
        warnings.extend(self.shown_warnings.iter().take(room).map(|(w, pos)| Problem::warning(w, pos, &path)));
        let (sequences, samples, num_errors, num_warnings) = match cbf_unreadable {
            true => (0, 0, 1, 0),
            false => (self.sequences, self.samples, self.total_errors(), self.warnings),
        };
        let streams = o.schema.map(|s| s.streams()).unwrap_or_default();
        Summary {
            path,
            format: self.format.name(),
            schema_inferred: o.schema_inferred,
            schema: streams.iter().map(stream_flag).collect(),
            valid: self.valid(),
            verdict: self.verdict(),
            sequences,
            samples,
            stream_samples: streams.iter().map(|s| s.name.clone()).zip(self.stream_samples.iter().copied()).collect(),
            num_errors,
            dropped_sequences: self.dropped,
            num_warnings,
            max_errors: self.max_errors,
            errors,
            warnings,
            missing_inputs: self.missing_inputs(),
            warning_notes: self.warning_notes(),
        }
    }
}

/// `[(name, n)…]` as a JSON object, in order.
fn as_map<S: Serializer>(pairs: &[(String, u64)], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(pairs.len()))?;
    for (k, v) in pairs {
        m.serialize_entry(k, v)?;
    }
    m.end()
}

impl Serialize for MissingInput {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Found<'a> {
            name: &'a str,
            samples: u64,
        }
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("stream", &self.stream)?;
        m.serialize_entry("alias", &self.alias)?;
        let found: Vec<Found<'_>> =
            self.found.iter().map(|(name, samples)| Found { name, samples: *samples }).collect();
        m.serialize_entry("found", &found)?;
        m.serialize_entry("suggestion", &self.suggestion)?;
        m.serialize_entry("text", &self.to_string())?;
        m.end()
    }
}

impl Serialize for WarningNote {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("code", self.code)?;
        m.serialize_entry("count", &self.count)?;
        m.serialize_entry("text", &self.text)?;
        m.end()
    }
}
