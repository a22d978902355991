//! `hatchery run`'s usual command lines, read without clap.
//!
//! Building clap's command for `run` (its two dozen arguments, their help and parsers) and
//! matching a line against it runs code that nothing else on a start touches: about 0.2 ms
//! of a 5 ms `run`, most of it the first touch of that code's pages. This reader takes
//! only lines made of what [`OPTIONS`] lists: long options with their values, `-v`,
//! `--log-format`, then `--` and the command. It gives `None` for anything else and clap
//! then reads the line, with its own help and errors. That covers help and the version,
//! other short flags and unknown words. It also covers a value that starts with `-`, is
//! empty or is refused by its parser, an option given twice that clap takes once, and an
//! argument that is not UTF-8. The unit tests hold the table to clap's definition of
//! `run`, and every line read here to clap's reading of it.

use std::ffi::OsString;
use std::path::PathBuf;

use super::RunArgs;
use crate::cli::egress::{self, EgressArgs};
use crate::cli::logging::LogFormat;

/// What a known option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takes {
    /// Nothing; given at most once.
    Flag,
    /// One value; given at most once.
    One,
    /// One value each time; repeatable.
    Many,
    /// Nothing; counted (`--verbose`, as `-v`).
    Count,
}

/// Every long option of `run` (its own and the global ones), with what it takes.
const OPTIONS: [(&str, Takes); 23] = [
    ("memory", Takes::One),
    ("cpus", Takes::One),
    ("pids", Takes::One),
    ("timeout", Takes::One),
    ("max-output", Takes::One),
    ("allow-host", Takes::Many),
    ("resolve", Takes::Many),
    ("max-egress", Takes::One),
    ("dangerously-share-host-network", Takes::Flag),
    ("ro", Takes::Many),
    ("rw", Takes::Many),
    ("ro-cwd", Takes::Flag),
    ("allow-system-rw", Takes::Flag),
    ("allow-exec", Takes::Many),
    ("cwd", Takes::One),
    ("env", Takes::Many),
    ("profile", Takes::One),
    ("report", Takes::One),
    ("allow-degraded", Takes::Flag),
    ("host-uid", Takes::One),
    ("hostname", Takes::One),
    ("log-format", Takes::One),
    ("verbose", Takes::Count),
];

/// A `run` line as clap would read it: (log format, verbosity, the arguments).
pub type Parsed = (LogFormat, u8, RunArgs);

/// Reads `raw` (`raw[0]` the program, `raw[1]` `run`), or `None` for clap to read it.
pub fn parse(raw: &[OsString]) -> Option<Parsed> {
    let mut words = raw.get(2..)?.iter();
    let mut line = Line::default();
    loop {
        let word = words.next()?.to_str()?;
        if word == "--" {
            break;
        }
        if let Some(long) = word.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (long, None),
            };
            let takes = OPTIONS.iter().find(|(n, _)| *n == name)?.1;
            if matches!(takes, Takes::Flag | Takes::Count) {
                if inline.is_some() {
                    return None;
                }
                line.flag(name)?;
                continue;
            }
            let value = match inline {
                Some(value) => value,
                None => words.next()?.to_str()?,
            };
            // A word that starts with `-` may be clap's next flag (except `-` alone, which
            // names standard output for `--report`).
            if value.is_empty() || (value.starts_with('-') && value != "-") {
                return None;
            }
            line.value(name, value)?;
        } else {
            // Only `-v`, `-vv`, ...: every other short flag (`-h`, `-V`) and a word before
            // `--` are clap's to answer.
            let vs = word.strip_prefix('-').filter(|v| !v.is_empty())?;
            if !vs.bytes().all(|b| b == b'v') {
                return None;
            }
            line.verbose = line.verbose.checked_add(u8::try_from(vs.len()).ok()?)?;
        }
    }
    let command = words
        .map(|w| w.to_str().map(str::to_string))
        .collect::<Option<Vec<String>>>()?;
    if command.is_empty() {
        return None;
    }
    Some((
        line.log_format.unwrap_or(LogFormat::Human),
        line.verbose,
        line.args(command),
    ))
}

