//! The channel's messages that carry descriptors (SCM_RIGHTS): the cgroup go-ahead with
//! the files to join, the egress listeners, a prepared sandbox's claim, and the filters
//! with the start gate. Each packet is received whole or refused: one longer than its
//! kind may be, or with more descriptors than it may carry, closes what came with it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::sys::socket::MsgFlags;

use super::{FromSandbox, MAX_MESSAGE, ToSandbox, send_bytes};
use crate::sandbox::seccomp::{LoadableFilter, MAX_INSTRUCTIONS};

/// Most cgroup files a sandbox is sent to move itself in with (one per v1 hierarchy).
pub const MAX_JOIN_FILES: usize = 8;

/// Tells the sandbox its cgroup is ready, with the files it writes `0` to, to move itself
/// in (v1; none where it was born inside or attached from outside).
pub fn send_cgroup_ready(fd: impl AsFd, join: &[BorrowedFd<'_>]) -> io::Result<()> {
    if join.len() > MAX_JOIN_FILES {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let tag = [ToSandbox::CgroupReady.tag()];
    if join.is_empty() {
        send_bytes(fd.as_fd(), &tag)
    } else {
        send_with_fds(fd.as_fd(), &tag, join)
    }
}

/// Waits for [`send_cgroup_ready`]'s message: the join files it carries. Anything else,
/// or end of stream, is an error (and closes what came with it).
pub fn recv_cgroup_ready(fd: impl AsFd) -> io::Result<Vec<OwnedFd>> {
    let mut buf = [0u8; 8];
    let mut space = nix::cmsg_space!([RawFd; MAX_JOIN_FILES]);
    let (n, fds) = recv_with_fds(fd.as_fd(), &mut buf, &mut space)?;
    match buf.get(..n) {
        Some([tag]) if *tag == ToSandbox::CgroupReady.tag() => Ok(fds),
        Some([]) | None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the supervisor went away",
        )),
        Some(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "unexpected message from the supervisor",
        )),
    }
}

/// Tag of the message carrying the sandbox's filters.
const FILTERS_TAG: u8 = 3;
/// Tag of the message carrying the egress listeners (distinct from every [`FromSandbox`]
/// tag, so that the supervisor can tell the two apart).
const LISTENERS_TAG: u8 = 0x10;
/// Most listeners one sandbox hands out (the stub's two, the proxy, one per port).
pub const MAX_LISTENERS: usize = 72;

