//! Verifying the OIDC token of a Pub/Sub push or Eventarc request: its form
//! and claims by the core ([`crate::core::inbound::oidc`]), its RS256 signature with
//! Google's published keys, fetched over HTTPS and cached as the core's
//! [`KeyCache`] decides.
//!
//! Two kinds of failure, answered differently: a token that is not valid for
//! this service is refused (401, [`AuthError::Refused`]); keys that cannot be
//! had are Google's or the network's fault, not the sender's, so the answer is
//! "retry later" (503, [`AuthError::KeysUnavailable`]) and the push comes back.

use std::time::Duration;

use reqwest::{Url, header::CACHE_CONTROL, redirect};
use ring::signature::{RSA_PKCS1_2048_8192_SHA256, RsaPublicKeyComponents};
use tokio::sync::Mutex;

use crate::core::inbound::oidc::cache::{KeyCache, Lookup};
use crate::core::inbound::oidc::jwks::{
    self, GOOGLE_CERTS_URL, JwksError, KeySet, MAX_JWKS_LEN, RsaKey,
};
use crate::core::inbound::oidc::{self, Expected, ExpectedError, PushIdentity, TokenError};
use crate::shell::error_chain;

/// Bounds one fetch of the keys: a push waits on it, and Pub/Sub gives a push
/// 10 s by default before it counts as failed.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a request is not let in.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Not a valid token for this service: answer 401.
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    /// Google's keys cannot be had: answer 503, so the push is retried.
    #[error("the token cannot be checked now: {0}")]
    KeysUnavailable(#[from] KeysError),
}

