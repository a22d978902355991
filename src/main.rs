//! The `hatchery` command line: parses arguments and dispatches; the work is in the library.

// The entry is hatchery's own, without std's start-up (see `hatchery::sandbox::entry`).
// A test build keeps the test harness's.
#![cfg_attr(not(test), no_main)]

mod cli;

#[cfg(not(test))]
hatchery::program_entry!(command_line);

#[cfg_attr(test, allow(dead_code))]
fn command_line() -> i32 {
    quiet_on_closed_stdout();
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let args = match cli::Cli::parse_args(&raw) {
        Ok(args) => args,
        Err(mut e) => {
            // `run`/`spawn`: say where the command goes, and write the report asked for.
            cli::run::on_usage_error(&mut e, &raw);
            usage_error(e, &raw)
        }
    };
    cli::logging::init(args.log_format, args.verbose);
    let code = cli::dispatch(args.command);
    std::process::exit(code);
}

/// Ends on a command line clap refused (exit 2), or prints help or the version (exit 0).
/// With `--log-format json` a refusal is one JSON log line, like every other error.
fn usage_error(e: clap::Error, raw: &[std::ffi::OsString]) -> ! {
    use clap::error::ErrorKind;
    let is_error = !matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if is_error && cli::logging::json_requested(raw) {
        cli::logging::init(cli::logging::LogFormat::Json, 0);
        let text = e.render().to_string();
        let message = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more"))
            .collect::<Vec<_>>()
            .join("; ");
        let message = message.strip_prefix("error: ").unwrap_or(&message);
        cli::logging::error_line(message);
        std::process::exit(cli::exit::USAGE);
    }
    e.exit()
}

/// A reader that goes away (`hatchery ps --json | head -1`) ends the command quietly with
/// status 0, as in every Unix tool.
///
/// Why not SIGPIPE's default action, which Rust ignores: the run supervisor, a sandbox's
/// pid 1 and the controller's launcher are forks of this process and write to pipes and
/// sockets whose other end may close (a worker that dies, a client that hangs up); for
/// them a closed pipe is an error to handle, never a reason to die. So the signal stays
/// ignored everywhere, and only a failed write to stdout is turned into a quiet exit:
/// here for `println!` (which panics on it), and in [`cli::fail`] for errors returned.
fn quiet_on_closed_stdout() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        // std's text for a failed `print!`: "failed printing to stdout: Broken pipe (os error 32)".
        let epipe = format!("(os error {})", libc::EPIPE);
        if message.starts_with("failed printing to stdout")
            && message.contains(&epipe)
            && cli::stdout_reader_gone()
        {
            std::process::exit(cli::exit::OK);
        }
        previous(info);
    }));
}
