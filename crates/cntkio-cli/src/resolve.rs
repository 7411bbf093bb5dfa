//! What the reading flags mean: the inputs ([`InputSpec`]) with their schema and options, from the flags, a
//! CNTK config (loaded once) or the files themselves.

use crate::args::ReadArgs;
use cntkio::config::ReaderConfig;
use cntkio::{Access, CtfInput, CtfOptions, ElementType, Error, InputSpec, Schema, StorageFormat, StreamSpec};
use std::path::{Path, PathBuf};

/// Parses a `--precision` value.
pub fn precision(p: &str) -> Result<ElementType, Error> {
    ElementType::parse(p).ok_or_else(|| Error::option_value("--precision", p, "must be float or double"))
}

/// The error for a command given no input.
fn no_input() -> Error {
    Error::config("no input file given (give FILE arguments or --config FILE.cntk)")
}

/// Parses one `--stream` value.
pub fn parse_stream(s: &str, element_type: ElementType) -> Result<StreamSpec, Error> {
    // The alias is the rest of the value: a CTF name may hold ':'.
    let parts: Vec<&str> = s.splitn(4, ':').collect();
    if !(3..=4).contains(&parts.len()) {
        return Err(Error::option_value(
            "--stream",
            s,
            "expected NAME:DIM:dense|sparse[:ALIAS], for example features:784:dense:F",
        ));
    }
    let dim: usize = parts[1].parse().map_err(|_| {
        Error::option_value("--stream", s, format!("DIM must be a non-negative integer, found {:?}", parts[1]))
    })?;
    let format = match parts[2].to_ascii_lowercase().as_str() {
        "dense" => StorageFormat::Dense,
        "sparse" => StorageFormat::Sparse,
        other => {
            return Err(Error::option_value("--stream", s, format!("format must be dense or sparse, found {other:?}")))
        }
    };
    let mut spec = StreamSpec::new(parts[0], dim, format).element_type(element_type);
    if let Some(a) = parts.get(3) {
        spec = spec.alias(*a);
    }
    Ok(spec)
}

impl ReadArgs {
    /// The files to work on, in order, each as its first bytes say (CBF, Parquet and Arrow IPC carry their
    /// streams; CTF files get the schema of the flags or of the config). Without files, the config's own
    /// data files, each read as its deserializer says.
    pub fn jobs(&self, files: &[PathBuf]) -> Result<Vec<InputSpec>, Error> {
        let config = self.config()?;
        if files.is_empty() {
            let Some(config) = config else { return Err(no_input()) };
            return config
                .deserializers
                .iter()
                .map(|d| {
                    let mut input = InputSpec::from_config(d)?;
                    if let InputSpec::Ctf(i) = &mut input {
                        self.override_config(i)?;
                    }
                    Ok(input)
                })
                .collect();
        }
        // The schema, resolved once and only if a file is CTF.
        let mut ctf: Option<(Schema, CtfOptions)> = None;
        let mut schema = || -> Result<(Schema, CtfOptions), Error> {
            if ctf.is_none() {
                ctf = Some(match &config {
                    Some(c) => self.config_schema(c)?,
                    None => self.schema_and_options()?,
                });
            }
            Ok(ctf.clone().expect("set above"))
        };
        let specs: Vec<InputSpec> =
            files.iter().map(|f| InputSpec::detect(f, &mut schema)).collect::<Result<_, _>>()?;
        Ok(specs.into_iter().map(|s| self.keep_points(s)).collect())
    }

    /// `--cache-index` for a CBF file: its gzip seek points are kept (CTF files get it with their options).
    fn keep_points(&self, spec: InputSpec) -> InputSpec {
        match spec {
            InputSpec::Cbf(mut i) if self.cache_index => {
                i.options.cache_index = true;
                InputSpec::Cbf(i)
            }
            other => other,
        }
    }

    /// The inputs of files given without any schema: a CTF file gets the schema its rows suggest
    /// ([`cntkio::ctf::infer_schema`]), for `validate`, which then checks the file's syntax.
    pub fn inferred_jobs(&self, files: &[PathBuf]) -> Result<Vec<InputSpec>, Error> {
        let options = self.options();
        files.iter().map(|f| Ok(self.keep_points(InputSpec::inferred(f, &options)?))).collect()
    }

    /// `path` read as CTF with the schema of the flags or of the config.
    pub fn ctf_input(&self, path: &Path) -> Result<CtfInput, Error> {
        let (schema, options) = match self.config()? {
            Some(c) => self.config_schema(&c)?,
            None => self.schema_and_options().map_err(|e| cntkio::inputs::explain_missing_schema(path, e))?,
        };
        Ok(CtfInput { path: path.to_path_buf(), schema, options })
    }

    /// The reader section of `--config`, if given (its warnings logged).
    fn config(&self) -> Result<Option<ReaderConfig>, Error> {
        let Some(path) = &self.config else { return Ok(None) };
        let overrides =
            self.set.iter().map(|s| cntkio::config::brainscript::split_override(s)).collect::<Result<Vec<_>, _>>()?;
        let cwd = PathBuf::new(); // relative to the current directory, as CNTK resolves them
        let data_dir = self.data_dir.as_ref().unwrap_or(&cwd);
        let config =
            cntkio::config::load_reader_config_file(path, self.section.as_deref(), &overrides, Some(data_dir))?;
        for w in &config.warnings {
            log::warn!("{}: {}", w.position, w.message);
        }
        Ok(Some(config))
    }

