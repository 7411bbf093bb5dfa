//! Conversion, inspection, validation and the command line, for Python.

use crate::errors::{at_path, error_fields, py_err, usage};
use crate::spec::{from_dict, Spec};
use cntkio::cbf::{CbfFile, CbfOptions, CbfWriterOptions, EmptyStreams};
use cntkio::convert::{cbf_to_ctf, ctf_to_cbf, detect_format, CtfToCbf, Format};
use cntkio::ctf::{scan_file, ScanOptions};
use cntkio::{ChunkData, Error, ErrorKind, InputFile, Position};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

fn threads(n: Option<usize>) -> usize {
    n.filter(|&t| t > 0).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `"ctf"` or `"cbf"`, by the file's magic number.
#[pyfunction]
pub fn detect(py: Python<'_>, path: PathBuf) -> PyResult<&'static str> {
    match py.detach(|| detect_format(&path)).map_err(|e| py_err(at_path(e, &path)))? {
        Format::Ctf => Ok("ctf"),
        Format::Cbf => Ok("cbf"),
    }
}

/// The `inspect --json` report as JSON text.
#[pyfunction]
#[pyo3(signature = (path, skip_sequence_ids = false))]
pub fn inspect_json(py: Python<'_>, path: PathBuf, skip_sequence_ids: bool) -> PyResult<String> {
    let v = py.detach(|| cntkio_cli::inspect_json(&path, skip_sequence_ids)).map_err(|e| py_err(at_path(e, &path)))?;
    serde_json::to_string(&v).map_err(|e| usage(format!("cannot encode the report: {e}")))
}

/// Runs the `cntkio` command line with `argv` (program name first) and returns its exit status.
#[pyfunction]
pub fn run_cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    let code = py.detach(|| crate::pool::run(|| cntkio_cli::run(argv)));
    (0..=u8::MAX).find(|&c| ExitCode::from(c) == code).unwrap_or(1)
}

/// Converts CTF → CBF (`config`: the CTF deserializer) or CBF → CTF (`config` optional: a CBF
/// deserializer's renames; `aliases`: `(stream name, alias written after '|')` pairs). Returns a dict of
/// totals.
#[pyfunction]
#[pyo3(signature = (input, output, config = None, aliases = None, chunk_size = None, ctf2bin_compatible = false, skip_bad_sequences = false, threads = None))]
#[allow(clippy::too_many_arguments)]
pub fn convert<'py>(
    py: Python<'py>,
    input: PathBuf,
    output: PathBuf,
    config: Option<&Bound<'py, PyDict>>,
    aliases: Option<Vec<(String, String)>>,
    chunk_size: Option<u64>,
    ctf2bin_compatible: bool,
    skip_bad_sequences: bool,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = config.map(from_dict).transpose()?;
    let format = py.detach(|| detect_format(&input)).map_err(|e| py_err(at_path(e, &input)))?;
    let nthreads = self::threads(threads);
    let chunk_size = chunk_size.unwrap_or(cntkio::options::DEFAULT_CHUNK_SIZE);
    if chunk_size == 0 {
        return Err(usage("chunk_size must be > 0"));
    }
    let summary = match (format, spec) {
        (Format::Ctf, Some(Spec::Ctf { schema, options, access, .. })) => {
            let mut writer = if ctf2bin_compatible {
                CbfWriterOptions::ctf2bin(chunk_size)
            } else {
                CbfWriterOptions::new(chunk_size)
            };
            if skip_bad_sequences {
                writer.empty_streams = EmptyStreams::Drop;
            }
            let how = CtfToCbf {
                ctf: options,
                writer,
                scan: ScanOptions { threads: nthreads, skip_bad_sequences, ..ScanOptions::default() },
                access,
            };
            py.detach(|| ctf_to_cbf(&input, &output, &schema, &how, &mut |_| {}))
        }
        (Format::Ctf, _) => {
            return Err(usage(format!(
                "{} is CTF: converting it to CBF needs its streams (a StreamDefs or a CTFDeserializer)",
                input.display()
            )))
        }
        (Format::Cbf, spec) => {
            let options = match spec {
                Some(Spec::Cbf { options, .. }) => options,
                _ => CbfOptions::default(),
            };
            let aliases = aliases.unwrap_or_default();
            py.detach(|| cbf_to_ctf(&input, &output, &options, &aliases, &mut |_| {}))
        }
    }
    .map_err(py_err)?;
    let d = PyDict::new(py);
    d.set_item("input_format", if format == Format::Ctf { "ctf" } else { "cbf" })?;
    d.set_item("sequences", summary.sequences)?;
    d.set_item("samples", summary.samples)?;
    d.set_item("chunks", summary.chunks)?;
    d.set_item("dropped_sequences", summary.dropped_sequences)?;
    d.set_item("tolerated_errors", summary.tolerated_errors)?;
    d.set_item("bytes_written", summary.bytes_written)?;
    Ok(d)
}

