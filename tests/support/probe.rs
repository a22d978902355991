//! The attack probe: run inside a sandbox by the integration tests, it tries one thing
//! and reports what the kernel answered, in one line on stdout:
//!
//!   ok <value>          the attempt succeeded (the attack worked, unless expected)
//!   err <errno>         the kernel refused with errno
//!
//! Commands that are expected to be killed (i386/x32 entry points, kill-action syscalls)
//! print nothing: the test reads the signal from the exit status. Several commands
//! separated by `+` run in turn in one process (`tiocsctty 0 + tiocsti 0 TEXT`).
//!
//! Every resource attack is bounded: fork bombs stop at the count asked for, memory hogs
//! at the size asked for, spinners after the time asked for.

use std::ffi::CString;
use std::io::Write;
use std::time::{Duration, Instant};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn report(rc: i64) -> i32 {
    if rc < 0 {
        println!("err {}", errno());
    } else {
        println!("ok {rc}");
    }
    0
}

fn arg(args: &[String], i: usize) -> &str {
    args.get(i).map(String::as_str).unwrap_or("")
}

fn num(args: &[String], i: usize) -> u64 {
    let s = arg(args, i);
    if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).unwrap_or(0)
    } else {
        s.parse().unwrap_or(0)
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// x86_64 syscall numbers the tests use by name.
fn syscall_nr(name: &str) -> Option<i64> {
    Some(match name {
        "getpid" => libc::SYS_getpid,
        "mount" => libc::SYS_mount,
        "umount2" => libc::SYS_umount2,
        "pivot_root" => libc::SYS_pivot_root,
        "chroot" => libc::SYS_chroot,
        "unshare" => libc::SYS_unshare,
        "setns" => libc::SYS_setns,
        "clone" => libc::SYS_clone,
        "clone3" => libc::SYS_clone3,
        "keyctl" => libc::SYS_keyctl,
        "add_key" => libc::SYS_add_key,
        "request_key" => libc::SYS_request_key,
        "bpf" => libc::SYS_bpf,
        "perf_event_open" => libc::SYS_perf_event_open,
        "ptrace" => libc::SYS_ptrace,
        "kexec_load" => libc::SYS_kexec_load,
        "kexec_file_load" => libc::SYS_kexec_file_load,
        "init_module" => libc::SYS_init_module,
        "finit_module" => libc::SYS_finit_module,
        "delete_module" => libc::SYS_delete_module,
        "iopl" => libc::SYS_iopl,
        "ioperm" => libc::SYS_ioperm,
        "userfaultfd" => libc::SYS_userfaultfd,
        "io_uring_setup" => libc::SYS_io_uring_setup,
        "io_setup" => libc::SYS_io_setup,
        "open_by_handle_at" => libc::SYS_open_by_handle_at,
        "name_to_handle_at" => libc::SYS_name_to_handle_at,
        "process_vm_readv" => libc::SYS_process_vm_readv,
        "process_vm_writev" => libc::SYS_process_vm_writev,
        "reboot" => libc::SYS_reboot,
        "swapon" => libc::SYS_swapon,
        "swapoff" => libc::SYS_swapoff,
        "settimeofday" => libc::SYS_settimeofday,
        "clock_settime" => libc::SYS_clock_settime,
        "personality" => libc::SYS_personality,
        "ioctl" => libc::SYS_ioctl,
        "open_tree" => libc::SYS_open_tree,
        "move_mount" => libc::SYS_move_mount,
        "fsopen" => libc::SYS_fsopen,
        "acct" => libc::SYS_acct,
        "syslog" => libc::SYS_syslog,
        "uname" => libc::SYS_uname,
        "memfd_create" => libc::SYS_memfd_create,
        "memfd_secret" => libc::SYS_memfd_secret,
        "openat2" => libc::SYS_openat2,
        "getuid" => libc::SYS_getuid,
        "read" => libc::SYS_read,
        "socket" => libc::SYS_socket,
        "mkdir" => libc::SYS_mkdir,
        "kill" => libc::SYS_kill,
        "setuid" => libc::SYS_setuid,
        "getcwd" => libc::SYS_getcwd,
        "sethostname" => libc::SYS_sethostname,
        "modify_ldt" => libc::SYS_modify_ldt,
        _ => return None,
    })
}

/// `syscall NAME [ARG...]`: the raw syscall with integer arguments (0 for the rest).
fn raw_syscall(args: &[String]) -> i32 {
    let Some(nr) = syscall_nr(arg(args, 1)).or_else(|| arg(args, 1).parse().ok()) else {
        eprintln!("probe: unknown syscall {}", arg(args, 1));
        return 2;
    };
    let a: Vec<u64> = (2..8).map(|i| num(args, i)).collect();
    // SAFETY (test probe): arguments are integers chosen by the test; pointers are null.
    let rc = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    report(rc)
}

/// `i386 NR`: the syscall through the 32-bit `int 0x80` entry point.
fn i386(args: &[String]) -> i32 {
    let nr = num(args, 1) as u32;
    let ret: u32;
    // SAFETY (test probe): int 0x80 with ebx..edi zero; a filter should kill us first.
    unsafe {
        std::arch::asm!(
            "xchg rbx, {zero}",
            "int 0x80",
            "xchg rbx, {zero}",
            zero = inout(reg) 0u64 => _,
            inlateout("eax") nr => ret,
            in("ecx") 0u32,
            in("edx") 0u32,
        );
    }
    // The raw entry point returns -errno; errno itself is not set.
    let rc = ret as i32;
    if rc < 0 {
        println!("err {}", rc.unsigned_abs());
    } else {
        println!("ok {rc}");
    }
    0
}

/// `x32 NR`: the native syscall instruction with the x32 bit set.
fn x32(args: &[String]) -> i32 {
    let nr = num(args, 1) | 0x4000_0000;
    // SAFETY (test probe): an x32 syscall with zero arguments.
    let rc = unsafe { libc::syscall(nr as i64, 0, 0, 0) };
    report(rc)
}

fn connect_tcp(args: &[String], udp: bool) -> i32 {
    let addr = format!("{}:{}", arg(args, 1), arg(args, 2));
    let res = if udp {
        std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| {
            s.connect(&addr)?;
            s.send(b"hello-from-sandbox")?;
            s.set_read_timeout(Some(Duration::from_millis(500)))?;
            let mut buf = [0u8; 64];
            s.recv(&mut buf).map(|n| n as i64)
        })
    } else {
        addr.parse::<std::net::SocketAddr>()
            .map_err(std::io::Error::other)
            .and_then(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500)))
            .map(|_| 0)
    };
    match res {
        Ok(v) => println!("ok {v}"),
        Err(e) => println!("err {}", e.raw_os_error().unwrap_or(-1)),
    }
    0
}

