//! Streams and schemas: what a reader is told to find in a file.

use crate::error::{Error, ErrorKind};

/// The element type of a stream's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// 32-bit IEEE float (CNTK's `precision = "float"`, the default).
    F32,
    /// 64-bit IEEE float (CNTK's `precision = "double"`).
    F64,
}

impl ElementType {
    /// Size of one value in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            ElementType::F32 => 4,
            ElementType::F64 => 8,
        }
    }
    /// CNTK's name: `float` or `double`.
    pub fn cntk_name(self) -> &'static str {
        match self {
            ElementType::F32 => "float",
            ElementType::F64 => "double",
        }
    }
    /// Parses CNTK's `precision` value (`float` / `double`, any case).
    pub fn parse(s: &str) -> Option<ElementType> {
        if s.eq_ignore_ascii_case("float") || s.eq_ignore_ascii_case("f32") {
            Some(ElementType::F32)
        } else if s.eq_ignore_ascii_case("double") || s.eq_ignore_ascii_case("f64") {
            Some(ElementType::F64)
        } else {
            None
        }
    }
}

/// How a stream's samples are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageFormat {
    /// `dim` values per sample.
    Dense,
    /// `index:value` entries per sample (CSC / CSR).
    Sparse,
}

impl StorageFormat {
    /// `dense` or `sparse`.
    pub fn name(self) -> &'static str {
        match self {
            StorageFormat::Dense => "dense",
            StorageFormat::Sparse => "sparse",
        }
    }
}

/// One configured input stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamSpec {
    /// The stream's name (CNTK's input name; what CBF stores and what outputs are keyed by).
    pub name: String,
    /// The name written in a CTF file after `|` (defaults to `name`).
    pub alias: String,
    /// Sample dimension (number of values of a dense sample, index range of a sparse one).
    pub dim: usize,
    /// Dense or sparse.
    pub format: StorageFormat,
    /// Element type of the values.
    pub element_type: ElementType,
    /// Whether this stream's sample count defines a sequence's length (CNTK's `definesMBSize`).
    pub defines_mb_size: bool,
}

impl StreamSpec {
    /// A stream whose alias equals its name, f32, not defining the minibatch size.
    pub fn new(name: impl Into<String>, dim: usize, format: StorageFormat) -> StreamSpec {
        let name = name.into();
        StreamSpec { alias: name.clone(), name, dim, format, element_type: ElementType::F32, defines_mb_size: false }
    }
    /// Sets the alias.
    pub fn alias(mut self, alias: impl Into<String>) -> Self {
        self.alias = alias.into();
        self
    }
    /// Sets the element type.
    pub fn element_type(mut self, t: ElementType) -> Self {
        self.element_type = t;
        self
    }
    /// Marks the stream as the one defining the sequence length.
    pub fn defines_mb_size(mut self, yes: bool) -> Self {
        self.defines_mb_size = yes;
        self
    }
    /// True for sparse streams.
    pub fn is_sparse(&self) -> bool {
        self.format == StorageFormat::Sparse
    }
}

/// The largest sparse dimension CNTK accepts (indices are stored as `i32`).
pub const MAX_SPARSE_DIM: usize = i32::MAX as usize;
/// The largest dense dimension cntkio accepts (one sample must stay addressable).
pub const MAX_DENSE_DIM: usize = u32::MAX as usize;

/// A validated list of streams.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema {
    streams: Vec<StreamSpec>,
    main: Option<usize>,
}

