//! `ManifestSigner`: HMAC-SHA256 signatures over manifests, and their verification.
//!
//! The MAC covers the canonical encoding of every manifest field except the signature
//! (`crate::manifest::canonical`). [`ManifestSigner::verify`] (and its variants
//! `verify_owned`, `verify_json`) is the one door a manifest goes through before anything
//! acts on it; it runs these checks in this order and
//! reports the first that fails as a [`VerifyError`] naming the check:
//!
//! 1. format — every field in bounds, the fields consistent with each other;
//! 2. signature present and well-formed (64 lowercase hex digits);
//! 3. key_id — a key of the keyring (the active one or one kept after a rotation);
//! 4. signature — the MAC matches, compared in constant time;
//! 5. issued_at / expires_at — `issued_at <= now + skew` and `now < expires_at`;
//! 6. nonce — not seen before (then remembered until the manifest expires).
//!
//! The cryptographic checks come before the time and replay checks so that nothing an
//! attacker writes reaches the nonce memory without a valid signature. A successful
//! verification returns a [`VerifiedManifest`], which only this module can make: code
//! that needs a verified manifest says so in its types.

pub mod keys;
pub mod replay;

use std::ops::Deref;

use hmac::Mac;

use crate::manifest::fields::decode_lower_hex;
use crate::manifest::{
    FieldError, KeyId, Lineage, Manifest, ManifestError, Nonce, SpawnRequest, Validity, canonical,
};

pub use keys::{KeyError, Keyring, SecretKey};
pub use replay::{DEFAULT_NONCE_CAPACITY, NonceMemory, ReplayError};

/// How far in the future `issued_at` may be (clocks of the signer and the verifier).
pub const DEFAULT_CLOCK_SKEW_SECONDS: u64 = 30;
/// Length of a signature: HMAC-SHA256, 32 bytes.
pub const SIGNATURE_BYTES: usize = 32;

/// Why a manifest was refused. [`VerifyError::check`] names the failed check in one word;
/// [`VerifyError::audit_event`] is the audit trail's event name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    #[error("format: {0}")]
    Malformed(#[from] ManifestError),
    #[error("signature: missing (the manifest is unsigned)")]
    MissingSignature,
    #[error("signature: {0}")]
    MalformedSignature(String),
    #[error("key_id: {0} is not in the keyring (an unknown or retired key)")]
    UnknownKey(KeyId),
    #[error("signature: does not match (a signed field was changed, or another key signed it)")]
    BadSignature,
    #[error("issued_at: {issued_at} is in the future (now is {now})")]
    NotYetValid { issued_at: u64, now: u64 },
    #[error("expires_at: the manifest expired at {expires_at} (now is {now})")]
    Expired { expires_at: u64, now: u64 },
    #[error("nonce: {0} was already used (a replayed manifest)")]
    Replayed(Nonce),
    #[error(
        "nonce: the replay memory is full ({capacity} unexpired nonces); refusing rather than forgetting one"
    )]
    ReplayMemoryFull { capacity: usize },
}

impl VerifyError {
    /// The check that failed, in one word.
    pub fn check(&self) -> &'static str {
        match self {
            VerifyError::Malformed(_) => "format",
            VerifyError::MissingSignature
            | VerifyError::MalformedSignature(_)
            | VerifyError::BadSignature => "signature",
            VerifyError::UnknownKey(_) => "key_id",
            VerifyError::NotYetValid { .. } => "issued_at",
            VerifyError::Expired { .. } => "expires_at",
            VerifyError::Replayed(_) | VerifyError::ReplayMemoryFull { .. } => "nonce",
        }
    }

    /// The audit event: the seed's `reject_manifest_signature` for anything that is not an
    /// authentic manifest, and two names of ours for authentic ones refused on time or
    /// replay (they are different incidents: a stale or a duplicated grant, not a forgery).
    pub fn audit_event(&self) -> &'static str {
        match self {
            VerifyError::NotYetValid { .. } | VerifyError::Expired { .. } => {
                "reject_manifest_expired"
            }
            VerifyError::Replayed(_) | VerifyError::ReplayMemoryFull { .. } => {
                "reject_manifest_replay"
            }
            _ => "reject_manifest_signature",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("cannot sign an invalid manifest: {0}")]
    Invalid(#[from] FieldError),
    #[error("cannot make a nonce: the system random source failed: {0}")]
    Random(String),
}

