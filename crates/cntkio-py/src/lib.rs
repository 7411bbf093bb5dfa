//! `cntkio._native`: the Python extension of cntkio. Thin wrappers over the `cntkio` library and the
//! hand-over of chunk data to NumPy; the Python API lives in `python/cntkio`.
#![deny(missing_docs)]

mod arrays;
mod arrow;
mod errors;
mod feed;
mod ops;
mod pool;
mod reader;
mod source;
mod spec;

use pyo3::prelude::*;

/// Makes cntkio's guard of memory-mapped CBF files the `SIGBUS` handler again, after PyTorch's DataLoader
/// worker installed its own (see `cntkio::rearm_map_guard`).
#[pyfunction]
fn rearm_map_guard() {
    cntkio::rearm_map_guard();
}

/// The cores this process may run on: its CPU affinity, within its cgroup's CPU quota (the library's
/// default number of threads).
#[pyfunction]
fn available_cores() -> usize {
    cntkio::threads_or_cores(None)
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    pool::init();
    // Rust `log` records go to Python's `logging` (logger names follow the Rust module paths, e.g.
    // `cntkio.cbf`). Loggers are cached, levels are not, so `logging` configuration changes apply.
    let _ = pyo3_log::Logger::new(m.py(), pyo3_log::Caching::Loggers)?.install();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CTF_TYPE", spec::CTF_TYPE)?;
    m.add("CBF_TYPE", spec::CBF_TYPE)?;
    m.add("DEFAULT_CHUNK_SIZE", cntkio::options::DEFAULT_CHUNK_SIZE)?;
    m.add_class::<reader::Reader>()?;
    m.add_class::<arrow::ArrowStream>()?;
    m.add_class::<source::Source>()?;
    m.add_class::<source::Keep>()?;
    m.add_class::<feed::Feed>()?;
    m.add_class::<feed::NextSource>()?;
    m.add_class::<feed::BatchMemory>()?;
    m.add_class::<feed::BatchPool>()?;
    m.add_function(wrap_pyfunction!(reader::read_all, m)?)?;
    m.add_function(wrap_pyfunction!(reader::stream_infos, m)?)?;
    m.add_function(wrap_pyfunction!(ops::detect, m)?)?;
    m.add_function(wrap_pyfunction!(ops::inspect_json, m)?)?;
    m.add_function(wrap_pyfunction!(ops::stats_json, m)?)?;
    m.add_function(wrap_pyfunction!(ops::suggest_streams, m)?)?;
    m.add_function(wrap_pyfunction!(ops::convert, m)?)?;
    m.add_function(wrap_pyfunction!(ops::validate_json, m)?)?;
    m.add_function(wrap_pyfunction!(ops::recompress, m)?)?;
    m.add_function(wrap_pyfunction!(rearm_map_guard, m)?)?;
    m.add_function(wrap_pyfunction!(available_cores, m)?)?;
    Ok(())
}
