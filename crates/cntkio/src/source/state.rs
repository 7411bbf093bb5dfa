//! A minibatch source's position, saved and restored (the checkpoint JSON).

use super::BpttState;
use crate::Error;
use serde::{Deserialize, Serialize};

/// A checkpoint of a [`MinibatchSource`]; see the module docs for its JSON form (version 1, or 2 with the
/// rows of truncated BPTT).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceState {
    /// Format version: [`SourceState::VERSION`], or [`SourceState::VERSION_BPTT`] with `bptt`.
    pub version: u32,
    /// Global sample position of the next sequence (CNTK's `minibatchSourcePosition`).
    pub position: u64,
    /// Minibatches returned before the checkpoint.
    pub minibatches: u64,
    /// The data's sweep size in samples.
    pub sweep_size: u64,
    /// Truncated BPTT: the sequences held in the rows (fetched, not yet wholly delivered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bptt: Option<BpttState>,
}

impl SourceState {
    /// The version of states without BPTT rows.
    pub const VERSION: u32 = 1;
    /// The version of states with BPTT rows.
    pub const VERSION_BPTT: u32 = 2;

    /// The state as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a state serializes")
    }

    /// Parses the JSON form. Errors: not JSON of this shape, or a version this library does not read
    /// (1 without BPTT rows, 2 with them).
    pub fn from_json(s: &str) -> Result<SourceState, Error> {
        let st: SourceState =
            serde_json::from_str(s).map_err(|e| Error::state(format!("not a minibatch source state: {e}")))?;
        st.check_version()?;
        Ok(st)
    }

    pub(super) fn check_version(&self) -> Result<(), Error> {
        let want = if self.bptt.is_some() { Self::VERSION_BPTT } else { Self::VERSION };
        if self.version != want {
            return Err(Error::state(format!(
                "minibatch source state version {} is not supported (this library reads version {} and, with BPTT rows, {})",
                self.version,
                Self::VERSION,
                Self::VERSION_BPTT
            )));
        }
        Ok(())
    }
}