/// A manifest that passed every check of [`ManifestSigner::verify`]. Only this module
/// makes them.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedManifest(Manifest);

impl VerifiedManifest {
    pub fn manifest(&self) -> &Manifest {
        &self.0
    }

    pub fn into_manifest(self) -> Manifest {
        self.0
    }
}

impl VerifiedManifest {
    /// The files of `filesystem.allow_exec` as paths; empty when the manifest has no
    /// allowlist (what `Profile::narrow_exec` takes as "no change").
    pub fn allowed_executables(&self) -> Vec<std::path::PathBuf> {
        self.0
            .filesystem
            .allow_exec
            .iter()
            .flatten()
            .map(|p| p.as_path().to_path_buf())
            .collect()
    }
}

impl Deref for VerifiedManifest {
    type Target = Manifest;
    fn deref(&self) -> &Manifest {
        &self.0
    }
}

/// Signs manifests with the keyring's active key and verifies them against every key of
/// the keyring, remembering nonces to refuse replays.
#[derive(Debug)]
pub struct ManifestSigner {
    keyring: Keyring,
    nonces: NonceMemory,
    clock_skew: u64,
}

impl ManifestSigner {
    pub fn new(keyring: Keyring) -> ManifestSigner {
        ManifestSigner {
            keyring,
            nonces: NonceMemory::default(),
            clock_skew: DEFAULT_CLOCK_SKEW_SECONDS,
        }
    }

    /// Sets how many unexpired nonces are remembered (see [`replay`]).
    pub fn with_nonce_capacity(mut self, capacity: usize) -> ManifestSigner {
        self.nonces = NonceMemory::new(capacity);
        self
    }

    /// Sets how far in the future `issued_at` may be.
    pub fn with_clock_skew(mut self, seconds: u64) -> ManifestSigner {
        self.clock_skew = seconds;
        self
    }

    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// Rotates the keyring: a new active key; manifests signed with the old keys still
    /// verify.
    pub fn rotate(&mut self) -> Result<KeyId, KeyError> {
        self.keyring.rotate()
    }

    pub fn nonce_memory(&self) -> &NonceMemory {
        &self.nonces
    }

    /// Signs `m` with the active key: sets `key_id`, then `signature`. Refuses a manifest
    /// that would not pass verification's format check.
    pub fn sign(&self, m: &mut Manifest) -> Result<(), SignError> {
        m.validate()?;
        let entry = self.keyring.active_entry();
        m.key_id = entry.id.clone();
        m.signature = hex::encode(mac_of(&entry.mac, m));
        Ok(())
    }

    /// Issues a new signed manifest for `lineage` with a fresh random nonce.
    pub fn issue(
        &self,
        lineage: Lineage,
        job: SpawnRequest,
        validity: Validity,
    ) -> Result<Manifest, SignError> {
        let nonce = Nonce::random().map_err(|e| SignError::Random(e.to_string()))?;
        let mut m = Manifest::unsigned(
            self.keyring.active_key_id().clone(),
            lineage,
            validity,
            nonce,
            job,
        );
        self.sign(&mut m)?;
        Ok(m)
    }

