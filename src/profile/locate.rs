//! Line numbers for errors found after parsing: a profile author is told "line 42", not
//! "the third syscall of the seventh rule".

use toml::de::{DeTable, DeValue};

/// The 1-based line of a byte offset.
pub fn line_of(source: &str, offset: usize) -> usize {
    source
        .get(..offset.min(source.len()))
        .map_or(1, |s| s.matches('\n').count() + 1)
}

/// The line of `[[seccomp.rule]]` number `rule` (0-based), of one syscall name in it, or
/// of one of its keys (`errno`, `args`).
pub fn rule_line(
    source: &str,
    rule: usize,
    syscall: Option<&str>,
    key: Option<&str>,
) -> Option<usize> {
    let root = DeTable::parse(source).ok()?;
    let seccomp = match root.get_ref().get("seccomp")?.get_ref() {
        DeValue::Table(t) => t,
        _ => return None,
    };
    let rules = match seccomp.get("rule")?.get_ref() {
        DeValue::Array(a) => a,
        _ => return None,
    };
    let entry = rules.get(rule)?;
    let table = match entry.get_ref() {
        DeValue::Table(t) => t,
        _ => return Some(line_of(source, entry.span().start)),
    };
    if let Some(name) = syscall {
        if let Some(DeValue::Array(list)) = table.get("syscalls").map(|v| v.get_ref()) {
            for item in list.iter() {
                if matches!(item.get_ref(), DeValue::String(s) if s.as_ref() == name) {
                    return Some(line_of(source, item.span().start));
                }
            }
        }
    }
    if let Some((k, _)) = key.and_then(|k| table.get_key_value(k)) {
        return Some(line_of(source, k.span().start));
    }
    // The first key of the table is on (or right below) its header.
    let first = table
        .iter()
        .map(|(k, _)| k.span().start)
        .min()
        .unwrap_or(entry.span().start);
    Some(line_of(source, first))
}

/// The line of a dotted key such as `landlock.read`.
pub fn key_line(source: &str, path: &[&str]) -> Option<usize> {
    let root = DeTable::parse(source).ok()?;
    let mut table = root.get_ref();
    let (last, parents) = path.split_last()?;
    for key in parents {
        table = match table.get(*key)?.get_ref() {
            DeValue::Table(t) => t,
            _ => return None,
        };
    }
    let (k, _) = table.get_key_value(*last)?;
    Some(line_of(source, k.span().start))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n\n[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"ptrace\"]\n\n[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"bpf\",\n  \"nope\"]\n[landlock]\nread = [\"/usr\"]\n";

    #[test]
    fn rules_and_their_syscalls_are_found_by_line() {
        assert_eq!(rule_line(SRC, 0, None, None), Some(6));
        assert_eq!(rule_line(SRC, 1, None, None), Some(10));
        assert_eq!(rule_line(SRC, 1, Some("nope"), None), Some(12));
        assert_eq!(rule_line(SRC, 1, None, Some("syscalls")), Some(11));
        assert_eq!(rule_line(SRC, 1, None, Some("errno")), Some(10));
        assert_eq!(rule_line(SRC, 2, None, None), None);
    }

    #[test]
    fn dotted_keys_are_found_by_line() {
        assert_eq!(key_line(SRC, &["landlock", "read"]), Some(14));
        assert_eq!(key_line(SRC, &["seccomp", "default_action"]), Some(3));
        assert_eq!(key_line(SRC, &["mounts", "system"]), None);
    }
}
