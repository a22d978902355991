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
