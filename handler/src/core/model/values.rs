//! How people spell values in environment variables and ConfigMaps, read
//! the same way wherever one is read (the configuration, the kill switch).

/// Parses a boolean the way people write them in environment variables.
pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// An RFC 3339 time (as node-fencer's annotations write them), in Unix
/// seconds; `None` for anything else.
pub(crate) fn unix_seconds(text: &str) -> Option<i64> {
    text.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

/// True when both name the same instant (RFC 3339, whatever the spelling).
pub fn same_time(a: &str, b: &str) -> bool {
    match (
        a.parse::<k8s_openapi::jiff::Timestamp>(),
        b.parse::<k8s_openapi::jiff::Timestamp>(),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