/// Sends the egress listeners (SCM_RIGHTS) to the supervisor, from pid 1.
pub fn send_listeners(fd: impl AsFd, listeners: &[OwnedFd]) -> io::Result<()> {
    if listeners.len() > MAX_LISTENERS {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let fds: Vec<BorrowedFd<'_>> = listeners.iter().map(|l| l.as_fd()).collect();
    send_with_fds(fd.as_fd(), &[LISTENERS_TAG], &fds)
}

/// Sends one packet with `fds` attached (SCM_RIGHTS).
fn send_with_fds(fd: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, sendmsg};
    let raw: Vec<RawFd> = fds.iter().map(|l| l.as_raw_fd()).collect();
    let iov = [io::IoSlice::new(bytes)];
    loop {
        match sendmsg::<()>(
            fd.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The length of the next message on the sequenced-packet socket `fd`, which stays
/// queued (`MSG_TRUNC` makes the kernel say a message's whole length); 0 when the peer
/// is gone.
fn next_message_len(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut probe = [0u8; 1];
    loop {
        match nix::sys::socket::recv(
            fd.as_raw_fd(),
            &mut probe,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC,
        ) {
            Ok(n) => return Ok(n),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one packet into `buf` with the descriptors attached to it (close-on-exec):
/// its length and the descriptors. A packet longer than `buf`, or with more descriptors
/// than `space` holds, is refused (its descriptors are closed).
fn recv_with_fds(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    space: &mut Vec<u8>,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, recvmsg};
    use std::os::fd::FromRawFd;
    let mut iov = [io::IoSliceMut::new(buf)];
    loop {
        match recvmsg::<()>(
            fd.as_raw_fd(),
            &mut iov,
            Some(&mut *space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for c in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(received) = c {
                        for raw in received {
                            // SAFETY: SCM_RIGHTS installed these descriptors in this
                            // process for us; nothing else owns them.
                            fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                        }
                    }
                }
                if msg
                    .flags
                    .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
                {
                    return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
                }
                return Ok((msg.bytes, fds));
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one packet of at most `largest` bytes with its descriptors, into a buffer the
/// size of the packet, asked of the socket first: the largest a filters or claim message
/// may be is 64 KiB, zeroed page by page at every start for the few KiB one usually
/// takes. A longer packet is refused (EMSGSIZE), never cut to fit; end of stream is an
/// empty packet.
fn recv_packet(
    fd: BorrowedFd<'_>,
    largest: usize,
    space: &mut Vec<u8>,
) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; next_message_len(fd)?.clamp(1, largest)];
    let (n, fds) = recv_with_fds(fd, &mut buf, space)?;
    buf.truncate(n);
    Ok((buf, fds))
}

/// What came first from a sandbox expected to hand over its egress listeners.
pub enum Handover {
    Listeners(Vec<OwnedFd>),
    /// Another message (a setup failure): the sandbox is not going to send them.
    Message(FromSandbox),
    /// The sandbox closed its end.
    Closed,
}

/// Receives the egress listeners sent by [`send_listeners`], or what came instead.
pub fn recv_listeners(fd: impl AsFd) -> io::Result<Handover> {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut space = nix::cmsg_space!([RawFd; MAX_LISTENERS]);
    let (n, fds) = recv_with_fds(fd.as_fd(), &mut buf, &mut space)?;
    let bytes = buf.get(..n).unwrap_or_default();
    match bytes {
        [] => Ok(Handover::Closed),
        [LISTENERS_TAG] => Ok(Handover::Listeners(fds)),
        other => FromSandbox::decode(other)
            .map(Handover::Message)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "malformed message from the sandbox",
                )
            }),
    }
}

/// Tag of the message that turns a prepared sandbox into a worker (see
/// [`crate::sandbox::launch::warm`]).
const CLAIM_TAG: u8 = 4;
/// Largest claim (the command line and environment, mostly); a larger one is started the
/// ordinary way instead. Far below a socket's default send buffer, which bounds a packet.
pub const MAX_CLAIM: usize = 64 << 10;
/// Most descriptors a claim carries (stdio and the passed ones).
pub const MAX_CLAIM_FDS: usize = 8;

/// Sends a prepared sandbox its claim: `body`, with `fds` attached.
pub fn send_claim(fd: impl AsFd, body: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if body.len() > MAX_CLAIM || fds.len() > MAX_CLAIM_FDS {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let mut out = Vec::with_capacity(body.len().saturating_add(1));
    out.push(CLAIM_TAG);
    out.extend_from_slice(body);
    send_with_fds(fd.as_fd(), &out, fds)
}

/// Receives a claim sent by [`send_claim`]: its body and descriptors. End of stream (the
/// supervisor dropped the prepared sandbox) is `UnexpectedEof`.
pub fn recv_claim(fd: impl AsFd) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; MAX_CLAIM_FDS]);
    let (packet, fds) = recv_packet(fd.as_fd(), MAX_CLAIM.saturating_add(1), &mut space)?;
    match packet.as_slice() {
        [] => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the supervisor went away",
        )),
        [CLAIM_TAG, body @ ..] => Ok((body.to_vec(), fds)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed claim from the supervisor",
        )),
    }
}

