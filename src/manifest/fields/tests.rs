use super::*;

#[test]
fn numbers_outside_their_bounds_are_refused() {
    assert!(Depth::new(MAX_DEPTH + 1).is_err());
    assert!(MemoryMb::new(0).is_err());
    assert!(MemoryMb::new(MAX_MEMORY_MB + 1).is_err());
    assert!(MemoryMb::try_from(u64::MAX).is_err());
    assert!(PidsLimit::new(0).is_err());
    assert!(TimeoutMs::new(0).is_err());
    assert!(TimeoutMs::new(MAX_TIMEOUT_MS + 1).is_err());
    assert!(UnixSeconds::new(MAX_UNIX_SECONDS + 1).is_err());
    assert!(Depth::try_from(u64::from(u32::MAX) + 1).is_err());
    for bad in [
        0.0,
        -0.0,
        -1.0,
        f64::NAN,
        f64::INFINITY,
        0.001,
        1024.5,
        0.0005,
        0.5001,
    ] {
        assert!(CpuLimit::new(bad).is_err(), "{bad} accepted");
    }
    assert_eq!(CpuLimit::new(0.5).map(CpuLimit::get), Ok(0.5));
    assert_eq!(CpuLimit::new(0.01).map(CpuLimit::millicores), Ok(10));
    assert_eq!(
        CpuLimit::new(1024.0).map(CpuLimit::millicores),
        Ok(1_024_000)
    );
    // A few ulps off (a lossy float parser) is still the same quota.
    assert_eq!(
        CpuLimit::new(0.123_000_000_000_001).map(CpuLimit::millicores),
        Ok(123)
    );
}

#[test]
fn depth_stops_at_the_maximum() -> Result<(), FieldError> {
    assert_eq!(Depth::new(0)?.child(), Some(Depth::new(1)?));
    assert_eq!(Depth::new(MAX_DEPTH)?.child(), None);
    Ok(())
}

#[test]
fn identifiers_refuse_separators_and_control_characters() {
    for bad in [
        "",
        "-lead",
        ".hidden",
        "a/b",
        "a b",
        "a\nb",
        "é",
        &"x".repeat(65),
    ] {
        assert!(WorkerId::new(bad).is_err(), "{bad:?} accepted");
    }
    assert!(WorkerId::new("w-1.a_B").is_ok());
}

#[test]
fn nonces_have_one_spelling() {
    let lower = "00112233445566778899aabbccddeeff".to_string();
    assert!(Nonce::try_from(lower.clone()).is_ok());
    assert!(Nonce::try_from(lower.to_uppercase()).is_err());
    assert!(Nonce::try_from(lower[..30].to_string()).is_err());
    assert!(Nonce::try_from(format!("{lower}00")).is_err());
}

#[test]
fn exposed_paths_must_be_absolute_and_normal() {
    for bad in [
        "relative", "/", "/a/../b", "/a/./b", "/a//b", "/a/b/", "/a\nb", "",
    ] {
        assert!(ExposedPath::new(bad).is_err(), "{bad:?} accepted");
    }
    assert!(ExposedPath::new("/srv/data").is_ok());
    for bad in [
        "python3",
        "/",
        "/usr/bin/../bin/sh",
        "/usr//bin/sh",
        "/usr/bin/",
    ] {
        assert!(ExecPath::new(bad).is_err(), "{bad:?} accepted");
    }
    assert!(ExecPath::new("/usr/bin/python3.11").is_ok());
}

#[test]
fn output_caps_are_bounded() {
    assert!(OutputBytes::new(0).is_err());
    assert!(OutputBytes::new(units::MAX_OUTPUT_BYTES + 1).is_err());
    assert_eq!(OutputBytes::new(1).map(OutputBytes::get), Ok(1));
}

#[test]
fn within_compares_whole_components() -> Result<(), FieldError> {
    let data = ExposedPath::new("/data")?;
    assert!(ExposedPath::new("/data")?.is_within(&data));
    assert!(ExposedPath::new("/data/x/y")?.is_within(&data));
    assert!(!ExposedPath::new("/data2")?.is_within(&data));
    assert!(!data.is_within(&ExposedPath::new("/data/x")?));
    Ok(())
}

#[test]
fn state_snapshots_are_bounded() {
    assert!(StateSnapshot::new("x".repeat(MAX_STATE_SNAPSHOT_BYTES)).is_ok());
    assert!(StateSnapshot::new("x".repeat(MAX_STATE_SNAPSHOT_BYTES + 1)).is_err());
    assert!(StateSnapshot::new("a\0b").is_err());
}
