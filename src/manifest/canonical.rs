//! The canonical byte encoding of a manifest: the exact bytes the signature covers.
//!
//! JSON is how manifests travel, never what is signed: key order, whitespace, escapes and
//! number spellings would all give one manifest many byte forms. No float is signed
//! either: the CPU quota is signed as integer millicores. Instead every field but
//! `signature` is written, in this fixed order, with a fixed-width or length-prefixed
//! encoding:
//!
//! ```text
//! magic            the 21 bytes "hatchery-manifest-v1\n" (domain separation, version)
//! key_id           str
//! worker_id        str
//! parent_id        opt(str)
//! depth            u64
//! issued_at        u64
//! expires_at       u64
//! nonce            16 raw bytes
//! state_snapshot   str
//! resources.cpu_limit                       u64 (millicores)
//! resources.memory_limit_mb                 u64
//! resources.pids_limit                      u64
//! resources.timeout_ms                      u64
//! resources.network_policy.allow_controller bool
//! resources.network_policy.allow_external   bool
//! filesystem.read_only                      list(str)
//! filesystem.read_write                     list(str)
//! profile          str
//! command          list(str)
//! env              list(str)
//! cwd              opt(str)
//! extensions       fields added after v1, each present field as one tag byte and its
//!                  value, in increasing tag order; an absent field writes nothing:
//!   0x01  filesystem.allow_exec                       list(str)
//!   0x02  resources.max_output_bytes                  u64
//!   0x03  resources.network_policy.allow_hosts        list(str), each entry's canonical
//!                                                     HOST:PORT text, in the manifest's
//!                                                     order; absent when the list is empty
//!   0x04  resources.network_policy.max_egress_bytes   u64
//!
//! u64       8 bytes, big-endian
//! bool      one byte, 0x00 or 0x01
//! str       u64 byte length, then the UTF-8 bytes
//! opt(x)    0x00 for absent; 0x01 then x
//! list(x)   u64 element count, then each element
//! ```
//!
//! Why two manifests that differ in any signed field never encode the same: every item is
//! either fixed-width or announces its own length before its bytes, and the sequence of
//! items is fixed, so reading the bytes back from the start recovers every field
//! unambiguously — the encoding is a prefix-free code, hence injective. The extensions
//! keep it so: after `cwd` a reader either meets the end (no extension field) or a tag
//! naming the one field that follows, and tags only ever increase, so each set of present
//! fields has exactly one spelling. A manifest without extension fields encodes exactly
//! as before they existed, so its signature stays valid. The tests hold the decoder that
//! demonstrates all this (`decode(encode(m)) == m` for generated manifests).

use super::Manifest;

/// The first bytes of every encoding: names the format and its version, so these bytes
/// can never be mistaken for a signature over anything else.
pub const MAGIC: &[u8; 21] = b"hatchery-manifest-v1\n";

/// Tag of `filesystem.allow_exec` in the extensions.
pub const TAG_ALLOW_EXEC: u8 = 0x01;
/// Tag of `resources.max_output_bytes` in the extensions.
pub const TAG_MAX_OUTPUT_BYTES: u8 = 0x02;
/// Tag of `resources.network_policy.allow_hosts` in the extensions.
pub const TAG_ALLOW_HOSTS: u8 = 0x03;
/// Tag of `resources.network_policy.max_egress_bytes` in the extensions.
pub const TAG_MAX_EGRESS_BYTES: u8 = 0x04;

/// Where encoded bytes go (a buffer; kept as a trait so a test can count or inspect).
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

fn put_u64(out: &mut impl Sink, v: u64) {
    out.put(&v.to_be_bytes());
}

fn put_bool(out: &mut impl Sink, v: bool) {
    out.put(&[u8::from(v)]);
}

fn put_str(out: &mut impl Sink, s: &str) {
    put_u64(out, s.len() as u64);
    out.put(s.as_bytes());
}

fn put_opt_str(out: &mut impl Sink, s: Option<&str>) {
    match s {
        None => out.put(&[0]),
        Some(s) => {
            out.put(&[1]);
            put_str(out, s);
        }
    }
}

