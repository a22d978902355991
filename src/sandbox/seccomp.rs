//! Loading the profile's compiled filter: the exact bytes libseccomp produced are handed
//! to seccomp(2), so the program `profile show --format bpf` prints is the one enforced.

use crate::profile::SeccompProgram;

/// The most instructions the kernel takes in one filter (`BPF_MAXINSNS`).
pub const MAX_INSTRUCTIONS: usize = 4096;

/// The filter as `struct sock_filter`s, prepared before fork (no allocation afterwards).
pub struct LoadableFilter {
    filters: Vec<libc::sock_filter>,
}

impl LoadableFilter {
    pub fn new(program: &SeccompProgram) -> LoadableFilter {
        LoadableFilter {
            filters: program
                .instructions()
                .map(|i| libc::sock_filter {
                    code: i.code,
                    jt: i.jt,
                    jf: i.jf,
                    k: i.k,
                })
                .collect(),
        }
    }

    /// The program as bytes for the channel to the sandbox: the instruction count (u16),
    /// then each instruction (code u16, jt u8, jf u8, k u32), little-endian.
    pub fn to_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.filters.len() as u16).to_le_bytes());
        for f in &self.filters {
            out.extend_from_slice(&f.code.to_le_bytes());
            out.push(f.jt);
            out.push(f.jf);
            out.extend_from_slice(&f.k.to_le_bytes());
        }
    }

    /// Reads a program written by [`LoadableFilter::to_bytes`] from the front of `buf`,
    /// returning it and the rest; `None` when the bytes are short or malformed (the kernel
    /// checks the program itself when it is loaded).
    pub fn from_bytes(buf: &[u8]) -> Option<(LoadableFilter, &[u8])> {
        let (count, mut rest) = buf.split_first_chunk::<2>()?;
        let count = usize::from(u16::from_le_bytes(*count));
        if count == 0 || count > MAX_INSTRUCTIONS {
            return None;
        }
        let mut filters = Vec::with_capacity(count);
        for _ in 0..count {
            let (ins, tail) = rest.split_first_chunk::<8>()?;
            let [c0, c1, jt, jf, k0, k1, k2, k3] = *ins;
            filters.push(libc::sock_filter {
                code: u16::from_le_bytes([c0, c1]),
                jt,
                jf,
                k: u32::from_le_bytes([k0, k1, k2, k3]),
            });
            rest = tail;
        }
        Some((LoadableFilter { filters }, rest))
    }

    pub fn len(&self) -> usize {
        self.filters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Installs the filter on the calling thread. no_new_privs must already be set.
    pub fn load(&self) -> Result<(), i32> {
        let prog = libc::sock_fprog {
            len: self.filters.len() as libc::c_ushort,
            filter: self.filters.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: `prog` points at `self.filters`, which outlives the call; the kernel copies
        // the program. The flags argument is 0 (no TSYNC: the process is single-threaded).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong,
                0 as libc::c_ulong,
                &prog as *const libc::sock_fprog,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL));
        }
        Ok(())
    }
}

/// Whether the kernel offers seccomp filters at all.
pub fn available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointer arguments.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_survives_the_channel_encoding_and_garbage_does_not_decode() {
        let p = crate::profile::Profile::resolve("default")
            .and_then(|p| p.compile_seccomp())
            .map(|prog| LoadableFilter::new(&prog));
        let Ok(filter) = p else {
            panic!("the default profile compiles");
        };
        let mut bytes = Vec::new();
        filter.to_bytes(&mut bytes);
        filter.to_bytes(&mut bytes);
        let (a, rest) = LoadableFilter::from_bytes(&bytes).unwrap_or_else(|| panic!("decodes"));
        let (b, rest) = LoadableFilter::from_bytes(rest).unwrap_or_else(|| panic!("decodes"));
        assert!(rest.is_empty());
        assert_eq!(a.len(), filter.len());
        assert_eq!(b.len(), filter.len());
        assert!(
            LoadableFilter::from_bytes(&[0, 0]).is_none(),
            "an empty program"
        );
        assert!(
            LoadableFilter::from_bytes(&[5, 0, 1, 2]).is_none(),
            "a short one"
        );
        assert!(LoadableFilter::from_bytes(&[]).is_none());
    }
}
