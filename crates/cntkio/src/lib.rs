//! cntkio
#![deny(missing_docs)]
pub use cntkio_core as core_formats;
