//! Signing keys: the keyring and its file.
//!
//! A keyring holds up to [`MAX_KEYS`] 256-bit HMAC keys, each with a [`KeyId`]; one is
//! active and signs, every key verifies. Rotation adds a new active key and keeps the old
//! ones, so manifests signed before the rotation stay valid until they expire; an operator
//! retires an old key by deleting its line once nothing it signed is alive.
//!
//! The key file is text, one statement per line (`#` starts a comment):
//!
//! ```text
//! active k-3f1c0e9a2b7d4c51
//! key k-3f1c0e9a2b7d4c51 <64 hex digits>
//! ```
//!
//! It is loaded only if it is a regular file (not a symlink), owned by the effective user,
//! with no permission bits for group or others (0600 or 0400): anyone else able to read it
//! could forge manifests. Secrets never appear in `Debug`, `Display`, logs or errors: key
//! file errors name the path and line, never the line's content.

use std::fmt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit};
use sha2::{Digest, Sha256};

use crate::manifest::KeyId;
use crate::manifest::fields::decode_lower_hex;

/// Most keys a keyring holds (active + retired ones still verifying).
pub const MAX_KEYS: usize = 16;
/// Largest key file read.
pub const MAX_KEY_FILE_BYTES: u64 = 64 << 10;
/// Key length in bytes (the SHA-256 block-size-independent recommendation: the hash size).
pub const KEY_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key file {path}: {why}")]
    File { path: PathBuf, why: String },
    #[error(
        "key file {path}: mode {mode:04o} lets others read or write it; run `chmod 600 {path}`"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error(
        "key file {path}: owned by uid {owner}, not by the current user (uid {euid}); a key file must be owned by whoever uses it"
    )]
    Owner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error("key file {path} line {line}: {why}")]
    Syntax {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error("key file {path} already exists; `hatchery manifest keygen --rotate` adds a key to it")]
    Exists { path: PathBuf },
    #[error("keyring: {0}")]
    Keyring(String),
    #[error("cannot generate a key: the system random source failed: {0}")]
    Random(String),
}

/// A 256-bit HMAC key. Its bytes never leave this module except into a MAC or the key file.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey([u8; KEY_BYTES]);

impl SecretKey {
    /// A new key from the operating system's random source.
    pub fn generate() -> Result<SecretKey, KeyError> {
        let mut b = [0u8; KEY_BYTES];
        getrandom::fill(&mut b).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(SecretKey(b))
    }

    /// A key from raw bytes. An all-zero key is refused: it is what an uninitialised buffer
    /// looks like, never what a random source produced.
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Result<SecretKey, KeyError> {
        if bytes == [0u8; KEY_BYTES] {
            return Err(KeyError::Keyring("an all-zero key is not a key".into()));
        }
        Ok(SecretKey(bytes))
    }

    /// The id `keygen` gives a key: "k-" and 16 hex digits of a domain-separated SHA-256
    /// of the key (one-way: it names the key without revealing it).
    pub fn fingerprint_id(&self) -> Result<KeyId, KeyError> {
        let digest = Sha256::new()
            .chain_update(b"hatchery key id v1\0")
            .chain_update(self.0)
            .finalize();
        KeyId::new(format!("k-{}", hex::encode(&digest[..8])))
            .map_err(|e| KeyError::Keyring(e.to_string()))
    }

    pub(super) fn mac(&self) -> Result<Hmac<Sha256>, KeyError> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .map_err(|e| KeyError::Keyring(e.to_string()))
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

/// One key of a keyring with its MAC state prepared (keyed once, cloned per use).
#[derive(Clone)]
pub(super) struct KeyEntry {
    pub(super) id: KeyId,
    secret: SecretKey,
    pub(super) mac: Hmac<Sha256>,
}

/// The controller's signing keys. `Debug` shows key ids only.
#[derive(Clone)]
pub struct Keyring {
    /// Index of the active key in `keys`.
    active: usize,
    keys: Vec<KeyEntry>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("active", self.active_key_id())
            .field("keys", &self.key_ids().collect::<Vec<_>>())
            .finish()
    }
}

impl Keyring {
    /// A keyring of one key, active.
    pub fn single(id: KeyId, key: SecretKey) -> Result<Keyring, KeyError> {
        Keyring::from_keys(id.clone(), vec![(id, key)])
    }

