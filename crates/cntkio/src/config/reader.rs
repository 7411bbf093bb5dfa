//! Extracting a typed reader configuration from a parsed config (CTF.md §10, CBF.md §5, READER.md §2, §9.3).

use super::brainscript::{apply_overrides, parse, Block, Entry, Pos, Resolved, Scope, Value};
use crate::options::{CtfOptions, DEFAULT_CHUNK_SIZE};
use cntkio_core::error::{Error, ErrorKind, Position};
use cntkio_core::schema::{ElementType, Schema, StorageFormat, StreamSpec};
use std::path::{Path, PathBuf};

/// CNTK's `randomizeAuto`: a window of 2^62 − 1 samples, i.e. the whole sweep.
pub const RANDOMIZE_AUTO: u64 = (1 << 62) - 1;

/// 4 GiB: the default chunk-based window is this many bytes of chunks (`4 GiB / chunkSizeInBytes`).
const FOUR_GIB: u64 = 4 << 30;

/// The default window of the legacy `CNTKBinaryReader`: 128 chunks.
pub const DEFAULT_CBF_WINDOW_CHUNKS: u64 = 128;

/// Which CNTK reader the section configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReaderKind {
    /// `readerType = "CNTKTextFormatReader"` (also the default when there is no `readerType`).
    LegacyCtf,
    /// `readerType = "CNTKBinaryReader"`.
    LegacyCbf,
    /// A composite reader: `deserializers = ( … )`.
    Composite,
}

/// The effective randomization, with the defaults of READER.md §2 applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Randomization {
    /// Data are read in file order.
    Off,
    /// Randomized with a window of this many chunks.
    Chunks(u64),
    /// Randomized with a window of this many samples ([`RANDOMIZE_AUTO`] means the whole sweep).
    Samples(u64),
}

/// Something CNTK accepts but that is probably not what the author meant (an unknown key, a key the chosen
/// reader ignores, a syntax problem outside the reader section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// What and why.
    pub message: String,
    /// Where, in the config file or an override.
    pub position: Position,
}

/// One deserializer: a data file and how to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeserializerConfig {
    /// A CNTK Text Format file.
    Ctf {
        /// The `file` value as written (after `$name$` substitution).
        file: String,
        /// `file` resolved against the data directory (equal to `file` when there is none or `file` is
        /// absolute).
        path: PathBuf,
        /// The streams, in the order of the `input` block (CNTK sorts them case-insensitively by name
        /// internally; the order does not affect reading). Element types are the precision.
        schema: Schema,
        /// The deserializer's options.
        options: CtfOptions,
    },
    /// A CNTK Binary Format file.
    Cbf {
        /// The `file` value as written (after `$name$` substitution).
        file: String,
        /// `file` resolved against the data directory.
        path: PathBuf,
        /// Stream renames from the `input` block: `(new name, name in the file)`, in the order written.
        /// Inputs without an `alias` rename nothing and are not listed.
        renames: Vec<(String, String)>,
        /// The precision, which must match the file's element types.
        precision: ElementType,
    },
}

impl DeserializerConfig {
    /// The `file` value as written.
    pub fn file(&self) -> &str {
        match self {
            DeserializerConfig::Ctf { file, .. } | DeserializerConfig::Cbf { file, .. } => file,
        }
    }

    /// The resolved path of the data file.
    pub fn path(&self) -> &Path {
        match self {
            DeserializerConfig::Ctf { path, .. } | DeserializerConfig::Cbf { path, .. } => path,
        }
    }
}

/// A reader section, typed, with CNTK's defaults applied (READER.md §9.3). Keys the chosen reader does not
/// read keep their composite-reader defaults.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ReaderConfig {
    /// Path of the reader block, e.g. `Simple.reader` (`reader` for a top-level reader).
    pub section: String,
    /// Legacy CTF, legacy CBF or composite.
    pub kind: ReaderKind,
    /// `readerType` of a legacy reader, as written (`Cntk.Deserializers.TextFormat`, CNTK's default, when
    /// absent); `None` for a composite reader.
    pub legacy_reader: Option<String>,
    /// The deserializers, in order; the first is the primary.
    pub deserializers: Vec<DeserializerConfig>,
    /// `precision` (default `float`); every deserializer uses it.
    pub precision: ElementType,
    /// `randomize` (default true; `none` means false).
    pub randomize: bool,
    /// `randomizationWindow` if given.
    pub randomization_window: Option<u64>,
    /// `sampleBasedRandomizationWindow` if given.
    pub sample_based_randomization_window: Option<bool>,
    /// The effective randomization: `randomize`, the window and its unit with the defaults of the reader
    /// kind applied (READER.md §2).
    pub randomization: Randomization,
    /// `randomizationSeed` (default 0).
    pub randomization_seed: u64,
    /// `frameMode` (default false; always false for the legacy CBF reader).
    pub frame_mode: bool,
    /// `truncationLength` when `truncated = true` (composite reader only).
    pub truncation_length: Option<u64>,
    /// `rightSplice` (composite reader only, default 0).
    pub right_splice: u64,
    /// `maxErrors`: the CTF parser's budget for the legacy CTF reader, the invalid-sequence budget of the
    /// composite reader (default 0).
    pub max_errors: u64,
    /// `traceLevel` (default 1; a negative value counts as 0).
    pub trace_level: u32,
    /// `verbosity` (default 0).
    pub verbosity: i64,
    /// `keepDataInMemory` (legacy readers only, default false).
    pub keep_data_in_memory: bool,
    /// `multiThreadedDeserialization` (default false: true only with image deserializers).
    pub multi_threaded_deserialization: bool,
    /// `useNumericSequenceKeys` (default true).
    pub use_numeric_sequence_keys: bool,
    /// `hashSequenceKeys` (default false).
    pub hash_sequence_keys: bool,
    /// `checkData` (default true).
    pub check_data: bool,
    /// `localTimeline` (composite default true; false for legacy readers).
    pub local_timeline: bool,
    /// `prefetch` (default true; no effect on the data).
    pub prefetch: bool,
    /// Things CNTK accepts that look wrong.
    pub warnings: Vec<ConfigWarning>,
    /// The reader block as written (before variable substitution).
    pub raw: Block,
}

