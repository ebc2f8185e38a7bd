//! The OIDC checks of a Pub/Sub push or Eventarc request on any bytes: as an
//! `Authorization` header, as a bare token, as a JWK Set and as a
//! `Cache-Control` value. A refusal, or a result that holds what the checks
//! promise, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_fencer::core::inbound::oidc::{self, CLOCK_SKEW_SECS, Expected, MAX_TOKEN_LEN, jwks};

const NOW: i64 = 1_700_000_000;
const AUDIENCE: &str = "https://node-fencer-abc123-ew.a.run.app/pubsub";
const EMAIL: &str = "pusher@my-project.iam.gserviceaccount.com";

fuzz_target!(|data: &[u8]| {
    if let Ok(keys) = jwks::parse_jwks(data) {
        for (i, key) in keys.keys().iter().enumerate() {
            assert!(!key.kid.is_empty());
            // ring refuses leading zeros; the parser drops them.
            assert!(key.n.first().is_some_and(|b| *b != 0));
            assert!(key.e.first().is_some_and(|b| *b != 0));
            assert!(keys.keys()[..i].iter().all(|k| k.kid != key.kid));
            assert_eq!(keys.find(&key.kid), Some(key));
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let age = jwks::max_age_secs(Some(text));
    assert!((jwks::MIN_MAX_AGE_SECS..=jwks::MAX_MAX_AGE_SECS).contains(&age));

    let Ok(expected) = Expected::new(AUDIENCE, EMAIL) else {
        return;
    };
    for token in [oidc::bearer(Some(text)).ok(), Some(text)]
        .into_iter()
        .flatten()
    {
        let Ok(checked) = oidc::check_token(token, &expected, NOW) else {
            continue;
        };
        // What passes is what was promised: the bytes before the last dot are
        // the ones signed, and the claims are the expected ones.
        assert!(token.len() <= MAX_TOKEN_LEN);
        assert!(token.as_bytes().starts_with(checked.signing_input));
        assert_eq!(
            token.as_bytes().get(checked.signing_input.len()),
            Some(&b'.')
        );
        assert!(!checked.kid.is_empty() && !checked.signature.is_empty());
        assert_eq!(checked.identity.email, EMAIL);
        assert!(checked.identity.expires_at > NOW);
        assert!(checked.identity.issued_at <= NOW + CLOCK_SKEW_SECS);
    }
});
