//! A profile's sections besides seccomp: lint acceptances, Landlock, namespaces, mounts,
//! rlimits and default limits, as the TOML spells them.

use super::*;

/// Lint findings the profile's author has accepted, by rule id (`[lint] accept = [...]`):
/// still reported, marked accepted, and no longer failing `profile lint`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LintPolicy {
    #[serde(default)]
    pub accept: Vec<String>,
}

impl LintPolicy {
    pub fn is_empty(&self) -> bool {
        self.accept.is_empty()
    }
}

/// Landlock filesystem rules: paths inside the sandbox and what may be done beneath them.
/// Paths exposed with `--ro` get read + execute, `--rw` read + write + execute, on top.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandlockPolicy {
    /// Read files and list directories.
    #[serde(default)]
    pub read: Vec<PathBuf>,
    /// Create, write, truncate, rename and remove (implies read).
    #[serde(default)]
    pub write: Vec<PathBuf>,
    /// Execute files.
    #[serde(default)]
    pub execute: Vec<PathBuf>,
    /// An executable allowlist: when present, these files (and the dynamic loader they
    /// name) are the only ones that may be executed, and `execute` above no longer
    /// applies (see `sandbox::exec`). Real paths of regular files, no symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_exec: Option<Vec<PathBuf>>,
    /// Lowest Landlock ABI that enforces this profile's filesystem rules. A kernel below it
    /// makes `run` fail closed (exit 125) unless `--allow-degraded`.
    #[serde(default = "default_min_abi")]
    pub min_abi: u8,
    /// Refuse every TCP bind and connect, loopback included (Landlock ABI 4). Off by
    /// default: the sandbox's empty network namespace is what keeps it off the network,
    /// and its own loopback (a test server an agent starts) should work.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deny_tcp: bool,
}

fn default_min_abi() -> u8 {
    1
}

impl Default for LandlockPolicy {
    fn default() -> Self {
        LandlockPolicy {
            read: Vec::new(),
            write: Vec::new(),
            execute: Vec::new(),
            allow_exec: None,
            min_abi: default_min_abi(),
            deny_tcp: false,
        }
    }
}

/// Which namespaces the sandbox gets. User, pid and mount namespaces are not optional:
/// the rootfs, the pid-1 reaper and the identity mapping depend on them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespacePolicy {
    /// A private network namespace with only loopback (false shares the host's network).
    #[serde(default = "yes")]
    pub net: bool,
    #[serde(default = "yes")]
    pub ipc: bool,
    #[serde(default = "yes")]
    pub uts: bool,
    #[serde(default = "yes")]
    pub cgroup: bool,
}

fn yes() -> bool {
    true
}

impl Default for NamespacePolicy {
    fn default() -> Self {
        NamespacePolicy {
            net: true,
            ipc: true,
            uts: true,
            cgroup: true,
        }
    }
}

/// What of the host appears in the sandbox besides `--ro`/`--rw` paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountPolicy {
    /// Host directories bound read-only at the same path. The `/bin /lib /lib64 /sbin`
    /// links (or directories) of the host follow `/usr` as the host has them.
    #[serde(default = "default_system_mounts")]
    pub system: Vec<PathBuf>,
    /// Size cap of the sandbox's tmpfs, which holds its private `/tmp` and `/dev/shm` (its
    /// pages are also charged to the memory limit).
    #[serde(default = "default_tmp_size")]
    pub tmp_size: String,
    /// A private, writable `/dev/shm` (in the same tmpfs as `/tmp`, under `tmp_size`'s cap).
    #[serde(default = "yes")]
    pub dev_shm: bool,
}

fn default_system_mounts() -> Vec<PathBuf> {
    vec![PathBuf::from("/usr"), PathBuf::from("/etc")]
}

fn default_tmp_size() -> String {
    "256M".to_string()
}

impl Default for MountPolicy {
    fn default() -> Self {
        MountPolicy {
            system: default_system_mounts(),
            tmp_size: default_tmp_size(),
            dev_shm: true,
        }
    }
}

impl MountPolicy {
    /// The tmpfs size cap in bytes (validated when the profile is loaded).
    pub fn tmp_size_bytes(&self) -> u64 {
        units::parse_size(&self.tmp_size).unwrap_or(256 << 20)
    }
}

/// An rlimit value: one number for soft = hard, `"unlimited"`, or `{ soft, hard }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RlimitValue {
    Both(u64),
    Named(String),
    Pair { soft: u64, hard: u64 },
}

/// Soft and hard values, `u64::MAX` meaning unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rlimit {
    pub resource: RlimitResource,
    pub soft: u64,
    pub hard: u64,
}

/// The rlimits a profile may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RlimitResource {
    As,
    Core,
    Cpu,
    Data,
    Fsize,
    Memlock,
    Nofile,
    Nproc,
    Stack,
}

impl RlimitResource {
    pub const ALL: &'static [(&'static str, RlimitResource)] = &[
        ("as", RlimitResource::As),
        ("core", RlimitResource::Core),
        ("cpu", RlimitResource::Cpu),
        ("data", RlimitResource::Data),
        ("fsize", RlimitResource::Fsize),
        ("memlock", RlimitResource::Memlock),
        ("nofile", RlimitResource::Nofile),
        ("nproc", RlimitResource::Nproc),
        ("stack", RlimitResource::Stack),
    ];

    pub fn name(self) -> &'static str {
        RlimitResource::ALL
            .iter()
            .find(|(_, r)| *r == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

/// Limits a profile applies when the command line gives none.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultLimits {
    pub memory: Option<String>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub timeout: Option<String>,
}

/// [`DefaultLimits`] with units resolved.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ResolvedLimits {
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub timeout: Option<Duration>,
}
