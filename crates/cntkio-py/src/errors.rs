//! cntkio errors as Python exceptions (the classes live in `cntkio/_errors.py`).

use cntkio::validate::Problem;
use cntkio::{Error, ErrorKind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Every field of an error, as a dict: what exceptions are built from (those of a validation's problems,
/// and for I/O errors `errno` and `io_kind`).
pub fn error_fields<'py>(py: Python<'py>, e: &Error) -> PyResult<Bound<'py, PyDict>> {
    let text = serde_json::to_string(&Problem::of(e)).map_err(|err| PyValueError::new_err(err.to_string()))?;
    let d = py.import("json")?.call_method1("loads", (text,))?.downcast_into::<PyDict>()?;
    let (errno, io_kind) = match e.kind() {
        ErrorKind::Io { source, .. } => (source.raw_os_error(), Some(format!("{:?}", source.kind()))),
        _ => (None, None),
    };
    d.set_item("errno", errno)?;
    d.set_item("io_kind", io_kind)?;
    Ok(d)
}

/// A cntkio error as an instance of the matching `cntkio` exception class.
pub fn py_err(e: Error) -> PyErr {
    Python::attach(|py| {
        let made = (|| -> PyResult<Bound<'_, PyAny>> {
            let fields = error_fields(py, &e)?;
            py.import("cntkio._errors")?.getattr("_from_native")?.call1((fields,))
        })();
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(err) => err,
        }
    })
}

/// Sets the error's path to `path` when the library left it unset (errors opening an input file).
pub fn at_path(e: Error, path: &std::path::Path) -> Error {
    if e.position().path.is_none() {
        e.with_path(path.display().to_string())
    } else {
        e
    }
}

/// A usage error (wrong argument) raised as `cntkio.UsageError`.
pub fn usage(msg: impl Into<String>) -> PyErr {
    py_err(Error::config(msg))
}
