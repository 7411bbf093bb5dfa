//! cntkio errors as Python exceptions (the classes live in `cntkio/_errors.py`).

use cntkio::{Category, Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The category's name, as `cntkio._errors` knows it.
fn category_name(c: Category) -> &'static str {
    match c {
        Category::Io => "io",
        Category::Format => "format",
        Category::Usage => "usage",
        Category::Limit => "limit",
        Category::Internal => "internal",
    }
}

/// Every field of an error, as a dict: what exceptions and validation results are built from.
pub fn error_fields<'py>(py: Python<'py>, e: &Error) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let p = e.position();
    d.set_item("category", category_name(e.category()))?;
    d.set_item("code", e.code())?;
    d.set_item("kind", e.kind().name())?;
    d.set_item("message", e.kind().to_string())?;
    d.set_item("display", e.to_string())?;
    d.set_item("help", e.kind().help())?;
    d.set_item("path", p.path.clone())?;
    d.set_item("byte", p.byte)?;
    d.set_item("line", p.line)?;
    d.set_item("column", p.column)?;
    d.set_item("sequence_id", p.sequence_id)?;
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