/// What a validation pass collected (Rust side, before the GIL is taken back).
#[derive(Default)]
struct Validation {
    sequences: u64,
    samples: u64,
    errors: u64,
    dropped: u64,
    warnings: u64,
    shown: Vec<Error>,
    shown_warnings: Vec<(String, String, Position)>,
    fatal: Option<Error>,
    max_errors: u64,
    format: &'static str,
}

fn validate_ctf(
    path: &std::path::Path,
    schema: &cntkio::Schema,
    opts: &cntkio::CtfOptions,
    access: cntkio::Access,
    warnings: bool,
    limit: usize,
    nthreads: usize,
) -> Result<Validation, Error> {
    let file = InputFile::open(path, access)?;
    let scan =
        ScanOptions { threads: nthreads, enforce_max_errors: false, keep: limit, warnings, skip_bad_sequences: true };
    let mut v = Validation { max_errors: opts.max_errors, format: "ctf", ..Validation::default() };
    let r = scan_file(
        &file,
        schema,
        opts,
        &scan,
        |p| {
            v.sequences += p.data.num_sequences() as u64;
            v.samples += p.data.num_samples.iter().map(|&n| u64::from(n)).sum::<u64>();
            v.errors += p.num_errors;
            v.dropped += p.num_dropped;
            v.warnings += p.num_warnings;
            for e in &p.errors {
                if v.shown.len() < limit {
                    v.shown.push(e.clone());
                }
            }
            for (w, pos) in &p.warnings {
                if v.shown_warnings.len() < limit {
                    v.shown_warnings.push((w.code().to_string(), w.to_string(), pos.clone()));
                }
            }
            Ok(ControlFlow::Continue(()))
        },
        &mut |_| {},
    );
    match r {
        Ok(_) => {}
        Err(e) if e.is_io() => return Err(e),
        Err(e) => v.fatal = Some(if e.position().path.is_none() { e.with_path(path.display().to_string()) } else { e }),
    }
    Ok(v)
}

fn validate_cbf(path: &std::path::Path, options: &CbfOptions, limit: usize) -> Result<Validation, Error> {
    let mut v = Validation { format: "cbf", ..Validation::default() };
    let shown = path.display().to_string();
    let f = match CbfFile::open_with(path, options) {
        Ok(f) => f,
        Err(e) if e.is_io() => return Err(e),
        Err(e) => {
            v.fatal = Some(e);
            return Ok(v);
        }
    };
    let types: std::collections::BTreeSet<&str> = f.streams().iter().map(|s| s.element_type.cntk_name()).collect();
    if types.len() > 1 {
        v.errors += 1;
        v.shown.push(
            Error::config("streams mix float and double; CNTK requires every stream to match the reader's precision")
                .with_path(shown.clone()),
        );
    }
    let mut data = ChunkData { keys: Vec::new(), num_samples: Vec::new(), streams: Vec::new() };
    let mut buf = Vec::new();
    for k in 0..f.chunk_count() {
        if let Err(e) = f.read_chunk_into(k, &mut buf, &mut data) {
            if e.is_io() {
                return Err(e);
            }
            v.fatal = Some(e);
            return Ok(v);
        }
        for q in 0..data.num_sequences() {
            let empty: Vec<String> = data
                .streams
                .iter()
                .zip(f.streams())
                .filter(|(st, _)| st.sequence_len(q) == 0)
                .map(|(_, h)| h.name.clone())
                .collect();
            if !empty.is_empty() {
                v.dropped += 1;
                if v.shown.len() < limit {
                    let mut e = Error::new(ErrorKind::EmptyStream { sequence: data.keys[q], streams: empty })
                        .with_path(shown.clone())
                        .with_sequence(data.keys[q]);
                    e.position_mut().byte = Some(f.chunks()[k].offset);
                    v.shown.push(e);
                }
            }
        }
        v.sequences += data.num_sequences() as u64;
        v.samples += data.num_samples.iter().map(|&n| u64::from(n)).sum::<u64>();
    }
    Ok(v)
}

