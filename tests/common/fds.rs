//! What a payload holds open, and a caller that leaves descriptors open for the commands
//! it starts (not close-on-exec), as a careless shell or service manager does: every one
//! of them reaches hatchery, and none may reach the payload.

use std::ffi::OsStr;
use std::process::Command;

/// The descriptors [`holding_extra_fds`] leaves open: a host file, the host's root
/// directory (a way out of any root, CVE-2024-21626) and a read-write descriptor.
pub const EXTRA_FDS: [i32; 3] = [7, 8, 9];

/// The shell line that opens [`EXTRA_FDS`] and then becomes `"$0" "$@"`.
pub const HOLD_EXTRA_FDS: &str = r#"exec 7</etc/hostname 8</ 9<>/dev/null; exec "$0" "$@""#;

/// `sh -c HOLD_EXTRA_FDS PROGRAM`: add PROGRAM's arguments; it starts holding
/// [`EXTRA_FDS`] besides its stdio.
pub fn holding_extra_fds(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", HOLD_EXTRA_FDS]).arg(program);
    cmd
}

/// `cmd` + `run FLAGS --ro PROBE_DIR -- PROBE fds`: the probe lists what the payload of a
/// `hatchery run` holds open.
pub fn run_probe_fds<'c>(cmd: &'c mut Command, flags: &[&str]) -> &'c mut Command {
    cmd.arg("run")
        .args(flags)
        .arg("--ro")
        .arg(super::probe_dir())
        .arg("--")
        .arg(super::probe())
        .arg("fds")
}

/// The descriptors the probe's `fds` command listed, from its `ok 0=chr:N,1=...` line in
/// `text` (`\r` line ends allowed, as a terminal shows them).
pub fn probe_fds(text: &str) -> Vec<(i32, String)> {
    let Some(line) = text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find(|l| l.starts_with("ok 0="))
    else {
        panic!("the probe listed no descriptors; its output: {text:?}")
    };
    line.trim_start_matches("ok ")
        .split(',')
        .filter_map(|e| e.split_once('='))
        .filter_map(|(fd, kind)| Some((fd.parse().ok()?, kind.to_string())))
        .collect()
}

/// The numbers alone of [`probe_fds`].
pub fn probe_fd_numbers(text: &str) -> Vec<i32> {
    probe_fds(text).into_iter().map(|(fd, _)| fd).collect()
}

/// Fails unless the probe run directly under [`holding_extra_fds`] sees every one of
/// [`EXTRA_FDS`]: a test that finds none of them in a sandbox then proves something.
pub fn assert_extra_fds_reach_a_plain_command() {
    let out = super::run_with_timeout(
        holding_extra_fds(super::probe()).arg("fds"),
        std::time::Duration::from_secs(30),
    );
    let fds = probe_fd_numbers(&super::stdout(&out));
    assert!(
        EXTRA_FDS.iter().all(|fd| fds.contains(fd)),
        "the caller's extra descriptors do not reach a command it starts: {fds:?}"
    );
}
