//! The program's entry point, without std's start-up.
//!
//! Why: before `main`, std's runtime finds the main thread's stack (glibc's
//! `pthread_getattr_np`, which reads the whole of `/proc/self/maps`), maps an alternate
//! signal stack and installs SIGSEGV and SIGBUS handlers whose only job is to print
//! "has overflowed its stack" before the process dies anyway: 19 system calls, about a
//! tenth of a millisecond on every start of a sandbox, for a message. The kernel's guard
//! gap below the main thread's stack, and the guard pages std puts below every other
//! thread's, still turn an overflow into SIGSEGV.
//!
//! What std's start-up does that hatchery relies on is kept, in [`run`]: descriptors 0, 1
//! and 2 are open (on `/dev/null` if the caller closed them, or gave an `O_PATH` one, on
//! which std's start-up aborted), so that no file this process
//! opens becomes its stdout; SIGPIPE is ignored (see `quiet_on_closed_stdout` in
//! `main.rs`); a panic that unwinds to the top ends the process with status 101. The
//! command line is still read by std (`std::env::args_os`), which glibc hands it before
//! `main` (glibc only: hatchery is built for `*-linux-gnu`). Not kept: the main thread's
//! name in a panic's message (`<unnamed>` instead of `main`).

use std::os::fd::RawFd;

/// Defines the program's C `main`, which runs `$body` (a `fn() -> i32`) through [`run`].
/// For a `#![no_main]` binary.
#[macro_export]
macro_rules! program_entry {
    ($body:path) => {
        // SAFETY: the program's one C `main` (its crate is `#![no_main]`), called once by
        // the C start-up code with the arguments it declares.
        #[unsafe(no_mangle)]
        extern "C" fn main(
            _argc: ::std::ffi::c_int,
            _argv: *const *const ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            // Through std's exit, never a return to C: stdout's buffer is flushed even
            // when `$body` returns its status instead of exiting.
            ::std::process::exit($crate::sandbox::entry::run($body))
        }
    };
}

/// What std's start-up does that hatchery needs, then `body`; its status, or 101 when a
/// panic unwinds out of it (std's status for a panic in `main`; a build with `panic =
/// "abort"`, as the release profile is, aborts at the panic instead, as before).
pub fn run(body: fn() -> i32) -> i32 {
    standard_descriptors_open();
    // SAFETY: SIG_IGN installs no handler; nothing else is running yet.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // A file size limit (`ulimit -f`) makes a write past it fail with EFBIG instead of
    // killing hatchery (a supervisor killed so leaves its cgroups and writes no report).
    // SAFETY: as above. A payload starts with every disposition reset.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    std::panic::catch_unwind(body).unwrap_or(101)
}

/// Opens `/dev/null` on whichever of descriptors 0, 1 and 2 is closed, as std's start-up
/// does; aborts if that fails (nothing can be said safely then).
fn standard_descriptors_open() {
    let mut fds = [0, 1, 2].map(|fd: RawFd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    loop {
        // SAFETY: poll(2) on an array we own, of the length we pass, with no wait.
        if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } >= 0 {
            break;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // poll cannot run (a descriptor limit of 0, no memory): ask each one instead.
            _ => {
                for fd in &mut fds {
                    // SAFETY: F_GETFD only reads the descriptor's flags.
                    let closed = unsafe { libc::fcntl(fd.fd, libc::F_GETFD) } == -1
                        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
                    fd.revents = if closed { libc::POLLNVAL } else { 0 };
                }
                break;
            }
        }
    }
    for fd in fds {
        if fd.revents & libc::POLLNVAL != 0 {
            // SAFETY: open(2) of a constant NUL-terminated path.
            let opened = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR, 0) };
            if opened < 0 {
                std::process::abort();
            }
            // A closed descriptor gets the lowest free number, this one (the lower ones
            // are open by now). One that poll(2) calls invalid but is open (an `O_PATH`
            // descriptor, which can neither be read nor written) is replaced, as if closed.
            if opened != fd.fd {
                // SAFETY: dup2(2) and close(2) of descriptors this process holds; nothing
                // else runs yet to race for the numbers.
                let placed = unsafe { libc::dup2(opened, fd.fd) };
                unsafe { libc::close(opened) };
                if placed != fd.fd {
                    std::process::abort();
                }
            }
        }
    }
}