fn connect_abstract(args: &[String]) -> i32 {
    use std::os::linux::net::SocketAddrExt;
    let res = std::os::unix::net::SocketAddr::from_abstract_name(arg(args, 1).as_bytes())
        .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a));
    match res {
        Ok(_) => println!("ok 0"),
        Err(e) => println!("err {}", e.raw_os_error().unwrap_or(-1)),
    }
    0
}

fn write_file(args: &[String]) -> i32 {
    match std::fs::write(arg(args, 1), arg(args, 2)) {
        Ok(()) => println!("ok 0"),
        Err(e) => println!("err {}", e.raw_os_error().unwrap_or(-1)),
    }
    0
}

fn read_file(args: &[String]) -> i32 {
    match std::fs::read(arg(args, 1)) {
        Ok(b) => println!("ok {}", b.len()),
        Err(e) => println!("err {}", e.raw_os_error().unwrap_or(-1)),
    }
    0
}

/// `forkbomb N HOLD_MS`: forks until N children exist or fork fails; prints how many.
fn forkbomb(args: &[String]) -> i32 {
    let max = num(args, 1).clamp(1, 1000);
    let hold = Duration::from_millis(num(args, 2).max(100));
    let mut children = Vec::new();
    let mut failed = 0;
    for _ in 0..max {
        // SAFETY (test probe): the child only sleeps and exits.
        match unsafe { libc::fork() } {
            0 => {
                std::thread::sleep(hold);
                // SAFETY: leave the child immediately.
                unsafe { libc::_exit(0) };
            }
            -1 => {
                failed = errno();
                break;
            }
            pid => children.push(pid),
        }
    }
    println!("forked {} err {failed}", children.len());
    let _ = std::io::stdout().flush();
    for pid in children {
        // SAFETY (test probe): reaping our own children.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
    0
}

/// `memhog MB`: allocates and touches MB MiB, one MiB at a time, reporting progress.
fn memhog(args: &[String]) -> i32 {
    let mb = num(args, 1).min(1024) as usize;
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for i in 0..mb {
        blocks.push(vec![(i % 251) as u8 + 1; 1 << 20]);
    }
    println!("ok {}", blocks.len());
    0
}

/// `spin SECONDS`: burns CPU on one thread.
fn spin(args: &[String]) -> i32 {
    let until = Instant::now() + Duration::from_millis((num(args, 1) * 1000).min(60_000));
    let mut x = 0u64;
    while Instant::now() < until {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    println!("ok {}", x & 1);
    0
}

/// `daemon PIDFILE SECONDS`: double-forks a setsid daemon that writes its pid and sleeps.
fn daemon(args: &[String]) -> i32 {
    let pidfile = arg(args, 1).to_string();
    let secs = num(args, 2).min(600);
    // SAFETY (test probe): classic double fork; children only call async-signal-safe-ish code.
    unsafe {
        if libc::fork() == 0 {
            libc::setsid();
            if libc::fork() == 0 {
                let _ = std::fs::write(&pidfile, format!("{}", libc::getpid()));
                libc::sleep(secs as u32);
                libc::_exit(0);
            }
            libc::_exit(0);
        }
        libc::wait(std::ptr::null_mut());
    }
    std::thread::sleep(Duration::from_millis(200));
    println!("ok 0");
    0
}

/// `tiocsti [FD [TEXT]]`: pushes TEXT (default `x`; `\\n` stands for a newline) into the
/// input queue of the terminal on FD (default 0), one byte per ioctl, as if typed there:
/// the classic escape from a sandbox that shares its caller's terminal (CVE-2017-5226).
/// Prints how many bytes went in, or the errno of the first refusal.
fn tiocsti(args: &[String]) -> i32 {
    let fd = if args.len() > 1 {
        num(args, 1) as i32
    } else {
        0
    };
    let text = if args.len() > 2 {
        arg(args, 2).replace("\\n", "\n")
    } else {
        "x".to_string()
    };
    let mut pushed = 0i64;
    for b in text.bytes() {
        let c = b as libc::c_char;
        // SAFETY (test probe): TIOCSTI with a pointer to one byte we own.
        if unsafe { libc::ioctl(fd, libc::TIOCSTI, &c) } < 0 {
            return report(-1);
        }
        pushed += 1;
    }
    report(pushed)
}

/// `tiocsctty FD`: makes the terminal on FD this process's controlling terminal (needs a
/// session leader without one, and a terminal that is no session's: the first step of
/// taking over a terminal the sandbox was handed).
fn tiocsctty(args: &[String]) -> i32 {
    // SAFETY (test probe): TIOCSCTTY with an integer argument (0: do not steal).
    report(unsafe { libc::ioctl(num(args, 1) as i32, libc::TIOCSCTTY, 0) } as i64)
}

/// `write-fd FD BYTES`: writes BYTES bytes of `Z` to FD, 4 KiB at a time; prints how many
/// went out, or the errno if the first write failed.
fn write_fd(args: &[String]) -> i32 {
    let fd = num(args, 1) as i32;
    let total = num(args, 2).min(1 << 30) as usize;
    let chunk = [b'Z'; 4096];
    let mut written = 0usize;
    while written < total {
        let n = chunk.len().min(total - written);
        // SAFETY (test probe): write(2) from a buffer we own, `n` within it.
        let rc = unsafe { libc::write(fd, chunk.as_ptr().cast(), n) };
        if rc <= 0 {
            if written == 0 {
                return report(-1);
            }
            break;
        }
        written += rc as usize;
    }
    report(written as i64)
}

/// `fds`: every open descriptor of this process, as `FD=KIND` where KIND is `chr:RDEV` for
/// a character device (a terminal among them) and the file type otherwise.
fn fds() -> i32 {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        println!("err {}", errno());
        return 0;
    };
    let mut nums: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    nums.sort_unstable();
    for fd in nums {
        // SAFETY (test probe): fstat into a zeroed struct we own; a stale number fails.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            continue;
        }
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFCHR => format!("chr:{}", st.st_rdev),
            libc::S_IFREG => "reg".to_string(),
            libc::S_IFIFO => "fifo".to_string(),
            libc::S_IFSOCK => "sock".to_string(),
            libc::S_IFDIR => "dir".to_string(),
            _ => "other".to_string(),
        };
        out.push(format!("{fd}={kind}"));
    }
    println!("ok {}", out.join(","));
    0
}

