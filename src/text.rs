//! Text that came from a file or a peer and is printed to a person's terminal.
//!
//! A control character (ESC, BEL, CR, a C1 CSI) in it drives the terminal: it sets the
//! window title, clears the screen, conceals what follows or redraws a line; a
//! bidirectional override or an invisible format character makes what is shown differ
//! from what is there. Such text is escaped where it is printed, or refused where it is
//! read as a name or a reason someone will review.

use std::borrow::Cow;

mod json;
pub use json::{to_json, to_json_pretty};

/// Whether `c` drives a terminal or changes how the text around it is drawn: a control
/// character (C0, DEL, C1), or a format character that reorders or hides text.
pub fn is_control_or_format(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Unicode's format characters (category Cf): bidirectional marks and
            // overrides, zero-width joiners and spaces, invisible operators, shorthand
            // and musical formatting, interlinear annotation.
            '\u{00ad}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061c}'
                | '\u{06dd}'
                | '\u{070f}'
                | '\u{0890}'..='\u{0891}'
                | '\u{08e2}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{110bd}'
                | '\u{110cd}'
                | '\u{13430}'..='\u{1343f}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                // Tags: invisible letters that can carry a hidden text.
                | '\u{e0000}'..='\u{e007f}'
                // Variation selectors, and the fillers that draw as nothing.
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{e0100}'..='\u{e01ef}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{3164}'
                | '\u{ffa0}'
        )
}

/// `s`, or its first `max` characters and how many more there were: for text from a
/// file or a peer quoted in a message, which must stay a line a person reads (a parser's
/// error quoting a 1 MB value printed all of it).
pub fn clip(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some((end, _)) => {
            let more = s.get(end..).map_or(0, |rest| rest.chars().count());
            Cow::Owned(format!(
                "{}… ({more} more characters)",
                s.get(..end).unwrap_or_default()
            ))
        }
    }
}

/// At most `width` characters of `line` around its character `column` (counted from 1),
/// with `…` where it was cut: the place a parser's error points at, never the whole line.
pub fn excerpt(line: &str, column: usize, width: usize) -> String {
    let total = line.chars().count();
    if total <= width {
        return line.to_string();
    }
    let at = column.saturating_sub(1).min(total);
    let start = at
        .saturating_sub(width / 2)
        .min(total.saturating_sub(width));
    let shown: String = line.chars().skip(start).take(width).collect();
    let before = if start > 0 { "…" } else { "" };
    let after = if start.saturating_add(width) < total {
        "…"
    } else {
        ""
    };
    format!("{before}{shown}{after}")
}

/// The first such character in `s`, if any.
pub fn first_control(s: &str) -> Option<char> {
    s.chars().find(|c| is_control_or_format(*c))
}

/// `s` with each such character written as its escape (`\u{1b}`, `\n`); other text,
/// accented letters and other scripts included, as it is.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if first_control(s).is_none() {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len().saturating_add(16));
    for c in s.chars() {
        if is_control_or_format(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn clip_and_excerpt_keep_whole_characters_and_say_what_was_cut() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcd", 3), "abc… (1 more characters)");
        // A multi-byte character at the cut.
        assert_eq!(clip("ééé", 2), "éé… (1 more characters)");
        assert_eq!(clip("", 0), "");
        assert_eq!(clip("x", 0), "… (1 more characters)");
        let line = "é".repeat(1000) + " junk";
        let shown = excerpt(&line, 1002, 10);
        assert_eq!(shown, "…ééééé junk");
        assert_eq!(excerpt(&line, 1, 4), "éééé…");
        assert_eq!(excerpt(&line, 500, 4), "…éééé…");
        assert_eq!(excerpt("short", 99, 80), "short");
        // A column past the end (a parser's span at the end of the file).
        assert_eq!(excerpt("abcdef", 50, 3), "…def");
    }

    use super::*;

    #[test]
    fn terminal_controls_and_reordering_are_escaped_and_other_text_kept() {
        assert_eq!(
            escape_controls("a\u{1b}]0;T\u{7}b\r\n\u{9b}2J\u{202e}é漢"),
            "a\\u{1b}]0;T\\u{7}b\\r\\n\\u{9b}2J\\u{202e}é漢"
        );
        assert!(matches!(escape_controls("plain /path é"), Cow::Borrowed(_)));
        assert_eq!(first_control("ok\u{200b}"), Some('\u{200b}'));
        assert_eq!(first_control("tab\there"), Some('\t'));
        // A text hidden in tag characters, and a variation selector.
        assert_eq!(first_control("Safe\u{e0069}\u{e0067}"), Some('\u{e0069}'));
        assert_eq!(first_control("a\u{fe0f}"), Some('\u{fe0f}'));
    }
}
