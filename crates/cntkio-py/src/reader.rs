//! Reading a deserializer's data: chunk by chunk (an opened, indexed [`Reader`]) or all at once
//! ([`read_all`]: one ordered pass with CNTK's `maxErrors` budget). The GIL is released while reading.

use crate::arrays::{chunk_to_py, concat};
use crate::arrow::ArrowStream;
use crate::errors::{at_path, py_err};
use crate::spec::{from_dict, Spec};
use cntkio::arrow::Rows;
use cntkio::ctf::{scan_file, ScanOptions};
use cntkio::source::Deserializer;
use cntkio::{ChunkData, CtfInput, ElementType, Error, InputFile, Schema, StreamSpec};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rayon::prelude::*;
use std::ops::ControlFlow;
use std::sync::Arc;

/// An opened deserializer: a CTF file indexed (or its index cache loaded), or a CBF header and its
/// per-sequence meta counts read (Parquet and Arrow IPC: their keys and lengths).
#[pyclass(module = "cntkio._native", frozen)]
pub struct Reader {
    source: Arc<dyn Deserializer>,
}

impl Reader {
    /// The opened file as a deserializer of the minibatch source (shared, not reopened).
    pub fn deserializer(&self) -> Arc<dyn Deserializer> {
        self.source.clone()
    }
}

/// `(name, alias, dim, is_sparse, dtype, defines_mb_size)` of a stream.
pub fn stream_info<'py>(py: Python<'py>, s: &StreamSpec) -> PyResult<Bound<'py, PyTuple>> {
    (
        s.name.clone(),
        s.alias.clone(),
        s.dim,
        s.is_sparse(),
        if s.element_type == ElementType::F64 { "float64" } else { "float32" },
        s.defines_mb_size,
    )
        .into_pyobject(py)
}

#[pymethods]
impl Reader {
    /// Opens the deserializer described by `config` (the GIL is released while indexing).
    #[new]
    fn new(py: Python<'_>, config: &Bound<'_, PyDict>) -> PyResult<Reader> {
        let spec = from_dict(config)?;
        py.detach(|| {
            crate::pool::run(|| -> Result<Reader, Error> {
                let (input, mmap) = spec.into_input()?;
                let source =
                    input.open(Some(mmap), cntkio::threads_or_cores(None)).map_err(|e| at_path(e, input.path()))?;
                Ok(Reader { source })
            })
        })
        .map_err(py_err)
    }

    /// Number of chunks.
    fn num_chunks(&self) -> usize {
        self.source.chunks().len()
    }

    /// `(sequences, samples)` of each chunk, from the index or the CBF chunk table.
    fn chunk_sizes(&self) -> Vec<(u64, u64)> {
        self.source.chunks().iter().map(|c| (u64::from(c.num_sequences), c.num_samples)).collect()
    }

    /// `(name, alias, dim, is_sparse, dtype, defines_mb_size)` of each stream, in delivery order.
    fn stream_infos<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.source.streams().iter().map(|s| stream_info(py, s)).collect()
    }

    /// Loads chunk `i` (see `arrays::chunk_to_py` for the layout).
    fn read_chunk<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyTuple>> {
        let n = self.num_chunks();
        if i >= n {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("chunk {i} out of range ({n} chunks)")));
        }
        let data = py
            .detach(|| {
                crate::pool::run(|| -> Result<ChunkData, Error> {
                    let data = self.source.load_chunk(i as u32)?;
                    Ok(Arc::try_unwrap(data).unwrap_or_else(|shared| (*shared).clone()))
                })
            })
            .map_err(py_err)?;
        chunk_to_py(py, data)
    }

    /// Chunks `start..stop` (all when not given) in cntkio's Arrow mapping (one row per sample when
    /// `flatten`), loaded one chunk at a time as an Arrow consumer reads the stream.
    #[pyo3(signature = (start = None, stop = None, flatten = false))]
    fn arrow_stream(&self, start: Option<u32>, stop: Option<u32>, flatten: bool) -> PyResult<ArrowStream> {
        ArrowStream::lazy(self.deserializer(), self.chunk_range(start, stop), rows(flatten)).map_err(py_err)
    }

    /// Chunks `start..stop` (all when not given) in cntkio's Arrow mapping, read now (the GIL released;
    /// chunks in parallel where the order of loading cannot matter).
    #[pyo3(signature = (start = None, stop = None, flatten = false))]
    fn read_arrow(
        &self,
        py: Python<'_>,
        start: Option<u32>,
        stop: Option<u32>,
        flatten: bool,
    ) -> PyResult<ArrowStream> {
        let range = self.chunk_range(start, stop);
        let source = self.deserializer();
        py.detach(|| crate::pool::run(|| ArrowStream::loaded(source, range, rows(flatten)))).map_err(py_err)
    }
}

impl Reader {
    fn chunk_range(&self, start: Option<u32>, stop: Option<u32>) -> Option<std::ops::Range<u32>> {
        match (start, stop) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0)..b.unwrap_or_else(|| u32::try_from(self.num_chunks()).unwrap_or(u32::MAX))),
        }
    }
}

fn rows(flatten: bool) -> Rows {
    if flatten {
        Rows::Samples
    } else {
        Rows::Sequences
    }
}

/// The stream infos of a deserializer config without keeping it open (CBF: reads the header).
#[pyfunction]
pub fn stream_infos<'py>(py: Python<'py>, config: &Bound<'py, PyDict>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    let spec = from_dict(config)?;
    let streams = py
        .detach(|| {
            let (input, _) = spec.into_input()?;
            input.streams().map_err(|e| at_path(e, input.path()))
        })
        .map_err(py_err)?;
    streams.iter().map(|s| stream_info(py, s)).collect()
}

/// Reads every sequence of a deserializer, in file order, on `threads` threads (default: all cores).
#[pyfunction]
#[pyo3(signature = (config, threads = None))]
pub fn read_all<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyDict>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyTuple>> {
    let spec = from_dict(config)?;
    let nthreads = cntkio::threads_or_cores(threads);
    let data = py
        .detach(|| -> Result<ChunkData, Error> {
            match spec {
                Spec::Ctf { input: CtfInput { path, schema, options }, access } => {
                    let file = InputFile::open(&path, access).map_err(|e| at_path(e, &path))?;
                    let mut acc = ChunkData::new(&schema);
                    let scan = ScanOptions { threads: nthreads, ..ScanOptions::default() };
                    scan_file(
                        &file,
                        &schema,
                        &options,
                        &scan,
                        |p| {
                            crate::arrays::append(&mut acc, &p.data);
                            Ok(ControlFlow::Continue(()))
                        },
                        &mut |_| {},
                    )
                    .map_err(|e| at_path(e, &path))?;
                    Ok(acc)
                }
                spec @ Spec::Cbf { .. } => {
                    let (input, mmap) = spec.into_input()?;
                    let source = input.open(Some(mmap), 1).map_err(|e| at_path(e, input.path()))?;
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(nthreads)
                        .build()
                        .map_err(|e| Error::io("start reader threads", std::io::Error::other(e)))?;
                    let chunks = pool.install(|| {
                        (0..source.chunks().len() as u32)
                            .into_par_iter()
                            .map(|k| {
                                Ok(Arc::try_unwrap(source.load_chunk(k)?).unwrap_or_else(|shared| (*shared).clone()))
                            })
                            .collect::<Result<Vec<_>, Error>>()
                    })?;
                    Ok(concat(ChunkData::new(&Schema::new(source.streams().to_vec())?), chunks))
                }
            }
        })
        .map_err(py_err)?;
    chunk_to_py(py, data)
}
