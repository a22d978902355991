//! Every command the README shows and every example in every `--help`, found mechanically
//! (so that an example is covered the day it is written), is checked to do what the text
//! says: the exit status the text shows (`$ echo $?`, `echo "exit $?"`), and otherwise at
//! least that it is not refused as bad usage (exit 2).
//!
//! - README transcripts (`$ hatchery ...` in a code block, `\` continuations joined) run for
//!   real, in order, in a scratch directory holding the repository's `examples/` and
//!   `tests/fixtures/`, with the transcript's own setup lines (`mkdir`, `cp`; a `$ cat FILE`
//!   followed by its text makes FILE). Commands that talk to a controller get
//!   `--socket` (or `--state-dir`) of one started for the test.
//! - README example lines (`hatchery ...` in a code block, not a synopsis with `[`, `|` or
//!   `...`) and `--help` examples (the lines after `Examples:`) are parsed with the real
//!   command-line definition; those that are safe to run here (run, doctor, profile, and
//!   the controller's clients against the test's controller) run for real too.
//!   The controller itself, `agent` (it needs a worker), `manifest` and `audit` (they
//!   name system files) and anything writing outside the scratch directory are parsed only.

mod common;

#[allow(dead_code, unused_imports, unused_macros)]
#[path = "../src/cli/mod.rs"]
mod cli;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use clap::{CommandFactory, Parser};
use common::controller::TestController;
use common::*;

/// Commands known to fail until other changes land (a substring of the command, and
/// why). A listed command that passes fails the test, so that the list only shrinks.
const KNOWN_PENDING: &[(&str, &str)] = &[];

/// Transcripts typed at a terminal, run under script(1) to have one.
const AT_A_TERMINAL: &[&str] = &["TIOCSTI"];

/// Why this host cannot show what the README shows for `command`, if it cannot.
fn host_differs(command: &str) -> Option<&'static str> {
    let no_tiocsti =
        std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti").is_ok_and(|v| v.trim() == "0");
    if command.contains("TIOCSTI") && no_tiocsti {
        eprintln!(
            "NOTE: output of {command:?} not compared: TIOCSTI is off on this kernel (dev.tty.legacy_tiocsti = 0)"
        );
        return Some("TIOCSTI is off");
    }
    None
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

const LIMIT: Duration = Duration::from_secs(90);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One command found in the documentation.
#[derive(Debug, Clone)]
struct Found {
    /// Where: `README.md:LINE` or `hatchery SUB --help`.
    origin: String,
    command: String,
    /// From a README transcript: run in order, with its setup.
    transcript: bool,
    /// The exit status the text shows for it.
    expected: Option<i32>,
    /// Setup lines before it in the same transcript (run first, once).
    setup: Vec<Setup>,
    /// The output the transcript shows for it.
    shown: Vec<String>,
}

#[derive(Debug, Clone)]
enum Setup {
    Shell(String),
    File(String, String),
}

// ---- extraction ----------------------------------------------------------------------

/// The commands of the README and of every page under `docs/`.
fn readme_commands() -> Vec<Found> {
    let mut pages = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".md"))
                .map(|n| format!("docs/{n}"))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    pages.extend(docs);
    pages.iter().flat_map(|p| page_commands(p)).collect()
}

