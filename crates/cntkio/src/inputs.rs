//! Input descriptions: one file and how to read it, whatever asked for it (the command line's flags, a
//! CNTK config, Python's deserializer configurations), opened as a [`Deserializer`].
//!
//! The format is told by the file's first bytes ([`detect_format`]); a CTF file needs a schema, which the
//! caller gives or the rows suggest ([`InputSpec::inferred`]). CBF, Parquet and Arrow IPC files carry
//! their streams.

use crate::arrow::{ArrowFile, ArrowSource};
use crate::cbf::{CbfFile, CbfOptions};
use crate::config::DeserializerConfig;
use crate::convert::{detect_format, Format};
use crate::source::{set_element_types, CbfSource, Deserializer, MultiSource};
use crate::{Access, CtfOptions, CtfReader, ElementType, Error, ErrorKind, InputFile, Schema, StreamSpec};
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

impl CtfInput {
    /// The CTF deserializer of a CNTK reader config, if `d` is one.
    pub fn of_config(d: &DeserializerConfig) -> Option<CtfInput> {
        match d {
            DeserializerConfig::Ctf { path, schema, options, .. } => {
                Some(CtfInput { path: path.clone(), schema: schema.clone(), options: options.clone() })
            }
            DeserializerConfig::Cbf { .. } => None,
        }
    }
}

/// A file that carries its streams (CBF, Parquet, Arrow IPC) and how to deliver them: CNTK's CBF
/// deserializer options.
#[derive(Debug, Clone)]
pub struct StoredInput {
    /// The file.
    pub path: PathBuf,
    /// Stream renames (`mmap` is [`InputSpec::open`]'s).
    pub options: CbfOptions,
    /// Every stream delivered as this element type (CNTK's `precision`; None: the file's).
    pub precision: Option<ElementType>,
}

impl StoredInput {
    /// `path` with its streams as stored.
    pub fn new(path: &Path) -> StoredInput {
        StoredInput { path: path.to_path_buf(), options: CbfOptions::default(), precision: None }
    }
}

/// One input file and how to read it.
#[derive(Debug, Clone)]
pub enum InputSpec {
    /// A CTF file and how to read it.
    Ctf(CtfInput),
    /// A CBF file (it carries its own streams).
    Cbf(StoredInput),
    /// A Parquet or Arrow IPC file in cntkio's Arrow mapping (it carries its own streams).
    Arrow(StoredInput),
}

/// `e` as it concerns the CTF input `path` (by its first bytes): where `e` asks for a schema, the error of a
/// file that is not CTF text either (the input's fault), else the same request with the schema the file's
/// first rows suggest ([`suggest_schema`](crate::ctf::suggest_schema)); any other error as it is.
pub fn explain_missing_schema(path: &Path, e: Error) -> Error {
    if !matches!(e.kind(), ErrorKind::NoStreams { suggestion: None }) {
        return e;
    }
    match crate::ctf::check_start(path) {
        Err(not_ctf) => not_ctf,
        Ok(()) => match crate::ctf::suggest_schema(path) {
            Some(s) => Error::new(ErrorKind::NoStreams { suggestion: Some(stream_flags(&s)) }),
            None => e,
        },
    }
}

/// `schema` as the command line's flags, `--stream NAME:DIM:dense|sparse[:ALIAS]` for each stream.
fn stream_flags(schema: &Schema) -> String {
    let flags: Vec<String> = schema.streams().iter().map(crate::validate::stream_arg).collect();
    flags.join(" ")
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
            Format::Cbf => InputSpec::Cbf(StoredInput::new(path)),
            Format::Parquet | Format::ArrowIpc => InputSpec::Arrow(StoredInput::new(path)),
            Format::Ctf => {
                let (schema, options) = ctf().map_err(|e| explain_missing_schema(path, e))?;
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

    /// A file that carries its streams, as CNTK's CBF deserializer reads it: Parquet or Arrow IPC by its
    /// first bytes, CBF otherwise (whose header then says what else it is).
    pub fn stored(input: StoredInput) -> Result<InputSpec, Error> {
        Ok(match detect_format(&input.path)? {
            Format::Parquet | Format::ArrowIpc => InputSpec::Arrow(input),
            Format::Cbf | Format::Ctf => InputSpec::Cbf(input),
        })
    }

    /// A deserializer of a CNTK reader config: a CTF file with its streams and options, or a file that
    /// carries its streams with the config's renames. The config's precision is not imposed on such a
    /// file: its streams keep their element types (CNTK refuses a file whose types differ).
    pub fn from_config(d: &DeserializerConfig) -> Result<InputSpec, Error> {
        let DeserializerConfig::Cbf { path, renames, .. } = d else {
            return Ok(InputSpec::Ctf(CtfInput::of_config(d).unwrap_or_else(|| unreachable!("a CTF deserializer"))));
        };
        let mut options = CbfOptions::default();
        for (name, in_file) in renames {
            options = options.rename(in_file.clone(), name.clone());
        }
        InputSpec::stored(StoredInput { path: path.clone(), options, precision: None })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            InputSpec::Ctf(i) => &i.path,
            InputSpec::Cbf(i) | InputSpec::Arrow(i) => &i.path,
        }
    }

    /// The streams the input delivers, read from the file's header or metadata where it carries them
    /// (renamed, with the element type asked for), without opening it as a deserializer.
    pub fn streams(&self) -> Result<Vec<StreamSpec>, Error> {
        let (mut streams, i) = match self {
            InputSpec::Ctf(i) => return Ok(i.schema.streams().to_vec()),
            InputSpec::Cbf(i) => {
                (CbfFile::open_with(&i.path, &i.options)?.streams().iter().map(|s| s.to_spec()).collect(), i)
            }
            InputSpec::Arrow(i) => {
                let mut streams = ArrowFile::open(&i.path)?.schema().streams().to_vec();
                let names = streams.iter_mut().map(|s| &mut s.name).collect();
                cntkio_core::schema::rename_streams(names, &i.options.renames)?;
                (streams, i)
            }
        };
        set_element_types(&mut streams, i.precision);
        Ok(streams)
    }

    /// The file as a deserializer: CTF indexed with `threads` threads; CTF and CBF read through a memory map
    /// when `mmap` says so, else ([`None`]) a CBF file is (its map guarded: a file that becomes shorter
    /// meanwhile gives an I/O error, not a `SIGBUS`) and a CTF file is read.
    pub fn open(&self, mmap: Option<bool>, threads: usize) -> Result<Arc<dyn Deserializer>, Error> {
        Ok(match self {
            InputSpec::Ctf(i) => {
                let access = if mmap == Some(true) { Access::Mmap } else { Access::Read };
                Arc::new(CtfReader::open_with(&i.path, &i.schema, &i.options, access, threads)?)
            }
            InputSpec::Cbf(i) => {
                let options = i.options.clone().mmap(mmap.unwrap_or(true));
                Arc::new(CbfSource::open_with(&i.path, &options)?.with_precision(i.precision))
            }
            InputSpec::Arrow(i) => {
                let mut source = ArrowSource::open(&i.path)?.with_precision(i.precision);
                for (from, to) in source.rename(&i.options.renames)? {
                    let p = i.path.display();
                    log::warn!(
                        "{p}: rename of stream \"{from}\" to \"{to}\" ignored: the file has no stream \"{from}\""
                    );
                }
                Arc::new(source)
            }
        })
    }
}