fn put_list<'a>(out: &mut impl Sink, items: impl ExactSizeIterator<Item = &'a str>) {
    put_u64(out, items.len() as u64);
    for s in items {
        put_str(out, s);
    }
}

/// Writes the canonical encoding of every field of `m` except `signature` into `out`.
pub fn encode_into(m: &Manifest, out: &mut impl Sink) {
    out.put(MAGIC);
    put_str(out, m.key_id.as_str());
    put_str(out, m.worker_id.as_str());
    put_opt_str(out, m.parent_id.as_ref().map(|p| p.as_str()));
    put_u64(out, u64::from(m.depth.get()));
    put_u64(out, m.issued_at.get());
    put_u64(out, m.expires_at.get());
    out.put(m.nonce.as_bytes());
    put_str(out, m.state_snapshot.as_str());
    let r = &m.resources;
    put_u64(out, u64::from(r.cpu_limit.millicores()));
    put_u64(out, r.memory_limit_mb.get());
    put_u64(out, r.pids_limit.get());
    put_u64(out, r.timeout_ms.get());
    put_bool(out, r.network_policy.allow_controller);
    put_bool(out, r.network_policy.allow_external);
    put_list(out, m.filesystem.read_only.iter().map(|p| p.as_str()));
    put_list(out, m.filesystem.read_write.iter().map(|p| p.as_str()));
    put_str(out, m.profile.as_str());
    put_list(out, m.command.iter().map(String::as_str));
    put_list(out, m.env.iter().map(String::as_str));
    put_opt_str(out, m.cwd.as_deref());
    if let Some(allow) = &m.filesystem.allow_exec {
        out.put(&[TAG_ALLOW_EXEC]);
        put_list(out, allow.iter().map(|p| p.as_str()));
    }
    if let Some(cap) = m.resources.max_output_bytes {
        out.put(&[TAG_MAX_OUTPUT_BYTES]);
        put_u64(out, cap.get());
    }
    let net = &m.resources.network_policy;
    if !net.allow_hosts.is_empty() {
        out.put(&[TAG_ALLOW_HOSTS]);
        let entries: Vec<String> = net
            .allow_hosts
            .entries()
            .iter()
            .map(|e| e.to_string())
            .collect();
        put_list(out, entries.iter().map(String::as_str));
    }
    if let Some(budget) = net.max_egress_bytes {
        out.put(&[TAG_MAX_EGRESS_BYTES]);
        put_u64(out, budget.get());
    }
}

/// The canonical encoding as one buffer: what the MAC is computed over.
pub fn encode(m: &Manifest) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    encode_into(m, &mut out);
    out
}

#[cfg(test)]
pub(crate) mod decode {
    //! The inverse of [`super::encode`]: exists to prove the encoding is unambiguous.

    use super::*;
    use crate::manifest::*;

