use super::*;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;

use nix::poll::{PollTimeout, poll};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn file_sink() -> Result<(std::fs::File, OwnedFd), Box<dyn std::error::Error>> {
    let f = tempfile::tempfile()?;
    let sink = OwnedFd::from(f.try_clone()?);
    Ok((f, sink))
}

fn contents(mut f: &std::fs::File) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    f.rewind()?;
    f.read_to_end(&mut out)?;
    Ok(out)
}

#[test]
fn output_under_the_cap_passes_whole_and_is_not_truncated() -> TestResult {
    let (out, out_sink) = file_sink()?;
    let (err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(Some(100), out_sink, err_sink)?;
    std::fs::File::from(w_out).write_all(b"hello\n")?;
    std::fs::File::from(w_err).write_all(b"oops\n")?;
    pump.drain(None);
    assert!(pump.is_done());
    assert_eq!(contents(&out)?, b"hello\n");
    assert_eq!(contents(&err)?, b"oops\n");
    assert_eq!(
        pump.summary(),
        OutputSummary {
            bytes: 11,
            truncated: false,
            cap: Some(100),
            pty: false,
            write_errno: None,
            lost: 0,
            unwritten: 0,
            stalled: false,
        }
    );
    Ok(())
}

#[test]
fn pumps_sharing_a_budget_keep_no_more_than_it_together() -> TestResult {
    let budget = OutputBudget::new(10);
    let (a_out, a_sink) = file_sink()?;
    let (_a_err, a_err_sink) = file_sink()?;
    let (b_out, b_sink) = file_sink()?;
    let (_b_err, b_err_sink) = file_sink()?;
    let (mut a, [wa, _wa_err]) = OutputPump::new(None, a_sink, a_err_sink)?;
    let (mut b, [wb, _wb_err]) = OutputPump::new(Some(100), b_sink, b_err_sink)?;
    a.share_budget(budget.clone());
    b.share_budget(budget.clone());
    std::fs::File::from(wa).write_all(b"1234567")?;
    a.progress();
    std::fs::File::from(wb).write_all(b"abcdefgh")?;
    b.progress();
    assert_eq!(contents(&a_out)?, b"1234567");
    assert_eq!(
        contents(&b_out)?,
        b"abc",
        "the rest of the shared budget, no more"
    );
    assert!(b.summary().truncated && !a.summary().truncated);
    assert_eq!(budget.left(), 0);
    Ok(())
}

#[test]
fn exactly_the_cap_then_end_of_file_is_not_truncated() -> TestResult {
    let (out, out_sink) = file_sink()?;
    let (_err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(Some(4), out_sink, err_sink)?;
    drop(w_err);
    std::fs::File::from(w_out).write_all(b"abcd")?;
    pump.drain(None);
    assert_eq!(contents(&out)?, b"abcd");
    assert!(!pump.summary().truncated);
    Ok(())
}

#[test]
fn the_cap_counts_both_streams_and_closes_both_pipes() -> TestResult {
    let (out, out_sink) = file_sink()?;
    let (err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(Some(10), out_sink, err_sink)?;
    let mut w_out = std::fs::File::from(w_out);
    let mut w_err = std::fs::File::from(w_err);
    w_err.write_all(b"123456")?;
    pump.progress();
    w_out.write_all(b"abcdefgh")?;
    pump.progress();
    assert_eq!(contents(&err)?, b"123456");
    assert_eq!(contents(&out)?, b"abcd");
    assert!(pump.summary().truncated);
    assert_eq!(pump.open_pipes(), 0, "both pipes are closed at the cap");
    // The writers now get EPIPE (the test process ignores SIGPIPE, as Rust programs do).
    match w_err.write_all(b"more") {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPIPE)),
        Ok(()) => panic!("a write after the cap succeeded"),
    }
    assert_eq!(pump.summary().bytes, 10);
    Ok(())
}

#[test]
fn without_a_cap_everything_passes() -> TestResult {
    let (out, out_sink) = file_sink()?;
    let (_err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(None, out_sink, err_sink)?;
    drop(w_err);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let data = data.clone();
        std::thread::spawn(move || std::fs::File::from(w_out).write_all(&data))
    };
    while !pump.is_done() {
        let mut fds = pump.poll_fds();
        let _ = poll(&mut fds, PollTimeout::from(100u16));
        drop(fds);
        pump.progress();
    }
    match writer.join() {
        Ok(r) => r?,
        Err(_) => panic!("the writer thread panicked"),
    }
    assert_eq!(contents(&out)?, data);
    assert_eq!(pump.summary().bytes, data.len() as u64);
    Ok(())
}

#[test]
fn a_destination_that_stops_reading_never_blocks_the_pump() -> TestResult {
    // The destination is a pipe nobody reads: once it is full the pump must return
    // from progress() instead of waiting in write(2).
    let (dest_r, dest_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (_err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(None, dest_w, err_sink)?;
    drop(w_err);
    fcntl(&w_out, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let mut w_out = std::fs::File::from(w_out);
    let chunk = vec![b'x'; 64 << 10];
    // Fill the payload pipe and the destination pipe; every call must return.
    for _ in 0..8 {
        let _ = w_out.write(&chunk);
        pump.progress();
    }
    assert!(!pump.is_done());
    assert!(
        !pump.poll_fds().is_empty(),
        "the pump waits for the destination"
    );
    let written = pump.summary().bytes;
    assert!(written > 0, "some output reached the destination");
    // Reading the destination makes room, and the pump continues.
    let mut sink = std::fs::File::from(dest_r);
    let mut buf = vec![0u8; 64 << 10];
    let n = sink.read(&mut buf)?;
    assert!(n > 0);
    pump.progress();
    assert!(pump.summary().bytes > written);
    Ok(())
}

#[test]
fn a_closed_destination_closes_its_pipe() -> TestResult {
    let (dest_r, dest_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    drop(dest_r);
    let (_err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(None, dest_w, err_sink)?;
    drop(w_err);
    let mut w_out = std::fs::File::from(w_out);
    w_out.write_all(b"nobody reads this")?;
    pump.progress();
    assert_eq!(pump.open_pipes(), 0);
    match w_out.write_all(b"again") {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPIPE)),
        Ok(()) => panic!("a write to a pipe whose destination is gone succeeded"),
    }
    Ok(())
}

/// Polls and moves bytes until `done` or 5 s.
fn pump_until(pump: &mut OutputPump, mut done: impl FnMut(&OutputPump) -> bool) {
    let start = Instant::now();
    while !done(pump) && start.elapsed() < std::time::Duration::from_secs(5) {
        let mut fds = pump.poll_fds();
        let _ = poll(&mut fds, PollTimeout::from(20u8));
        drop(fds);
        pump.progress();
    }
}

#[test]
fn input_reaches_the_payload_and_its_end_is_end_of_file() -> TestResult {
    let (src_r, src_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let mut pump = OutputPump::with_cap(Some(1));
    let payload_stdin = pump.add_input(src_r)?;
    std::fs::File::from(src_w).write_all(b"typed ahead, longer than the cap")?;
    let mut got = Vec::new();
    let mut payload_stdin = std::fs::File::from(payload_stdin);
    pump_until(&mut pump, |p| p.streams.iter().all(|s| s.sink.is_none()));
    payload_stdin.read_to_end(&mut got)?;
    assert_eq!(got, b"typed ahead, longer than the cap");
    assert_eq!(pump.summary().bytes, 0, "input is not counted");
    assert!(!pump.summary().truncated);
    Ok(())
}

#[test]
fn a_payload_that_never_reads_its_input_never_blocks_the_pump() -> TestResult {
    // An endless source (/dev/zero) and a payload that reads nothing: the input pipe
    // fills, and every progress() call returns.
    let zero = std::fs::File::open("/dev/zero")?;
    let mut pump = OutputPump::with_cap(None);
    let _payload_stdin = pump.add_input(OwnedFd::from(zero))?;
    for _ in 0..64 {
        pump.progress();
    }
    assert!(pump.streams.iter().any(Stream::has_pending));
    Ok(())
}

#[test]
fn the_sandbox_terminal_is_relayed_counted_and_hung_up_at_the_cap() -> TestResult {
    // The caller's terminal is a pty of the test's; the pump gives the sandbox another.
    let caller = tty::open_pty()?;
    let raw = tty::RawMode::enter(caller.replica.as_fd())?;
    let mut pump = OutputPump::with_cap(Some(10));
    let replica = pump.add_terminal(caller.replica.as_fd(), raw.saved(), true)?;
    // The payload's terminal raw too, to see the bytes as they pass.
    let mut plain = raw.saved().clone();
    nix::sys::termios::cfmakeraw(&mut plain);
    tty::set_modes(&replica, &plain)?;
    // Typed at the caller's terminal, read by the payload.
    nix::unistd::write(&caller.master, b"ls\r")?;
    pump_until(&mut pump, |_| {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int into a local that outlives the call.
        unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&replica),
                libc::FIONREAD,
                &mut n,
            )
        };
        n >= 3
    });
    fcntl(&replica, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let mut buf = [0u8; 64];
    let n = nix::unistd::read(&replica, &mut buf)?;
    assert_eq!(buf.get(..n), Some(b"ls\r".as_slice()));
    assert_eq!(pump.summary().bytes, 0, "input is not counted");
    // Written by the payload, shown on the caller's terminal, up to the cap.
    nix::unistd::write(&replica, b"0123456789abcdef")?;
    pump_until(&mut pump, |p| p.summary().truncated);
    let summary = pump.summary();
    assert!(summary.truncated && summary.pty);
    assert_eq!(summary.bytes, 10);
    let mut shown = [0u8; 64];
    let n = nix::unistd::read(&caller.master, &mut shown)?;
    assert_eq!(shown.get(..n), Some(b"0123456789".as_slice()));
    // The master is closed: the sandbox's terminal is hung up, its writes fail.
    assert_eq!(
        nix::unistd::write(&replica, b"more"),
        Err(Errno::EIO),
        "a write after the cap succeeded"
    );
    Ok(())
}

#[test]
fn a_terminal_destination_is_written_without_blocking_when_nobody_reads_it() -> TestResult {
    let caller = tty::open_pty()?;
    let (_err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(None, caller.replica.try_clone()?, err_sink)?;
    drop(w_err);
    fcntl(&w_out, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let mut w_out = std::fs::File::from(w_out);
    let chunk = vec![b'x'; 64 << 10];
    // Nobody reads the master: the terminal fills, and every call returns.
    for _ in 0..16 {
        let _ = w_out.write(&chunk);
        pump.progress();
    }
    assert!(!pump.is_done());
    assert!(pump.summary().bytes > 0);
    Ok(())
}

#[test]
fn one_place_is_one_pipe_or_one_open_file_not_one_file_opened_twice() -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let (_r, w) = nix::unistd::pipe()?;
    let (_r2, w2) = nix::unistd::pipe()?;
    assert!(same_destination(w.as_fd(), w.try_clone()?.as_fd()));
    assert!(!same_destination(w.as_fd(), w2.as_fd()));
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("log");
    let file = std::fs::File::create(&path)?;
    let again = std::fs::OpenOptions::new().write(true).open(&path)?;
    assert!(same_destination(file.as_fd(), file.try_clone()?.as_fd()));
    assert!(!same_destination(file.as_fd(), again.as_fd()));
    assert!(!same_destination(file.as_fd(), w.as_fd()));
    Ok(())
}

/// A pty's master as the destination (a terminal emulator or `script` handing its end to
/// `run`): opened again, `/dev/ptmx` made a new pty, and the output reached no one.
#[test]
fn output_to_a_pty_master_reaches_its_replica() -> TestResult {
    use std::os::fd::AsFd;
    let pty = tty::open_pty()?;
    let other = tty::open_pty()?;
    assert!(!same_destination(pty.master.as_fd(), other.master.as_fd()));
    assert!(same_destination(
        pty.master.as_fd(),
        pty.master.try_clone()?.as_fd()
    ));
    let (mut pump, [out, err]) =
        OutputPump::new(None, pty.master.try_clone()?, pty.master.try_clone()?)?;
    nix::unistd::write(&out, b"to the replica\n")?;
    drop((out, err));
    pump.drain(None);
    let mut got = [0u8; 64];
    let mut read = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !got[..read].ends_with(b"\n") && std::time::Instant::now() < deadline {
        let mut fds = [nix::poll::PollFd::new(
            pty.replica.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16))? > 0 {
            read += nix::unistd::read(&pty.replica, &mut got[read..])?;
        }
    }
    // Written to the master, it is the replica's input.
    assert_eq!(&got[..read], b"to the replica\n");
    Ok(())
}

/// A pty master whose replica nobody reads: its POLLOUT promises room for one byte, and a
/// write of more blocked the supervisor (and the timeout with it) until someone read.
#[test]
fn a_pty_master_nobody_reads_never_blocks_the_pump() -> TestResult {
    let pty = tty::open_pty()?;
    // A caller's master blocks, as one a terminal program opened does, and its replica is
    // raw (a canonical one drops what does not fit a line, so nothing ever waits).
    nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))?;
    let mut raw = nix::sys::termios::tcgetattr(&pty.replica)?;
    nix::sys::termios::cfmakeraw(&mut raw);
    nix::sys::termios::tcsetattr(&pty.replica, nix::sys::termios::SetArg::TCSANOW, &raw)?;
    let sinks = (pty.master.try_clone()?, pty.master.try_clone()?);
    let (done, finished) = std::sync::mpsc::channel();
    // In a thread of its own: the pump is not `Send`, its descriptors are.
    std::thread::spawn(move || -> std::io::Result<()> {
        let (mut pump, [out, err]) = OutputPump::new(None, sinks.0, sinks.1)?;
        drop(err);
        nix::fcntl::fcntl(&out, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        let chunk = vec![b'x'; 32 << 10];
        // Far more than the pty and the line discipline hold.
        for _ in 0..64 {
            let _ = nix::unistd::write(&out, &chunk);
            pump.progress();
        }
        let _ = done.send(pump.summary().bytes);
        Ok(())
    });
    let passed = finished.recv_timeout(std::time::Duration::from_secs(20));
    assert!(passed.is_ok(), "the pump blocked writing to the pty master");
    assert_blocking(&pty.master)
}

/// A read from a blocking pty master whose bytes another reader took after the poll: it
/// must come back at once, the master's flags as found, not wait for the next byte (with
/// the timeout behind it).
#[test]
fn a_read_from_a_shared_master_never_waits_and_leaves_its_flags() -> TestResult {
    let pty = tty::open_pty()?;
    nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))?;
    let (done, finished) = std::sync::mpsc::channel();
    let master = pty.master.try_clone()?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let _ = done.send(read_nonblocking(master.as_fd(), &mut buf));
    });
    let got = finished.recv_timeout(std::time::Duration::from_secs(10));
    // A blocking read would still wait here; the replica is written to only to end it.
    nix::unistd::write(&pty.replica, b"x")?;
    assert_eq!(got.ok(), Some(Err(Errno::EAGAIN)));
    assert_blocking(&pty.master)
}

