//! Key files on disk: a keyring is read only from a regular file owned by the effective
//! user with no group or other permissions, opened without following symlinks, and
//! written new (0600, never over anything) or replaced atomically.
//!
//! Why apart from `signing`: signing and verifying are pure (bytes in, verdict out); what
//! a file system can do to a key file — a planted symlink, a FIFO, another owner — is this
//! module's, with the system calls it needs.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::signing::keys::{MAX_KEY_FILE_BYTES, file_err, parse};
use crate::signing::{KeyError, Keyring};

impl Keyring {
    /// Reads a key file, refusing it unless it is a regular file owned by the effective
    /// user with no group or other permissions.
    pub fn load(path: &Path) -> Result<Keyring, KeyError> {
        let file = open_private(path)?;
        let mut text = String::new();
        file.take(MAX_KEY_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| file_err(path, format!("cannot read: {}", io_reason(&e))))?;
        if text.len() as u64 > MAX_KEY_FILE_BYTES {
            return Err(file_err(
                path,
                format!("larger than {MAX_KEY_FILE_BYTES} bytes"),
            ));
        }
        parse(path, &text)
    }

    /// Loads the key file, or creates it with one new key when it does not exist (first
    /// start). Returns whether it was created.
    pub fn load_or_generate(path: &Path) -> Result<(Keyring, bool), KeyError> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => Ok((Keyring::load(path)?, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let ring = Keyring::generate()?;
                match ring.write_new(path) {
                    Ok(()) => Ok((ring, true)),
                    // Someone else created it between our look and our create: use theirs.
                    Err(KeyError::Exists { .. }) => Ok((Keyring::load(path)?, false)),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(file_err(path, io_reason(&e))),
        }
    }

    /// Writes the keyring to a new file (mode 0600); refuses to overwrite anything.
    pub fn write_new(&self, path: &Path) -> Result<(), KeyError> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => KeyError::Exists {
                    path: path.to_path_buf(),
                },
                _ => file_err(path, format!("cannot create: {}", io_reason(&e))),
            })?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| file_err(path, io_reason(&e)))?;
        file.write_all(self.to_file_text().as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| file_err(path, format!("cannot write: {}", io_reason(&e))))?;
        sync_parent(path);
        Ok(())
    }

    /// Replaces an existing key file atomically (a new file beside it, then rename), after
    /// checking the existing one passes the same ownership and mode checks as [`load`].
    ///
    /// [`load`]: Keyring::load
    pub fn replace(&self, path: &Path) -> Result<(), KeyError> {
        drop(open_private(path)?);
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix).map_err(|e| KeyError::Random(e.to_string()))?;
        let name = path
            .file_name()
            .ok_or_else(|| file_err(path, "not a file name".to_string()))?;
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp-{}", hex::encode(suffix)));
        let tmp = path.with_file_name(tmp_name);
        self.write_new(&tmp)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            file_err(path, format!("cannot replace: {}", io_reason(&e)))
        })?;
        sync_parent(path);
        Ok(())
    }
}

/// The reason of an I/O error without anything that could echo file content.
fn io_reason(e: &std::io::Error) -> String {
    match (e.raw_os_error(), e.kind()) {
        (Some(libc::ELOOP), _) => "is a symlink; name the real file".to_string(),
        (_, std::io::ErrorKind::NotFound) => {
            "does not exist (create one with `hatchery manifest keygen --key FILE`)".to_string()
        }
        (_, kind) => kind.to_string(),
    }
}

