//! `hatchery doctor`: what this host (and this user) can enforce, and what `run` would
//! have to degrade, with the fix for each gap.
//!
//! Exit status: 0 when no check fails (warnings included), 1 when one does — so a script
//! or a provisioning step can gate on it; the same with --json.

use std::io::Write;

use clap::Args;
use serde::Serialize;

use hatchery::sandbox::cgroup::CgroupManager;
use hatchery::sandbox::preflight::fix;
use hatchery::sandbox::{self, Host};

#[derive(Args, Debug)]
#[command(
    after_help = "Exit status: 0 every check is ok (or only warns); 1 a check FAILs.\n\nExamples:\n  hatchery doctor\n  hatchery doctor --json\n  hatchery doctor >/dev/null || echo 'this host cannot enforce everything'"
)]
pub struct DoctorArgs {
    /// Machine-readable output
    #[arg(long)]
    pub json: bool,
}

/// A check's outcome. Ordered: `ok < warn < fail`.
#[derive(Serialize, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    /// Works, with an optional improvement.
    Warn,
    /// Something `run` cannot enforce here.
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

#[derive(Serialize)]
struct Check {
    name: &'static str,
    status: Status,
    /// Not failed (ok or warn).
    ok: bool,
    detail: String,
    /// How to fix it, when not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

#[derive(Serialize)]
struct Diagnosis {
    /// The worst status of the checks; `fail` is exit status 1.
    status: Status,
    kernel: String,
    uid: u32,
    rootless: bool,
    checks: Vec<Check>,
    /// What `run` would refuse without --allow-degraded.
    degraded: Vec<String>,
}

impl Check {
    /// A check that passes or fails.
    fn new(name: &'static str, ok: bool, detail: String, fix: Option<String>) -> Check {
        Check {
            name,
            status: if ok { Status::Ok } else { Status::Fail },
            ok,
            detail,
            fix,
        }
    }
}

fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| {
            format!(
                "{} {}",
                u.release().to_string_lossy(),
                u.machine().to_string_lossy()
            )
        })
        .unwrap_or_else(|_| "unknown".into())
}

/// Runs every check in the order they are reported, collecting what `run` would have to
/// degrade along the way.
fn diagnose() -> Diagnosis {
    let host = Host::detect();
    let uid = nix::unistd::geteuid().as_raw();
    let rootless = uid != 0;
    let mut degraded = Vec::new();
    let mut checks = vec![user_namespaces()];
    if rootless {
        checks.push(id_mapping(uid));
    }
    checks.push(match &host.cgroups {
        Some(m) => cgroup_limits(m.as_ref(), &mut degraded),
        None => no_cgroups(&host, rootless, &mut degraded),
    });
    checks.push(landlock(&host, &mut degraded));
    checks.push(seccomp(&host, &mut degraded));
    Diagnosis {
        status: checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok),
        kernel: kernel_release(),
        uid,
        rootless,
        checks,
        degraded,
    }
}

/// Whether the sandbox can have its namespaces (user, pid, mount, net, ipc, uts, cgroup).
fn user_namespaces() -> Check {
    let userns = sandbox::userns::probe();
    Check::new(
        "user namespaces",
        userns.is_ok(),
        match &userns {
            Ok(()) => "available: the sandbox gets user, pid, mount, net, ipc, uts and cgroup namespaces".into(),
            Err(e) => format!("unavailable: {e}"),
        },
        userns.err().map(|_| {
            "sysctl -w user.max_user_namespaces=15000; for non-root also kernel.unprivileged_userns_clone=1 and kernel.apparmor_restrict_unprivileged_userns=0".to_string()
        }),
    )
}

/// Which ids a rootless sandbox can map: subordinate ranges give workers distinct ids;
/// without them every sandbox runs as the caller (a warning, not a failure).
fn id_mapping(uid: u32) -> Check {
    let ranges = sandbox::userns::subordinate_ranges(uid);
    Check {
        name: "id mapping",
        status: if ranges.is_some() { Status::Ok } else { Status::Warn },
        ok: true,
        detail: match &ranges {
            Some((u, g, _, _)) => format!(
                "your uid as inside root, plus subordinate uids {}..{} / gids {}..{} via newuidmap/newgidmap (distinct ids for workers)",
                u.start,
                u.start.saturating_add(u.count - 1),
                g.start,
                g.start.saturating_add(g.count - 1)
            ),
            None => "your uid only (no /etc/subuid range or no newuidmap): every sandbox runs as you, setgroups denied".into(),
        },
        fix: ranges.is_none().then(|| "optional: install uidmap and add a range for your user to /etc/subuid and /etc/subgid".into()),
    }
}