/// Reads everything and reports every error (not only the first): a dict with `valid`, `verdict`,
/// totals, and `errors` / `warnings` as lists of field dicts (see `errors::error_fields`).
#[pyfunction]
#[pyo3(signature = (path, config = None, warnings = false, limit = 1000, threads = None))]
pub fn validate<'py>(
    py: Python<'py>,
    path: PathBuf,
    config: Option<&Bound<'py, PyDict>>,
    warnings: bool,
    limit: usize,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = config.map(from_dict).transpose()?;
    let nthreads = self::threads(threads);
    let format = py.detach(|| detect_format(&path)).map_err(|e| py_err(at_path(e, &path)))?;
    let v = match (format, spec) {
        (Format::Cbf, Some(Spec::Cbf { options, .. })) => py.detach(|| validate_cbf(&path, &options, limit)),
        (Format::Cbf, _) => py.detach(|| validate_cbf(&path, &CbfOptions::default(), limit)),
        (Format::Ctf, Some(Spec::Ctf { schema, options, access, .. })) => {
            py.detach(|| validate_ctf(&path, &schema, &options, access, warnings, limit, nthreads))
        }
        (Format::Ctf, _) => {
            return Err(usage(format!(
                "{} is CTF: validating it needs its streams (a StreamDefs or a CTFDeserializer)",
                path.display()
            )))
        }
    }
    .map_err(|e| py_err(at_path(e, &path)))?;
    let total_errors = v.errors + v.dropped + u64::from(v.fatal.is_some());
    let tolerated = v.errors <= v.max_errors;
    let valid = v.fatal.is_none() && v.dropped == 0 && tolerated;
    let verdict = if valid && v.errors == 0 {
        "valid".to_string()
    } else if valid {
        format!("readable: {} error(s) tolerated by maxErrors = {}", v.errors, v.max_errors)
    } else if v.fatal.is_some() {
        "invalid: the file cannot be read".to_string()
    } else if v.dropped > 0 {
        format!("invalid: {} sequence(s) lack a configured stream (always fatal in CNTK)", v.dropped)
    } else {
        format!("invalid: {} error(s), more than maxErrors = {}", v.errors, v.max_errors)
    };
    let errors = PyList::empty(py);
    for e in v.shown.iter().chain(v.fatal.iter()) {
        let d = error_fields(py, e)?;
        if d.get_item("path")?.map_or(true, |p| p.is_none()) {
            d.set_item("path", path.display().to_string())?;
        }
        d.set_item("severity", "error")?;
        errors.append(d)?;
    }
    let warns = PyList::empty(py);
    for (code, message, pos) in &v.shown_warnings {
        let d = PyDict::new(py);
        d.set_item("category", "format")?;
        d.set_item("code", code)?;
        d.set_item("kind", "Warning")?;
        d.set_item("message", message)?;
        d.set_item("display", format!("{pos}: warning[{code}]: {message}"))?;
        d.set_item("help", py.None())?;
        d.set_item("path", pos.path.clone().unwrap_or_else(|| path.display().to_string()))?;
        d.set_item("byte", pos.byte)?;
        d.set_item("line", pos.line)?;
        d.set_item("column", pos.column)?;
        d.set_item("sequence_id", pos.sequence_id)?;
        d.set_item("severity", "warning")?;
        warns.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("path", path.display().to_string())?;
    d.set_item("format", v.format)?;
    d.set_item("valid", valid)?;
    d.set_item("verdict", verdict)?;
    d.set_item("sequences", v.sequences)?;
    d.set_item("samples", v.samples)?;
    d.set_item("num_errors", total_errors)?;
    d.set_item("dropped_sequences", v.dropped)?;
    d.set_item("num_warnings", v.warnings)?;
    d.set_item("max_errors", v.max_errors)?;
    d.set_item("errors", errors)?;
    d.set_item("warnings", warns)?;
    Ok(d)
}
