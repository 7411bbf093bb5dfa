//! The deserializers of a reader section: a legacy reader's one, or a composite reader's list.

use super::extract::Extractor;
use super::keys::Keys;
use super::known::{
    CBF_DESERIALIZER_KEYS, CBF_INPUT_KEYS, COMMON_READER_KEYS, COMPOSITE_KEYS, CTF_DESERIALIZER_KEYS, CTF_INPUT_KEYS,
};
use super::{DeserializerConfig, Randomization, ReaderConfig, FOUR_GIB, RANDOMIZE_AUTO};
use crate::config::brainscript::{Block, Entry, Resolved, Scope, Value};
use crate::options::{CtfOptions, DEFAULT_CHUNK_SIZE};
use cntkio_core::error::{Error, ErrorKind};
use cntkio_core::schema::{ElementType, Schema, StorageFormat, StreamSpec};
use std::path::PathBuf;

impl Extractor<'_> {
    /// A composite reader: its own keys, each of its deserializers, and its randomization (READER.md §2).
    pub(super) fn composite(&mut self, k: &Keys<'_>, reader: &Block, config: &mut ReaderConfig) -> Result<(), Error> {
        self.composite_keys(k, config)?;
        // CompositeDataReader inserts the reader's traceLevel (if any, enclosing blocks included) into every
        // deserializer; otherwise each deserializer reads its own.
        let trace_override = k.trace_level()?;
        let Some((scope, entry)) = k.entry("deserializers") else { unreachable!("checked by the caller") };
        let items = deserializer_items(k, &scope, entry)?;
        let mut has_ctf = false;
        for (i, item) in items.into_iter().enumerate() {
            let path = format!("{}.{}[{i}]", k.path, entry.key);
            let d = self.composite_deserializer(&scope, item, path, i, config, trace_override)?;
            has_ctf |= matches!(d, DeserializerConfig::Ctf { .. });
            config.deserializers.push(d);
        }
        self.warn_unknown(reader, &k.path, &[COMMON_READER_KEYS, COMPOSITE_KEYS]);
        config.randomization = composite_randomization(k, reader, config, has_ctf)?;
        Ok(())
    }

    /// The composite reader's own keys: frame mode, truncation and the reader-level flags.
    fn composite_keys(&mut self, k: &Keys<'_>, config: &mut ReaderConfig) -> Result<(), Error> {
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
        Ok(())
    }

    /// The `i`-th deserializer block of a composite reader, at `path`.
    fn composite_deserializer(
        &mut self,
        scope: &Scope<'_>,
        item: &Value,
        path: String,
        i: usize,
        config: &ReaderConfig,
        trace_override: Option<u32>,
    ) -> Result<DeserializerConfig, Error> {
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
            return Err(block.pos.error(format!(
                "{}: missing \"module\" (CNTK loads the deserializer from it, e.g. module = \"CNTKTextFormatReader\")",
                dk.path
            )));
        }
        for key in ["precision", "frameMode"] {
            if let Some(e) = block.get(key) {
                self.warn(
                    e.key_pos,
                    format!("{}.{}: ignored; the composite reader sets it from the reader level", dk.path, e.key),
                );
            }
        }
        Ok(match ty.as_str() {
            "CNTKTextFormatDeserializer" => {
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
        })
    }

    /// A CTF deserializer from `dk`: the legacy reader block (looked up with fallback to the enclosing
    /// blocks) or a composite deserializer block (without).
    pub(super) fn ctf(
        &mut self,
        dk: &Keys<'_>,
        precision: ElementType,
        frame_mode: bool,
        trace_override: Option<u32>,
    ) -> Result<DeserializerConfig, Error> {
        let schema = self.ctf_schema(dk, precision)?;
        let (file, path) = self.file(dk)?;
        let options = self.ctf_options(dk, frame_mode, trace_override)?;
        Ok(DeserializerConfig::Ctf { file, path, schema, options })
    }

    /// The schema a CTF deserializer's `input` block describes.
    fn ctf_schema(&mut self, dk: &Keys<'_>, precision: ElementType) -> Result<Schema, Error> {
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
            streams.push(stream_spec(&sk, e, precision)?);
            self.warn_unknown(sk.block(), &sk.path, &[CTF_INPUT_KEYS]);
        }
        Schema::new(streams).map_err(|mut err| {
            let pos = match err.kind() {
                ErrorKind::DuplicateAlias { second, .. } | ErrorKind::InvalidStream { stream: second, .. } => {
                    input.get(second).map_or(input_entry.key_pos, |e| e.key_pos)
                }
                _ => input_entry.key_pos,
            };
            *err.position_mut() = pos.position();
            err
        })
    }

    /// A CTF deserializer's options.
    fn ctf_options(
        &mut self,
        dk: &Keys<'_>,
        frame_mode: bool,
        trace_override: Option<u32>,
    ) -> Result<CtfOptions, Error> {
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
        Ok(CtfOptions {
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
        })
    }

    pub(super) fn cbf(&mut self, dk: &Keys<'_>, precision: ElementType) -> Result<DeserializerConfig, Error> {
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

    pub(super) fn file(&self, dk: &Keys<'_>) -> Result<(String, PathBuf), Error> {
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

/// The items of a composite reader's `deserializers` array (a block of items without keys counts too).
fn deserializer_items<'a>(k: &Keys<'_>, scope: &Scope<'a>, entry: &'a Entry) -> Result<Vec<&'a Value>, Error> {
    let items: Vec<&'a Value> = match scope.resolve(&entry.value)? {
        Resolved::Array(a) => a.items.iter().collect(),
        Resolved::Block(b) if b.entries.is_empty() => b.items.iter().collect(),
        other => {
            return Err(k.err(
                other.pos(),
                &entry.key,
                format_args!("expected an array of deserializer blocks ( [ … ] : [ … ] ), found {}", other.describe()),
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
    Ok(items)
}

/// CompositeDataReader's window rules (READER.md §2): with a CTF deserializer and no explicit window, a
/// window of 4 GiB of chunks.
fn composite_randomization(
    k: &Keys<'_>,
    reader: &Block,
    config: &ReaderConfig,
    has_ctf: bool,
) -> Result<Randomization, Error> {
    Ok(if !config.randomize {
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
    })
}

/// One stream of a CTF `input` block: `e`, read through `sk`.
fn stream_spec(sk: &Keys<'_>, e: &Entry, precision: ElementType) -> Result<StreamSpec, Error> {
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
        return Err(sk.err(format_pos, "format", format_args!("must be \"dense\" or \"sparse\", found {format:?}")));
    };
    let alias = match sk.text("alias")? {
        Some((a, pos)) if a.is_empty() => {
            return Err(sk.err(pos, "alias", format_args!("the alias of input \"{}\" is empty", e.key)))
        }
        Some((a, _)) => a,
        None => e.key.clone(),
    };
    let defines_mb_size = sk.bool_or("definesMBSize", false)?;
    Ok(StreamSpec::new(e.key.clone(), dim, format)
        .alias(alias)
        .element_type(precision)
        .defines_mb_size(defines_mb_size))
}
