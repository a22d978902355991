//! Structured logging with tracing: human-readable by default, JSON on request, always on
//! stderr so that a sandboxed command's stdout stays its own.
//!
//! The line that ends a command with an error goes the same way: `hatchery: MESSAGE` for
//! people, one JSON object (`level` "ERROR", `fields.message`) with `--log-format json`,
//! so that a script reading stderr as JSON lines never meets a line it cannot parse.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Set once `--log-format json` is in force.
static JSON: AtomicBool = AtomicBool::new(false);

/// The target of error lines in JSON: always let through, whatever `HATCHERY_LOG` says.
const LINE_TARGET: &str = "hatchery_line";

pub fn init(format: LogFormat, verbose: u8) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let level = match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        _ => LevelFilter::DEBUG,
    };
    // `HATCHERY_LOG` takes tracing's directives (`hatchery=debug,...`), parsed by an
    // `EnvFilter`. Without it the levels above are plain per-target levels: a `Targets`
    // filter does that, and builds in a fraction of the time an `EnvFilter` takes to
    // parse its directives (every `run` pays this before its sandbox starts).
    let (directives, levels) = match EnvFilter::try_from_env("HATCHERY_LOG") {
        Ok(filter) => {
            let filter = match format!("{LINE_TARGET}=info").parse() {
                Ok(directive) => filter.add_directive(directive),
                Err(_) => filter,
            };
            (Some(filter), None)
        }
        Err(_) => (
            None,
            Some(
                Targets::new()
                    .with_default(level)
                    .with_target(LINE_TARGET, LevelFilter::INFO),
            ),
        ),
    };
    // Colour only for a person at a terminal (and not where NO_COLOR asks otherwise): a log
    // file or a pipe gets plain text.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let registry = tracing_subscriber::registry().with(directives).with(levels);
    let lines = || {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_target(false)
    };
    let _ = match format {
        LogFormat::Human => registry.with(lines()).try_init(),
        LogFormat::Json => {
            JSON.store(true, Ordering::Relaxed);
            registry.with(lines().json()).try_init()
        }
    };
}

/// Whether `--log-format json` is in force.
pub fn is_json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Most characters of one error line.
const MOST_LINE: usize = 4096;

/// Prints the line that ends a command with an error (without the `hatchery: ` prefix):
/// plain text, or a JSON log object with `--log-format json`.
/// A message that begins `warning: ` or `note: ` is logged at that level instead.
pub fn error_line(message: &str) {
    // The message may carry a path or a field a sandbox or a file chose: it must not
    // drive the terminal, nor break the one line into several.
    let message = &*hatchery::text::escape_controls(message);
    // Nor run to megabytes, whatever part of it a file or a peer chose.
    let message = &*hatchery::text::clip(message, MOST_LINE);
    if !JSON.load(Ordering::Relaxed) {
        eprintln!("hatchery: {message}");
        return;
    }
    if let Some(m) = message.strip_prefix("warning: ") {
        tracing::warn!(target: LINE_TARGET, "{m}");
    } else if let Some(m) = message.strip_prefix("note: ") {
        tracing::info!(target: LINE_TARGET, "{m}");
    } else {
        tracing::error!(target: LINE_TARGET, "{message}");
    }
}

/// Whether the raw arguments ask for JSON logs (for errors found before they are parsed).
pub fn json_requested(args: &[std::ffi::OsString]) -> bool {
    let mut previous_was_flag = false;
    for a in args {
        if a == "--" {
            break;
        }
        if a == "--log-format=json" || (previous_was_flag && a == "json") {
            return true;
        }
        previous_was_flag = a == "--log-format";
    }
    false
}