/// Parses config text and applies command-line overrides (`name=value`, which define or replace top-level
/// values, CNTK's extra config arguments).
pub fn parse_config(text: &str, overrides: &[(String, String)]) -> Result<Block, Error> {
    let mut root = parse(text)?;
    apply_overrides(&mut root, overrides)?;
    Ok(root)
}

/// Reads the reader section of a config.
///
/// `section` selects `<section>.reader` (or `<section>` itself if it is a reader block; dotted paths such
/// as `train.reader` also work). Without it, the config must have exactly one top-level block with a
/// `reader` key, or a top-level `reader`. `overrides` are CNTK's extra command-line arguments, e.g.
/// `("defMBSize", "true")`. Data-file paths are kept as written (`path` equals `file`).
pub fn load_reader_config(
    text: &str,
    section: Option<&str>,
    overrides: &[(String, String)],
) -> Result<ReaderConfig, Error> {
    let root = parse_config(text, overrides)?;
    extract_reader(&root, section, None)
}

/// Reads the reader section of a config file; see [`load_reader_config`]. Relative data-file paths are
/// resolved against `data_dir`, by default the config file's directory. Errors and warnings carry the
/// config file's path.
pub fn load_reader_config_file(
    path: impl AsRef<Path>,
    section: Option<&str>,
    overrides: &[(String, String)],
    data_dir: Option<&Path>,
) -> Result<ReaderConfig, Error> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::io(format!("cannot read config file {shown}"), e))?;
    let text = String::from_utf8_lossy(&bytes);
    let base = match data_dir {
        Some(d) => d.to_path_buf(),
        None => path.parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    let result = parse_config(&text, overrides).and_then(|root| extract_reader(&root, section, Some(&base)));
    match result {
        Ok(mut config) => {
            for w in &mut config.warnings {
                w.position.path.get_or_insert_with(|| shown.clone());
            }
            Ok(config)
        }
        Err(mut e) => {
            e.position_mut().path.get_or_insert(shown);
            Err(e)
        }
    }
}

/// Names of the sections a reader can be taken from: top-level blocks with a `reader` key, and `reader` if
/// the top level has one. Pass one as `section` to [`extract_reader`].
pub fn reader_sections(root: &Block) -> Vec<String> {
    root.entries
        .iter()
        .filter(|e| e.key.eq_ignore_ascii_case("reader") || matches!(&e.value, Value::Block(b) if b.contains("reader")))
        .map(|e| e.key.clone())
        .collect()
}

/// Extracts the reader section from a parsed config (see [`load_reader_config`]), resolving relative
/// data-file paths against `data_dir` if given.
pub fn extract_reader(root: &Block, section: Option<&str>, data_dir: Option<&Path>) -> Result<ReaderConfig, Error> {
    let (name, scope) = find_reader(root, section)?;
    let reader = scope.block();
    if let Some(p) = reader.first_problem() {
        return Err(p.pos.error(format!("{name}: {}", p.message)));
    }
    let mut x = Extractor { data_dir, warnings: Vec::new() };
    for b in &scope.blocks()[..scope.blocks().len() - 1] {
        for p in &b.problems {
            x.warn(p.pos, format!("{} (outside the reader section; ignored)", p.message));
        }
    }
    let k = Keys { scope: scope.clone(), fallback: true, path: name.clone() };
    x.reader(&k, reader)
}

// ---- finding the section -------------------------------------------------------------------------------

fn is_reader_block(b: &Block) -> bool {
    ["readerType", "deserializers", "file", "input"].iter().any(|k| b.contains(k))
}

fn candidates_text(root: &Block) -> String {
    let c = reader_sections(root);
    if c.is_empty() {
        "the config has no block with a \"reader\" key".to_string()
    } else {
        format!("sections with a reader: {}", c.join(", "))
    }
}

