//! Pure parsers and codecs for CNTK's data formats: bytes in, values out. No files, no threads.
//!
//! ```
//! use cntkio_core::{ctf::parse::{parse_bytes, FailFast}, Schema, StreamSpec, StorageFormat};
//! let schema = Schema::new(vec![
//!     StreamSpec::new("features", 3, StorageFormat::Dense).alias("x"),
//!     StreamSpec::new("labels", 4, StorageFormat::Sparse).alias("y"),
//! ]).unwrap();
//! let data = parse_bytes(b"0 |x 1 2 3 |y 2:1\n", &schema, false, &mut FailFast).unwrap();
//! assert_eq!(data.keys, vec![0]);
//! assert_eq!(data.streams[0].values, cntkio_core::Values::F32(vec![1.0, 2.0, 3.0]));
//! ```
// Audited exceptions, each with its invariant: the SSE2 byte masks of the CTF parser
// (`ctf::parse::byte_mask_sse2`) and its AVX-512 paths (`ctf::simd`).
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod cbf;
pub mod ctf;
pub mod data;
pub mod error;
pub mod number;
pub mod schema;
#[cfg(test)]
mod test_rng;

pub use data::{ChunkData, Layout, Sizes, StreamData, Values};
pub use error::{Category, Error, ErrorKind, Position, WarningKind};
pub use schema::{ElementType, Schema, StorageFormat, StreamSpec};
