//! A schema read off a CTF file's own rows, for checking a file whose schema the user did not give.

use crate::ctf::{index_streaming, locate_index_error, IndexConfig, IndexMode, SequenceDesc};
use crate::input::InputFile;
use crate::{Error, Schema, StorageFormat, StreamSpec};
use cntkio_core::ctf::infer::Inferrer;

/// The schema a CTF file's rows suggest: every input name it has, in order of first appearance, sparse if
/// any of its samples has an `index:value` entry (dim: the largest index + 1), else dense (dim: the most
/// values in a sample). One tolerant pass over the file (the sequences as CNTK's index finds them); the
/// [`Inferrer`] with what was seen is returned too. A file without any input name has no schema:
/// [`ErrorKind::NoStreams`](crate::ErrorKind::NoStreams).
pub fn infer_schema(file: &InputFile, skip_sequence_ids: bool) -> Result<(Schema, Inferrer), Error> {
    let inf = survey(file, skip_sequence_ids, &mut |_| {}, &mut |_| {})?.inferrer;
    let streams = inf
        .streams
        .iter()
        .map(|s| {
            let format = if s.is_sparse() { StorageFormat::Sparse } else { StorageFormat::Dense };
            StreamSpec::new(s.alias.clone(), usize::try_from(s.min_dim().max(1)).unwrap_or(usize::MAX), format)
        })
        .collect();
    Ok((Schema::new(streams)?, inf))
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
    fn a_file_without_inputs_has_no_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.ctf");
        std::fs::write(&path, "0\n1 |# only comments\n").unwrap();
        let file = InputFile::open(&path, Access::Read).unwrap();
        let e = infer_schema(&file, false).unwrap_err();
        assert_eq!(e.code(), "E1001");
    }
}
