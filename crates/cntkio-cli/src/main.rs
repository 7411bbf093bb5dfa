fn main() { cntkio_cli::run() }