    /// Checks 1–4 of the module documentation: the manifest is well-formed and was
    /// signed by a key of the keyring.
    pub fn check_signature(&self, m: &Manifest) -> Result<(), VerifyError> {
        m.validate()
            .map_err(|e| VerifyError::Malformed(ManifestError::Invalid(e)))?;
        if m.signature.is_empty() {
            return Err(VerifyError::MissingSignature);
        }
        let tag = decode_lower_hex::<SIGNATURE_BYTES>(&m.signature)
            .ok_or_else(|| VerifyError::MalformedSignature(describe_bad_signature(&m.signature)))?;
        let entry = self
            .keyring
            .entry(&m.key_id)
            .ok_or_else(|| VerifyError::UnknownKey(m.key_id.clone()))?;
        let mut mac = entry.mac.clone();
        mac.update(&canonical::encode(m));
        // `verify_slice` compares in constant time.
        mac.verify_slice(&tag)
            .map_err(|_| VerifyError::BadSignature)
    }

    fn check_time(&self, m: &Manifest, now: u64) -> Result<(), VerifyError> {
        let issued_at = m.issued_at.get();
        if issued_at > now.saturating_add(self.clock_skew) {
            return Err(VerifyError::NotYetValid { issued_at, now });
        }
        if m.is_expired(now) {
            return Err(VerifyError::Expired {
                expires_at: m.expires_at.get(),
                now,
            });
        }
        Ok(())
    }

    /// Checks 1–5 without touching the nonce memory: for auditors and for re-checking a
    /// manifest already registered. Never use it to admit a worker: it accepts replays.
    pub fn authenticate(&self, m: &Manifest, now: u64) -> Result<(), VerifyError> {
        self.check_signature(m)?;
        self.check_time(m, now)
    }

    /// Checks 5 and 6 after 1–4 passed; on success the nonce is remembered.
    fn check_fresh(&mut self, m: &Manifest, now: u64) -> Result<(), VerifyError> {
        // The memory's clock never runs backwards; see `replay`.
        let now = self.nonces.advance(now);
        self.check_time(m, now)?;
        self.nonces
            .insert(m.nonce, m.expires_at.get())
            .map_err(|e| match e {
                ReplayError::Seen => VerifyError::Replayed(m.nonce),
                ReplayError::Full { capacity } => VerifyError::ReplayMemoryFull { capacity },
            })
    }

    /// Every check, in the order of the module documentation; on success the nonce is
    /// remembered, so the same manifest is refused next time.
    pub fn verify(&mut self, m: &Manifest, now: u64) -> Result<VerifiedManifest, VerifyError> {
        self.check_signature(m)?;
        self.check_fresh(m, now)?;
        Ok(VerifiedManifest(m.clone()))
    }

    /// [`verify`](ManifestSigner::verify) for a manifest the caller no longer needs if it
    /// is refused (no copy is made).
    pub fn verify_owned(&mut self, m: Manifest, now: u64) -> Result<VerifiedManifest, VerifyError> {
        self.check_signature(&m)?;
        self.check_fresh(&m, now)?;
        Ok(VerifiedManifest(m))
    }

    /// Decodes JSON bytes ([`Manifest::from_json`]) and verifies the result.
    pub fn verify_json(&mut self, bytes: &[u8], now: u64) -> Result<VerifiedManifest, VerifyError> {
        let m = Manifest::from_json(bytes)?;
        self.verify_owned(m, now)
    }
}

/// The MAC of `m`'s canonical encoding under the keyed state `keyed`. The encoding is
/// built in one buffer and fed to the MAC at once: a few dozen small updates cost more
/// than the copy.
fn mac_of(keyed: &hmac::Hmac<sha2::Sha256>, m: &Manifest) -> [u8; SIGNATURE_BYTES] {
    let mut mac = keyed.clone();
    mac.update(&canonical::encode(m));
    mac.finalize().into_bytes().into()
}

fn describe_bad_signature(sig: &str) -> String {
    let hexdigits = sig.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if hexdigits && sig.len() < 2 * SIGNATURE_BYTES {
        format!(
            "truncated ({} of {} hex digits)",
            sig.len(),
            2 * SIGNATURE_BYTES
        )
    } else {
        format!(
            "malformed (expected {} lowercase hex digits)",
            2 * SIGNATURE_BYTES
        )
    }
}

#[cfg(test)]
mod tests;
