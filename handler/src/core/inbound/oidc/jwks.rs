//! Google's signing keys as a JWK Set (RFC 7517), the document at
//! [`GOOGLE_CERTS_URL`], and how long the response says it may be kept.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::Value;

/// Where Google publishes the keys its ID tokens are signed with.
pub const GOOGLE_CERTS_URL: &str = "https://www.googleapis.com/oauth2/v3/certs";

/// Google's key set is about 2 KiB; a response over this is not one.
pub(crate) const MAX_JWKS_LEN: usize = 64 * 1024;

/// Kept this long when the response gives no `max-age`.
const DEFAULT_MAX_AGE_SECS: i64 = 300;

/// Never kept for less: a server that says `no-cache` or `max-age=0` would
/// otherwise have every request fetch the keys again.
pub const MIN_MAX_AGE_SECS: i64 = 60;

/// Never kept for more: Google says about six hours; a day's cap keeps a
/// wrong header from pinning keys long after they are rotated out.
pub const MAX_MAX_AGE_SECS: i64 = 24 * 3600;

/// One RSA public key: what RS256 verification needs.
#[derive(Clone, PartialEq, Eq)]
pub struct RsaKey {
    /// Its id, as tokens name it.
    pub kid: String,
    /// The modulus, big-endian, without leading zeros.
    pub n: Vec<u8>,
    /// The public exponent, big-endian, without leading zeros.
    pub e: Vec<u8>,
}

impl fmt::Debug for RsaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RsaKey")
            .field("kid", &self.kid)
            .field("modulus_bits", &(self.n.len() * 8))
            .finish_non_exhaustive()
    }
}

/// The usable keys of a JWK Set, each kid once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<RsaKey>,
    skipped: usize,
}

impl KeySet {
    /// The key with this id.
    pub fn find(&self, kid: &str) -> Option<&RsaKey> {
        self.keys.iter().find(|k| k.kid == kid)
    }

    /// The keys.
    pub fn keys(&self) -> &[RsaKey] {
        &self.keys
    }

    /// How many entries of the document were not RS256 signing keys.
    pub fn skipped(&self) -> usize {
        self.skipped
    }
}

/// Why a key-set response is unusable. The shell answers "retry later" for
/// each: the fault is on the way to the keys, not in the request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    /// Over [`MAX_JWKS_LEN`].
    #[error("the key set is over {MAX_JWKS_LEN} bytes")]
    TooLarge,
    /// Not `{"keys": [...]}`.
    #[error("the key set is not a JSON object with a keys array")]
    NotJwks,
    /// No entry is an RS256 signing key.
    #[error("the key set has no RS256 signing key ({skipped} other entries)")]
    NoUsableKey {
        /// Entries that were not.
        skipped: usize,
    },
    /// Two keys with one id: which one a token means cannot be known.
    #[error("the key set has two keys with the id {0:?}")]
    DuplicateKid(String),
}

