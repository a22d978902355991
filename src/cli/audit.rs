//! `hatchery audit verify|tail`: check the trail's integrity, read it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use hatchery::audit::{self, AuditKey};
use hatchery::controller::paths;
use hatchery::signing::Keyring;

const AUDIT_EXAMPLES: &str = "\
Examples:
  hatchery audit verify
  hatchery audit verify --anchor /var/log/hatchery-audit.anchor
  journalctl -t hatchery-audit -o cat > anchor.txt && hatchery audit verify --anchor anchor.txt
  hatchery audit verify --json
  hatchery audit tail -n 20
  hatchery audit tail -f --state-dir /tmp/h-state";

const VERIFY_EXAMPLES: &str = "\
Exit status: 0 intact; 1 damaged (an edited, deleted, inserted or reordered entry, a cut
end, a vanished trail, a trail that does not match its anchor, a forged anchor line);
2 could not check (no key, unreadable files).

Examples:
  hatchery audit verify
  hatchery audit verify --state-dir /tmp/h-state --json
  hatchery audit verify --anchor /var/log/hatchery-audit.anchor
  journalctl -t hatchery-audit -o cat > anchor.txt && hatchery audit verify --anchor anchor.txt";

#[derive(Args, Debug)]
#[command(after_help = AUDIT_EXAMPLES)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: AuditCommand,
}

#[derive(Args, Debug, Clone)]
pub struct StateArgs {
    /// The controller's state directory (default /var/lib/hatchery for root,
    /// $XDG_STATE_HOME/hatchery otherwise)
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The controller's key file (default STATE_DIR/controller.key)
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check every entry's sequence, link, hash and MAC, that the trail has not vanished,
    /// and (with --anchor) that it holds every anchored head; name the first bad one
    Verify(VerifyArgs),
    /// Print entries readably, each checked first (sequence, link, hash; its MAC with the
    /// key): a damaged entry ends the output with exit status 1
    Tail(TailArgs),
}

#[derive(Args, Debug)]
#[command(after_help = VERIFY_EXAMPLES)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// Check the trail against this anchor (the controller's --audit-anchor file, or
    /// `journalctl -t hatchery-audit -o cat` saved to a file): every anchored head must be
    /// in the trail, every line's MAC valid
    #[arg(long, value_name = "FILE")]
    pub anchor: Option<PathBuf>,
    /// Check the trail against the head this node anchored in its cluster's etcd (a trail
    /// cut or rewritten after the fact does not hold it); with --node-id
    #[arg(long, value_name = "etcd://HOST:PORT[,...]", requires = "node_id")]
    pub cluster: Option<String>,
    /// The node whose trail this is (its controller's --node-id)
    #[arg(long, value_name = "NAME", requires = "cluster")]
    pub node_id: Option<String>,
    /// The cluster's key prefix [default: /hatchery/]
    #[arg(long, value_name = "PREFIX", requires = "cluster")]
    pub cluster_prefix: Option<String>,
    /// One JSON object: the result, the problem found, the anchor's result
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// How many of the last entries
    #[arg(short = 'n', long, default_value_t = 20)]
    pub lines: usize,
    /// Keep printing new entries
    #[arg(short, long)]
    pub follow: bool,
    /// One JSON object per line, as stored
    #[arg(long)]
    pub json: bool,
}

fn dir(s: &StateArgs) -> PathBuf {
    s.state_dir.clone().unwrap_or_else(paths::default_state_dir)
}

