//! The network namespace: a fresh one has only a loopback interface, and it is down.
//! Bringing `lo` up is the whole of hatchery's network setup: nothing else is ever added,
//! so the only way out of the sandbox is a file descriptor the supervisor hands in.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
