//! Extracting a typed reader configuration from a parsed config (CTF.md §10, CBF.md §5, READER.md §2, §9.3):
//! the types and the entry points here; [`find`] finds the section, [`keys`] reads typed values,
//! [`extract`] reads the reader level and [`deserializers`] the data files, warning about unknown keys
//! ([`known`]).

mod deserializers;
mod extract;
mod find;
mod keys;
mod known;

use super::brainscript::{apply_overrides, parse, Block, Value};
use crate::options::CtfOptions;
use cntkio_core::error::{Error, Position};
use cntkio_core::schema::{ElementType, Schema};
use extract::Extractor;
use find::find_reader;
use keys::Keys;
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
