//! The `hatchery` command line: parses arguments and dispatches; the work is in the library.

mod cli;

use clap::Parser;

fn main() {
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let args = match cli::Cli::try_parse_from(&raw) {
        Ok(args) => args,
        Err(mut e) => {
            cli::run::on_usage_error(&mut e, &raw);
            e.exit()
        }
    };
    cli::logging::init(args.log_format, args.verbose);
    let code = cli::dispatch(args.command);
    std::process::exit(code);
}
