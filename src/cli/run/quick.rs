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

use super::RunArgs;
use crate::cli::egress::{self, EgressArgs};
use crate::cli::logging::LogFormat;
use hatchery::units;

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

/// A line as read so far.
struct Line {
    log_format: LogFormat,
    verbose: u8,
    args: RunArgs,
}

/// Takes an option's value (a flag's is empty) through the parser clap would use; `None`
/// where clap would refuse it.
type Set = fn(&mut Line, &str) -> Option<()>;

/// Every long option of `run` (its own and the global ones): what it takes and how.
const OPTIONS: [(&str, Takes, Set); 23] = [
    ("memory", Takes::One, |l, v| {
        l.args.memory = Some(units::parse_memory(v).ok()?);
        Some(())
    }),
    ("cpus", Takes::One, |l, v| {
        l.args.cpus = Some(units::parse_cpus(v).ok()?);
        Some(())
    }),
    ("pids", Takes::One, |l, v| {
        l.args.pids = Some(units::parse_pids(v).ok()?);
        Some(())
    }),
    ("timeout", Takes::One, |l, v| {
        l.args.timeout = Some(units::parse_duration(v).ok()?);
        Some(())
    }),
    ("max-output", Takes::One, |l, v| {
        l.args.max_output = Some(units::parse_output_cap(v).ok()?);
        Some(())
    }),
    ("allow-host", Takes::Many, |l, v| {
        l.args
            .egress
            .allow_host
            .push(egress::parse_allow_host(v).ok()?);
        Some(())
    }),
    ("resolve", Takes::Many, |l, v| {
        l.args.egress.resolve.push(egress::parse_resolve(v).ok()?);
        Some(())
    }),
    ("max-egress", Takes::One, |l, v| {
        l.args.egress.max_egress = Some(egress::parse_budget(v).ok()?);
        Some(())
    }),
    ("dangerously-share-host-network", Takes::Flag, |l, _| {
        l.args.egress.dangerously_share_host_network = true;
        Some(())
    }),
    ("ro", Takes::Many, |l, v| {
        l.args.ro.push(v.into());
        Some(())
    }),
    ("rw", Takes::Many, |l, v| {
        l.args.rw.push(v.into());
        Some(())
    }),
    ("ro-cwd", Takes::Flag, |l, _| {
        l.args.ro_cwd = true;
        Some(())
    }),
    ("allow-system-rw", Takes::Flag, |l, _| {
        l.args.allow_system_rw = true;
        Some(())
    }),
    ("allow-exec", Takes::Many, |l, v| {
        l.args.allow_exec.push(v.into());
        Some(())
    }),
    ("cwd", Takes::One, |l, v| {
        l.args.cwd = Some(v.into());
        Some(())
    }),
    ("env", Takes::Many, |l, v| {
        l.args.env.push(v.to_string());
        Some(())
    }),
    ("profile", Takes::One, |l, v| {
        l.args.profile = v.to_string();
        Some(())
    }),
    ("report", Takes::One, |l, v| {
        l.args.report = Some(v.into());
        Some(())
    }),
    ("allow-degraded", Takes::Flag, |l, _| {
        l.args.allow_degraded = true;
        Some(())
    }),
    ("host-uid", Takes::One, |l, v| {
        l.args.host_uid = Some(super::parse_host_ids(v).ok()?);
        Some(())
    }),
    ("hostname", Takes::One, |l, v| {
        l.args.hostname = super::parse_hostname(v).ok()?;
        Some(())
    }),
    ("log-format", Takes::One, |l, v| {
        l.log_format = match v {
            "human" => LogFormat::Human,
            "json" => LogFormat::Json,
            _ => return None,
        };
        Some(())
    }),
    ("verbose", Takes::Count, |l, _| {
        l.verbose = l.verbose.checked_add(1)?;
        Some(())
    }),
];

/// A `run` line as clap would read it: (log format, verbosity, the arguments).
pub type Parsed = (LogFormat, u8, RunArgs);

/// Reads `raw` (`raw[0]` the program, `raw[1]` `run`), or `None` for clap to read it.
pub fn parse(raw: &[OsString]) -> Option<Parsed> {
    let mut words = raw.get(2..)?.iter();
    let mut line = Line {
        log_format: LogFormat::Human,
        verbose: 0,
        args: defaults(),
    };
    // Which options the line gave: clap refuses a second `One` or `Flag`.
    let mut given = [false; OPTIONS.len()];
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
            let at = OPTIONS.iter().position(|(n, _, _)| *n == name)?;
            let (_, takes, set) = OPTIONS.get(at)?;
            let seen = given.get_mut(at)?;
            if *seen && matches!(takes, Takes::One | Takes::Flag) {
                return None;
            }
            *seen = true;
            let value = match (takes, inline) {
                (Takes::Flag | Takes::Count, None) => "",
                (Takes::Flag | Takes::Count, Some(_)) => return None,
                (Takes::One | Takes::Many, Some(value)) => value,
                (Takes::One | Takes::Many, None) => words.next()?.to_str()?,
            };
            // A word that starts with `-` may be clap's next flag (except `-` alone, which
            // names standard output for `--report`).
            let takes_value = matches!(takes, Takes::One | Takes::Many);
            if takes_value && (value.is_empty() || (value.starts_with('-') && value != "-")) {
                return None;
            }
            set(&mut line, value)?;
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
    line.args.command = words
        .map(|w| w.to_str().map(str::to_string))
        .collect::<Option<Vec<String>>>()?;
    if line.args.command.is_empty() {
        return None;
    }
    Some((line.log_format, line.verbose, line.args))
}

/// `run`'s arguments before the line sets any: clap's defaults.
fn defaults() -> RunArgs {
    RunArgs {
        memory: None,
        cpus: None,
        pids: None,
        timeout: None,
        max_output: None,
        egress: EgressArgs {
            allow_host: Vec::new(),
            resolve: Vec::new(),
            max_egress: None,
            dangerously_share_host_network: false,
        },
        ro: Vec::new(),
        rw: Vec::new(),
        ro_cwd: false,
        allow_system_rw: false,
        allow_exec: Vec::new(),
        cwd: None,
        env: Vec::new(),
        profile: "default".to_string(),
        report: None,
        allow_degraded: false,
        host_uid: None,
        hostname: "hatchery".to_string(),
        command: Vec::new(),
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
        let mut table: Vec<(String, Takes)> = OPTIONS
            .iter()
            .map(|(n, t, _)| (n.to_string(), *t))
            .collect();
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
