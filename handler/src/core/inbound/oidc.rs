//! Google-signed OIDC ID tokens, as Pub/Sub push and Eventarc present them
//! (`Authorization: Bearer <JWT>`): everything about a token that can be
//! decided without the network or a clock. The shell fetches Google's keys
//! ([`jwks`], kept per [`cache`]) and checks the RS256 signature over what
//! [`check_token`] hands back; nothing here trusts a claim before that.
//! <https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions>
//!
//! Errors say what is wrong without echoing the token: only numbers (times,
//! lengths), the configured expectations and names from a fixed list appear.

pub mod cache;
pub mod jwks;

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

/// Google's push tokens are about 1 KiB; anything over this is not one and is
/// refused before any decoding, so a hostile header costs nothing to turn away.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;

/// How far `iat` (and `nbf`) may lie ahead of our clock. Google's signer and
/// the host that runs us keep NTP time but not the same instant, and a token
/// is often pushed the second it is minted; a minute absorbs that, while a
/// token dated further ahead (which would outlive its stated hour) is refused.
pub const CLOCK_SKEW_SECS: i64 = 60;

/// The issuers of Google's ID tokens: Google documents both forms.
const GOOGLE_ISSUERS: [&str; 2] = ["https://accounts.google.com", "accounts.google.com"];

/// Algorithm names (RFC 7518) an error may name; any other `alg` is reported
/// as unrecognised, so an attacker's bytes never reach a log line.
const KNOWN_ALGORITHMS: [&str; 14] = [
    "none", "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512",
    "PS256", "PS384", "PS512", "EdDSA",
];

/// Which part of a compact JWT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The JOSE header.
    Header,
    /// The claims (payload).
    Claims,
    /// The signature.
    Signature,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Header => "header",
            Part::Claims => "claims",
            Part::Signature => "signature",
        })
    }
}

/// Why a token is not valid for this service. Every one is a refusal (401).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No `Authorization` header.
    #[error("no Authorization header")]
    MissingAuthorization,
    /// A header of another scheme (`Basic …`) or without a token.
    #[error("the Authorization header is not `Bearer <token>`")]
    NotBearer,
    /// Over [`MAX_TOKEN_LEN`].
    #[error("the token is {len} bytes, over the limit of {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not `header.claims.signature`, each part non-empty.
    #[error("the token is not three non-empty parts separated by dots")]
    NotCompact,
    /// A part that is not base64url without padding.
    #[error("the token's {0} is not base64url without padding")]
    NotBase64(Part),
    /// A part that is not a JSON object of the expected types (a duplicated
    /// field too: which of the two counts would be a guess).
    #[error("the token's {0} is not a JSON object with fields of the expected types")]
    NotJson(Part),
    /// `alg` is not `RS256`.
    #[error("the token is signed with {}, only RS256 is accepted", .0.unwrap_or("an unrecognised algorithm"))]
    Algorithm(Option<&'static str>),
    /// No `kid`: the key to check it with cannot be chosen.
    #[error("the token's header names no key (kid)")]
    MissingKid,
    /// `crit` extensions, which a verifier must understand or refuse (RFC 7515 §4.1.11).
    #[error("the token's header has critical extensions (crit); none are understood")]
    Critical,
    /// A required claim is absent.
    #[error("the token has no {0} claim")]
    MissingClaim(&'static str),
    /// `iss` is not Google's.
    #[error("the token's issuer is not https://accounts.google.com")]
    Issuer,
    /// `aud` is not (or does not contain) one of this service's audiences.
    #[error("the token is not for this service (audience {expected} expected)")]
    Audience {
        /// The configured audiences, comma-separated.
        expected: String,
    },
    /// `exp` is not in the future.
    #[error("the token expired at {exp}; it is now {now}")]
    Expired {
        /// The token's `exp`.
        exp: i64,
        /// The time it was checked at.
        now: i64,
    },
    /// `iat` is more than [`CLOCK_SKEW_SECS`] ahead.
    #[error("the token is issued at {iat}, more than {CLOCK_SKEW_SECS} s after now ({now})")]
    IssuedInFuture {
        /// The token's `iat`.
        iat: i64,
        /// The time it was checked at.
        now: i64,
    },
    /// `nbf` is more than [`CLOCK_SKEW_SECS`] ahead.
    #[error("the token is not valid before {nbf}, more than {CLOCK_SKEW_SECS} s after now ({now})")]
    NotYetValid {
        /// The token's `nbf`.
        nbf: i64,
        /// The time it was checked at.
        now: i64,
    },
    /// `email` is not the push subscription's service account.
    #[error("the token's email is not the service account {expected}")]
    Email {
        /// The configured service account.
        expected: String,
    },
    /// `email_verified` is not `true`.
    #[error("the token's email is not verified")]
    EmailUnverified,
}

/// What a token must say to be for this service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    /// The configured URLs (`PUSH_AUDIENCE`), without a trailing `/`.
    audiences: Vec<String>,
    email: String,
    /// `URL + path` for each configured URL without a path, once the
    /// request's path is known ([`Expected::at_path`]).
    at_path: Vec<String>,
}

