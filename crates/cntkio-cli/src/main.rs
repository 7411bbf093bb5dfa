//! The `cntkio` binary.
fn main() -> std::process::ExitCode {
    cntkio_cli::run(std::env::args_os())
}
