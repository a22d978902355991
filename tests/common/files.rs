//! Small file and JSON helpers for tests that write profiles and read JSON output.

use std::path::{Path, PathBuf};

/// `text` as JSON, or the test fails saying what it got.
pub fn json(text: &str) -> serde_json::Value {
    match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => panic!("not JSON ({e}): {text}"),
    }
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    if let Err(e) = std::fs::write(&p, text) {
        panic!("write {}: {e}", p.display());
    }
    p
}

/// A path as a command-line word.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}
