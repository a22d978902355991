//! The syscall ABIs a filter meets on this machine, and their syscall tables.
//!
//! An x86_64 kernel accepts three: native x86_64, i386 through `int 0x80` (its own arch
//! value and numbers) and x32 (the x86_64 arch value with bit 30 set in the number).
//! A filter that forgets the other two is the classic seccomp bypass, so every audit
//! command can be asked about each ABI.

use libseccomp::{ScmpArch, ScmpSyscall};

use super::bpf::{self, SeccompData};

/// Highest syscall number probed when listing a table (x86_64 is below 470 today).
const TABLE_SPAN: i32 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Abi {
    X86_64,
    X86,
    X32,
    Aarch64,
    Arm,
}

impl Abi {
    /// The ABI of this build.
    pub fn native() -> Abi {
        if cfg!(target_arch = "aarch64") {
            Abi::Aarch64
        } else if cfg!(target_arch = "arm") {
            Abi::Arm
        } else if cfg!(target_arch = "x86") {
            Abi::X86
        } else {
            Abi::X86_64
        }
    }

    /// Every ABI whose syscalls this machine's kernel may accept from a process.
    pub fn runnable() -> Vec<Abi> {
        match Abi::native() {
            Abi::X86_64 => vec![Abi::X86_64, Abi::X86, Abi::X32],
            Abi::Aarch64 => vec![Abi::Aarch64, Abi::Arm],
            other => vec![other],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Abi::X86_64 => "x86_64",
            Abi::X86 => "x86",
            Abi::X32 => "x32",
            Abi::Aarch64 => "aarch64",
            Abi::Arm => "arm",
        }
    }

    /// How the ABI is reached, for people reading a report.
    pub fn entry(self) -> &'static str {
        match self {
            Abi::X86_64 => "native syscall",
            Abi::X86 => "i386 `int 0x80`",
            Abi::X32 => "x32 (syscall number | 0x40000000)",
            Abi::Aarch64 => "native svc",
            Abi::Arm => "AArch32 compat",
        }
    }

    /// Parses `native` or an architecture name as profiles and the OCI format spell them.
    pub fn parse(name: &str) -> Result<Abi, String> {
        Abi::from_scmp(parse_arch(name)?)
            .ok_or_else(|| format!("architecture {name:?} cannot run on this machine"))
    }

    pub fn from_scmp(arch: ScmpArch) -> Option<Abi> {
        Some(match arch {
            ScmpArch::X8664 => Abi::X86_64,
            ScmpArch::X86 => Abi::X86,
            ScmpArch::X32 => Abi::X32,
            ScmpArch::Aarch64 => Abi::Aarch64,
            ScmpArch::Arm => Abi::Arm,
            ScmpArch::Native => Abi::native(),
            _ => return None,
        })
    }

    pub fn scmp(self) -> ScmpArch {
        match self {
            Abi::X86_64 => ScmpArch::X8664,
            Abi::X86 => ScmpArch::X86,
            Abi::X32 => ScmpArch::X32,
            Abi::Aarch64 => ScmpArch::Aarch64,
            Abi::Arm => ScmpArch::Arm,
        }
    }

    /// The `arch` field of `struct seccomp_data` for this ABI.
    pub fn audit_arch(self) -> u32 {
        match self {
            Abi::X86_64 | Abi::X32 => bpf::AUDIT_ARCH_X86_64,
            Abi::X86 => bpf::AUDIT_ARCH_I386,
            Abi::Aarch64 => bpf::AUDIT_ARCH_AARCH64,
            Abi::Arm => 0x4000_0028,
        }
    }

    /// Width of an argument as libseccomp compares it: 32-bit ABIs compare the low half
    /// of each argument with the low half of the rule's value.
    pub fn arg_bits(self) -> u32 {
        match self {
            Abi::X86_64 | Abi::Aarch64 => 64,
            Abi::X86 | Abi::X32 | Abi::Arm => 32,
        }
    }

    fn nr_base(self) -> i32 {
        match self {
            Abi::X32 => bpf::X32_SYSCALL_BIT as i32,
            _ => 0,
        }
    }

    /// The syscall number of `name` on this ABI (x32 numbers include the x32 bit), or
    /// `None` when libseccomp does not know the name or the ABI has no such syscall.
    pub fn syscall_nr(self, name: &str) -> Option<i32> {
        let nr = ScmpSyscall::from_name_by_arch(name, self.scmp())
            .ok()?
            .as_raw_syscall();
        (nr >= 0).then_some(nr)
    }

    /// The name libseccomp gives a syscall number on this ABI.
    pub fn syscall_name(self, nr: i32) -> Option<String> {
        if nr < 0 {
            return None;
        }
        ScmpSyscall::from(nr).get_name_by_arch(self.scmp()).ok()
    }

    /// Every syscall of this ABI that libseccomp knows, by number.
    pub fn syscalls(self) -> Vec<(i32, String)> {
        let base = self.nr_base();
        (base..base + TABLE_SPAN)
            .filter_map(|nr| self.syscall_name(nr).map(|n| (nr, n)))
            .filter(|(nr, name)| self.syscall_nr(name) == Some(*nr))
            .collect()
    }

    /// What the filter is given for this syscall.
    pub fn data(self, nr: i32, args: [u64; 6]) -> SeccompData {
        SeccompData {
            nr,
            arch: self.audit_arch(),
            instruction_pointer: 0,
            args,
        }
    }
}

impl std::fmt::Display for Abi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses an architecture name as libseccomp and the OCI format spell them.
pub fn parse_arch(name: &str) -> Result<ScmpArch, String> {
    let n = name.trim().to_ascii_lowercase();
    let n = n.strip_prefix("scmp_arch_").unwrap_or(&n);
    Ok(match n {
        "native" => ScmpArch::native(),
        "x86_64" | "amd64" => ScmpArch::X8664,
        "x86" | "i386" | "i686" => ScmpArch::X86,
        "x32" => ScmpArch::X32,
        "aarch64" | "arm64" => ScmpArch::Aarch64,
        "arm" => ScmpArch::Arm,
        "riscv64" => ScmpArch::Riscv64,
        "ppc64le" => ScmpArch::Ppc64Le,
        "s390x" => ScmpArch::S390X,
        _ => return Err(format!("unknown architecture {name:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_resolve_both_ways() {
        if Abi::native() != Abi::X86_64 {
            return;
        }
        assert_eq!(Abi::X86_64.syscall_nr("getpid"), Some(39));
        assert_eq!(Abi::X86.syscall_nr("getpid"), Some(20));
        assert_eq!(Abi::X32.syscall_nr("getpid"), Some(0x4000_0027));
        assert_eq!(Abi::X86_64.syscall_nr("socketcall"), None);
        assert_eq!(Abi::X86_64.syscall_name(101).as_deref(), Some("ptrace"));
        let table = Abi::X86_64.syscalls();
        assert!(table.len() > 300, "{}", table.len());
        assert!(table.iter().any(|(nr, n)| *nr == 0 && n == "read"));
        assert!(
            Abi::X32
                .syscalls()
                .iter()
                .all(|(nr, _)| *nr as u32 & bpf::X32_SYSCALL_BIT != 0)
        );
    }
}
