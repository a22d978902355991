//! `hatchery profile ...`: read, check, compare, lint, import and export security profiles.
//!
//! Every verdict printed here comes from running the compiled filters — the bytes the
//! sandbox loads: the seccomp floor, loaded under every profile, and the profile's own —
//! so what these commands say is what the kernel enforces.
//!
//! Exit status: 0 success; 1 `lint` found something (unaccepted, at or above `--fail-on`)
//! or `diff` found differences; 2 bad input or a profile that cannot be used (one line on
//! stderr says why). A reader that stops early (`| head -1`) ends the output quietly and
//! changes no exit status.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args, Subcommand, ValueEnum};

use hatchery::profile::abi::Abi;
use hatchery::profile::floor::Floor;
use hatchery::profile::oci::{self, ImportOptions, KernelVersion};
use hatchery::profile::seccomp::{ArgCondition, CompareOp, SeccompPolicy, ValueSpec};
use hatchery::profile::verdict::{Analysis, Target};
use hatchery::profile::{BUILTIN, Profile, bpf, diff, lint, names};

/// Bad input or an unusable profile.
mod view;
use view::{oci_json, show};

const EXIT_ERROR: i32 = 2;
/// `lint` findings or `diff` differences.
const EXIT_FOUND: i32 = 1;

const PROFILE_EXAMPLES: &str = "\
Exit status: 0 success; 1 lint findings (not accepted, at or above --fail-on) or diff
differences; 2 bad input.

Examples:
  hatchery profile list --json
  hatchery profile show default --format pfc
  hatchery profile show strict --json
  hatchery profile check default --syscall ptrace
  hatchery profile check default --syscall clone --arg CLONE_NEWUSER --json
  hatchery profile check strict --all --json
  hatchery profile check default --syscall getpid --arch x86
  hatchery profile check compat --syscall memfd_create --exec-allowlist
  hatchery profile diff default strict
  hatchery profile diff default compat --json
  hatchery profile lint ./my-profile.toml
  hatchery profile lint compat --accept ptrace --json
  hatchery profile lint ./my-profile.toml --fail-on error
  hatchery profile import docker-default.json -o docker.toml
  hatchery profile export strict -o strict.json";

#[derive(Args, Debug)]
#[command(after_help = PROFILE_EXAMPLES)]
pub struct ProfileArgs {
    #[command(subcommand)]
    pub command: ProfileCommand,
}

