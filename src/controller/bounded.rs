//! Bounds on what a worker's bytes may become on the controller's side: audit entries,
//! error replies, log lines. A worker chooses every byte of what it sends; what the
//! controller keeps or repeats of it is cut to a size the controller chose, on a character
//! boundary (a cut inside a UTF-8 character once aborted the controller and with it every
//! worker).

use serde_json::Value;
use sha2::Digest;

/// Longest string kept from a worker in an audit entry or a reply.
pub const MAX_TEXT: usize = 1024;
/// Most elements of one array kept in an audit entry.
pub const MAX_ITEMS: usize = 64;
/// Deepest nesting kept in an audit entry.
const MAX_DEPTH: usize = 8;
/// Largest audit entry details, as written (JSON, escapes included). Far below what a
/// trail line may be: one worker's entry can never make the trail unreadable.
pub const MAX_DETAILS_JSON: usize = 16 << 10;
/// What `ps` shows of a worker's command: this many arguments, each cut to this many bytes.
const PREVIEW_ARGS: usize = 8;
const PREVIEW_ARG_BYTES: usize = 128;

/// `s` cut to at most `max` bytes on a character boundary, saying how much was cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    let kept = s.get(..end).unwrap_or("");
    format!("{kept}…(+{} bytes)", s.len().saturating_sub(end))
}

/// How many bytes `c` takes in a JSON string (`\u0001` for a control character).
fn json_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// `s` cut so that it takes at most `max` bytes written as a JSON string (escapes count:
/// a control character is one byte raw and six written), on a character boundary.
pub fn clip_json(s: &str, max: usize) -> String {
    let mut written = 0usize;
    for (at, c) in s.char_indices() {
        written = written.saturating_add(json_len(c));
        if written > max {
            let kept = s.get(..at).unwrap_or("");
            return format!("{kept}…(+{} bytes)", s.len().saturating_sub(at));
        }
    }
    s.to_string()
}

/// `v` with every string clipped to [`MAX_TEXT`] written bytes, every array to
/// [`MAX_ITEMS`] elements and nesting to a few levels; and if the whole is still larger
/// than [`MAX_DETAILS_JSON`] written, a summary in its place (its size, its hash and a
/// preview): what an audit entry may hold, whatever a worker sent.
pub fn bound_json(v: Value) -> Value {
    let bounded = bound_at(v, 0);
    let text = serde_json::to_string(&bounded).unwrap_or_default();
    if text.len() <= MAX_DETAILS_JSON {
        return bounded;
    }
    let digest = sha2::Sha256::digest(text.as_bytes());
    serde_json::json!({
        "oversized": true,
        "bytes": text.len(),
        "sha256": hex::encode(digest),
        "preview": clip_json(&text, MAX_TEXT),
    })
}

/// A worker's command as `ps` and the audit trail show it: a few arguments, each short.
pub fn command_preview(command: &[String]) -> Vec<String> {
    let mut out: Vec<String> = command
        .iter()
        .take(PREVIEW_ARGS)
        .map(|a| clip_json(a, PREVIEW_ARG_BYTES))
        .collect();
    if command.len() > PREVIEW_ARGS {
        out.push(format!(
            "…(+{} more)",
            command.len().saturating_sub(PREVIEW_ARGS)
        ));
    }
    out
}

fn bound_at(v: Value, depth: usize) -> Value {
    if depth >= MAX_DEPTH {
        return Value::String("…(nested too deep)".into());
    }
    let next = depth.saturating_add(1);
    match v {
        Value::String(s) => Value::String(clip_json(&s, MAX_TEXT)),
        Value::Array(items) => {
            let total = items.len();
            let mut out: Vec<Value> = items
                .into_iter()
                .take(MAX_ITEMS)
                .map(|i| bound_at(i, next))
                .collect();
            if total > MAX_ITEMS {
                out.push(Value::String(format!(
                    "…(+{} more)",
                    total.saturating_sub(MAX_ITEMS)
                )));
            }
            Value::Array(out)
        }
        Value::Object(map) => {
            let total = map.len();
            let mut out: serde_json::Map<String, Value> = map
                .into_iter()
                .take(MAX_ITEMS)
                .map(|(k, v)| (clip_json(&k, MAX_TEXT), bound_at(v, next)))
                .collect();
            if total > MAX_ITEMS {
                out.insert("…".into(), Value::from(total.saturating_sub(MAX_ITEMS)));
            }
            Value::Object(out)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_cut_inside_a_character_moves_to_its_start() {
        let euro = "€".repeat(400);
        let c = clip(&euro, 1024);
        assert!(c.starts_with(&"€".repeat(341)), "{c}");
        assert!(c.ends_with("…(+177 bytes)"), "{c}");
        assert_eq!(clip("short", 1024), "short");
        assert_eq!(clip("€", 1), "…(+3 bytes)");
    }

    #[test]
    fn deep_wide_and_long_values_are_bounded() {
        let mut v = Value::String("x".repeat(300_000));
        for _ in 0..50 {
            v = Value::Array(vec![v, Value::String("y".repeat(300_000))]);
        }
        let b = bound_json(v);
        assert!(serde_json::to_string(&b).map_or(0, |s| s.len()) < 64 << 10);
        let wide = Value::Array((0..10_000).map(Value::from).collect());
        let b = bound_json(wide);
        assert_eq!(b.as_array().map(Vec::len), Some(MAX_ITEMS + 1));
    }

    #[test]
    fn escapes_count_toward_the_bound_and_no_entry_outgrows_its_cap() {
        let ctl = "\u{1}".repeat(1024);
        let c = clip_json(&ctl, MAX_TEXT);
        assert!(serde_json::to_string(&c).map_or(usize::MAX, |s| s.len()) < MAX_TEXT + 64);
        // 42 arguments of 1,024 control characters: 43 KiB raw, 258 KiB written.
        let command = Value::Array((0..42).map(|_| Value::String(ctl.clone())).collect());
        let b = bound_json(serde_json::json!({ "command": command, "reason": ctl }));
        let written = serde_json::to_string(&b).map_or(usize::MAX, |s| s.len());
        assert!(written <= MAX_DETAILS_JSON, "{written}");
        let long: Vec<String> = (0..50).map(|_| "x".repeat(1000)).collect();
        let p = command_preview(&long);
        assert_eq!(p.len(), 9);
        assert!(p.iter().all(|a| a.len() < 200));
    }

    proptest! {
        #[test]
        fn written_clips_never_exceed_the_bound(s in "\\PC{0,200}|[\\x00-\\x1f\"\\\\]{0,200}", max in 0usize..300) {
            let c = clip_json(&s, max);
            let kept = c.rsplit_once('…').map_or(c.as_str(), |(k, _)| k);
            let written: usize = kept.chars().map(json_len).sum();
            prop_assert!(written <= max || c == s);
            prop_assert!(s.starts_with(kept));
        }

        #[test]
        fn clipping_never_panics_and_never_exceeds_the_bound(s in ".{0,300}", max in 0usize..300) {
            let c = clip(&s, max);
            if s.len() <= max {
                prop_assert_eq!(c, s);
            } else {
                let kept = c.rsplit_once('…').map_or("", |(k, _)| k);
                prop_assert!(kept.len() <= max);
                prop_assert!(s.starts_with(kept));
            }
        }
    }
}
