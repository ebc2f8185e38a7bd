//! The Function URL entry: the first byte picks the method, the token, the
//! content type and base64; the rest is the body. Whatever the body, a
//! request without the right token is refused with 401 and nothing else is
//! looked at; with it, a batch of well-formed suspects or a 4xx rejection.
#![no_main]

use aws_lambda_events::event::lambda_function_urls::LambdaFunctionUrlRequest;
use http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use node_fencer::core::inbound::trigger::function_url::{self, WebhookToken};
use node_fencer_fuzz::assert_well_formed;

const TOKEN: &str = "fuzz-token-0123456789abcdef";

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let Ok(token) = WebhookToken::new(TOKEN) else {
        return;
    };
    let right_token = flags & 1 != 0;
    let mut req = LambdaFunctionUrlRequest::default();
    req.request_context.http.method = Some(if flags & 2 != 0 { "POST" } else { "GET" }.into());
    let bearer = if right_token {
        format!("Bearer {TOKEN}")
    } else {
        format!("Bearer {TOKEN}x")
    };
    if let Ok(v) = HeaderValue::from_str(&bearer) {
        req.headers.insert(http::header::AUTHORIZATION, v);
    }
    if flags & 4 != 0 {
        req.headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    req.is_base64_encoded = flags & 8 != 0;
    req.body = Some(String::from_utf8_lossy(body).into_owned());

    match function_url::parse(&req, Some(&token)) {
        Ok(batch) => {
            assert!(right_token, "accepted without the right token");
            assert_well_formed(&batch);
        }
        Err(rejection) => {
            assert!((400..500).contains(&rejection.status), "{rejection:?}");
            if !right_token && flags & 2 != 0 {
                assert_eq!(rejection.status, 401, "{rejection:?}");
            }
        }
    }
});
