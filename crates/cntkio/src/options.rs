//! Options of the CTF deserializer (CNTK's config keys, CTF.md §10).

/// CNTK's default `chunkSizeInBytes`: 32 MiB.
pub const DEFAULT_CHUNK_SIZE: u64 = 32 << 20;

/// Options of a CTF deserializer. Precision lives in the schema (each stream's element type).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CtfOptions {
    /// Errors tolerated before reading fails (`maxErrors`, default 0: the first error is fatal).
    pub max_errors: u64,
    /// Read every row as its own sequence, ignoring ids (`skipSequenceIds`).
    pub skip_sequence_ids: bool,
    /// Upper bound of a chunk's byte span (`chunkSizeInBytes`, default 32 MiB).
    pub chunk_size: u64,
    /// Keep the index in a cache file beside the input and reuse it (`cacheIndex`).
    pub cache_index: bool,
    /// Keep parsed chunks in memory once loaded (`keepDataInMemory`).
    pub keep_data_in_memory: bool,
    /// Frame mode: every sequence must be one sample (`frameMode`).
    pub frame_mode: bool,
    /// CNTK's `traceLevel` (0 errors, 1 warnings, 2 info); cntkio uses it to decide what to log.
    pub trace_level: u32,
}

impl Default for CtfOptions {
    fn default() -> Self {
        CtfOptions {
            max_errors: 0,
            skip_sequence_ids: false,
            chunk_size: DEFAULT_CHUNK_SIZE,
            cache_index: false,
            keep_data_in_memory: false,
            frame_mode: false,
            trace_level: 1,
        }
    }
}
