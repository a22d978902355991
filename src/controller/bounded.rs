//! Bounds on what a worker's bytes may become on the controller's side: audit entries,
//! error replies, log lines. A worker chooses every byte of what it sends; what the
//! controller keeps or repeats of it is cut to a size the controller chose, on a character
//! boundary (a cut inside a UTF-8 character once aborted the controller and with it every
//! worker).

use serde_json::Value;

/// Longest string kept from a worker in an audit entry or a reply.
pub const MAX_TEXT: usize = 1024;
/// Most elements of one array kept in an audit entry.
pub const MAX_ITEMS: usize = 64;
/// Deepest nesting kept in an audit entry.
const MAX_DEPTH: usize = 8;

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

/// `v` with every string clipped to [`MAX_TEXT`], every array to [`MAX_ITEMS`] elements
/// and nesting to a few levels: what an audit entry may hold, whatever a worker sent.
pub fn bound_json(v: Value) -> Value {
    bound_at(v, 0)
}

fn bound_at(v: Value, depth: usize) -> Value {
    if depth >= MAX_DEPTH {
        return Value::String("…(nested too deep)".into());
    }
    let next = depth.saturating_add(1);
    match v {
        Value::String(s) => Value::String(clip(&s, MAX_TEXT)),
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
                .map(|(k, v)| (clip(&k, MAX_TEXT), bound_at(v, next)))
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

    proptest! {
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
