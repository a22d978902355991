//! Resource limits set with setrlimit(2) just before the payload starts: the profile's
//! rlimits, and (rootless, degraded) the stand-ins for cgroup limits that cannot be had.

use nix::sys::resource::{Resource, setrlimit};

use crate::profile::{Rlimit, RlimitResource};

fn resource(r: RlimitResource) -> Resource {
    match r {
        RlimitResource::As => Resource::RLIMIT_AS,
        RlimitResource::Core => Resource::RLIMIT_CORE,
        RlimitResource::Cpu => Resource::RLIMIT_CPU,
        RlimitResource::Data => Resource::RLIMIT_DATA,
        RlimitResource::Fsize => Resource::RLIMIT_FSIZE,
        RlimitResource::Memlock => Resource::RLIMIT_MEMLOCK,
        RlimitResource::Nofile => Resource::RLIMIT_NOFILE,
        RlimitResource::Nproc => Resource::RLIMIT_NPROC,
        RlimitResource::Stack => Resource::RLIMIT_STACK,
    }
}

fn raw(v: u64) -> libc::rlim_t {
    if v == u64::MAX {
        libc::RLIM_INFINITY
    } else {
        v as libc::rlim_t
    }
}

/// Applies every limit; the first failure is returned with the resource's name.
pub fn apply(limits: &[Rlimit]) -> Result<(), (&'static str, nix::Error)> {
    for l in limits {
        setrlimit(resource(l.resource), raw(l.soft), raw(l.hard))
            .map_err(|e| (l.resource.name(), e))?;
    }
    Ok(())
}
