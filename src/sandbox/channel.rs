//! The typed channel between the supervisor and a sandbox it starts: a SOCK_SEQPACKET
//! socketpair (message boundaries for free), one message per packet.
//!
//! Supervisor → sandbox init: the go-aheads for each setup phase. Sandbox → supervisor:
//! a setup failure with the step and errno (so the user sees the real cause, not "exited
//! 1"), the Landlock status, an exec failure, and finally the payload's wait status.
//! The socket is close-on-exec: a successful `execve` in the payload closes its copy.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, recv, socketpair};

mod fds;
pub use fds::{
    Handover, MAX_CLAIM, MAX_CLAIM_FDS, MAX_JOIN_FILES, MAX_LISTENERS, recv_cgroup_ready,
    recv_claim, recv_filters, recv_listeners, send_cgroup_ready, send_claim, send_filters,
    send_listeners, start_gate, start_is_over,
};

/// Largest message either side sends; anything longer is truncated or refused.
pub const MAX_MESSAGE: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToSandbox {
    /// The uid/gid maps are written: the init may change identity and build its root.
    IdentityReady,
    /// The sandbox is in its cgroup: the init may start the payload.
    CgroupReady,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromSandbox {
    /// A setup step failed before the payload started.
    SetupFailed {
        step: String,
        errno: i32,
        detail: String,
    },
    /// What Landlock enforced for the payload: ABI version and a status word.
    Landlock { abi: u8, status: String },
    /// `execve` of the payload failed with this errno.
    ExecFailed { errno: i32 },
    /// The payload ended; a raw wait(2) status.
    Exited { status: i32 },
}

/// Creates the socketpair: (supervisor end, sandbox end), both close-on-exec.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)
}