    pub struct Reader<'a> {
        bytes: &'a [u8],
    }

    type R<T> = Result<T, String>;

    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> R<&'a [u8]> {
            if self.bytes.len() < n {
                return Err("truncated".into());
            }
            let (head, tail) = self.bytes.split_at(n);
            self.bytes = tail;
            Ok(head)
        }
        fn u64(&mut self) -> R<u64> {
            let mut b = [0u8; 8];
            b.copy_from_slice(self.take(8)?);
            Ok(u64::from_be_bytes(b))
        }
        fn flag(&mut self) -> R<bool> {
            match self.take(1)? {
                [0] => Ok(false),
                [1] => Ok(true),
                _ => Err("bad flag".into()),
            }
        }
        fn string(&mut self) -> R<String> {
            let n = usize::try_from(self.u64()?).map_err(|e| e.to_string())?;
            String::from_utf8(self.take(n)?.to_vec()).map_err(|e| e.to_string())
        }
        fn opt(&mut self) -> R<Option<String>> {
            if self.flag()? {
                Ok(Some(self.string()?))
            } else {
                Ok(None)
            }
        }
        fn list(&mut self) -> R<Vec<String>> {
            let n = self.u64()?;
            (0..n).map(|_| self.string()).collect()
        }
    }

    fn field<T>(r: Result<T, FieldError>) -> R<T> {
        r.map_err(|e| e.to_string())
    }

    /// Decodes canonical bytes back into a manifest (with an empty signature).
    pub fn decode(bytes: &[u8]) -> R<Manifest> {
        let mut r = Reader { bytes };
        if r.take(MAGIC.len())? != MAGIC {
            return Err("bad magic".into());
        }
        let key_id = field(KeyId::new(r.string()?))?;
        let worker_id = field(WorkerId::new(r.string()?))?;
        let parent_id = r.opt()?.map(WorkerId::new).transpose();
        let parent_id = field(parent_id)?;
        let depth = field(Depth::try_from(r.u64()?))?;
        let issued_at = field(UnixSeconds::new(r.u64()?))?;
        let expires_at = field(UnixSeconds::new(r.u64()?))?;
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(r.take(16)?);
        let state_snapshot = field(StateSnapshot::new(r.string()?))?;
        let millis = u32::try_from(r.u64()?).map_err(|e| e.to_string())?;
        let cpu_limit = field(CpuLimit::from_millicores(millis))?;
        let memory_limit_mb = field(MemoryMb::new(r.u64()?))?;
        let pids_limit = field(PidsLimit::new(r.u64()?))?;
        let timeout_ms = field(TimeoutMs::new(r.u64()?))?;
        let mut network_policy = NetworkPolicy {
            allow_controller: r.flag()?,
            allow_external: r.flag()?,
            ..NetworkPolicy::default()
        };
        let paths = |v: Vec<String>| -> R<Vec<ExposedPath>> {
            v.into_iter().map(|s| field(ExposedPath::new(s))).collect()
        };
        let read_only = paths(r.list()?)?;
        let read_write = paths(r.list()?)?;
        let profile = field(ProfileName::new(r.string()?))?;
        let command = r.list()?;
        let env = r.list()?;
        let cwd = r.opt()?;
        let mut allow_exec = None;
        let mut max_output_bytes = None;
        let mut last_tag = 0u8;
        while !r.bytes.is_empty() {
            let tag = r.take(1)?[0];
            if tag <= last_tag {
                return Err(format!("extension tag {tag} after {last_tag}"));
            }
            last_tag = tag;
            match tag {
                TAG_ALLOW_EXEC => {
                    allow_exec = Some(
                        r.list()?
                            .into_iter()
                            .map(|s| field(ExecPath::new(s)))
                            .collect::<R<Vec<_>>>()?,
                    )
                }
                TAG_MAX_OUTPUT_BYTES => max_output_bytes = Some(field(OutputBytes::new(r.u64()?))?),
                TAG_ALLOW_HOSTS => {
                    let mut entries = Vec::new();
                    for text in r.list()? {
                        let entry: crate::egress::AllowHost = text
                            .parse()
                            .map_err(|e: crate::egress::EgressError| e.to_string())?;
                        if entry.to_string() != text {
                            return Err(format!("{text:?} is not in canonical form"));
                        }
                        entries.push(entry);
                    }
                    if entries.is_empty() {
                        return Err("an empty allow_hosts is written as no field".into());
                    }
                    let list = crate::egress::AllowList::new(entries.clone())
                        .map_err(|e| e.to_string())?;
                    if list.entries() != entries.as_slice() {
                        return Err("allow_hosts repeats an entry".into());
                    }
                    network_policy.allow_hosts = list;
                }
                TAG_MAX_EGRESS_BYTES => {
                    network_policy.max_egress_bytes = Some(field(EgressBytes::new(r.u64()?))?)
                }
                other => return Err(format!("unknown extension tag {other}")),
            }
        }
        Ok(Manifest {
            key_id,
            worker_id,
            parent_id,
            depth,
            issued_at,
            expires_at,
            nonce: Nonce::from_bytes(nonce),
            state_snapshot,
            resources: ResourceSpec {
                cpu_limit,
                memory_limit_mb,
                pids_limit,
                timeout_ms,
                network_policy,
                max_output_bytes,
            },
            filesystem: FilesystemScope {
                read_only,
                read_write,
                allow_exec,
            },
            profile,
            command,
            env,
            cwd,
            signature: String::new(),
        })
    }
}