/// `fionread FD`: how many bytes wait in FD's input queue (on a terminal: what a reader,
/// the caller's shell, would read next).
fn fionread(args: &[String]) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY (test probe): FIONREAD into an int we own.
    let rc = unsafe { libc::ioctl(num(args, 1) as i32, libc::FIONREAD, &mut n) };
    report(if rc < 0 { -1 } else { n as i64 })
}

/// `tiocsti-pty`: opens a new pseudo-terminal, makes it the controlling terminal (in a new
/// session where possible) and pushes a character into its input queue with TIOCSTI —
/// the injection itself, on a terminal the caller owns, so that only a filter stops it.
fn tiocsti_pty() -> i32 {
    // SAFETY (test probe): setsid, posix_openpt, grantpt, unlockpt, ptsname_r and open
    // with buffers we own; a failed setsid (already a session leader) changes nothing.
    unsafe {
        libc::setsid();
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        if master < 0 || libc::grantpt(master) != 0 || libc::unlockpt(master) != 0 {
            return report(-1);
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(master, name.as_mut_ptr(), name.len()) != 0 {
            return report(-1);
        }
        // Without O_NOCTTY: a session leader without a terminal acquires this one.
        let slave = libc::open(name.as_ptr(), libc::O_RDWR);
        if slave < 0 {
            return report(-1);
        }
        let c: libc::c_char = b'x' as libc::c_char;
        report(libc::ioctl(slave, libc::TIOCSTI, &c) as i64)
    }
}

fn octal(args: &[String], i: usize) -> u32 {
    u32::from_str_radix(arg(args, i), 8).unwrap_or(0)
}

/// `suid OP PATH MODE`: sets or creates a file mode (octal) with one syscall — chmod,
/// fchmod, fchmodat, fchmodat2 on an existing PATH; open, openat, creat, openat2 (O_CREAT),
/// mknod, mknodat (a regular file), mkdir, mkdirat creating PATH; tmpfile (O_TMPFILE in the
/// directory PATH).
fn suid(args: &[String]) -> i32 {
    let (op, path, mode) = (arg(args, 1), cstr(arg(args, 2)), octal(args, 3));
    let p = path.as_ptr();
    let m = mode as libc::c_uint;
    let create = libc::O_CREAT | libc::O_WRONLY;
    // SAFETY (test probe): each call gets a NUL-terminated path we own and integers.
    let rc: i64 = unsafe {
        match op {
            "chmod" => libc::syscall(libc::SYS_chmod, p, m),
            "fchmodat" => libc::syscall(libc::SYS_fchmodat, libc::AT_FDCWD, p, m),
            "fchmodat2" => libc::syscall(libc::SYS_fchmodat2, libc::AT_FDCWD, p, m, 0),
            "fchmod" => {
                let fd = libc::open(p, libc::O_RDONLY);
                if fd < 0 {
                    -1
                } else {
                    libc::syscall(libc::SYS_fchmod, fd, m)
                }
            }
            "open" => libc::syscall(libc::SYS_open, p, create, m),
            "openat" => libc::syscall(libc::SYS_openat, libc::AT_FDCWD, p, create, m),
            "creat" => libc::syscall(libc::SYS_creat, p, m),
            "tmpfile" => libc::syscall(
                libc::SYS_openat,
                libc::AT_FDCWD,
                p,
                libc::O_TMPFILE | libc::O_RDWR,
                m,
            ),
            "openat2" => {
                // struct open_how { u64 flags; u64 mode; u64 resolve; }
                let how: [u64; 3] = [create as u64, u64::from(mode), 0];
                libc::syscall(
                    libc::SYS_openat2,
                    libc::AT_FDCWD,
                    p,
                    how.as_ptr(),
                    std::mem::size_of_val(&how),
                )
            }
            "mknod" => libc::syscall(libc::SYS_mknod, p, libc::S_IFREG | m, 0),
            "mknodat" => libc::syscall(libc::SYS_mknodat, libc::AT_FDCWD, p, libc::S_IFREG | m, 0),
            "mkdir" => libc::syscall(libc::SYS_mkdir, p, m),
            "mkdirat" => libc::syscall(libc::SYS_mkdirat, libc::AT_FDCWD, p, m),
            _ => {
                eprintln!("probe: unknown suid operation {op}");
                return 2;
            }
        }
    };
    report(rc)
}

/// `shmat FLAGS`: attaches a new SysV shared memory segment with the flags given
/// (0x8000 is SHM_EXEC) and removes it again.
fn shmat(args: &[String]) -> i32 {
    let flags = num(args, 1) as libc::c_int;
    // SAFETY (test probe): a private segment of one page, attached where the kernel
    // chooses, detached and removed before returning.
    unsafe {
        let id = libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o700);
        if id < 0 {
            return report(-1);
        }
        let at = libc::shmat(id, std::ptr::null(), flags);
        let rc = if at as isize == -1 {
            -1
        } else {
            libc::shmdt(at);
            0
        };
        let saved = errno();
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        if rc < 0 {
            println!("err {saved}");
            return 0;
        }
        report(0)
    }
}

