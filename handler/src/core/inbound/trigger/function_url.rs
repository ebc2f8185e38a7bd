//! Function URL requests: the Alertmanager webhook ([`super::webhook`]) in
//! the Lambda's envelope. The method and the headers are checked before the
//! body is decoded (base64 when Lambda says so), then the neutral webhook
//! entry takes the bytes.

use std::borrow::Cow;

use aws_lambda_events::event::lambda_function_urls::{
    LambdaFunctionUrlRequest, LambdaFunctionUrlResponse,
};
use base64::Engine;
use http::{HeaderMap, HeaderValue};
use serde_json::Value;

use super::webhook::{self, Reply};
pub use super::webhook::{MAX_BODY_BYTES, Rejection, WebhookToken};
use crate::core::inbound::suspect::Batch;

/// Authenticates and parses a Function URL request carrying an Alertmanager payload.
pub fn parse(
    req: &LambdaFunctionUrlRequest,
    token: Option<&WebhookToken>,
) -> Result<Batch, Rejection> {
    method(req)?;
    webhook::admit(&req.headers, token)?;
    webhook::parse(&body(req)?)
}

/// Only a POST is a webhook.
pub fn method(req: &LambdaFunctionUrlRequest) -> Result<(), Rejection> {
    let method = req.request_context.http.method.as_deref().unwrap_or("");
    if !method.eq_ignore_ascii_case("POST") {
        return Err(Rejection::new(405, "only POST is accepted"));
    }
    Ok(())
}

/// The body's bytes, decoded from base64 when Lambda encoded them; one
/// too long to decode within the bound is refused undecoded.
pub fn body(req: &LambdaFunctionUrlRequest) -> Result<Cow<'_, [u8]>, Rejection> {
    let body = req
        .body
        .as_deref()
        .ok_or_else(|| Rejection::new(400, "the request has no body"))?;
    if !req.is_base64_encoded {
        return Ok(Cow::Borrowed(body.as_bytes()));
    }
    if body.len() > MAX_BODY_BYTES.div_ceil(3) * 4 {
        return Err(Rejection::too_large());
    }
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map(Cow::Owned)
        .map_err(|_| Rejection::new(400, "the body is not valid base64"))
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

/// A webhook's reply as a Function URL response.
pub fn reply(reply: &Reply) -> LambdaFunctionUrlResponse {
    response(reply.status, &reply.body)
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