impl AuthError {
    /// The HTTP status to answer with.
    pub fn status(&self) -> http::StatusCode {
        match self {
            AuthError::Refused(_) => http::StatusCode::UNAUTHORIZED,
            AuthError::KeysUnavailable(_) => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Why a token is not valid for this service.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Its form or claims (the core's checks).
    #[error(transparent)]
    Token(#[from] TokenError),
    /// It names a key Google does not publish (as of the last fetch).
    #[error("the token names a key Google does not publish")]
    UnknownKey,
    /// The signature does not verify with the key it names.
    #[error("the token's signature does not verify")]
    BadSignature,
}

/// Why Google's keys cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// No answer (connection, TLS, timeout).
    #[error("fetching {url} failed: {message}")]
    Fetch {
        /// The certs URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// An answer other than 2xx.
    #[error("{url} answered {status}")]
    Status {
        /// The certs URL.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// An answer that is not a usable key set.
    #[error("the key set from {url} is unusable: {source}")]
    Jwks {
        /// The certs URL.
        url: String,
        /// What is wrong with it.
        source: JwksError,
    },
    /// The last fetch failed moments ago; no new one yet.
    #[error("the last fetch of the keys failed moments ago")]
    Backoff,
}

/// Why a [`PushVerifier`] cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The audience or service account.
    #[error(transparent)]
    Expected(#[from] ExpectedError),
    /// Keys over plain HTTP could be swapped on the way; only a loopback
    /// address (a test's own server) is allowed without TLS.
    #[error("the certs URL {0:?} is neither https nor http to a loopback address")]
    CertsUrl(String),
    /// reqwest is built without a crypto provider of its own, and the process
    /// keeps one TLS stack: ring, installed at start.
    #[error(
        "no rustls crypto provider is installed; install ring's \
         (rustls::crypto::ring::default_provider().install_default()) at start"
    )]
    NoCryptoProvider,
    /// The HTTP client could not be built.
    #[error("building the HTTP client failed: {0}")]
    Client(String),
}

/// Verifies the `Authorization` header of Pub/Sub push and Eventarc requests.
/// One per process: it keeps Google's keys between requests.
pub struct PushVerifier {
    expected: Expected,
    certs_url: Url,
    http: reqwest::Client,
    /// Held across a fetch, so concurrent requests that need the keys wait
    /// for one fetch instead of each making their own.
    cache: Mutex<KeyCache>,
}

impl PushVerifier {
    /// A verifier with Google's keys.
    pub fn new(expected: Expected) -> Result<Self, BuildError> {
        Self::with_certs_url(expected, GOOGLE_CERTS_URL)
    }

    /// A verifier with the keys at `certs_url` (a test's own key server).
    pub fn with_certs_url(expected: Expected, certs_url: &str) -> Result<Self, BuildError> {
        let certs_url = Url::parse(certs_url)
            .ok()
            .filter(is_trusted_transport)
            .ok_or_else(|| BuildError::CertsUrl(certs_url.to_owned()))?;
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            return Err(BuildError::NoCryptoProvider);
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("node-fencer/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(FETCH_TIMEOUT)
            // The keys come from the configured URL and nowhere else.
            .redirect(redirect::Policy::none())
            .https_only(certs_url.scheme() == "https")
            .build()
            .map_err(|e| BuildError::Client(error_chain(&e)))?;
        Ok(Self {
            expected,
            certs_url,
            http,
            cache: Mutex::new(KeyCache::default()),
        })
    }

    /// What tokens must say.
    pub fn expected(&self) -> &Expected {
        &self.expected
    }

    /// Verifies an `Authorization` header value at `now_unix` (seconds).
    pub async fn verify(
        &self,
        authorization: Option<&str>,
        now_unix: i64,
    ) -> Result<PushIdentity, AuthError> {
        self.verify_with(authorization, &self.expected, now_unix)
            .await
    }

    /// [`Self::verify`] for a request to `path`: a token for a configured
    /// URL without a path followed by `path` is also accepted
    /// ([`Expected::at_path`]).
    pub async fn verify_at(
        &self,
        authorization: Option<&str>,
        path: &str,
        now_unix: i64,
    ) -> Result<PushIdentity, AuthError> {
        let expected = self.expected.at_path(path);
        self.verify_with(authorization, &expected, now_unix).await
    }

    async fn verify_with(
        &self,
        authorization: Option<&str>,
        expected: &Expected,
        now_unix: i64,
    ) -> Result<PushIdentity, AuthError> {
        let token = oidc::bearer(authorization).map_err(Refusal::Token)?;
        let checked = oidc::check_token(token, expected, now_unix).map_err(Refusal::Token)?;
        let key = self.key(&checked.kid, now_unix).await?;
        RsaPublicKeyComponents {
            n: &key.n,
            e: &key.e,
        }
        .verify(
            &RSA_PKCS1_2048_8192_SHA256,
            checked.signing_input,
            &checked.signature,
        )
        .map_err(|_| Refusal::BadSignature)?;
        Ok(checked.identity)
    }

    async fn key(&self, kid: &str, now: i64) -> Result<RsaKey, AuthError> {
        let mut cache = self.cache.lock().await;
        match cache.lookup(kid, now) {
            Lookup::Found(key) => return Ok(key),
            Lookup::Unknown => return Err(Refusal::UnknownKey.into()),
            Lookup::Backoff => return Err(KeysError::Backoff.into()),
            Lookup::Fetch => {}
        }
        match self.fetch().await {
            Ok((keys, max_age)) => cache.fetched(keys, max_age, now),
            Err(e) => {
                cache.failed(now);
                return Err(e.into());
            }
        }
        match cache.lookup(kid, now) {
            Lookup::Found(key) => Ok(key),
            _ => Err(Refusal::UnknownKey.into()),
        }
    }

    /// The key set and how long it may be kept.
    async fn fetch(&self) -> Result<(KeySet, i64), KeysError> {
        let url = || self.certs_url.to_string();
        let fetch_failed = |e: reqwest::Error| KeysError::Fetch {
            url: url(),
            message: error_chain(&e),
        };
        let unusable = |source| KeysError::Jwks { url: url(), source };
        let mut response = self
            .http
            .get(self.certs_url.clone())
            .send()
            .await
            .map_err(fetch_failed)?;
        if !response.status().is_success() {
            return Err(KeysError::Status {
                url: url(),
                status: response.status().as_u16(),
            });
        }
        let max_age = jwks::max_age_secs(
            response
                .headers()
                .get(CACHE_CONTROL)
                .and_then(|v| v.to_str().ok()),
        );
        // Read no further than the limit, whatever the length says.
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(fetch_failed)? {
            if body.len() + chunk.len() > MAX_JWKS_LEN {
                return Err(unusable(JwksError::TooLarge));
            }
            body.extend_from_slice(&chunk);
        }
        let keys = jwks::parse_jwks(&body).map_err(unusable)?;
        Ok((keys, max_age))
    }
}

fn is_trusted_transport(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    match url.scheme() {
        "https" => true,
        "http" => {
            host == "localhost"
                || host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