/// One page's commands: transcripts (`$ ...`) and example lines (`hatchery ...`).
fn page_commands(page: &str) -> Vec<Found> {
    let text = std::fs::read_to_string(repo().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut in_block = false;
    let mut i = 0;
    let mut setup: Vec<Setup> = Vec::new();
    while i < lines.len() {
        let line = lines.get(i).copied().unwrap_or("");
        if line.starts_with("```") {
            in_block = !in_block;
            setup.clear();
            i += 1;
            continue;
        }
        if !in_block {
            // Commands in running text: `hatchery ... --flag ...` (a bare name such as
            // `hatchery run` refers to a command, it is not an example).
            for (n, span) in line.split('`').enumerate() {
                let span = span.replace("\\|", "|");
                if n % 2 == 1
                    && span.starts_with("hatchery ")
                    && span.contains(" --")
                    && !is_synopsis(&span)
                {
                    out.push(Found {
                        origin: format!("{page}:{}", i + 1),
                        command: span,
                        transcript: false,
                        expected: None,
                        setup: Vec::new(),
                        shown: Vec::new(),
                    });
                }
            }
            i += 1;
            continue;
        }
        let origin = format!("{page}:{}", i + 1);
        if let Some(first) = line.strip_prefix("$ ") {
            // A command, with its `\` continuations.
            let mut command = first.to_string();
            while command.ends_with('\\') {
                command.pop();
                i += 1;
                command.push(' ');
                command.push_str(lines.get(i).map(|l| l.trim()).unwrap_or(""));
            }
            // Its output: the lines up to the next command or the end of the block.
            let mut output = Vec::new();
            while let Some(next) = lines.get(i + 1) {
                if next.starts_with("$ ") || next.starts_with("```") {
                    break;
                }
                output.push(next.to_string());
                i += 1;
            }
            let command = command.trim().to_string();
            if command.starts_with("hatchery ") {
                let expected = command
                    .contains("echo \"exit $?\"")
                    .then(|| {
                        output
                            .iter()
                            .find_map(|l| l.trim().strip_prefix("exit ")?.parse().ok())
                    })
                    .flatten();
                out.push(Found {
                    origin,
                    command,
                    transcript: true,
                    expected,
                    setup: setup.clone(),
                    shown: output.clone(),
                });
            } else if command == "echo $?" {
                let shown = output.first().and_then(|l| l.trim().parse().ok());
                if let Some(last) = out.last_mut().filter(|f: &&mut Found| f.transcript) {
                    last.expected = shown;
                }
            } else if let Some(file) = command
                .strip_prefix("cat ")
                .filter(|f| !f.starts_with('/') && !f.contains(' ') && !output.is_empty())
            {
                // The transcript shows the file: make it.
                let mut body = output.join("\n");
                body.push('\n');
                setup.push(Setup::File(file.to_string(), body));
            } else if command.starts_with("mkdir ") || command.starts_with("cp ") {
                setup.push(Setup::Shell(command));
            }
        } else if line.starts_with("hatchery ") && !is_synopsis(line) {
            out.push(Found {
                origin,
                command: strip_comment(line).trim().to_string(),
                transcript: false,
                expected: None,
                setup: Vec::new(),
                shown: Vec::new(),
            });
        }
        i += 1;
    }
    out
}

/// A usage synopsis (`hatchery kill ID [--recursive]`), not a command.
fn is_synopsis(line: &str) -> bool {
    let bare = strip_comment(line);
    let placeholder = bare
        .split_whitespace()
        .any(|w| w.len() >= 2 && w.chars().all(|c| c.is_ascii_uppercase()) && w != "PWD");
    bare.contains('[')
        || bare.contains("...")
        || bare.contains('…')
        || placeholder
        || (bare.contains('|') && !bare.contains(" | "))
}

/// The line without an unquoted ` # comment`.
fn strip_comment(line: &str) -> String {
    let mut quote = None;
    let mut prev = ' ';
    let mut out = String::new();
    for c in line.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => break,
            _ => {}
        }
        out.push(c);
        prev = c;
    }
    out
}

/// Every subcommand path (`["profile", "check"]`), the top level first.
fn subcommand_paths() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(path.clone());
        for sub in cmd.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            let mut p = path.clone();
            p.push(sub.get_name().to_string());
            walk(sub, p, out);
        }
    }
    let mut out = Vec::new();
    walk(&cli::Cli::command(), Vec::new(), &mut out);
    out
}

/// The examples in every `--help`, as the binary prints them (each subcommand's help
/// once: a subcommand's examples also show in no other help).
fn help_examples() -> Vec<Found> {
    let mut out = Vec::new();
    for path in subcommand_paths() {
        let mut cmd = Command::new(hatchery());
        cmd.args(&path).arg("--help");
        let help = run_with_timeout(&mut cmd, LIMIT);
        let origin = format!(
            "hatchery {}--help",
            path.iter().map(|p| format!("{p} ")).collect::<String>()
        );
        assert_eq!(code(&help), 0, "{origin}: {}", stderr(&help));
        let text = String::from_utf8_lossy(&help.stdout).to_string();
        // Examples are the lines indented by two spaces that start with `hatchery `, in an
        // `Examples:` section or any other (`Inside a worker ...:`); option descriptions
        // are indented further.
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            {
                let trimmed = line.trim();
                if line.starts_with("  hatchery ") {
                    let mut command = strip_comment(trimmed).trim().to_string();
                    let mut width = line.len();
                    // `\` continuations, and lines clap wrapped at the help's width.
                    loop {
                        let next = lines.clone().next().unwrap_or("");
                        // clap wraps at 100 columns: a long line went on below.
                        let wrapped = width > 80
                            && next.starts_with("  ")
                            && !next.trim().starts_with("hatchery ")
                            && !next.trim().is_empty();
                        width = next.len();
                        if !command.ends_with('\\') && !wrapped {
                            break;
                        }
                        if command.ends_with('\\') {
                            command.pop();
                        }
                        command.push(' ');
                        command.push_str(lines.next().map(str::trim).unwrap_or(""));
                    }
                    out.push(Found {
                        origin: origin.clone(),
                        command,
                        transcript: false,
                        expected: None,
                        setup: Vec::new(),
                        shown: Vec::new(),
                    });
                }
            }
        }
    }
    out
}

