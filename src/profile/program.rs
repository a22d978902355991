//! A compiled seccomp filter as the kernel takes it: `struct sock_filter` instructions in
//! native byte order.
//!
//! Why a module of its own: the compiler (`seccomp`) makes it, and the interpreter
//! (`bpf`), the explorers and the differ read it; none of them needs the others for that.

/// A compiled filter: an array of `struct sock_filter` in native byte order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeccompProgram {
    bytes: Vec<u8>,
}

/// One classic-BPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInstruction {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

impl SeccompProgram {
    /// Wraps raw `sock_filter` bytes; the length must be a non-zero multiple of 8.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<SeccompProgram, String> {
        if bytes.is_empty() || bytes.len() % 8 != 0 || bytes.len() / 8 > 4096 {
            return Err(format!("invalid BPF program length {}", bytes.len()));
        }
        Ok(SeccompProgram { bytes })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / 8
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn instructions(&self) -> impl Iterator<Item = BpfInstruction> + '_ {
        self.bytes.chunks_exact(8).map(|c| BpfInstruction {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
    }
}
