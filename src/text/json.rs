//! JSON that a person may read on a terminal as well as a program may parse.
//!
//! serde_json escapes only what JSON requires: the C0 controls, `"` and `\`. Everything
//! else a string holds is written as it is, so a C1 control (U+009B is CSI to a
//! terminal that takes 8-bit controls), DEL, a bidirectional override or a tag character
//! that a worker, a profile or a tampered trail put in a name reaches the screen of
//! whoever pipes `--json` into `less -R` or reads a report with `cat`. Here each
//! character [`is_control_or_format`] finds is written as a `\u` escape instead (a
//! surrogate pair above U+FFFF), which every JSON parser reads back as the same
//! character: the document means what it meant, and only its spelling changes.

use super::is_control_or_format;
use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter, PrettyFormatter};
use std::io::{self, Write};

/// `value` as one line of JSON, every control and format character in its strings
/// escaped.
pub fn to_json(value: &(impl Serialize + ?Sized)) -> serde_json::Result<String> {
    encode(value, CompactFormatter)
}

/// `value` as indented JSON, every control and format character in its strings escaped.
pub fn to_json_pretty(value: &(impl Serialize + ?Sized)) -> serde_json::Result<String> {
    encode(value, PrettyFormatter::new())
}

fn encode(
    value: &(impl Serialize + ?Sized),
    formatter: impl Formatter,
) -> serde_json::Result<String> {
    let mut out = Vec::with_capacity(128);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Escaping(formatter));
    value.serialize(&mut ser)?;
    // Only whole strings and JSON's own ASCII punctuation were written.
    String::from_utf8(out).map_err(|e| serde_json::Error::io(io::Error::other(e)))
}

/// A formatter that writes as `F` does, but for the characters of a string that drive a
/// terminal or change how text is drawn.
struct Escaping<F>(F);

impl<F: Formatter> Formatter for Escaping<F> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut plain_from = 0;
        for (at, c) in fragment.char_indices() {
            if !is_control_or_format(c) {
                continue;
            }
            let plain = fragment.get(plain_from..at).unwrap_or_default();
            self.0.write_string_fragment(writer, plain)?;
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(writer, "\\u{unit:04x}")?;
            }
            plain_from = at.saturating_add(c.len_utf8());
        }
        let rest = fragment.get(plain_from..).unwrap_or_default();
        self.0.write_string_fragment(writer, rest)
    }

    // Everything else as `F` writes it: the pretty formatter keeps its indentation here.
    fn write_char_escape<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        char_escape: CharEscape,
    ) -> io::Result<()> {
        self.0.write_char_escape(writer, char_escape)
    }
    fn begin_string<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_string(writer)
    }
    fn end_string<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_string(writer)
    }
    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_array(writer)
    }
    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array(writer)
    }
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(writer, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array_value(writer)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object(writer)
    }
    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object(writer)
    }
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(writer, first)
    }
    fn end_object_key<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object_key(writer)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object_value(writer)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object_value(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn terminal_controls_and_reordering_are_escaped_and_read_back_the_same() {
        let text = "a\u{1b}[2J\u{9b}31m\u{7f}b\u{202e}cba\u{200b}é漢\u{e0041}\"\\\n";
        let value = json!({ "name": text, "list": [text], text: 1 });
        for encoded in [to_json(&value).unwrap(), to_json_pretty(&value).unwrap()] {
            assert!(
                !encoded
                    .chars()
                    .any(|c| is_control_or_format(c) && c != '\n'),
                "{encoded:?}"
            );
            assert!(encoded.contains("\\u009b31m\\u007fb\\u202ecba\\u200bé漢\\udb40\\udc41"));
            assert!(encoded.contains("\\u001b[2J"));
            let back: serde_json::Value = serde_json::from_str(&encoded).unwrap();
            assert_eq!(back, value);
        }
        assert_eq!(to_json(&value).unwrap().lines().count(), 1);
        assert_eq!(
            to_json_pretty(&value).unwrap(),
            serde_json::to_string_pretty(&value)
                .unwrap()
                .replace('\u{9b}', "\\u009b")
                .replace('\u{7f}', "\\u007f")
                .replace('\u{202e}', "\\u202e")
                .replace('\u{200b}', "\\u200b")
                .replace('\u{e0041}', "\\udb40\\udc41")
        );
    }

    #[test]
    fn plain_text_is_written_as_serde_json_writes_it() {
        let value = json!({ "a": ["x y", 1, null, true, { "b": "é /path" }], "c": 1.5 });
        assert_eq!(
            to_json(&value).unwrap(),
            serde_json::to_string(&value).unwrap()
        );
        assert_eq!(
            to_json_pretty(&value).unwrap(),
            serde_json::to_string_pretty(&value).unwrap()
        );
    }
}
