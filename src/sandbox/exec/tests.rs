use super::*;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn bind(path: &Path, writable: bool) -> Result<Bind, std::io::Error> {
    let host = check_host_path(path).map_err(std::io::Error::other)?;
    Ok(Bind::same_path(host, writable))
}

fn system() -> Result<Vec<Bind>, std::io::Error> {
    Ok(vec![bind(Path::new("/usr"), false)?])
}

fn script(dir: &Path, name: &str, text: &str, mode: u32) -> Result<PathBuf, std::io::Error> {
    let p = dir.join(name);
    let mut f = File::create(&p)?;
    f.write_all(text.as_bytes())?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
    Ok(p)
}

#[test]
fn shebang_takes_the_first_word_like_the_kernel() {
    assert_eq!(shebang(b"#!/bin/sh\necho"), Some(PathBuf::from("/bin/sh")));
    assert_eq!(
        shebang(b"#! \t/usr/bin/env python3\n"),
        Some(PathBuf::from("/usr/bin/env"))
    );
    assert_eq!(
        shebang(b"#!/usr/bin/perl"),
        Some(PathBuf::from("/usr/bin/perl"))
    );
    assert_eq!(shebang(b"#!   \nx"), None);
    assert_eq!(shebang(b"echo hi"), None);
}

#[test]
fn a_dynamic_elf_names_an_existing_loader() -> TestResult {
    // The test binary itself is a dynamically linked ELF on this kind of host.
    let me = std::fs::canonicalize(std::env::current_exe()?)?;
    let Program::Elf {
        interpreter: Some(interp),
    } = inspect(&check_host_path(&me)?)?
    else {
        panic!("the test binary has no ELF interpreter");
    };
    assert!(interp.is_absolute(), "{}", interp.display());
    let real = std::fs::canonicalize(&interp)?;
    assert!(real.exists());
    Ok(())
}

#[test]
fn garbage_elf_headers_are_errors_not_panics() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut bytes = b"\x7fELF\x02\x01\x01".to_vec();
    bytes.resize(64, 0);
    // e_phoff far beyond the end, 56-byte entries, 1000 of them.
    bytes[0x20..0x28].copy_from_slice(&(1u64 << 40).to_le_bytes());
    bytes[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    bytes[0x38..0x3a].copy_from_slice(&1000u16.to_le_bytes());
    let p = dir.path().join("bad");
    std::fs::write(&p, &bytes)?;
    assert!(
        check_host_path(&p)
            .map_err(|e| e.to_string())
            .and_then(|h| inspect(&h))
            .is_err()
    );
    std::fs::write(&p, b"\x7fELF\x09")?;
    assert!(
        check_host_path(&p)
            .map_err(|e| e.to_string())
            .and_then(|h| inspect(&h))
            .is_err()
    );
    Ok(())
}

#[test]
fn symlinks_directories_and_writable_files_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let base = std::fs::canonicalize(dir.path())?;
    let real = script(&base, "tool", "#!/bin/sh\n", 0o755)?;
    std::os::unix::fs::symlink(&real, base.join("link"))?;
    match check_exec_path(&base.join("link")) {
        Err(PathError::Symlink { target, .. }) => assert_eq!(target, real),
        other => panic!("a symlink was not refused with its real path: {other:?}"),
    }
    assert!(check_exec_path(&base).is_err(), "a directory");
    let plain = script(&base, "data", "x", 0o644)?;
    assert!(check_exec_path(&plain).is_err(), "not executable");
    let open = script(&base, "open", "#!/bin/sh\n", 0o757)?;
    assert!(check_exec_path(&open).is_err(), "world-writable");
    assert!(check_exec_path(&real).is_ok());
    Ok(())
}