#[derive(Subcommand, Debug)]
pub enum ProfileCommand {
    /// The shipped profiles, one line each
    List(ListArgs),
    /// The resolved profile, or the filter it compiles to
    Show(ShowArgs),
    /// The verdict for one syscall (or all of them) and the rule that decides it
    Check(CheckArgs),
    /// Syscalls whose verdict differs between two profiles, and other differences
    Diff(DiffArgs),
    /// Known-dangerous things a profile allows, with the reason for each
    Lint(LintArgs),
    /// Convert OCI / Docker seccomp JSON into a hatchery profile
    Import(ImportArgs),
    /// Write a profile's seccomp policy as OCI / Docker seccomp JSON
    Export(ExportArgs),
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Machine-readable output: name, sha256, description and origin of each
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    /// A readable summary
    Table,
    /// The resolved profile as JSON, with its origin, hash and the seccomp floor's rules
    /// (the same as --json)
    Json,
    /// The profile file
    Toml,
    /// OCI / Docker seccomp JSON
    OciJson,
    /// libseccomp's pseudo-filter code for the compiled filter
    Pfc,
    /// The compiled classic-BPF program, instruction by instruction
    Bpf,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// A shipped profile name or a TOML file
    #[arg(value_name = "NAME|FILE")]
    pub profile: String,
    #[arg(long, value_enum, default_value_t = ShowFormat::Table)]
    pub format: ShowFormat,
    /// Machine-readable output (--format json)
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("what").required(true).args(["syscall", "all"])))]
pub struct CheckArgs {
    /// A shipped profile name or a TOML file
    #[arg(value_name = "NAME|FILE")]
    pub profile: String,
    /// The syscall, by name or number (or --all for every syscall)
    #[arg(long, value_name = "NAME")]
    pub syscall: Option<String>,
    /// Argument values in order (VALUE), or at an index (N=VALUE); numbers or constants
    /// such as CLONE_NEWUSER|CLONE_NEWNS; missing arguments are 0
    #[arg(long = "arg", value_name = "[N=]VALUE", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Every syscall of the architecture, with all-zero arguments
    #[arg(long)]
    pub all: bool,
    /// The ABI the call enters through: native, x86_64, x86 (i386), x32
    #[arg(long, value_name = "ABI", default_value = "native")]
    pub arch: String,
    /// Decide as under an executable allowlist (run --allow-exec), whose rules the floor
    /// gains; a profile with its own allow_exec always is
    #[arg(long)]
    pub exec_allowlist: bool,
    /// Machine-readable output
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    #[arg(value_name = "A")]
    pub a: String,
    #[arg(value_name = "B")]
    pub b: String,
    /// Machine-readable output
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct LintArgs {
    #[arg(value_name = "NAME|FILE")]
    pub profile: String,
    /// Machine-readable output: one object per finding, with its rule id, severity and
    /// whether it is accepted
    #[arg(long)]
    pub json: bool,
    /// Accept the findings of this rule (repeatable): still reported, they no longer fail
    /// the lint. A profile accepts its own with `[lint] accept = ["RULE"]`
    #[arg(long, value_name = "RULE")]
    pub accept: Vec<String>,
    /// Review a profile you did not write: its own `[lint] accept` is ignored, so only
    /// what you accept with --accept is waved through
    #[arg(long)]
    pub ignore_profile_accept: bool,
    /// The lowest severity that fails the lint (exit 1); findings below it are reported
    /// only
    #[arg(long, value_enum, value_name = "SEVERITY", default_value_t = FailOn::Info)]
    pub fail_on: FailOn,
}

/// `lint --fail-on`: info (every finding fails), warning, error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    Info,
    Warning,
    Error,
}

impl FailOn {
    fn severity(self) -> lint::Severity {
        match self {
            FailOn::Info => lint::Severity::Info,
            FailOn::Warning => lint::Severity::Warning,
            FailOn::Error => lint::Severity::Error,
        }
    }
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// OCI / Docker seccomp JSON
    #[arg(value_name = "FILE.json")]
    pub file: PathBuf,
    /// Write the profile here instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Name of the new profile (default: from the file name)
    #[arg(long)]
    pub name: Option<String>,
    /// Kernel version that `includes.minKernel` is compared with (default: this one)
    #[arg(long, value_name = "X.Y")]
    pub kernel: Option<String>,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    #[arg(value_name = "NAME|FILE")]
    pub profile: String,
    /// Write the JSON here instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn main(args: ProfileArgs) -> i32 {
    let result = match args.command {
        ProfileCommand::List(a) => list(a),
        ProfileCommand::Show(a) => show(a),
        ProfileCommand::Check(a) => check(a),
        ProfileCommand::Diff(a) => diff_cmd(a),
        ProfileCommand::Lint(a) => lint_cmd(a),
        ProfileCommand::Import(a) => import(a),
        ProfileCommand::Export(a) => export(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => super::fail_with(&e, EXIT_ERROR),
    }
}

fn load(name: &str) -> anyhow::Result<Profile> {
    Ok(Profile::resolve(name)?)
}

/// Writes the result to stdout. A reader that has gone (`| head -1`) is no error: the
/// output ends there, quietly, as in every Unix tool, and the exit status is what the
/// command decided.
fn out(text: &str) -> anyhow::Result<i32> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(anyhow::anyhow!("cannot write to stdout: {e}")),
        Ok(()) => Ok(0),
    }
}

fn json_out(value: &impl serde::Serialize) -> anyhow::Result<i32> {
    out(&(hatchery::text::to_json_pretty(value)? + "\n"))
}