/// `mount-proc`: tries to mount a new proc (needs CAP_SYS_ADMIN).
fn mount_tmpfs() -> i32 {
    let (src, dst, fs) = (cstr("none"), cstr("/tmp"), cstr("tmpfs"));
    // SAFETY (test probe): mount(2) with valid strings.
    let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) };
    report(rc as i64)
}

fn unshare_user() -> i32 {
    // SAFETY (test probe): unshare with a flag.
    report(unsafe { libc::unshare(libc::CLONE_NEWUSER) } as i64)
}

fn unshare_ns() -> i32 {
    // SAFETY (test probe): unshare with a flag.
    report(unsafe { libc::unshare(libc::CLONE_NEWNS) } as i64)
}

fn setns_host() -> i32 {
    let f = match std::fs::File::open("/proc/1/ns/mnt") {
        Ok(f) => f,
        Err(e) => {
            println!("err {}", e.raw_os_error().unwrap_or(-1));
            return 0;
        }
    };
    use std::os::fd::AsRawFd;
    // SAFETY (test probe): setns with a valid fd.
    report(unsafe { libc::setns(f.as_raw_fd(), 0) } as i64)
}

fn chroot() -> i32 {
    let p = cstr("/tmp");
    // SAFETY (test probe): chroot with a valid string.
    report(unsafe { libc::chroot(p.as_ptr()) } as i64)
}