fn find_reader<'a>(root: &'a Block, section: Option<&str>) -> Result<(String, Scope<'a>), Error> {
    let top = Scope::new(root);
    let Some(section) = section else {
        let c = reader_sections(root);
        return match c.len() {
            1 => find_reader(root, Some(&c[0])),
            0 => Err(Error::config("no reader section found: the config has no block with a \"reader\" key")),
            _ => Err(Error::config(format!(
                "the config has several reader sections ({}); choose one with --section",
                c.join(", ")
            ))),
        };
    };
    // The whole name first (keys may contain dots), then a dotted path.
    let mut path: Vec<&str> = vec![section];
    if root.get(section).is_none() && section.contains('.') {
        path = section.split('.').collect();
    }
    let mut scope = top;
    let mut shown = Vec::new();
    for (i, part) in path.iter().enumerate() {
        let Some(entry) = scope.block().get(part) else {
            return Err(if i == 0 {
                Error::config(format!("no section \"{section}\" in the config; {}", candidates_text(root)))
            } else {
                scope.block().pos.error(format!("no \"{part}\" in {}", shown.join(".")))
            });
        };
        shown.push(entry.key.clone());
        let block = match scope.resolve(&entry.value)? {
            Resolved::Block(b) => b,
            other => {
                return Err(other.pos().error(format!(
                    "\"{}\" must be a block [ … ], found {}",
                    shown.join("."),
                    other.describe()
                )))
            }
        };
        scope = scope.with(block);
    }
    let block = scope.block();
    if let Some(r) = block.get("reader") {
        if !block.contains("readerType") && !block.contains("deserializers") {
            let reader = match scope.resolve(&r.value)? {
                Resolved::Block(b) => b,
                other => {
                    return Err(other.pos().error(format!(
                        "{}.reader must be a block [ … ], found {}",
                        shown.join("."),
                        other.describe()
                    )))
                }
            };
            shown.push(r.key.clone());
            return Ok((shown.join("."), scope.with(reader)));
        }
    }
    if is_reader_block(block) {
        return Ok((shown.join("."), scope));
    }
    Err(block.pos.error(format!("section \"{}\" has no reader block; {}", shown.join("."), candidates_text(root))))
}

// ---- typed lookups -------------------------------------------------------------------------------------

/// How CNTK converts a value to a boolean (`ConfigValue::operator bool`).
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "t" | "true" | "T" | "True" | "TRUE" | "1" => Some(true),
        "f" | "false" | "F" | "False" | "FALSE" | "0" | "" => Some(false),
        _ => None,
    }
}

/// An unsigned decimal integer (CNTK uses `strtoull`, base 10, and requires the whole string).
fn parse_u64(s: &str) -> Option<u64> {
    let d = s.strip_prefix('+').unwrap_or(s);
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    d.parse().ok()
}

fn parse_i64(s: &str) -> Option<i64> {
    let (neg, d) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = d.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Looks keys up in a block, and (with `fallback`) in the enclosing blocks, as CNTK's `config(key, default)`
/// does. A value `default` means "not given".
struct Keys<'a> {
    scope: Scope<'a>,
    fallback: bool,
    path: String,
}

