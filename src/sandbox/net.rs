//! The network namespace: a fresh one has only a loopback interface, and it is down.
//! Bringing `lo` up is the whole of hatchery's network setup: nothing else is ever added,
//! so the only way out of the sandbox is a file descriptor the supervisor hands in.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The memory a socket holds in the kernel, as the protocol's memory pool (`tcp_mem`)
/// counts it: its receive queue, its send queue and what it has reserved ahead
/// (`SO_MEMINFO`: rmem_alloc, wmem_queued, fwd_alloc). The egress broker counts what a
/// sandbox's connections make it hold outside the sandbox's cgroup.
pub fn held_memory(sock: RawFd) -> io::Result<u64> {
    let mut info = [0u32; 9];
    let mut len = libc::socklen_t::try_from(std::mem::size_of_val(&info)).unwrap_or(0);
    // SAFETY: the kernel writes at most `len` bytes into `info`, which we own and whose
    // size `len` is, and stores the length it wrote. A descriptor that is not a socket
    // is refused (ENOTSOCK, EBADF); keeping it the caller's socket is the caller's part.
    let r = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let at = |i: libc::c_int| {
        usize::try_from(i)
            .ok()
            .and_then(|i| info.get(i))
            .map_or(0, |v| u64::from(*v))
    };
    Ok(at(libc::SK_MEMINFO_RMEM_ALLOC)
        .saturating_add(at(libc::SK_MEMINFO_WMEM_QUEUED))
        .saturating_add(at(libc::SK_MEMINFO_FWD_ALLOC)))
}

/// The bytes a TCP socket has yet to see acknowledged, its FIN counting as one
/// (`TIOCOUTQ`): zero once the peer has everything that was written.
pub fn unacknowledged(sock: RawFd) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int through the pointer, which points at `n`, owned
    // here. A descriptor that is not a socket is refused (ENOTTY, EBADF).
    if unsafe { libc::ioctl(sock, libc::TIOCOUTQ, &mut n) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Makes the socket's close a reset (`SO_LINGER` of zero): what waits in its queues is
/// freed at once instead of being sent to a peer that may never read it.
pub fn reset_on_close(sock: RawFd) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let len = libc::socklen_t::try_from(std::mem::size_of_val(&linger)).unwrap_or(0);
    // SAFETY: the kernel reads `len` bytes from `linger`, which we own and whose size
    // `len` is. A descriptor that is not a socket is refused (ENOTSOCK, EBADF).
    let r = unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&linger).cast(),
            len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets `lo` up in the calling process's network namespace.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket(2); the result is checked and owned immediately.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh, valid descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we own; the fd is valid.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the initialised one.
    unsafe {
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own; the fd is valid.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The DNS stub's port on 127.0.0.1 inside a sandbox with egress (UDP and TCP).
pub const DNS_PORT: u16 = 53;
/// The HTTP proxy's port on 127.0.0.1 inside a sandbox with egress.
pub const PROXY_PORT: u16 = 3128;

/// The listening sockets of a sandbox with egress, made by its pid 1 inside the
/// sandbox's network namespace (before anything untrusted runs) and handed to the broker
/// outside: the DNS stub (UDP, then TCP, on 127.0.0.1:53), the proxy (127.0.0.1:3128),
/// then one listener on every local address for each of `ports`, in that order. Nothing
/// is routed: a byte leaves only through a socket the broker holds.
pub fn egress_listeners(ports: &[u16]) -> io::Result<Vec<OwnedFd>> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, setsockopt, socket,
        sockopt,
    };
    let loopback = |port: u16| SockaddrIn::new(127, 0, 0, 1, port);
    let stream = |addr: SockaddrIn| -> io::Result<OwnedFd> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        bind(fd.as_raw_fd(), &addr)?;
        listen(&fd, Backlog::new(128).unwrap_or(Backlog::MAXCONN))?;
        Ok(fd)
    };
    let udp = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    bind(udp.as_raw_fd(), &loopback(DNS_PORT))?;
    let mut fds = vec![
        udp,
        stream(loopback(DNS_PORT))?,
        stream(loopback(PROXY_PORT))?,
    ];
    for &port in ports {
        fds.push(stream(SockaddrIn::new(0, 0, 0, 0, port))?);
    }
    Ok(fds)
}