fn clone_newuser() -> i32 {
    // SAFETY (test probe): raw clone with a namespace flag and no stack (fork-like); the
    // child, if any, exits at once.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as u64,
            0,
            0,
            0,
            0,
        )
    };
    if rc == 0 {
        // SAFETY: child leaves at once.
        unsafe { libc::_exit(0) };
    }
    report(rc)
}

fn kill_pid(args: &[String]) -> i32 {
    // SAFETY (test probe): kill(2) with integers.
    report(unsafe { libc::kill(num(args, 1) as i32, libc::SIGKILL) } as i64)
}

fn status_line(args: &[String]) -> i32 {
    let want = arg(args, 1);
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in s.lines() {
        if let Some(rest) = line.strip_prefix(want).and_then(|r| r.strip_prefix(':')) {
            println!("ok {}", rest.trim());
            return 0;
        }
    }
    println!("err 2");
    0
}

/// Reads one frame (4-byte big-endian length + body) from `f`.
fn read_frame(f: &mut std::fs::File) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut len = [0u8; 4];
    f.read_exact(&mut len).ok()?;
    let n = u32::from_be_bytes(len) as usize;
    if n > 256 * 1024 {
        return None;
    }
    let mut body = vec![0u8; n];
    f.read_exact(&mut body).ok()?;
    Some(body)
}

fn write_frame(f: &mut std::fs::File, body: &[u8]) -> bool {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    f.write_all(&out).is_ok()
}

