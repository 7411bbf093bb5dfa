//! cntkio: read, validate, convert and train from CNTK Text Format (CTF) and CNTK Binary Format (CBF) data.
#![deny(missing_docs)]

pub use cntkio_core::{
    data::{ChunkData, Layout, StreamData, Values},
    error::{Category, Error, ErrorKind, Position, WarningKind},
    schema::{ElementType, Schema, StorageFormat, StreamSpec},
};

pub mod cbf;
pub mod config;
pub mod convert;
pub mod options;
pub mod randomize;
pub mod source;
pub mod validate;
pub use options::CtfOptions;

pub mod ctf;
mod hint;
pub mod input;
mod mmap;
mod output;

pub use ctf::{CtfIndex, CtfReader};
pub use input::{Access, InputFile};