#[derive(Deserialize)]
struct Document {
    keys: Vec<Value>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    kid: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

/// Parses a JWK Set, keeping the RSA keys meant for RS256 signatures (`alg`
/// and `use` may be absent). Other entries are skipped, not errors: a set may
/// publish keys of other kinds beside the ones in use.
pub fn parse_jwks(body: &[u8]) -> Result<KeySet, JwksError> {
    if body.len() > MAX_JWKS_LEN {
        return Err(JwksError::TooLarge);
    }
    let doc: Document = serde_json::from_slice(body).map_err(|_| JwksError::NotJwks)?;
    let mut set = KeySet::default();
    for entry in doc.keys {
        match serde_json::from_value::<Jwk>(entry)
            .ok()
            .and_then(rsa_signing_key)
        {
            Some(key) if set.find(&key.kid).is_some() => {
                return Err(JwksError::DuplicateKid(key.kid));
            }
            Some(key) => set.keys.push(key),
            None => set.skipped += 1,
        }
    }
    if set.keys.is_empty() {
        return Err(JwksError::NoUsableKey {
            skipped: set.skipped,
        });
    }
    Ok(set)
}

fn rsa_signing_key(jwk: Jwk) -> Option<RsaKey> {
    let rs256 = jwk.kty.as_deref() == Some("RSA")
        && jwk.alg.as_deref().is_none_or(|alg| alg == "RS256")
        && jwk.usage.as_deref().is_none_or(|usage| usage == "sig");
    let kid = jwk.kid.filter(|kid| !kid.is_empty())?;
    let n = unsigned(jwk.n.as_deref()?)?;
    let e = unsigned(jwk.e.as_deref()?)?;
    rs256.then_some(RsaKey { kid, n, e })
}

/// A base64url big-endian integer without its leading zeros (RFC 7518 says
/// there are none; some publishers add one, and ring refuses them).
fn unsigned(b64: &str) -> Option<Vec<u8>> {
    let bytes = URL_SAFE_NO_PAD.decode(b64).ok()?;
    let first = bytes.iter().position(|b| *b != 0)?;
    Some(bytes[first..].to_vec())
}

/// How long a key-set response may be kept: its `Cache-Control: max-age`,
/// within [`MIN_MAX_AGE_SECS`] and [`MAX_MAX_AGE_SECS`]; `no-cache` and
/// `no-store` mean the minimum, no header or no `max-age` the default.
pub fn max_age_secs(cache_control: Option<&str>) -> i64 {
    let Some(value) = cache_control else {
        return DEFAULT_MAX_AGE_SECS;
    };
    let mut max_age = None;
    for directive in value.split(',').map(str::trim) {
        let (name, arg) = directive.split_once('=').unwrap_or((directive, ""));
        if name.eq_ignore_ascii_case("no-cache") || name.eq_ignore_ascii_case("no-store") {
            return MIN_MAX_AGE_SECS;
        }
        if name.eq_ignore_ascii_case("max-age") {
            // A malformed or duplicated max-age is stale per RFC 9111 §4.2.1.
            match (max_age, arg.trim_matches('"').parse::<i64>()) {
                (None, Ok(secs)) => max_age = Some(secs),
                _ => return MIN_MAX_AGE_SECS,
            }
        }
    }
    max_age.map_or(DEFAULT_MAX_AGE_SECS, |secs| {
        secs.clamp(MIN_MAX_AGE_SECS, MAX_MAX_AGE_SECS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Google's form, with a modulus that is not a real key (parsing does not
    /// care) and a leading zero to strip.
    fn google_like() -> Value {
        json!({"keys": [
            {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k1",
             "n": URL_SAFE_NO_PAD.encode([0u8, 0xc1, 0x02, 0x03]), "e": "AQAB"},
            {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k2",
             "n": URL_SAFE_NO_PAD.encode([0xd1, 0x02]), "e": "AQAB"}
        ]})
    }

    fn parse(v: &Value) -> Result<KeySet, JwksError> {
        parse_jwks(v.to_string().as_bytes())
    }

    fn with_first(change: impl FnOnce(&mut serde_json::Map<String, Value>)) -> KeySet {
        let mut doc = google_like();
        let first = doc["keys"][0].as_object_mut().expect("an object");
        change(first);
        parse(&doc).expect("k2 is still usable")
    }

    #[test]
    fn google_like_keys_are_read_with_leading_zeros_dropped() {
        let set = parse(&google_like()).expect("a key set");
        assert_eq!(set.keys().len(), 2);
        let k1 = set.find("k1").expect("k1");
        assert_eq!(k1.n, vec![0xc1, 0x02, 0x03]);
        assert_eq!(k1.e, vec![1, 0, 1]);
        assert_eq!(set.find("k2").map(|k| k.n.clone()), Some(vec![0xd1, 0x02]));
        assert_eq!(set.find("k3"), None);
        assert_eq!(set.skipped(), 0);
    }

    #[test]
    fn alg_and_use_may_be_absent() {
        let set = with_first(|k| {
            k.remove("alg");
            k.remove("use");
        });
        assert!(set.find("k1").is_some());
    }

    #[test]
    fn keys_not_for_rs256_signatures_are_skipped() {
        for (field, value) in [
            ("kty", json!("EC")),
            ("alg", json!("RS512")),
            ("use", json!("enc")),
            ("kid", json!("")),
            ("kid", json!(7)),
            ("n", json!("not base64!")),
            ("n", json!("AAAA")),
            ("e", json!("")),
        ] {
            let set = with_first(|k| {
                k.insert(field.to_owned(), value.clone());
            });
            assert!(set.find("k1").is_none(), "{field}={value} was kept");
            assert_eq!(set.skipped(), 1, "{field}={value}");
        }
        for missing in ["kty", "kid", "n", "e"] {
            let set = with_first(|k| {
                k.remove(missing);
            });
            assert!(set.find("k1").is_none(), "kept without {missing}");
        }
    }

    #[test]
    fn a_set_without_a_usable_key_is_refused() {
        let doc = json!({"keys": [{"kty": "EC", "kid": "x", "crv": "P-256"}]});
        assert_eq!(parse(&doc), Err(JwksError::NoUsableKey { skipped: 1 }));
        assert_eq!(
            parse(&json!({"keys": []})),
            Err(JwksError::NoUsableKey { skipped: 0 })
        );
    }

    #[test]
    fn not_a_key_set_is_refused() {
        for body in [&b"<html>"[..], b"[]", b"{}", b"{\"keys\": {}}", b""] {
            assert_eq!(parse_jwks(body), Err(JwksError::NotJwks), "{body:?}");
        }
    }

    #[test]
    fn a_duplicated_kid_is_refused() {
        let mut doc = google_like();
        doc["keys"][1]["kid"] = json!("k1");
        assert_eq!(parse(&doc), Err(JwksError::DuplicateKid("k1".into())));
    }

    #[test]
    fn an_oversized_set_is_refused_before_parsing() {
        let mut body = google_like().to_string().into_bytes();
        body.resize(MAX_JWKS_LEN, b' ');
        assert!(parse_jwks(&body).is_ok(), "at the limit");
        body.push(b' ');
        assert_eq!(parse_jwks(&body), Err(JwksError::TooLarge));
    }

    #[test]
    fn the_debug_form_names_the_key_not_its_bytes() {
        let key = RsaKey {
            kid: "k1".into(),
            n: vec![0xab; 256],
            e: vec![1, 0, 1],
        };
        let shown = format!("{key:?}");
        assert!(shown.contains("k1") && shown.contains("2048"), "{shown}");
        assert!(!shown.contains("171"), "{shown}");
    }

    #[test]
    fn max_age_follows_cache_control_within_bounds() {
        for (header, secs) in [
            (
                Some("public, max-age=21071, must-revalidate, no-transform"),
                21071,
            ),
            (Some("MAX-AGE=600"), 600),
            (Some("max-age=\"600\""), 600),
            (Some("max-age=5"), MIN_MAX_AGE_SECS),
            (Some("max-age=0"), MIN_MAX_AGE_SECS),
            (Some("max-age=-1"), MIN_MAX_AGE_SECS),
            (Some("max-age=99999999"), MAX_MAX_AGE_SECS),
            (Some("max-age=ten"), MIN_MAX_AGE_SECS),
            (Some("max-age=600, max-age=900"), MIN_MAX_AGE_SECS),
            (Some("no-cache, max-age=600"), MIN_MAX_AGE_SECS),
            (Some("max-age=600, no-store"), MIN_MAX_AGE_SECS),
            (Some("public"), DEFAULT_MAX_AGE_SECS),
            (Some(""), DEFAULT_MAX_AGE_SECS),
            (None, DEFAULT_MAX_AGE_SECS),
        ] {
            assert_eq!(max_age_secs(header), secs, "{header:?}");
        }
    }
}