/// `agent-idle SECONDS`: a minimal worker for benchmarks — reads the controller's welcome
/// from fd 3, registers with the manifest it carries, then heartbeats once a second.
fn agent_idle(args: &[String]) -> i32 {
    use std::os::fd::FromRawFd;
    // SAFETY (test probe): fd 3 is the worker socket the controller passed in.
    let mut sock = unsafe { std::fs::File::from_raw_fd(3) };
    let Some(welcome) = read_frame(&mut sock) else {
        return 1;
    };
    // {"type":"welcome","worker_id":..,"manifest":{..},"heartbeat_interval_ms":..}: take the
    // manifest object verbatim (it is the only value that starts with `"manifest":`).
    let text = String::from_utf8_lossy(&welcome);
    let Some(start) = text.find("\"manifest\":") else {
        return 1;
    };
    let rest = &text[start + 11..];
    let Some(end) = rest.rfind(",\"heartbeat_interval_ms\"") else {
        return 1;
    };
    let register = format!("{{\"type\":\"register\",\"manifest\":{}}}", &rest[..end]);
    if !write_frame(&mut sock, register.as_bytes()) || read_frame(&mut sock).is_none() {
        return 1;
    }
    let until = Instant::now() + Duration::from_secs(num(args, 1));
    while Instant::now() < until {
        std::thread::sleep(Duration::from_secs(1));
        if !write_frame(&mut sock, b"{\"type\":\"heartbeat\"}") || read_frame(&mut sock).is_none() {
            return 1;
        }
    }
    0
}

/// `swap A B MILLIS`: exchanges two paths (renameat2 RENAME_EXCHANGE) as fast as it can
/// for MILLIS ms: a component swapped between a check and a use.
fn swap(args: &[String]) -> i32 {
    let (a, b) = (cstr(arg(args, 1)), cstr(arg(args, 2)));
    let until = Instant::now() + Duration::from_millis(num(args, 3));
    let mut n: i64 = 0;
    while Instant::now() < until {
        // SAFETY: renameat2 with two NUL-terminated paths.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if rc < 0 {
            return report(-1);
        }
        n += 1;
    }
    report(n)
}

/// Raises the soft open-file limit to the hard one (attacks that hold many descriptors).
fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Writes "ready" to `path` (when given) and sleeps `secs` seconds: a holder of resources
/// the test looks at from outside meanwhile.
fn hold(path: &str, secs: u64) {
    if !path.is_empty() {
        let _ = std::fs::write(path, "ready");
    }
    std::thread::sleep(Duration::from_secs(secs));
}

/// `pipes N SECONDS [READY]`: creates up to N empty pipes and holds them.
fn pipes(args: &[String]) -> i32 {
    raise_nofile();
    let mut held = Vec::new();
    for _ in 0..num(args, 1) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the array we own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
            break;
        }
        held.push(fds);
    }
    println!("ok {}", held.len());
    let _ = std::io::stdout().flush();
    hold(arg(args, 3), num(args, 2));
    0
}

/// `pipe-size`: the size of a new pipe, then whether it can be grown to 1 MiB.
fn pipe_size() -> i32 {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the array we own; fcntl on the descriptors it returned.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) < 0 {
            return report(-1);
        }
        let size = libc::fcntl(fds[0], libc::F_GETPIPE_SZ);
        let grow = libc::fcntl(fds[0], libc::F_SETPIPE_SZ, 1 << 20);
        let e = if grow < 0 { errno() } else { 0 };
        println!(
            "size {size} grow {}",
            if grow < 0 {
                format!("err {e}")
            } else {
                "ok".into()
            }
        );
    }
    0
}

/// `inotify N SECONDS [READY]`: creates up to N inotify instances and holds them.
fn inotify(args: &[String]) -> i32 {
    raise_nofile();
    let mut n = 0;
    let mut last = 0;
    while n < num(args, 1) {
        // SAFETY: inotify_init1 returns a new descriptor or -1.
        if unsafe { libc::inotify_init1(libc::IN_CLOEXEC) } < 0 {
            last = errno();
            break;
        }
        n += 1;
    }
    println!("ok {n} err {last}");
    let _ = std::io::stdout().flush();
    hold(arg(args, 3), num(args, 2));
    0
}

