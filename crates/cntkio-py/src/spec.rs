//! A deserializer's configuration, as CNTK's Python API builds it (a dict: `type`, `file`, `input`, and
//! the options set with `d['chunkSizeInBytes'] = …`), turned into the library's schema and options.

use crate::errors::usage;
use cntkio::cbf::CbfOptions;
use cntkio::{Access, CtfInput, CtfOptions, ElementType, InputSpec, Schema, StorageFormat, StoredInput, StreamSpec};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// `type` of a CTF deserializer (CNTK's name).
pub const CTF_TYPE: &str = "CNTKTextFormatDeserializer";
/// `type` of a CBF deserializer (CNTK's name).
pub const CBF_TYPE: &str = "CNTKBinaryFormatDeserializer";

/// The option keys a deserializer dict may hold, with CNTK's spelling.
const CTF_KEYS: &[&str] = &[
    "type",
    "file",
    "input",
    "chunkSizeInBytes",
    "maxErrors",
    "skipSequenceIds",
    "cacheIndex",
    "keepDataInMemory",
    "precision",
    "traceLevel",
    "mmap",
];
const CBF_KEYS: &[&str] = &["type", "file", "input", "precision", "traceLevel", "mmap"];

/// One deserializer: what to read and how.
#[derive(Debug, Clone)]
pub enum Spec {
    /// A CTF file with its streams and CNTK's deserializer options.
    Ctf {
        /// The file, its streams and options.
        input: CtfInput,
        /// File access.
        access: Access,
    },
    /// A CBF file (or Parquet, or Arrow IPC) with its renames and precision.
    Cbf {
        /// The file, its renames and precision.
        input: StoredInput,
        /// The `mmap` option, if given (see [`mapped`]).
        mmap: Option<bool>,
    },
}

/// Whether a CBF deserializer's file is read through a map: as its `mmap` option asks, else a CBF file is
/// (its map guarded, see `InputFile::guard_map`) and a Parquet or Arrow file is not.
pub fn mapped(mmap: Option<bool>, cbf: bool) -> bool {
    mmap.unwrap_or(cbf)
}

impl Spec {
    /// The library's description of the input (a CBF deserializer's file told apart from Parquet and
    /// Arrow IPC by its first bytes) and whether to map it.
    pub fn into_input(self) -> Result<(InputSpec, bool), cntkio::Error> {
        match self {
            Spec::Ctf { input, access } => Ok((InputSpec::Ctf(input), access == Access::Mmap)),
            Spec::Cbf { input, mmap } => {
                let input = InputSpec::stored(input)?;
                let mapped = mapped(mmap, matches!(input, InputSpec::Cbf(_)));
                Ok((input, mapped))
            }
        }
    }
}

fn get<'py, T: FromPyObject<'py>>(d: &Bound<'py, PyDict>, key: &str, what: &str) -> PyResult<Option<T>> {
    match d.get_item(key)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => v.extract::<T>().map(Some).map_err(|_| {
            let shown = v.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into());
            usage(format!("option {key:?} must be {what}, found {shown}"))
        }),
    }
}

/// Rejects a Python bool where a number is expected (`True` would read as 1).
fn number<'py>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<u64>> {
    if let Some(v) = d.get_item(key)? {
        if v.is_instance_of::<pyo3::types::PyBool>() {
            return Err(usage(format!("option {key:?} must be a non-negative integer, found {v}")));
        }
    }
    get::<u64>(d, key, "a non-negative integer")
}

fn precision(d: &Bound<'_, PyDict>) -> PyResult<Option<ElementType>> {
    match get::<String>(d, "precision", "\"float\" or \"double\"")? {
        None => Ok(None),
        Some(p) => ElementType::parse(&p)
            .map(Some)
            .ok_or_else(|| usage(format!("option \"precision\" must be \"float\" or \"double\", found {p:?}"))),
    }
}

fn check_keys(d: &Bound<'_, PyDict>, known: &[&str], kind: &str) -> PyResult<()> {
    for k in d.keys() {
        let k: String = k.extract().map_err(|_| usage(format!("{kind} option names must be strings, found {k}")))?;
        if !known.contains(&k.as_str()) {
            return Err(usage(format!("unknown {kind} option {k:?}; known options: {}", known[3..].join(", "))));
        }
    }
    Ok(())
}

