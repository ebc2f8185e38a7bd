//! EKS bearer tokens: a presigned STS `GetCallerIdentity` URL, signed with the
//! `x-k8s-aws-id` header, base64url-encoded behind `k8s-aws-v1.`. The same
//! token `aws eks get-token` prints, made without any binary.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine;

/// The token prefix EKS expects.
pub const TOKEN_PREFIX: &str = "k8s-aws-v1.";
/// How long EKS accepts a token; clients are rebuilt well before.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// Refresh this long after minting, leaving a margin before expiry.
pub const REFRESH_AFTER: Duration = Duration::from_secs(10 * 60);

/// Presigning failed (bad region or credentials).
#[derive(Debug, thiserror::Error)]
#[error("could not presign the EKS token: {0}")]
pub struct TokenError(String);

/// Presigns `GetCallerIdentity` for `cluster` in `region` at `now`.
pub fn presign(
    cluster: &str,
    region: &str,
    credentials: Credentials,
    now: SystemTime,
) -> Result<String, TokenError> {
    let err = |e: &dyn std::fmt::Display| TokenError(e.to_string());
    let host = format!("sts.{region}.amazonaws.com");
    let url = format!("https://{host}/?Action=GetCallerIdentity&Version=2011-06-15");
    let identity: Identity = credentials.into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    // EKS ignores X-Amz-Expires beyond its own 15 minutes; 60 s is what
    // aws-iam-authenticator signs.
    settings.expires_in = Some(Duration::from_secs(60));
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| err(&e))?
        .into();
    let headers = [("host", host.as_str()), ("x-k8s-aws-id", cluster)];
    let signable = SignableRequest::new(
        "GET",
        url.as_str(),
        headers.into_iter(),
        SignableBody::Bytes(&[]),
    )
    .map_err(|e| err(&e))?;
    let (instructions, _signature) = sign(signable, &params).map_err(|e| err(&e))?.into_parts();
    let mut request = http::Request::builder()
        .method("GET")
        .uri(&url)
        .body(())
        .map_err(|e| err(&e))?;
    instructions.apply_to_request_http1x(&mut request);
    let signed = request.uri().to_string();
    Ok(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signed)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_a_presigned_sts_url_bound_to_the_cluster() {
        let creds = Credentials::new(
            "AKIDEXAMPLE",
            "secret",
            Some("session".into()),
            None,
            "test",
        );
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let token = presign("prod-eu", "eu-west-1", creds.clone(), now).unwrap();
        let body = token.strip_prefix(TOKEN_PREFIX).unwrap();
        assert!(!body.contains('='), "no padding");
        let url = String::from_utf8(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(body)
                .unwrap(),
        )
        .unwrap();
        assert!(url.starts_with(
            "https://sts.eu-west-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15&"
        ));
        for part in [
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            "X-Amz-Expires=60",
            "X-Amz-SignedHeaders=host%3Bx-k8s-aws-id",
            "X-Amz-Security-Token=session",
            "X-Amz-Credential=AKIDEXAMPLE%2F20261118%2Feu-west-1%2Fsts%2Faws4_request",
            "X-Amz-Signature=",
        ] {
            assert!(url.contains(part), "{part} missing from {url}");
        }
        // Deterministic for the same inputs; bound to the cluster name.
        assert_eq!(
            presign("prod-eu", "eu-west-1", creds.clone(), now).unwrap(),
            token
        );
        assert_ne!(presign("prod-us", "eu-west-1", creds, now).unwrap(), token);
    }
}
