//! Input descriptions: one file and how to read it, whatever asked for it (the command line's flags, a
//! CNTK config, Python's deserializer configurations), opened as a [`Deserializer`].
//!
//! The format is told by the file's first bytes ([`detect_format`]); a CTF file needs a schema, which the
//! caller gives or the rows suggest ([`InputSpec::inferred`]). CBF, Parquet and Arrow IPC files carry
//! their streams.

use crate::arrow::ArrowSource;
use crate::cbf::CbfOptions;
use crate::convert::{detect_format, Format};
use crate::source::{CbfSource, Deserializer, MultiSource};
use crate::{Access, CtfOptions, CtfReader, Error, ErrorKind, InputFile, Schema};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A CTF file, its schema and its reading options.
#[derive(Debug, Clone)]
pub struct CtfInput {
    /// The file.
    pub path: PathBuf,
    /// Its streams.
    pub schema: Schema,
    /// Its options.
    pub options: CtfOptions,
}

/// One input file and how to read it.
#[derive(Debug, Clone)]
pub enum InputSpec {
    /// A CTF file and how to read it.
    Ctf(CtfInput),
    /// A CBF file (it carries its own streams).
    Cbf(PathBuf),
    /// A Parquet or Arrow IPC file in cntkio's Arrow mapping (it carries its own streams).
    Arrow(PathBuf),
}

impl InputSpec {
    /// `path` by its first bytes: a CTF file gets the schema and options `ctf` gives (asked only for CTF
    /// files). Where `ctf` fails for want of streams and the file is not CTF text either, the error says
    /// that (the input's fault) rather than ask for a schema.
    pub fn detect(
        path: &Path,
        ctf: &mut dyn FnMut() -> Result<(Schema, CtfOptions), Error>,
    ) -> Result<InputSpec, Error> {
        Ok(match detect_format(path)? {
            Format::Cbf => InputSpec::Cbf(path.to_path_buf()),
            Format::Parquet | Format::ArrowIpc => InputSpec::Arrow(path.to_path_buf()),
            Format::Ctf => {
                let (schema, options) = ctf().map_err(|e| match e.kind() {
                    ErrorKind::NoStreams => crate::ctf::check_start(path).err().unwrap_or(e),
                    _ => e,
                })?;
                InputSpec::Ctf(CtfInput { path: path.to_path_buf(), schema, options })
            }
        })
    }

    /// `path` by its first bytes, a CTF file with the schema its rows suggest
    /// ([`infer_schema`](crate::ctf::infer_schema)) and `options`.
    pub fn inferred(path: &Path, options: &CtfOptions) -> Result<InputSpec, Error> {
        let mut infer = || -> Result<(Schema, CtfOptions), Error> {
            let file = InputFile::open(path, Access::Read)?;
            let (schema, _) = crate::ctf::infer_schema(&file, options.skip_sequence_ids)?;
            Ok((schema, options.clone()))
        };
        InputSpec::detect(path, &mut infer)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            InputSpec::Ctf(i) => &i.path,
            InputSpec::Cbf(p) | InputSpec::Arrow(p) => p,
        }
    }

    /// The file as a deserializer: CTF indexed with `threads` threads, CTF and CBF read through a memory
    /// map when `mmap`.
    pub fn open(&self, mmap: bool, threads: usize) -> Result<Arc<dyn Deserializer>, Error> {
        Ok(match self {
            InputSpec::Ctf(i) if mmap => {
                Arc::new(CtfReader::open_with(&i.path, &i.schema, &i.options, Access::Mmap, threads)?)
            }
            InputSpec::Ctf(i) => Arc::new(CtfReader::open(&i.path, &i.schema, &i.options)?),
            InputSpec::Cbf(p) => Arc::new(CbfSource::open_with(p, &CbfOptions::default().mmap(mmap))?),
            InputSpec::Arrow(p) => Arc::new(ArrowSource::open(p)?),
        })
    }
}

/// The inputs as one deserializer: several files are read one after the other ([`MultiSource`]).
pub fn open_all(inputs: &[InputSpec], mmap: bool, threads: usize) -> Result<Arc<dyn Deserializer>, Error> {
    let mut parts = inputs.iter().map(|i| i.open(mmap, threads)).collect::<Result<Vec<_>, _>>()?;
    if parts.len() == 1 {
        return Ok(parts.pop().expect("one part"));
    }
    Ok(Arc::new(MultiSource::new(parts)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StorageFormat, StreamSpec};

    fn schema() -> Schema {
        Schema::new(vec![StreamSpec::new("a", 2, StorageFormat::Dense)]).unwrap()
    }

    #[test]
    fn the_format_comes_from_the_first_bytes_and_only_ctf_asks_for_a_schema() {
        let dir = tempfile::tempdir().unwrap();
        let ctf = dir.path().join("data.bin");
        std::fs::write(&ctf, "0 |a 1 2\n1 |a 3 4\n").unwrap();
        let mut asked = 0;
        let mut given = || {
            asked += 1;
            Ok((schema(), CtfOptions::default()))
        };
        let spec = InputSpec::detect(&ctf, &mut given).unwrap();
        assert!(matches!(&spec, InputSpec::Ctf(i) if i.schema.streams()[0].dim == 2 && i.path == ctf));
        assert_eq!(asked, 1);
        let d = spec.open(false, 1).unwrap();
        assert_eq!(d.streams()[0].name, "a");
        let two = open_all(&[spec.clone(), spec], true, 2).unwrap();
        assert_eq!(two.chunks().iter().map(|c| c.num_sequences).sum::<u32>(), 4);

        let cbf = dir.path().join("data.ctf");
        std::fs::write(&cbf, cntkio_core::cbf::MAGIC.to_le_bytes()).unwrap();
        let mut never = || -> Result<(Schema, CtfOptions), Error> { panic!("a CBF file needs no schema") };
        assert!(matches!(InputSpec::detect(&cbf, &mut never).unwrap(), InputSpec::Cbf(p) if p == cbf));
    }

    #[test]
    fn a_file_that_is_not_ctf_text_is_its_own_error_not_a_missing_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        std::fs::write(&path, b"\xff\xfe0\x00 \x00|\x00").unwrap();
        let mut none = || Err(Error::new(ErrorKind::NoStreams));
        let e = InputSpec::detect(&path, &mut none).unwrap_err();
        assert_ne!(e.code(), "E1001", "{e}");
        let text = dir.path().join("t");
        std::fs::write(&text, "0 |a 1\n").unwrap();
        assert_eq!(InputSpec::detect(&text, &mut none).unwrap_err().code(), "E1001");
        let inferred = InputSpec::inferred(&text, &CtfOptions::default()).unwrap();
        assert!(matches!(inferred, InputSpec::Ctf(i) if i.schema.streams()[0].name == "a"));
    }
}