/// Writes a file whole or not at all.
fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    hatchery::paths::OutputTarget::prepare(path)
        .and_then(|t| t.write(text.as_bytes()))
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

fn list(a: ListArgs) -> anyhow::Result<i32> {
    let profiles = BUILTIN
        .iter()
        .map(|(name, _)| load(name))
        .collect::<anyhow::Result<Vec<Profile>>>()?;
    if a.json {
        let list: Vec<serde_json::Value> = profiles
            .iter()
            .map(|p| {
                serde_json::json!({
                    "name": p.name,
                    "sha256": p.sha256,
                    "description": p.description,
                    "origin": p.origin,
                })
            })
            .collect();
        return json_out(&list);
    }
    let mut text = String::new();
    for p in &profiles {
        text.push_str(&format!(
            "{:<10} {}  {}\n",
            p.name,
            p.sha256.get(..12).unwrap_or(&p.sha256),
            p.description
        ));
    }
    out(&text)
}

/// The six argument values `--arg` gives, in order or by index. An index given twice is
/// refused, not decided by the last one: `--arg 0x10 --arg 0=2` would otherwise check a
/// call other than the one the reviewer typed.
fn parse_args(list: &[String]) -> anyhow::Result<[u64; 6]> {
    let mut args = [0u64; 6];
    let mut given: [Option<&str>; 6] = [None; 6];
    let mut next = 0usize;
    for item in list {
        let (index, value) = match item.split_once('=') {
            Some((i, v)) => (
                i.trim().parse::<usize>().map_err(|_| {
                    anyhow::anyhow!("--arg {item:?}: expected N=VALUE with N from 0 to 5")
                })?,
                v,
            ),
            None => (next, item.as_str()),
        };
        let (Some(slot), Some(seen)) = (args.get_mut(index), given.get_mut(index)) else {
            anyhow::bail!("--arg {item:?}: a syscall has at most 6 arguments (0 to 5)");
        };
        if let Some(first) = seen {
            anyhow::bail!("--arg {item:?}: argument {index} is already given (--arg {first:?})");
        }
        *seen = Some(item.as_str());
        *slot =
            names::parse_value_expr(value).map_err(|e| anyhow::anyhow!("--arg {item:?}: {e}"))?;
        next = index.saturating_add(1);
    }
    Ok(args)
}

fn check(a: CheckArgs) -> anyhow::Result<i32> {
    let p = load(&a.profile)?;
    let abi = Abi::parse(&a.arch).map_err(|e| anyhow::anyhow!("--arch: {e}"))?;
    if !Abi::runnable().contains(&abi) {
        anyhow::bail!("--arch {abi}: this machine cannot run that ABI");
    }
    let args = parse_args(&a.args)?;
    if abi.arg_bits() == 32 && abi != Abi::X32 && args.iter().any(|v| *v > u64::from(u32::MAX)) {
        anyhow::bail!("--arg: {abi} passes 32-bit arguments");
    }
    let floor = Floor::new(
        &p.seccomp,
        a.exec_allowlist || p.landlock.allow_exec.is_some(),
    )?;
    let analysis = Analysis::with_floor(&p.seccomp, floor)?;
    let verdicts = match &a.syscall {
        Some(name) => vec![analysis.check(&Target::parse(abi, name)?, args)?],
        None => analysis.check_all(abi)?,
    };
    if a.json {
        let map: BTreeMap<String, _> = verdicts
            .iter()
            .map(|v| (v.target.label(), analysis.json(v)))
            .collect();
        return json_out(&map);
    }
    let text = if a.all {
        let mut t = format!(
            "{} and the seccomp floor on {} ({} syscalls, all-zero arguments)\n{:<24} {:>10}  {:<40} {}\n",
            p.name,
            abi,
            verdicts.len(),
            "syscall",
            "nr",
            "verdict",
            "decided by"
        );
        for v in &verdicts {
            t.push_str(&analysis.line(v));
            t.push('\n');
        }
        t
    } else {
        verdicts.iter().map(|v| analysis.describe(v)).collect()
    };
    out(&text)
}

