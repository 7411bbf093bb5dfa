//! Reading a deserializer's data: chunk by chunk (an opened, indexed [`Reader`]) or all at once
//! ([`read_all`]: one ordered pass with CNTK's `maxErrors` budget). The GIL is released while reading.

use crate::arrays::{chunk_to_py, concat};
use crate::arrow::ArrowStream;
use crate::errors::{at_path, py_err};
use crate::spec::{from_dict, Spec};
use cntkio::arrow::{ArrowFile, ArrowSource, Rows};
use cntkio::cbf::{CbfFile, CbfOptions};
use cntkio::convert::{detect_format, Format};
use cntkio::ctf::{scan_file, ScanOptions};
use cntkio::randomize::{ChunkInfo, SequenceInfo, SequenceSource};
use cntkio::source::{CbfSource, Deserializer, SourceChunk};
use cntkio::{ChunkData, CtfReader, ElementType, Error, InputFile, Schema, StreamSpec};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rayon::prelude::*;
use std::ops::ControlFlow;
use std::sync::Arc;

/// The files a CBF deserializer reads: CBF, and Parquet or Arrow IPC in cntkio's Arrow mapping (told apart
/// by their magic bytes).
#[derive(Debug)]
enum Stored {
    Cbf(CbfSource),
    Arrow(ArrowSource),
}

impl Stored {
    /// Opens `path` with the deserializer's renames (and, for CBF, its other options).
    fn open(path: &std::path::Path, options: &CbfOptions) -> Result<Stored, Error> {
        Ok(match detect_format(path)? {
            Format::Parquet | Format::ArrowIpc => {
                let mut s = ArrowSource::open(path)?;
                for (from, to) in s.rename(&options.renames)? {
                    let p = path.display();
                    log::warn!(
                        "{p}: rename of stream \"{from}\" to \"{to}\" ignored: the file has no stream \"{from}\""
                    );
                }
                Stored::Arrow(s)
            }
            _ => Stored::Cbf(CbfSource::new(CbfFile::open_with(path, options)?)?),
        })
    }

    fn source(&self) -> &dyn Deserializer {
        match self {
            Stored::Cbf(c) => c,
            Stored::Arrow(a) => a,
        }
    }
}

/// A CBF (or Parquet, or Arrow IPC) file as a deserializer of the minibatch source, its streams converted
/// to the element type asked for (`precision`), if any.
#[derive(Debug)]
pub struct CbfDeserializer {
    source: Stored,
    streams: Vec<StreamSpec>,
    precision: Option<ElementType>,
}

impl SequenceSource for CbfDeserializer {
    fn chunks(&self) -> &[ChunkInfo] {
        self.source.source().chunks()
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        self.source.source().sequences(chunk, out)
    }
}

