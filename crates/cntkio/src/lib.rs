//! cntkio: read, validate, convert and train from CNTK Text Format (CTF) and CNTK Binary Format (CBF) data.
#![deny(missing_docs)]

pub use cntkio_core::{
    data::{ChunkData, Column, Entry, Keys, Layout, Lengths, StreamData, Values},
    error::{Category, Error, ErrorKind, Position, WarningKind},
    schema::{ElementType, Schema, StorageFormat, StreamSpec},
};

pub mod arrow;
pub mod cbf;
pub mod compress;
pub mod config;
mod conversion;
pub mod convert;
pub mod inspect;
pub mod options;
pub mod randomize;
pub mod source;
pub mod stats;
pub mod suggest;
pub mod validate;
pub use options::CtfOptions;

pub mod ctf;
mod hint;
pub mod input;
pub mod inputs;
mod length_stats;
mod mmap;
pub use mmap::rearm_map_guard;
mod output;
pub mod remote;

pub use compress::Compression;
pub use ctf::{CtfIndex, CtfReader};
pub use input::{Access, InputFile};
pub use inputs::{CtfInput, InputSpec, StoredInput};

/// The error of a pass stopped by its caller's `cancel` hook ([`convert::Hooks::cancel`],
/// [`validate::ValidateOptions::cancel`]): an I/O error of kind
/// [`Interrupted`](std::io::ErrorKind::Interrupted).
pub fn interrupted() -> Error {
    Error::io("interrupted", std::io::Error::from(std::io::ErrorKind::Interrupted))
}

/// A thread count asked for: `threads` when given and not 0, else one per core.
pub fn threads_or_cores(threads: Option<usize>) -> usize {
    threads.filter(|&t| t > 0).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// [`interrupted`] if `cancel` says to stop.
pub(crate) fn check_cancel(cancel: Option<fn() -> bool>) -> Result<(), Error> {
    match cancel {
        Some(f) if f() => Err(interrupted()),
        _ => Ok(()),
    }
}

/// The message of a caught panic (`""` when it carries none).
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}
