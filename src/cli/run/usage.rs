//! A refused command line of `run` or `spawn`: a tip where the command goes, and for
//! `run --report FILE` the report of the refusal.

use super::*;

/// Called with a command line clap refused: for `run` and `spawn`, a stray word before
/// `--` is most likely the command (`hatchery run echo hi`), so a tip says where it goes;
/// and `run --report FILE` still writes its report, with the refusal in `error`.
pub fn on_usage_error(e: &mut clap::Error, raw: &[std::ffi::OsString]) {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let words: Vec<String> = raw
        .iter()
        .skip(1)
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    // The subcommand: the first word that is neither a global flag nor its value.
    let mut i = 0;
    while let Some(w) = words.get(i) {
        if w == "--log-format" {
            i = i.saturating_add(2);
        } else if w.starts_with('-') {
            i = i.saturating_add(1);
        } else {
            break;
        }
    }
    let Some(sub) = words.get(i).map(String::as_str) else {
        return;
    };
    if sub != "run" && sub != "spawn" {
        return;
    }
    let rest = words.get(i.saturating_add(1)..).unwrap_or_default();
    let dashdash = rest.iter().position(|w| w == "--");
    let (options, command) = match dashdash {
        Some(at) => (
            rest.get(..at).unwrap_or_default(),
            rest.get(at.saturating_add(1)..).unwrap_or_default(),
        ),
        None => (rest, &[][..]),
    };
    if e.kind() == ErrorKind::UnknownArgument {
        if let Some(ContextValue::String(stray)) = e.get(ContextKind::InvalidArg) {
            if !stray.starts_with('-') && dashdash.is_none() {
                let stray = stray.clone();
                let at = options.iter().position(|w| *w == stray).unwrap_or(0);
                let tail = options.get(at..).unwrap_or_default().join(" ");
                e.insert(
                    ContextKind::Suggested,
                    ContextValue::StyledStrs(vec![
                        format!("the command goes after `--`: hatchery {sub} [OPTIONS] -- {tail}")
                            .into(),
                    ]),
                );
            }
        }
    }
    if sub != "run" || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        return;
    }
    // `--report` and `--profile` as clap reads them: a word that an option takes as its
    // value (`--timeout --report=/etc/x`) is that option's value, never a report path,
    // however it looks.
    let run_cmd = <crate::cli::Cli as clap::CommandFactory>::command();
    let takes_value = |long: &str| {
        run_cmd
            .find_subcommand("run")
            .and_then(|c| c.get_arguments().find(|a| a.get_long() == Some(long)))
            .is_some_and(|a| a.get_action().takes_values())
    };
    let mut report = None;
    let mut profile = None;
    let mut words = options.iter();
    while let Some(w) = words.next() {
        let Some(long) = w.strip_prefix("--") else {
            continue;
        };
        let (name, value) = match long.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None if takes_value(long) => (long, words.next().cloned()),
            None => continue,
        };
        match name {
            "report" => report = value,
            "profile" => profile = value,
            _ => {}
        }
    }
    let profile = profile.unwrap_or_else(|| "default".into());
    let Some(path) = report else {
        return;
    };
    let rendered = e.render().to_string();
    let message = rendered
        .lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("error: ")
        .to_string();
    let body = Report::refused(
        message,
        crate::cli::exit::USAGE,
        command.to_vec(),
        LimitsRequested {
            memory_bytes: None,
            cpus: None,
            pids: None,
            timeout_ms: None,
            max_output_bytes: None,
        },
        &profile,
    );
    let written = OutputTarget::prepare(Path::new(&path)).and_then(|t| body.write(&t));
    if let Err(err) = written {
        error_line!("--report {path}: cannot write the report of this refusal: {err}");
    }
}