impl Deserializer for CbfDeserializer {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<ChunkData>, Error> {
        match &self.source {
            Stored::Cbf(c) => Ok(Arc::new(read_cbf_chunk(c.file(), chunk as usize, self.precision)?)),
            // Through the source, which checks the chunk holds the sequences it announced.
            Stored::Arrow(a) => match (a.load_chunk(chunk)?, self.precision) {
                (d, None) => Ok(d),
                (d, Some(t)) => {
                    let mut d = Arc::try_unwrap(d).unwrap_or_else(|shared| (*shared).clone());
                    cntkio_core::cbf::convert_element_type(&mut d, t);
                    Ok(Arc::new(d))
                }
            },
        }
    }
    fn load_source_chunk(&self, chunk: u32, spare: Option<SourceChunk>) -> Result<SourceChunk, Error> {
        let same_types =
            self.streams.iter().zip(self.source.source().streams()).all(|(a, b)| a.element_type == b.element_type);
        match &self.source {
            // The file's own element types: the records are kept undecoded and copied once, into the
            // minibatch (decoding the whole chunk first would copy every value twice).
            Stored::Cbf(c) if same_types => c.load_source_chunk(chunk, spare),
            _ => Ok(SourceChunk::from_data(self.load_chunk(chunk)?)),
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

/// `streams` with the element type asked for.
fn with_precision(mut streams: Vec<StreamSpec>, precision: Option<ElementType>) -> Vec<StreamSpec> {
    if let Some(t) = precision {
        for x in &mut streams {
            x.element_type = t;
        }
    }
    streams
}

/// The streams a CBF file delivers, with the element type asked for.
fn cbf_streams(file: &CbfFile, precision: Option<ElementType>) -> Result<Vec<StreamSpec>, Error> {
    Ok(with_precision(file.schema()?.streams().to_vec(), precision))
}

/// The streams a Parquet or Arrow IPC file delivers to a CBF deserializer: renamed, with the element type
/// asked for.
fn arrow_streams(
    file: &ArrowFile,
    options: &CbfOptions,
    precision: Option<ElementType>,
) -> Result<Vec<StreamSpec>, Error> {
    let mut streams = file.schema().streams().to_vec();
    cntkio_core::schema::rename_streams(streams.iter_mut().map(|s| &mut s.name).collect(), &options.renames)?;
    Ok(with_precision(streams, precision))
}

fn read_arrow_chunk(file: &ArrowFile, k: usize, precision: Option<ElementType>) -> Result<ChunkData, Error> {
    let mut d = file.read_chunk(k)?;
    if let Some(t) = precision {
        cntkio_core::cbf::convert_element_type(&mut d, t);
    }
    Ok(d)
}

/// Whether the file a CBF deserializer names is Parquet or Arrow IPC.
fn is_arrow(path: &std::path::Path) -> Result<bool, Error> {
    Ok(matches!(detect_format(path)?, Format::Parquet | Format::ArrowIpc))
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
                        let threads = cntkio::threads_or_cores(None);
                        let r = CtfReader::open_with(&path, &schema, &options, access, threads)
                            .map_err(|e| at_path(e, &path))?;
                        Reader { streams: schema.streams().to_vec(), inner: Inner::Ctf(Arc::new(r)) }
                    }
                    Spec::Cbf { path, options, precision } => {
                        let source = Stored::open(&path, &options).map_err(|e| at_path(e, &path))?;
                        let streams = with_precision(source.source().streams().to_vec(), precision);
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
            Inner::Cbf(c) => match &c.source {
                Stored::Cbf(s) => s.file().chunk_count(),
                Stored::Arrow(a) => a.file().chunk_count(),
            },
        }
    }

    /// `(sequences, samples)` of each chunk, from the index or the CBF chunk table.
    fn chunk_sizes(&self) -> Vec<(u64, u64)> {
        match &self.inner {
            Inner::Ctf(r) => r.chunks().iter().map(|c| (u64::from(c.num_sequences), c.num_samples)).collect(),
            Inner::Cbf(c) => match &c.source {
                Stored::Cbf(s) => {
                    s.file().chunks().iter().map(|c| (u64::from(c.num_sequences), u64::from(c.num_samples))).collect()
                }
                Stored::Arrow(a) => a.chunks().iter().map(|c| (u64::from(c.num_sequences), c.num_samples)).collect(),
            },
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
                        Inner::Cbf(c) => Ok(Arc::try_unwrap(c.load_chunk(i as u32)?).unwrap_or_else(|a| (*a).clone())),
                    }
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
    let streams = match from_dict(config)? {
        Spec::Ctf { schema, .. } => schema.streams().to_vec(),
        Spec::Cbf { path, options, precision } => py
            .detach(|| {
                if is_arrow(&path)? {
                    arrow_streams(&ArrowFile::open(&path)?, &options, precision)
                } else {
                    CbfFile::open_with(&path, &options).and_then(|f| cbf_streams(&f, precision))
                }
            })
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
    let nthreads = cntkio::threads_or_cores(threads);
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
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(nthreads)
                        .build()
                        .map_err(|e| Error::io("start reader threads", std::io::Error::other(e)))?;
                    let read_all = |n: usize, read: &(dyn Fn(usize) -> Result<ChunkData, Error> + Sync)| {
                        pool.install(|| (0..n).into_par_iter().map(read).collect::<Result<Vec<_>, _>>())
                    };
                    let (schema, chunks) = if is_arrow(&path).map_err(|e| at_path(e, &path))? {
                        let file = ArrowFile::open(&path)?;
                        let schema = Schema::new(arrow_streams(&file, &options, precision)?)?;
                        (schema, read_all(file.chunk_count(), &|k| read_arrow_chunk(&file, k, precision))?)
                    } else {
                        let file = CbfFile::open_with(&path, &options).map_err(|e| at_path(e, &path))?;
                        let schema = Schema::new(cbf_streams(&file, precision)?)?;
                        (schema, read_all(file.chunk_count(), &|k| read_cbf_chunk(&file, k, precision))?)
                    };
                    Ok(concat(ChunkData::new(&schema), chunks))
                }
            }
        })
        .map_err(py_err)?;
    chunk_to_py(py, data)
}
