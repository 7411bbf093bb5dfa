//! One conversion as a front end describes it ([`Conversion`]): the input's format told by its first bytes,
//! the output's by its name, and the options of every route in one place.

use crate::arrow::{
    arrow_to_arrow, arrow_to_cbf, arrow_to_ctf, cbf_to_arrow, ctf_to_arrow, ArrowFormat, ArrowToCbf, ArrowToCtf,
    ParquetCompression, ToArrow,
};
use crate::cbf::{CbfOptions, CbfWriterOptions};
use crate::compress::OutputCompression;
use crate::convert::{cbf_to_ctf, ctf_to_cbf, detect_format, CbfToCtf, ConvertSummary, CtfToCbf, Format, Hooks};
use crate::ctf::ScanOptions;
use crate::{Access, CtfInput, Error};
use std::path::{Path, PathBuf};

/// What a conversion writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// CNTK Text Format (compressed when its name ends in `.zst` or `.gz`).
    Ctf,
    /// CNTK Binary Format.
    Cbf,
    /// Parquet or Arrow IPC in cntkio's Arrow mapping.
    Arrow(ArrowFormat),
}

impl Target {
    /// What `output` names, for an input of format `from`: `.parquet`/`.arrow` (and their aliases, see
    /// [`ArrowFormat::from_extension`]) the Arrow mapping; from Parquet or Arrow, `.ctf`/`.txt` CTF and
    /// `.cbf`/`.bin` CBF (the format's extension before a compression's: `OUT.ctf.zst`); otherwise CTF
    /// becomes CBF and CBF becomes CTF. Errors: a file in the mapping to an output that names no format.
    pub fn of(from: Format, output: &Path) -> Result<Target, Error> {
        if let Some(f) = ArrowFormat::from_extension(output) {
            return Ok(Target::Arrow(f));
        }
        Ok(match from {
            Format::Ctf => Target::Cbf,
            Format::Cbf => Target::Ctf,
            Format::Parquet | Format::ArrowIpc => {
                let named = match OutputCompression::from_path(output) {
                    Some(_) => Path::new(output.file_stem().unwrap_or_default()),
                    None => output,
                };
                let ext = named.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase());
                match ext.as_deref() {
                    Some("ctf" | "txt") => Target::Ctf,
                    Some("cbf" | "bin") => Target::Cbf,
                    _ => {
                        return Err(Error::option_value(
                            "output",
                            output.display().to_string(),
                            "has no extension that names a format: use .ctf or .txt (CTF), .cbf or .bin (CBF), \
                             .parquet, or .arrow",
                        ))
                    }
                }
            }
        })
    }

    /// `CTF`, `CBF`, `Parquet` or `Arrow IPC`.
    pub fn title(self) -> &'static str {
        match self {
            Target::Ctf => Format::Ctf.title(),
            Target::Cbf => Format::Cbf.title(),
            Target::Arrow(ArrowFormat::Parquet) => Format::Parquet.title(),
            Target::Arrow(ArrowFormat::Ipc) => Format::ArrowIpc.title(),
        }
    }
}

/// One conversion: `input` (CTF, CBF, Parquet or Arrow IPC, told apart by their first bytes) to `output`
/// (its format from its name, [`Target::of`]), written to a temporary file and renamed when complete.
/// The options of the routes that do not apply are ignored.
#[derive(Debug, Clone)]
pub struct Conversion {
    /// The input file.
    pub input: PathBuf,
    /// The output file.
    pub output: PathBuf,
    /// A CTF input's streams and reader options (the `path` is `input`'s); a CTF input without them is
    /// refused.
    pub ctf: Option<CtfInput>,
    /// How a CTF input is read: parsing threads, dropping sequences with an empty stream.
    pub scan: ScanOptions,
    /// How a CTF input is accessed.
    pub access: Access,
    /// How a CBF input is opened (renames, memory map).
    pub cbf: CbfOptions,
    /// How CBF output is written (its chunk size, ctf2bin's layout, meta counts).
    pub writer: CbfWriterOptions,
    /// CTF output: `(stream name, alias)` pairs; each stream is written as `|alias`, else as the input
    /// records it.
    pub aliases: Vec<(String, String)>,
    /// Parquet output: page compression.
    pub parquet_compression: ParquetCompression,
    /// Parquet and Arrow output: rows per row group at most (`None`: as many as fit in 64 MiB).
    pub rows_per_group: Option<usize>,
    /// Parquet and Arrow output: one row per sample.
    pub flatten: bool,
    /// Callbacks.
    pub hooks: Hooks,
    /// The input's format and what the output will be, told at [`Conversion::new`].
    route: (Format, Target),
}

