//! Symbolic names profiles may use instead of numbers: errno values and the flag and
//! request constants that syscall argument conditions compare against.

/// errno names accepted in `errno = "..."`.
const ERRNOS: &[(&str, i32)] = &[
    ("EPERM", libc::EPERM),
    ("ENOENT", libc::ENOENT),
    ("ESRCH", libc::ESRCH),
    ("EINTR", libc::EINTR),
    ("EIO", libc::EIO),
    ("E2BIG", libc::E2BIG),
    ("EBADF", libc::EBADF),
    ("EAGAIN", libc::EAGAIN),
    ("ENOMEM", libc::ENOMEM),
    ("EACCES", libc::EACCES),
    ("EFAULT", libc::EFAULT),
    ("EBUSY", libc::EBUSY),
    ("EEXIST", libc::EEXIST),
    ("EXDEV", libc::EXDEV),
    ("ENODEV", libc::ENODEV),
    ("ENOTDIR", libc::ENOTDIR),
    ("EISDIR", libc::EISDIR),
    ("EINVAL", libc::EINVAL),
    ("ENFILE", libc::ENFILE),
    ("EMFILE", libc::EMFILE),
    ("ENOTTY", libc::ENOTTY),
    ("ENOSPC", libc::ENOSPC),
    ("ESPIPE", libc::ESPIPE),
    ("EROFS", libc::EROFS),
    ("EMLINK", libc::EMLINK),
    ("EPIPE", libc::EPIPE),
    ("ERANGE", libc::ERANGE),
    ("ENOSYS", libc::ENOSYS),
    ("ENOTSUP", libc::ENOTSUP),
    ("EOPNOTSUPP", libc::EOPNOTSUPP),
    ("EAFNOSUPPORT", libc::EAFNOSUPPORT),
    ("EPROTONOSUPPORT", libc::EPROTONOSUPPORT),
    ("ENETUNREACH", libc::ENETUNREACH),
    ("ECONNREFUSED", libc::ECONNREFUSED),
];

/// Flag and request constants accepted in argument conditions.
const CONSTANTS: &[(&str, u64)] = &[
    ("CLONE_NEWNS", libc::CLONE_NEWNS as u64),
    ("CLONE_NEWUTS", libc::CLONE_NEWUTS as u64),
    ("CLONE_NEWIPC", libc::CLONE_NEWIPC as u64),
    ("CLONE_NEWUSER", libc::CLONE_NEWUSER as u64),
    ("CLONE_NEWPID", libc::CLONE_NEWPID as u64),
    ("CLONE_NEWNET", libc::CLONE_NEWNET as u64),
    ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP as u64),
    ("CLONE_NEWTIME", 0x80),
    ("CLONE_VM", libc::CLONE_VM as u64),
    ("CLONE_THREAD", libc::CLONE_THREAD as u64),
    ("CLONE_PTRACE", libc::CLONE_PTRACE as u64),
    ("CLONE_UNTRACED", libc::CLONE_UNTRACED as u64),
    ("TIOCSTI", libc::TIOCSTI),
    ("TIOCLINUX", libc::TIOCLINUX),
    ("TIOCSETD", libc::TIOCSETD),
    ("TCGETS", libc::TCGETS),
    ("TIOCGWINSZ", libc::TIOCGWINSZ),
    ("TIOCGPGRP", libc::TIOCGPGRP),
    ("FIONREAD", libc::FIONREAD),
    ("FIONBIO", libc::FIONBIO),
    ("FIOCLEX", libc::FIOCLEX),
    ("FIONCLEX", libc::FIONCLEX),
    ("AF_UNIX", libc::AF_UNIX as u64),
    ("AF_INET", libc::AF_INET as u64),
    ("AF_INET6", libc::AF_INET6 as u64),
    ("AF_NETLINK", libc::AF_NETLINK as u64),
    ("AF_PACKET", libc::AF_PACKET as u64),
    ("AF_VSOCK", libc::AF_VSOCK as u64),
    ("AF_ALG", libc::AF_ALG as u64),
    ("NETLINK_ROUTE", libc::NETLINK_ROUTE as u64),
    ("NETLINK_USERSOCK", libc::NETLINK_USERSOCK as u64),
    ("NETLINK_SOCK_DIAG", libc::NETLINK_SOCK_DIAG as u64),
    ("S_ISUID", libc::S_ISUID as u64),
    ("S_ISGID", libc::S_ISGID as u64),
    ("O_CREAT", libc::O_CREAT as u64),
    ("O_TMPFILE", libc::O_TMPFILE as u64),
    // The bit that makes O_TMPFILE (which also sets O_DIRECTORY) create a file.
    ("__O_TMPFILE", (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64),
    ("SHM_EXEC", libc::SHM_EXEC as u64),
    ("PER_LINUX", 0x0000),
    ("UNAME26", 0x0002_0000),
    ("PER_LINUX32", 0x0008),
    ("PER_QUERY", 0xffff_ffff),
    ("ADDR_NO_RANDOMIZE", 0x0004_0000),
    ("MMAP_PAGE_ZERO", 0x0010_0000),
    ("ADDR_COMPAT_LAYOUT", 0x0020_0000),
    ("READ_IMPLIES_EXEC", 0x0040_0000),
    ("PR_SET_NO_NEW_PRIVS", libc::PR_SET_NO_NEW_PRIVS as u64),
];

