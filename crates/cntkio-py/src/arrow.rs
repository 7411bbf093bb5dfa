//! Arrow data for Python through the Arrow PyCapsule interface (`__arrow_c_stream__`,
//! `__arrow_c_schema__`): record batches in cntkio's Arrow mapping, built by the library
//! ([`ChunkBatches`]), exported as an `ArrowArrayStream` that pyarrow, polars and DuckDB import without
//! copying the values.

use crate::errors::py_err;
use arrow_array::ffi::FFI_ArrowSchema;
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_array::{RecordBatch, RecordBatchIterator, RecordBatchReader};
use cntkio::arrow::arrow_schema::{ArrowError, SchemaRef};
use cntkio::arrow::{ChunkBatches, Rows};
use cntkio::source::Deserializer;
use cntkio::Error;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::CString;
use std::ops::Range;
use std::sync::Arc;

/// What a stream hands out.
enum Batches {
    /// Chunks of a source, loaded one at a time as the consumer asks for them (each export starts again
    /// from the first).
    Lazy { source: Arc<dyn Deserializer>, chunks: Option<Range<u32>>, rows: Rows },
    /// Batches already read (each export shares their buffers).
    Loaded(Vec<RecordBatch>),
}

/// Record batches in cntkio's Arrow mapping, for any consumer of the Arrow PyCapsule interface:
/// `pyarrow.table(s)`, `polars.DataFrame(s)`, DuckDB's `FROM s`. Each `__arrow_c_stream__` call exports
/// the batches anew.
#[pyclass(module = "cntkio._native", frozen)]
pub struct ArrowStream {
    batches: Batches,
    schema: SchemaRef,
}

impl ArrowStream {
    /// The chunks `chunks` (all: `None`) of `source`, loaded on demand. Errors: a range outside the chunks.
    pub fn lazy(source: Arc<dyn Deserializer>, chunks: Option<Range<u32>>, rows: Rows) -> Result<ArrowStream, Error> {
        let schema = Arc::clone(ChunkBatches::new(Arc::clone(&source), chunks.clone(), rows)?.schema());
        Ok(ArrowStream { batches: Batches::Lazy { source, chunks, rows }, schema })
    }

    /// The chunks `chunks` of `source`, read now (in parallel where the order of loading cannot matter).
    pub fn loaded(source: Arc<dyn Deserializer>, chunks: Option<Range<u32>>, rows: Rows) -> Result<ArrowStream, Error> {
        let b = ChunkBatches::new(source, chunks, rows)?;
        let schema = Arc::clone(b.schema());
        Ok(ArrowStream { batches: Batches::Loaded(b.read_all()?), schema })
    }
}

/// A reader whose batches are loaded where rayon works in this process (see [`crate::pool`]): consumers
/// call it from their own threads, maybe in a forked worker.
struct InPool(ChunkBatches);

impl Iterator for InPool {
    type Item = Result<RecordBatch, ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        let inner = &mut self.0;
        crate::pool::run(move || inner.next())
    }
}

impl RecordBatchReader for InPool {
    fn schema(&self) -> SchemaRef {
        Arc::clone(self.0.schema())
    }
}

fn capsule_name(name: &str) -> CString {
    CString::new(name).expect("a capsule name has no NUL byte")
}

#[pymethods]
impl ArrowStream {
    /// The batches as an `ArrowArrayStream` in a capsule named "arrow_array_stream". `requested_schema`
    /// is accepted as the interface asks; the batches always come in the mapping's schema (consumers
    /// cast if they need another).
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let reader: Box<dyn RecordBatchReader + Send> = match &self.batches {
            Batches::Lazy { source, chunks, rows } => {
                Box::new(InPool(ChunkBatches::new(Arc::clone(source), chunks.clone(), *rows).map_err(py_err)?))
            }
            Batches::Loaded(b) => {
                Box::new(RecordBatchIterator::new(b.clone().into_iter().map(Ok), Arc::clone(&self.schema)))
            }
        };
        PyCapsule::new(py, FFI_ArrowArrayStream::new(reader), Some(capsule_name("arrow_array_stream")))
    }

    /// The mapping's Arrow schema in a capsule named "arrow_schema".
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let s = FFI_ArrowSchema::try_from(self.schema.as_ref())
            .map_err(|e| py_err(Error::internal(format!("exporting an Arrow schema: {e}"))))?;
        PyCapsule::new(py, s, Some(capsule_name("arrow_schema")))
    }

    /// Rows in the batches read (`None` for a stream that loads its chunks on demand).
    #[getter]
    fn num_rows(&self) -> Option<usize> {
        match &self.batches {
            Batches::Loaded(b) => Some(b.iter().map(RecordBatch::num_rows).sum()),
            Batches::Lazy { .. } => None,
        }
    }
}
