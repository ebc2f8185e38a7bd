//! The authenticated webhook request: Alertmanager's POST, whichever door
//! it comes in by (a Lambda Function URL, `serve`'s `/alertmanager`).
//! Headers and body bytes in, a status and a JSON body out; each entry point
//! only unwraps its own envelope around it.
//!
//! Everything the headers decide is decided first ([`admit`]: the bearer
//! token, then the content type), so a caller without the token costs no
//! more than its headers: the body is read only after [`admit`] let it in,
//! and no further than [`MAX_BODY_BYTES`].

use http::HeaderMap;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::alertmanager;
use crate::core::inbound::suspect::Batch;

/// The largest body accepted, decoded. The receiver the project documents
/// groups by node (`group_by: ["node"]`): one notification carries one
/// node's alerts, a few KiB. 256 KiB still holds a group of about 150
/// alerts of 1.7 KiB (labels, annotations, generator URL) from a receiver
/// grouped more coarsely. Anything larger is not a notification
/// node-fencer could act on whole (the cap lets a few nodes out of service
/// at once, and the sweep finds what an oversized group named); it would
/// only cost memory.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// The shared secret Alertmanager presents. Only its digest is kept, so the
/// token itself cannot end up in a log line or a debug dump.
#[derive(Clone)]
pub struct WebhookToken {
    digest: [u8; 32],
}

impl WebhookToken {
    /// Wraps a token; refuses tokens too short to resist guessing.
    pub fn new(token: &str) -> Result<Self, &'static str> {
        let token = token.trim();
        if token.len() < 16 {
            return Err("the webhook token must be at least 16 characters");
        }
        Ok(Self {
            digest: Sha256::digest(token.as_bytes()).into(),
        })
    }

    /// Compares in constant time: digests have a fixed length, so neither the
    /// position of the first difference nor the token's length leaks.
    fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.digest.ct_eq(&digest).into()
    }
}

impl std::fmt::Debug for WebhookToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookToken(<redacted>)")
    }
}

/// An HTTP request refused before anything was done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The HTTP status to answer with.
    pub status: u16,
    /// What to tell the caller (never the token).
    pub message: String,
}

impl Rejection {
    pub(crate) fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// The body is over [`MAX_BODY_BYTES`].
    pub fn too_large() -> Self {
        Self::new(413, format!("the body exceeds {MAX_BODY_BYTES} bytes"))
    }
}

/// What a webhook request is answered with, whichever entry point wraps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body: the report, or the error and the correlation id.
    pub body: Value,
}

/// Lets a request in by its headers alone: the bearer token (fail closed:
/// without a configured token nothing is authentic), then the content type.
pub fn admit(headers: &HeaderMap, token: Option<&WebhookToken>) -> Result<(), Rejection> {
    authenticate(headers, token)?;
    if let Some(ct) = header(headers, "content-type") {
        let mime = ct.split(';').next().unwrap_or("").trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            return Err(Rejection::new(415, "the body must be application/json"));
        }
    }
    Ok(())
}

/// The body of an admitted request, decoded: Alertmanager's payload.
pub fn parse(body: &[u8]) -> Result<Batch, Rejection> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Rejection::too_large());
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Rejection::new(400, format!("the body is not valid JSON: {e}")))?;
    alertmanager::parse(value).map_err(|e| Rejection::new(400, e.to_string()))
}

fn authenticate(headers: &HeaderMap, token: Option<&WebhookToken>) -> Result<(), Rejection> {
    let unauthorized = || Rejection::new(401, "missing or invalid bearer token");
    let token = token.ok_or_else(unauthorized)?;
    let value = header(headers, "authorization").ok_or_else(unauthorized)?;
    let (scheme, presented) = value.split_once(' ').ok_or_else(unauthorized)?;
    if !scheme.eq_ignore_ascii_case("bearer") || !token.matches(presented.trim()) {
        return Err(unauthorized());
    }
    Ok(())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use serde_json::json;

    const TOKEN: &str = "s3cret-token-with-length";

    fn headers(auth: Option<&str>, content_type: Option<&'static str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert("authorization", HeaderValue::from_str(a).unwrap());
        }
        if let Some(ct) = content_type {
            h.insert("content-type", HeaderValue::from_static(ct));
        }
        h
    }

    #[test]
    fn the_headers_decide_before_any_body() {
        let token = WebhookToken::new(TOKEN).unwrap();
        let right = format!("Bearer {TOKEN}");
        assert_eq!(admit(&headers(Some(&right), None), Some(&token)), Ok(()));
        let json = Some("application/json; charset=utf-8");
        assert_eq!(admit(&headers(Some(&right), json), Some(&token)), Ok(()));
        let refused = |h: HeaderMap, t: Option<&WebhookToken>| admit(&h, t).unwrap_err().status;
        assert_eq!(refused(headers(None, json), Some(&token)), 401);
        assert_eq!(refused(headers(Some(&right), json), None), 401);
        // The token before the content type: a stranger learns nothing more.
        assert_eq!(
            refused(headers(None, Some("text/plain")), Some(&token)),
            401
        );
        let text = Some("text/plain");
        assert_eq!(refused(headers(Some(&right), text), Some(&token)), 415);
    }

    #[test]
    fn a_body_is_alertmanagers_payload_within_the_bound() {
        let payload = json!({"version": "4", "alerts": [
            {"status": "firing", "labels": {"node": "worker-1"}}]});
        let batch = parse(payload.to_string().as_bytes()).unwrap();
        assert_eq!(batch.suspects.len(), 1);
        assert_eq!(parse(b"{").unwrap_err().status, 400);
        assert_eq!(parse(b"{\"version\": \"3\"}").unwrap_err().status, 400);
        let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(MAX_BODY_BYTES));
        assert_eq!(parse(big.as_bytes()).unwrap_err().status, 413);
    }
}
