//! `hatchery manifest contract`: contract files checked from outside.

mod common;

use std::path::Path;

use common::{code, hatchery_cmd, stderr, stdout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn check(path: &Path) -> std::process::Output {
    match path.to_str() {
        Some(p) => hatchery_cmd(&["manifest", "contract", p]),
        None => panic!("test paths are UTF-8"),
    }
}

#[test]
fn without_a_file_the_built_in_contract_is_printed() {
    let out = hatchery_cmd(&["manifest", "contract"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    for line in [
        "max_depth = 3",
        "max_replicas = 8",
        "cooldown_seconds = 5",
        "expiration_seconds = 3600",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

#[test]
fn a_contract_file_is_printed_with_defaults_filled_in_and_reads_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("contract.toml");
    std::fs::write(
        &file,
        "max_depth = 2\n\n[[stop_condition]]\nkind = \"spawn_rate\"\nmax_spawns = 20\nwindow_seconds = 3600\n\n[profile_narrowing]\ndefault = [\"strict\"]\n",
    )?;
    let out = check(&file);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("max_depth = 2"), "{text}");
    assert!(text.contains("max_replicas = 8"), "{text}");
    assert!(text.contains("kind = \"spawn_rate\""), "{text}");
    let again = dir.path().join("again.toml");
    std::fs::write(&again, &out.stdout)?;
    let out2 = check(&again);
    assert_eq!(code(&out2), 0, "{}", stderr(&out2));
    assert_eq!(stdout(&out2), text, "the printed contract is a fixed point");
    Ok(())
}

#[test]
fn an_unknown_key_is_refused_with_its_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("contract.toml");
    std::fs::write(&file, "max_depth = 2\nmax_replica = 4\n")?;
    let out = check(&file);
    assert_eq!(code(&out), 2);
    let err = stderr(&out);
    assert!(
        err.contains("line 2") && err.contains("max_replica"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    Ok(())
}

#[test]
fn an_out_of_range_value_is_refused_with_its_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("contract.toml");
    std::fs::write(&file, "# depth\n\nmax_depth = 1000\n")?;
    let out = check(&file);
    assert_eq!(code(&out), 2);
    let err = stderr(&out);
    assert!(err.contains("line 3") && err.contains("max_depth"), "{err}");
    Ok(())
}

#[test]
fn a_missing_contract_file_is_an_error() {
    let out = hatchery_cmd(&["manifest", "contract", "/nonexistent/contract.toml"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("/nonexistent/contract.toml"));
}