impl<'a> Keys<'a> {
    fn block(&self) -> &'a Block {
        self.scope.block()
    }

    fn entry(&self, key: &str) -> Option<(Scope<'a>, &'a Entry)> {
        if self.fallback {
            self.scope.lookup(key)
        } else {
            self.block().get(key).map(|e| (self.scope.clone(), e))
        }
    }

    /// The resolved value and the key as written.
    fn get(&self, key: &str) -> Result<Option<(Resolved<'a>, &'a str)>, Error> {
        let Some((scope, e)) = self.entry(key) else {
            return Ok(None);
        };
        let v = scope.resolve(&e.value)?;
        if matches!(&v, Resolved::Text { text, .. } if text == "default") {
            return Ok(None);
        }
        Ok(Some((v, &e.key)))
    }

    fn err(&self, pos: Pos, key: &str, message: impl std::fmt::Display) -> Error {
        pos.key_error(format!("{}.{key}", self.path), message.to_string())
    }

    fn text(&self, key: &str) -> Result<Option<(String, Pos)>, Error> {
        Ok(self.text_key(key)?.map(|(t, pos, _)| (t, pos)))
    }

    /// A scalar value, where it is, and the key as written.
    fn text_key(&self, key: &str) -> Result<Option<(String, Pos, &'a str)>, Error> {
        match self.get(key)? {
            None => Ok(None),
            Some((Resolved::Text { text, pos }, written)) => Ok(Some((text, pos, written))),
            Some((other, written)) => {
                Err(self.err(other.pos(), written, format_args!("expected a single value, found {}", other.describe())))
            }
        }
    }

    fn bool(&self, key: &str) -> Result<Option<(bool, Pos)>, Error> {
        let Some((t, pos, key)) = self.text_key(key)? else {
            return Ok(None);
        };
        match parse_bool(&t) {
            Some(b) => Ok(Some((b, pos))),
            None => Err(self.err(
                pos,
                key,
                format_args!("expected a boolean (true, false, T, F, 1, 0, True, False, TRUE, FALSE), found {t:?}"),
            )),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, Error> {
        Ok(self.bool(key)?.map_or(default, |(b, _)| b))
    }

    fn u64(&self, key: &str) -> Result<Option<(u64, Pos)>, Error> {
        let Some((t, pos, key)) = self.text_key(key)? else {
            return Ok(None);
        };
        match parse_u64(&t) {
            Some(v) => Ok(Some((v, pos))),
            None => Err(self.err(pos, key, format_args!("expected a non-negative integer, found {t:?}"))),
        }
    }

    fn u64_or(&self, key: &str, default: u64) -> Result<u64, Error> {
        Ok(self.u64(key)?.map_or(default, |(v, _)| v))
    }

    fn i64(&self, key: &str) -> Result<Option<(i64, Pos)>, Error> {
        let Some((t, pos, key)) = self.text_key(key)? else {
            return Ok(None);
        };
        match parse_i64(&t) {
            Some(v) => Ok(Some((v, pos))),
            None => Err(self.err(pos, key, format_args!("expected an integer, found {t:?}"))),
        }
    }

    /// `traceLevel`: CNTK compares it with `>=`, so a negative level behaves as 0.
    fn trace_level(&self) -> Result<Option<u32>, Error> {
        Ok(self.i64("traceLevel")?.map(|(v, _)| v.clamp(0, i64::from(u32::MAX)) as u32))
    }

    /// A block-valued key of this block (no fallback), with the scope to read it in.
    fn sub_block(&self, key: &str) -> Result<Option<(&'a Entry, Keys<'a>)>, Error> {
        let Some(e) = self.block().get(key) else {
            return Ok(None);
        };
        match self.scope.resolve(&e.value)? {
            Resolved::Block(b) => Ok(Some((
                e,
                Keys { scope: self.scope.with(b), fallback: false, path: format!("{}.{}", self.path, e.key) },
            ))),
            other => {
                Err(self.err(other.pos(), &e.key, format_args!("expected a block [ … ], found {}", other.describe())))
            }
        }
    }
}

// ---- known keys, for warnings --------------------------------------------------------------------------

const COMMON_READER_KEYS: &[&str] =
    &["readerType", "precision", "verbosity", "prefetch", "action", "nbruttsineachrecurrentiter"];
const LEGACY_CTF_KEYS: &[&str] = &[
    "file",
    "input",
    "randomize",
    "randomizationWindow",
    "sampleBasedRandomizationWindow",
    "randomizationSeed",
    "skipSequenceIds",
    "maxErrors",
    "traceLevel",
    "chunkSizeInBytes",
    "cacheIndex",
    "keepDataInMemory",
    "frameMode",
];
const LEGACY_CBF_KEYS: &[&str] = &[
    "file",
    "input",
    "randomize",
    "randomizationWindow",
    "sampleBasedRandomizationWindow",
    "randomizationSeed",
    "keepDataInMemory",
    "traceLevel",
    "frameMode", // warned about separately
];
const COMPOSITE_KEYS: &[&str] = &[
    "deserializers",
    "randomize",
    "randomizationWindow",
    "sampleBasedRandomizationWindow",
    "randomizationSeed",
    "frameMode",
    "truncated",
    "truncationLength",
    "rightSplice",
    "maxErrors",
    "multiThreadedDeserialization",
    "useNumericSequenceKeys",
    "hashSequenceKeys",
    "checkData",
    "localTimeline",
    "traceLevel",
    "chunkSizeInBytes",
];
const CTF_DESERIALIZER_KEYS: &[&str] = &[
    "type",
    "module",
    "file",
    "input",
    "precision",
    "skipSequenceIds",
    "maxErrors",
    "traceLevel",
    "chunkSizeInBytes",
    "cacheIndex",
    "keepDataInMemory",
    "frameMode",
    "composable",
];
const CBF_DESERIALIZER_KEYS: &[&str] =
    &["type", "module", "file", "input", "precision", "traceLevel", "keepDataInMemory", "composable"];
const CTF_INPUT_KEYS: &[&str] = &["dim", "format", "alias", "definesMBSize"];
const CBF_INPUT_KEYS: &[&str] = &["alias", "dim", "format", "definesMBSize"];

/// Levenshtein distance, case-insensitive (for "did you mean").
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<u8> = a.bytes().map(|c| c.to_ascii_lowercase()).collect();
    let b: Vec<u8> = b.bytes().map(|c| c.to_ascii_lowercase()).collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

// ---- extraction ----------------------------------------------------------------------------------------

struct Extractor<'p> {
    data_dir: Option<&'p Path>,
    warnings: Vec<ConfigWarning>,
}

