//! The keys each reader and deserializer reads, for warnings about the others.

pub(super) const COMMON_READER_KEYS: &[&str] =
    &["readerType", "precision", "verbosity", "prefetch", "action", "nbruttsineachrecurrentiter"];
pub(super) const LEGACY_CTF_KEYS: &[&str] = &[
    "file",
    "input",
    "randomize",
    "randomizationWindow",
    "sampleBasedRandomizationWindow",
    "randomizationSeed",
    "skipSequenceIds",
    "maxErrors",
    "traceLevel",
    "chunkSizeInBytes",
    "cacheIndex",
    "keepDataInMemory",
    "frameMode",
];
pub(super) const LEGACY_CBF_KEYS: &[&str] = &[
    "file",
    "input",
    "randomize",
    "randomizationWindow",
    "sampleBasedRandomizationWindow",
    "randomizationSeed",
    "keepDataInMemory",
    "traceLevel",
    "frameMode", // warned about separately
];
pub(super) const COMPOSITE_KEYS: &[&str] = &[
    "deserializers",
    "randomize",
    "randomizationWindow",
    "sampleBasedRandomizationWindow",
    "randomizationSeed",
    "frameMode",
    "truncated",
    "truncationLength",
    "rightSplice",
    "maxErrors",
    "multiThreadedDeserialization",
    "useNumericSequenceKeys",
    "hashSequenceKeys",
    "checkData",
    "localTimeline",
    "traceLevel",
    "chunkSizeInBytes",
];
pub(super) const CTF_DESERIALIZER_KEYS: &[&str] = &[
    "type",
    "module",
    "file",
    "input",
    "precision",
    "skipSequenceIds",
    "maxErrors",
    "traceLevel",
    "chunkSizeInBytes",
    "cacheIndex",
    "keepDataInMemory",
    "frameMode",
    "composable",
];
pub(super) const CBF_DESERIALIZER_KEYS: &[&str] =
    &["type", "module", "file", "input", "precision", "traceLevel", "keepDataInMemory", "composable"];
pub(super) const CTF_INPUT_KEYS: &[&str] = &["dim", "format", "alias", "definesMBSize"];
pub(super) const CBF_INPUT_KEYS: &[&str] = &["alias", "dim", "format", "definesMBSize"];

/// Levenshtein distance, case-insensitive (for "did you mean").
pub(super) fn distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(&a.to_lowercase(), &b.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_ignores_case() {
        assert_eq!(distance("randomise", "randomize"), 1);
        assert_eq!(distance("RANDOMIZE", "randomize"), 0);
    }
}
