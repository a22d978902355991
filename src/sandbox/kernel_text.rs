//! Reading the small text files the kernel writes on demand: `/proc`, cgroupfs, sysctls.
//!
//! Why not `std::fs::read_to_string`: these files report a size of 0, so std asks for
//! their metadata and then reads them 32 bytes first, doubling from there (seven reads for
//! a 1.5 KiB `mountinfo`). Each read of a generated file makes the kernel walk and print
//! it again up to the offset asked for, and a sandbox start reads a dozen of them. Here a
//! file takes one `open`, one read into a buffer that fits it, and the read that sees its
//! end. A file larger than [`LIMIT`] is an error, not a truncated answer.

use std::io::{self, Read};
use std::path::Path;
use std::sync::OnceLock;

/// The first buffer: every file read here on the start path fits (a `mountinfo` of
/// about 50 mounts included).
const FIRST: usize = 4096;

/// The most [`read`] takes from one file.
pub const LIMIT: u64 = 8 << 20;

/// The whole text of a kernel-generated file that is small by nature (a cgroup's counters,
/// a process's `stat`, a sysctl); one longer than [`LIMIT`] is an error.
pub fn read(path: impl AsRef<Path>) -> io::Result<String> {
    text(read_bytes(path.as_ref(), Some(LIMIT))?)
}

/// The whole text of a host table that is as long as the host makes it (`mountinfo`: a
/// host's or a container runtime's mounts, or a user's through setuid `fusermount`), which
/// no length bound may cut short or refuse. Never for a file a sandbox writes to.
pub fn read_host_table(path: impl AsRef<Path>) -> io::Result<String> {
    text(read_bytes(path.as_ref(), None)?)
}

/// [`read`] of a file already open (a cgroup's control file, opened in its directory).
pub fn read_file(file: std::fs::File) -> io::Result<String> {
    text(read_open(file, Some(LIMIT))?)
}

fn read_bytes(path: &Path, limit: Option<u64>) -> io::Result<Vec<u8>> {
    read_open(std::fs::File::open(path)?, limit)
}

fn read_open(file: std::fs::File, limit: Option<u64>) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(FIRST);
    // `take` hides the file's (zero) size from std, which then fills the spare capacity
    // in one read instead of probing.
    let most = limit.map_or(u64::MAX, |l| l.saturating_add(1));
    file.take(most).read_to_end(&mut bytes)?;
    if let Some(l) = limit.filter(|l| bytes.len() as u64 > *l) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {l} bytes"),
        ));
    }
    Ok(bytes)
}

fn text(bytes: Vec<u8>) -> io::Result<String> {
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The fields of a `/proc/PID/stat` after the command name (from the state, field 3, on).
///
/// The name is the process's own choice: any 15 bytes, not always UTF-8, with spaces and
/// parentheses. The kernel writes `)` after it and nowhere later, so the fields start after
/// the last one; the name itself is never decoded.
pub fn stat_fields(path: impl AsRef<Path>) -> io::Result<String> {
    let bytes = read_bytes(path.as_ref(), Some(LIMIT))?;
    let rest = fields_after_name(&bytes)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no command name"))?;
    text(rest.to_vec())
}

fn fields_after_name(stat: &[u8]) -> Option<&[u8]> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    stat.get(close.checked_add(1)?..)
}

/// [`stat_fields`] of this process, read once per process: the supervisor needs its start
/// time and its argument area, and later its copies (which share the cache, not the pid)
/// read their own. Only for the fields fixed for a process's life: the counters in it are
/// as they were at the first read. A failed read is not kept (the next call reads again),
/// and a pid 1 always reads: the first process of a container and the first of a sandbox
/// it starts have the same number.
pub fn own_stat_fields() -> Option<String> {
    static OWN: OnceLock<(u32, String)> = OnceLock::new();
    let pid = std::process::id();
    if let Some((cached, fields)) = OWN.get() {
        if *cached == pid && pid != 1 {
            return Some(fields.clone());
        }
    }
    let fields = stat_fields("/proc/self/stat").ok()?;
    if pid != 1 {
        let _ = OWN.set((pid, fields.clone()));
    }
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_file_is_read_whole_and_an_oversized_one_is_refused() -> io::Result<()> {
        let mountinfo = read("/proc/self/mountinfo")?;
        assert_eq!(mountinfo, std::fs::read_to_string("/proc/self/mountinfo")?);
        assert_eq!(read_host_table("/proc/self/mountinfo")?, mountinfo);
        assert!(read("/proc/self/no-such-file").is_err());

        let dir = tempfile::tempdir()?;
        let big = dir.path().join("big");
        let len = usize::try_from(LIMIT).unwrap_or(usize::MAX);
        std::fs::write(&big, vec![b'x'; len])?;
        assert_eq!(read(&big)?.len(), len, "exactly the limit is read");
        std::fs::write(&big, vec![b'x'; len.saturating_add(1)])?;
        assert_eq!(
            read(&big).map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::InvalidData)
        );
        assert_eq!(
            read_host_table(&big)?.len(),
            len.saturating_add(1),
            "a table is not cut"
        );
        std::fs::write(&big, [0xff, 0xfe])?;
        assert!(read(&big).is_err(), "not text");
        Ok(())
    }

    #[test]
    fn the_own_stat_is_this_processs_and_stays_the_same() -> io::Result<()> {
        let first = own_stat_fields().unwrap_or_default();
        let fresh = stat_fields(format!("/proc/{}/stat", std::process::id()))?;
        // The same process: the same parent and start time (fields 4 and 22).
        let fixed = |f: &str| {
            let v: Vec<&str> = f.split_whitespace().collect();
            (
                v.get(1).map(|s| s.to_string()),
                v.get(19).map(|s| s.to_string()),
            )
        };
        assert_eq!(fixed(&first), fixed(&fresh));
        assert!(fixed(&first).1.is_some(), "{first}");
        assert_eq!(own_stat_fields(), Some(first));
        Ok(())
    }

    #[test]
    fn the_fields_start_after_the_last_parenthesis_whatever_the_name() {
        let tail = b" S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0\n";
        // A name that plays the state and the fields after it, with parentheses, and one
        // that is not UTF-8: neither moves the fields.
        for name in [&b"Z 1 ) Z 9 9"[..], b"sh", b"\xff\xfe(x"] {
            let mut stat = b"77 (".to_vec();
            stat.extend_from_slice(name);
            stat.push(b')');
            stat.extend_from_slice(tail);
            assert_eq!(fields_after_name(&stat), Some(&tail[..]));
        }
        assert_eq!(fields_after_name(b"77 sh S 1"), None);
        assert_eq!(fields_after_name(b""), None);
    }
}