impl Extractor<'_> {
    fn warn(&mut self, pos: Pos, message: String) {
        self.warnings.push(ConfigWarning { message, position: pos.position() });
    }

    fn warn_unknown(&mut self, block: &Block, path: &str, known: &[&[&str]]) {
        let all = || known.iter().flat_map(|k| k.iter().copied());
        for e in &block.entries {
            if all().any(|k| k.eq_ignore_ascii_case(&e.key)) {
                continue;
            }
            let message = if e.key.eq_ignore_ascii_case("numChunksToCache") {
                format!("{path}.{}: not used by CNTK 2.7 (ignored)", e.key)
            } else {
                let best = all().map(|k| (distance(k, &e.key), k)).min();
                match best {
                    Some((d, k)) if d <= 2 => {
                        format!("{path}: unknown key \"{}\" is ignored by CNTK; did you mean \"{k}\"?", e.key)
                    }
                    _ => format!("{path}: unknown key \"{}\" is ignored by CNTK", e.key),
                }
            };
            self.warn(e.key_pos, message);
        }
    }

    fn resolve_path(&self, file: &str) -> PathBuf {
        let p = Path::new(file);
        match self.data_dir {
            Some(d) if p.is_relative() => d.join(p),
            _ => p.to_path_buf(),
        }
    }

    fn reader(mut self, k: &Keys<'_>, reader: &Block) -> Result<ReaderConfig, Error> {
        let precision = precision(k)?;
        let (randomize, randomize_none) = randomize(k)?;
        let has_deserializers = k.entry("deserializers").is_some();
        let reader_type = k.text("readerType")?;
        if !has_deserializers {
            if let Some((_, e)) = k.entry("readers") {
                return Err(k.err(
                    e.key_pos,
                    &e.key,
                    "several legacy readers (readers = …) are not supported by cntkio",
                ));
            }
        }
        let is = |names: &[&str], t: &str| names.iter().any(|n| n.eq_ignore_ascii_case(t));
        const COMPOSITE: &[&str] = &["CompositeDataReader", "Cntk.Composite"];
        const CTF: &[&str] = &["CNTKTextFormatReader", "Cntk.Deserializers.TextFormat"];
        const CBF: &[&str] = &["CNTKBinaryReader", "Cntk.Deserializers.Binary"];
        let kind = match (&reader_type, has_deserializers) {
            (None, true) => ReaderKind::Composite,
            (Some((t, _)), true) if is(COMPOSITE, t) => ReaderKind::Composite,
            (Some((t, pos)), true) => {
                return Err(k.err(
                    *pos,
                    "readerType",
                    format_args!("\"{t}\" cannot be combined with \"deserializers\"; remove readerType (a reader with deserializers is a composite reader)"),
                ))
            }
            (None, false) => ReaderKind::LegacyCtf,
            (Some((t, _)), false) if is(CTF, t) => ReaderKind::LegacyCtf,
            (Some((t, _)), false) if is(CBF, t) => ReaderKind::LegacyCbf,
            (Some((t, pos)), false) if is(COMPOSITE, t) => {
                return Err(k.err(*pos, "readerType", format_args!("\"{t}\" needs deserializers = ( [ … ] : … )")))
            }
            (Some((t, pos)), false) => {
                return Err(k.err(
                    *pos,
                    "readerType",
                    format_args!("\"{t}\" is not supported by cntkio (supported: CNTKTextFormatReader, CNTKBinaryReader, or a composite reader with deserializers = ( … ) of CNTKTextFormatDeserializer / CNTKBinaryFormatDeserializer)"),
                ))
            }
        };
        let randomization_window = k.u64("randomizationWindow")?.map(|(v, _)| v);
        let sample_based = k.bool("sampleBasedRandomizationWindow")?;
        let randomization_seed = k.u64_or("randomizationSeed", 0)?;
        let trace_level = k.trace_level()?.unwrap_or(1);
        let verbosity = k.i64("verbosity")?.map_or(0, |(v, _)| v);
        let prefetch = k.bool_or("prefetch", true)?;

        let mut config = ReaderConfig {
            section: k.path.clone(),
            kind,
            legacy_reader: None,
            deserializers: Vec::new(),
            precision,
            randomize,
            randomization_window,
            sample_based_randomization_window: sample_based.map(|(b, _)| b),
            randomization: Randomization::Off,
            randomization_seed,
            frame_mode: false,
            truncation_length: None,
            right_splice: 0,
            max_errors: 0,
            trace_level,
            verbosity,
            keep_data_in_memory: false,
            multi_threaded_deserialization: false,
            use_numeric_sequence_keys: true,
            hash_sequence_keys: false,
            check_data: true,
            local_timeline: false,
            prefetch,
            warnings: Vec::new(),
            raw: reader.clone(),
        };

        match kind {
            ReaderKind::LegacyCtf | ReaderKind::LegacyCbf => {
                config.legacy_reader =
                    Some(reader_type.map_or_else(|| "Cntk.Deserializers.TextFormat".to_string(), |(t, _)| t));
                let (window_default, sample_based_default) = if kind == ReaderKind::LegacyCtf {
                    let frame_mode = k.bool_or("frameMode", false)?;
                    let d = self.ctf(k, precision, frame_mode, None)?;
                    let DeserializerConfig::Ctf { options, .. } = &d else { unreachable!() };
                    config.frame_mode = frame_mode;
                    config.max_errors = options.max_errors;
                    config.keep_data_in_memory = options.keep_data_in_memory;
                    let chunks = FOUR_GIB / options.chunk_size;
                    config.deserializers.push(d);
                    self.warn_unknown(reader, &k.path, &[COMMON_READER_KEYS, LEGACY_CTF_KEYS]);
                    (chunks, false)
                } else {
                    if let Some((true, pos)) = k.bool("frameMode")? {
                        self.warn(
                            pos,
                            format!(
                                "{}.frameMode: the CNTKBinaryReader always packs whole sequences; frameMode is ignored",
                                k.path
                            ),
                        );
                    }
                    config.keep_data_in_memory = k.bool_or("keepDataInMemory", false)?;
                    let d = self.cbf(k, precision)?;
                    config.deserializers.push(d);
                    self.warn_unknown(reader, &k.path, &[COMMON_READER_KEYS, LEGACY_CBF_KEYS]);
                    (DEFAULT_CBF_WINDOW_CHUNKS, false)
                };
                for key in ["truncated", "truncationLength"] {
                    if let Some((_, e)) = k.entry(key) {
                        if reader.contains(key) {
                            self.warn(
                                e.key_pos,
                                format!(
                                    "{}.{}: only the composite reader (deserializers = …) reads this; ignored",
                                    k.path, e.key
                                ),
                            );
                        }
                    }
                }
                // GetRandomizationWindowFromConfig + the reader's default (READER.md §2).
                let sb = sample_based.map_or(sample_based_default, |(b, _)| b);
                config.randomization = match (randomize, randomization_window) {
                    (false, _) | (true, Some(0)) => Randomization::Off,
                    (true, Some(w)) if sb => Randomization::Samples(w),
                    (true, Some(w)) => Randomization::Chunks(w),
                    (true, None) if sb => Randomization::Samples(RANDOMIZE_AUTO),
                    (true, None) => Randomization::Chunks(window_default),
                };
            }
            ReaderKind::Composite => {
                if let Some(pos) = randomize_none {
                    self.warn(pos, format!("{}.randomize: CNTK 2.7's composite reader accepts only booleans here (\"none\" works with the legacy readers); cntkio reads it as false", k.path));
                }
                self.composite(k, reader, &mut config)?;
            }
        }
        config.warnings = self.warnings;
        Ok(config)
    }

    fn composite(&mut self, k: &Keys<'_>, reader: &Block, config: &mut ReaderConfig) -> Result<(), Error> {
        let frame_mode = k.bool("frameMode")?;
        let truncated = k.bool("truncated")?;
        if let (Some((true, _)), Some((true, pos))) = (frame_mode, truncated) {
            return Err(k.err(pos, "truncated", "frameMode and truncated BPTT are mutually exclusive"));
        }
        config.frame_mode = frame_mode.is_some_and(|(b, _)| b);
        if let Some((true, truncated_pos)) = truncated {
            match k.u64("truncationLength")? {
                Some((t, _)) if t > 0 => config.truncation_length = Some(t),
                found => {
                    let pos = found.map_or(truncated_pos, |(_, p)| p);
                    return Err(k.err(
                        pos,
                        "truncationLength",
                        "must be given and > 0 when truncated = true (CNTK: \"Truncation length cannot be 0.\")",
                    ));
                }
            }
        } else if let Some((_, pos)) = k.u64("truncationLength")? {
            self.warn(pos, format!("{}.truncationLength: ignored without truncated = true", k.path));
        }
        config.right_splice = k.u64_or("rightSplice", 0)?;
        config.max_errors = k.u64_or("maxErrors", 0)?;
        config.multi_threaded_deserialization = k.bool_or("multiThreadedDeserialization", false)?;
        config.use_numeric_sequence_keys = k.bool_or("useNumericSequenceKeys", true)?;
        config.hash_sequence_keys = k.bool_or("hashSequenceKeys", false)?;
        config.check_data = k.bool_or("checkData", true)?;
        config.local_timeline = k.bool_or("localTimeline", true)?;
        // CompositeDataReader inserts the reader's traceLevel (if any, enclosing blocks included) into every
        // deserializer; otherwise each deserializer reads its own.
        let trace_override = k.trace_level()?;

        let Some((scope, entry)) = k.entry("deserializers") else { unreachable!("checked by the caller") };
        let items: Vec<&Value> = match scope.resolve(&entry.value)? {
            Resolved::Array(a) => a.items.iter().collect(),
            Resolved::Block(b) if b.entries.is_empty() => b.items.iter().collect(),
            other => {
                return Err(k.err(
                    other.pos(),
                    &entry.key,
                    format_args!(
                        "expected an array of deserializer blocks ( [ … ] : [ … ] ), found {}",
                        other.describe()
                    ),
                ))
            }
        };
        if items.is_empty() {
            return Err(k.err(
                entry.key_pos,
                &entry.key,
                "no deserializers (CNTK: \"Could not find deserializers in the reader config.\")",
            ));
        }
        let mut has_ctf = false;
        for (i, item) in items.into_iter().enumerate() {
            let path = format!("{}.{}[{i}]", k.path, entry.key);
            let block = match scope.resolve(item)? {
                Resolved::Block(b) => b,
                other => {
                    return Err(other.pos().error(format!(
                        "{path}: expected a deserializer block [ type = …; … ], found {}",
                        other.describe()
                    )))
                }
            };
            if let Some(p) = block.first_problem() {
                return Err(p.pos.error(format!("{path}: {}", p.message)));
            }
            // CNTK passes array elements without a parent: a deserializer sees only its own keys, plus the
            // precision, frameMode and traceLevel the composite reader inserts.
            let dk = Keys { scope: scope.with(block), fallback: false, path };
            let Some((ty, ty_pos)) = dk.text("type")? else {
                return Err(block.pos.error(format!(
                    "{}: missing \"type\" (CNTKTextFormatDeserializer or CNTKBinaryFormatDeserializer)",
                    dk.path
                )));
            };
            if dk.text("module")?.is_none() {
                return Err(block.pos.error(format!("{}: missing \"module\" (CNTK loads the deserializer from it, e.g. module = \"CNTKTextFormatReader\")", dk.path)));
            }
            for key in ["precision", "frameMode"] {
                if let Some(e) = block.get(key) {
                    self.warn(
                        e.key_pos,
                        format!("{}.{}: ignored; the composite reader sets it from the reader level", dk.path, e.key),
                    );
                }
            }
            let d = match ty.as_str() {
                "CNTKTextFormatDeserializer" => {
                    has_ctf = true;
                    let d = self.ctf(&dk, config.precision, config.frame_mode, trace_override)?;
                    self.warn_unknown(block, &dk.path, &[CTF_DESERIALIZER_KEYS]);
                    d
                }
                "CNTKBinaryFormatDeserializer" => {
                    if i > 0 {
                        return Err(dk.err(ty_pos, "type", "a CBF deserializer can only be the first (primary) one (CNTK: \"Binary deserializer can only be used as a primary.\")"));
                    }
                    let d = self.cbf(&dk, config.precision)?;
                    self.warn_unknown(block, &dk.path, &[CBF_DESERIALIZER_KEYS]);
                    d
                }
                t => {
                    let hint = ["CNTKTextFormatDeserializer", "CNTKBinaryFormatDeserializer"]
                        .into_iter()
                        .find(|n| n.eq_ignore_ascii_case(t))
                        .map(|n| format!(" (type names are case-sensitive: \"{n}\")"))
                        .unwrap_or_else(|| {
                            " (cntkio supports CNTKTextFormatDeserializer and CNTKBinaryFormatDeserializer)".into()
                        });
                    return Err(dk.err(ty_pos, "type", format_args!("unsupported deserializer type \"{t}\"{hint}")));
                }
            };
            config.deserializers.push(d);
        }
        self.warn_unknown(reader, &k.path, &[COMMON_READER_KEYS, COMPOSITE_KEYS]);

        // CompositeDataReader's window rules (READER.md §2).
        config.randomization = if !config.randomize {
            Randomization::Off
        } else {
            let mut window = config.randomization_window.unwrap_or(RANDOMIZE_AUTO);
            let mut sample_based = config.sample_based_randomization_window.unwrap_or(true);
            if has_ctf && !reader.contains("randomizationWindow") {
                if !reader.contains("sampleBasedRandomizationWindow") || !sample_based {
                    sample_based = false;
                    let (chunk, pos) = k.u64("chunkSizeInBytes")?.unwrap_or((DEFAULT_CHUNK_SIZE, reader.pos));
                    if chunk == 0 {
                        return Err(k.err(pos, "chunkSizeInBytes", "must be > 0"));
                    }
                    window = FOUR_GIB / chunk;
                } else {
                    let pos = reader.get("sampleBasedRandomizationWindow").map_or(reader.pos, |e| e.key_pos);
                    return Err(k.err(pos, "sampleBasedRandomizationWindow", "'sampleBasedRandomizationWindow' (== 'true') requires that the 'randomizationWindow' is explicitly specified"));
                }
            }
            if sample_based {
                Randomization::Samples(window)
            } else {
                Randomization::Chunks(window)
            }
        };
        Ok(())
    }

    /// A CTF deserializer from `dk`: the legacy reader block (looked up with fallback to the enclosing
    /// blocks) or a composite deserializer block (without).
    fn ctf(
        &mut self,
        dk: &Keys<'_>,
        precision: ElementType,
        frame_mode: bool,
        trace_override: Option<u32>,
    ) -> Result<DeserializerConfig, Error> {
        let block = dk.block();
        let Some((input_entry, ik)) = dk.sub_block("input")? else {
            return Err(block.pos.error(format!(
                "{}: no \"input\" block; a CNTKTextFormatReader needs input = [ <name> = [ dim = …; format = \"dense\" | \"sparse\" ] … ]",
                dk.path
            )));
        };
        let input = ik.block();
        if let Some(p) = input.first_problem() {
            return Err(p.pos.error(format!("{}: {}", ik.path, p.message)));
        }
        if input.entries.is_empty() {
            return Err(input_entry
                .key_pos
                .error(format!("{}: the \"input\" block is empty; it needs one entry per stream", ik.path)));
        }
        let mut streams = Vec::new();
        for e in &input.entries {
            let Some((_, sk)) = ik.sub_block(&e.key)? else { unreachable!() };
            let missing: Vec<&str> = ["dim", "format"].into_iter().filter(|k| !sk.block().contains(k)).collect();
            if !missing.is_empty() {
                return Err(e.key_pos.error(format!(
                    "{}: missing {} (every input needs \"dim\" and \"format\")",
                    sk.path,
                    missing.iter().map(|m| format!("\"{m}\"")).collect::<Vec<_>>().join(" and ")
                )));
            }
            let Some((dim, dim_pos)) = sk.u64("dim")? else {
                return Err(sk.err(e.key_pos, "dim", "must not be \"default\""));
            };
            let dim = usize::try_from(dim).map_err(|_| sk.err(dim_pos, "dim", "too large"))?;
            let Some((format, format_pos)) = sk.text("format")? else {
                return Err(sk.err(e.key_pos, "format", "must not be \"default\""));
            };
            let format = if format.eq_ignore_ascii_case("dense") {
                StorageFormat::Dense
            } else if format.eq_ignore_ascii_case("sparse") {
                StorageFormat::Sparse
            } else {
                return Err(sk.err(
                    format_pos,
                    "format",
                    format_args!("must be \"dense\" or \"sparse\", found {format:?}"),
                ));
            };
            let alias = match sk.text("alias")? {
                Some((a, pos)) if a.is_empty() => {
                    return Err(sk.err(pos, "alias", format_args!("the alias of input \"{}\" is empty", e.key)))
                }
                Some((a, _)) => a,
                None => e.key.clone(),
            };
            let defines_mb_size = sk.bool_or("definesMBSize", false)?;
            streams.push(
                StreamSpec::new(e.key.clone(), dim, format)
                    .alias(alias)
                    .element_type(precision)
                    .defines_mb_size(defines_mb_size),
            );
            self.warn_unknown(sk.block(), &sk.path, &[CTF_INPUT_KEYS]);
        }
        let schema = Schema::new(streams).map_err(|mut err| {
            let pos = match err.kind() {
                ErrorKind::DuplicateAlias { second, .. } | ErrorKind::InvalidStream { stream: second, .. } => {
                    input.get(second).map_or(input_entry.key_pos, |e| e.key_pos)
                }
                _ => input_entry.key_pos,
            };
            *err.position_mut() = pos.position();
            err
        })?;
        let (file, path) = self.file(dk)?;
        let chunk_size = match dk.u64("chunkSizeInBytes")? {
            Some((0, pos)) => return Err(dk.err(pos, "chunkSizeInBytes", "must be > 0")),
            Some((size, _)) => size,
            None => DEFAULT_CHUNK_SIZE,
        };
        let mut keep_data_in_memory = dk.bool_or("keepDataInMemory", false)?;
        if keep_data_in_memory && !dk.fallback {
            let pos = dk.block().get("keepDataInMemory").map_or(dk.block().pos, |e| e.key_pos);
            let message = format!("{}.keepDataInMemory: ignored by the composite reader", dk.path);
            self.warn(pos, message);
            keep_data_in_memory = false;
        }
        let options = CtfOptions {
            max_errors: dk.u64_or("maxErrors", 0)?,
            skip_sequence_ids: dk.bool_or("skipSequenceIds", false)?,
            chunk_size,
            cache_index: dk.bool_or("cacheIndex", false)?,
            keep_data_in_memory,
            frame_mode,
            trace_level: match trace_override {
                Some(t) => t,
                None => dk.trace_level()?.unwrap_or(1),
            },
        };
        Ok(DeserializerConfig::Ctf { file, path, schema, options })
    }

    fn cbf(&mut self, dk: &Keys<'_>, precision: ElementType) -> Result<DeserializerConfig, Error> {
        let mut renames: Vec<(String, String)> = Vec::new();
        if let Some((_, ik)) = dk.sub_block("input")? {
            let input = ik.block();
            for e in &input.entries {
                let Some((_, sk)) = ik.sub_block(&e.key)? else { unreachable!() };
                self.warn_unknown(sk.block(), &sk.path, &[CBF_INPUT_KEYS]);
                let Some((alias, pos)) = sk.text("alias")? else {
                    continue;
                };
                if alias.is_empty() {
                    return Err(sk.err(pos, "alias", format_args!("the alias of input \"{}\" is empty", e.key)));
                }
                if let Some((first, _)) = renames.iter().find(|(_, a)| *a == alias) {
                    let mut err = Error::new(ErrorKind::DuplicateAlias {
                        alias: alias.clone(),
                        first: first.clone(),
                        second: e.key.clone(),
                    });
                    *err.position_mut() = pos.position();
                    return Err(err);
                }
                renames.push((e.key.clone(), alias));
            }
        }
        let (file, path) = self.file(dk)?;
        Ok(DeserializerConfig::Cbf { file, path, renames, precision })
    }

    fn file(&self, dk: &Keys<'_>) -> Result<(String, PathBuf), Error> {
        match dk.text("file")? {
            Some((f, _)) if !f.is_empty() => {
                let path = self.resolve_path(&f);
                Ok((f, path))
            }
            Some((_, pos)) => Err(dk.err(pos, "file", "is empty")),
            None => Err(dk.block().pos.error(format!("{}: missing \"file\" (the path of the data file)", dk.path))),
        }
    }
}