/// `ptys N`: opens up to N terminals from /dev/ptmx; prints how many and the last errno.
fn ptys(args: &[String]) -> i32 {
    raise_nofile();
    let ptmx = cstr("/dev/ptmx");
    let mut n = 0;
    let mut last = 0;
    while n < num(args, 1) {
        // SAFETY: open with a NUL-terminated path.
        if unsafe {
            libc::open(
                ptmx.as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        } < 0
        {
            last = errno();
            break;
        }
        n += 1;
    }
    println!("ok {n} err {last}");
    0
}

/// `unix-connect PATH`: connects to a unix stream socket at PATH.
fn unix_connect(args: &[String]) -> i32 {
    match std::os::unix::net::UnixStream::connect(arg(args, 1)) {
        Ok(_) => report(0),
        Err(e) => {
            println!("err {}", e.raw_os_error().unwrap_or(0));
            0
        }
    }
}

/// `fifo-write PATH`: opens PATH for writing without blocking (a FIFO with no reader
/// gives ENXIO, which still means the open itself was allowed) and writes a byte.
fn fifo_write(args: &[String]) -> i32 {
    let p = cstr(arg(args, 1));
    // SAFETY: open with a NUL-terminated path; write one byte from a static buffer.
    unsafe {
        let fd = libc::open(
            p.as_ptr(),
            libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return report(-1);
        }
        report(libc::write(fd, b"x".as_ptr().cast(), 1) as i64)
    }
}

/// `listen-loopback`: a TCP server on the sandbox's own 127.0.0.1 and a client of it.
fn listen_loopback() -> i32 {
    let listener = match std::net::TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => {
            println!("err {}", e.raw_os_error().unwrap_or(0));
            return 0;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            println!("err {}", e.raw_os_error().unwrap_or(0));
            return 0;
        }
    };
    match std::net::TcpStream::connect(addr).and_then(|_c| listener.accept()) {
        Ok(_) => report(0),
        Err(e) => {
            println!("err {}", e.raw_os_error().unwrap_or(0));
            0
        }
    }
}

/// Runs one probe command; `main` runs each of a `+`-separated sequence in turn.
fn run_one(args: &[String]) -> i32 {
    match arg(args, 0) {
        "syscall" => raw_syscall(args),
        "i386" => i386(args),
        "x32" => x32(args),
        "tcp" => connect_tcp(args, false),
        "udp" => connect_tcp(args, true),
        "abstract" => connect_abstract(args),
        "write" => write_file(args),
        "read" => read_file(args),
        "forkbomb" => forkbomb(args),
        "memhog" => memhog(args),
        "spin" => spin(args),
        "daemon" => daemon(args),
        "tiocsti" => tiocsti(args),
        "tiocsctty" => tiocsctty(args),
        "write-fd" => write_fd(args),
        "fds" => fds(),
        "fionread" => fionread(args),
        "tiocsti-pty" => tiocsti_pty(),
        "suid" => suid(args),
        "shmat" => shmat(args),
        "mount" => mount_tmpfs(),
        "unshare-user" => unshare_user(),
        "unshare-ns" => unshare_ns(),
        "setns" => setns_host(),
        "chroot" => chroot(),
        "clone-newuser" => clone_newuser(),
        "kill" => kill_pid(args),
        "status" => status_line(args),
        "agent-idle" => agent_idle(args),
        "swap" => swap(args),
        "pipes" => pipes(args),
        "pipe-size" => pipe_size(),
        "inotify" => inotify(args),
        "ptys" => ptys(args),
        "unix-connect" => unix_connect(args),
        "fifo-write" => fifo_write(args),
        "listen-loopback" => listen_loopback(),
        other => {
            eprintln!("probe: unknown command {other:?}");
            2
        }
    }
}

/// `probe CMD ARGS... [+ CMD ARGS...]...`: the commands run in order (a sequence such as
/// `tiocsctty 0 + tiocsti 0 TEXT` acts as one process); the exit status is the first
/// non-zero one.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut code = 0;
    for cmd in args.split(|a| a == "+") {
        let c = run_one(cmd);
        let _ = std::io::stdout().flush();
        if code == 0 {
            code = c;
        }
    }
    std::process::exit(code);
}
