//! Reading the `reader = [ … ]` section of CNTK BrainScript config files (`.cntk`), so that old configs can
//! be validated and used as they are.
//!
//! ```
//! use cntkio::config::{load_reader_config, DeserializerConfig, Randomization};
//! use cntkio::{ElementType, StorageFormat};
//!
//! let text = r#"
//! defMbSize = false
//! train = [
//!     precision = "double"
//!     reader = [
//!         readerType = "CNTKTextFormatReader"
//!         file = "train.txt"   # relative to the config file
//!         randomize = false
//!         input = [
//!             features = [ alias = "F"; dim = 3; format = "dense"; definesMBSize = $defMBSize$ ]
//!             labels = [ alias = "L"; dim = 10; format = "sparse" ]
//!         ]
//!     ]
//! ]
//! "#;
//! // `defMBSize=true` on the command line overrides the top-level `defMbSize = false`.
//! let config = load_reader_config(text, None, &[("defMBSize".into(), "true".into())]).unwrap();
//! assert_eq!(config.section, "train.reader");
//! assert_eq!(config.randomization, Randomization::Off);
//! let DeserializerConfig::Ctf { file, schema, .. } = &config.deserializers[0] else { panic!() };
//! assert_eq!(file, "train.txt");
//! let features = &schema.streams()[0];
//! assert_eq!((features.alias.as_str(), features.dim, features.format), ("F", 3, StorageFormat::Dense));
//! assert_eq!(features.element_type, ElementType::F64);
//! assert_eq!(schema.main_stream(), Some(0));
//! ```
//!
//! [`brainscript`] is the generic, tolerant parser of the config language; [`load_reader_config`] and
//! [`load_reader_config_file`] find a reader section in it and apply CNTK 2.7's keys, defaults and checks
//! (`shared/spec/CTF.md` §10, `CBF.md` §5, `READER.md` §2 and §9.3).

pub mod brainscript;
mod reader;

pub use reader::{
    extract_reader, load_reader_config, load_reader_config_file, parse_config, reader_sections, ConfigWarning,
    DeserializerConfig, Randomization, ReaderConfig, ReaderKind, DEFAULT_CBF_WINDOW_CHUNKS, RANDOMIZE_AUTO,
};
