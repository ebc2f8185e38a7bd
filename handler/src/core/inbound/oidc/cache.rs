//! When to fetch Google's keys again: the decisions of the key cache, over
//! times passed in. The shell holds a [`KeyCache`] behind a lock, asks it
//! [`KeyCache::lookup`], fetches when told to and reports how that went.
//!
//! Tokens are sent by anyone who can reach the service, so what they name must
//! not drive the fetches: a kid the current keys lack triggers at most one
//! fetch per [`UNKNOWN_KID_REFETCH_SECS`], and after a failed fetch the next
//! waits [`FAILURE_BACKOFF_SECS`].

use std::sync::Arc;

use super::jwks::{KeySet, RsaKey};

/// At most one fetch per this many seconds for kids the keys lack. Google
/// publishes a key well before it signs with it, so a real new kid is rare
/// and a minute's wait for it costs one retried push at most.
pub const UNKNOWN_KID_REFETCH_SECS: i64 = 60;

/// After a failed fetch, requests are answered "retry later" for this long
/// without another try, so an outage does not turn every push into a fetch.
pub const FAILURE_BACKOFF_SECS: i64 = 5;

/// What to do for a token's kid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The key, from keys still fresh.
    Found(RsaKey),
    /// Fetch the keys, then look again.
    Fetch,
    /// The fresh keys lack it and were fetched too recently to fetch again:
    /// refuse the token.
    Unknown,
    /// No fresh keys, and the last fetch failed moments ago: retry later.
    Backoff,
}

/// The keys last fetched and when fetches happened.
#[derive(Clone, Debug, Default)]
pub struct KeyCache {
    keys: Option<Arc<KeySet>>,
    fresh_until: i64,
    last_attempt: Option<i64>,
    failed_at: Option<i64>,
}

impl KeyCache {
    /// What to do for `kid` at `now` (Unix seconds).
    pub fn lookup(&self, kid: &str, now: i64) -> Lookup {
        let fresh = self.keys.as_ref().filter(|_| now < self.fresh_until);
        match fresh {
            Some(keys) => match keys.find(kid) {
                Some(key) => Lookup::Found(key.clone()),
                None if within(self.last_attempt, now, UNKNOWN_KID_REFETCH_SECS) => Lookup::Unknown,
                None => Lookup::Fetch,
            },
            None if within(self.failed_at, now, FAILURE_BACKOFF_SECS) => Lookup::Backoff,
            None => Lookup::Fetch,
        }
    }

    /// A fetch at `now` brought `keys`, to be kept `max_age_secs`.
    pub fn fetched(&mut self, keys: KeySet, max_age_secs: i64, now: i64) {
        self.keys = Some(Arc::new(keys));
        self.fresh_until = now.saturating_add(max_age_secs);
        self.last_attempt = Some(now);
        self.failed_at = None;
    }

    /// A fetch at `now` failed. Keys still fresh stay; stale ones are not
    /// trusted past their time, whatever the fetch did.
    pub fn failed(&mut self, now: i64) {
        self.last_attempt = Some(now);
        self.failed_at = Some(now);
    }
}

/// Whether `at` is less than `secs` before `now`. A time ahead of `now` (the
/// clock stepped back) counts as recent, so it holds fetches off rather than
/// letting them through.
fn within(at: Option<i64>, now: i64, secs: i64) -> bool {
    at.is_some_and(|at| now.saturating_sub(at) < secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::inbound::oidc::jwks::parse_jwks;

    const T0: i64 = 1_700_000_000;

    fn keys(kids: &[&str]) -> KeySet {
        let keys: Vec<_> = kids
            .iter()
            .map(|kid| serde_json::json!({"kty": "RSA", "kid": kid, "n": "wQ", "e": "AQAB"}))
            .collect();
        parse_jwks(serde_json::json!({ "keys": keys }).to_string().as_bytes()).expect("keys")
    }

    fn found(lookup: Lookup) -> String {
        match lookup {
            Lookup::Found(key) => key.kid,
            other => panic!("expected a key, got {other:?}"),
        }
    }

    #[test]
    fn an_empty_cache_fetches() {
        assert_eq!(KeyCache::default().lookup("a", T0), Lookup::Fetch);
    }

    #[test]
    fn fresh_keys_answer_until_max_age() {
        let mut cache = KeyCache::default();
        cache.fetched(keys(&["a"]), 300, T0);
        assert_eq!(found(cache.lookup("a", T0)), "a");
        assert_eq!(found(cache.lookup("a", T0 + 299)), "a");
        assert_eq!(cache.lookup("a", T0 + 300), Lookup::Fetch);
    }

    #[test]
    fn an_unknown_kid_fetches_at_most_once_per_interval() {
        let mut cache = KeyCache::default();
        cache.fetched(keys(&["a"]), 3600, T0);
        assert_eq!(cache.lookup("b", T0), Lookup::Unknown);
        assert_eq!(
            cache.lookup("b", T0 + UNKNOWN_KID_REFETCH_SECS - 1),
            Lookup::Unknown
        );
        let later = T0 + UNKNOWN_KID_REFETCH_SECS;
        assert_eq!(cache.lookup("b", later), Lookup::Fetch);
        cache.fetched(keys(&["a", "b"]), 3600, later);
        assert_eq!(found(cache.lookup("b", later)), "b");
        // A fetch that failed counts as an attempt too.
        cache.failed(later + 100);
        assert_eq!(cache.lookup("c", later + 101), Lookup::Unknown);
        assert_eq!(found(cache.lookup("a", later + 101)), "a");
    }

    #[test]
    fn a_failed_fetch_holds_off_the_next_for_a_moment() {
        let mut cache = KeyCache::default();
        cache.failed(T0);
        assert_eq!(cache.lookup("a", T0), Lookup::Backoff);
        assert_eq!(
            cache.lookup("a", T0 + FAILURE_BACKOFF_SECS - 1),
            Lookup::Backoff
        );
        assert_eq!(cache.lookup("a", T0 + FAILURE_BACKOFF_SECS), Lookup::Fetch);
    }

    #[test]
    fn stale_keys_are_not_used_when_the_refetch_fails() {
        let mut cache = KeyCache::default();
        cache.fetched(keys(&["a"]), 60, T0);
        cache.failed(T0 + 61);
        assert_eq!(cache.lookup("a", T0 + 62), Lookup::Backoff);
        assert_eq!(
            cache.lookup("a", T0 + 61 + FAILURE_BACKOFF_SECS),
            Lookup::Fetch
        );
    }

    #[test]
    fn a_clock_stepped_back_holds_fetches_off() {
        let mut cache = KeyCache::default();
        cache.failed(T0);
        assert_eq!(cache.lookup("a", T0 - 3600), Lookup::Backoff);
        cache.fetched(keys(&["a"]), 300, T0);
        assert_eq!(cache.lookup("b", T0 - 3600), Lookup::Unknown);
    }
}
