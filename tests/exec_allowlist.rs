//! Executable allowlists (`run --allow-exec`, a profile's `landlock.allow_exec`): only the
//! listed files run, and every way around it the tests know of fails in a real sandbox.
//!
//! The attacker here is an allowed interpreter (python3): it tries to execute other
//! binaries, copies of allowed ones, scripts for other interpreters, programs through the
//! dynamic loader (from writable places and from memory files), and executable shared
//! memory. Each attempt prints `ok ...` or `err ERRNO` from inside the sandbox.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The attacks, run by the allowed interpreter inside the sandbox.
const ATTACK: &str = r#"
import mmap, os, shutil, sys

def report(f):
    try:
        r = f()
        print("ok", "" if r is None else r, flush=True)
    except OSError as e:
        print("err", e.errno, flush=True)

def copy(src, dir):
    dst = os.path.join(dir, "copy")
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755)
    return dst

case, args = sys.argv[1], sys.argv[2:]
if case == "exec":
    report(lambda: os.execv(args[0], args))
elif case == "copy-exec":
    dst = copy(args[0], args[1])
    report(lambda: os.execv(dst, [dst, "-c", "print('escaped')"]))
elif case == "copy-map-exec":
    fd = os.open(copy(args[0], args[1]), os.O_RDONLY)
    report(lambda: mmap.mmap(fd, 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC) and None)
elif case == "copy-loader":
    dst = copy(args[0], args[1])
    report(lambda: os.execv(args[2], [args[2], dst, "-c", "print('escaped')"]))
elif case == "open":
    report(lambda: os.close(os.open(args[0], os.O_RDONLY)))
elif case == "memfd":
    report(lambda: os.close(os.memfd_create("x", int(args[0]))))
elif case == "memfd-loader":
    # The bypass: a program's bytes in a memory file sealed non-executable, run by the
    # allowed loader through /proc/self/fd/N (the loader maps it PROT_EXEC; the seal
    # does not stop that).
    try:
        fd = os.memfd_create("x", 8)  # MFD_NOEXEC_SEAL
    except OSError as e:
        if e.errno != 22:
            print("err", e.errno, flush=True)
            sys.exit(0)
        fd = os.memfd_create("x", 0)  # a kernel before 6.3 has no such flag
    os.write(fd, open(args[0], "rb").read())
    os.set_inheritable(fd, True)
    report(lambda: os.execv(args[1], [args[1], "/proc/self/fd/%d" % fd] + args[2:]))
"#;

/// The real path of python3 on this host, or `None` (the test then skips).
fn python() -> Option<PathBuf> {
    std::fs::canonicalize("/usr/bin/python3").ok()
}

/// The ELF interpreter python3 names (`/lib64/ld-linux-x86-64.so.2` here).
fn loader(python: &Path) -> PathBuf {
    let host = hatchery::paths::check_host_path(python)
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    match hatchery::sandbox::exec::inspect(&host) {
        Ok(hatchery::sandbox::exec::Program::Elf {
            interpreter: Some(p),
        }) => p,
        other => panic!("{} names no ELF interpreter: {other:?}", python.display()),
    }
}

fn skip(test: &str) -> Option<PathBuf> {
    if skip_unless_root(test) {
        return None;
    }
    let p = python();
    if p.is_none() {
        eprintln!("SKIP {test}: no /usr/bin/python3 on this host");
    }
    p
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A directory with the attack script, readable by the sandbox.
struct Attack {
    dir: tempfile::TempDir,
}

impl Attack {
    fn new() -> Attack {
        let dir = shared_tempdir();
        write(&dir.path().join("attack.py"), ATTACK, 0o644);
        Attack { dir }
    }

    fn dir(&self) -> PathBuf {
        canonical(self.dir.path())
    }

    fn script(&self) -> String {
        s(&self.dir().join("attack.py"))
    }
}

fn write(path: &Path, text: &str, mode: u32) {
    if let Err(e) = std::fs::write(path, text) {
        panic!("write {}: {e}", path.display());
    }
    write_mode(path, mode);
}

fn write_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        panic!("chmod {}: {e}", path.display());
    }
}

