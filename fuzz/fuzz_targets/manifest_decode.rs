//! Manifest decoding and verification on arbitrary bytes: never a panic; whatever decodes
//! survives a JSON round trip with the same signed bytes; a forged input never verifies.
#![no_main]

use hatchery::manifest::{Manifest, canonical};
use hatchery::signing::{Keyring, ManifestSigner, SecretKey};
use libfuzzer_sys::fuzz_target;

fn signer() -> ManifestSigner {
    let key = match SecretKey::from_bytes([0x5a; 32]) {
        Ok(k) => k,
        Err(e) => panic!("{e}"),
    };
    let id = match key.fingerprint_id() {
        Ok(id) => id,
        Err(e) => panic!("{e}"),
    };
    match Keyring::single(id, key) {
        Ok(ring) => ManifestSigner::new(ring),
        Err(e) => panic!("{e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut verifier = signer();
    let verdict = verifier.verify_json(data, 1_700_000_000);
    let Ok(m) = Manifest::from_json(data) else {
        assert!(verdict.is_err(), "undecodable bytes verified");
        return;
    };
    let json = match m.to_json() {
        Ok(j) => j,
        Err(e) => panic!("a decoded manifest does not encode: {e}"),
    };
    match Manifest::from_json(json.as_bytes()) {
        Ok(again) => assert_eq!(canonical::encode(&again), canonical::encode(&m)),
        Err(e) => panic!("a decoded manifest does not decode again: {e}"),
    }
    if verdict.is_ok() {
        // Only possible if the input carries the MAC this key gives it.
        let mut resigned = m.clone();
        if signer().sign(&mut resigned).is_err() || resigned.signature != m.signature {
            panic!("a manifest verified with a signature the key did not make");
        }
    }
});
