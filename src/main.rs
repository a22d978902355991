//! The `hatchery` command line: parses arguments and dispatches; the work is in the library.

mod cli;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    cli::logging::init(args.log_format, args.verbose);
    let code = cli::dispatch(args.command);
    std::process::exit(code);
}
