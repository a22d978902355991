//! Text that reached the controller from a worker or a sandbox (a replication's reason, a
//! command, a path, a failure's detail), made fit for the operator's terminal: a worker
//! chooses every character of it, and an escape sequence printed raw can clear the screen
//! and draw a fake listing where a person decides, or reorder what is read (bidirectional
//! overrides, invisible characters).

/// `s` with its control and invisible formatting characters written as escapes
/// (`\u{1b}`, `\u{202e}`); everything else as it is.
pub fn shown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || is_format(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Unicode's invisible formatting characters most used to deceive (most of category Cf):
/// bidirectional embeddings, overrides, isolates and marks, zero-width spaces and
/// joiners, the byte-order mark, interlinear annotations and tags. Spaces, line
/// separators and look-alike letters are shown as they are.
fn is_format(c: char) -> bool {
    matches!(
        c as u32,
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn control_and_invisible_characters_are_shown_as_escapes() {
        assert_eq!(
            shown("cwd \u{1b}[2J/x\r\nok: \u{e9}"),
            "cwd \\u{1b}[2J/x\\r\\nok: \u{e9}"
        );
        assert_eq!(
            shown("/tmp/\u{202e}evil\u{200b}\u{2066}txt.exe\u{feff}"),
            "/tmp/\\u{202e}evil\\u{200b}\\u{2066}txt.exe\\u{feff}"
        );
        assert_eq!(
            shown("plain text, ünïcödé, 漢字"),
            "plain text, ünïcödé, 漢字"
        );
    }
}
