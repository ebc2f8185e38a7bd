//! The verifier against a key server of the test's own: tokens signed with the
//! committed test keys (`handler/tests/fixtures/oidc`), their public halves
//! served as a JWK Set over HTTP on the loopback address, each request counted.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use serde_json::{Value, json};

use super::*;
use crate::core::inbound::oidc::cache::{FAILURE_BACKOFF_SECS, UNKNOWN_KID_REFETCH_SECS};

const NOW: i64 = 1_700_000_000;
const AUDIENCE: &str = "https://node-fencer-abc123-ew.a.run.app/pubsub";
const EMAIL: &str = "pusher@my-project.iam.gserviceaccount.com";

static KEY_A: &[u8] = include_bytes!("../../../tests/fixtures/oidc/test-key-a.pk8.der");
static KEY_B: &[u8] = include_bytes!("../../../tests/fixtures/oidc/test-key-b.pk8.der");

/// reqwest is built without a provider of its own; `serve` installs ring at
/// start, and so does every test here.
fn install_ring() {
    // Err means one is installed already (another test did it).
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

struct Signer {
    pair: RsaKeyPair,
    kid: &'static str,
}

impl Signer {
    fn new(der: &[u8], kid: &'static str) -> Self {
        let pair = RsaKeyPair::from_pkcs8(der).expect("a test key in PKCS#8");
        Self { pair, kid }
    }

    fn a() -> Self {
        Self::new(KEY_A, "key-a")
    }

    fn b() -> Self {
        Self::new(KEY_B, "key-b")
    }

    fn jwk(&self) -> Value {
        let public = RsaPublicKeyComponents::<Vec<u8>>::from(self.pair.public());
        json!({"kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid,
               "n": b64(&public.n), "e": b64(&public.e)})
    }

    fn header(&self) -> Value {
        json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"})
    }

    /// `header.claims.signature`, signed with this key whatever the header says.
    fn sign(&self, header: &Value, claims: &Value) -> String {
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let mut signature = vec![0; self.pair.public().modulus_len()];
        self.pair
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                input.as_bytes(),
                &mut signature,
            )
            .expect("signing");
        format!("{input}.{}", b64(&signature))
    }

    fn token(&self, claims: &Value) -> String {
        self.sign(&self.header(), claims)
    }
}

fn claims() -> Value {
    json!({
        "aud": AUDIENCE,
        "azp": "113774264463038321964",
        "email": EMAIL,
        "email_verified": true,
        "exp": NOW + 3000,
        "iat": NOW - 600,
        "iss": "https://accounts.google.com",
        "sub": "113774264463038321964"
    })
}

