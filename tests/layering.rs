//! The trust core stays pure: what decides who may exist (manifests, their signatures, the
//! replication contract, and the controller's admission decisions) imports nothing that
//! makes system calls or runs tasks. A change that reaches from these modules into
//! `sandbox`, `nix`, `libc` or `tokio` fails here, not in a review.

use std::path::{Path, PathBuf};

/// Modules (files or directories under `src/`) that must stay pure.
const PURE: &[&str] = &[
    "signing",
    "manifest",
    "contract",
    "controller/admission",
    "controller/admission.rs",
];

/// What the pure modules may not name.
const FORBIDDEN_PATHS: &[&str] = &["crate::sandbox", "super::sandbox"];
const FORBIDDEN_CRATES: &[&str] = &["nix", "libc", "tokio"];

fn rust_files(root: &Path, out: &mut Vec<PathBuf>) {
    if root.is_file() {
        out.push(root.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a line without its comment (a `//` outside a string is enough here: the
/// pure modules do not put `//` in string literals next to these names).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

#[test]
fn the_trust_core_imports_nothing_that_touches_the_system() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for module in PURE {
        rust_files(&src.join(module), &mut files);
    }
    assert!(
        files.iter().any(|f| f.starts_with(src.join("signing"))),
        "the layering check found none of the trust core's files"
    );
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let code = code(line);
            let words: Vec<&str> = code
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .collect();
            let hit = FORBIDDEN_PATHS.iter().any(|p| code.contains(p))
                || FORBIDDEN_CRATES.iter().any(|c| words.contains(c));
            if hit {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    found.dedup();
    assert!(
        found.is_empty(),
        "the trust core reaches out:\n{}",
        found.join("\n")
    );
}
