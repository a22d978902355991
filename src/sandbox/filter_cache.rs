//! Compiled seccomp filters kept between runs, so that a one-shot `run` does not compile
//! its profile's and the floor's filters with libseccomp every time (half a millisecond
//! of a start that costs a few).
//!
//! An entry is keyed by everything the compiled bytes depend on: this build of hatchery
//! (a hash of the code that turns a policy into a program, made by `build.rs`), the
//! libseccomp version, the profile's seccomp policy and whether the allowlist rules are
//! in. A different key is a miss, never a stale hit.
//!
//! A filter is what stands between a sandbox and the kernel: whoever could write an entry
//! could weaken every later sandbox. So only a privileged supervisor keeps a cache, in
//! `/run/hatchery/bpf` (a directory root owns, mode 0700, reached without following a
//! symlink, its entries written whole through the held directory); an unprivileged one
//! (whose sandboxes may be given its own home read-write) compiles every time. An entry
//! that does not decode is ignored and replaced.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::paths::Dir;
use crate::profile::{Profile, SeccompProgram};

use super::{Filters, SandboxError};

/// Hash of the code and data the compiled bytes depend on (see `build.rs`).
const BUILD_ID: &str = env!("HATCHERY_FILTER_BUILD_ID");

const DIR: &str = "/run/hatchery";
const SUBDIR: &str = "bpf";
/// Entries kept before the cache is emptied and started again (a handful of profiles is
/// the normal case; this bounds what a flood of distinct profiles could leave).
const MAX_ENTRIES: usize = 256;
/// Largest entry read: two programs of the kernel's maximum size, and notes.
const MAX_ENTRY_BYTES: u64 = 2 * 4096 * 8 + 64 * 1024;
const MAGIC: &[u8; 8] = b"HBPFv1\n\0";

fn key(profile: &Profile) -> Option<String> {
    let version = libseccomp::ScmpVersion::current().ok()?;
    let policy = serde_json::to_vec(&profile.seccomp).ok()?;
    let mut h = Sha256::new();
    h.update(b"hatchery filter cache v1\n");
    h.update(BUILD_ID.as_bytes());
    h.update(format!("{}.{}.{}\n", version.major, version.minor, version.micro).as_bytes());
    h.update([u8::from(profile.landlock.allow_exec.is_some())]);
    h.update(&policy);
    Some(hex::encode(h.finalize()))
}

fn encode(f: &Filters) -> Vec<u8> {
    let notes = f.floor_notes.join("\n");
    let mut out = Vec::with_capacity(
        MAGIC.len() + 12 + f.floor.as_bytes().len() + f.profile.as_bytes().len() + notes.len(),
    );
    out.extend_from_slice(MAGIC);
    for part in [f.floor.as_bytes(), f.profile.as_bytes(), notes.as_bytes()] {
        out.extend_from_slice(&(part.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(f.floor.as_bytes());
    out.extend_from_slice(f.profile.as_bytes());
    out.extend_from_slice(notes.as_bytes());
    out
}

fn decode(bytes: &[u8]) -> Option<Filters> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let (lens, mut rest) = rest.split_first_chunk::<12>()?;
    let len = |i: usize| -> Option<usize> {
        let b: [u8; 4] = lens.get(i..i + 4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(b)).ok()
    };
    let mut take = |n: usize| -> Option<&[u8]> {
        let (part, tail) = rest.split_at_checked(n)?;
        rest = tail;
        Some(part)
    };
    let floor = SeccompProgram::from_bytes(take(len(0)?)?.to_vec()).ok()?;
    let profile = SeccompProgram::from_bytes(take(len(4)?)?.to_vec()).ok()?;
    let notes = std::str::from_utf8(take(len(8)?)?).ok()?;
    if !rest.is_empty() {
        return None;
    }
    Some(Filters {
        floor,
        profile,
        floor_notes: notes
            .split('\n')
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

fn compile(profile: &Profile) -> Result<Filters, SandboxError> {
    let invalid = |e: crate::profile::ProfileError| SandboxError::Invalid(e.to_string());
    let floor = profile.floor().map_err(invalid)?;
    Ok(Filters {
        profile: profile.compile_seccomp().map_err(invalid)?,
        floor: floor.program,
        floor_notes: floor.notes,
    })
}

fn cache_dir() -> Option<Dir> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let dir = Dir::create(Path::new(DIR), 0o755)
        .and_then(|d| d.subdir(SUBDIR, 0o700))
        .ok()?;
    // Refuse a directory that is not root's alone (someone made it before us).
    let st = dir.stat().ok()?;
    (st.st_uid == 0 && st.st_mode & 0o077 == 0).then_some(dir)
}

/// The filters for `profile`: from the cache when there, else compiled (and kept).
pub fn filters(profile: &Profile) -> Result<Filters, SandboxError> {
    let (Some(dir), Some(key)) = (cache_dir(), key(profile)) else {
        return compile(profile);
    };
    let name = format!("{key}.bpf");
    if let Ok(Some(bytes)) = dir.read(&name, MAX_ENTRY_BYTES) {
        if let Some(hit) = decode(&bytes) {
            return Ok(hit);
        }
    }
    let compiled = compile(profile)?;
    let names = dir.names().unwrap_or_default();
    if names.len() >= MAX_ENTRIES {
        for old in names.iter().filter_map(|n| n.to_str()) {
            let _ = dir.remove(old);
        }
    }
    // A cache that cannot be written costs time, never correctness.
    let _ = dir.write_atomically(&name, &encode(&compiled), 0o600);
    Ok(compiled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_and_anything_else_is_a_miss() -> Result<(), Box<dyn std::error::Error>>
    {
        let p = Profile::resolve("default")?;
        let f = compile(&p)?;
        let bytes = encode(&f);
        assert_eq!(decode(&bytes), Some(f.clone()));
        for cut in [0, 7, 8, 20, bytes.len() - 1] {
            assert_eq!(decode(bytes.get(..cut).unwrap_or_default()), None, "{cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer), None);
        let mut bad = bytes.clone();
        if let Some(b) = bad.get_mut(8) {
            *b = 3;
        }
        assert_eq!(decode(&bad), None, "a program length not a multiple of 8");
        Ok(())
    }

    #[test]
    fn keys_differ_with_the_policy_and_the_allowlist() -> Result<(), Box<dyn std::error::Error>> {
        let d = Profile::resolve("default")?;
        let s = Profile::resolve("strict")?;
        assert_ne!(key(&d), key(&s));
        let mut listed = d.clone();
        listed.landlock.allow_exec = Some(vec!["/usr/bin/true".into()]);
        assert_ne!(key(&d), key(&listed));
        assert_eq!(key(&d), key(&Profile::resolve("default")?));
        Ok(())
    }

    #[test]
    fn the_cache_gives_what_a_compile_gives() -> Result<(), Box<dyn std::error::Error>> {
        let p = Profile::resolve("compat")?;
        let first = filters(&p)?;
        let second = filters(&p)?;
        assert_eq!(first, compile(&p)?);
        assert_eq!(second, first);
        Ok(())
    }
}
