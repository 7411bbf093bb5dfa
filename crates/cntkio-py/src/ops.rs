//! Conversion, inspection and validation, for Python.

use crate::errors::{at_path, py_err, usage};
use crate::spec::{from_dict, Spec};
use cntkio::arrow::{
    arrow_to_arrow, arrow_to_cbf, arrow_to_ctf, cbf_to_arrow, ctf_to_arrow, ArrowFormat, ArrowToCbf, ArrowToCtf,
    ToArrow,
};
use cntkio::cbf::{CbfOptions, CbfWriterOptions, EmptyStreams};
use cntkio::convert::{cbf_to_ctf, ctf_to_cbf, detect_format, CbfToCtf, ConvertSummary, CtfToCbf, Format, Hooks};
use cntkio::ctf::ScanOptions;
use cntkio::inspect::inspect;
use cntkio::validate::{validate_cbf, validate_ctf, SummaryOptions, ValidateOptions};
use cntkio::{Error, InputFile};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `"ctf"`, `"cbf"`, `"parquet"` or `"arrow"`, by the file's magic number.
#[pyfunction]
pub fn detect(py: Python<'_>, path: PathBuf) -> PyResult<&'static str> {
    Ok(py.detach(|| detect_format(&path)).map_err(|e| py_err(at_path(e, &path)))?.name())
}

/// The `inspect --json` report as JSON text.
#[pyfunction]
#[pyo3(signature = (path, skip_sequence_ids = false))]
pub fn inspect_json(py: Python<'_>, path: PathBuf, skip_sequence_ids: bool) -> PyResult<String> {
    let report = py.detach(|| inspect(&path, skip_sequence_ids)).map_err(|e| py_err(at_path(e, &path)))?;
    serde_json::to_string(&report).map_err(|e| usage(format!("cannot encode the report: {e}")))
}

thread_local! {
    /// The Python exception (`KeyboardInterrupt`, …) a conversion on this thread stopped for.
    static STOPPED_BY: RefCell<Option<PyErr>> = const { RefCell::new(None) };
    /// When Python's signal handlers last ran for a conversion on this thread.
    static CHECKED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How often a conversion lets Python run its signal handlers.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// [`Hooks::cancel`] of a conversion called from Python (which runs without the GIL): every
/// [`CHECK_EVERY`], takes the GIL and runs Python's signal handlers; if one raises (Ctrl-C's
/// `KeyboardInterrupt`), keeps the exception for [`convert`] to raise and stops the conversion.
fn python_signal_raised() -> bool {
    let now = Instant::now();
    if CHECKED.get().is_some_and(|t| now.duration_since(t) < CHECK_EVERY) {
        return false;
    }
    CHECKED.set(Some(now));
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(e) => {
            STOPPED_BY.set(Some(e));
            true
        }
    })
}

/// Runs a long pass without the GIL, a pass whose cancel hook is [`python_signal_raised`]: a signal
/// handler's exception (Ctrl-C's `KeyboardInterrupt`) is raised in place of the pass's "interrupted"
/// error; other errors go through `err`.
fn interruptible<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, Error> + Send,
    err: impl FnOnce(Error) -> PyErr,
) -> PyResult<T> {
    STOPPED_BY.set(None);
    CHECKED.set(None);
    let r = py.detach(f);
    match (r, STOPPED_BY.take()) {
        (Err(_), Some(raised)) => Err(raised),
        (r, _) => r.map_err(err),
    }
}