/// The caller's description is left as found: blocking.
fn assert_blocking(fd: &OwnedFd) -> TestResult {
    let flags = OFlag::from_bits_retain(nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)?);
    assert!(!flags.contains(OFlag::O_NONBLOCK));
    Ok(())
}

/// Whether `call` on another thread comes back within 10 s (a call that waits would not:
/// `unblock` then ends its wait, so the test never hangs).
fn returns_at_once<T: Send + 'static>(
    call: impl FnOnce() -> T + Send + 'static,
    unblock: impl FnOnce(),
) -> Option<T> {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(call());
    });
    let got = finished
        .recv_timeout(std::time::Duration::from_secs(10))
        .ok();
    unblock();
    got
}

/// A caller's pipe is shared: another reader of a stdin pipe may empty it, another writer
/// to a stdout pipe may fill it, between the poll that found it ready and the pump's call.
/// The pump's calls go through a non-blocking description of its own, so they never wait
/// (and `--timeout` with them); the caller's description stays blocking.
#[test]
fn a_shared_pipe_is_used_through_a_description_that_never_waits() -> TestResult {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (ours_r, mode_r) = caller_end(r.try_clone()?, OFlag::O_RDONLY)?;
    assert_eq!(mode_r, Mode::NonBlocking);
    let w_unblock = w.try_clone()?;
    let got = returns_at_once(
        move || {
            let mut buf = [0u8; 64];
            nix::unistd::read(&ours_r, &mut buf)
        },
        || {
            let _ = nix::unistd::write(&w_unblock, b"x");
        },
    );
    assert_eq!(got, Some(Err(Errno::EAGAIN)));

    let (ours_w, mode_w) = caller_end(w.try_clone()?, OFlag::O_WRONLY)?;
    assert_eq!(mode_w, Mode::NonBlocking);
    let r_unblock = r.try_clone()?;
    let got = returns_at_once(
        move || {
            let chunk = [b'x'; 4096];
            loop {
                match nix::unistd::write(&ours_w, &chunk) {
                    Ok(_) => continue,
                    other => return other,
                }
            }
        },
        || {
            let mut buf = vec![0u8; 1 << 20];
            let _ = nix::unistd::read(&r_unblock, &mut buf);
        },
    );
    assert_eq!(got, Some(Err(Errno::EAGAIN)), "a full pipe waited");
    assert_blocking(&r)?;
    assert_blocking(&w)
}