// ---- parsing as a shell would --------------------------------------------------------

/// Splits a command line into words as sh would (quotes, backslashes, `$PWD`), up to the
/// first unquoted `|`, `>`, `<`, `;` or `&`.
fn words(line: &str, pwd: &Path) -> Vec<String> {
    let pwd = pwd.to_string_lossy().to_string();
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') => quote = None,
            (Some('\''), _) => word.push(c),
            (Some('"'), '"') => quote = None,
            (_, '$') if quote != Some('\'') && line_follows(&mut chars, "PWD") => {
                word.push_str(&pwd);
                in_word = true;
            }
            (Some('"'), '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            (Some(_), _) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                    in_word = true;
                }
            }
            (None, '|' | '>' | '<' | ';' | '&') => break,
            (None, '#') if !in_word => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, _) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// Consumes `name` (or `{name}`) if it comes next.
fn line_follows(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, name: &str) -> bool {
    let rest: String = chars.clone().take(name.len() + 2).collect();
    if rest.starts_with(name) {
        for _ in 0..name.len() {
            chars.next();
        }
        true
    } else if rest.starts_with(&format!("{{{name}}}")) {
        for _ in 0..name.len() + 2 {
            chars.next();
        }
        true
    } else {
        false
    }
}

// ---- running -------------------------------------------------------------------------

