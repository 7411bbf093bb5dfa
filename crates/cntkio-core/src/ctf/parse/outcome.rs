//! What reading one sample's values gives the parser: where it ended and what it noted, or why it failed.

use crate::error::ErrorKind;
use crate::number::{NumberError, NumberErrorKind};

#[inline]
pub(super) fn skip_to_next(s: &[u8], from: usize) -> usize {
    match memchr::memchr2(b'|', b'\n', s.get(from..).unwrap_or(&[])) {
        Some(k) => from + k,
        None => s.len(),
    }
}

#[derive(Debug)]
pub(super) enum DenseNote {
    None,
    Short(u64),
    LongAtEnd(u64),
}

pub(super) struct Done {
    pub(super) end: usize,
    pub(super) note: DenseNote,
}

pub(super) enum FailKind {
    Number(NumberError),
    TooMany(u64),
    EmptyDenseAtEnd,
    IndexExpected(Option<u8>),
    IndexOverflow,
    IndexRange(u64),
    Colon(u64, Option<u8>),
    SparseAtEnd,
}

pub(super) struct Fail {
    pub(super) at: usize,
    pub(super) kind: FailKind,
}

impl Fail {
    pub(super) fn into_kind(self, stream: &str, dim: usize) -> ErrorKind {
        let stream = stream.to_string();
        match self.kind {
            FailKind::Number(e) => match e.kind {
                NumberErrorKind::InvalidStart => ErrorKind::InvalidNumber { stream, found: e.found },
                NumberErrorKind::SignWithoutDigits => ErrorKind::SignWithoutDigits { stream, found: e.found },
                NumberErrorKind::ExponentWithoutDigits => ErrorKind::ExponentWithoutDigits { stream, found: e.found },
            },
            FailKind::TooMany(count) => ErrorKind::DenseTooManyValues { stream, count, dim },
            FailKind::EmptyDenseAtEnd => ErrorKind::EmptyDenseAtEnd { stream },
            FailKind::IndexExpected(found) => ErrorKind::SparseIndexExpected { stream, found },
            FailKind::IndexOverflow => ErrorKind::SparseIndexOverflow { stream },
            FailKind::IndexRange(index) => ErrorKind::SparseIndexOutOfRange { stream, index, dim },
            FailKind::Colon(index, found) => ErrorKind::SparseMissingColon { stream, index, found },
            FailKind::SparseAtEnd => ErrorKind::SparseAtEnd { stream },
        }
    }
}