/// The start gate: (the supervisor's read end, the write end the payload's set-up holds
/// until its `execve`), both close-on-exec. The write end travels with the filters
/// ([`send_filters`]) straight to the payload's set-up: pid 1 never holds it. So the read
/// end reports end of file exactly when the payload's `execve` is past its point of no
/// return (the kernel closes close-on-exec descriptors there, before the command's first
/// instruction) or the set-up has ended: before that, no command of the user's has run.
pub fn start_gate() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// Whether the start gate's read end is at end of file (see [`start_gate`]): the payload
/// has reached its `execve`, or its set-up ended. Never waits. Nothing is ever written to
/// the gate, so readable means its last write end is closed; where poll(2) cannot tell,
/// the signal is passed on, as before the gate existed.
pub fn start_is_over(gate: BorrowedFd<'_>) -> bool {
    crate::sandbox::wait::ready_now(gate).unwrap_or(true)
}

/// Sends the sandbox its seccomp filters, the floor's first, with the write end of the
/// start gate attached (one packet; the payload's set-up receives it).
pub fn send_filters(
    fd: impl AsFd,
    floor: &LoadableFilter,
    profile: &LoadableFilter,
    gate: BorrowedFd<'_>,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(5 + 8 * (floor.len() + profile.len()));
    out.push(FILTERS_TAG);
    floor.to_bytes(&mut out);
    profile.to_bytes(&mut out);
    send_with_fds(fd.as_fd(), &out, &[gate])
}

