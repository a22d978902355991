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
    let json = format == LogFormat::Json;
    let lines = || {
        tracing_subscriber::fmt::layer()
            .with_writer(move || EscapedStderr { json, ansi })
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

/// stderr for log lines, every control and format character in them escaped. A logged
/// field may hold what a worker chose (a path it exposed, with a bidi override in its
/// name, reached the operator's terminal raw): whatever the call site, a line can neither
/// drive the terminal nor reorder or hide what is drawn. JSON lines keep meaning the
/// same (`\u` escapes inside their strings, where serde_json escaped only C0); text lines
/// keep the colours the formatter itself writes (SGR sequences of its own kinds) and
/// nothing else of an escape sequence.
struct EscapedStderr {
    json: bool,
    ansi: bool,
}

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes one whole event at a time.
        let line = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(escape_line(&line, self.json, self.ansi).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `line` as [`EscapedStderr`] writes it.
fn escape_line(line: &str, json: bool, ansi: bool) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        let len = c.len_utf8();
        if c == '\x1b' && ansi && !json {
            let colour = formatter_colour(rest);
            if colour > 0 {
                out.push_str(rest.get(..colour).unwrap_or_default());
                rest = rest.get(colour..).unwrap_or_default();
                continue;
            }
        }
        if c == '\n' || !hatchery::text::is_control_or_format(c) {
            out.push(c);
        } else if json {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.extend(c.escape_default());
        }
        rest = rest.get(len..).unwrap_or_default();
    }
    out
}

/// The length of the SGR sequence `s` begins with, when it is one the formatter writes
/// (`ESC [ n ; ... m` of reset, bold, dim, italic, underline and the foreground colours);
/// 0 otherwise (conceal, blink, cursor moves, titles: anything else is escaped).
fn formatter_colour(s: &str) -> usize {
    let Some(body) = s.strip_prefix("\x1b[") else {
        return 0;
    };
    let Some(end) = body.find('m').filter(|e| *e <= 16) else {
        return 0;
    };
    let params = body.get(..end).unwrap_or_default();
    let known = |p: &str| {
        p.parse::<u8>()
            .is_ok_and(|n| matches!(n, 0..=4 | 22..=24 | 30..=37 | 39 | 90..=97))
    };
    if params.split(';').all(known) {
        end + 3
    } else {
        0
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_value_can_neither_drive_the_terminal_nor_reorder_the_line() {
        let worker =
            "path=/w/\u{202e}gpj.exe \u{9b}2J \u{200b}\x1b]52;c;AAAA\x07 \x1b[8mhidden\x1b[2J";
        for ansi in [false, true] {
            let text = escape_line(&format!("\x1b[33m WARN\x1b[0m {worker}\n"), false, ansi);
            assert!(
                text.ends_with('\n') && text.lines().count() == 1,
                "{text:?}"
            );
            let shown = text.trim_end_matches('\n');
            for raw in ['\u{202e}', '\u{9b}', '\u{200b}', '\x07'] {
                assert!(!shown.contains(raw), "{ansi}: {text:?}");
            }
            // The formatter's own colours stay where it asked for them; the worker's
            // conceal, clear and clipboard sequences are text.
            assert_eq!(
                shown.matches('\x1b').count(),
                if ansi { 2 } else { 0 },
                "{text:?}"
            );
            assert!(shown.contains("\\u{202e}gpj.exe"), "{text:?}");
        }
        // JSON keeps its meaning: the same characters, escaped inside the strings.
        let line = serde_json::json!({"fields": {"path": worker, "tag": "\u{e0041}"}}).to_string();
        let escaped = escape_line(&format!("{line}\n"), true, false);
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