/// The inputs as one deserializer: several files are read one after the other ([`MultiSource`]).
pub fn open_all(inputs: &[InputSpec], mmap: Option<bool>, threads: usize) -> Result<Arc<dyn Deserializer>, Error> {
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
        let d = spec.open(Some(false), 1).unwrap();
        assert_eq!(d.streams()[0].name, "a");
        let two = open_all(&[spec.clone(), spec], Some(true), 2).unwrap();
        assert_eq!(two.chunks().iter().map(|c| c.num_sequences).sum::<u32>(), 4);

        let cbf = dir.path().join("data.ctf");
        std::fs::write(&cbf, cntkio_core::cbf::MAGIC.to_le_bytes()).unwrap();
        let mut never = || -> Result<(Schema, CtfOptions), Error> { panic!("a CBF file needs no schema") };
        assert!(matches!(InputSpec::detect(&cbf, &mut never).unwrap(), InputSpec::Cbf(i) if i.path == cbf));
    }

    #[test]
    fn a_file_that_is_not_ctf_text_is_its_own_error_not_a_missing_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        std::fs::write(&path, b"\xff\xfe0\x00 \x00|\x00").unwrap();
        let mut none = || Err(Error::new(ErrorKind::NoStreams { suggestion: None }));
        let e = InputSpec::detect(&path, &mut none).unwrap_err();
        assert_ne!(e.code(), "E1001", "{e}");
        let text = dir.path().join("t");
        std::fs::write(&text, "0 |a 1\n").unwrap();
        let e = InputSpec::detect(&text, &mut none).unwrap_err();
        assert_eq!(e.code(), "E1001");
        assert!(
            e.to_string().ends_with(
                "the file's first rows suggest --stream a:1:dense (each dim the largest seen there: use your model's)"
            ),
            "{e}"
        );
        let inferred = InputSpec::inferred(&text, &CtfOptions::default()).unwrap();
        assert!(matches!(inferred, InputSpec::Ctf(i) if i.schema.streams()[0].name == "a"));
    }

    #[test]
    fn a_stored_input_is_delivered_renamed_and_in_the_precision_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let ctf = dir.path().join("in.ctf");
        std::fs::write(&ctf, "0 |a 0.1 0.2\n1 |a 0.3 0.4\n").unwrap();
        let reader = CtfReader::open(&ctf, &schema(), &CtfOptions::default()).unwrap();
        let data = reader.load_chunk(0).unwrap();
        let cbf = dir.path().join("in.cbf");
        let mut w = crate::cbf::CbfWriter::create(&cbf, &schema(), 1 << 20).unwrap();
        w.write(&data).unwrap();
        w.finish().unwrap();

        let as_stored = StoredInput { path: cbf.clone(), options: CbfOptions::default(), precision: None };
        let plain = InputSpec::stored(as_stored.clone()).unwrap();
        assert!(matches!(plain, InputSpec::Cbf(_)));
        let renamed = StoredInput {
            options: CbfOptions::default().rename("a", "b"),
            precision: Some(ElementType::F64),
            ..as_stored
        };
        let spec = InputSpec::stored(renamed).unwrap();
        let streams = spec.streams().unwrap();
        assert_eq!((streams[0].name.as_str(), streams[0].element_type), ("b", ElementType::F64));
        for mmap in [false, true] {
            let d = spec.open(Some(mmap), 1).unwrap();
            assert_eq!(d.streams(), &streams[..]);
            let got = d.load_chunk(0).unwrap();
            let want: Vec<f64> = match &data.streams[0].values {
                cntkio_core::Values::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
                other => panic!("float data expected, found {other:?}"),
            };
            assert_eq!(got.streams[0].values, cntkio_core::Values::F64(want));
            assert_eq!(got.keys, data.keys);
        }
        let plain = plain.open(Some(false), 1).unwrap();
        assert_eq!(plain.streams()[0].element_type, ElementType::F32);
        assert_eq!(*plain.load_chunk(0).unwrap(), *data);
    }
}
