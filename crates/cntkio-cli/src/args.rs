//! The command line's arguments, as clap parses them (their meaning for the inputs: [`crate::resolve`]).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Validate, inspect, convert and benchmark CNTK Text Format (CTF) and CNTK Binary Format (CBF) data.
#[derive(Debug, Parser)]
#[command(name = "cntkio", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Print nothing but errors (no progress, no summaries on stderr).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read every byte and report every error with file:line:column (exit 0 valid, 1 invalid, 2 usage/IO).
    Validate(ValidateArgs),
    /// Describe a file without a schema: streams (dense/sparse, dims), sequences, samples, lengths.
    Inspect(InspectArgs),
    /// Print every sequence as JSON Lines: {"key": K, "streams": {"NAME": SAMPLES}}.
    Dump(DumpArgs),
    /// Per stream and dimension: mean, std, min, max of the values (sparse: as dense) and entries per index.
    Stats(StatsArgs),
    /// Measure index and parse throughput (MB/s, samples/s).
    Bench(BenchArgs),
    /// Convert CTF to CBF (like CNTK's ctf2bin.py) or CBF back to CTF; the input's format is detected.
    Convert(ConvertArgs),
    /// Print the minibatches of CNTK's minibatch source as JSON Lines (randomization, workers, checkpoints).
    Batches(BatchesArgs),
    /// Rewrite a file (plain, gzip or zstd) as seekable zstd (OUT.zst) or BGZF (OUT.gz), read at any offset.
    Recompress(RecompressArgs),
}

/// `recompress`.
#[derive(Debug, Args)]
pub struct RecompressArgs {
    /// Input file, plain or compressed (any content: CTF, CBF).
    pub input: PathBuf,
    /// Output file: `.zst` writes seekable zstd, `.gz` BGZF (written to a temporary file beside it, renamed
    /// when complete).
    pub output: PathBuf,
    /// Compressing threads (default: all cores).
    #[arg(short = 'j', long, value_name = "N")]
    pub threads: Option<usize>,
}

/// `batches`.
#[derive(Debug, Args)]
pub struct BatchesArgs {
    /// Input files (CTF or CBF), read as one data set, one after another (optional with --config).
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub read: ReadArgs,
    /// Minibatch size in samples (of the stream that defines sequence lengths).
    #[arg(long, value_name = "N")]
    pub mb_size: u64,
    /// Randomize as CNTK does (off unless given).
    #[arg(long)]
    pub randomize: bool,
    /// Randomization seed (sweep k uses SEED + k).
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub seed: u64,
    /// Randomization window in chunks (default 128).
    #[arg(long, value_name = "W", conflicts_with = "window_samples")]
    pub window_chunks: Option<u64>,
    /// Randomization window in samples.
    #[arg(long, value_name = "W")]
    pub window_samples: Option<u64>,
    /// Read this many sweeps (default: one).
    #[arg(long, value_name = "K", conflicts_with = "max_samples")]
    pub max_sweeps: Option<u64>,
    /// Read this many samples (up to the next sequence boundary).
    #[arg(long, value_name = "N")]
    pub max_samples: Option<u64>,
    /// Frame mode: every sequence must be a single sample.
    #[arg(long)]
    pub frame_mode: bool,
    /// Truncated BPTT with this truncation length: max(1, N / T) parallel rows of T samples, every stream
    /// dense, sequences continued across minibatches (each line then has a "bptt" layout).
    #[arg(long, value_name = "T", conflicts_with = "frame_mode")]
    pub truncation: Option<u64>,
    /// Number of workers reading the data.
    #[arg(long, default_value_t = 1, value_name = "W")]
    pub workers: u32,
    /// This worker's rank (0-based).
    #[arg(long, default_value_t = 0, value_name = "R")]
    pub rank: u32,
    /// With --randomize, deal sequences instead of chunks to the workers, so that every worker gets the
    /// same number of sequences (±1) per sweep (not in CNTK, which deals whole chunks).
    #[arg(long)]
    pub balanced_workers: bool,
    /// Also print the state ({"state": …}) once M minibatches have been printed.
    #[arg(long, value_name = "M")]
    pub checkpoint_after: Option<u64>,
    /// Continue from the state in FILE (a line {"state": …}, e.g. the output of --checkpoint-after).
    #[arg(long, value_name = "FILE")]
    pub restore: Option<PathBuf>,
    /// Restore as CNTK 2.7 does, quirks included (default: continue exactly as the uninterrupted run).
    #[arg(long)]
    pub cntk_restore: bool,
    /// Measure instead of printing: read the run and print minibatches, samples, samples/s and peak memory
    /// as one JSON object.
    #[arg(long)]
    pub bench: bool,
}