    /// The schema and options of the config's one CTF deserializer, for files given on the command line,
    /// with the flags given beside the config applied.
    fn config_schema(&self, config: &ReaderConfig) -> Result<(Schema, CtfOptions), Error> {
        let ctf: Vec<CtfInput> = config.deserializers.iter().filter_map(CtfInput::of_config).collect();
        let path = || self.config.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        let mut input = match <[CtfInput; 1]>::try_from(ctf) {
            Ok([first]) => first,
            Err(ctf) if ctf.is_empty() => {
                return Err(Error::option_value("--config", path(), "the reader section has no CTF deserializer"))
            }
            Err(ctf) => {
                let problem = format!(
                    "has {} deserializers; give no FILE arguments to read each with its own streams",
                    ctf.len()
                );
                return Err(Error::option_value("--config", path(), problem));
            }
        };
        self.override_config(&mut input)?;
        Ok((input.schema, input.options))
    }

    /// Flags given beside a config take precedence over it.
    fn override_config(&self, i: &mut CtfInput) -> Result<(), Error> {
        if !self.streams.is_empty() {
            let (schema, _) = self.schema_and_options()?;
            i.schema = schema;
        }
        if let Some(p) = &self.precision {
            i.schema = i.schema.with_element_type(precision(p)?);
        }
        if let Some(m) = &self.defines_mb_size {
            let mut streams = i.schema.streams().to_vec();
            if !streams.iter().any(|s| &s.name == m) {
                return Err(Error::option_value("--defines-mb-size", m, "no stream has this name"));
            }
            for s in &mut streams {
                s.defines_mb_size = &s.name == m;
            }
            i.schema = Schema::new(streams)?;
        }
        if let Some(n) = self.max_errors {
            i.options.max_errors = n;
        }
        if self.skip_sequence_ids {
            i.options.skip_sequence_ids = true;
        }
        if let Some(c) = self.chunk_size {
            i.options.chunk_size = c;
        }
        if self.cache_index {
            i.options.cache_index = true;
        }
        Ok(())
    }

    /// The reader options given by the flags (CNTK's defaults otherwise).
    pub fn options(&self) -> CtfOptions {
        let mut opts = CtfOptions::default();
        if let Some(n) = self.max_errors {
            opts.max_errors = n;
        }
        opts.skip_sequence_ids = self.skip_sequence_ids;
        if let Some(c) = self.chunk_size {
            opts.chunk_size = c;
        }
        opts.cache_index = self.cache_index;
        opts
    }

    /// The schema and options given by the flags.
    pub fn schema_and_options(&self) -> Result<(Schema, CtfOptions), Error> {
        let element_type = match &self.precision {
            None => ElementType::F32,
            Some(p) => precision(p)?,
        };
        if self.streams.is_empty() {
            return Err(Error::new(cntkio::ErrorKind::NoStreams { suggestion: None }));
        }
        let mut streams = Vec::new();
        for s in &self.streams {
            streams.push(parse_stream(s, element_type)?);
        }
        if let Some(m) = &self.defines_mb_size {
            match streams.iter_mut().find(|s| &s.name == m) {
                Some(s) => s.defines_mb_size = true,
                None => {
                    let names: Vec<&str> = streams.iter().map(|s| s.name.as_str()).collect();
                    let hint = match streams.iter().find(|s| &s.alias == m) {
                        Some(s) => format!(" (\"{m}\" is the alias of stream \"{}\"; give the name)", s.name),
                        None => String::new(),
                    };
                    let problem = format!("no stream has this name{hint}; streams: {}", names.join(", "));
                    return Err(Error::option_value("--defines-mb-size", m, problem));
                }
            }
        }
        Ok((Schema::new(streams)?, self.options()))
    }

    /// Threads to use.
    pub fn threads(&self) -> usize {
        cntkio::threads_or_cores(self.threads)
    }

    /// File access for a command that maps its input unless told not to (`--no-mmap`): a map where the
    /// system allows it, forced with `--mmap`.
    pub fn access_mapped_by_default(&self) -> Access {
        if self.no_mmap {
            Access::Read
        } else if self.mmap {
            Access::Mmap
        } else {
            Access::Auto
        }
    }

    /// How to read a CTF input without a map, for a command that maps it by default.
    pub fn no_map_hint(&self) -> &'static str {
        if self.mmap {
            "use --no-mmap instead of --mmap"
        } else {
            "pass --no-mmap"
        }
    }

    /// Whether to map the inputs of a command that reads CTF unless `--mmap` and maps CBF unless
    /// `--no-mmap`: `Some` when a flag says, else `None` (each format's default, see
    /// [`InputSpec::open`](cntkio::inputs::InputSpec::open)).
    pub fn mapping(&self) -> Option<bool> {
        if self.no_mmap {
            Some(false)
        } else if self.mmap {
            Some(true)
        } else {
            None
        }
    }

    /// Whether a CBF input is mapped: unless `--no-mmap`.
    pub fn cbf_mapped(&self) -> bool {
        self.mapping().unwrap_or(true)
    }

    /// File access.
    pub fn access(&self) -> Access {
        if self.mmap {
            Access::Mmap
        } else {
            Access::Read
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams() {
        let s = parse_stream("features:784:dense:F", ElementType::F64).unwrap();
        assert_eq!(
            (s.name.as_str(), s.alias.as_str(), s.dim, s.element_type),
            ("features", "F", 784, ElementType::F64)
        );
        assert!(parse_stream("x:1", ElementType::F32).is_err());
        assert!(parse_stream("x:a:dense", ElementType::F32).is_err());
        assert!(parse_stream("x:1:dens", ElementType::F32).is_err());
    }
}