/// Converts CTF → CBF (`config`: the CTF deserializer) or CBF → CTF (`config` optional: a CBF
/// deserializer's renames; `aliases`: `(stream name, alias written after '|')` pairs); any of them to
/// Parquet or Arrow IPC when `output`'s extension names one (one row per sample when `flatten`; at most
/// `row_group_size` rows per Parquet row group or IPC record batch), and those
/// back to CBF (`.cbf`, `.bin`) or CTF. Returns a dict of totals.
#[pyfunction]
#[pyo3(signature = (input, output, config = None, aliases = None, chunk_size = None, ctf2bin_compatible = false, skip_bad_sequences = false, threads = None, flatten = false, row_group_size = None))]
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
    flatten: bool,
    row_group_size: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = config.map(from_dict).transpose()?;
    let format = py.detach(|| detect_format(&input)).map_err(|e| py_err(at_path(e, &input)))?;
    let nthreads = cntkio::threads_or_cores(threads);
    let chunk_size = chunk_size.unwrap_or(cntkio::options::DEFAULT_CHUNK_SIZE);
    if chunk_size == 0 {
        return Err(usage("chunk_size must be > 0"));
    }
    let hooks = Hooks { cancel: Some(python_signal_raised), ..Hooks::default() };
    let arrow_out = ArrowFormat::from_extension(&output);
    if (flatten || row_group_size.is_some()) && arrow_out.is_none() {
        let what = if flatten { "flatten" } else { "row_group_size" };
        return Err(usage(format!("{what} applies to Parquet and Arrow outputs (.parquet, .arrow)")));
    }
    if row_group_size == Some(0) {
        return Err(usage("row_group_size must be > 0"));
    }
    if let Some(f) = arrow_out {
        let how = ToArrow { flatten, hooks, rows_per_group: row_group_size, ..ToArrow::new(f) };
        let summary = match (format, spec) {
            (Format::Ctf, Some(Spec::Ctf { schema, options, access, .. })) => {
                let scan = ScanOptions { threads: nthreads, skip_bad_sequences, ..ScanOptions::default() };
                interruptible(
                    py,
                    || ctf_to_arrow(&input, &output, &schema, &options, &scan, access, &how, &mut |_| {}),
                    py_err,
                )
            }
            (Format::Ctf, _) => {
                return Err(usage(format!(
                    "{} is CTF: converting it needs its streams (a StreamDefs or a CTFDeserializer)",
                    input.display()
                )))
            }
            (Format::Cbf, spec) => {
                let options = match spec {
                    Some(Spec::Cbf { options, .. }) => options,
                    _ => CbfOptions::default(),
                };
                interruptible(py, || cbf_to_arrow(&input, &output, &options, &how, &mut |_| {}), py_err)
            }
            (Format::Parquet | Format::ArrowIpc, _) => {
                interruptible(py, || arrow_to_arrow(&input, &output, &how, &mut |_| {}), py_err)
            }
        }?;
        return totals(py, format, summary);
    }
    let cbf_out = output
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("cbf") || e.eq_ignore_ascii_case("bin"));
    let summary = match (format, spec) {
        (Format::Ctf, Some(Spec::Ctf { schema, options, access, .. })) => {
            let mut writer = cbf_writer(chunk_size, ctf2bin_compatible);
            if skip_bad_sequences {
                writer.empty_streams = EmptyStreams::Drop;
            }
            let how = CtfToCbf {
                ctf: options,
                writer,
                scan: ScanOptions { threads: nthreads, skip_bad_sequences, ..ScanOptions::default() },
                access,
                hooks: Hooks { cancel: Some(python_signal_raised), ..Hooks::default() },
            };
            interruptible(py, || ctf_to_cbf(&input, &output, &schema, &how, &mut |_| {}), py_err)
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
            let hooks = Hooks { cancel: Some(python_signal_raised), ..Hooks::default() };
            let how = CbfToCtf { cbf: options, aliases, threads: nthreads, hooks };
            interruptible(py, || cbf_to_ctf(&input, &output, &how, &mut |_| {}), py_err)
        }
        (Format::Parquet | Format::ArrowIpc, _) if cbf_out => {
            let how = ArrowToCbf { writer: cbf_writer(chunk_size, ctf2bin_compatible), hooks };
            interruptible(py, || arrow_to_cbf(&input, &output, &how, &mut |_| {}), py_err)
        }
        (Format::Parquet | Format::ArrowIpc, _) => {
            let how = ArrowToCtf { aliases: aliases.unwrap_or_default(), threads: nthreads, hooks };
            interruptible(py, || arrow_to_ctf(&input, &output, &how, &mut |_| {}), py_err)
        }
    }?;
    totals(py, format, summary)
}

