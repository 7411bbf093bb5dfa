//! The reader section as a whole: its kind, its reader-level keys and its randomization.

use super::keys::{parse_bool, Keys};
use super::known::{distance, COMMON_READER_KEYS, LEGACY_CBF_KEYS, LEGACY_CTF_KEYS};
use super::{
    ConfigWarning, DeserializerConfig, Randomization, ReaderConfig, ReaderKind, DEFAULT_CBF_WINDOW_CHUNKS, FOUR_GIB,
    RANDOMIZE_AUTO,
};
use crate::config::brainscript::{Block, Pos};
use cntkio_core::error::Error;
use cntkio_core::schema::ElementType;
use std::path::{Path, PathBuf};

/// Reads a reader section into a [`ReaderConfig`], collecting warnings as it goes.
pub(super) struct Extractor<'p> {
    pub(super) data_dir: Option<&'p Path>,
    pub(super) warnings: Vec<ConfigWarning>,
}

impl Extractor<'_> {
    pub(super) fn warn(&mut self, pos: Pos, message: String) {
        self.warnings.push(ConfigWarning { message, position: pos.position() });
    }

    pub(super) fn warn_unknown(&mut self, block: &Block, path: &str, known: &[&[&str]]) {
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

    pub(super) fn resolve_path(&self, file: &str) -> PathBuf {
        let p = Path::new(file);
        match self.data_dir {
            Some(d) if p.is_relative() => d.join(p),
            _ => p.to_path_buf(),
        }
    }

    /// The whole reader section: its kind, the reader-level keys, then the deserializers and the
    /// randomization as the kind reads them.
    pub(super) fn reader(mut self, k: &Keys<'_>, reader: &Block) -> Result<ReaderConfig, Error> {
        let precision = precision(k)?;
        let (randomize, randomize_none) = randomize(k)?;
        let reader_type = k.text("readerType")?;
        let kind = reader_kind(k, reader_type.as_ref())?;
        let mut config = reader_level(k, reader, kind, precision, randomize)?;
        match kind {
            ReaderKind::LegacyCtf | ReaderKind::LegacyCbf => {
                config.legacy_reader =
                    Some(reader_type.map_or_else(|| "Cntk.Deserializers.TextFormat".to_string(), |(t, _)| t));
                self.legacy(k, reader, &mut config)?;
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

    /// A legacy reader's deserializer, its keys and its randomization (READER.md §2).
    fn legacy(&mut self, k: &Keys<'_>, reader: &Block, config: &mut ReaderConfig) -> Result<(), Error> {
        let window_default = if config.kind == ReaderKind::LegacyCtf {
            self.legacy_ctf(k, reader, config)?
        } else {
            self.legacy_cbf(k, reader, config)?
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
        config.randomization = legacy_randomization(config, window_default);
        Ok(())
    }

    /// The legacy CTF reader's deserializer and keys; returns its default window in chunks.
    fn legacy_ctf(&mut self, k: &Keys<'_>, reader: &Block, config: &mut ReaderConfig) -> Result<u64, Error> {
        let frame_mode = k.bool_or("frameMode", false)?;
        let d = self.ctf(k, config.precision, frame_mode, None)?;
        let DeserializerConfig::Ctf { options, .. } = &d else { unreachable!() };
        config.frame_mode = frame_mode;
        config.max_errors = options.max_errors;
        config.keep_data_in_memory = options.keep_data_in_memory;
        let chunks = FOUR_GIB / options.chunk_size;
        config.deserializers.push(d);
        self.warn_unknown(reader, &k.path, &[COMMON_READER_KEYS, LEGACY_CTF_KEYS]);
        Ok(chunks)
    }

    /// The legacy CBF reader's deserializer and keys; returns its default window in chunks.
    fn legacy_cbf(&mut self, k: &Keys<'_>, reader: &Block, config: &mut ReaderConfig) -> Result<u64, Error> {
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
        let d = self.cbf(k, config.precision)?;
        config.deserializers.push(d);
        self.warn_unknown(reader, &k.path, &[COMMON_READER_KEYS, LEGACY_CBF_KEYS]);
        Ok(DEFAULT_CBF_WINDOW_CHUNKS)
    }
}

/// Which reader the section configures, from `readerType` and whether it has `deserializers`.
fn reader_kind(k: &Keys<'_>, reader_type: Option<&(String, Pos)>) -> Result<ReaderKind, Error> {
    let has_deserializers = k.entry("deserializers").is_some();
    if !has_deserializers {
        if let Some((_, e)) = k.entry("readers") {
            return Err(k.err(e.key_pos, &e.key, "several legacy readers (readers = …) are not supported by cntkio"));
        }
    }
    let is = |names: &[&str], t: &str| names.iter().any(|n| n.eq_ignore_ascii_case(t));
    const COMPOSITE: &[&str] = &["CompositeDataReader", "Cntk.Composite"];
    const CTF: &[&str] = &["CNTKTextFormatReader", "Cntk.Deserializers.TextFormat"];
    const CBF: &[&str] = &["CNTKBinaryReader", "Cntk.Deserializers.Binary"];
    Ok(match (reader_type, has_deserializers) {
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
    })
}

/// The configuration with the keys every reader kind reads at the reader level; the rest at their
/// defaults, for the kind's own step to fill in.
fn reader_level(
    k: &Keys<'_>,
    reader: &Block,
    kind: ReaderKind,
    precision: ElementType,
    randomize: bool,
) -> Result<ReaderConfig, Error> {
    let randomization_window = k.u64("randomizationWindow")?.map(|(v, _)| v);
    let sample_based = k.bool("sampleBasedRandomizationWindow")?;
    let randomization_seed = k.u64_or("randomizationSeed", 0)?;
    let trace_level = k.trace_level()?.unwrap_or(1);
    let verbosity = k.i64("verbosity")?.map_or(0, |(v, _)| v);
    let prefetch = k.bool_or("prefetch", true)?;
    Ok(ReaderConfig {
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
    })
}

/// A legacy reader's randomization: `GetRandomizationWindowFromConfig` and the reader's default window
/// (READER.md §2). Neither legacy reader defaults to a sample-based window.
fn legacy_randomization(config: &ReaderConfig, window_default: u64) -> Randomization {
    let sb = config.sample_based_randomization_window.unwrap_or(false);
    match (config.randomize, config.randomization_window) {
        (false, _) | (true, Some(0)) => Randomization::Off,
        (true, Some(w)) if sb => Randomization::Samples(w),
        (true, Some(w)) => Randomization::Chunks(w),
        (true, None) if sb => Randomization::Samples(RANDOMIZE_AUTO),
        (true, None) => Randomization::Chunks(window_default),
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