/// Opens a key file for reading after the ownership and mode checks (on the open file, so
/// the checked file is the one read).
fn open_private(path: &Path) -> Result<File, KeyError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| file_err(path, format!("cannot open: {}", io_reason(&e))))?;
    let meta = file.metadata().map_err(|e| file_err(path, io_reason(&e)))?;
    if !meta.is_file() {
        return Err(file_err(path, "not a regular file".to_string()));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(KeyError::Owner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            euid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(file)
}

/// Makes a create or rename durable; best effort, since the file itself is already synced.
fn sync_parent(path: &Path) {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(dir) = File::open(parent) {
        let _ = dir.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn write_mode(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
        std::fs::write(path, text)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }

    #[test]
    fn generated_key_files_are_private_and_load_back() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys");
        let ring = Keyring::generate()?;
        ring.write_new(&path)?;
        let meta = std::fs::metadata(&path)?;
        assert_eq!(meta.mode() & 0o777, 0o600);
        let loaded = Keyring::load(&path)?;
        assert_eq!(loaded.active_key_id(), ring.active_key_id());
        assert!(matches!(
            ring.write_new(&path),
            Err(KeyError::Exists { .. })
        ));
        Ok(())
    }

    #[test]
    fn readable_by_others_is_refused() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys");
        Keyring::generate()?.write_new(&path)?;
        for mode in [0o644, 0o640, 0o604, 0o660, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            assert!(
                matches!(Keyring::load(&path), Err(KeyError::Permissions { .. })),
                "mode {mode:o} accepted"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400))?;
        assert!(Keyring::load(&path).is_ok(), "0400 is stricter than 0600");
        Ok(())
    }

    #[test]
    fn symlinks_and_directories_are_refused() -> TestResult {
        let dir = tempfile::tempdir()?;
        let real = dir.path().join("keys");
        Keyring::generate()?.write_new(&real)?;
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link)?;
        match Keyring::load(&link) {
            Err(KeyError::File { why, .. }) => assert!(why.contains("symlink"), "{why}"),
            other => panic!("symlink accepted: {other:?}"),
        }
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub)?;
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700))?;
        assert!(Keyring::load(&sub).is_err());
        Ok(())
    }

    #[test]
    fn files_owned_by_someone_else_are_refused() -> TestResult {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP files_owned_by_someone_else_are_refused: needs root to chown");
            return Ok(());
        }
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys");
        Keyring::generate()?.write_new(&path)?;
        std::os::unix::fs::chown(&path, Some(65534), Some(65534))?;
        assert!(matches!(Keyring::load(&path), Err(KeyError::Owner { .. })));
        Ok(())
    }

    #[test]
    fn syntax_errors_name_the_line_but_never_show_it() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys");
        let secret = "ab".repeat(31); // 62 digits: one byte short
        let text = format!("# comment\nactive k1\nkey k1 {secret}\n");
        write_mode(&path, &text, 0o600)?;
        match Keyring::load(&path) {
            Err(e @ KeyError::Syntax { line: 3, .. }) => {
                assert!(!e.to_string().contains(&secret), "{e}");
                assert!(!format!("{e:?}").contains(&secret), "{e:?}");
            }
            other => panic!("expected a syntax error on line 3, got {other:?}"),
        }
        let cases = [
            ("key k1 x y z\n", 1),
            ("active k1\nactive k1\n", 2),
            ("active k1\nkey k1 UPPER\n", 2),
        ];
        for (text, line) in cases {
            write_mode(&path, text, 0o600)?;
            match Keyring::load(&path) {
                Err(KeyError::Syntax { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn the_active_key_must_be_listed_and_ids_unique() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys");
        let k = "01".repeat(32);
        let k2 = "02".repeat(32);
        for text in [
            format!("active k2\nkey k1 {k}\n"),
            format!("active k1\nkey k1 {k}\nkey k1 {k2}\n"),
            format!("active k1\nkey k1 {k}\nkey k2 {k}\n"),
            format!("key k1 {k}\n"),
            format!("active k1\nkey k1 {}\n", "00".repeat(32)),
        ] {
            write_mode(&path, &text, 0o600)?;
            assert!(Keyring::load(&path).is_err(), "{text}");
        }
        Ok(())
    }

    #[test]
    fn load_or_generate_creates_once_then_loads() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys");
        let (first, created) = Keyring::load_or_generate(&path)?;
        assert!(created);
        let (second, created) = Keyring::load_or_generate(&path)?;
        assert!(!created);
        assert_eq!(first.active_key_id(), second.active_key_id());
        Ok(())
    }
}