/// What heads each side of a diff: the profile names, or — when both have the same name,
/// as two versions of one file do — what was given on the command line.
fn labels(a: &DiffArgs, pa: &Profile, pb: &Profile) -> (String, String) {
    if pa.name != pb.name {
        return (pa.name.clone(), pb.name.clone());
    }
    if a.a != a.b {
        return (a.a.clone(), a.b.clone());
    }
    (format!("{} (A)", pa.name), format!("{} (B)", pb.name))
}

fn diff_cmd(a: DiffArgs) -> anyhow::Result<i32> {
    let (mut pa, mut pb) = (load(&a.a)?, load(&a.b)?);
    let (la, lb) = labels(&a, &pa, &pb);
    let side = |p: &Profile, label: &str| serde_json::json!({ "name": p.name, "origin": p.origin, "sha256": p.sha256, "label": label });
    let (ja, jb) = (side(&pa, &la), side(&pb, &lb));
    // The labels head the columns and name the sides in the ABI lines.
    pa.name = la;
    pb.name = lb;
    let d = diff::diff(&pa, &pb)?;
    let code = if d.is_empty() { 0 } else { EXIT_FOUND };
    let count = |c: diff::Change| d.syscalls.iter().filter(|s| s.verdict == c).count();
    let counts = [
        diff::Change::Stricter,
        diff::Change::Looser,
        diff::Change::Different,
    ]
    .map(|c| (c.as_str(), count(c)));
    if a.json {
        let mut v = serde_json::to_value(&d)?;
        if let Some(map) = v.as_object_mut() {
            map.insert("a".into(), ja);
            map.insert("b".into(), jb);
            map.insert(
                "counts".into(),
                serde_json::Value::Object(
                    counts
                        .iter()
                        .map(|(k, n)| ((*k).to_string(), (*n).into()))
                        .collect(),
                ),
            );
        }
        json_out(&v)?;
        return Ok(code);
    }
    let mut t = String::new();
    if d.is_empty() {
        t.push_str(&format!("{} and {} enforce the same\n", pa.name, pb.name));
    } else if !d.syscalls.is_empty() {
        let [(_, stricter), (_, looser), (_, other)] = counts;
        t.push_str(&match d.verdict {
            diff::Change::Stricter => format!(
                "seccomp: {} is stricter than {} ({stricter} syscalls)\n",
                pb.name, pa.name
            ),
            diff::Change::Looser => format!(
                "seccomp: {} is looser than {} ({looser} syscalls)\n",
                pb.name, pa.name
            ),
            _ => format!(
                "seccomp, {} against {}: {stricter} syscalls stricter, {looser} looser, {other} otherwise different (another errno or action, neither more restrictive)\n",
                pb.name, pa.name
            ),
        });
    }
    for line in &d.abis {
        t.push_str(&format!("{line}\n"));
    }
    if !d.syscalls.is_empty() {
        let (wa, wb) = (pa.name.len().max(32), pb.name.len().max(32));
        t.push_str(&format!(
            "{} syscalls differ\n{:<24} {:<7} {:<wa$} {:<wb$} {:<9} where they differ\n",
            d.syscalls.len(),
            "syscall",
            "arch",
            pa.name,
            pb.name,
            "B is"
        ));
        for s in &d.syscalls {
            t.push_str(&format!(
                "{:<24} {:<7} {:<wa$} {:<wb$} {:<9} {}\n",
                s.syscall,
                s.arch,
                s.a,
                s.b,
                s.verdict.as_str(),
                s.example
            ));
        }
    }
    if !d.settings.is_empty() {
        t.push_str("settings that differ\n");
        for s in &d.settings {
            t.push_str(&format!(
                "  {:<22} {}: {}\n  {:<22} {}: {}\n",
                s.key, pa.name, s.a, "", pb.name, s.b
            ));
        }
    }
    out(&t)?;
    Ok(code)
}

