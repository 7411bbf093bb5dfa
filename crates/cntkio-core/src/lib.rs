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

/// Building blocks that the `cntkio` crate (and the fuzz targets) assemble in their own way: the pieces of the
/// CTF index pass and the checks behind the CBF writer's fast paths. Not part of the API: they may change
/// with any release.
#[doc(hidden)]
pub mod internal {
    pub use crate::cbf::{
        check_chunk_fast, check_parsed_chunk_fast, encode_checked_record_to, encode_checked_records_to,
    };
    pub use crate::ctf::index::{
        bom_len, check_first_id, is_utf16_bom, select_mode, skip_space, BlockScan, Chunker, LocatedSequence,
        RowScanner, Run, SequenceAssembler,
    };
}

pub use data::{ChunkData, Column, Entry, Keys, Layout, Lengths, Sizes, StreamData, Values};
pub use error::{Category, Error, ErrorKind, Position, WarningKind};
pub use schema::{ElementType, Schema, StorageFormat, StreamSpec};
