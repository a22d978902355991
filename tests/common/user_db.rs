//! A test's own user database: files bind-mounted over `/etc/group` or `/etc/passwd` in a
//! private mount namespace the test's command runs in (never the host's), and a directory
//! whose group only that database can say its owner is in.

use std::path::{Path, PathBuf};

/// `unshare` arguments that run the command following them (as `"$0" "$@"`) in a private
/// mount namespace of its own, with each `(source, target)` bind-mounted first.
pub fn with_binds(binds: &[(&Path, &str)]) -> Vec<String> {
    let mounts: Vec<String> = binds
        .iter()
        .map(|(source, target)| format!("mount --bind '{}' '{target}'", source.display()))
        .collect();
    let script = format!("{} && exec \"$0\" \"$@\"", mounts.join(" && "));
    ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
        .iter()
        .map(|a| a.to_string())
        .chain([script])
        .collect()
}

/// A controller (`contract`, `extra` flags) whose user database is the test's own: each
/// `(source, target)` bound in a private mount namespace of its own.
pub fn controller_with_binds(
    binds: &[(&Path, &str)],
    contract: &str,
    extra: &[&str],
) -> super::controller::TestController {
    let unshare = with_binds(binds);
    let unshare: Vec<&str> = unshare.iter().map(String::as_str).collect();
    super::controller::TestController::start_under(&unshare, contract, None, extra)
}

/// `nobody`'s directory `dir/exposed` in group 4242, which `nobody` is not in by the
/// host's database: only the group database can say whether it is.
pub fn foreign_group_dir(dir: &Path) -> PathBuf {
    let exposed = dir.join("exposed");
    std::fs::create_dir(&exposed).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::chown(&exposed, Some(65534), Some(4242)).unwrap_or_else(|e| panic!("{e}"));
    exposed
}

/// A FIFO `dir/group` nobody writes: bound over `/etc/group`, the group database's `open`
/// never returns, as an LDAP server or a stalled network filesystem behind the host's
/// user database may never answer.
pub fn silent_group_file(dir: &Path) -> PathBuf {
    let fifo = dir.join("group");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644))
        .unwrap_or_else(|e| panic!("{e}"));
    fifo
}

/// A group database that answers, slowly: `dir/group`, the host's group file followed by
/// millions of groups no one is in, which the group database reads through at each
/// lookup, made long enough here that a lookup takes at least `each`. `None` where the
/// host's group database does not read `/etc/group` first (nothing it is given there
/// slows it down).
pub fn slow_group_file(dir: &Path, each: std::time::Duration) -> Option<PathBuf> {
    use std::io::Write;
    let path = dir.join("group");
    let host = std::fs::read("/etc/group").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&path, &host).unwrap_or_else(|e| panic!("{e}"));
    let mut lines = 0u32;
    for _ in 0..4 {
        let mut file = std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("{e}")),
        );
        for i in lines..lines + 3_000_000 {
            writeln!(file, "g{i}:x:{}:", 200_000 + i).unwrap_or_else(|e| panic!("{e}"));
        }
        file.flush().unwrap_or_else(|e| panic!("{e}"));
        lines += 3_000_000;
        // One lookup, as the helper makes it, in a namespace of its own.
        let unshare = with_binds(&[(&path, "/etc/group")]);
        let started = std::time::Instant::now();
        let out = super::run_with_timeout(
            std::process::Command::new(&unshare[0])
                .args(&unshare[1..])
                .args(["getent", "initgroups", "nobody"]),
            std::time::Duration::from_secs(60),
        );
        if started.elapsed() >= each && out.status.success() {
            return Some(path);
        }
    }
    None
}
