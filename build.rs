//! Turns the shipped profiles (TOML, the source of truth that `profile show` prints and
//! whose SHA-256 reports name) into JSON at build time: parsing TOML was a fifth of what a
//! one-shot `run` did before the clone, and JSON of the same shape decodes into the same
//! types an order of magnitude faster. Their SHA-256 is computed here too.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const PROFILES: [&str; 5] = ["default", "strict", "compat", "floor", "floor-allowlist"];

/// Hashes the code and data a compiled seccomp filter depends on: the filter cache
/// (`src/sandbox/filter_cache.rs`) keys its entries with it, so a changed build never
/// reads a filter an older one compiled.
fn filter_build_id() -> String {
    let mut files: Vec<std::path::PathBuf> = ["src/profile", "profiles"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.push("src/sandbox/filter_cache.rs".into());
    files.sort();
    let mut h = Sha256::new();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        h.update(f.to_string_lossy().as_bytes());
        h.update(std::fs::read(f).unwrap_or_default());
    }
    println!("cargo:rerun-if-changed=src/profile");
    println!("cargo:rerun-if-changed=profiles");
    let digest = h.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Links libseccomp from its static archive where the system has one (Debian's and
/// Ubuntu's libseccomp-dev ship it): a short-lived `run` then has one shared object fewer
/// for the dynamic loader to find, map, relocate and resolve before its first instruction
/// (docs/performance.md). The archive is found the way the C compiler finds libraries;
/// where there is none, libseccomp stays a shared library as `libseccomp-sys` asks. The
/// archive comes first on the link line, so the shared library is then not needed.
fn link_libseccomp_statically() {
    println!("cargo:rerun-if-env-changed=HATCHERY_SHARED_LIBSECCOMP");
    if std::env::var_os("HATCHERY_SHARED_LIBSECCOMP").is_some() {
        return;
    }
    let Some(dir) =
        compiler_archive("libseccomp.a").and_then(|a| a.parent().map(Path::to_path_buf))
    else {
        return;
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=static=seccomp");
}

/// The static archive `name` where the C compiler would find it, or `None` (the compiler
/// prints the bare name back when it has none). Only for a build for this machine: the
/// compiler asked is the host's, whose archives would not fit another target. The build
/// script runs again when the archive changes or goes (a compiler upgrade moves it).
fn compiler_archive(name: &str) -> Option<PathBuf> {
    if std::env::var("TARGET").ok() != std::env::var("HOST").ok() {
        return None;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(cc)
        .arg(format!("-print-file-name={name}"))
        .output()
        .ok()?;
    let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let archive = Path::new(&found);
    let archive = archive
        .is_absolute()
        .then(|| archive.canonicalize().ok())
        .flatten()
        .filter(|a| a.is_file())?;
    println!("cargo:rerun-if-changed={}", archive.display());
    Some(archive)
}

/// Links GCC's unwinder from its static archive (`libgcc_eh.a`, with `libgcc.a`: what
/// `gcc -static-libgcc` links) instead of `libgcc_s.so.1`: one shared object fewer to
/// find, map and initialise (its constructor asks the processor for its features, a trap
/// to the hypervisor per question in a VM), and one fewer in the scope of every symbol the
/// loader resolves, at every start. 0.94x the wall time of a `run` (docs/performance.md).
/// The archive of GCC 12 and later asks glibc for `_dl_find_object`, so the binary then
/// needs glibc 2.35 where it runs. Where the C compiler has no such archive, or for
/// another target, the shared library stays; `HATCHERY_SHARED_LIBGCC=1` at build time
/// keeps it too.
fn link_unwinder_statically() {
    println!("cargo:rerun-if-env-changed=HATCHERY_SHARED_LIBGCC");
    if std::env::var_os("HATCHERY_SHARED_LIBGCC").is_some() {
        return;
    }
    // Both archives, as `gcc -static-libgcc` links them: the system's `libgcc_s.so`
    // script brought `libgcc.a` in too (`-lgcc`), and rustc asks for no default libraries.
    let archives: Option<Vec<String>> = ["libgcc_eh.a", "libgcc.a"]
        .iter()
        .map(|name| {
            compiler_archive(name)
                .and_then(|a| a.to_str().map(str::to_string))
                .filter(|a| !a.contains('"'))
        })
        .collect();
    let Some(archives) = archives else {
        return;
    };
    let Ok(out_dir) = std::env::var("OUT_DIR") else {
        return;
    };
    let dir = Path::new(&out_dir).join("unwinder");
    // A linker script named like the shared library, found first on the search path:
    // every `-lgcc_s` (rustc's and the C compiler driver's) then takes the archives.
    let quoted: Vec<String> = archives.iter().map(|a| format!("\"{a}\"")).collect();
    let script = format!("GROUP ( {} )\n", quoted.join(" "));
    if std::fs::create_dir_all(&dir).is_err()
        || std::fs::write(dir.join("libgcc_s.so"), script).is_err()
    {
        return;
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
}

/// Lays out the functions a start runs (`src/hot-functions.txt`, made by
/// `scripts/hot-functions.py`) together at the front of the release binary's `.text`. A
/// start runs about 540 functions spread over 5 MB of code, and the kernel maps code at
/// the first touch, 16 pages at a time: spread, that is a page fault for each scattered
/// page in the supervisor and again in pid 1 (a clone maps code afresh), and more pages
/// to unmap at each exit (docs/performance.md). The list goes to rustc's own linker
/// (`rust-lld`, what rustc links x86-64 Linux binaries with): GNU ld has no such option.
/// Only the release build of `hatchery` takes it. Where rustc has no `rust-lld`, or the
/// build chose its own linker, the layout stays the linker's own and the build says so
/// in a warning; `HATCHERY_NO_FUNCTION_ORDER=1` at build time asks for that quietly.
/// Names the binary does not have (after a toolchain, Cargo.lock or feature change, or
/// with `--target`, those of the crates) are skipped: never a failed link.
fn order_hot_functions() {
    const LIST: &str = "src/hot-functions.txt";
    println!("cargo:rerun-if-changed={LIST}");
    println!("cargo:rerun-if-env-changed=HATCHERY_NO_FUNCTION_ORDER");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    if std::env::var_os("HATCHERY_NO_FUNCTION_ORDER").is_some()
        || std::env::var("PROFILE").ok().as_deref() != Some("release")
    {
        return;
    }
    if let Err(why) = hot_function_link_args(LIST) {
        println!(
            "cargo:warning=the functions a start runs are not laid out together: {why} \
             (a start costs more page faults; HATCHERY_NO_FUNCTION_ORDER=1 silences this)"
        );
    }
}

/// Whether rustc's arguments (`-C opt`, `-Copt` or `-C` then `opt`) choose the linker:
/// name one, its flavour, turn rustc's own lld off, or ask the C compiler for another.
fn chooses_linker<'a>(args: impl Iterator<Item = &'a str>) -> bool {
    let mut codegen_next = false;
    for arg in args {
        let opt = if codegen_next {
            codegen_next = false;
            arg
        } else if arg == "-C" || arg == "--codegen" {
            codegen_next = true;
            continue;
        } else if let Some(opt) = arg.strip_prefix("-C") {
            opt
        } else if let Some(opt) = arg.strip_prefix("--codegen=") {
            opt
        } else {
            continue;
        };
        let (key, value) = opt.split_once('=').unwrap_or((opt, ""));
        let chosen = match key {
            "linker" | "linker-flavor" => true,
            "linker-features" => value.split(',').any(|f| f == "-lld"),
            "link-self-contained" => value
                .split(',')
                .any(|f| f == "-linker" || f == "n" || f == "no" || f == "off" || f == "false"),
            "link-arg" | "link-args" => value.contains("-fuse-ld="),
            _ => false,
        };
        if chosen {
            return true;
        }
    }
    false
}

/// Gives the link arguments that hand `list` to `rust-lld`, or says why it cannot.
fn hot_function_link_args(list: &str) -> Result<(), String> {
    // A linker the build chose itself (the cargo config's `linker`, or `-C linker`,
    // `-C linker-features=-lld`, `-fuse-ld=` in RUSTFLAGS) is kept: these arguments come
    // after RUSTFLAGS and would override it.
    if std::env::var_os("RUSTC_LINKER").is_some() {
        return Err("the cargo config names a linker".into());
    }
    let rustflags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if chooses_linker(rustflags.split('\x1f')) {
        return Err("RUSTFLAGS choose the linker".into());
    }
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?;
    let target = std::env::var("TARGET").map_err(|e| e.to_string())?;
    let list = Path::new(&manifest_dir).join(list);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = std::process::Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("rustc --print sysroot: {e}"))?;
    if !out.status.success() {
        return Err("rustc --print sysroot failed".into());
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let gcc_ld = sysroot.join("lib/rustlib").join(&target).join("bin/gcc-ld");
    if !gcc_ld.join("ld.lld").is_file() {
        return Err(format!(
            "the toolchain has no rust-lld ({})",
            gcc_ld.display()
        ));
    }
    if !list.is_file() {
        return Err(format!("{} is missing", list.display()));
    }
    // The C compiler driver takes `-Wl,` arguments apart at commas.
    let (Some(list_arg), Some(dir_arg)) = (list.to_str(), gcc_ld.to_str()) else {
        return Err("a path that is not UTF-8".into());
    };
    if list_arg.contains(',') {
        return Err(format!("{list_arg} has a comma in its path"));
    }
    // With `--target` (its build directory is named after it) every crate has other
    // hashes than in the plain build the list is made from: only the standard library's
    // and the C functions are found.
    let out_dir = std::env::var("OUT_DIR").unwrap_or_default();
    if Path::new(&out_dir)
        .components()
        .any(|c| c.as_os_str() == target.as_str())
    {
        println!(
            "cargo:warning=a build with --target renames the crates' functions: only the \
             standard library's and the C functions of {} are laid out together; make \
             the list from this build (scripts/hot-functions.py) to lay out the rest",
            list.display()
        );
    }
    for arg in [
        format!("-B{dir_arg}"),
        "-fuse-ld=lld".to_string(),
        format!("-Wl,--symbol-ordering-file={list_arg}"),
        "-Wl,--no-warn-symbol-ordering".to_string(),
    ] {
        println!("cargo:rustc-link-arg-bin=hatchery={arg}");
    }
    Ok(())
}

fn main() {
    println!(
        "cargo:rustc-env=HATCHERY_FILTER_BUILD_ID={}",
        filter_build_id()
    );
    // Which archives the C compiler finds (`compiler_archive`) depends on which compiler.
    println!("cargo:rerun-if-env-changed=CC");
    // The unwinder's directory first on the search path, ahead of any system directory.
    link_unwinder_statically();
    link_libseccomp_statically();
    order_hot_functions();
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into());
    for name in PROFILES {
        let src = format!("profiles/{name}.toml");
        println!("cargo:rerun-if-changed={src}");
        let text = match std::fs::read_to_string(&src) {
            Ok(t) => t,
            Err(e) => {
                println!("cargo:warning={src}: {e}");
                std::process::exit(1);
            }
        };
        let value: toml::Value = match toml::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                println!("cargo:warning={src}: {e}");
                std::process::exit(1);
            }
        };
        let json = match serde_json::to_string(&value) {
            Ok(j) => j,
            Err(e) => {
                println!("cargo:warning={src}: {e}");
                std::process::exit(1);
            }
        };
        if let Err(e) = std::fs::write(Path::new(&out).join(format!("{name}.json")), json) {
            println!("cargo:warning={name}.json: {e}");
            std::process::exit(1);
        }
        // The profile's identity (the SHA-256 of its TOML), so that a run does not hash
        // the source every time.
        let sha: String = Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if let Err(e) = std::fs::write(Path::new(&out).join(format!("{name}.sha256")), sha) {
            println!("cargo:warning={name}.sha256: {e}");
            std::process::exit(1);
        }
    }
}