fn claims_with(name: &str, value: Value) -> Value {
    let mut c = claims();
    c[name] = value;
    c
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// What the key server answers, changeable while it runs.
struct Answer {
    status: u16,
    body: String,
    cache_control: String,
}

/// A one-request-per-connection HTTP/1.1 server on the loopback address.
struct KeyServer {
    url: String,
    hits: Arc<AtomicUsize>,
    answer: Arc<StdMutex<Answer>>,
    /// Per response, whether it was written to its end.
    delivered: Arc<StdMutex<Vec<bool>>>,
}

impl KeyServer {
    fn start(keys: &[&Signer]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let url = format!(
            "http://{}/oauth2/v3/certs",
            listener.local_addr().expect("an address")
        );
        let hits = Arc::new(AtomicUsize::new(0));
        let answer = Arc::new(StdMutex::new(Answer {
            status: 200,
            body: String::new(),
            cache_control: "public, max-age=3600, must-revalidate, no-transform".into(),
        }));
        let server = Self {
            url,
            hits,
            answer,
            delivered: Arc::default(),
        };
        server.publish(keys);
        let (hits, answer, delivered) = (
            server.hits.clone(),
            server.answer.clone(),
            server.delivered.clone(),
        );
        // Detached: it ends with the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                hits.fetch_add(1, Ordering::SeqCst);
                let response = {
                    let a = answer.lock().expect("the answer");
                    format!(
                        "HTTP/1.1 {} X\r\nContent-Type: application/json\r\n\
                         Cache-Control: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                        a.status,
                        a.cache_control,
                        a.body.len(),
                        a.body
                    )
                };
                let written = stream.write_all(response.as_bytes()).is_ok();
                delivered.lock().expect("the log").push(written);
            }
        });
        server
    }

    fn publish(&self, keys: &[&Signer]) {
        let keys: Vec<Value> = keys.iter().map(|k| k.jwk()).collect();
        self.answer.lock().expect("the answer").body = json!({ "keys": keys }).to_string();
    }

    fn set(&self, change: impl FnOnce(&mut Answer)) {
        change(&mut self.answer.lock().expect("the answer"));
    }

    /// Waits (bounded) until `n` responses have been written or given up on.
    /// Async: the client's connection task must run meanwhile to close its end.
    async fn delivered(&self, n: usize) -> Vec<bool> {
        for _ in 0..1000 {
            let delivered = self.delivered.lock().expect("the log").clone();
            if delivered.len() >= n {
                return delivered;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("fewer than {n} responses written in 10 s");
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn verifier(&self) -> PushVerifier {
        install_ring();
        let expected = Expected::new(AUDIENCE, EMAIL).expect("an expectation");
        PushVerifier::with_certs_url(expected, &self.url).expect("a verifier")
    }
}

/// What is sent, as whom, and the refusal it must get.
type RefusalCase = (&'static str, Option<String>, fn(&Refusal) -> bool);

fn refusal(result: Result<PushIdentity, AuthError>) -> Refusal {
    match result {
        Err(AuthError::Refused(refusal)) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn unavailable(result: Result<PushIdentity, AuthError>) -> KeysError {
    let e = match result {
        Err(e) => e,
        Ok(identity) => panic!("expected keys unavailable, got {identity:?}"),
    };
    assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE, "{e}");
    match e {
        AuthError::KeysUnavailable(keys) => keys,
        AuthError::Refused(refused) => panic!("expected keys unavailable, got {refused:?}"),
    }
}

#[tokio::test]
async fn a_valid_push_token_passes() {
    let a = Signer::a();
    let server = KeyServer::start(&[&a, &Signer::b()]);
    let identity = server
        .verifier()
        .verify(Some(&bearer(&a.token(&claims()))), NOW)
        .await
        .expect("valid");
    assert_eq!(
        identity,
        PushIdentity {
            email: EMAIL.into(),
            subject: Some("113774264463038321964".into()),
            issued_at: NOW - 600,
            expires_at: NOW + 3000,
        }
    );
}

#[tokio::test]
async fn tokens_not_valid_for_this_service_are_refused() {
    let (a, b) = (Signer::a(), Signer::b());
    let server = KeyServer::start(&[&a]);
    let verifier = server.verifier();

    let flipped = {
        let token = a.token(&claims());
        let (signed, signature) = token.rsplit_once('.').expect("three parts");
        let mut signature = URL_SAFE_NO_PAD.decode(signature).expect("base64url");
        signature[17] ^= 0x01;
        format!("{signed}.{}", b64(&signature))
    };
    // Claims changed after signing, still well-formed and for us.
    let altered = {
        let token = a.token(&claims());
        let signature = token.rsplit_once('.').expect("three parts").1;
        let forged = claims_with("sub", json!("999"));
        let h = b64(a.header().to_string().as_bytes());
        format!("{h}.{}.{signature}", b64(forged.to_string().as_bytes()))
    };
    let unsigned = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "kid": "key-a"})
            .to_string()
            .as_bytes()),
        b64(claims().to_string().as_bytes())
    );
    let hs256 = a.sign(&json!({"alg": "HS256", "kid": "key-a"}), &claims());
    let cases: Vec<RefusalCase> = vec![
        (
            "wrong audience",
            Some(bearer(
                &a.token(&claims_with("aud", json!("https://other.example"))),
            )),
            |r| matches!(r, Refusal::Token(TokenError::Audience { .. })),
        ),
        (
            "wrong issuer",
            Some(bearer(
                &a.token(&claims_with("iss", json!("https://evil.example"))),
            )),
            |r| matches!(r, Refusal::Token(TokenError::Issuer)),
        ),
        (
            "expired",
            Some(bearer(&a.token(&claims_with("exp", json!(NOW - 1))))),
            |r| matches!(r, Refusal::Token(TokenError::Expired { .. })),
        ),
        (
            "wrong email",
            Some(bearer(&a.token(&claims_with(
                "email",
                json!("other@my-project.iam.gserviceaccount.com"),
            )))),
            |r| matches!(r, Refusal::Token(TokenError::Email { .. })),
        ),
        (
            "unverified email",
            Some(bearer(
                &a.token(&claims_with("email_verified", json!(false))),
            )),
            |r| matches!(r, Refusal::Token(TokenError::EmailUnverified)),
        ),
        ("alg none", Some(bearer(&unsigned)), |r| {
            matches!(r, Refusal::Token(TokenError::NotCompact))
        }),
        ("HS256", Some(bearer(&hs256)), |r| {
            matches!(r, Refusal::Token(TokenError::Algorithm(Some("HS256"))))
        }),
        ("a flipped signature byte", Some(bearer(&flipped)), |r| {
            matches!(r, Refusal::BadSignature)
        }),
        (
            "claims changed after signing",
            Some(bearer(&altered)),
            |r| matches!(r, Refusal::BadSignature),
        ),
        (
            "another key under this key's kid",
            Some(bearer(&b.sign(&a.header(), &claims()))),
            |r| matches!(r, Refusal::BadSignature),
        ),
        ("an unknown kid", Some(bearer(&b.token(&claims()))), |r| {
            matches!(r, Refusal::UnknownKey)
        }),
        ("no header", None, |r| {
            matches!(r, Refusal::Token(TokenError::MissingAuthorization))
        }),
        ("Basic", Some("Basic cHVzaGVyOnNlY3JldA==".into()), |r| {
            matches!(r, Refusal::Token(TokenError::NotBearer))
        }),
        (
            "the token without its scheme",
            Some(a.token(&claims())),
            |r| matches!(r, Refusal::Token(TokenError::NotBearer)),
        ),
    ];
    for (what, header, expected) in cases {
        let result = verifier.verify(header.as_deref(), NOW).await;
        if let Err(e) = &result {
            assert_eq!(e.status(), http::StatusCode::UNAUTHORIZED, "{what}");
        }
        let refused = refusal(result);
        assert!(expected(&refused), "{what}: {refused:?}");
    }
    // The untouched token passes with the same verifier: the refusals are the changes'.
    assert!(
        verifier
            .verify(Some(&bearer(&a.token(&claims()))), NOW)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn refusals_of_form_and_claims_fetch_nothing() {
    let a = Signer::a();
    let server = KeyServer::start(&[&a]);
    let verifier = server.verifier();
    for header in [
        None,
        Some("Basic x".to_owned()),
        Some(bearer("a.b.c")),
        Some(bearer(&a.token(&claims_with("aud", json!("x"))))),
    ] {
        assert!(verifier.verify(header.as_deref(), NOW).await.is_err());
    }
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn keys_are_fetched_once_and_kept_for_max_age() {
    let a = Signer::a();
    let server = KeyServer::start(&[&a]);
    server.set(|answer| answer.cache_control = "public, max-age=600".into());
    let verifier = server.verifier();
    let header = bearer(&a.token(&claims()));
    for now in [NOW, NOW + 1, NOW + 599] {
        verifier.verify(Some(&header), now).await.expect("valid");
    }
    assert_eq!(server.hits(), 1, "one fetch for three verifications");
    verifier
        .verify(Some(&header), NOW + 600)
        .await
        .expect("valid");
    assert_eq!(server.hits(), 2, "fetched again once max-age is over");
}

#[tokio::test]
async fn an_unknown_kid_refetches_at_most_once_per_interval() {
    let (a, b) = (Signer::a(), Signer::b());
    let server = KeyServer::start(&[&a]);
    let verifier = server.verifier();
    verifier
        .verify(Some(&bearer(&a.token(&claims()))), NOW)
        .await
        .expect("valid");
    assert_eq!(server.hits(), 1);

    // Google starts signing with a key it now publishes.
    server.publish(&[&a, &b]);
    let by_b = bearer(&b.token(&claims()));
    for now in NOW..NOW + 20 {
        let refused = refusal(verifier.verify(Some(&by_b), now).await);
        assert!(matches!(refused, Refusal::UnknownKey), "{refused:?}");
    }
    assert_eq!(server.hits(), 1, "no refetch within the interval");

    let later = NOW + UNKNOWN_KID_REFETCH_SECS;
    verifier
        .verify(Some(&by_b), later)
        .await
        .expect("the new key, refetched");
    assert_eq!(server.hits(), 2);

    // A flood of garbage kids after that costs at most one fetch per interval.
    let c = Signer::new(KEY_B, "key-c");
    let by_c = bearer(&c.token(&claims()));
    for now in later..=later + 2 * UNKNOWN_KID_REFETCH_SECS {
        let refused = refusal(verifier.verify(Some(&by_c), now).await);
        assert!(matches!(refused, Refusal::UnknownKey), "{refused:?}");
    }
    assert_eq!(
        server.hits(),
        4,
        "one fetch per interval for the unknown kid"
    );
}

#[tokio::test]
async fn keys_out_of_reach_mean_retry_later() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let url = format!(
        "http://{}/certs",
        listener.local_addr().expect("an address")
    );
    drop(listener);
    install_ring();
    let expected = Expected::new(AUDIENCE, EMAIL).expect("an expectation");
    let verifier = PushVerifier::with_certs_url(expected, &url).expect("a verifier");
    let token = bearer(&Signer::a().token(&claims()));
    let down = unavailable(verifier.verify(Some(&token), NOW).await);
    assert!(matches!(down, KeysError::Fetch { .. }), "{down:?}");
    assert!(down.to_string().contains(&url), "{down}");
}

#[tokio::test]
async fn a_failing_key_server_is_retried_after_a_backoff() {
    let a = Signer::a();
    let server = KeyServer::start(&[&a]);
    server.set(|answer| answer.status = 500);
    let verifier = server.verifier();
    let token = bearer(&a.token(&claims()));

    let failed = unavailable(verifier.verify(Some(&token), NOW).await);
    assert!(
        matches!(failed, KeysError::Status { status: 500, .. }),
        "{failed:?}"
    );
    let held = unavailable(verifier.verify(Some(&token), NOW + 1).await);
    assert!(matches!(held, KeysError::Backoff), "{held:?}");
    assert_eq!(server.hits(), 1, "no fetch during the backoff");

    server.set(|answer| answer.status = 200);
    verifier
        .verify(Some(&token), NOW + FAILURE_BACKOFF_SECS)
        .await
        .expect("valid once the keys are back");
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn an_unusable_key_set_means_retry_later() {
    let a = Signer::a();
    let server = KeyServer::start(&[&a]);
    let verifier = server.verifier();
    let token = bearer(&a.token(&claims()));
    for (body, problem) in [
        ("<html>".to_owned(), JwksError::NotJwks),
        (
            format!(
                "{{\"keys\": [], \"pad\": \"{}\"}}",
                "x".repeat(MAX_JWKS_LEN)
            ),
            JwksError::TooLarge,
        ),
        (
            "{\"keys\": []}".to_owned(),
            JwksError::NoUsableKey { skipped: 0 },
        ),
    ] {
        server.set(|answer| answer.body = body);
        let now = NOW + 100 * server.hits() as i64;
        match unavailable(verifier.verify(Some(&token), now).await) {
            KeysError::Jwks { source, .. } => assert_eq!(source, problem),
            other => panic!("expected {problem:?}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_oversized_key_set_is_not_read_to_its_end() {
    let a = Signer::a();
    let server = KeyServer::start(&[&a]);
    // Far more than the socket buffers hold, so a full write means a full read.
    server.set(|answer| answer.body = " ".repeat(64 << 20));
    let verifier = server.verifier();
    let token = bearer(&a.token(&claims()));
    match unavailable(verifier.verify(Some(&token), NOW).await) {
        KeysError::Jwks { source, .. } => assert_eq!(source, JwksError::TooLarge),
        other => panic!("expected too large, got {other:?}"),
    }
    assert_eq!(
        server.delivered(1).await,
        vec![false],
        "the client read it all"
    );
}

#[tokio::test]
async fn the_keys_are_taken_from_a_trusted_transport_only() {
    install_ring();
    let expected = Expected::new(AUDIENCE, EMAIL).expect("an expectation");
    for url in [
        "http://www.googleapis.com/oauth2/v3/certs",
        "http://10.0.0.1/certs",
        "ftp://127.0.0.1/certs",
        "file:///etc/certs.json",
        "not a url",
    ] {
        assert!(
            matches!(
                PushVerifier::with_certs_url(expected.clone(), url),
                Err(BuildError::CertsUrl(_))
            ),
            "{url}"
        );
    }
    for url in [
        GOOGLE_CERTS_URL,
        "http://127.0.0.1:8080/certs",
        "http://[::1]:8080/certs",
        "http://localhost:8080/certs",
    ] {
        assert!(
            PushVerifier::with_certs_url(expected.clone(), url).is_ok(),
            "{url}"
        );
    }
    let google = PushVerifier::new(expected).expect("Google's keys");
    assert_eq!(google.certs_url.as_str(), GOOGLE_CERTS_URL);
    assert_eq!(google.expected().audiences(), [AUDIENCE]);
}