/// The key file (`--key`, or the state directory's), and whether there is none.
fn key_file(s: &StateArgs) -> (PathBuf, bool) {
    let path = s
        .key
        .clone()
        .unwrap_or_else(|| dir(s).join("controller.key"));
    let missing = matches!(std::fs::symlink_metadata(&path), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    (path, missing)
}

fn key(s: &StateArgs) -> anyhow::Result<AuditKey> {
    // Checking needs the key the trail was written with: a new key would check nothing.
    let (path, missing) = key_file(s);
    if missing && s.key.is_none() {
        anyhow::bail!(
            "the controller's key {} does not exist: checking the trail needs the key the controller wrote it with (pass it with --key FILE, or name the controller's state directory with --state-dir)",
            path.display()
        );
    }
    if missing {
        anyhow::bail!(
            "the key file {} given with --key does not exist: name the file the controller was started with (its --key, or STATE_DIR/controller.key)",
            path.display()
        );
    }
    let ring = Keyring::load(&path)?;
    Ok(AuditKey::from_mac(ring.derived_mac(audit::KEY_PURPOSE)?))
}

/// What `audit verify` found, for people and (with --json) for programs.
#[derive(Debug, Default, serde::Serialize)]
struct Outcome {
    state_dir: PathBuf,
    /// Whether the trail (and the anchor, if given) checked out.
    intact: bool,
    entries: Option<u64>,
    last_hash: Option<String>,
    /// The hash of the first entry: the trail's name in the anchor.
    trail: Option<String>,
    /// Bytes of a partial line after the last synced entry (an append a crash cut short;
    /// the controller removes it at its next start).
    #[serde(skip_serializing_if = "is_zero")]
    torn_tail_bytes: u64,
    problem: Option<Problem>,
    anchor: Option<AnchorOutcome>,
}

#[derive(Debug, serde::Serialize)]
struct Problem {
    /// `damaged`, `vanished`, `rolled_back`, `anchor` or `error` (could not check).
    kind: &'static str,
    /// The entry (`damaged`, `rolled_back`) or anchor line (`anchor`) it concerns.
    at: Option<u64>,
    evidence: Vec<String>,
    message: String,
}

#[derive(Debug, serde::Serialize)]
struct AnchorOutcome {
    path: PathBuf,
    ok: bool,
    #[serde(flatten)]
    report: Option<audit::AnchorReport>,
}

fn problem(e: &audit::AuditError) -> Problem {
    use audit::AuditError as E;
    let (kind, at, evidence) = match e {
        E::Damaged { line, .. } => ("damaged", Some(*line), Vec::new()),
        E::NotAFile { .. } => ("damaged", None, Vec::new()),
        E::Vanished { evidence, .. } => ("vanished", None, evidence.clone()),
        E::RolledBack { seq, .. } => ("rolled_back", Some(*seq), Vec::new()),
        E::Anchor { line: Some(l), .. } => ("anchor", Some(*l), Vec::new()),
        _ => ("error", None, Vec::new()),
    };
    Problem {
        kind,
        at,
        evidence,
        message: e.to_string(),
    }
}

/// Why `audit verify` did not find the trail intact.
enum Failure {
    Audit(audit::AuditError),
    /// The key (or the state directory) could not be used: nothing could be checked.
    Key(anyhow::Error),
}

impl From<audit::AuditError> for Failure {
    fn from(e: audit::AuditError) -> Failure {
        Failure::Audit(e)
    }
}

fn check(a: &VerifyArgs, out: &mut Outcome) -> Result<(), Failure> {
    // A trail in the /tmp fallback is read only from a directory of the caller's: another
    // user's directory there could hold another user's trail and key.
    paths::check_fallback_base(&out.state_dir, paths::BaseUse::Reach)
        .map_err(|e| Failure::Key(anyhow::Error::msg(e)))?;
    // Whether a trail vanished needs no key: asked first, so a wiped key hides nothing.
    if let audit::TrailState::Vanished { evidence } =
        audit::trail_state(&out.state_dir, a.anchor.as_deref())?
    {
        return Err(Failure::Audit(audit::AuditError::Vanished {
            path: out.state_dir.join(audit::LOG_FILE),
            evidence,
        }));
    }
    let k = key(&a.state).map_err(Failure::Key)?;
    let (summary, report) = audit::verify_with_anchor(&out.state_dir, &k, a.anchor.as_deref())?;
    out.entries = Some(summary.entries);
    out.last_hash = Some(summary.last_hash);
    out.trail = summary.first_hash;
    out.torn_tail_bytes = summary.torn_tail;
    if let Some(path) = &a.anchor {
        out.anchor = Some(AnchorOutcome {
            path: path.clone(),
            ok: true,
            report,
        });
    }
    if let Some(url) = &a.cluster {
        check_cluster_anchor(a, url, &out.state_dir, out.entries.unwrap_or(0))?;
    }
    Ok(())
}

/// The trail must hold the head its node anchored in the cluster: an entry with that
/// number and hash. A trail that ends before it was cut; one whose entry differs was
/// rewritten.
fn check_cluster_anchor(
    a: &VerifyArgs,
    url: &str,
    dir: &std::path::Path,
    verified: u64,
) -> Result<(), Failure> {
    let args = hatchery::controller::cluster::ClusterArgs {
        url: Some(url.to_string()),
        node_id: a.node_id.clone(),
        prefix: a.cluster_prefix.clone(),
        ..Default::default()
    };
    let opts = hatchery::controller::cluster::ClusterOptions::resolve(&args, &Default::default())
        .map_err(|e| Failure::Key(anyhow::Error::msg(e)))?
        .ok_or_else(|| Failure::Key(anyhow::Error::msg("--cluster needs etcd://HOST:PORT")))?;
    let heads = read_cluster_anchors(&opts).map_err(|e| Failure::Key(anyhow::Error::msg(e)))?;
    let anchor = format!("{url} (node {})", opts.node_id);
    if hatchery::controller::cluster::check_anchored_head(dir, verified, &heads, &anchor, false)? {
        Ok(())
    } else {
        Err(Failure::Key(anyhow::Error::msg(format!(
            "the cluster holds no audit head for node {}: check --node-id and --cluster-prefix",
            opts.node_id
        ))))
    }
}

#[cfg(feature = "cluster")]
fn read_cluster_anchors(
    opts: &hatchery::controller::cluster::ClusterOptions,
) -> Result<Vec<hatchery::controller::cluster::AnchorRecord>, String> {
    hatchery::controller::cluster::etcd::read_anchors(opts)
}

#[cfg(not(feature = "cluster"))]
fn read_cluster_anchors(
    _opts: &hatchery::controller::cluster::ClusterOptions,
) -> Result<Vec<hatchery::controller::cluster::AnchorRecord>, String> {
    Err("this hatchery was built without cluster support: build it with `cargo build --release --features cluster`".into())
}

fn verify(a: &VerifyArgs) -> i32 {
    let mut out = Outcome {
        state_dir: dir(&a.state),
        ..Outcome::default()
    };
    let result = check(a, &mut out);
    let code = match &result {
        Ok(()) => 0,
        Err(Failure::Audit(e)) if e.is_damage() => 1,
        Err(_) => 2,
    };
    out.intact = code == 0;
    if let Err(Failure::Key(e)) = &result {
        out.problem = Some(Problem {
            kind: "error",
            at: None,
            evidence: Vec::new(),
            message: format!("{e:#}"),
        });
    }
    if let Err(Failure::Audit(e)) = &result {
        if let (Some(path), None) = (&a.anchor, &out.anchor) {
            if matches!(
                e,
                audit::AuditError::RolledBack { .. } | audit::AuditError::Anchor { .. }
            ) {
                out.anchor = Some(AnchorOutcome {
                    path: path.clone(),
                    ok: false,
                    report: None,
                });
            }
        }
        out.problem = Some(problem(e));
    }
    if a.json {
        super::controller::out_json(&out);
        return code;
    }
    match result {
        Ok(()) => {
            super::controller::outln(&format!(
                "audit trail intact: {} entries, last hash {}",
                out.entries.unwrap_or(0),
                out.last_hash.as_deref().unwrap_or("")
            ));
            if out.torn_tail_bytes > 0 {
                super::controller::outln(&format!(
                    "after them, {} bytes of a partial entry: an append cut short by a crash or a power loss before it was synced (never reported durable); the controller removes them when it next starts",
                    out.torn_tail_bytes
                ));
            }
            if let Some(r) = out.anchor.as_ref().and_then(|a| a.report.as_ref()) {
                let last = r
                    .last_anchored_seq
                    .map(|s| format!(" (the last anchored: entry {s})"))
                    .unwrap_or_default();
                let mut notes = Vec::new();
                if r.other_key_lines > 0 {
                    notes.push(format!(
                        "{} lines of other controllers' keys skipped",
                        r.other_key_lines
                    ));
                }
                if r.earlier_trail_lines > 0 {
                    notes.push(format!(
                        "{} lines of the earlier trail this one replaced (see its first entry)",
                        r.earlier_trail_lines
                    ));
                }
                let notes = if notes.is_empty() {
                    String::new()
                } else {
                    format!("; {}", notes.join("; "))
                };
                super::controller::outln(&format!(
                    "matches the anchor {}: {} anchored heads checked{last}{notes}",
                    r.anchor, r.heads_checked
                ));
            }
        }
        // The damage may quote what was written into the trail.
        Err(Failure::Audit(e)) if code == 1 => {
            super::controller::outln(&hatchery::text::escape_controls(&e.to_string()))
        }
        Err(Failure::Audit(e)) => error_line!("{e}"),
        Err(Failure::Key(e)) => error_line!("{e:#}"),
    }
    code
}

/// The key `tail` checks MACs with: `--key`, or the state directory's key where there is
/// one; `None` (the chain alone is checked) where neither is.
fn tail_key(s: &StateArgs) -> anyhow::Result<Option<AuditKey>> {
    if s.key.is_none() && key_file(s).1 {
        return Ok(None);
    }
    key(s).map(Some)
}

fn tail(a: &TailArgs) -> i32 {
    let d = dir(&a.state);
    if let Err(e) = paths::check_fallback_base(&d, paths::BaseUse::Reach) {
        error_line!("{e}");
        return 2;
    }
    let key = match tail_key(&a.state) {
        Ok(k) => k,
        Err(e) => {
            error_line!("{e:#}");
            return 2;
        }
    };
    if key.is_none() {
        error_line!(
            "note: no key: each entry's sequence, link and hash are checked, not its MAC (pass the controller's key with --key FILE)"
        );
    }
    let mut trail = match audit::TrailFollower::open(&d, key.as_ref()) {
        Ok(t) => t,
        Err(e) => {
            error_line!("{e}");
            return 2;
        }
    };
    let print = |e: &audit::AuditEntry| {
        if a.json {
            super::controller::outln(&hatchery::text::to_json(e).unwrap_or_default());
        } else {
            // Details carry what workers chose (a reason, a command, a host name).
            let line = super::shown::shown(&audit::describe(e));
            // Asked at each entry: the terminal may be resized while `-f` waits.
            super::controller::outln(&match super::shown::table_width() {
                Some(width) => super::shown::field("", &line, width),
                None => line,
            });
        }
    };
    // A damaged entry ends the reading: what came before it is shown, it and what
    // follows it never are.
    let stopped = |e: audit::AuditError| -> i32 {
        if e.is_damage() {
            error_line!(
                "{}; nothing from there on is shown (`hatchery audit verify` checks the whole trail)",
                hatchery::text::escape_controls(&e.to_string())
            );
            1
        } else {
            error_line!("{e}");
            2
        }
    };
    // The last `lines` entries of what is there now, and only those kept.
    let mut last = std::collections::VecDeque::with_capacity(a.lines.min(1024));
    let read = trail.read_new(|e| {
        if a.lines > 0 {
            if last.len() == a.lines {
                last.pop_front();
            }
            last.push_back(e);
        }
    });
    last.iter().for_each(print);
    drop(last);
    if let Err(e) = read {
        return stopped(e);
    }
    if !a.follow {
        return 0;
    }
    loop {
        if super::stdout_gone() {
            // Nobody reads any more: following on would print to no one, for ever.
            return 0;
        }
        std::thread::sleep(Duration::from_millis(300));
        if let Err(e) = trail.read_new(|e| print(&e)) {
            return stopped(e);
        }
    }
}

pub fn main(args: AuditArgs) -> i32 {
    match &args.command {
        AuditCommand::Verify(v) => verify(v),
        AuditCommand::Tail(t) => tail(t),
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