fn run(args: &[String]) -> Output {
    let mut cmd = Command::new(hatchery());
    cmd.arg("run").args(args);
    run_with_timeout(&mut cmd, Duration::from_secs(60))
}

/// `hatchery run --allow-exec PYTHON --ro DIR FLAGS -- python3 attack.py CASE ARGS`.
fn attack(python: &Path, a: &Attack, flags: &[String], case: &[&str]) -> Output {
    let mut args = vec![
        "--timeout".to_string(),
        "30s".into(),
        "--allow-exec".into(),
        s(python),
        "--ro".into(),
        s(&a.dir()),
    ];
    args.extend(flags.iter().cloned());
    args.extend(["--".into(), "python3".into(), a.script()]);
    args.extend(case.iter().map(|c| c.to_string()));
    run(&args)
}

fn lines(o: &Output) -> Vec<String> {
    stdout(o).lines().map(str::to_string).collect()
}

#[test]
fn an_allowed_interpreter_runs_a_script() {
    let Some(py) = skip("an_allowed_interpreter_runs_a_script") else {
        return;
    };
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    write(
        &d.join("agent.py"),
        "print('hello from the agent')\n",
        0o644,
    );
    let out = run(&[
        "--allow-exec".into(),
        s(&py),
        "--ro".into(),
        s(&d),
        "--".into(),
        "python3".into(),
        s(&d.join("agent.py")),
    ]);
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "hello from the agent"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn any_other_binary_fails_with_eacces() {
    let Some(py) = skip("any_other_binary_fails_with_eacces") else {
        return;
    };
    let a = Attack::new();
    let out = attack(&py, &a, &[], &["exec", "/usr/bin/id"]);
    assert_eq!(lines(&out), ["err 13"], "{}", stderr(&out));
    // The same as the command itself: 126, with the reason.
    let out = run(&[
        "--allow-exec".into(),
        s(&py),
        "--".into(),
        "/usr/bin/id".into(),
    ]);
    assert_eq!(code(&out), 126, "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "id ran: {}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("Permission denied") && err.contains("allowlist"),
        "{err}"
    );
}

#[test]
fn an_unlisted_program_fails_even_where_it_is_readable_and_mappable() {
    // No noexec mount and no unreadable directory stands in the way here: only the
    // execute right Landlock grants to listed files.
    let test = "an_unlisted_program_fails_even_where_it_is_readable_and_mappable";
    let Some(py) = skip(test) else {
        return;
    };
    let a = Attack::new();
    let copy = a.dir().join("python-copy");
    // A copy keeps python's mode (0755).
    if let Err(e) = std::fs::copy(&py, &copy) {
        panic!("copy: {e}");
    }
    let mut targets = vec![s(&copy)];
    if Path::new("/usr/lib/git-core/git").exists() {
        targets.push("/usr/lib/git-core/git".into());
    }
    for t in &targets {
        let out = attack(&py, &a, &[], &["exec", t, "--version"]);
        assert_eq!(lines(&out), ["err 13"], "{t}: {}", stderr(&out));
    }
}

#[test]
fn a_program_found_through_a_symlink_runs_when_its_real_file_is_allowed() {
    let Some(py) = skip("a_program_found_through_a_symlink_runs_when_its_real_file_is_allowed")
    else {
        return;
    };
    // `python3` is found on PATH as /usr/bin/python3 -> python3.11: rules follow inodes.
    let out = run(&[
        "--allow-exec".into(),
        s(&py),
        "--".into(),
        "python3".into(),
        "-c".into(),
        "import sys; print(sys.version_info[0])".into(),
    ]);
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "3"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_copy_of_an_allowed_binary_fails_in_tmp_dev_shm_and_rw_paths() {
    let Some(py) = skip("a_copy_of_an_allowed_binary_fails_in_tmp_dev_shm_and_rw_paths") else {
        return;
    };
    let a = Attack::new();
    let rw = shared_tempdir();
    let rw = s(&canonical(rw.path()));
    for dir in ["/tmp", "/dev/shm", rw.as_str()] {
        let out = attack(
            &py,
            &a,
            &["--rw".into(), rw.clone()],
            &["copy-exec", &s(&py), dir],
        );
        assert_eq!(lines(&out), ["err 13"], "{dir}: {}", stderr(&out));
    }
}

#[test]
fn a_script_with_a_shebang_to_a_non_allowed_interpreter_fails() {
    let Some(py) = skip("a_script_with_a_shebang_to_a_non_allowed_interpreter_fails") else {
        return;
    };
    let a = Attack::new();
    let perl = a.dir().join("tool.pl");
    write(&perl, "#!/usr/bin/perl\nprint \"escaped\\n\";\n", 0o755);
    let flags = ["--allow-exec".to_string(), s(&perl)];
    let out = attack(&py, &a, &flags, &["exec", &s(&perl)]);
    assert_eq!(lines(&out), ["err 13"], "{}", stderr(&out));
    assert!(
        stderr(&out).contains("#!/usr/bin/perl, which is not allowed"),
        "hatchery warns before the run: {}",
        stderr(&out)
    );
    // The same script with an allowed interpreter runs.
    let good = a.dir().join("tool.py");
    write(
        &good,
        &format!("#!{}\nprint('a listed script')\n", py.display()),
        0o755,
    );
    let out = run(&[
        "--allow-exec".into(),
        s(&py),
        "--allow-exec".into(),
        s(&good),
        "--ro".into(),
        s(&a.dir()),
        "--".into(),
        s(&good),
    ]);
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "a listed script"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_loader_cannot_open_programs_in_executable_directories() {
    let Some(py) = skip("the_loader_cannot_open_programs_in_executable_directories") else {
        return;
    };
    let ld = loader(&py);
    for target in ["/usr/bin/perl", "/usr/bin/id", "/usr/sbin/nologin"] {
        if !Path::new(target).exists() {
            continue;
        }
        let out = run(&[
            "--allow-exec".into(),
            s(&py),
            "--".into(),
            s(&ld),
            target.into(),
            "--version".into(),
        ]);
        assert_eq!(code(&out), 127, "{target}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{target} ran: {}", stdout(&out));
        assert!(
            stderr(&out).contains("cannot open shared object file: Permission denied"),
            "{target}: {}",
            stderr(&out)
        );
    }
    // And the interpreter itself cannot open them either.
    let a = Attack::new();
    let out = attack(&py, &a, &[], &["open", "/usr/bin/id"]);
    assert_eq!(lines(&out), ["err 13"], "{}", stderr(&out));
}

#[test]
fn the_loader_cannot_map_a_copy_on_a_writable_mount() {
    let Some(py) = skip("the_loader_cannot_map_a_copy_on_a_writable_mount") else {
        return;
    };
    let a = Attack::new();
    let ld = s(&loader(&py));
    // noexec: mapping the copy executable fails with EPERM (not EACCES: this is mmap(2)).
    let out = attack(&py, &a, &[], &["copy-map-exec", &s(&py), "/tmp"]);
    assert_eq!(lines(&out), ["err 1"], "{}", stderr(&out));
    // So `ld.so /tmp/copy` dies before running a single instruction of the copy.
    let out = attack(&py, &a, &[], &["copy-loader", &s(&py), "/tmp", &ld]);
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    assert!(!stdout(&out).contains("escaped"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("failed to map segment from shared object"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn no_memory_file_can_be_created_under_an_allowlist() {
    let Some(py) = skip("no_memory_file_can_be_created_under_an_allowlist") else {
        return;
    };
    let a = Attack::new();
    // Executable, sealed non-executable (MFD_NOEXEC_SEAL = 8), close-on-exec: none.
    for flags in ["0", "8", "1"] {
        let out = attack(&py, &a, &[], &["memfd", flags]);
        assert_eq!(lines(&out), ["err 13"], "flags {flags}: {}", stderr(&out));
    }
    // Without an allowlist nothing of this applies.
    let out = run(&[
        "--ro".into(),
        s(&a.dir()),
        "--".into(),
        "python3".into(),
        a.script(),
        "memfd".into(),
        "0".into(),
    ]);
    assert_eq!(lines(&out), ["ok"], "{}", stderr(&out));
}

#[test]
fn the_loader_cannot_run_a_program_from_a_sealed_memory_file() {
    // The bypass found from inside a sandbox allowed only python3: ld.so run on
    // /proc/self/fd/N of an MFD_NOEXEC_SEAL memory file holding a copy of id.
    let Some(py) = skip("the_loader_cannot_run_a_program_from_a_sealed_memory_file") else {
        return;
    };
    let ld = s(&loader(&py));
    let a = Attack::new();
    let copy = a.dir().join("id-copy");
    if let Err(e) = std::fs::copy("/usr/bin/id", &copy) {
        panic!("copy /usr/bin/id: {e}");
    }
    write_mode(&copy, 0o644);
    // Without hatchery the attack runs the copy.
    let mut plain = Command::new("python3");
    plain.args([a.script(), "memfd-loader".into(), s(&copy), ld.clone()]);
    let out = run_with_timeout(&mut plain, Duration::from_secs(30));
    assert!(
        stdout(&out).starts_with("uid="),
        "the attack does not work outside hatchery: {} {}",
        stdout(&out),
        stderr(&out)
    );
    // Under the allowlist no memory file can be made, so nothing runs.
    let out = attack(&py, &a, &[], &["memfd-loader", &s(&copy), &ld]);
    assert_eq!(lines(&out), ["err 13"], "{}", stderr(&out));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn executable_shared_memory_cannot_be_attached_under_an_allowlist() {
    let Some(_py) = skip("executable_shared_memory_cannot_be_attached_under_an_allowlist") else {
        return;
    };
    let shm_exec = format!("{:#x}", libc::SHM_EXEC);
    // Without hatchery, and in a sandbox without an allowlist, SHM_EXEC attaches.
    let mut plain = Command::new(probe());
    plain.args(["shmat", &shm_exec]);
    let out = run_with_timeout(&mut plain, Duration::from_secs(30));
    assert_eq!(stdout(&out), "ok 0", "outside hatchery: {}", stderr(&out));
    let out = run_probe(&[], &["shmat", &shm_exec]);
    assert_eq!(stdout(&out), "ok 0", "no allowlist: {}", stderr(&out));
    // Under an allowlist: refused, while a segment without SHM_EXEC still attaches.
    let listed = [
        "--allow-exec".to_string(),
        s(&probe()),
        "--timeout".into(),
        "30s".into(),
    ];
    let listed: Vec<&str> = listed.iter().map(String::as_str).collect();
    let out = run_probe(&listed, &["shmat", &shm_exec]);
    assert_eq!(
        stdout(&out),
        format!("err {}", libc::EACCES),
        "{}",
        stderr(&out)
    );
    let out = run_probe(&listed, &["shmat", "0"]);
    assert_eq!(stdout(&out), "ok 0", "{}", stderr(&out));
    let out = run_probe(&listed, &["syscall", "memfd_secret", "0"]);
    assert_eq!(
        stdout(&out),
        format!("err {}", libc::EACCES),
        "{}",
        stderr(&out)
    );
    // The sandbox still has two filters: the floor took the rules in.
    let out = run_probe(&listed, &["status", "Seccomp_filters"]);
    assert_eq!(stdout(&out), "ok 2", "{}", stderr(&out));
}

#[test]
fn the_loader_still_runs_programs_outside_executable_directories() {
    // A limit the README states: files outside the executable directories stay readable,
    // and the loader runs any ELF program it can read on an exec-capable mount: one kept
    // under /usr/lib, or one in an --ro path.
    let Some(py) = skip("the_loader_still_runs_programs_outside_executable_directories") else {
        return;
    };
    let ld = s(&loader(&py));
    let a = Attack::new();
    let copy = a.dir().join("python-copy");
    if let Err(e) = std::fs::copy(&py, &copy) {
        panic!("copy: {e}");
    }
    let mut args = vec![
        "--allow-exec".to_string(),
        s(&py),
        "--ro".into(),
        s(&a.dir()),
        "--".into(),
        ld.clone(),
        s(&copy),
        "-c".into(),
        "print('ran through the loader')".into(),
    ];
    let out = run(&args);
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "ran through the loader"),
        "{}",
        stderr(&out)
    );
    let target = "/usr/lib/git-core/git";
    if Path::new(target).exists() {
        args.truncate(6);
        args.extend([target.to_string(), "--version".into()]);
        let out = run(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).starts_with("git version"), "{}", stdout(&out));
    } else {
        eprintln!("note: no {target} on this host; only the --ro case was checked");
    }
}

#[test]
fn an_allowed_interpreter_runs_any_program_it_can_read_and_any_code_in_its_memory() {
    // The other limit the README states: allowing an interpreter allows its language.
    let test = "an_allowed_interpreter_runs_any_program_it_can_read_and_any_code_in_its_memory";
    let Some(py) = skip(test) else {
        return;
    };
    // A SysV segment attached without SHM_EXEC (which the floor refuses) still becomes
    // executable with mprotect: memory like the anonymous kind, no file for the loader.
    let script = "import ctypes, mmap, os, subprocess\n\
        open('/tmp/x.py', 'w').write('print(6 * 7)')\n\
        print(subprocess.run(['python3', '/tmp/x.py'], capture_output=True, text=True).stdout.strip())\n\
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n\
        print('rwx', len(m))\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        libc.shmat.restype = ctypes.c_void_p\n\
        sid = libc.shmget(0, 4096, 0o1600)\n\
        addr = libc.shmat(sid, None, 0)\n\
        print('shm rx', libc.mprotect(ctypes.c_void_p(addr), 4096, mmap.PROT_READ | mmap.PROT_EXEC))\n\
        libc.shmctl(sid, 0, None)\n";
    let out = run(&[
        "--allow-exec".into(),
        s(&py),
        "--".into(),
        "python3".into(),
        "-c".into(),
        script.into(),
    ]);
    assert_eq!(
        lines(&out),
        ["42", "rwx 4096", "shm rx 0"],
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_allowed_program_in_a_read_only_path_runs_and_the_loader_is_reported() {
    let test = "an_allowed_program_in_a_read_only_path_runs_and_the_loader_is_reported";
    let Some(py) = skip(test) else {
        return;
    };
    let dir = shared_tempdir();
    let report = dir.path().join("r.json");
    let out = run(&[
        "--report".into(),
        s(&report),
        "--allow-exec".into(),
        s(&probe()),
        "--ro".into(),
        s(&probe_dir()),
        "--ro".into(),
        "/etc/hostname".into(),
        "--".into(),
        s(&probe()),
        "syscall".into(),
        "getpid".into(),
    ]);
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "ok 2"),
        "{}",
        stderr(&out)
    );
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let e = &v["enforcement"];
    assert_eq!(e["exec_allowlist"]["files"][0], s(&probe()), "{v}");
    let by: Vec<&str> = e["exec_allowlist"]["by"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        by.iter()
            .any(|b| b.starts_with("seccomp floor: memfd_create")),
        "{v}"
    );
    assert!(
        e["seccomp_floor"]
            .as_str()
            .is_some_and(|f| f.starts_with("filter (")),
        "{v}"
    );
    let ld = std::fs::canonicalize(loader(&py)).unwrap_or_default();
    assert_eq!(e["exec_allowlist"]["loaders"][0], s(&ld), "{v}");
    // Rules on single files (the probe, /etc/hostname) keep the ruleset fully enforced
    // (where the kernel has every right hatchery asks for: ABI 6 and up).
    if e["landlock_abi"].as_u64() >= Some(6) {
        assert_eq!(e["landlock"], "fully_enforced", "{v}");
        assert_eq!(e["not_enforced"], Value::Array(Vec::new()), "{v}");
    }
}

#[test]
fn a_profile_allowlist_is_enforced_and_the_command_line_only_narrows_it() {
    let test = "a_profile_allowlist_is_enforced_and_the_command_line_only_narrows_it";
    let Some(py) = skip(test) else {
        return;
    };
    let dir = shared_tempdir();
    let profile = dir.path().join("python-only.toml");
    let default = match hatchery::profile::Profile::resolve("default") {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let mut mine = default.clone();
    mine.name = "python-only".into();
    mine.landlock.allow_exec = Some(vec![py.clone()]);
    match mine.to_toml() {
        Ok(t) => write(&profile, &t, 0o644),
        Err(e) => panic!("{e}"),
    }
    let p = s(&profile);
    let out = run(&[
        "--profile".into(),
        p.clone(),
        "--".into(),
        "python3".into(),
        "-c".into(),
        "import os\ntry:\n    os.execv('/usr/bin/id', ['id'])\nexcept OSError as e:\n    print(e.errno)".into(),
    ]);
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "13"),
        "{}",
        stderr(&out)
    );
    // The command line cannot add to the profile's list.
    let out = run(&[
        "--profile".into(),
        p,
        "--allow-exec".into(),
        "/usr/bin/id".into(),
        "--".into(),
        "/usr/bin/id".into(),
    ]);
    // Bad input, found before anything starts (the exit-status rule).
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not in the profile's executable allowlist"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
}

#[test]
fn without_an_allowlist_tmp_stays_executable() {
    if skip_unless_root("without_an_allowlist_tmp_stays_executable") {
        return;
    }
    let out = run(&[
        "--".into(),
        "sh".into(),
        "-c".into(),
        "cp /usr/bin/true /tmp/t && /tmp/t && echo ran".into(),
    ]);
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "ran"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn allowlisted_paths_are_checked_on_the_host() {
    let Some(py) = skip("allowlisted_paths_are_checked_on_the_host") else {
        return;
    };
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let rw = d.join("rw");
    let ro = d.join("ro");
    for sub in [&rw, &ro] {
        if let Err(e) = std::fs::create_dir(sub) {
            panic!("mkdir: {e}");
        }
    }
    write(&rw.join("tool"), "#!/bin/sh\n", 0o755);
    write(&ro.join("open"), "#!/bin/sh\n", 0o777);
    write(&ro.join("plain"), "data\n", 0o644);
    let (pys, rws, ros) = (s(&py), s(&rw), s(&ro));
    let many: Vec<String> = (0..65)
        .map(|i| {
            let f = ro.join(format!("tool{i}"));
            write(&f, "#!/bin/sh\n", 0o755);
            s(&f)
        })
        .collect();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["/usr/bin/python3".into()], "name the real path"),
        (vec!["usr/bin/python3".into()], "absolute"),
        (vec![format!("{rws}/missing")], "does not exist"),
        (vec!["/usr/bin".into()], "directory"),
        (vec![format!("{ros}/plain")], "not executable"),
        (vec![format!("{ros}/open")], "group or others"),
        (vec![pys.clone(), pys.clone()], "twice"),
        (vec![format!("{rws}/tool")], "--rw"),
        (vec![s(&hatchery())], "not inside the sandbox"),
        (many, "at most 64"),
    ];
    for (files, needle) in cases {
        let mut args = vec!["--ro".to_string(), ros.clone(), "--rw".into(), rws.clone()];
        for f in &files {
            args.extend(["--allow-exec".to_string(), f.clone()]);
        }
        args.extend([
            "--".into(),
            "python3".into(),
            "-c".into(),
            "print('ran')".into(),
        ]);
        let out = run(&args);
        assert_eq!(code(&out), 2, "{files:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(needle),
            "{files:?}: the error does not say {needle:?}: {}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty(), "{files:?}: something ran");
    }
    let out = run(&[
        "--allow-exec".into(),
        "/usr/bin/python3".into(),
        "--".into(),
        "true".into(),
    ]);
    assert!(
        stderr(&out).contains(&format!("({pys})")),
        "the real path is named: {}",
        stderr(&out)
    );
}

#[test]
fn a_signed_manifest_carries_an_allowlist_and_an_output_cap() {
    let dir = shared_tempdir();
    let key = dir.path().join("manifest.key");
    let out = hatchery_cmd(&["manifest", "keygen", "--key", &s(&key)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = hatchery_cmd(&[
        "manifest",
        "issue",
        "--key",
        &s(&key),
        "--allow-exec",
        "/usr/bin/python3.11",
        "--allow-exec",
        "/usr/bin/git",
        "--max-output",
        "1M",
        "--",
        "python3",
        "agent.py",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        v["filesystem"]["allow_exec"],
        serde_json::json!(["/usr/bin/python3.11", "/usr/bin/git"]),
        "{v}"
    );
    assert_eq!(v["resources"]["max_output_bytes"], 1 << 20, "{v}");
    let file = dir.path().join("m.json");
    if let Err(e) = std::fs::write(&file, &out.stdout) {
        panic!("{e}");
    }
    let out = hatchery_cmd(&["manifest", "verify", &s(&file), "--key", &s(&key)]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    // The allowlist is signed: editing it breaks the signature.
    let edited = String::from_utf8_lossy(&std::fs::read(&file).unwrap_or_default())
        .replace("/usr/bin/git", "/usr/bin/gdb");
    if let Err(e) = std::fs::write(&file, edited) {
        panic!("{e}");
    }
    let out = hatchery_cmd(&["manifest", "verify", &s(&file), "--key", &s(&key)]);
    assert_eq!(code(&out), 1, "{} {}", stdout(&out), stderr(&out));
    // Bad values are refused by the flags.
    for (flag, value) in [
        ("--allow-exec", "python3"),
        ("--allow-exec", "/"),
        ("--max-output", "0"),
        ("--max-output", "2T"),
    ] {
        let out = hatchery_cmd(&[
            "manifest",
            "issue",
            "--key",
            &s(&key),
            flag,
            value,
            "--",
            "true",
        ]);
        assert_eq!(code(&out), 2, "{flag} {value}: {}", stderr(&out));
        assert!(stdout(&out).is_empty());
    }
}

#[test]
fn an_allowlist_holds_for_rootless_runs_too() {
    let Some(py) = skip("an_allowlist_holds_for_rootless_runs_too") else {
        return;
    };
    let as_nobody = ["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"];
    let mut plain = Command::new("setpriv");
    plain
        .args(as_nobody)
        .arg(hatchery())
        .args(["run", "--", "true"]);
    let out = run_with_timeout(&mut plain, Duration::from_secs(60));
    if code(&out) != 0 {
        // A pure cgroup v2 host without a delegated subtree (the VM suite) runs nothing
        // rootless at all; that is tested in tests/cgroup_v2.rs.
        eprintln!(
            "SKIP an_allowlist_holds_for_rootless_runs_too: rootless runs do not start here: {}",
            stderr(&out)
        );
        return;
    }
    let mut cmd = Command::new("setpriv");
    cmd.args(as_nobody)
        .arg(hatchery())
        .args(["run", "--timeout", "30s", "--allow-exec"])
        .arg(&py)
        .args([
            "--",
            "python3",
            "-c",
            "import os\ntry:\n    os.execv('/usr/bin/id', ['id'])\nexcept OSError as e:\n    print(e.errno)",
        ]);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "13"),
        "{}",
        stderr(&out)
    );
}