/// Which limit controllers the cgroups here have, and whether memory limits hold with
/// swap; each missing one is a limit `run` would have to degrade.
fn cgroup_limits(m: &dyn CgroupManager, degraded: &mut Vec<String>) -> Check {
    let c = m.controllers();
    let mut have = Vec::new();
    let mut missing = Vec::new();
    for (name, ok) in [("memory", c.memory), ("cpu", c.cpu), ("pids", c.pids)] {
        if ok {
            have.push(name)
        } else {
            missing.push(name)
        }
    }
    let check = Check::new(
        "cgroups",
        missing.is_empty(),
        format!(
            "{} at {}: {} (swap {})",
            m.version(),
            m.base().display(),
            if have.is_empty() {
                "no limit controllers".to_string()
            } else {
                have.join(", ")
            },
            if c.swap_off {
                "held at zero or absent"
            } else {
                "NOT limitable"
            },
        ),
        if !missing.is_empty() {
            Some(format!("enable the {} controller(s)", missing.join(", ")))
        } else if !c.swap_off && c.memory {
            Some(fix::SWAP.into())
        } else {
            None
        },
    );
    if c.memory && !c.swap_off {
        degraded.push("--memory (the host has swap but no swap accounting)".into());
    }
    for m in missing {
        degraded.push(format!("--{}", if m == "cpu" { "cpus" } else { m }));
    }
    check
}

/// No usable cgroups: no limit can be enforced, and how the fallbacks stand in.
fn no_cgroups(host: &Host, rootless: bool, degraded: &mut Vec<String>) -> Check {
    let why = host.cgroup_problem.clone().unwrap_or_default();
    degraded.push(
        "--memory, --cpus, --pids (no cgroups; with --allow-degraded, --memory becomes RLIMIT_AS per process, --pids RLIMIT_NPROC, --cpus is not enforced)".into(),
    );
    Check::new(
        "cgroups",
        false,
        format!("no limits possible: {why}"),
        Some(if rootless {
            fix::delegated_scope("run")
        } else {
            fix::CGROUP_CONTROLLERS.into()
        }),
    )
}

/// Which Landlock ABI the kernel offers, and so which rules the sandbox gets.
fn landlock(host: &Host, degraded: &mut Vec<String>) -> Check {
    if host.landlock_abi.is_none() {
        degraded.push("Landlock filesystem rules".into());
    }
    Check::new(
        "landlock",
        host.landlock_abi.is_some(),
        match host.landlock_abi {
            Some(abi) => format!(
                "ABI {abi}: filesystem rules{}{}",
                if abi >= 4 {
                    ", TCP bind/connect denied"
                } else {
                    ""
                },
                if abi >= 6 {
                    ", abstract unix sockets and signals scoped"
                } else {
                    ""
                }
            ),
            None => "not available".into(),
        },
        host.landlock_abi.is_none().then(|| fix::LANDLOCK.into()),
    )
}

/// Whether seccomp filters can be loaded.
fn seccomp(host: &Host, degraded: &mut Vec<String>) -> Check {
    if !host.seccomp {
        degraded.push("seccomp".into());
    }
    Check::new(
        "seccomp",
        host.seccomp,
        if host.seccomp {
            "filters available".into()
        } else {
            "not available".into()
        },
        (!host.seccomp).then(|| fix::SECCOMP.into()),
    )
}

pub fn main(args: DoctorArgs) -> i32 {
    let d = diagnose();
    let code = if d.status == Status::Fail { 1 } else { 0 };
    let text = if args.json {
        match hatchery::text::to_json_pretty(&d) {
            Ok(s) => s + "\n",
            Err(e) => {
                error_line!("{e}");
                return 1;
            }
        }
    } else {
        human(&d)
    };
    // A reader that stops early (`| head -1`) ends the output quietly.
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("hatchery: cannot write to stdout: {e}");
            1
        }
        _ => code,
    }
}

fn human(d: &Diagnosis) -> String {
    let mut t = format!("kernel      {}\n", d.kernel);
    t.push_str(&format!(
        "user        uid {}{}\n",
        d.uid,
        if d.rootless { " (rootless)" } else { " (root)" }
    ));
    for c in &d.checks {
        t.push_str(&format!(
            "{:<16} {} {}\n",
            c.name,
            c.status.word(),
            c.detail
        ));
        if let Some(fix) = &c.fix {
            t.push_str(&format!("{:<16}      fix: {fix}\n", ""));
        }
    }
    if d.degraded.is_empty() {
        t.push_str("\nrun enforces everything it is asked for on this host.\n");
    } else {
        t.push_str(&format!(
            "\nrun refuses (exit 125) unless --allow-degraded: {}\n",
            d.degraded.join("; ")
        ));
    }
    t
}
