//! Text that reached the controller from a worker or a sandbox (a replication's reason, a
//! command, a path, a failure's detail), made fit for the operator's terminal: a worker
//! chooses every character of it, and an escape sequence printed raw can clear the screen
//! and draw a fake listing where a person decides, or reorder what is read (bidirectional
//! overrides, invisible characters). Long text is folded (or, in a table, cut) by this
//! program, not by the terminal: a line the terminal wraps starts its next row with
//! whatever the worker put there, which can pass for another field or another row.

/// The width folded text takes where the screen's is not known (a pipe into a pager).
pub const DEFAULT_WIDTH: usize = 80;

/// The narrowest screen text is folded for.
const MIN_WIDTH: usize = 20;

/// How wide the operator's screen is: the terminal's when standard output is one, else
/// `COLUMNS` (a number of at least 20), else none (a file or a pipe, width not given).
pub fn screen_width() -> Option<usize> {
    if let Some((terminal_size::Width(w), _)) = terminal_size::terminal_size_of(std::io::stdout()) {
        return Some(usize::from(w).max(MIN_WIDTH));
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|w| *w >= MIN_WIDTH)
}

/// The columns `c` may take on a terminal, counted high so that no line runs wider than
/// it was measured: 1 for printable ASCII, 2 for anything else (a wide character, an
/// emoji a terminal draws wide; a combining mark then counts 2 for 0, which only folds
/// early).
fn columns(c: char) -> usize {
    if c.is_ascii() { 1 } else { 2 }
}

/// The columns `s` may take (see [`columns`]).
fn width_of(s: &str) -> usize {
    s.chars().map(columns).sum()
}

/// `label` then `text` (as [`shown`] made it), folded into lines no wider than `width`
/// (no line break at the end). Every line after the first starts with a continuation
/// mark as wide as the label (`… `), so nothing a worker wrote starts a line of its own,
/// where it could pass for another field.
pub fn field(label: &str, text: &str, width: usize) -> String {
    let more = format!("{}… ", " ".repeat(width_of(label).max(4).saturating_sub(2)));
    let room = |prefix: &str| width.saturating_sub(width_of(prefix)).max(MIN_WIDTH / 2);
    let mut out = String::with_capacity(label.len().saturating_add(text.len()));
    out.push_str(label);
    let mut left = room(label);
    for c in text.chars() {
        let n = columns(c);
        if n > left {
            out.push('\n');
            out.push_str(&more);
            left = room(&more);
        }
        out.push(c);
        left = left.saturating_sub(n);
    }
    out
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

/// `line` cut to at most `width` columns, ending in `…` where it was cut.
pub fn clipped(line: &str, width: usize) -> String {
    if width_of(line) <= width {
        return line.to_string();
    }
    let mut out = String::new();
    let mut left = width.saturating_sub(width_of("…"));
    for c in line.chars() {
        let n = columns(c);
        if n > left {
            break;
        }
        out.push(c);
        left = left.saturating_sub(n);
    }
    out.push('…');
    out
}

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
    use super::{clipped, field, fold_fields, shown, width_of};

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
    fn clipped_lines_fit_and_say_so() {
        assert_eq!(clipped("short", 10), "short");
        assert_eq!(clipped("0123456789abc", 10), "01234567…");
        assert!(width_of(&clipped(&"é".repeat(30), 21)) <= 21);
    }

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