/// A scratch directory with what the examples use: the repository's `examples/` and
/// `tests/fixtures/`, a `workspace/`, an `agent.py` and a `contract.toml`.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("hatchery-readme-")
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path();
    for (from, to) in [
        ("examples", "examples"),
        ("tests/fixtures", "tests/fixtures"),
    ] {
        if let Some(parent) = d.join(to).parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        let out = run_with_timeout(
            Command::new("cp")
                .arg("-r")
                .arg(repo().join(from))
                .arg(d.join(to)),
            LIMIT,
        );
        assert_eq!(code(&out), 0, "cp {from}: {}", stderr(&out));
    }
    std::fs::create_dir(d.join("workspace")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(d.join("agent.py"), "print('agent ran')\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(d.join("contract.toml"), "").unwrap_or_else(|e| panic!("{e}"));
    // The files the profile examples name: a profile of one's own and Docker's JSON.
    let profile = run_with_timeout(
        Command::new(hatchery()).args(["profile", "show", "default", "--format", "toml"]),
        LIMIT,
    );
    assert_eq!(code(&profile), 0, "{}", stderr(&profile));
    std::fs::write(d.join("my-profile.toml"), &profile.stdout).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(
        repo().join("tests/fixtures/docker-default-seccomp.json"),
        d.join("docker-default.json"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The sandbox's uid must be able to read what it is given.
    let out = run_with_timeout(Command::new("chmod").args(["-R", "a+rX"]).arg(d), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    dir
}

/// The subcommand path at the start of `argv` (after `hatchery` and global flags).
fn subcommand_of(argv: &[String]) -> Vec<String> {
    let mut cmd = cli::Cli::command();
    let mut path = Vec::new();
    for a in argv.iter().skip(1) {
        if a.starts_with('-') {
            continue;
        }
        match cmd.find_subcommand(a) {
            Some(sub) => {
                path.push(a.clone());
                cmd = sub.clone();
            }
            None => break,
        }
    }
    path
}

/// What a command needs: run against the test's controller, run alone, or parse only.
#[derive(Debug, PartialEq)]
enum How {
    Controller,
    Alone,
    ParseOnly,
}

fn how(f: &Found, argv: &[String]) -> How {
    let sub = subcommand_of(argv);
    let first = sub.first().map(String::as_str).unwrap_or("");
    // Writes outside the scratch directory (an install location, a system file).
    let writes_elsewhere = f.command.contains("> /") || f.command.contains(">/");
    // Runs until stopped (`approvals --watch`, `audit tail -f`).
    let follows = argv
        .iter()
        .any(|a| a == "--watch" || a == "-f" || a == "--follow");
    if writes_elsewhere || follows {
        return How::ParseOnly;
    }
    match first {
        "run" | "doctor" | "profile" | "completions" | "man" | "" => How::Alone,
        "spawn" | "ps" | "kill" | "kill-switch" | "approvals" | "approve" | "deny" => {
            How::Controller
        }
        "audit" if sub.get(1).map(String::as_str) == Some("tail") => How::Controller,
        _ => How::ParseOnly,
    }
}

/// The command with `--socket` (or `--state-dir`) of the test's controller after its
/// subcommand.
fn against(command: &str, argv: &[String], c: &TestController) -> String {
    let sub = subcommand_of(argv);
    let flag = if sub.first().map(String::as_str) == Some("audit") {
        format!("--state-dir '{}'", c.state.display())
    } else {
        format!("--socket '{}'", c.socket.display())
    };
    let head = format!("hatchery {}", sub.join(" "));
    match command.strip_prefix(&head) {
        Some(rest) => format!("{head} {flag}{rest}"),
        None => command.to_string(),
    }
}

/// `sh -c COMMAND` in `dir` with the binary first on PATH, in a process group of its own
/// that is killed whole if it outlives the limit (a pipeline's commands included).
fn sh(command: &str, dir: &Path) -> Output {
    use std::os::unix::process::CommandExt;
    let files = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (out_path, err_path) = (files.path().join("out"), files.path().join("err"));
    let create = |p: &Path| std::fs::File::create(p).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = shell(command, dir);
    cmd.process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(create(&out_path))
        .stderr(create(&err_path));
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("sh: {e}"));
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let start = std::time::Instant::now();
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if start.elapsed() > LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever the command left running in its group goes with it.
    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
    let status = match status {
        Some(s) => s,
        None => {
            let _ = child.wait();
            panic!("{command:?} did not finish within {LIMIT:?}");
        }
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap_or_default(),
        stderr: std::fs::read(&err_path).unwrap_or_default(),
    }
}

fn shell(command: &str, dir: &Path) -> Command {
    let bin_dir = hatchery()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", path)
        .env("PWD", dir);
    cmd
}

/// What went wrong with one command, if anything.
fn check(f: &Found, dir: &Path, c: Option<&TestController>) -> Result<(), String> {
    let argv = words(&f.command, dir);
    if let Err(e) = cli::Cli::try_parse_from(&argv) {
        return Err(format!("does not parse: {}", e.render()));
    }
    let how = how(f, &argv);
    let command = match (&how, c) {
        (How::ParseOnly, _) => return Ok(()),
        (How::Controller, Some(c)) => against(&f.command, &argv, c),
        (How::Controller, None) => return Ok(()),
        (How::Alone, _) => f.command.clone(),
    };
    // Shown as typed at a terminal (the sandbox's own terminal is the point): run under
    // script(1), which gives it one.
    let command = if AT_A_TERMINAL.iter().any(|n| command.contains(n)) {
        format!("script -qec {} /dev/null", shell_quote(&command))
    } else {
        command
    };
    let started = std::time::Instant::now();
    let out = sh(&command, dir);
    if started.elapsed() > Duration::from_secs(5) {
        eprintln!("SLOW {:?}: {}", started.elapsed(), f.command);
    }
    // `...; echo "exit $?"` shows the status in its output.
    let status = if command.contains("echo \"exit $?\"") {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("exit ")?.parse().ok())
            .unwrap_or(-1)
    } else {
        out.status.code().unwrap_or(-1)
    };
    let said = || format!("exit {status}: {} {}", stdout(&out), stderr(&out));
    let printed = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // What the test's controller holds is not what the README's had: its output differs.
    let compare = how != How::Controller && host_differs(&f.command).is_none();
    // A transcript interleaves hatchery's lines with the command's output: each part is
    // looked for on its own.
    let missing = |l: &&String| {
        l.split("hatchery:")
            .enumerate()
            .map(|(n, part)| {
                if n == 0 {
                    part.trim().to_string()
                } else {
                    format!("hatchery:{}", part.trim_end())
                }
            })
            .filter(|part| !part.trim().is_empty())
            .any(|part| !printed.contains(part.trim()))
    };
    if let Some(line) = f
        .shown
        .iter()
        .filter(|l| compare && is_stable(l))
        .find(missing)
    {
        return Err(format!(
            "the text shows {line:?}, which it did not print; {}",
            said()
        ));
    }
    match f.expected {
        Some(want) if status != want => Err(format!("the text shows exit {want}; {}", said())),
        Some(_) => Ok(()),
        None if status == 2 => Err(format!("refused as bad usage; {}", said())),
        None if stderr(&out).contains("panicked") => Err(format!("panicked; {}", said())),
        None => Ok(()),
    }
}

/// A line of shown output that any host prints alike: no numbers (sizes, times, ids,
/// hashes, versions), no paths of this machine, no JSON (its key order and values vary).
fn is_stable(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty()
        && !t.chars().any(|c| c.is_ascii_digit())
        && !t.starts_with('{')
        && !t.starts_with('[')
        && !t.contains("/tmp/")
        && !t.contains('…')
        && !t.contains("...")
}

fn pending(command: &str) -> Option<&'static str> {
    KNOWN_PENDING
        .iter()
        .find(|(needle, _)| command.contains(needle))
        .map(|(_, why)| *why)
}

/// Checks every command; fails listing each one that does not do what its text says,
/// and each listed as pending that now works.
fn check_all(found: &[Found]) {
    let dir = scratch();
    let mut c = None;
    if found.iter().any(|f| {
        let argv = words(&f.command, dir.path());
        cli::Cli::try_parse_from(&argv).is_ok() && how(f, &argv) == How::Controller
    }) && is_root()
    {
        c = Some(TestController::start("", &[]));
    }
    // Setup lines made under /tmp by a transcript are removed afterwards.
    let made_in_tmp: Vec<PathBuf> = found
        .iter()
        .flat_map(|f| f.setup.iter())
        .filter_map(|s| match s {
            Setup::Shell(cmd) => cmd
                .split_whitespace()
                .find(|w| w.starts_with("/tmp/"))
                .map(PathBuf::from),
            Setup::File(..) => None,
        })
        .filter(|p| !p.exists())
        .collect();
    let mut done_setup: Vec<String> = Vec::new();
    eprintln!("checking {} documented commands", found.len());
    let mut failures = Vec::new();
    let mut now_passing = Vec::new();
    for f in found {
        for s in &f.setup {
            let key = format!("{s:?}");
            if done_setup.contains(&key) {
                continue;
            }
            match s {
                Setup::Shell(cmd) => {
                    let out = sh(cmd, dir.path());
                    assert_eq!(code(&out), 0, "{}: setup {cmd}: {}", f.origin, stderr(&out));
                }
                Setup::File(name, body) => {
                    std::fs::write(dir.path().join(name), body)
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                }
            }
            done_setup.push(key);
        }
        let result = check(f, dir.path(), c.as_ref());
        match (result, pending(&f.command)) {
            (Ok(()), Some(_)) => now_passing.push(format!("{}: {}", f.origin, f.command)),
            (Ok(()), None) => {}
            (Err(e), Some(why)) => {
                eprintln!("PENDING {}: {} ({why}): {e}", f.origin, f.command);
            }
            (Err(e), None) => failures.push(format!("{}: {}\n    {e}", f.origin, f.command)),
        }
        // A kill switch an example engaged is released for the next.
        if let Some(c) = &c {
            if f.command.contains("kill-switch") && !f.command.contains("--release") {
                let _ = c.cli(&["kill-switch", "--release"]);
            }
        }
    }
    drop(c);
    for p in made_in_tmp {
        let _ = std::fs::remove_dir_all(p);
    }
    assert!(
        failures.is_empty(),
        "{} documented command(s) do not do what the text says:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        now_passing.is_empty(),
        "now working: remove from KNOWN_PENDING:\n{}",
        now_passing.join("\n")
    );
}

#[test]
fn the_extraction_finds_the_readme_transcripts_and_every_help_example() {
    let readme = readme_commands();
    assert!(
        readme.iter().filter(|f| f.transcript).count() >= 20,
        "{readme:#?}"
    );
    assert!(readme.iter().any(|f| f.command.starts_with("hatchery profile lint compat")
        && f.expected == Some(1)));
    assert!(
        readme
            .iter()
            .any(|f| f.command.contains("-- id") && f.expected == Some(126))
    );
    let help = help_examples();
    for sub in [
        "hatchery run ",
        "hatchery controller",
        "hatchery spawn ",
        "hatchery completions ",
    ] {
        assert!(
            help.iter().any(|f| f.command.starts_with(sub)),
            "no --help example of {sub}: {help:#?}"
        );
    }
}

#[test]
fn every_command_in_the_readme_does_what_the_readme_says() {
    if skip_unless_root("README commands (they start sandboxes and a controller)") {
        return;
    }
    check_all(&readme_commands());
}

#[test]
fn every_help_example_parses_and_runs() {
    if skip_unless_root("--help examples (they start sandboxes and a controller)") {
        return;
    }
    check_all(&help_examples());
}