/// `convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Input file (CTF, CBF, Parquet or Arrow IPC, told apart by their magic numbers).
    pub input: PathBuf,
    /// Output file (written to a temporary file beside it, renamed when complete). `.parquet` and `.arrow`
    /// write cntkio's Arrow mapping; from those, `.ctf`/`.txt` writes CTF and `.cbf`/`.bin` CBF; else CTF
    /// becomes CBF and CBF becomes CTF. CTF output named `.zst` is written as seekable zstd, `.gz` as BGZF.
    pub output: PathBuf,
    /// Parquet and Arrow output: one row per sample instead of per sequence (every sequence must have
    /// exactly one sample of each stream).
    #[arg(long)]
    pub flatten: bool,
    /// Parquet output: page compression.
    #[arg(long, value_name = "zstd|snappy|none", default_value = "zstd")]
    pub parquet_compression: String,
    /// Parquet and Arrow output: rows per row group (record batch) at most; by default as many as fit in
    /// 64 MiB.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub row_group_size: Option<u64>,
    #[command(flatten)]
    pub read: ReadArgs,
    /// Streams from a ctf2bin.py header file (lines `name alias dense|sparse dim`).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["streams", "config"])]
    pub header: Option<PathBuf>,
    /// Chunk exactly as ctf2bin.py does, bug included (for byte-identical files).
    #[arg(long)]
    pub ctf2bin_compatible: bool,
    /// Write each sequence's meta count as its longest stream (ctf2bin.py) instead of its declared length.
    #[arg(long)]
    pub max_over_streams: bool,
}

/// How to read CTF: the schema and CNTK's deserializer options.
#[derive(Debug, Args, Clone)]
pub struct ReadArgs {
    /// A stream: NAME:DIM:dense|sparse[:ALIAS] (repeatable; ALIAS is the name written after '|', default NAME).
    #[arg(short = 's', long = "stream", value_name = "NAME:DIM:FORMAT[:ALIAS]")]
    pub streams: Vec<String>,
    /// The stream (by NAME, not alias) whose samples define a sequence's length (CNTK's definesMBSize).
    #[arg(long, value_name = "NAME")]
    pub defines_mb_size: Option<String>,
    /// Errors tolerated before reading fails (CNTK's maxErrors).
    #[arg(long, value_name = "N")]
    pub max_errors: Option<u64>,
    /// Treat every line as its own sequence, ignoring sequence ids (CNTK's skipSequenceIds).
    #[arg(long)]
    pub skip_sequence_ids: bool,
    /// Chunk size in bytes (CNTK's chunkSizeInBytes).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub chunk_size: Option<u64>,
    /// Element type of every stream: float (default) or double.
    #[arg(long, value_name = "float|double")]
    pub precision: Option<String>,
    /// Keep the index in a cache file beside the input and reuse it (CNTK's cacheIndex); for a plain
    /// gzip file (CTF or CBF), its seek points too, so that a later run need not decompress it all first.
    #[arg(long)]
    pub cache_index: bool,
    /// Drop sequences in which a stream is empty instead of failing (CNTK always fails).
    #[arg(long)]
    pub skip_bad_sequences: bool,
    /// Worker threads (default: all cores).
    #[arg(short = 'j', long, value_name = "N")]
    pub threads: Option<usize>,
    /// Memory-map the input instead of reading it (faster; the file must not change while it is read).
    #[arg(long)]
    pub mmap: bool,
    /// Read the input with positional reads instead of a memory map. A CBF input is mapped by default, and
    /// so is a CTF input of convert and validate; a file that becomes shorter while it is mapped stops the
    /// command with an error.
    #[arg(long, conflicts_with = "mmap")]
    pub no_mmap: bool,
    /// Take the streams and options from the reader section of a CNTK config file (BrainScript); flags given
    /// as well override the config. Without FILE arguments the config's data files are read.
    #[arg(long, value_name = "FILE.cntk")]
    pub config: Option<PathBuf>,
    /// The config section holding the reader (needed when the config has several).
    #[arg(long, value_name = "NAME", requires = "config")]
    pub section: Option<String>,
    /// Directory that relative data-file paths in the config are resolved against (default: the current
    /// directory, as CNTK does).
    #[arg(long, value_name = "DIR", requires = "config")]
    pub data_dir: Option<PathBuf>,
    /// Set a config variable, as on CNTK's command line (`--set defMBSize=true`; repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE", requires = "config")]
    pub set: Vec<String>,
}

/// `validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Input files (optional with --config, which names its own).
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub read: ReadArgs,
    /// Show at most this many errors per file (all are counted).
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub limit: usize,
    /// Also show warnings (short dense samples, unknown inputs, missing final newline).
    #[arg(long)]
    pub warnings: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Input file.
    pub file: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Treat every line as its own sequence (CNTK's skipSequenceIds).
    #[arg(long)]
    pub skip_sequence_ids: bool,
}

/// `dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Input files, dumped one after another (optional with --config, which names its own).
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub read: ReadArgs,
}

/// `stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Input files, taken together (optional with --config, which names its own).
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub read: ReadArgs,
    /// Dimensions listed per stream in the text (the first N; sparse streams: the N indices with the most
    /// entries).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub dims: usize,
    /// Print JSON, with every dimension.
    #[arg(long)]
    pub json: bool,
}

/// `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Input files (optional with --config, which names its own).
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub read: ReadArgs,
    /// Runs per measurement (the best is reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeat: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Measure minibatches instead: `bench --batches …` takes the options of `batches` and is
    /// `batches … --bench` (minibatches, samples, samples/s and peak memory as one JSON object).
    #[arg(long)]
    pub batches: bool,
}

/// Parses sizes like `33554432`, `32M`, `32MiB`, `1G`, `64k`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("expected a size in bytes like 33554432 or 32M, found {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("unknown size unit in {s:?} (use K, M or G)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("33554432"), Ok(33554432));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("12x").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }
}