/// The same for a socket, which cannot be opened again: each call asks not to wait.
#[test]
fn a_shared_socket_is_read_and_written_without_waiting() -> TestResult {
    let (a, b) = std::os::unix::net::UnixStream::pair()?;
    let (a, b) = (OwnedFd::from(a), OwnedFd::from(b));
    let (ours, mode) = caller_end(a.try_clone()?, OFlag::O_RDONLY)?;
    assert_eq!(mode, Mode::Socket);
    let b_unblock = b.try_clone()?;
    let reader = ours.try_clone()?;
    let got = returns_at_once(
        move || {
            let mut buf = [0u8; 64];
            recv_nonblocking(reader.as_fd(), &mut buf)
        },
        || {
            let _ = nix::unistd::write(&b_unblock, b"x");
        },
    );
    assert_eq!(got, Some(Err(Errno::EAGAIN)));
    let b_drain = b.try_clone()?;
    let got = returns_at_once(
        move || {
            let chunk = [b'x'; 4096];
            loop {
                match send_nonblocking(ours.as_fd(), &chunk) {
                    Ok(_) => continue,
                    other => return other,
                }
            }
        },
        || {
            let mut buf = vec![0u8; 1 << 20];
            let _ = nix::unistd::read(&b_drain, &mut buf);
        },
    );
    assert_eq!(got, Some(Err(Errno::EAGAIN)), "a full socket waited");
    assert_blocking(&a)
}