impl Schema {
    /// Validates the streams as CNTK does: at least one, non-empty unique names and aliases, at most one
    /// `definesMBSize`, sparse dims that fit an `i32`.
    pub fn new(streams: Vec<StreamSpec>) -> Result<Schema, Error> {
        if streams.is_empty() {
            return Err(Error::new(ErrorKind::NoStreams { suggestion: None }));
        }
        let mut main = None;
        let mut mains = Vec::new();
        for (i, s) in streams.iter().enumerate() {
            if s.name.is_empty() {
                return Err(Error::new(ErrorKind::InvalidStream {
                    stream: s.name.clone(),
                    reason: "the stream name is empty".into(),
                }));
            }
            if s.alias.is_empty() {
                return Err(Error::new(ErrorKind::InvalidStream {
                    stream: s.name.clone(),
                    reason: "the alias is empty".into(),
                }));
            }
            if s.alias.bytes().any(|b| b <= b' ' || b == b'|' || b >= 0x7f) {
                return Err(Error::new(ErrorKind::InvalidStream {
                    stream: s.name.clone(),
                    reason: format!(
                        "the alias {:?} contains a space, '|' or a non-printable byte, so no CTF file can use it",
                        s.alias
                    ),
                }));
            }
            match s.format {
                StorageFormat::Sparse if s.dim > MAX_SPARSE_DIM => {
                    return Err(Error::new(ErrorKind::InvalidStream {
                        stream: s.name.clone(),
                        reason: format!("sparse dim {} exceeds {}", s.dim, MAX_SPARSE_DIM),
                    }))
                }
                StorageFormat::Dense if s.dim > MAX_DENSE_DIM => {
                    return Err(Error::new(ErrorKind::InvalidStream {
                        stream: s.name.clone(),
                        reason: format!("dense dim {} exceeds {}", s.dim, MAX_DENSE_DIM),
                    }))
                }
                _ => {}
            }
            for t in &streams[..i] {
                if t.alias == s.alias {
                    return Err(Error::new(ErrorKind::DuplicateAlias {
                        alias: s.alias.clone(),
                        first: t.name.clone(),
                        second: s.name.clone(),
                    }));
                }
                if t.name == s.name {
                    return Err(Error::new(ErrorKind::InvalidStream {
                        stream: s.name.clone(),
                        reason: "two streams have this name".into(),
                    }));
                }
            }
            if s.defines_mb_size {
                main = Some(i);
                mains.push(s.name.clone());
            }
        }
        if mains.len() > 1 {
            return Err(Error::new(ErrorKind::SeveralMainStreams { streams: mains }));
        }
        Ok(Schema { streams, main })
    }

    /// The streams, in the order given.
    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    /// Number of streams.
    pub fn len(&self) -> usize {
        self.streams.len()
    }
    /// Never true for a valid schema; present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
    /// Index of the stream marked `definesMBSize`, if any.
    pub fn main_stream(&self) -> Option<usize> {
        self.main
    }
    /// The stream with this name.
    pub fn by_name(&self, name: &str) -> Option<usize> {
        self.streams.iter().position(|s| s.name == name)
    }
    /// The stream with this alias.
    pub fn by_alias(&self, alias: &[u8]) -> Option<usize> {
        self.streams.iter().position(|s| s.alias.as_bytes() == alias)
    }
    /// Returns a copy with every stream's element type set to `t`.
    pub fn with_element_type(&self, t: ElementType) -> Schema {
        let mut s = self.clone();
        for st in &mut s.streams {
            st.element_type = t;
        }
        s
    }
}

/// Renames streams as CNTK's CBF deserializer does (`input = [ newName = [ alias = "nameInFile" ] ]`,
/// CBF.md §5): each `(name_in_file, new_name)` pair renames every stream of `names` called
/// `name_in_file` (matched against the names before any rename). Returns the pairs that match no stream
/// (CNTK ignores them silently). The resulting names must be unique
/// ([`ErrorKind::InvalidStream`] otherwise): CNTK refuses two streams
/// with one name when it builds its packer.
pub fn rename_streams(
    mut names: Vec<&mut String>,
    renames: &[(String, String)],
) -> Result<Vec<(String, String)>, Error> {
    let mut unused = Vec::new();
    let originals: Vec<String> = names.iter().map(|n| (**n).clone()).collect();
    for (from, to) in renames {
        let mut used = false;
        for (name, orig) in names.iter_mut().zip(&originals) {
            if orig == from {
                **name = to.clone();
                used = true;
            }
        }
        if !used {
            unused.push((from.clone(), to.clone()));
        }
    }
    for (i, n) in names.iter().enumerate() {
        if names[..i].iter().any(|m| **m == **n) {
            return Err(Error::new(ErrorKind::InvalidStream {
                stream: (**n).clone(),
                reason: "two streams have this name; rename one of them".into(),
            }));
        }
    }
    Ok(unused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_duplicate_alias_and_two_mains() {
        let a = StreamSpec::new("a", 1, StorageFormat::Dense).alias("x");
        let b = StreamSpec::new("b", 1, StorageFormat::Dense).alias("x");
        let e = Schema::new(vec![a.clone(), b]).unwrap_err();
        assert_eq!(e.code(), "E1003");
        let b = StreamSpec::new("b", 1, StorageFormat::Dense).defines_mb_size(true);
        let e = Schema::new(vec![a.defines_mb_size(true), b]).unwrap_err();
        assert!(e.to_string().contains("Only a single stream"), "{e}");
    }

    #[test]
    fn rejects_bad_alias_and_big_sparse_dim() {
        let a = StreamSpec::new("a", 1, StorageFormat::Dense).alias("x y");
        assert!(Schema::new(vec![a]).is_err());
        let a = StreamSpec::new("a", MAX_SPARSE_DIM + 1, StorageFormat::Sparse);
        assert!(Schema::new(vec![a]).is_err());
        assert!(Schema::new(vec![]).is_err());
    }
}