/// Receives the filters sent by [`send_filters`]: (floor, profile, the start gate's write
/// end, close-on-exec).
pub fn recv_filters(fd: impl AsFd) -> io::Result<(LoadableFilter, LoadableFilter, OwnedFd)> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed filters from the supervisor",
        )
    };
    let largest = 1 + 2 * (2 + 8 * MAX_INSTRUCTIONS);
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let (msg, fds) = recv_packet(fd.as_fd(), largest, &mut space)?;
    if msg.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the supervisor went away",
        ));
    }
    let Ok::<[OwnedFd; 1], _>([gate]) = fds.try_into() else {
        return Err(bad());
    };
    let (&tag, rest) = msg.split_first().ok_or_else(bad)?;
    if tag != FILTERS_TAG {
        return Err(bad());
    }
    let (floor, rest) = LoadableFilter::from_bytes(rest).ok_or_else(bad)?;
    let (profile, rest) = LoadableFilter::from_bytes(rest).ok_or_else(bad)?;
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok((floor, profile, gate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::channel::pair;

    #[test]
    fn the_cgroup_go_ahead_carries_the_join_files_and_nothing_else() -> io::Result<()> {
        let (a, b) = pair()?;
        let files: Vec<std::fs::File> = (0..3)
            .map(|_| std::fs::File::open("/dev/null"))
            .collect::<io::Result<_>>()?;
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        send_cgroup_ready(&a, &borrowed)?;
        assert_eq!(recv_cgroup_ready(&b)?.len(), 3);
        send_cgroup_ready(&a, &[])?;
        assert!(recv_cgroup_ready(&b)?.is_empty());
        // More files than a sandbox takes are not sent; a packet carrying them is refused.
        let many: Vec<BorrowedFd<'_>> = (0..=MAX_JOIN_FILES)
            .map(|i| borrowed[i % borrowed.len()])
            .collect();
        assert!(send_cgroup_ready(&a, &many).is_err());
        send_with_fds(a.as_fd(), &[ToSandbox::CgroupReady.tag()], &many)?;
        assert!(recv_cgroup_ready(&b).is_err());
        // Another go-ahead is not this one, and neither is end of stream.
        ToSandbox::IdentityReady.send(&a)?;
        assert!(recv_cgroup_ready(&b).is_err());
        drop(a);
        assert_eq!(
            recv_cgroup_ready(&b).map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::UnexpectedEof)
        );
        Ok(())
    }

    #[test]
    fn the_filters_carry_the_start_gate_which_ends_when_its_last_holder_closes() -> io::Result<()> {
        // One instruction: return ALLOW.
        let allow = crate::profile::SeccompProgram::from_bytes(vec![6, 0, 0, 0, 0, 0, 0xff, 0x7f])
            .map_err(io::Error::other)?;
        let allow = LoadableFilter::new(&allow);
        let (a, b) = pair()?;
        let (gate, token) = start_gate()?;
        send_filters(&a, &allow, &allow, token.as_fd())?;
        drop(token);
        // In flight, then received: open until the receiver closes it.
        assert!(!start_is_over(gate.as_fd()));
        let (_, _, held) = recv_filters(&b)?;
        assert!(!start_is_over(gate.as_fd()));
        drop(held);
        assert!(start_is_over(gate.as_fd()));
        // A filters packet without its gate, or with two, is refused.
        let mut bytes = vec![FILTERS_TAG];
        allow.to_bytes(&mut bytes);
        allow.to_bytes(&mut bytes);
        send_bytes(a.as_fd(), &bytes)?;
        assert!(recv_filters(&b).is_err());
        let (_gate2, token2) = start_gate()?;
        send_with_fds(a.as_fd(), &bytes, &[token2.as_fd(), token2.as_fd()])?;
        assert!(recv_filters(&b).is_err());
        // Never received: held by the socket until the sandbox's end closes.
        let (gate3, token3) = start_gate()?;
        send_filters(&a, &allow, &allow, token3.as_fd())?;
        drop(token3);
        assert!(!start_is_over(gate3.as_fd()));
        drop(b);
        assert!(start_is_over(gate3.as_fd()));
        Ok(())
    }

    #[test]
    fn the_largest_claim_arrives_whole_and_a_byte_more_is_refused() -> io::Result<()> {
        let (a, b) = pair()?;
        let (keep, _) = start_gate()?;
        let body = vec![b'c'; MAX_CLAIM];
        send_claim(&a, &body, &[keep.as_fd()])?;
        let (got, fds) = recv_claim(&b)?;
        assert_eq!((got, fds.len()), (body, 1));
        assert!(send_claim(&a, &vec![b'c'; MAX_CLAIM + 1], &[]).is_err());
        // Sent as it is, past the sender's check: refused, never cut to fit.
        let mut packet = vec![CLAIM_TAG];
        packet.extend(vec![b'c'; MAX_CLAIM + 1]);
        send_with_fds(a.as_fd(), &packet, &[keep.as_fd()])?;
        assert!(recv_claim(&b).is_err());
        drop(a);
        assert_eq!(
            recv_claim(&b).map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::UnexpectedEof)
        );
        Ok(())
    }

    #[test]
    fn the_largest_filters_arrive_whole_and_a_byte_more_is_refused() -> io::Result<()> {
        // Every instruction: return ALLOW.
        let largest = crate::profile::SeccompProgram::from_bytes(
            [6u8, 0, 0, 0, 0, 0, 0xff, 0x7f].repeat(MAX_INSTRUCTIONS),
        )
        .map_err(io::Error::other)?;
        let largest = LoadableFilter::new(&largest);
        let (a, b) = pair()?;
        let (_gate, token) = start_gate()?;
        send_filters(&a, &largest, &largest, token.as_fd())?;
        let (floor, profile, _) = recv_filters(&b)?;
        let (mut sent, mut got) = (Vec::new(), Vec::new());
        largest.to_bytes(&mut sent);
        floor.to_bytes(&mut got);
        profile.to_bytes(&mut got);
        assert_eq!(got, [sent.clone(), sent.clone()].concat());
        // One byte past the largest there can be: refused, never cut to fit.
        let mut bytes = vec![FILTERS_TAG];
        largest.to_bytes(&mut bytes);
        largest.to_bytes(&mut bytes);
        bytes.push(0);
        send_with_fds(a.as_fd(), &bytes, &[token.as_fd()])?;
        assert!(recv_filters(&b).is_err());
        // The peer gone: the end, not a wait.
        drop(a);
        assert!(recv_filters(&b).is_err());
        Ok(())
    }
}