/// Why an [`Expected`] cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExpectedError {
    /// An empty list would let no token through, or one entry empty
    /// would be a typo: refused rather than guessed at.
    #[error("the OIDC audience is empty")]
    EmptyAudience,
    /// An entry that is not an https URL of the accepted form.
    #[error("the OIDC audience {0:?} is not an https:// URL without query, fragment or user")]
    NotAUrl(String),
    /// Not `name@domain`.
    #[error("the push service account {0:?} is not an email address")]
    NotAnEmail(String),
}

/// What an audience URL may look like: `https://HOST[:PORT][/PATH]`, host
/// and path of plain characters, no query, fragment, user or trailing `/`
/// (one is taken off). Tokens name these URLs byte for byte, so anything
/// looser would only hide a typo.
fn audience_url(raw: &str) -> Option<String> {
    let rest = raw.strip_prefix("https://")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, port) = authority
        .rsplit_once(':')
        .map_or((authority, None), |(h, p)| (h, Some(p)));
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && !host.starts_with(['.', '-'])
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    (host_ok && port_ok && plain_path(path, true)).then(|| format!("https://{rest}"))
}

/// A path of plain characters: `/a/b-c_d.e~f` (or nothing, when `empty`
/// is allowed). No `//`, query, fragment, percent-escape or dot segment.
fn plain_path(path: &str, empty: bool) -> bool {
    if path.is_empty() {
        return empty;
    }
    path.starts_with('/')
        && path[1..].split('/').all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'))
        })
}

impl Expected {
    /// The audiences tokens may name (`PUSH_AUDIENCE`: one URL or several,
    /// comma-separated: the push subscription's and the Cloud Scheduler
    /// job's audience, the service's own URL an Eventarc trigger's tokens
    /// name) and the service account they are issued for.
    pub fn new(audiences: &str, email: &str) -> Result<Self, ExpectedError> {
        if audiences.trim().is_empty() {
            return Err(ExpectedError::EmptyAudience);
        }
        let audiences = audiences
            .split(',')
            .map(|entry| match entry.trim() {
                "" => Err(ExpectedError::EmptyAudience),
                url => audience_url(url).ok_or_else(|| ExpectedError::NotAUrl(url.to_owned())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        match email.split_once('@') {
            Some((name, domain))
                if !name.is_empty()
                    && !domain.is_empty()
                    && !email.chars().any(|c| c.is_whitespace()) => {}
            _ => return Err(ExpectedError::NotAnEmail(email.to_owned())),
        }
        Ok(Self {
            audiences,
            email: email.to_owned(),
            at_path: Vec::new(),
        })
    }

    /// The same for a request to `path`: a configured URL without a path
    /// also stands for itself followed by the request's path, the audience
    /// Pub/Sub and Cloud Scheduler default to (the endpoint's full URL).
    /// A URL configured with a path is taken as it is; the request's host
    /// is never looked at, since behind a load balancer or a custom domain
    /// the caller chooses it. A path of any other shape adds nothing.
    pub fn at_path(&self, path: &str) -> Self {
        let mut with = self.clone();
        if plain_path(path, false) {
            with.at_path = self
                .audiences
                .iter()
                .filter(|url| !url["https://".len()..].contains('/'))
                .map(|url| format!("{url}{path}"))
                .collect();
        }
        with
    }

    /// The configured audiences.
    pub fn audiences(&self) -> &[String] {
        &self.audiences
    }

    /// The service account.
    pub fn email(&self) -> &str {
        &self.email
    }

    fn accepts(&self, aud: &str) -> bool {
        self.audiences.iter().chain(&self.at_path).any(|a| a == aud)
    }
}

/// Who a verified request comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PushIdentity {
    /// The service account the push was signed as.
    pub email: String,
    /// Its unique id (`sub`), when the token carries one.
    pub(crate) subject: Option<String>,
    /// When the token was issued (Unix seconds).
    pub issued_at: i64,
    /// When it expires (Unix seconds).
    pub expires_at: i64,
}

/// A token whose form and claims are right: what is left is the signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked<'t> {
    /// The key it says it is signed with.
    pub kid: String,
    /// The bytes signed: `header.claims` as sent.
    pub signing_input: &'t [u8],
    /// The decoded signature.
    pub signature: Vec<u8>,
    /// Who it is from, once the signature holds.
    pub identity: PushIdentity,
}

#[derive(Deserialize)]
struct Header {
    alg: Option<String>,
    kid: Option<String>,
    crit: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct Claims {
    iss: Option<String>,
    aud: Option<Audience>,
    exp: Option<i64>,
    iat: Option<i64>,
    nbf: Option<i64>,
    email: Option<String>,
    email_verified: Option<bool>,
    sub: Option<String>,
}

/// The token of an `Authorization` header value, `Bearer <token>` (the
/// scheme in any case, RFC 7235).
pub fn bearer(authorization: Option<&str>) -> Result<&str, TokenError> {
    let value = authorization.ok_or(TokenError::MissingAuthorization)?;
    let (scheme, token) = value.split_once(' ').ok_or(TokenError::NotBearer)?;
    let token = token.trim_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.contains(' ') {
        return Err(TokenError::NotBearer);
    }
    Ok(token)
}

/// Checks a compact JWT's form, header and claims against `expected` at
/// `now_unix`. The signature is left to the caller, who has the keys.
pub fn check_token<'t>(
    token: &'t str,
    expected: &Expected,
    now_unix: i64,
) -> Result<Checked<'t>, TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::TooLong {
            len: token.len(),
            max: MAX_TOKEN_LEN,
        });
    }
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::NotCompact);
    };
    if header.is_empty() || claims.is_empty() || signature.is_empty() {
        return Err(TokenError::NotCompact);
    }
    let signing_input = &token.as_bytes()[..header.len() + 1 + claims.len()];

    let header: Header = decode_json(header, Part::Header)?;
    let kid = check_header(header)?;
    let claims: Claims = decode_json(claims, Part::Claims)?;
    let identity = check_claims(claims, expected, now_unix)?;
    let signature = decode(signature, Part::Signature)?;
    Ok(Checked {
        kid,
        signing_input,
        signature,
        identity,
    })
}

