//! A schema read off a CTF file's own rows, for checking a file whose schema the user did not give.

use crate::ctf::{index_streaming, locate_index_error, IndexConfig, IndexMode, SequenceDesc};
use crate::input::InputFile;
use crate::{Access, Error, Schema, StorageFormat, StreamSpec};
use cntkio_core::ctf::infer::Inferrer;
use std::path::Path;

/// The schema a CTF file's rows suggest: every input name it has, in order of first appearance, sparse if
/// any of its samples has an `index:value` entry (dim: the largest index + 1), else dense (dim: the most
/// values in a sample). One tolerant pass over the file (the sequences as CNTK's index finds them); the
/// [`Inferrer`] with what was seen is returned too. A file without any input name has no schema:
/// [`ErrorKind::NoStreams`](crate::ErrorKind::NoStreams).
pub fn infer_schema(file: &InputFile, skip_sequence_ids: bool) -> Result<(Schema, Inferrer), Error> {
    let inf = survey(file, skip_sequence_ids, &mut |_| {}, &mut |_| {})?.inferrer;
    Ok((schema_of(&inf)?, inf))
}

/// Bytes of a file's start that [`suggest_schema`] reads.
const SUGGEST_BYTES: usize = 4 << 20;

/// The schema the rows in the first 4 MiB of a CTF file suggest (made as [`infer_schema`] makes it from the
/// whole file), for an error that asks for a schema to show one: a quick look, whatever the file's size.
/// `None` if the file cannot be read or those rows name no input.
pub fn suggest_schema(path: &Path) -> Option<Schema> {
    let file = InputFile::open(path, Access::Read).ok()?;
    let mut buf = vec![0u8; SUGGEST_BYTES];
    let mut n = 0;
    while n < buf.len() {
        match file.read_some(n as u64, &mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    // Whole rows only: a row cut at the end of what was read could show a smaller dim or a cut name.
    let end = if n < buf.len() { n } else { memchr::memrchr(b'\n', &buf[..n])? + 1 };
    let mut inf = Inferrer::new();
    inf.add_sequence(&buf[..end]);
    schema_of(&inf).ok()
}

/// The schema of the inputs `inf` saw: sparse where a sample had `index:value` entries (dim: the largest
/// index + 1), else dense (dim: the most values in a sample).
fn schema_of(inf: &Inferrer) -> Result<Schema, Error> {
    let streams = inf
        .streams
        .iter()
        .map(|s| {
            let format = if s.is_sparse() { StorageFormat::Sparse } else { StorageFormat::Dense };
            StreamSpec::new(s.alias.clone(), usize::try_from(s.min_dim().max(1)).unwrap_or(usize::MAX), format)
        })
        .collect();
    Schema::new(streams)
}

/// What one pass over a CTF file saw (see [`survey`]).
pub(crate) struct Survey {
    /// How its rows are grouped into sequences.
    pub mode: IndexMode,
    /// Every sequence, fed to the inferrer.
    pub inferrer: Inferrer,
    /// Chunks of [`DEFAULT_CHUNK_SIZE`](crate::options::DEFAULT_CHUNK_SIZE) bytes.
    pub chunks: u64,
}

/// The one tolerant pass of [`infer_schema`] and [`inspect`](crate::inspect): the sequences as CNTK's index
/// finds them, each fed to an [`Inferrer`] and its length (rows) to `on_sequence`; `progress` gets the bytes
/// indexed so far.
pub(crate) fn survey(
    file: &InputFile,
    skip_sequence_ids: bool,
    on_sequence: &mut dyn FnMut(u32),
    progress: &mut dyn FnMut(u64),
) -> Result<Survey, Error> {
    let cfg = IndexConfig { skip_sequence_ids, main_alias: None, chunk_size: crate::options::DEFAULT_CHUNK_SIZE };
    let mut inferrer = Inferrer::new();
    let mut chunks = 0u64;
    let mut buf = Vec::new();
    let mode = index_streaming(
        file,
        &cfg,
        1,
        |c| {
            chunks += 1;
            file.with_bytes(c.offset, c.len_bytes as usize, &mut buf, |bytes| {
                add_sequences(&mut inferrer, bytes, c.offset, &c.sequences, &mut *on_sequence)
            })
        },
        progress,
    )
    .map_err(|e| locate_index_error(e, file))?;
    Ok(Survey { mode, inferrer, chunks })
}

/// Feeds `sequences` (of a file; `bytes` are the file's from byte `base`) to `inferrer`, each one's rows to
/// `on_sequence`. A sequence outside `bytes` is left out.
pub(crate) fn add_sequences<'a>(
    inferrer: &mut Inferrer,
    bytes: &[u8],
    base: u64,
    sequences: impl IntoIterator<Item = &'a SequenceDesc>,
    on_sequence: &mut dyn FnMut(u32),
) {
    for s in sequences {
        let a = (s.offset - base) as usize;
        if let Some(seq) = bytes.get(a..a + s.len_bytes as usize) {
            inferrer.add_sequence(seq);
            on_sequence(s.num_samples);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::infer_schema;
    use crate::{Access, InputFile, StorageFormat};

    #[test]
    fn infers_names_formats_and_dims() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.ctf");
        std::fs::write(&path, "0 |x 1 2 3 |y 4:1\n0 |x 1 2 |y 0:1 7:2\n1 |x 5 |# note\n").unwrap();
        let file = InputFile::open(&path, Access::Read).unwrap();
        let (schema, inf) = infer_schema(&file, false).unwrap();
        let got: Vec<(&str, usize, StorageFormat)> =
            schema.streams().iter().map(|s| (s.name.as_str(), s.dim, s.format)).collect();
        assert_eq!(got, [("x", 3, StorageFormat::Dense), ("y", 8, StorageFormat::Sparse)]);
        assert_eq!(inf.rows, 3);
    }

    #[test]
    fn a_suggestion_reads_whole_rows_of_the_first_4_mib_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.ctf");
        // Rows of 16 bytes, so that the 4 MiB boundary falls inside a row (a cut "|x 1 2" would be `x` of dim
        // 1, or a cut name); rows past the boundary have a wider `x` and an input of their own.
        let mut text = "0 |x 1 2 |yy 3:1\n".repeat((4 << 20) / 17 + 1);
        assert!(text.len() > 4 << 20 && (4 << 20) % 17 != 0);
        text.push_str("1 |x 1 2 3 4 |z 1\n");
        std::fs::write(&path, &text).unwrap();
        let s = super::suggest_schema(&path).unwrap();
        let got: Vec<(&str, usize, StorageFormat)> =
            s.streams().iter().map(|s| (s.name.as_str(), s.dim, s.format)).collect();
        assert_eq!(got, [("x", 2, StorageFormat::Dense), ("yy", 4, StorageFormat::Sparse)]);
        std::fs::write(&path, "0 |# only comments\n").unwrap();
        assert!(super::suggest_schema(&path).is_none());
        assert!(super::suggest_schema(&dir.path().join("missing.ctf")).is_none());
    }

    #[test]
    fn a_file_without_inputs_has_no_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.ctf");
        std::fs::write(&path, "0\n1 |# only comments\n").unwrap();
        let file = InputFile::open(&path, Access::Read).unwrap();
        let e = infer_schema(&file, false).unwrap_err();
        assert_eq!(e.code(), "E1001");
    }
}
