//! What the binary loads at every start: the build links GCC's unwinder and libseccomp from
//! their static archives where the C compiler has them (build.rs), so that a short-lived
//! `run` does not map, relocate and initialise two more shared objects
//! (docs/performance.md). A toolchain or build-script change that quietly brings either
//! back costs every start about 5 %; these tests say so instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The shared objects an ELF file names as needed (`DT_NEEDED`), read by `readelf`.
fn needed(binary: &Path) -> Vec<String> {
    let out = common::run_with_timeout(
        Command::new("readelf").arg("-dW").arg(binary),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "readelf -d {}: {}",
        binary.display(),
        common::stderr(&out)
    );
    common::stdout(&out)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| {
            let start = l.find('[')?.checked_add(1)?;
            let end = l.rfind(']')?;
            l.get(start..end).map(str::to_string)
        })
        .collect()
}

/// The archive `name` where the C compiler finds it (as build.rs asks), if it has one.
/// Asked again here rather than taken from the build script, so that a build script that
/// decides wrongly, or a link that ignores its decision, fails these tests.
fn compiler_archive(name: &str) -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = common::run_with_timeout(
        Command::new(cc).arg(format!("-print-file-name={name}")),
        Duration::from_secs(30),
    );
    let path = PathBuf::from(common::stdout(&out).trim());
    (path.is_absolute() && path.is_file()).then_some(path)
}

#[test]
fn the_binary_loads_no_shared_unwinder_where_gcc_has_its_archive() {
    // build.rs links both archives or neither.
    if option_env!("HATCHERY_SHARED_LIBGCC").is_some()
        || compiler_archive("libgcc_eh.a").is_none()
        || compiler_archive("libgcc.a").is_none()
    {
        eprintln!(
            "skipped: the build keeps libgcc_s.so.1 (no libgcc_eh.a or libgcc.a, or asked to)"
        );
        return;
    }
    let libs = needed(&common::hatchery());
    assert!(
        libs.iter().any(|l| l.starts_with("libc.so")),
        "readelf found no libc: {libs:?}"
    );
    assert!(
        !libs.iter().any(|l| l.starts_with("libgcc_s")),
        "the binary needs {libs:?}: build.rs should have linked libgcc_eh.a"
    );
}

#[test]
fn the_binary_loads_no_shared_libseccomp_where_its_archive_exists() {
    if option_env!("HATCHERY_SHARED_LIBSECCOMP").is_some()
        || compiler_archive("libseccomp.a").is_none()
    {
        eprintln!("skipped: the build keeps libseccomp.so (no libseccomp.a, or asked to)");
        return;
    }
    let libs = needed(&common::hatchery());
    assert!(
        !libs.iter().any(|l| l.starts_with("libseccomp")),
        "the binary needs {libs:?}: build.rs should have linked libseccomp.a"
    );
}
