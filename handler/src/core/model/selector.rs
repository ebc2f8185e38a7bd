//! Kubernetes label selectors as `kubectl -l` and the API's `labelSelector`
//! take them (`NODE_SELECTOR`): requirements joined by commas, each
//! `key=value` (or `==`), `key!=value`, `key in (a,b)`, `key notin (a,b)`,
//! `key` or `!key`. Parsed once, with an error that names the requirement,
//! and matched against a Node's labels with Kubernetes' meaning: `!=` and
//! `notin` also select a Node without the label.

use std::collections::BTreeMap;
use std::fmt;

/// One requirement on one label.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

/// A parsed label selector: every requirement must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses `text`; an empty selector (which selects everything) is an
    /// error, since a setting left empty means "no selector".
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_requirements(text)? {
            requirements.push(requirement(part.trim())?);
        }
        if requirements.is_empty() {
            return Err("an empty selector".into());
        }
        Ok(Self { requirements })
    }

    /// Whether a Node with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
        })
    }
}

/// The canonical form, as the API's `labelSelector` takes it.
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                Requirement::Exists(k) => f.write_str(k)?,
                Requirement::Absent(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// Splits at the commas outside parentheses.
fn split_requirements(text: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0u8, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err(format!("nested parentheses in {text:?}")),
            ')' if depth == 1 => depth = 0,
            ')' => return Err(format!("an unmatched `)` in {text:?}")),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("an unclosed `(` in {text:?}"));
    }
    parts.push(&text[start..]);
    if parts.len() == 1 && parts[0].trim().is_empty() {
        return Ok(Vec::new());
    }
    Ok(parts)
}

fn requirement(part: &str) -> Result<Requirement, String> {
    let fail = |why: &str| Err(format!("`{part}`: {why}"));
    if part.is_empty() {
        return fail("an empty requirement (a stray comma?)");
    }
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::Absent(checked_key(key.trim(), part)?));
    }
    for (op, build) in [
        (
            "!=",
            Requirement::NotEquals as fn(String, String) -> Requirement,
        ),
        ("==", Requirement::Equals),
        ("=", Requirement::Equals),
    ] {
        if let Some((key, value)) = part.split_once(op) {
            let value = value.trim();
            if value.contains(['=', '!']) {
                return fail("one operator per requirement");
            }
            return Ok(build(
                checked_key(key.trim(), part)?,
                checked_value(value, part)?,
            ));
        }
    }
    if let Some(open) = part.find('(') {
        let Some(inner) = part[open + 1..].strip_suffix(')') else {
            return fail("text after `)`");
        };
        let mut words = part[..open].split_whitespace();
        let (Some(key), Some(op), None) = (words.next(), words.next(), words.next()) else {
            return fail("expected `key in (values)` or `key notin (values)`");
        };
        let key = checked_key(key, part)?;
        if inner.trim().is_empty() {
            return fail("an empty set of values");
        }
        let values = inner
            .split(',')
            .map(|v| checked_value(v.trim(), part))
            .collect::<Result<Vec<_>, _>>()?;
        return match op {
            "in" => Ok(Requirement::In(key, values)),
            "notin" => Ok(Requirement::NotIn(key, values)),
            _ => fail("the operator is `in` or `notin`"),
        };
    }
    if part.split_whitespace().count() > 1 {
        return fail("expected `key`, `!key`, `key=value`, `key!=value` or `key in (values)`");
    }
    Ok(Requirement::Exists(checked_key(part, part)?))
}

/// True for a label key Kubernetes accepts.
pub(crate) fn is_label_key(key: &str) -> bool {
    checked_key(key, key).is_ok()
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn checked_key(key: &str, part: &str) -> Result<String, String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(super::names::is_dns_subdomain);
    if !prefix_ok || name.is_empty() || !is_label_word(name) {
        return Err(format!("`{part}`: `{key}` is not a label key"));
    }
    Ok(key.to_owned())
}

/// A label value: empty, or a label word.
fn checked_value(value: &str, part: &str) -> Result<String, String> {
    if value.is_empty() || is_label_word(value) {
        Ok(value.to_owned())
    } else {
        Err(format!("`{part}`: `{value}` is not a label value"))
    }
}

/// At most 63 characters, alphanumeric at both ends, `-`, `_` and `.`
/// between.
fn is_label_word(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A Node's labels from `pairs`, for the tests of what reads them.
#[cfg(test)]
pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_operator_means_what_kubernetes_means() {
        let node = labels(&[
            ("pool", "stateful"),
            ("topology.kubernetes.io/zone", "eu-west-1a"),
        ]);
        let bare = labels(&[]);
        for (text, on_node, on_bare) in [
            ("pool=stateful", true, false),
            ("pool==stateful", true, false),
            ("pool=web", false, false),
            ("pool!=web", true, true),
            ("pool!=stateful", false, true),
            ("pool in (stateful, batch)", true, false),
            ("pool in (web)", false, false),
            ("pool notin (web,batch)", true, true),
            ("pool notin (stateful)", false, true),
            ("pool", true, false),
            ("!pool", false, true),
            (
                "topology.kubernetes.io/zone in (eu-west-1a,eu-west-1b)",
                true,
                false,
            ),
            ("pool=stateful,!node-fencer.io/exclude", true, false),
            (
                "pool=stateful, topology.kubernetes.io/zone=eu-west-1b",
                false,
                false,
            ),
            ("pool=", false, false),
        ] {
            let s = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(s.matches(&node), on_node, "{text} on the node");
            assert_eq!(s.matches(&bare), on_bare, "{text} on a bare node");
        }
    }

    #[test]
    fn a_bad_selector_is_an_error_naming_the_requirement() {
        for (text, names) in [
            ("", "empty"),
            ("  ", "empty"),
            ("pool=a,", "stray comma"),
            ("pool=a=b", "one operator"),
            ("Pool/x=a", "not a label key"),
            ("pool=a b", "not a label value"),
            ("pool in (a", "unclosed"),
            ("pool in a)", "unmatched"),
            ("pool in ((a))", "nested"),
            ("pool within (a)", "`in` or `notin`"),
            ("pool in (a) x", "text after"),
            ("pool stateful", "expected"),
            ("pool in ( )", "empty set"),
            ("-pool", "not a label key"),
            (&format!("pool={}", "a".repeat(64)), "not a label value"),
        ] {
            let err = LabelSelector::parse(text).expect_err(text);
            assert!(err.contains(names), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_canonical_form_reads_back_the_same() {
        for text in [
            "pool=stateful",
            "pool!=web,!node-fencer.io/exclude",
            "pool in (a,b),tier notin (c)",
            "example.com/pool",
        ] {
            let s = LabelSelector::parse(text).unwrap();
            assert_eq!(s.to_string(), text);
            assert_eq!(LabelSelector::parse(&s.to_string()).unwrap(), s);
        }
        assert_eq!(
            LabelSelector::parse(" pool == a , tier in ( b , c ) ")
                .unwrap()
                .to_string(),
            "pool=a,tier in (b,c)"
        );
    }

    proptest! {
        /// Whatever is written in the setting, parsing returns an answer,
        /// and what it accepts prints to a form that parses to the same.
        #[test]
        fn any_text_is_parsed_without_panic(text in "[a-z=!(), ./-]{0,40}") {
            if let Ok(s) = LabelSelector::parse(&text) {
                prop_assert_eq!(LabelSelector::parse(&s.to_string()), Ok(s));
            }
        }
    }
}
