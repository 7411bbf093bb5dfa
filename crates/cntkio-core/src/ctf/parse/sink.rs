//! Where the parser's recoverable errors and warnings go: an [`ErrorSink`] decides whether to go on.

use crate::error::{Error, ErrorKind, WarningKind};

/// Receives recoverable errors and warnings while a chunk is parsed.
pub trait ErrorSink {
    /// A counted error. Return `Err` to stop parsing (the error is then returned by the parser).
    fn error(&mut self, e: Error) -> Result<(), Error>;
    /// Whether warnings should be built at all (they cost an allocation each).
    fn wants_warnings(&self) -> bool {
        false
    }
    /// A warning (not counted) at an absolute byte offset.
    fn warning(&mut self, _w: WarningKind, _byte: u64) {}
    /// An error CNTK always treats as fatal (a stream empty in a sequence). Return `Ok` to drop the
    /// sequence and go on (cntkio's `skip_bad_sequences`), `Err` to stop (CNTK's behaviour, the default).
    fn fatal(&mut self, e: Error) -> Result<(), Error> {
        Err(e)
    }
}

/// A sink that fails on the first error (CNTK's default `maxErrors = 0`).
#[derive(Debug, Default)]
pub struct FailFast;

impl ErrorSink for FailFast {
    fn error(&mut self, e: Error) -> Result<(), Error> {
        Err(Error::new(ErrorKind::MaxErrorsReached { max_errors: 0, last: Box::new(e) }))
    }
}

/// A sink that records up to `cap` errors (then stops) and, if asked, warnings.
#[derive(Debug, Default)]
pub struct Collect {
    /// Errors so far, in order.
    pub errors: Vec<Error>,
    /// Warnings so far (when enabled), with their byte offsets.
    pub warnings: Vec<(WarningKind, u64)>,
    /// Stop after this many errors.
    pub cap: usize,
    /// Record warnings.
    pub keep_warnings: bool,
    /// Set when the cap was reached.
    pub capped: bool,
}

impl Collect {
    /// Records up to `cap` errors.
    pub fn new(cap: usize, keep_warnings: bool) -> Collect {
        Collect { cap, keep_warnings, ..Collect::default() }
    }
}

impl ErrorSink for Collect {
    fn error(&mut self, e: Error) -> Result<(), Error> {
        self.errors.push(e);
        if self.errors.len() >= self.cap {
            self.capped = true;
            // The caller looks at `capped`; this value is only a marker.
            return Err(Error::new(ErrorKind::Limit {
                what: "errors recorded in one chunk".into(),
                value: self.errors.len() as u64,
                limit: self.cap as u64,
            }));
        }
        Ok(())
    }
    fn wants_warnings(&self) -> bool {
        self.keep_warnings
    }
    fn warning(&mut self, w: WarningKind, byte: u64) {
        if self.keep_warnings && self.warnings.len() < 10_000 {
            self.warnings.push((w, byte));
        }
    }
}