/// `precision`: CNTK's DataReader accepts exactly `float` or `double` (case-sensitive, `GetReaderName`),
/// before any reader sees the value, so the deserializer factory's quirk (a non-lowercase `Float` selects
/// double, CTF.md §10) cannot be reached from a BrainScript config; other spellings are errors here too.
fn precision(k: &Keys<'_>) -> Result<ElementType, Error> {
    match k.text("precision")? {
        None => Ok(ElementType::F32),
        Some((t, _)) if t == "float" => Ok(ElementType::F32),
        Some((t, _)) if t == "double" => Ok(ElementType::F64),
        Some((t, pos)) if t.eq_ignore_ascii_case("float") || t.eq_ignore_ascii_case("double") => Err(k.err(
            pos,
            "precision",
            format_args!(
                "{t:?} must be written in lowercase (CNTK's DataReader accepts exactly \"float\" or \"double\")"
            ),
        )),
        Some((t, pos)) => Err(k.err(pos, "precision", format_args!("must be \"float\" or \"double\", found {t:?}"))),
    }
}

/// `randomize`: `none` (any case) is off, anything else must be a CNTK boolean (READER.md §2). Returns the
/// value and, if it was `none`, where.
fn randomize(k: &Keys<'_>) -> Result<(bool, Option<Pos>), Error> {
    let Some((t, pos)) = k.text("randomize")? else {
        return Ok((true, None));
    };
    if t.eq_ignore_ascii_case("none") {
        return Ok((false, Some(pos)));
    }
    match parse_bool(&t) {
        Some(b) => Ok((b, None)),
        None => {
            let hint = if t.eq_ignore_ascii_case("auto") {
                " (the old wiki's \"auto\" is a config error in CNTK 2.x: use true)"
            } else {
                ""
            };
            Err(k.err(
                pos,
                "randomize",
                format_args!("expected a boolean (true, false, T, F, 1, 0, True, False, TRUE, FALSE) or \"none\", found {t:?}{hint}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cntk_scalars() {
        for t in ["t", "true", "T", "True", "TRUE", "1"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["f", "false", "F", "False", "FALSE", "0", ""] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        assert_eq!(parse_bool("tRue"), None);
        assert_eq!(parse_bool("yes"), None);
        assert_eq!(parse_u64("+12"), Some(12));
        assert_eq!(parse_u64("-1"), None);
        assert_eq!(parse_u64("1e3"), None);
        assert_eq!(parse_u64("99999999999999999999"), None);
        assert_eq!(parse_i64("-3"), Some(-3));
        assert_eq!(distance("randomise", "randomize"), 1);
        assert_eq!(distance("RANDOMIZE", "randomize"), 0);
    }
}