/// The CBF writer's options: CNTK's `ctf2bin.py` layout or cntkio's.
fn cbf_writer(chunk_size: u64, ctf2bin_compatible: bool) -> CbfWriterOptions {
    if ctf2bin_compatible {
        CbfWriterOptions::ctf2bin(chunk_size)
    } else {
        CbfWriterOptions::new(chunk_size)
    }
}

/// The totals of a conversion as a dict.
fn totals<'py>(py: Python<'py>, format: Format, summary: ConvertSummary) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("input_format", format.name())?;
    d.set_item("sequences", summary.sequences)?;
    d.set_item("samples", summary.samples)?;
    d.set_item("chunks", summary.chunks)?;
    d.set_item("dropped_sequences", summary.dropped_sequences)?;
    d.set_item("tolerated_errors", summary.tolerated_errors)?;
    d.set_item("bytes_written", summary.bytes_written)?;
    Ok(d)
}

/// Reads everything and reports every error (not only the first): the JSON text of the library's
/// validation summary, the object `cntkio validate --json` prints for the file.
#[pyfunction]
#[pyo3(signature = (path, config = None, warnings = false, limit = 1000, threads = None))]
pub fn validate_json<'py>(
    py: Python<'py>,
    path: PathBuf,
    config: Option<&Bound<'py, PyDict>>,
    warnings: bool,
    limit: usize,
    threads: Option<usize>,
) -> PyResult<String> {
    let spec = config.map(from_dict).transpose()?;
    let vo = ValidateOptions {
        threads: cntkio::threads_or_cores(threads),
        limit,
        warnings,
        cancel: Some(python_signal_raised),
    };
    let format = py.detach(|| detect_format(&path)).map_err(|e| py_err(at_path(e, &path)))?;
    let err = |e| py_err(at_path(e, &path));
    let (r, schema, schema_inferred) = match (format, spec) {
        (Format::Cbf, spec) => {
            let options = match spec {
                Some(Spec::Cbf { options, .. }) => options,
                _ => CbfOptions::default(),
            };
            (interruptible(py, || validate_cbf(&path, &options, &vo, &mut |_| {}), err)?, None, false)
        }
        (Format::Ctf, Some(Spec::Ctf { schema, options, access, .. })) => {
            let r = interruptible(
                py,
                || {
                    let file = InputFile::open(&path, access)?;
                    validate_ctf(&file, &schema, &options, &vo, &mut |_| {}, &mut |_| {})
                },
                err,
            )?;
            (r, Some(schema), false)
        }
        (Format::Parquet | Format::ArrowIpc, _) => {
            (interruptible(py, || cntkio::validate::validate_arrow(&path, &vo, &mut |_| {}), err)?, None, false)
        }
        // Without streams: checked with the schema its rows suggest.
        (Format::Ctf, _) => {
            let (r, schema) = interruptible(
                py,
                || {
                    let file = InputFile::open(&path, cntkio::Access::Read)?;
                    let (schema, _) = cntkio::ctf::infer_schema(&file, false)?;
                    let opts = cntkio::CtfOptions::default();
                    Ok((validate_ctf(&file, &schema, &opts, &vo, &mut |_| {}, &mut |_| {})?, schema))
                },
                err,
            )?;
            (r, Some(schema), true)
        }
    };
    let summary = r.summary(&SummaryOptions { schema: schema.as_ref(), schema_inferred, limit });
    serde_json::to_string(&summary).map_err(|e| usage(format!("cannot encode the report: {e}")))
}

/// Rewrites `input` (plain or compressed) as seekable zstd (`output` ending in `.zst`) or BGZF (`.gz`);
/// returns the bytes written.
#[pyfunction]
#[pyo3(signature = (input, output, threads = None))]
pub fn recompress(py: Python<'_>, input: PathBuf, output: PathBuf, threads: Option<usize>) -> PyResult<u64> {
    let hooks = Hooks { cancel: Some(python_signal_raised), ..Hooks::default() };
    let nthreads = cntkio::threads_or_cores(threads);
    let run = || cntkio::convert::recompress(&input, &output, nthreads, hooks, &mut |_| {});
    Ok(interruptible(py, run, py_err)?.bytes_written)
}