impl Conversion {
    /// `input` to `output` with default options (all cores, CNTK's chunk size), the route told now: the
    /// input's format by its first bytes, the output's by its name ([`Target::of`]).
    pub fn new(input: &Path, output: &Path) -> Result<Conversion, Error> {
        let from = detect_format(input)?;
        Ok(Conversion {
            input: input.to_path_buf(),
            output: output.to_path_buf(),
            ctf: None,
            scan: ScanOptions::default(),
            access: Access::Read,
            cbf: CbfOptions::default(),
            writer: CbfWriterOptions::new(crate::options::DEFAULT_CHUNK_SIZE),
            aliases: Vec::new(),
            parquet_compression: ParquetCompression::Zstd,
            rows_per_group: None,
            flatten: false,
            hooks: Hooks::default(),
            route: (from, Target::of(from, output)?),
        })
    }

    /// The input's format and what the output will be.
    pub fn route(&self) -> (Format, Target) {
        self.route
    }

    /// Converts. `progress` is called with the input bytes (or, from Parquet and Arrow, the share of the
    /// file) read so far.
    pub fn run(&self, progress: &mut dyn FnMut(u64)) -> Result<ConvertSummary, Error> {
        let (from, to) = self.route;
        let (input, output) = (self.input.as_path(), self.output.as_path());
        let threads = self.scan.threads;
        match (from, to) {
            (Format::Ctf, Target::Arrow(format)) => {
                let ctf = self.ctf_input()?;
                let how = self.to_arrow(format);
                ctf_to_arrow(input, output, &ctf.schema, &ctf.options, &self.scan, self.access, &how, progress)
            }
            (Format::Cbf, Target::Arrow(format)) => {
                cbf_to_arrow(input, output, &self.cbf, &self.to_arrow(format), progress)
            }
            (Format::Parquet | Format::ArrowIpc, Target::Arrow(format)) => {
                arrow_to_arrow(input, output, &self.to_arrow(format), progress)
            }
            (Format::Parquet | Format::ArrowIpc, Target::Ctf) => {
                let how = ArrowToCtf { aliases: self.aliases.clone(), threads, hooks: self.hooks };
                arrow_to_ctf(input, output, &how, progress)
            }
            (Format::Parquet | Format::ArrowIpc, Target::Cbf) => {
                arrow_to_cbf(input, output, &ArrowToCbf { writer: self.writer, hooks: self.hooks }, progress)
            }
            (Format::Cbf, _) => {
                let how = CbfToCtf { cbf: self.cbf.clone(), aliases: self.aliases.clone(), threads, hooks: self.hooks };
                cbf_to_ctf(input, output, &how, progress)
            }
            (Format::Ctf, _) => {
                let ctf = self.ctf_input()?;
                let how = CtfToCbf {
                    ctf: ctf.options.clone(),
                    writer: self.writer,
                    scan: self.scan,
                    access: self.access,
                    hooks: self.hooks,
                };
                ctf_to_cbf(input, output, &ctf.schema, &how, progress)
            }
        }
    }

    fn ctf_input(&self) -> Result<&CtfInput, Error> {
        let input = || self.input.display().to_string();
        self.ctf
            .as_ref()
            .ok_or_else(|| Error::option_value("input", input(), "is CTF: converting it needs its streams"))
    }

    fn to_arrow(&self, format: ArrowFormat) -> ToArrow {
        ToArrow {
            format,
            compression: self.parquet_compression,
            rows_per_group: self.rows_per_group,
            flatten: self.flatten,
            hooks: self.hooks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_name_picks_the_target() {
        let of = |from, name: &str| Target::of(from, Path::new(name));
        assert_eq!(of(Format::Ctf, "x.parquet").unwrap(), Target::Arrow(ArrowFormat::Parquet));
        assert_eq!(of(Format::Cbf, "x.feather").unwrap(), Target::Arrow(ArrowFormat::Ipc));
        assert_eq!(of(Format::Ctf, "x.anything").unwrap(), Target::Cbf);
        assert_eq!(of(Format::Cbf, "x.cbf").unwrap(), Target::Ctf, "CBF becomes CTF whatever the name");
        assert_eq!(of(Format::Parquet, "x.ctf.zst").unwrap(), Target::Ctf);
        assert_eq!(of(Format::ArrowIpc, "x.TXT").unwrap(), Target::Ctf);
        assert_eq!(of(Format::Parquet, "x.bin").unwrap(), Target::Cbf);
        let e = of(Format::Parquet, "x.data").unwrap_err();
        assert_eq!(e.code(), "E1006", "{e}");
        assert!(e.to_string().contains(".ctf or .txt"), "{e}");
    }

    #[test]
    fn a_ctf_input_without_streams_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.ctf");
        std::fs::write(&input, "0 |a 1\n").unwrap();
        let output = dir.path().join("out.cbf");
        let e = Conversion::new(&input, &output).unwrap().run(&mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("needs its streams"), "{e}");
        assert!(!output.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }
}