fn decode(part: &str, which: Part) -> Result<Vec<u8>, TokenError> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| TokenError::NotBase64(which))
}

fn decode_json<T: for<'de> Deserialize<'de>>(part: &str, which: Part) -> Result<T, TokenError> {
    serde_json::from_slice(&decode(part, which)?).map_err(|_| TokenError::NotJson(which))
}

fn check_header(header: Header) -> Result<String, TokenError> {
    match header.alg.as_deref() {
        Some("RS256") => {}
        other => {
            let known = other.and_then(|alg| KNOWN_ALGORITHMS.into_iter().find(|k| *k == alg));
            return Err(TokenError::Algorithm(known));
        }
    }
    if header.crit.is_some() {
        return Err(TokenError::Critical);
    }
    match header.kid {
        Some(kid) if !kid.is_empty() => Ok(kid),
        _ => Err(TokenError::MissingKid),
    }
}

fn check_claims(claims: Claims, expected: &Expected, now: i64) -> Result<PushIdentity, TokenError> {
    let iss = claims.iss.ok_or(TokenError::MissingClaim("iss"))?;
    if !GOOGLE_ISSUERS.contains(&iss.as_str()) {
        return Err(TokenError::Issuer);
    }
    let for_us = match claims.aud.ok_or(TokenError::MissingClaim("aud"))? {
        Audience::One(aud) => expected.accepts(&aud),
        Audience::Many(auds) => auds.iter().any(|aud| expected.accepts(aud)),
    };
    if !for_us {
        return Err(TokenError::Audience {
            expected: expected.audiences.join(", "),
        });
    }
    let exp = claims.exp.ok_or(TokenError::MissingClaim("exp"))?;
    // Strict: a token is good until `exp`, and Pub/Sub mints a fresh one well
    // before then, so an expired token is never a clock matter.
    if exp <= now {
        return Err(TokenError::Expired { exp, now });
    }
    let iat = claims.iat.ok_or(TokenError::MissingClaim("iat"))?;
    if iat > now.saturating_add(CLOCK_SKEW_SECS) {
        return Err(TokenError::IssuedInFuture { iat, now });
    }
    if let Some(nbf) = claims.nbf
        && nbf > now.saturating_add(CLOCK_SKEW_SECS)
    {
        return Err(TokenError::NotYetValid { nbf, now });
    }
    let email = claims.email.ok_or(TokenError::MissingClaim("email"))?;
    if email != expected.email {
        return Err(TokenError::Email {
            expected: expected.email.clone(),
        });
    }
    if claims.email_verified != Some(true) {
        return Err(TokenError::EmailUnverified);
    }
    Ok(PushIdentity {
        email,
        subject: claims.sub,
        issued_at: iat,
        expires_at: exp,
    })
}

#[cfg(test)]
mod tests;
