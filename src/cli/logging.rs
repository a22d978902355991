//! Structured logging with tracing: human-readable by default, JSON on request, always on
//! stderr so that a sandboxed command's stdout stays its own.
//!
//! The line that ends a command with an error goes the same way: `hatchery: MESSAGE` for
//! people, one JSON object (`level` "ERROR", `fields.message`) with `--log-format json`,
//! so that a script reading stderr as JSON lines never meets a line it cannot parse.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

mod off_loop;

pub use off_loop::{off_loop, stream_off_loop};

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
    // No colour: a colour sequence of the formatter's own cannot be told apart, in the
    // written line, from one a logged value carried (black on black hides what follows).
    let registry = tracing_subscriber::registry().with(directives).with(levels);
    let json = format == LogFormat::Json;
    let lines = || {
        tracing_subscriber::fmt::layer()
            .with_writer(move || EscapedStderr { json })
            .with_ansi(false)
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

/// stderr for log lines, every control and format character in them escaped. A logged
/// field may hold what a worker chose (a path it exposed, with a bidi override in its
/// name, reached the operator's terminal raw): whatever the call site, a line can neither
/// drive the terminal, nor reorder or hide what is drawn, nor end early and forge a line
/// after it. Only the newline that ends the event is kept. JSON lines keep meaning the
/// same (`\u` escapes inside their strings, where serde_json escaped only C0).
struct EscapedStderr {
    json: bool,
}

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes one whole event at a time.
        let line = escape_line(&String::from_utf8_lossy(buf), self.json);
        if let Some(line) = off_loop::take(line) {
            std::io::stderr().write_all(line.as_bytes())?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `line` (one event) as [`EscapedStderr`] writes it.
fn escape_line(line: &str, json: bool) -> String {
    let (body, end) = match line.strip_suffix('\n') {
        Some(body) => (body, "\n"),
        None => (line, ""),
    };
    let mut out = String::with_capacity(line.len());
    for c in body.chars() {
        if !hatchery::text::is_control_or_format(c) {
            out.push(c);
        } else if json {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.extend(c.escape_default());
        }
    }
    out.push_str(end);
    out
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
        // In order with the log lines, off the supervisor's loop while those are; and not
        // with `eprintln!`, which panics when stderr is gone (its reader exited): the line
        // is lost, and the run goes on to write its report and exit with its status.
        if let Some(line) = off_loop::take(format!("hatchery: {message}\n")) {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_value_can_neither_drive_the_terminal_nor_forge_a_line() {
        let worker = "path=/w/\u{202e}gpj.exe \u{9b}2J \u{200b}\x1b]52;c;AAAA\x07 \x1b[30;2mhidden\nhatchery: FAKE forged line\r";
        let text = escape_line(&format!(" WARN {worker}\n"), false);
        assert!(
            text.ends_with('\n') && text.lines().count() == 1,
            "{text:?}"
        );
        assert!(
            text.trim_end_matches('\n')
                .chars()
                .all(|c| !hatchery::text::is_control_or_format(c)),
            "{text:?}"
        );
        assert!(text.contains("\\u{202e}gpj.exe"), "{text:?}");
        // JSON keeps its meaning: the same characters, escaped inside the strings.
        let line = serde_json::json!({"fields": {"path": worker, "tag": "\u{e0041}"}}).to_string();
        let escaped = escape_line(&format!("{line}\n"), true);
        assert!(
            escaped
                .trim_end_matches('\n')
                .chars()
                .all(|c| !hatchery::text::is_control_or_format(c)),
            "{escaped:?}"
        );
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap_or_default();
        assert_eq!(back["fields"]["path"], worker);
        assert_eq!(back["fields"]["tag"], "\u{e0041}");
    }
}