/// The streams of a deserializer's `input` dict: each name with its StreamDef dict.
fn stream_dicts<'py>(input: &Bound<'py, PyDict>) -> PyResult<Vec<(String, Bound<'py, PyDict>)>> {
    input
        .iter()
        .map(|(name, s)| {
            let name: String = name.extract().map_err(|_| usage(format!("stream names must be strings: {name}")))?;
            let s = s
                .downcast_into::<PyDict>()
                .map_err(|_| usage(format!("stream {name:?}: expected a dict (a StreamDef)")))?;
            Ok((name, s))
        })
        .collect()
}

/// Reads a deserializer dict.
pub fn from_dict(d: &Bound<'_, PyDict>) -> PyResult<Spec> {
    let ty: String = get(d, "type", "a string")?.ok_or_else(|| usage("the deserializer has no \"type\""))?;
    let path: PathBuf =
        get(d, "file", "a path")?.ok_or_else(|| usage("the deserializer has no \"file\" (the data file)"))?;
    let mmap = get::<bool>(d, "mmap", "True or False")?;
    let access = if mmap.unwrap_or(false) { Access::Mmap } else { Access::Read };
    let input: Option<Bound<'_, PyDict>> = get(d, "input", "a dict of streams")?;
    match ty.as_str() {
        CTF_TYPE => {
            check_keys(d, CTF_KEYS, "CTFDeserializer")?;
            let t = precision(d)?.unwrap_or(ElementType::F32);
            let input = input.ok_or_else(|| usage("a CTFDeserializer needs streams (\"input\")"))?;
            let mut streams = Vec::new();
            for (name, s) in stream_dicts(&input)? {
                let dim = number(&s, "dim")?.ok_or_else(|| {
                    usage(format!("stream {name:?} has no dim: give StreamDef(shape=…) (CTF data is read flat)"))
                })?;
                let dim = usize::try_from(dim).map_err(|_| usage(format!("stream {name:?}: dim {dim} too large")))?;
                let format = match get::<String>(&s, "format", "\"dense\" or \"sparse\"")?.as_deref() {
                    None | Some("dense") => StorageFormat::Dense,
                    Some("sparse") => StorageFormat::Sparse,
                    Some(f) => {
                        return Err(usage(format!("stream {name:?}: format must be dense or sparse, found {f:?}")))
                    }
                };
                let alias: String = get(&s, "alias", "a string")?.unwrap_or_else(|| name.clone());
                let main = get::<bool>(&s, "definesMBSize", "True or False")?.unwrap_or(false);
                streams.push(StreamSpec::new(name, dim, format).alias(alias).element_type(t).defines_mb_size(main));
            }
            let schema = Schema::new(streams).map_err(crate::errors::py_err)?;
            let mut options = CtfOptions::default();
            if let Some(c) = number(d, "chunkSizeInBytes")? {
                if c == 0 {
                    return Err(usage("option \"chunkSizeInBytes\" must be > 0"));
                }
                options.chunk_size = c;
            }
            if let Some(n) = number(d, "maxErrors")? {
                options.max_errors = n;
            }
            options.skip_sequence_ids = get(d, "skipSequenceIds", "True or False")?.unwrap_or(false);
            options.cache_index = get(d, "cacheIndex", "True or False")?.unwrap_or(false);
            options.keep_data_in_memory = get(d, "keepDataInMemory", "True or False")?.unwrap_or(false);
            if let Some(t) = number(d, "traceLevel")? {
                options.trace_level = u32::try_from(t).unwrap_or(u32::MAX);
            }
            Ok(Spec::Ctf { input: CtfInput { path, schema, options }, access })
        }
        CBF_TYPE => {
            check_keys(d, CBF_KEYS, "CBFDeserializer")?;
            let mut options = CbfOptions::default();
            if let Some(input) = input {
                for (name, s) in stream_dicts(&input)? {
                    if let Some(alias) = get::<String>(&s, "alias", "a string")? {
                        if alias != name {
                            options = options.rename(alias, name);
                        }
                    }
                }
            }
            let input = StoredInput { path, options, precision: precision(d)? };
            Ok(Spec::Cbf { input, mmap })
        }
        other => Err(usage(format!("unknown deserializer type {other:?}; cntkio reads {CTF_TYPE:?} and {CBF_TYPE:?}"))),
    }
}
