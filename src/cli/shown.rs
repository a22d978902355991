//! Text that reached the controller from a worker or a sandbox (a replication's reason, a
//! command, a path, a failure's detail), made fit for the operator's terminal: a worker
//! chooses every character of it, and an escape sequence printed raw can clear the screen
//! and draw a fake listing where a person decides, reorder what is read (bidirectional
//! overrides, invisible characters) or pass for other text (look-alike letters). So every
//! character but printable ASCII is written as an escape, as `git` quotes paths; and long
//! text is folded here, not left for the terminal to wrap: a
//! wrapped line starts its next row with whatever the worker put there, which can pass
//! for another field or another row.

use std::os::fd::AsFd;

/// The width folded text takes where no screen's is known (output into a file or a pipe,
/// no terminal and no `COLUMNS`).
pub const DEFAULT_WIDTH: usize = 80;

/// The narrowest width anything is folded to: below it nothing fits anyway.
const NARROWEST: usize = 4;

/// The width of the terminal on `fd`, if it is one (0 where it does not say).
fn terminal_width(fd: impl AsFd) -> Option<usize> {
    hatchery::sandbox::tty::window_width(fd.as_fd())
}

/// The width of the terminal on `fd`, if it is one and says.
fn known_width(fd: impl AsFd) -> Option<usize> {
    terminal_width(fd).filter(|w| *w > 0)
}

/// `COLUMNS`, when it is a width.
fn columns_var() -> Option<usize> {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|w| *w > 0)
}

/// How wide a table's rows or a log's lines may be: the terminal's when standard output
/// is one, else `COLUMNS`, else 80 on a terminal that does not say, else none (output
/// into a file or a pipe, left whole for `grep`, as procps's `ps` leaves it).
pub fn table_width() -> Option<usize> {
    let on_stdout = terminal_width(std::io::stdout());
    on_stdout
        .filter(|w| *w > 0)
        .or_else(columns_var)
        // A terminal that does not say its width (a serial console, some `exec -t`
        // terminals) still wraps.
        .or(on_stdout.map(|_| DEFAULT_WIDTH))
        .map(|w| w.max(NARROWEST))
}

/// How wide the screen a listing ends up on is: the terminal's on standard output, else
/// `COLUMNS`, else the terminal's on standard error (output piped into a pager or `tee`
/// still lands on it), else [`DEFAULT_WIDTH`]. Asked at each print, since a terminal may
/// be resized while `--watch` waits.
pub fn screen_width() -> usize {
    known_width(std::io::stdout())
        .or_else(columns_var)
        .or_else(|| known_width(std::io::stderr()))
        .unwrap_or(DEFAULT_WIDTH)
        .max(NARROWEST)
}

/// The columns `c` may take on a terminal, counted high so that no line runs wider than
/// it was measured: 1 for printable ASCII, 2 for anything else (text from a worker is
/// ASCII once [`shown`]; this program's own marks, `…` and `└─`, may be drawn wide).
fn columns(c: char) -> usize {
    if c.is_ascii() { 1 } else { 2 }
}

/// The columns `s` may take (see [`columns`]).
fn width_of(s: &str) -> usize {
    s.chars().map(columns).sum()
}

/// `label` then `text` (as [`shown`] made it), folded into lines no wider than `width`
/// (no line break at the end), at a space where one is near the end of the line. Every
/// line after the first starts with a continuation mark as wide as the label (`… `), so
/// nothing a worker wrote starts a line, where it could pass for another field; a worker
/// cannot write the mark itself (`shown` escapes it). Where `width` cannot hold the label
/// and a few columns more, the label is folded with the text.
pub fn field(label: &str, text: &str, width: usize) -> String {
    let width = width.max(NARROWEST);
    let (first, text, more) = if width >= width_of(label).saturating_add(8) {
        let indent = width_of(label).max(4).saturating_sub(2);
        (
            label.to_string(),
            text.to_string(),
            format!("{}… ", " ".repeat(indent)),
        )
    } else {
        (String::new(), format!("{label}{text}"), "… ".to_string())
    };
    let room = width.saturating_sub(width_of(&more));
    let mut lines: Vec<String> = Vec::new();
    let mut prefix = first;
    let mut body = String::new();
    let mut left = width.saturating_sub(width_of(&prefix));
    for c in text.chars() {
        let n = columns(c);
        if n > left && !body.is_empty() {
            // Carry the last word over, with the space before it (nothing is dropped: two
            // paths must not read as one), when that space is in the line's second half.
            let carried = match body.rfind(' ') {
                Some(at) if at > 0 && at.saturating_mul(2) >= body.len() => {
                    let tail = body.get(at..).unwrap_or_default();
                    if width_of(tail) < room {
                        let tail = tail.to_string();
                        body.truncate(at);
                        tail
                    } else {
                        String::new()
                    }
                }
                _ => String::new(),
            };
            lines.push(format!("{prefix}{body}"));
            prefix = more.clone();
            left = room.saturating_sub(width_of(&carried));
            body = carried;
        }
        body.push(c);
        left = left.saturating_sub(n);
    }
    lines.push(format!("{prefix}{body}"));
    lines.join("\n")
}