/// The errno number for a name such as `EPERM`.
pub fn errno_by_name(name: &str) -> Option<i32> {
    ERRNOS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| *v)
}

/// The known errno name closest to a misspelt one (one or two letters off), for the hint
/// in an "unknown errno" error.
pub fn errno_like(name: &str) -> Option<&'static str> {
    let wanted = name.to_ascii_uppercase();
    ERRNOS
        .iter()
        .map(|(n, _)| (edit_distance(n, &wanted), *n))
        .filter(|(d, _)| *d <= 1 || (*d <= 2 && wanted.len() >= 6))
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

/// Levenshtein distance over bytes (names here are short ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut cur = vec![i.saturating_add(1)];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev.get(j).copied().unwrap_or(usize::MAX);
            let del = prev.get(j.saturating_add(1)).copied().unwrap_or(usize::MAX);
            let ins = cur.get(j).copied().unwrap_or(usize::MAX);
            let cost = usize::from(ca != *cb);
            cur.push(
                sub.saturating_add(cost)
                    .min(del.saturating_add(1))
                    .min(ins.saturating_add(1)),
            );
        }
        prev = cur;
    }
    prev.last().copied().unwrap_or(0)
}

/// The conventional name of an errno number, when it has one hatchery knows.
pub fn errno_name(value: i32) -> Option<&'static str> {
    ERRNOS.iter().find(|(_, v)| *v == value).map(|(n, _)| *n)
}

/// The value of a single constant such as `CLONE_NEWUSER`.
pub fn constant_by_name(name: &str) -> Option<u64> {
    CONSTANTS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// Every named constant, for documentation and round-tripping.
pub fn constants() -> &'static [(&'static str, u64)] {
    CONSTANTS
}

/// Evaluates `A|B|0x10|16`: names, hex and decimal numbers joined by `|`.
pub fn parse_value_expr(expr: &str) -> Result<u64, String> {
    let mut acc = 0u64;
    for part in expr.split('|') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("empty term in {expr:?}"));
        }
        let v = if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            u64::from_str_radix(hex, 16).map_err(|_| format!("bad hex number {part:?}"))?
        } else if part.chars().all(|c| c.is_ascii_digit()) {
            part.parse::<u64>()
                .map_err(|_| format!("number {part:?} out of range"))?
        } else {
            constant_by_name(part).ok_or_else(|| format!("unknown constant {part:?}"))?
        };
        acc |= v;
    }
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_expressions_combine_names_and_numbers() {
        assert_eq!(
            parse_value_expr("CLONE_NEWUSER|CLONE_NEWNS"),
            Ok((libc::CLONE_NEWUSER | libc::CLONE_NEWNS) as u64)
        );
        assert_eq!(parse_value_expr("0x10|1"), Ok(0x11));
        assert!(parse_value_expr("NOPE").is_err());
        assert!(parse_value_expr("1||2").is_err());
    }

    #[test]
    fn errnos_resolve_both_ways() {
        assert_eq!(errno_by_name("eperm"), Some(libc::EPERM));
        assert_eq!(errno_name(libc::ENOSYS), Some("ENOSYS"));
    }
}
