//! The `cntkio` command line: validate, inspect, dump, summarize, convert and benchmark CNTK data files.
//!
//! This crate only translates: arguments to library calls, results to text and JSON.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[macro_use]
mod output;
mod args;
mod batches;
mod bench;
mod cbf_cmds;
mod convert;
mod dump;
mod inspect;
mod render;
mod resolve;
mod signals;
mod stats;
mod validate;

use clap::Parser;
use std::ffi::OsString;
use std::process::ExitCode;

pub use signals::{ask_to_stop, explain_interrupt, explain_sigbus, first_to_end, stopped_by, Explain};

/// Exit code for valid input.
pub const EXIT_OK: u8 = 0;
/// Exit code for invalid input.
pub const EXIT_INVALID: u8 = 1;
/// Exit code for usage and I/O errors.
pub const EXIT_USAGE: u8 = 2;
/// Exit code for a bug in cntkio (an internal error, `E9001`): BSD's `EX_SOFTWARE`.
pub const EXIT_INTERNAL: u8 = 70;

/// The exit status for an error: 1 when the input is wrong or asks for too much, 2 for the caller's
/// mistakes and I/O errors, 70 for a bug in cntkio.
pub fn exit_code(e: &cntkio::Error) -> u8 {
    match e.category() {
        cntkio::Category::Format | cntkio::Category::Limit => EXIT_INVALID,
        cntkio::Category::Usage | cntkio::Category::Io => EXIT_USAGE,
        cntkio::Category::Internal => EXIT_INTERNAL,
    }
}

/// `cntkio bench --batches …` is `cntkio batches … --bench` (the same options).
fn bench_batches_alias<I, T>(args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut argv: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = argv.iter().skip(1).position(|a| !a.to_string_lossy().starts_with('-')).map(|i| i + 1);
    if let Some(i) = command {
        if argv[i] == "bench" && argv[i + 1..].iter().any(|a| a == "--batches") {
            argv[i] = "batches".into();
            argv.retain(|a| a != "--batches");
            argv.push("--bench".into());
        }
    }
    argv
}

/// Runs the command line with these arguments (the first is the program name).
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match args::Cli::try_parse_from(bench_batches_alias(args)) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { EXIT_OK };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(if cli.quiet {
        "error"
    } else {
        "warn"
    }))
    .format_timestamp(None)
    .try_init();
    let r = match &cli.command {
        args::Command::Validate(a) => validate::run(a, cli.quiet),
        args::Command::Inspect(a) => inspect::run(a, cli.quiet),
        args::Command::Dump(a) => dump::run(a, cli.quiet),
        args::Command::Stats(a) => stats::run(a, cli.quiet),
        args::Command::Bench(a) => bench::run(a, cli.quiet),
        args::Command::Convert(a) => convert::run(a, cli.quiet),
        args::Command::Batches(a) => batches::run(a, cli.quiet),
        args::Command::Recompress(a) => convert::recompress(a, cli.quiet),
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if output::is_broken_pipe(&e) {
                return ExitCode::from(EXIT_OK);
            }
            let interrupted = matches!(e.kind(), cntkio::ErrorKind::Io { source, .. }
                if source.kind() == std::io::ErrorKind::Interrupted);
            if stopped_by().is_some() && interrupted {
                // Asked to stop by an interrupt, which said so: the binary ends by that signal.
                return ExitCode::from(EXIT_USAGE);
            }
            eprint!("{}", render::render(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}