    /// A keyring of the given keys with `active` signing; ids must be unique.
    pub fn from_keys(active: KeyId, keys: Vec<(KeyId, SecretKey)>) -> Result<Keyring, KeyError> {
        if keys.is_empty() {
            return Err(KeyError::Keyring("no keys".into()));
        }
        if keys.len() > MAX_KEYS {
            return Err(KeyError::Keyring(format!(
                "{} keys; the maximum is {MAX_KEYS} (retire old ones)",
                keys.len()
            )));
        }
        let mut entries: Vec<KeyEntry> = Vec::with_capacity(keys.len());
        for (id, secret) in keys {
            if entries.iter().any(|e| e.id == id) {
                return Err(KeyError::Keyring(format!("key id {id} appears twice")));
            }
            if entries.iter().any(|e| e.secret == secret) {
                return Err(KeyError::Keyring(format!(
                    "key {id} has the same secret as another key"
                )));
            }
            let mac = secret.mac()?;
            entries.push(KeyEntry { id, secret, mac });
        }
        let active = entries
            .iter()
            .position(|e| e.id == active)
            .ok_or_else(|| KeyError::Keyring("the active key id names none of the keys".into()))?;
        Ok(Keyring {
            active,
            keys: entries,
        })
    }

    /// A keyring of one freshly generated key.
    pub fn generate() -> Result<Keyring, KeyError> {
        let key = SecretKey::generate()?;
        Keyring::single(key.fingerprint_id()?, key)
    }

    /// A key derived from the active key for one purpose (HMAC-SHA256 of a
    /// domain-separated label): the secret never leaves the keyring, and keys derived for
    /// different purposes are unrelated.
    fn derive(&self, purpose: &str) -> Result<SecretKey, KeyError> {
        Self::derive_from(self.active_entry(), purpose)
    }

    fn derive_from(entry: &KeyEntry, purpose: &str) -> Result<SecretKey, KeyError> {
        let mut mac = entry.mac.clone();
        hmac::Mac::update(&mut mac, b"hatchery derived key v1\0");
        hmac::Mac::update(&mut mac, purpose.as_bytes());
        let bytes: [u8; KEY_BYTES] = hmac::Mac::finalize(mac).into_bytes().into();
        SecretKey::from_bytes(bytes)
    }

    /// A keyed HMAC-SHA256 for `purpose` (the audit trail's MAC), derived from the active key.
    pub fn derived_mac(&self, purpose: &str) -> Result<Hmac<Sha256>, KeyError> {
        self.derive(purpose)?.mac()
    }

    /// A keyring of one key derived for controller session `session`: manifests signed in
    /// one controller run verify in no other, so a restart ends every earlier manifest,
    /// while whoever holds the key file can still re-derive the key to audit them.
    pub fn session(&self, session: &str) -> Result<Keyring, KeyError> {
        let key = self.derive(&format!("session:{session}"))?;
        let id = KeyId::new(format!("{}.s{}", self.active_key_id(), session))
            .map_err(|e| KeyError::Keyring(e.to_string()))?;
        Keyring::single(id, key)
    }

    /// The keyring that verifies manifests signed in a controller session under key id
    /// `<id>.s<session>`, where `<id>` is a key of this keyring: the session key derived
    /// again. So whoever holds the key file — any node of a cluster — verifies any
    /// session's manifests, while each session signs with its own key.
    pub fn for_session_key_id(&self, key_id: &KeyId) -> Option<Keyring> {
        let (base, session) = key_id.as_str().rsplit_once(".s")?;
        let entry = self.keys.iter().find(|e| e.id.as_str() == base)?;
        let key = Self::derive_from(entry, &format!("session:{session}")).ok()?;
        Keyring::single(key_id.clone(), key).ok()
    }

    /// Adds a freshly generated key and makes it active; the others keep verifying.
    pub fn rotate(&mut self) -> Result<KeyId, KeyError> {
        if self.keys.len() >= MAX_KEYS {
            return Err(KeyError::Keyring(format!(
                "already {MAX_KEYS} keys; retire old ones before rotating"
            )));
        }
        let key = SecretKey::generate()?;
        let id = key.fingerprint_id()?;
        if self.keys.iter().any(|e| e.id == id) {
            return Err(KeyError::Keyring(format!("key id {id} already present")));
        }
        let mac = key.mac()?;
        self.keys.push(KeyEntry {
            id: id.clone(),
            secret: key,
            mac,
        });
        self.active = self.keys.len() - 1;
        Ok(id)
    }

    pub fn active_key_id(&self) -> &KeyId {
        &self.active_entry().id
    }

    pub fn key_ids(&self) -> impl Iterator<Item = &KeyId> {
        self.keys.iter().map(|e| &e.id)
    }

    pub(super) fn active_entry(&self) -> &KeyEntry {
        // `active` is an index into `keys` by construction (never empty).
        &self.keys[self.active]
    }

    pub(super) fn entry(&self, id: &KeyId) -> Option<&KeyEntry> {
        self.keys.iter().find(|e| &e.id == id)
    }