/// What a line set so far; `None` from a setter hands the line to clap.
#[derive(Default)]
struct Line {
    log_format: Option<LogFormat>,
    verbose: u8,
    memory: Option<u64>,
    cpus: Option<f64>,
    pids: Option<u64>,
    timeout: Option<std::time::Duration>,
    max_output: Option<u64>,
    allow_host: Vec<hatchery::egress::AllowHost>,
    resolve: Vec<(String, std::net::IpAddr)>,
    max_egress: Option<u64>,
    share_host_network: bool,
    ro: Vec<PathBuf>,
    rw: Vec<PathBuf>,
    ro_cwd: bool,
    allow_system_rw: bool,
    allow_exec: Vec<PathBuf>,
    cwd: Option<PathBuf>,
    env: Vec<String>,
    profile: Option<String>,
    report: Option<PathBuf>,
    allow_degraded: bool,
    host_uid: Option<(u32, u32)>,
    hostname: Option<String>,
}

/// Sets a value given at most once: `None` the second time.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// Sets a flag given at most once: `None` the second time.
fn flag_once(slot: &mut bool) -> Option<()> {
    if *slot {
        return None;
    }
    *slot = true;
    Some(())
}

impl Line {
    fn flag(&mut self, name: &str) -> Option<()> {
        match name {
            "dangerously-share-host-network" => flag_once(&mut self.share_host_network),
            "ro-cwd" => flag_once(&mut self.ro_cwd),
            "allow-system-rw" => flag_once(&mut self.allow_system_rw),
            "allow-degraded" => flag_once(&mut self.allow_degraded),
            "verbose" => {
                self.verbose = self.verbose.checked_add(1)?;
                Some(())
            }
            _ => None,
        }
    }

    /// Takes `value` for the option `name` through the parser clap would use.
    fn value(&mut self, name: &str, value: &str) -> Option<()> {
        use hatchery::units;
        match name {
            "memory" => once(&mut self.memory, units::parse_memory(value).ok()?),
            "cpus" => once(&mut self.cpus, units::parse_cpus(value).ok()?),
            "pids" => once(&mut self.pids, units::parse_pids(value).ok()?),
            "timeout" => once(&mut self.timeout, units::parse_duration(value).ok()?),
            "max-output" => once(&mut self.max_output, units::parse_output_cap(value).ok()?),
            "allow-host" => {
                self.allow_host.push(egress::parse_allow_host(value).ok()?);
                Some(())
            }
            "resolve" => {
                self.resolve.push(egress::parse_resolve(value).ok()?);
                Some(())
            }
            "max-egress" => once(&mut self.max_egress, egress::parse_budget(value).ok()?),
            "ro" => {
                self.ro.push(value.into());
                Some(())
            }
            "rw" => {
                self.rw.push(value.into());
                Some(())
            }
            "allow-exec" => {
                self.allow_exec.push(value.into());
                Some(())
            }
            "cwd" => once(&mut self.cwd, value.into()),
            "env" => {
                self.env.push(value.to_string());
                Some(())
            }
            "profile" => once(&mut self.profile, value.to_string()),
            "report" => once(&mut self.report, value.into()),
            "host-uid" => once(&mut self.host_uid, super::parse_host_ids(value).ok()?),
            "hostname" => once(&mut self.hostname, super::parse_hostname(value).ok()?),
            "log-format" => {
                let format = match value {
                    "human" => LogFormat::Human,
                    "json" => LogFormat::Json,
                    _ => return None,
                };
                once(&mut self.log_format, format)
            }
            _ => None,
        }
    }

