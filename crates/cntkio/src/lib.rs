//! cntkio: read, validate, convert and train from CNTK Text Format (CTF) and CNTK Binary Format (CBF) data.
#![deny(missing_docs)]

pub use cntkio_core::{
    data::{ChunkData, Layout, StreamData, Values},
    error::{Category, Error, ErrorKind, Position, WarningKind},
    schema::{ElementType, Schema, StorageFormat, StreamSpec},
};

pub mod cbf;
mod mmap;
pub mod options;
pub use options::CtfOptions;