/// The caller's pipe end is used only the way the caller opened it: its other end is
/// someone else's. A write-only stdin is never read (what its reader was sent stays for
/// it), a read-only stdout never written (nothing is put into what the caller reads).
#[test]
fn a_callers_pipe_end_is_never_turned_around() -> TestResult {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    nix::unistd::write(&w, b"for the pipe's own reader")?;
    let mut pump = OutputPump::with_cap(Some(1 << 20));
    let payload_stdin = pump.add_input(w.try_clone()?)?;
    for _ in 0..4 {
        pump.progress();
    }
    fcntl(&payload_stdin, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let mut buf = [0u8; 64];
    assert_ne!(
        nix::unistd::read(&payload_stdin, &mut buf)
            .ok()
            .filter(|n| *n > 0),
        Some(25),
        "the payload read what the caller's pipe held for its reader"
    );
    assert_eq!(
        nix::unistd::read(&r, &mut buf)?,
        25,
        "the reader lost its bytes"
    );

    let (r, _w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (_err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(Some(1 << 20), r.try_clone()?, err_sink)?;
    drop(w_err);
    nix::unistd::write(&w_out, b"INJECTED")?;
    drop(w_out);
    for _ in 0..4 {
        pump.progress();
    }
    fcntl(&r, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    assert_eq!(
        nix::unistd::read(&r, &mut buf),
        Err(Errno::EAGAIN),
        "the payload's output went into a pipe the caller only reads"
    );
    Ok(())
}

/// A pipe that cannot be opened again (here: a FIFO whose reader has gone, which no
/// writer may open) is written with the flag set for each call, never by a call that may
/// wait.
#[test]
fn a_pipe_that_cannot_be_opened_again_is_still_never_waited_on() -> TestResult {
    let dir = tempfile::tempdir()?;
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)?;
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo)?;
    drop(reader);
    let (_, mode) = caller_end(OwnedFd::from(writer), OFlag::O_WRONLY)?;
    assert_eq!(mode, Mode::BriefNonBlocking);
    Ok(())
}

/// A datagram socket takes each send as one record: the output goes in pieces it takes,
/// not in one record of everything read.
#[test]
fn output_to_a_datagram_socket_goes_in_records_it_takes() -> TestResult {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Datagram,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let (_err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(Some(1 << 20), ours, err_sink)?;
    drop(w_err);
    let mut w_out = std::fs::File::from(w_out);
    w_out.write_all(&[b'x'; 60_000])?;
    drop(w_out);
    fcntl(&theirs, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 17];
    for _ in 0..1000 {
        pump.progress();
        while let Ok(n) = nix::unistd::read(&theirs, &mut buf) {
            assert!(n <= PIPE_BUF, "a record of {n} bytes");
            got += n;
        }
        if got >= 60_000 {
            break;
        }
    }
    assert_eq!(got, 60_000);
    assert_eq!(pump.summary().write_errno, None);
    Ok(())
}

#[test]
fn a_relay_moves_output_on_its_own_thread_and_drains_it_at_the_end() -> TestResult {
    let (out, out_sink) = file_sink()?;
    let (err, err_sink) = file_sink()?;
    let (pump, [w_out, w_err]) = OutputPump::new(Some(100), out_sink, err_sink)?;
    let relay = Relay::start(pump, None)?;
    std::fs::File::from(w_out).write_all(b"hello\n")?;
    std::fs::File::from(w_err).write_all(b"oops\n")?;
    let summary = relay.finish(None);
    assert_eq!(contents(&out)?, b"hello\n");
    assert_eq!(contents(&err)?, b"oops\n");
    assert_eq!((summary.bytes, summary.unwritten), (11, 0));
    assert!(
        !summary.stalled && summary.write_error().is_none(),
        "{summary:?}"
    );
    Ok(())
}

#[test]
fn a_relay_whose_destination_stops_reading_says_what_it_could_not_write() -> TestResult {
    // A pipe nobody reads: the relay drains until the deadline, then says what is left.
    let (_dest_r, dest_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (_err, err_sink) = file_sink()?;
    let (pump, [w_out, w_err]) = OutputPump::new(None, dest_w, err_sink)?;
    drop(w_err);
    fcntl(&w_out, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let deadline = Instant::now() + std::time::Duration::from_secs(1);
    let relay = Relay::start(pump, Some(deadline))?;
    let mut w_out = std::fs::File::from(w_out);
    let chunk = vec![b'x'; 64 << 10];
    // Until the destination and the payload's pipe are both full (nothing taken for a
    // while), or the deadline.
    let mut refused = 0;
    while refused < 10 && Instant::now() < deadline {
        match w_out.write(&chunk) {
            Ok(n) if n > 0 => refused = 0,
            Ok(_) => refused += 1,
            Err(_) => {
                refused += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    drop(w_out);
    let summary = relay.finish(None);
    assert!(
        Instant::now() < deadline + std::time::Duration::from_secs(2),
        "the relay was waited for past its deadline"
    );
    assert!(!summary.stalled, "{summary:?}");
    assert!(summary.unwritten > 0, "{summary:?}");
    assert!(
        summary
            .write_error()
            .is_some_and(|e| e.contains("took no more before the timeout")),
        "{summary:?}"
    );
    Ok(())
}

#[test]
fn a_relay_passes_a_new_window_size_on_to_the_sandboxs_terminal() -> TestResult {
    let caller = tty::open_pty()?;
    let raw = tty::RawMode::enter(caller.replica.as_fd())?;
    let mut pump = OutputPump::with_cap(None);
    let replica = pump.add_terminal(caller.replica.as_fd(), raw.saved(), false)?;
    let relay = Relay::start(pump, Some(Instant::now()))?;
    let size = libc::winsize {
        ws_row: 31,
        ws_col: 97,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from a local that outlives the call.
    let set = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&caller.master),
            libc::TIOCSWINSZ,
            &size,
        )
    };
    assert_eq!(set, 0, "{}", io::Error::last_os_error());
    assert!(relay.window_changed(), "the sandbox has a terminal");
    let start = Instant::now();
    while tty::window_width(replica.as_fd()) != Some(97)
        && start.elapsed() < std::time::Duration::from_secs(5)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(tty::window_width(replica.as_fd()), Some(97));
    drop(replica);
    let _ = relay.finish(None);
    Ok(())
}

#[test]
fn a_held_relay_still_hears_that_the_sandbox_ended_after_any_number_of_window_changes() -> TestResult
{
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    // The caller's terminal, so that window changes are passed on; the output goes to a
    // pipe whose reader splices it into a socket nobody reads, which holds the pipe's
    // lock once the socket is full: the relay's next write to the pipe waits for it.
    let caller = tty::open_pty()?;
    let raw = tty::RawMode::enter(caller.replica.as_fd())?;
    let mut pump = OutputPump::with_cap(None);
    let replica = pump.add_terminal(caller.replica.as_fd(), raw.saved(), false)?;
    let (dest_r, dest_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let w_out = pump.add_output(dest_w)?;
    let (full, peer) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let holder = std::thread::spawn(move || {
        // Returns once `peer` is closed (EPIPE), letting the pipe go.
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: splice(2) on two descriptors this thread owns, no offsets.
            let n = unsafe {
                libc::splice(
                    dest_r.as_raw_fd(),
                    std::ptr::null_mut(),
                    full.as_raw_fd(),
                    std::ptr::null_mut(),
                    1 << 20,
                    0,
                )
            };
            if n <= 0 {
                break;
            }
        }
    });
    let relay = Relay::start(pump, None)?;
    fcntl(&w_out, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let mut w_out = std::fs::File::from(w_out);
    let chunk = vec![b'x'; 64 << 10];
    // Enough to fill the socket and the pipe, and hold the relay in its write.
    for _ in 0..64 {
        if w_out.write(&chunk).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    drop(w_out);
    drop(replica);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Far more window changes than a pipe holds bytes.
    for _ in 0..200_000 {
        assert!(relay.window_changed());
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(relay.finish(None));
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The reader lets go: the relay must now drain and end.
    drop(peer);
    let summary = rx.recv_timeout(std::time::Duration::from_secs(10));
    let _ = holder.join();
    let summary = summary.map_err(|_| "the relay never heard that the sandbox ended")?;
    assert!(!summary.stalled, "{summary:?}");
    Ok(())
}

#[test]
fn a_stop_signal_ends_the_wait_for_a_relay_whose_destination_takes_nothing() -> TestResult {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    // A run without a timeout whose caller stopped reading: once the command has ended,
    // ^C ends the wait for its output.
    let (_dest_r, dest_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (_err, err_sink) = file_sink()?;
    let (pump, [w_out, w_err]) = OutputPump::new(None, dest_w, err_sink)?;
    drop(w_err);
    fcntl(&w_out, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let relay = Relay::start(pump, None)?;
    let mut w_out = std::fs::File::from(w_out);
    let chunk = vec![b'x'; 64 << 10];
    let mut refused = 0;
    while refused < 10 {
        match w_out.write(&chunk) {
            Ok(n) if n > 0 => refused = 0,
            _ => {
                refused += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    drop(w_out);
    // SIGINT, blocked in this thread alone and read from a signalfd, as `run` does.
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    let signals = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    // SAFETY: gettid(2) takes nothing and cannot fail.
    let me = unsafe { libc::gettid() };
    let pid = std::process::id() as libc::pid_t;
    let sender = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        // SAFETY: tgkill(2) with plain integers: SIGINT to this process's test thread.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, me, libc::SIGINT) };
    });
    let summary = relay.finish(Some(&signals));
    let _ = sender.join();
    pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None)?;
    assert!(summary.stalled && summary.unwritten > 0, "{summary:?}");
    Ok(())
}

#[test]
fn a_drain_tells_what_has_passed_after_every_round() -> TestResult {
    let (_out, out_sink) = file_sink()?;
    let (_err, err_sink) = file_sink()?;
    let (mut pump, [w_out, w_err]) = OutputPump::new(None, out_sink, err_sink)?;
    drop(w_err);
    let mut w_out = std::fs::File::from(w_out);
    w_out.write_all(&[b'x'; 60_000])?;
    drop(w_out);
    let mut told = Vec::new();
    pump.drain_telling(None, |p| told.push(p.summary().bytes));
    // What a relay held in a later round would have published: everything so far.
    assert_eq!(told.last(), Some(&60_000), "{told:?}");
    Ok(())
}