    /// The arguments, with clap's defaults for what the line left out.
    fn args(self, command: Vec<String>) -> RunArgs {
        RunArgs {
            memory: self.memory,
            cpus: self.cpus,
            pids: self.pids,
            timeout: self.timeout,
            max_output: self.max_output,
            egress: EgressArgs {
                allow_host: self.allow_host,
                resolve: self.resolve,
                max_egress: self.max_egress,
                dangerously_share_host_network: self.share_host_network,
            },
            ro: self.ro,
            rw: self.rw,
            ro_cwd: self.ro_cwd,
            allow_system_rw: self.allow_system_rw,
            allow_exec: self.allow_exec,
            cwd: self.cwd,
            env: self.env,
            profile: self.profile.unwrap_or_else(|| "default".to_string()),
            report: self.report,
            allow_degraded: self.allow_degraded,
            host_uid: self.host_uid,
            hostname: self.hostname.unwrap_or_else(|| "hatchery".to_string()),
            command,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::{ArgAction, CommandFactory, Parser};

    fn line(words: &[&str]) -> Vec<OsString> {
        std::iter::once("hatchery")
            .chain(words.iter().copied())
            .map(Into::into)
            .collect()
    }

    /// clap's reading of a line, as text (`None`: clap refuses it or prints help).
    fn by_clap(raw: &[OsString]) -> Option<String> {
        Cli::try_parse_from(raw).ok().map(|c| format!("{c:?}"))
    }

    /// This reader's, as the same text.
    fn by_quick(raw: &[OsString]) -> Option<String> {
        parse(raw).map(|(log_format, verbose, args)| {
            let cli = Cli {
                log_format,
                verbose,
                command: Command::Run(Box::new(args)),
            };
            format!("{cli:?}")
        })
    }

    #[test]
    fn the_table_is_every_long_option_of_run_as_clap_defines_it() {
        let root = Cli::command();
        let run = root
            .find_subcommand("run")
            .unwrap_or_else(|| panic!("no run subcommand"));
        let mut clap_options: Vec<(String, Takes)> = root
            .get_arguments()
            .chain(run.get_arguments())
            .filter_map(|arg| {
                let long = arg.get_long()?;
                let takes = match arg.get_action() {
                    ArgAction::Set => Takes::One,
                    ArgAction::Append => Takes::Many,
                    ArgAction::SetTrue => Takes::Flag,
                    ArgAction::Count => Takes::Count,
                    // Help and version: clap's to print.
                    ArgAction::Help | ArgAction::HelpLong | ArgAction::Version => return None,
                    other => panic!("--{long}: {other:?} is not in the table's vocabulary"),
                };
                Some((long.to_string(), takes))
            })
            .collect();
        clap_options.sort_by(|a, b| a.0.cmp(&b.0));
        let mut table: Vec<(String, Takes)> =
            OPTIONS.iter().map(|(n, t)| (n.to_string(), *t)).collect();
        table.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(table, clap_options);
    }

    /// Lines this reader takes (the command-line tests of `cli` use them too).
    pub(crate) const USUAL_LINES: &[&[&str]] = &[
        &["run", "--", "/bin/true"],
        &[
            "run", "--memory", "256M", "--cpus", "1", "--pids", "64", "--", "true",
        ],
        &[
            "run",
            "--memory=256M",
            "--cpus=0.5",
            "--pids=64",
            "--",
            "true",
        ],
        &[
            "run",
            "-vv",
            "--log-format",
            "json",
            "--ro",
            "x",
            "--",
            "a",
            "--b",
        ],
        &[
            "run",
            "-v",
            "--verbose",
            "-vvv",
            "--log-format=human",
            "--",
            "a",
        ],
        &[
            "run",
            "--timeout",
            "1m30s",
            "--env",
            "A=1",
            "--env",
            "B",
            "--",
            "sh",
        ],
        &["run", "--env=A=B=C", "--", "sh"],
        &[
            "run",
            "--profile",
            "strict",
            "--report",
            "-",
            "--",
            "sh",
            "-c",
            "id",
        ],
        &[
            "run",
            "--report",
            "out.json",
            "--max-output",
            "64K",
            "--",
            "x",
        ],
        &[
            "run", "--ro", "/a", "--ro", "/b", "--rw", "./w", "--ro-cwd", "--", "x",
        ],
        &[
            "run",
            "--allow-exec",
            "/usr/bin/python3",
            "--cwd",
            "/tmp/w",
            "--",
            "x",
        ],
        &["run", "--allow-system-rw", "--allow-degraded", "--", "x"],
        &[
            "run",
            "--host-uid",
            "1000:1001",
            "--hostname",
            "box",
            "--",
            "x",
        ],
        &["run", "--host-uid", "1000", "--", "x"],
        &[
            "run",
            "--allow-host",
            "example.com:443",
            "--allow-host",
            "[::1]:8080",
            "--",
            "x",
        ],
        &[
            "run",
            "--resolve",
            "a.example=127.0.0.1",
            "--max-egress",
            "1M",
            "--",
            "x",
        ],
        &["run", "--dangerously-share-host-network", "--", "x"],
        &["run", "--", "a", "--", "b", "-c"],
        &["run", "--", ""],
        &["run", "--", "-x"],
    ];

    #[test]
    fn usual_lines_are_read_here_exactly_as_clap_reads_them() {
        for words in USUAL_LINES {
            let raw = line(words);
            let quick = by_quick(&raw);
            assert!(quick.is_some(), "{words:?} should be read here");
            assert_eq!(quick, by_clap(&raw), "{words:?}");
        }
    }

    #[test]
    fn everything_else_is_left_to_clap() {
        let lines: &[&[&str]] = &[
            &["run"],
            &["run", "--"],
            &["run", "true"],
            &["run", "--help"],
            &["run", "-h"],
            &["run", "--version"],
            &["run", "-V"],
            &["run", "-vx", "--", "true"],
            &["run", "--bogus", "--", "true"],
            &["run", "--memmory", "1G", "--", "true"],
            &["run", "--memory", "lots", "--", "true"],
            &["run", "--memory", "1G", "--memory", "2G", "--", "true"],
            &["run", "--memory", "--", "true"],
            &["run", "--memory"],
            &["run", "--memory=", "--", "true"],
            &["run", "--cpus", "-1", "--", "true"],
            &["run", "--ro", "-x", "--", "true"],
            &["run", "--ro", "", "--", "true"],
            &["run", "--ro-cwd", "--ro-cwd", "--", "true"],
            &["run", "--ro-cwd=yes", "--", "true"],
            &["run", "--verbose=2", "--", "true"],
            &["run", "--hostname", "a_b", "--", "true"],
            &["run", "--host-uid", "0", "--", "true"],
            &["run", "--log-format", "xml", "--", "true"],
            &["run", "--log-format", "JSON", "--", "true"],
            &["run", "--profile", "a", "--profile", "b", "--", "true"],
        ];
        for words in lines {
            assert_eq!(by_quick(&line(words)), None, "{words:?}");
        }
        // Words that are not UTF-8, before `--` and after it.
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'/', 0xff]);
        let mut raw = line(&["run", "--ro"]);
        raw.extend([bad.clone(), "--".into(), "true".into()]);
        assert_eq!(by_quick(&raw), None);
        let mut raw = line(&["run", "--"]);
        raw.push(bad);
        assert_eq!(by_quick(&raw), None);
    }

