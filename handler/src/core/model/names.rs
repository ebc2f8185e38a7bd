//! Kubernetes' naming rules, shared by every parser that accepts a name
//! from outside (labels, direct invocations, the command line, settings),
//! and the validated [`NodeName`] they produce.

use serde::Serialize;

/// A Node's name as a trigger gave it, valid by construction (an RFC 1123
/// subdomain, as Kubernetes requires): safe to resolve, to print and to
/// put in an API path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct NodeName(String);

impl NodeName {
    /// The name, if `raw` is one Kubernetes would accept.
    pub fn parse(raw: &str) -> Option<Self> {
        is_dns_subdomain(raw).then(|| Self(raw.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Kubernetes' rule for object names (RFC 1123 subdomain). Anything else in a
/// label is refused before it reaches an API call or a log line.
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && !name.is_empty()
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kubernetes_names_are_node_names() {
        assert_eq!(
            NodeName::parse("ip-10-0-1-17.ec2.internal").map(|n| n.to_string()),
            Some("ip-10-0-1-17.ec2.internal".to_owned())
        );
        for bad in ["", "Worker-1", "a..b", "-a", "a_b", "a b", &"a".repeat(254)] {
            assert_eq!(NodeName::parse(bad), None, "{bad:?}");
        }
    }
}