    pub(crate) fn to_file_text(&self) -> String {
        let mut s = String::from(
            "# hatchery manifest signing keys. Secret: anyone who can read this file can forge\n\
             # manifests. Mode 0600, owned by the controller's user. The active key signs;\n\
             # every listed key verifies (delete a key's line to retire it).\n",
        );
        s.push_str(&format!("active {}\n", self.active_key_id()));
        for e in &self.keys {
            s.push_str(&format!("key {} {}\n", e.id, hex::encode(e.secret.0)));
        }
        s
    }
}

pub(crate) fn file_err(path: &Path, why: String) -> KeyError {
    KeyError::File {
        path: path.to_path_buf(),
        why,
    }
}

pub(crate) fn parse(path: &Path, text: &str) -> Result<Keyring, KeyError> {
    let syntax = |line: usize, why: &str| KeyError::Syntax {
        path: path.to_path_buf(),
        line,
        why: why.to_string(),
    };
    let mut active: Option<(usize, KeyId)> = None;
    let mut keys: Vec<(KeyId, SecretKey)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        match words.as_slice() {
            ["active", id] => {
                if active.is_some() {
                    return Err(syntax(n, "a second `active` line"));
                }
                let id = KeyId::new(*id).map_err(|e| syntax(n, &e.to_string()))?;
                active = Some((n, id));
            }
            ["key", id, secret] => {
                let id = KeyId::new(*id).map_err(|e| syntax(n, &e.to_string()))?;
                let bytes = decode_lower_hex::<KEY_BYTES>(secret).ok_or_else(|| {
                    syntax(
                        n,
                        "the key must be 64 lowercase hex digits (256 bits); the line was not shown",
                    )
                })?;
                let key = SecretKey::from_bytes(bytes).map_err(|e| syntax(n, &e.to_string()))?;
                keys.push((id, key));
            }
            _ => {
                return Err(syntax(
                    n,
                    "expected `active KEY_ID` or `key KEY_ID HEX` (the line was not shown: it may hold a secret)",
                ));
            }
        }
    }
    let (line, active) = active.ok_or_else(|| file_err(path, "no `active KEY_ID` line".into()))?;
    Keyring::from_keys(active, keys).map_err(|e| match e {
        KeyError::Keyring(why) => syntax(line, &why),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn secrets_never_show_in_debug_output() -> TestResult {
        let ring = Keyring::generate()?;
        let secret_hex = hex::encode(ring.active_entry().secret.0);
        let shown = format!("{ring:?} {:?}", ring.active_entry().secret);
        assert!(!shown.contains(&secret_hex), "{shown}");
        assert!(shown.contains(ring.active_key_id().as_str()));
        Ok(())
    }

    #[test]
    fn session_keyrings_differ_per_session_and_from_the_master() -> TestResult {
        let master = Keyring::generate()?;
        let a = master.session("0011223344556677")?;
        let b = master.session("8899aabbccddeeff")?;
        assert_ne!(a.active_key_id(), b.active_key_id());
        assert!(
            a.active_key_id()
                .as_str()
                .starts_with(master.active_key_id().as_str())
        );
        let again = master.session("0011223344556677")?;
        // Any holder of the key file derives a session's key again from its key id.
        let derived = master.for_session_key_id(a.active_key_id());
        assert_eq!(
            derived
                .as_ref()
                .map(|k| k.active_entry().secret == a.active_entry().secret),
            Some(true)
        );
        assert!(master.for_session_key_id(master.active_key_id()).is_none());
        assert!(
            a.active_entry().secret == again.active_entry().secret,
            "derivation is deterministic"
        );
        assert!(a.active_entry().secret != b.active_entry().secret);
        assert!(a.active_entry().secret != master.active_entry().secret);
        Ok(())
    }

    #[test]
    fn rotation_adds_an_active_key_and_keeps_the_old_one() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys");
        let mut ring = Keyring::generate()?;
        let old = ring.active_key_id().clone();
        ring.write_new(&path)?;
        let new = ring.rotate()?;
        assert_ne!(old, new);
        ring.replace(&path)?;
        let loaded = Keyring::load(&path)?;
        assert_eq!(loaded.active_key_id(), &new);
        assert!(loaded.entry(&old).is_some());
        assert_eq!(std::fs::metadata(&path)?.mode() & 0o777, 0o600);
        let leftovers = std::fs::read_dir(dir.path())?.count();
        assert_eq!(leftovers, 1, "no temporary file is left behind");
        Ok(())
    }

    #[test]
    fn keyrings_are_bounded() -> TestResult {
        let mut ring = Keyring::generate()?;
        for _ in 1..MAX_KEYS {
            ring.rotate()?;
        }
        assert!(matches!(ring.rotate(), Err(KeyError::Keyring(_))));
        Ok(())
    }
}
