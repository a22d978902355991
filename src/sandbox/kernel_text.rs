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

/// The most read from one file: a `mountinfo` with tens of thousands of mounts.
pub const LIMIT: u64 = 8 << 20;

/// The whole text of a kernel-generated file.
pub fn read(path: impl AsRef<Path>) -> io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::with_capacity(FIRST);
    // `take` hides the file's (zero) size from std, which then fills the spare capacity
    // in one read instead of probing.
    file.take(LIMIT.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > LIMIT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {LIMIT} bytes"),
        ));
    }
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// This process's `/proc/self/stat`, read once per process: the supervisor needs its start
/// time and its argument area, and later its copies (which share the cache, not the pid)
/// read their own. Only for the fields fixed for a process's life: the counters in it
/// are as they were at the first call. A pid 1 always reads: the first process of a
/// container and the first of a sandbox it starts have the same number.
pub fn own_stat() -> Option<String> {
    static OWN: OnceLock<(u32, Option<String>)> = OnceLock::new();
    let pid = std::process::id();
    let (cached_pid, text) = OWN.get_or_init(|| (pid, read("/proc/self/stat").ok()));
    if *cached_pid == pid && pid != 1 {
        text.clone()
    } else {
        read("/proc/self/stat").ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_file_is_read_whole_and_an_oversized_one_is_refused() -> io::Result<()> {
        let mountinfo = read("/proc/self/mountinfo")?;
        assert_eq!(mountinfo, std::fs::read_to_string("/proc/self/mountinfo")?);
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
        std::fs::write(&big, [0xff, 0xfe])?;
        assert!(read(&big).is_err(), "not text");
        Ok(())
    }

    #[test]
    fn the_own_stat_is_this_processs_and_stays_the_same() {
        let first = own_stat().unwrap_or_default();
        let pid = std::process::id().to_string();
        assert!(first.starts_with(&format!("{pid} (")), "{first}");
        assert_eq!(own_stat(), Some(first));
    }
}