    /// Pieces a line is made of: each option with values good and bad, in both spellings,
    /// and words that are clap's alone (help, unknown flags, a missing value, `=`, empty).
    const PIECES: &[&[&str]] = &[
        &["--memory", "256M"],
        &["--memory=1G"],
        &["--memory", "lots"],
        &["--cpus", "0.5"],
        &["--cpus", "-1"],
        &["--pids", "64"],
        &["--timeout", "1m30s"],
        &["--max-output", "64K"],
        &["--allow-host", "example.com:443"],
        &["--allow-host", "*.pypi.org:443"],
        &["--allow-host", "nope"],
        &["--resolve", "a.example=127.0.0.1"],
        &["--max-egress", "1M"],
        &["--max-egress", "0"],
        &["--dangerously-share-host-network"],
        &["--ro", "/tmp/x"],
        &["--ro", "x"],
        &["--rw", "/w"],
        &["--ro-cwd"],
        &["--allow-system-rw"],
        &["--allow-exec", "/usr/bin/python3"],
        &["--cwd", "/w"],
        &["--env", "A=1"],
        &["--env", "B"],
        &["--env=A=B"],
        &["--profile", "strict"],
        &["--report", "-"],
        &["--report", "out.json"],
        &["--allow-degraded"],
        &["--host-uid", "1000"],
        &["--host-uid", "1000:1000"],
        &["--host-uid", "0"],
        &["--hostname", "box"],
        &["--hostname", "a_b"],
        &["--log-format", "json"],
        &["--log-format", "human"],
        &["--log-format=json"],
        &["--log-format", "xml"],
        &["-v"],
        &["-vv"],
        &["--verbose"],
        &["--verbose=1"],
        &["-h"],
        &["--help"],
        &["-V"],
        &["--version"],
        &["--bogus"],
        &[""],
        &["="],
        &["--=x"],
        &["-x"],
        &["--ro="],
        &["--memory"],
        &["x"],
    ];

    /// Commands a line ends with (none, too).
    const COMMANDS: &[&[&str]] = &[&[], &["true"], &["sh", "-c", "id"], &["a", "--", "b"]];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
        /// Whatever the line, a reading here is clap's reading.
        #[test]
        fn a_line_read_here_is_read_the_same_by_clap(
            pieces in proptest::collection::vec(proptest::sample::select(PIECES), 0..6),
            command in proptest::sample::select(COMMANDS),
            separated in proptest::prelude::any::<bool>(),
        ) {
            let mut all = vec!["run"];
            all.extend(pieces.iter().flat_map(|p| p.iter().copied()));
            if separated {
                all.push("--");
            }
            all.extend(command.iter().copied());
            let raw = line(&all);
            if let Some(quick) = by_quick(&raw) {
                proptest::prop_assert_eq!(Some(quick), by_clap(&raw), "{:?}", all);
            }
        }
    }
}
