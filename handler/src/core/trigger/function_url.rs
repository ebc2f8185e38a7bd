//! Function URL requests: the Alertmanager entry. Authenticated by a bearer
//! token before the body is looked at.

use aws_lambda_events::event::lambda_function_urls::{
    LambdaFunctionUrlRequest, LambdaFunctionUrlResponse,
};
use base64::Engine;
use http::{HeaderMap, HeaderValue};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::alertmanager;
use crate::core::suspect::Batch;

/// The largest body accepted, decoded. Alertmanager groups with hundreds of
/// alerts stay far below it; anything larger is not from Alertmanager.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

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
    fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

/// Authenticates and parses a Function URL request carrying an Alertmanager payload.
pub fn parse(
    req: &LambdaFunctionUrlRequest,
    token: Option<&WebhookToken>,
) -> Result<Batch, Rejection> {
    let method = req.request_context.http.method.as_deref().unwrap_or("");
    if !method.eq_ignore_ascii_case("POST") {
        return Err(Rejection::new(405, "only POST is accepted"));
    }
    authenticate(&req.headers, token)?;
    if let Some(ct) = header(&req.headers, "content-type") {
        let mime = ct.split(';').next().unwrap_or("").trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            return Err(Rejection::new(415, "the body must be application/json"));
        }
    }
    let body = req
        .body
        .as_deref()
        .ok_or_else(|| Rejection::new(400, "the request has no body"))?;
    let bytes = if req.is_base64_encoded {
        if body.len() > MAX_BODY_BYTES.div_ceil(3) * 4 {
            return Err(too_large());
        }
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| Rejection::new(400, "the body is not valid base64"))?
    } else {
        body.as_bytes().to_vec()
    };
    if bytes.len() > MAX_BODY_BYTES {
        return Err(too_large());
    }
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| Rejection::new(400, format!("the body is not valid JSON: {e}")))?;
    alertmanager::parse(value).map_err(|e| Rejection::new(400, e.to_string()))
}

fn too_large() -> Rejection {
    Rejection::new(413, format!("the body exceeds {MAX_BODY_BYTES} bytes"))
}

fn authenticate(headers: &HeaderMap, token: Option<&WebhookToken>) -> Result<(), Rejection> {
    let unauthorized = || Rejection::new(401, "missing or invalid bearer token");
    // Fail closed: without a configured token no request is authentic.
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

/// Builds the Function URL response for a JSON body.
pub fn response(status: u16, body: &Value) -> LambdaFunctionUrlResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let mut resp = LambdaFunctionUrlResponse::default();
    resp.status_code = i64::from(status);
    resp.headers = headers;
    resp.body = Some(body.to_string());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOKEN: &str = "s3cret-token-with-length";

    fn request(auth: Option<&str>, body: &str, b64: bool) -> LambdaFunctionUrlRequest {
        let mut headers = json!({"content-type": "application/json"});
        if let Some(a) = auth {
            headers["authorization"] = json!(a);
        }
        let body = if b64 {
            base64::engine::general_purpose::STANDARD.encode(body)
        } else {
            body.to_owned()
        };
        serde_json::from_value(json!({
            "version": "2.0", "rawPath": "/", "rawQueryString": "", "headers": headers,
            "requestContext": {"accountId": "123456789012", "apiId": "abc", "domainName": "abc.lambda-url.us-east-1.on.aws",
                "domainPrefix": "abc", "requestId": "r1", "routeKey": "$default", "stage": "$default",
                "time": "22/Nov/2026:10:00:00 +0000", "timeEpoch": 1795000000000i64,
                "http": {"method": "POST", "path": "/", "protocol": "HTTP/1.1", "sourceIp": "203.0.113.9", "userAgent": "Alertmanager/0.28.1"}},
            "body": body, "isBase64Encoded": b64
        }))
        .unwrap()
    }

    fn payload() -> String {
        json!({"version": "4", "alerts": [{"status": "firing", "labels": {"node": "worker-1"}}]})
            .to_string()
    }

    #[test]
    fn accepts_the_right_token_plain_and_base64() {
        let token = WebhookToken::new(TOKEN).unwrap();
        for b64 in [false, true] {
            let req = request(Some(&format!("Bearer {TOKEN}")), &payload(), b64);
            assert_eq!(parse(&req, Some(&token)).unwrap().suspects.len(), 1);
        }
        let req = request(Some(&format!("bearer {TOKEN}")), &payload(), false);
        assert!(parse(&req, Some(&token)).is_ok());
    }

    #[test]
    fn refuses_everything_else_with_401() {
        let token = WebhookToken::new(TOKEN).unwrap();
        for auth in [
            None,
            Some("Bearer"),
            Some("Bearer wrong-token-of-some-length"),
            Some(&format!("Basic {TOKEN}")),
            Some(&format!("Bearer {TOKEN}x")),
            Some(TOKEN),
        ] {
            let req = request(auth, &payload(), false);
            assert_eq!(
                parse(&req, Some(&token)).unwrap_err().status,
                401,
                "{auth:?}"
            );
        }
        let req = request(Some(&format!("Bearer {TOKEN}")), &payload(), false);
        assert_eq!(parse(&req, None).unwrap_err().status, 401);
    }

    #[test]
    fn auth_comes_before_the_body() {
        let token = WebhookToken::new(TOKEN).unwrap();
        let req = request(None, "not json", false);
        assert_eq!(parse(&req, Some(&token)).unwrap_err().status, 401);
    }

    #[test]
    fn bad_bodies_are_4xx() {
        let token = WebhookToken::new(TOKEN).unwrap();
        let auth = format!("Bearer {TOKEN}");
        let mut req = request(Some(&auth), "{", false);
        assert_eq!(parse(&req, Some(&token)).unwrap_err().status, 400);
        req.body = Some("***".into());
        req.is_base64_encoded = true;
        assert_eq!(parse(&req, Some(&token)).unwrap_err().status, 400);
        req.body = None;
        assert_eq!(parse(&req, Some(&token)).unwrap_err().status, 400);
        let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(MAX_BODY_BYTES));
        let req = request(Some(&auth), &big, false);
        assert_eq!(parse(&req, Some(&token)).unwrap_err().status, 413);
        let mut req = request(Some(&auth), &payload(), false);
        req.headers
            .insert("content-type", HeaderValue::from_static("text/plain"));
        assert_eq!(parse(&req, Some(&token)).unwrap_err().status, 415);
        let mut req = request(Some(&auth), &payload(), false);
        req.request_context.http.method = Some("GET".into());
        assert_eq!(parse(&req, Some(&token)).unwrap_err().status, 405);
    }

    #[test]
    fn short_tokens_are_refused_and_debug_redacts() {
        assert!(WebhookToken::new("short").is_err());
        let t = WebhookToken::new(TOKEN).unwrap();
        assert!(!format!("{t:?}").contains(TOKEN));
    }
}