fn lint_cmd(a: LintArgs) -> anyhow::Result<i32> {
    lint::check_accepted_ids(&a.accept).map_err(|m| anyhow::anyhow!("--accept: {m}"))?;
    let mut p = load(&a.profile)?;
    if a.ignore_profile_accept {
        p.lint.accept.clear();
    }
    let mut findings = lint::lint(&p)?;
    lint::accept(&mut findings, &a.accept);
    let threshold = a.fail_on.severity();
    let failing = findings
        .iter()
        .filter(|f| !f.accepted && f.severity >= threshold)
        .count();
    let code = if failing == 0 { 0 } else { EXIT_FOUND };
    if a.json {
        json_out(&findings)?;
        return Ok(code);
    }
    let mut t = String::new();
    if findings.is_empty() {
        t.push_str(&format!("{}: no findings\n", p.name));
    }
    for f in &findings {
        let state = if f.accepted { ", accepted" } else { "" };
        t.push_str(&format!(
            "{}: {} [{}{state}] {}\n  why: {}\n  e.g. {}\n",
            p.name, f.severity, f.id, f.message, f.reason, f.example
        ));
    }
    if !findings.is_empty() && failing == 0 {
        t.push_str(&format!(
            "{}: no finding fails the lint (accepted, or below --fail-on {})\n",
            p.name, threshold
        ));
    }
    out(&t)?;
    Ok(code)
}

fn import(a: ImportArgs) -> anyhow::Result<i32> {
    let text = hatchery::profile::read_bounded(&a.file)?;
    let origin = a.file.display().to_string();
    let parsed = oci::parse(&text, &origin)?;
    let kernel = match &a.kernel {
        Some(k) => KernelVersion::parse(k).map_err(|e| anyhow::anyhow!("--kernel: {e}"))?,
        None => KernelVersion::running().map_err(anyhow::Error::msg)?,
    };
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| oci::name_from_path(&a.file));
    let imported = oci::import(
        &parsed,
        &ImportOptions {
            name,
            source: a
                .file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or(origin),
            kernel,
        },
    )?;
    let toml = oci::to_toml(&imported.profile, &imported.notes)?;
    // What is written must load as it is.
    Profile::from_toml(&toml, "the imported profile")?;
    // A note may quote a name the file chose, however long.
    for n in &imported.notes {
        error_line!("note: {}", hatchery::text::clip(n, 300));
    }
    match &a.output {
        Some(path) => {
            write_file(path, &toml)?;
            error_line!(
                "wrote {} ({} rules); use it with: hatchery run --profile {} -- ...",
                path.display(),
                imported.profile.seccomp.rules.len(),
                path.display()
            );
            Ok(0)
        }
        None => out(&toml),
    }
}

fn export(a: ExportArgs) -> anyhow::Result<i32> {
    let p = load(&a.profile)?;
    let json = oci_json(&p)?;
    match &a.output {
        Some(path) => {
            write_file(path, &json)?;
            Ok(0)
        }
        None => out(&json),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_args;

    fn args(list: &[&str]) -> anyhow::Result<[u64; 6]> {
        parse_args(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn arguments_in_order_and_by_index_fill_their_places_once() -> anyhow::Result<()> {
        assert_eq!(args(&["1", "2", "5=7"])?, [1, 2, 0, 0, 0, 7]);
        assert_eq!(args(&["3=4", "9"])?, [0, 0, 0, 4, 9, 0]);
        assert_eq!(args(&[])?, [0; 6]);
        // Twice the same place, in order or by index: refused, never the last one kept.
        for twice in [&["0=1", "0=2"][..], &["1", "0=2"], &["2=1", "1=5", "9"]] {
            let e = args(twice).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("already given"), "{twice:?}: {e}");
        }
        assert!(args(&["6=1"]).is_err());
        assert!(args(&["5=1", "2"]).is_err(), "a seventh argument");
        Ok(())
    }
}
