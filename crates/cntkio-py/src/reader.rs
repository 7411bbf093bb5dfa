//! Reading a deserializer's data: chunk by chunk (an opened, indexed [`Reader`]) or all at once
//! ([`read_all`]: one ordered pass with CNTK's `maxErrors` budget). The GIL is released while reading.

use crate::arrays::{chunk_to_py, concat};
use crate::errors::{at_path, py_err};
use crate::spec::{from_dict, Spec};
use cntkio::cbf::CbfFile;
use cntkio::ctf::{scan_file, ScanOptions};
use cntkio::randomize::{ChunkInfo, SequenceInfo, SequenceSource};
use cntkio::source::{CbfSource, Deserializer, SourceChunk};
use cntkio::{ChunkData, CtfReader, ElementType, Error, InputFile, Schema, StreamSpec};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rayon::prelude::*;
use std::ops::ControlFlow;
use std::sync::Arc;

/// A CBF file as a deserializer of the minibatch source, its streams converted to the element type asked
/// for (`precision`), if any.
#[derive(Debug)]
pub struct CbfDeserializer {
    source: CbfSource,
    streams: Vec<StreamSpec>,
    precision: Option<ElementType>,
}

impl SequenceSource for CbfDeserializer {
    fn chunks(&self) -> &[ChunkInfo] {
        self.source.chunks()
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        self.source.sequences(chunk, out)
    }
}

impl Deserializer for CbfDeserializer {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        Ok(Arc::new(read_cbf_chunk(self.source.file(), chunk as usize, self.precision)?))
    }
    fn load_source_chunk(&self, chunk: u32, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
        if self.streams.iter().zip(self.source.streams()).all(|(a, b)| a.element_type == b.element_type) {
            // The file's own element types: the records are kept undecoded and copied once, into the
            // minibatch (decoding the whole chunk first would copy every value twice).
            self.source.load_source_chunk(chunk, spare)
        } else {
            Ok(SourceChunk::from_data(self.load_chunk(chunk)?))
        }
    }
}

enum Inner {
    Ctf(Arc<CtfReader>),
    Cbf(Arc<CbfDeserializer>),
}

/// An opened deserializer: a CTF file indexed (or its index cache loaded), or a CBF header and its
/// per-sequence meta counts read.
#[pyclass(module = "cntkio._native", frozen)]
pub struct Reader {
    inner: Inner,
    streams: Vec<StreamSpec>,
}

impl Reader {
    /// The opened file as a deserializer of the minibatch source (shared, not reopened).
    pub fn deserializer(&self) -> Arc<dyn Deserializer> {
        match &self.inner {
            Inner::Ctf(r) => r.clone(),
            Inner::Cbf(c) => c.clone(),
        }
    }
}

fn threads(n: Option<usize>) -> usize {
    n.filter(|&t| t > 0).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The streams a CBF file delivers, with the element type asked for.
fn cbf_streams(file: &CbfFile, precision: Option<ElementType>) -> Result<Vec<StreamSpec>, Error> {
    let mut s = file.schema()?.streams().to_vec();
    if let Some(t) = precision {
        for x in &mut s {
            x.element_type = t;
        }
    }
    Ok(s)
}

fn read_cbf_chunk(file: &CbfFile, k: usize, precision: Option<ElementType>) -> Result<ChunkData, Error> {
    match precision {
        Some(t) => file.read_chunk_as(k, t),
        None => file.read_chunk(k),
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
                Ok(match spec {
                    Spec::Ctf { path, schema, options, access } => {
                        let threads = threads(None);
                        let r = CtfReader::open_with(&path, &schema, &options, access, threads)
                            .map_err(|e| at_path(e, &path))?;
                        Reader { streams: schema.streams().to_vec(), inner: Inner::Ctf(Arc::new(r)) }
                    }
                    Spec::Cbf { path, options, precision } => {
                        let file = CbfFile::open_with(&path, &options).map_err(|e| at_path(e, &path))?;
                        let streams = cbf_streams(&file, precision)?;
                        let source = CbfSource::new(file).map_err(|e| at_path(e, &path))?;
                        let c = CbfDeserializer { source, streams: streams.clone(), precision };
                        Reader { streams, inner: Inner::Cbf(Arc::new(c)) }
                    }
                })
            })
        })
        .map_err(py_err)
    }

    /// Number of chunks.
    fn num_chunks(&self) -> usize {
        match &self.inner {
            Inner::Ctf(r) => r.index().chunks.len(),
            Inner::Cbf(c) => c.source.file().chunk_count(),
        }
    }

    /// `(sequences, samples)` of each chunk, from the index or the CBF chunk table.
    fn chunk_sizes(&self) -> Vec<(u64, u64)> {
        match &self.inner {
            Inner::Ctf(r) => r.chunks().iter().map(|c| (u64::from(c.num_sequences), c.num_samples)).collect(),
            Inner::Cbf(c) => c
                .source
                .file()
                .chunks()
                .iter()
                .map(|c| (u64::from(c.num_sequences), u64::from(c.num_samples)))
                .collect(),
        }
    }

    /// `(name, alias, dim, is_sparse, dtype, defines_mb_size)` of each stream, in delivery order.
    fn stream_infos<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.streams.iter().map(|s| stream_info(py, s)).collect()
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
                    match &self.inner {
                        Inner::Ctf(r) => {
                            Ok(Arc::try_unwrap(CtfReader::load_chunk(r, i)?).unwrap_or_else(|a| (*a).clone()))
                        }
                        Inner::Cbf(c) => read_cbf_chunk(c.source.file(), i, c.precision),
                    }
                })
            })
            .map_err(py_err)?;
        chunk_to_py(py, data)
    }
}

/// The stream infos of a deserializer config without keeping it open (CBF: reads the header).
#[pyfunction]
pub fn stream_infos<'py>(py: Python<'py>, config: &Bound<'py, PyDict>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    let streams = match from_dict(config)? {
        Spec::Ctf { schema, .. } => schema.streams().to_vec(),
        Spec::Cbf { path, options, precision } => py
            .detach(|| CbfFile::open_with(&path, &options).and_then(|f| cbf_streams(&f, precision)))
            .map_err(|e| at_path(e, &path))
            .map_err(py_err)?,
    };
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
    let nthreads = self::threads(threads);
    let data = py
        .detach(|| -> Result<ChunkData, Error> {
            match spec {
                Spec::Ctf { path, schema, options, access } => {
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
                Spec::Cbf { path, options, precision } => {
                    let file = CbfFile::open_with(&path, &options).map_err(|e| at_path(e, &path))?;
                    let schema = Schema::new(cbf_streams(&file, precision)?)?;
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(nthreads)
                        .build()
                        .map_err(|e| Error::io("start reader threads", std::io::Error::other(e)))?;
                    let chunks: Vec<ChunkData> = pool.install(|| {
                        (0..file.chunk_count())
                            .into_par_iter()
                            .map(|k| read_cbf_chunk(&file, k, precision))
                            .collect::<Result<_, _>>()
                    })?;
                    Ok(concat(ChunkData::new(&schema), chunks))
                }
            }
        })
        .map_err(py_err)?;
    chunk_to_py(py, data)
}