/// Sends one packet with write(2): the one call every seccomp profile allows, so that an
/// exec failure can still be reported after the payload's filter is loaded.
fn send_bytes(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<()> {
    loop {
        match nix::unistd::write(fd, bytes) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one packet; `Ok(None)` at end of stream (the other side closed).
///
/// A unix socket whose peer closed while a message to it lay unread reports ECONNRESET
/// once, ahead of the messages still queued for us: the sandbox's last words (a setup
/// failure, say) come after it. So ECONNRESET is read past, not taken as the end.
fn recv_bytes(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<usize>> {
    let mut resets = 0;
    loop {
        match recv(fd.as_raw_fd(), buf, MsgFlags::empty()) {
            Ok(0) => return Ok(None),
            Ok(n) => return Ok(Some(n)),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::ECONNRESET) if resets < 2 => resets += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

impl ToSandbox {
    fn tag(&self) -> u8 {
        match self {
            ToSandbox::IdentityReady => 1,
            ToSandbox::CgroupReady => 2,
        }
    }

    pub fn send(&self, fd: impl AsFd) -> io::Result<()> {
        send_bytes(fd.as_fd(), &[self.tag()])
    }

    /// Waits for exactly `expected`; anything else (or end of stream) is an error.
    pub fn expect(expected: ToSandbox, fd: impl AsFd) -> io::Result<()> {
        let mut buf = [0u8; 8];
        match recv_bytes(fd.as_fd(), &mut buf)? {
            Some(1) if buf[0] == expected.tag() => Ok(()),
            Some(_) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "unexpected message from the supervisor",
            )),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the supervisor went away",
            )),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let bytes = &s.as_bytes()[..s.len().min(400)];
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn get_str(buf: &[u8], at: &mut usize) -> Option<String> {
    let len = u16::from_le_bytes(buf.get(*at..*at + 2)?.try_into().ok()?) as usize;
    let s = buf.get(*at + 2..*at + 2 + len)?;
    *at += 2 + len;
    Some(String::from_utf8_lossy(s).into_owned())
}

fn get_i32(buf: &[u8], at: &mut usize) -> Option<i32> {
    let v = i32::from_le_bytes(buf.get(*at..*at + 4)?.try_into().ok()?);
    *at += 4;
    Some(v)
}

/// What [`FromSandbox::recv_now`] found.
#[derive(Debug, PartialEq)]
pub enum Heard {
    /// Nothing sent yet.
    Nothing,
    Message(FromSandbox),
    /// End of stream, or a malformed or failed read: nothing more is worth reading.
    Closed,
}

/// [`FromSandbox::Exited`]'s packet: its tag and the status.
fn exited_packet(status: i32) -> [u8; 5] {
    let [a, b, c, d] = status.to_le_bytes();
    [4, a, b, c, d]
}

impl FromSandbox {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match self {
            FromSandbox::SetupFailed {
                step,
                errno,
                detail,
            } => {
                out.push(1);
                out.extend_from_slice(&errno.to_le_bytes());
                put_str(&mut out, step);
                put_str(&mut out, detail);
            }
            FromSandbox::Landlock { abi, status } => {
                out.push(2);
                out.push(*abi);
                put_str(&mut out, status);
            }
            FromSandbox::ExecFailed { errno } => {
                out.push(3);
                out.extend_from_slice(&errno.to_le_bytes());
            }
            FromSandbox::Exited { status } => out.extend_from_slice(&exited_packet(*status)),
        }
        out
    }

    /// Sends [`FromSandbox::Exited`] from the stack, touching no heap: for a pid 1 whose
    /// payload's set-up, sharing its memory, may have died halfway through changing it
    /// (see `spawn`). Best effort, as [`FromSandbox::send`].
    pub fn send_exited(fd: impl AsFd, status: i32) {
        let _ = send_bytes(fd.as_fd(), &exited_packet(status));
    }

    pub fn decode(buf: &[u8]) -> Option<FromSandbox> {
        let (&tag, _) = buf.split_first()?;
        let mut at = 1;
        let msg = match tag {
            1 => {
                let errno = get_i32(buf, &mut at)?;
                let step = get_str(buf, &mut at)?;
                let detail = get_str(buf, &mut at)?;
                FromSandbox::SetupFailed {
                    step,
                    errno,
                    detail,
                }
            }
            2 => {
                let abi = *buf.get(1)?;
                at = 2;
                FromSandbox::Landlock {
                    abi,
                    status: get_str(buf, &mut at)?,
                }
            }
            3 => FromSandbox::ExecFailed {
                errno: get_i32(buf, &mut at)?,
            },
            4 => FromSandbox::Exited {
                status: get_i32(buf, &mut at)?,
            },
            _ => return None,
        };
        (at == buf.len()).then_some(msg)
    }

    /// Best effort: the sandbox side reports and moves on (the supervisor may be gone).
    pub fn send(&self, fd: impl AsFd) {
        let _ = send_bytes(fd.as_fd(), &self.encode());
    }

    /// Takes one message if one is there, never waiting for it.
    pub fn recv_now(fd: impl AsFd) -> Heard {
        match super::wait::ready_now(fd.as_fd()) {
            Ok(false) => Heard::Nothing,
            Ok(true) => match FromSandbox::recv(fd) {
                Ok(Some(msg)) => Heard::Message(msg),
                Ok(None) | Err(_) => Heard::Closed,
            },
            Err(_) => Heard::Closed,
        }
    }

    /// Reads one message; `Ok(None)` when the sandbox side has closed its end.
    pub fn recv(fd: impl AsFd) -> io::Result<Option<FromSandbox>> {
        let mut buf = [0u8; MAX_MESSAGE];
        match recv_bytes(fd.as_fd(), &mut buf)? {
            None => Ok(None),
            Some(n) => FromSandbox::decode(&buf[..n]).map(Some).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "malformed message from the sandbox",
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_supervisor_gone_after_its_go_ahead_is_seen_before_the_go_ahead_is_read() {
        let (supervisor, sandbox) = match pair() {
            Ok(p) => p,
            Err(e) => panic!("socketpair: {e}"),
        };
        assert!(
            !super::super::wait::hung_up_now(sandbox.as_fd()),
            "the supervisor is there"
        );
        ToSandbox::IdentityReady
            .send(&supervisor)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !super::super::wait::hung_up_now(sandbox.as_fd()),
            "a message is no hang-up"
        );
        drop(supervisor);
        // The go-ahead is still there to read; the hang-up shows all the same.
        assert!(super::super::wait::hung_up_now(sandbox.as_fd()));
        assert!(ToSandbox::expect(ToSandbox::IdentityReady, &sandbox).is_ok());
    }

    #[test]
    fn messages_round_trip() {
        for m in [
            FromSandbox::SetupFailed {
                step: "mount /usr".into(),
                errno: 13,
                detail: "permission denied".into(),
            },
            FromSandbox::Landlock {
                abi: 6,
                status: "fully_enforced".into(),
            },
            FromSandbox::ExecFailed { errno: 2 },
            FromSandbox::Exited { status: 256 },
        ] {
            assert_eq!(FromSandbox::decode(&m.encode()), Some(m));
        }
    }

    #[test]
    fn a_message_is_taken_without_waiting_and_garbage_or_an_end_closes_the_channel()
    -> io::Result<()> {
        let (ours, theirs) = pair()?;
        assert_eq!(FromSandbox::recv_now(&ours), Heard::Nothing);
        FromSandbox::Exited { status: 256 }.send(&theirs);
        assert_eq!(
            FromSandbox::recv_now(&ours),
            Heard::Message(FromSandbox::Exited { status: 256 })
        );
        // A frame no sandbox sends (an unknown tag, a message cut short): nothing more
        // from that channel is trusted.
        send_bytes(theirs.as_fd(), &[0xff, 1, 2, 3])?;
        assert_eq!(FromSandbox::recv_now(&ours), Heard::Closed);
        let cut = FromSandbox::Exited { status: 1 }.encode();
        send_bytes(theirs.as_fd(), cut.get(..2).unwrap_or_default())?;
        assert_eq!(FromSandbox::recv_now(&ours), Heard::Closed);
        drop(theirs);
        assert_eq!(FromSandbox::recv_now(&ours), Heard::Closed);
        Ok(())
    }

    #[test]
    fn truncated_or_padded_messages_are_refused() {
        let enc = FromSandbox::Exited { status: 1 }.encode();
        assert_eq!(FromSandbox::decode(&enc[..enc.len() - 1]), None);
        let mut long = enc.clone();
        long.push(0);
        assert_eq!(FromSandbox::decode(&long), None);
        assert_eq!(FromSandbox::decode(&[]), None);
        assert_eq!(FromSandbox::decode(&[9, 0, 0, 0, 0]), None);
    }

    #[test]
    fn a_message_sent_before_the_peer_closed_with_unread_data_is_still_read() -> io::Result<()> {
        let (supervisor, sandbox) = pair()?;
        // The supervisor's go-ahead is never read: the sandbox fails and leaves.
        ToSandbox::CgroupReady.send(&supervisor)?;
        FromSandbox::SetupFailed {
            step: "hostname".into(),
            errno: libc::EINVAL,
            detail: String::new(),
        }
        .send(&sandbox);
        drop(sandbox);
        assert!(matches!(
            FromSandbox::recv(&supervisor)?,
            Some(FromSandbox::SetupFailed { .. })
        ));
        assert_eq!(FromSandbox::recv(&supervisor)?, None);
        Ok(())
    }

    #[test]
    fn go_aheads_travel_over_the_pair() -> io::Result<()> {
        let (a, b) = pair()?;
        ToSandbox::IdentityReady.send(&a)?;
        ToSandbox::expect(ToSandbox::IdentityReady, &b)?;
        ToSandbox::CgroupReady.send(&a)?;
        assert!(ToSandbox::expect(ToSandbox::IdentityReady, &b).is_err());
        drop(a);
        assert!(ToSandbox::expect(ToSandbox::CgroupReady, &b).is_err());
        Ok(())
    }
}