#[test]
fn files_must_be_inside_and_not_writable_by_the_sandbox() -> TestResult {
    let dir = tempfile::tempdir()?;
    let base = std::fs::canonicalize(dir.path())?;
    let ro = base.join("ro");
    let rw = base.join("rw");
    std::fs::create_dir_all(&ro)?;
    std::fs::create_dir_all(&rw)?;
    let in_ro = script(&ro, "tool", "#!/usr/bin/nonexistent\n", 0o755)?;
    let in_rw = script(&rw, "tool", "#!/bin/sh\n", 0o755)?;
    let exposures = vec![bind(&ro, false)?, bind(&rw, true)?];
    let sys = system()?;
    let got = resolve(std::slice::from_ref(&in_ro), &sys, &exposures)?;
    assert_eq!(got.files, vec![in_ro.clone()]);
    assert_eq!(
        got.pinned.iter().map(|h| &h.path).collect::<Vec<_>>(),
        vec![&in_ro],
        "a file in an exposed path is pinned"
    );
    assert_eq!(got.notes.len(), 1, "the script's interpreter is not listed");
    let e = resolve(std::slice::from_ref(&in_rw), &sys, &exposures)
        .err()
        .unwrap_or_default();
    assert!(e.contains("--rw"), "{e}");
    let e = resolve(std::slice::from_ref(&in_ro), &sys, &[])
        .err()
        .unwrap_or_default();
    assert!(e.contains("not inside"), "{e}");
    let e = resolve(&[in_ro.clone(), in_ro.clone()], &sys, &exposures)
        .err()
        .unwrap_or_default();
    assert!(e.contains("twice"), "{e}");
    assert!(resolve(&[], &sys, &exposures).is_err());
    Ok(())
}

#[test]
fn exec_dirs_are_carved_out_of_read_rules() {
    let out = without_exec_dirs(&[
        PathBuf::from("/usr"),
        PathBuf::from("/etc"),
        PathBuf::from("/usr/bin/x"),
    ]);
    assert!(out.contains(&PathBuf::from("/etc")));
    assert!(!out.contains(&PathBuf::from("/usr")));
    for p in &out {
        for d in EXEC_DIRS {
            assert!(
                !p.starts_with(d) && !Path::new(d).starts_with(p),
                "{} covers or lies in {d}",
                p.display()
            );
        }
    }
    if Path::new("/usr/lib").is_dir() {
        assert!(out.contains(&PathBuf::from("/usr/lib")), "{out:?}");
    }
}

/// A minimal ELF image: header, one PT_INTERP program header, the path.
fn elf(wide: bool, big: bool, interp: &[u8]) -> Vec<u8> {
    let (ehsize, phentsize) = if wide { (64usize, 56usize) } else { (52, 32) };
    let mut b = vec![0u8; ehsize + phentsize];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = if wide { 2 } else { 1 };
    b[5] = if big { 2 } else { 1 };
    let put = |b: &mut Vec<u8>, at: usize, v: u64, n: usize| {
        let bytes = if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        let bytes = if big { &bytes[8 - n..] } else { &bytes[..n] };
        b[at..at + n].copy_from_slice(bytes);
    };
    let path_at = (ehsize + phentsize) as u64;
    let size = interp.len() as u64 + 1;
    if wide {
        put(&mut b, 0x20, ehsize as u64, 8);
        put(&mut b, 0x36, phentsize as u64, 2);
        put(&mut b, 0x38, 1, 2);
        put(&mut b, ehsize, 3, 4);
        put(&mut b, ehsize + 8, path_at, 8);
        put(&mut b, ehsize + 32, size, 8);
    } else {
        put(&mut b, 0x1c, ehsize as u64, 4);
        put(&mut b, 0x2a, phentsize as u64, 2);
        put(&mut b, 0x2c, 1, 2);
        put(&mut b, ehsize, 3, 4);
        put(&mut b, ehsize + 4, path_at, 4);
        put(&mut b, ehsize + 16, size, 4);
    }
    b.extend_from_slice(interp);
    b.push(0);
    b
}

proptest::proptest! {
    #[test]
    fn the_elf_reader_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let mut image = b"\x7fELF".to_vec();
        image.extend_from_slice(&bytes);
        let _ = elf_interpreter(image.as_slice());
        let _ = shebang(&bytes);
    }

    #[test]
    fn the_interpreter_is_read_back_in_every_class_and_byte_order(
        wide in proptest::prelude::any::<bool>(),
        big in proptest::prelude::any::<bool>(),
        path in "/[a-z0-9/._-]{1,200}",
    ) {
        let image = elf(wide, big, path.as_bytes());
        proptest::prop_assert_eq!(elf_interpreter(image.as_slice()), Ok(Some(PathBuf::from(&path))));
    }
}

#[test]
fn an_interpreter_without_its_nul_is_refused() {
    let mut image = elf(true, false, b"/lib/ld.so");
    image.pop();
    image.push(b'x');
    assert!(elf_interpreter(image.as_slice()).is_err());
}