/// Each line of `text`, a listing of `label:   value` lines (the label, up to its first
/// `": "` and the spaces after it, is this program's; the value may be a worker's), folded
/// by [`field`] to `width`. A line with no such label within its first 24 columns is
/// folded as a whole.
pub fn fold_fields(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.lines().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let label_end = line
            .find(": ")
            .map(|colon| {
                let after = colon.saturating_add(2);
                let spaces = line
                    .get(after..)
                    .map(|rest| {
                        rest.len()
                            .saturating_sub(rest.trim_start_matches(' ').len())
                    })
                    .unwrap_or(0);
                after.saturating_add(spaces)
            })
            .filter(|end| *end <= 24);
        let (label, value) = match label_end.and_then(|end| line.get(..end).zip(line.get(end..))) {
            Some(split) => split,
            None => ("", line),
        };
        out.push_str(&field(label, value, width));
    }
    if text.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// `value` as JSON, with every character but printable ASCII written as an escape as
/// [`shown`] does; the backslashes of JSON's own escapes are left as they are.
pub fn shown_json(value: &impl serde::Serialize) -> String {
    escaped(&serde_json::to_string(value).unwrap_or_default(), |_| false)
}

/// `s` with every character but printable ASCII written as an escape (`\u{1b}`,
/// `\u{202e}`, `\u{e9}`, `\n`), and a backslash as `\\`, so that what is printed
/// can be read back as exactly what was sent.
pub fn shown(s: &str) -> String {
    escaped(s, |c| c == '\\')
}

/// `s` with every character but printable ASCII, and those `also` names, written as
/// Rust's escapes.
fn escaped(s: &str, also: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if (c == ' ' || c.is_ascii_graphic()) && !also(c) {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{field, fold_fields, shown, width_of};

    #[test]
    fn folded_text_never_starts_a_line_of_its_own() {
        // Padded so that, wrapped by an 80-column terminal, the rest would start a row
        // and read as the next field.
        let why = format!("{}  needs:      nothing", "x".repeat(66));
        let text = field("  why:        ", &why, 80);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines.iter().all(|l| width_of(l) <= 80), "{text}");
        assert!(lines[0].starts_with("  why:        xxx"), "{text}");
        assert!(lines[1].starts_with("            … "), "{text}");
        assert_eq!(
            text.replace("\n            … ", ""),
            format!("  why:        {why}")
        );
        // Wide characters count two columns; nothing is cut, only folded.
        let wide = "漢".repeat(50);
        let text = field("path: ", &wide, 40);
        assert!(text.lines().all(|l| width_of(l) <= 40), "{text}");
        assert_eq!(text.matches('漢').count(), 50);
        // Short text stays on its line.
        assert_eq!(field("  cwd:        ", "/work", 80), "  cwd:        /work");
    }

    #[test]
    fn a_listing_is_folded_field_by_field() {
        let text = format!(
            "a-1  requested by w-2\n  why:        {}\n  cwd:        /\n",
            "y".repeat(100)
        );
        let folded = fold_fields(&text, 60);
        let lines: Vec<&str> = folded.lines().collect();
        assert_eq!(lines[0], "a-1  requested by w-2");
        assert!(lines[1].starts_with("  why:        yyy"), "{folded}");
        assert!(lines[2].starts_with("            … yyy"), "{folded}");
        assert!(lines.iter().all(|l| width_of(l) <= 60), "{folded}");
        assert_eq!(lines.last().copied(), Some("  cwd:        /"));
        assert!(folded.ends_with('\n'));
    }

    #[test]
    fn no_line_is_wider_than_the_screen_however_narrow() {
        let why = shown(&format!("{} needs: nothing \u{f0000}", "ab ".repeat(40)));
        for width in 1..=100 {
            let text = field("  why:        ", &why, width);
            for (i, line) in text.lines().enumerate() {
                assert!(
                    width_of(line) <= width.max(4),
                    "{width}: {line:?} in\n{text}"
                );
                if i > 0 {
                    assert!(line.trim_start().starts_with("… "), "{width}: {text}");
                }
            }
            let joined: String = text
                .lines()
                .enumerate()
                .map(|(i, l)| {
                    if i == 0 {
                        l
                    } else {
                        l.trim_start_matches(' ').strip_prefix("… ").unwrap_or(l)
                    }
                })
                .collect();
            assert_eq!(
                joined,
                format!("  why:        {why}"),
                "{width}: nothing is lost"
            );
        }
    }

    #[test]
    fn folding_breaks_at_a_space_near_the_end() {
        let text = field(
            "  why:        ",
            "a helper for the nightly build of the docs",
            40,
        );
        assert_eq!(
            text,
            "  why:        a helper for the nightly\n            …  build of the docs"
        );
    }

    #[test]
    fn control_and_invisible_characters_are_shown_as_escapes() {
        assert_eq!(
            shown("cwd \u{1b}[2J/x\r\nok: \u{e9}"),
            "cwd \\u{1b}[2J/x\\r\\nok: \\u{e9}"
        );
        assert_eq!(
            shown("/tmp/\u{202e}evil\u{200b}\u{2066}txt.exe\u{feff}"),
            "/tmp/\\u{202e}evil\\u{200b}\\u{2066}txt.exe\\u{feff}"
        );
        // Look-alike letters and text a pager would draw wide are escapes too.
        assert_eq!(
            shown("plain text, \u{e9}\u{430}\u{2028}\u{f0000} a\\b"),
            "plain text, \\u{e9}\\u{430}\\u{2028}\\u{f0000} a\\\\b"
        );
    }
}
