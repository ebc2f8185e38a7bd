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

/// Unix seconds in RFC 3339, or the number itself if out of range.
pub fn rfc3339(secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map_or_else(|_| secs.to_string(), |t| t.to_string())
}

/// Serializes Unix seconds as [`rfc3339`], for reports read by people.
pub(crate) fn serialize_rfc3339<S: serde::Serializer>(
    secs: &Option<i64>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match secs {
        Some(secs) => s.serialize_str(&rfc3339(*secs)),
        None => s.serialize_none(),
    }
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
