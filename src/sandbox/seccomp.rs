//! Loading the profile's compiled filter: the exact bytes libseccomp produced are handed
//! to seccomp(2), so the program `profile show --format bpf` prints is the one enforced.

use crate::profile::SeccompProgram;

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
