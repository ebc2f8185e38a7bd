use super::*;
use serde_json::{Value, json};

const NOW: i64 = 1_700_000_000;
const AUDIENCE: &str = "https://node-fencer-abc123-ew.a.run.app/pubsub";
const EMAIL: &str = "pusher@my-project.iam.gserviceaccount.com";

fn expected() -> Expected {
    Expected::new(AUDIENCE, EMAIL).expect("a valid expectation")
}

fn header() -> Value {
    json!({"alg": "RS256", "kid": "key-1", "typ": "JWT"})
}

/// Google's push token claims, as documented.
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

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn token_of(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes()),
        b64(&[0x5a; 256])
    )
}

fn check(token: &str) -> Result<Checked<'_>, TokenError> {
    check_token(token, &expected(), NOW)
}

fn with_claim(name: &str, value: Value) -> String {
    let mut c = claims();
    c[name] = value;
    token_of(&header(), &c)
}

fn without_claim(name: &str) -> String {
    let mut c = claims();
    c.as_object_mut().expect("an object").remove(name);
    token_of(&header(), &c)
}

fn with_header(name: &str, value: Value) -> String {
    let mut h = header();
    h[name] = value;
    token_of(&h, &claims())
}

#[test]
fn a_push_token_passes_with_its_parts() {
    let token = token_of(&header(), &claims());
    let checked = check(&token).expect("valid");
    assert_eq!(checked.kid, "key-1");
    let (signed, _) = token.rsplit_once('.').expect("three parts");
    assert_eq!(checked.signing_input, signed.as_bytes());
    assert_eq!(checked.signature, vec![0x5a; 256]);
    assert_eq!(
        checked.identity,
        PushIdentity {
            email: EMAIL.into(),
            subject: Some("113774264463038321964".into()),
            issued_at: NOW - 600,
            expires_at: NOW + 3000,
        }
    );
}

#[test]
fn the_bare_issuer_form_passes_too() {
    assert!(check(&with_claim("iss", json!("accounts.google.com"))).is_ok());
}

#[test]
fn another_issuer_is_refused() {
    for iss in [
        json!("https://evil.example"),
        json!("https://accounts.google.com/"),
        json!("HTTPS://ACCOUNTS.GOOGLE.COM"),
    ] {
        assert_eq!(
            check(&with_claim("iss", iss.clone())),
            Err(TokenError::Issuer),
            "{iss}"
        );
    }
}

#[test]
fn the_audience_must_be_ours() {
    let wrong = Err(TokenError::Audience {
        expected: AUDIENCE.into(),
    });
    assert_eq!(check(&with_claim("aud", json!("https://other"))), wrong);
    assert_eq!(check(&with_claim("aud", json!([]))), wrong);
    assert_eq!(
        check(&with_claim("aud", json!(["https://other", "x"]))),
        wrong
    );
    assert_eq!(
        check(&with_claim("aud", json!(format!("{AUDIENCE}/")))),
        wrong
    );
    assert!(check(&with_claim("aud", json!(["https://other", AUDIENCE]))).is_ok());
}

#[test]
fn an_expired_token_is_refused_to_the_second() {
    assert_eq!(
        check(&with_claim("exp", json!(NOW))),
        Err(TokenError::Expired { exp: NOW, now: NOW })
    );
    assert!(check(&with_claim("exp", json!(NOW + 1))).is_ok());
}

#[test]
fn a_token_issued_ahead_is_allowed_the_skew_and_no_more() {
    assert!(check(&with_claim("iat", json!(NOW + CLOCK_SKEW_SECS))).is_ok());
    assert_eq!(
        check(&with_claim("iat", json!(NOW + CLOCK_SKEW_SECS + 1))),
        Err(TokenError::IssuedInFuture {
            iat: NOW + CLOCK_SKEW_SECS + 1,
            now: NOW
        })
    );
}

#[test]
fn not_before_is_allowed_the_skew_and_no_more() {
    assert!(check(&with_claim("nbf", json!(NOW + CLOCK_SKEW_SECS))).is_ok());
    assert_eq!(
        check(&with_claim("nbf", json!(NOW + CLOCK_SKEW_SECS + 1))),
        Err(TokenError::NotYetValid {
            nbf: NOW + CLOCK_SKEW_SECS + 1,
            now: NOW
        })
    );
}

#[test]
fn the_email_must_be_the_push_service_account() {
    let wrong = Err(TokenError::Email {
        expected: EMAIL.into(),
    });
    assert_eq!(
        check(&with_claim(
            "email",
            json!("other@my-project.iam.gserviceaccount.com")
        )),
        wrong
    );
    assert_eq!(
        check(&with_claim("email", json!(EMAIL.to_uppercase()))),
        wrong
    );
}

#[test]
fn the_email_must_be_verified() {
    for value in [json!(false), json!("true"), json!(1)] {
        let token = with_claim("email_verified", value.clone());
        let refused = check(&token).expect_err("refused");
        assert!(
            matches!(
                refused,
                TokenError::EmailUnverified | TokenError::NotJson(Part::Claims)
            ),
            "{value}: {refused:?}"
        );
    }
    assert_eq!(
        check(&without_claim("email_verified")),
        Err(TokenError::EmailUnverified)
    );
}

#[test]
fn every_required_claim_is_required() {
    for name in ["iss", "aud", "exp", "iat", "email"] {
        assert_eq!(
            check(&without_claim(name)),
            Err(TokenError::MissingClaim(name)),
            "{name}"
        );
    }
    assert!(check(&without_claim("sub")).is_ok());
}

#[test]
fn claims_of_the_wrong_type_are_refused() {
    for (name, value) in [
        ("exp", json!("1700003000")),
        ("exp", json!(1.7e9)),
        ("iat", json!(null)),
        ("aud", json!(42)),
        ("aud", json!([AUDIENCE, 1])),
        ("email", json!([EMAIL])),
    ] {
        let token = with_claim(name, value.clone());
        let refused = check(&token).expect_err("refused");
        // A null is an absent claim; anything else of the wrong type is not JSON of the shape.
        assert!(
            matches!(
                refused,
                TokenError::NotJson(Part::Claims) | TokenError::MissingClaim(_)
            ),
            "{name}={value}: {refused:?}"
        );
    }
}

#[test]
fn only_rs256_is_accepted() {
    for (alg, named) in [
        (json!("none"), Some("none")),
        (json!("HS256"), Some("HS256")),
        (json!("RS512"), Some("RS512")),
        (json!("rs256"), None),
        (json!("RS256 "), None),
        (json!(null), None),
    ] {
        assert_eq!(
            check(&with_header("alg", alg.clone())),
            Err(TokenError::Algorithm(named)),
            "{alg}"
        );
    }
    let mut h = header();
    h.as_object_mut().expect("an object").remove("alg");
    assert_eq!(
        check(&token_of(&h, &claims())),
        Err(TokenError::Algorithm(None))
    );
}

#[test]
fn an_unsigned_token_is_refused() {
    // `alg: none` with its empty signature, as an attacker would send it.
    let h = json!({"alg": "none", "kid": "key-1"});
    let token = format!(
        "{}.{}.",
        b64(h.to_string().as_bytes()),
        b64(claims().to_string().as_bytes())
    );
    assert_eq!(check(&token), Err(TokenError::NotCompact));
}

#[test]
fn the_header_must_name_a_key() {
    let mut h = header();
    h.as_object_mut().expect("an object").remove("kid");
    assert_eq!(check(&token_of(&h, &claims())), Err(TokenError::MissingKid));
    assert_eq!(
        check(&with_header("kid", json!(""))),
        Err(TokenError::MissingKid)
    );
    assert_eq!(
        check(&with_header("kid", json!(3))),
        Err(TokenError::NotJson(Part::Header))
    );
}

#[test]
fn critical_extensions_are_refused() {
    assert_eq!(
        check(&with_header("crit", json!(["b64"]))),
        Err(TokenError::Critical)
    );
}

#[test]
fn duplicated_fields_are_refused() {
    let claims = claims().to_string();
    let doubled = format!(
        "{},\"email\":\"other@x.iam.gserviceaccount.com\"}}",
        &claims[..claims.len() - 1]
    );
    let token = format!(
        "{}.{}.{}",
        b64(header().to_string().as_bytes()),
        b64(doubled.as_bytes()),
        b64(&[1])
    );
    assert_eq!(check(&token), Err(TokenError::NotJson(Part::Claims)));
}

#[test]
fn the_form_is_checked_part_by_part() {
    let good = token_of(&header(), &claims());
    let parts: Vec<&str> = good.split('.').collect();
    let (h, c, s) = (parts[0], parts[1], parts[2]);
    for (token, error) in [
        (format!("{h}.{c}"), TokenError::NotCompact),
        (format!("{h}.{c}.{s}.{s}"), TokenError::NotCompact),
        (format!(".{c}.{s}"), TokenError::NotCompact),
        (format!("{h}..{s}"), TokenError::NotCompact),
        (String::new(), TokenError::NotCompact),
        (format!("{h}=.{c}.{s}"), TokenError::NotBase64(Part::Header)),
        (format!("{h}.{c}+.{s}"), TokenError::NotBase64(Part::Claims)),
        (
            format!("{h}.{c}.{s}/"),
            TokenError::NotBase64(Part::Signature),
        ),
        (
            format!("{h}.{c}.{s}=="),
            TokenError::NotBase64(Part::Signature),
        ),
        (
            format!("{}.{c}.{s}", b64(b"[1]")),
            TokenError::NotJson(Part::Header),
        ),
        (
            format!("{h}.{}.{s}", b64(b"{\"iss\":")),
            TokenError::NotJson(Part::Claims),
        ),
    ] {
        assert_eq!(check(&token), Err(error.clone()), "{token}");
    }
}

#[test]
fn a_long_token_is_refused_before_decoding() {
    let good = token_of(&header(), &claims());
    let padded = format!("{good}{}", "A".repeat(MAX_TOKEN_LEN - good.len()));
    // At the limit the token is decoded (whatever it then says).
    assert!(!matches!(check(&padded), Err(TokenError::TooLong { .. })));
    let over = format!("{padded}A");
    assert_eq!(
        check(&over),
        Err(TokenError::TooLong {
            len: MAX_TOKEN_LEN + 1,
            max: MAX_TOKEN_LEN
        })
    );
    assert!(matches!(
        check(&"!".repeat(MAX_TOKEN_LEN + 1)),
        Err(TokenError::TooLong { .. })
    ));
}

#[test]
fn errors_never_echo_the_token() {
    let marker = "ZZTOPSECRETZZ";
    let cases = [
        with_header("alg", json!(marker)),
        with_claim("iss", json!(marker)),
        with_claim("aud", json!(marker)),
        with_claim(
            "email",
            json!(format!("{marker}@x.iam.gserviceaccount.com")),
        ),
        with_claim("exp", json!(marker)),
        format!("{marker}.{marker}.{marker}"),
        format!("{}.{marker}!.x", b64(header().to_string().as_bytes())),
    ];
    for token in &cases {
        let refused = check(token).expect_err("refused");
        let shown = format!("{refused} {refused:?}");
        assert!(!shown.contains(marker), "{shown}");
        assert!(!shown.contains(token.as_str()), "{shown}");
    }
}

#[test]
fn the_bearer_scheme_is_required() {
    assert_eq!(bearer(Some("Bearer abc.def.ghi")), Ok("abc.def.ghi"));
    assert_eq!(bearer(Some("bearer  abc.def.ghi ")), Ok("abc.def.ghi"));
    assert_eq!(bearer(None), Err(TokenError::MissingAuthorization));
    for value in [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer ",
        "Bearer a b",
        "Bearerabc",
        "abc.def.ghi",
        "",
        "Token abc.def.ghi",
    ] {
        assert_eq!(bearer(Some(value)), Err(TokenError::NotBearer), "{value:?}");
    }
}

#[test]
fn the_expectation_is_checked_when_built() {
    assert_eq!(Expected::new(" ", EMAIL), Err(ExpectedError::EmptyAudience));
    for email in ["", "pusher", "@x", "pusher@", "a b@x"] {
        assert_eq!(
            Expected::new(AUDIENCE, email),
            Err(ExpectedError::NotAnEmail(email.into())),
            "{email:?}"
        );
    }
    let e = expected();
    assert_eq!(
        (e.audiences(), e.email()),
        (&[AUDIENCE.to_owned()][..], EMAIL)
    );
}

#[test]
fn fuzz_regressions_are_refused() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let (mut replayed, mut tokens) = (0, 0);
    for entry in std::fs::read_dir(&dir).expect("handler/fuzz/regressions exists") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let bytes = std::fs::read(&path).expect("a readable regression input");
        replayed += 1;
        let _ = jwks::parse_jwks(&bytes);
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        let _ = jwks::max_age_secs(Some(text));
        let header = bearer(Some(text));
        for token in [header.clone().ok(), Some(text)].into_iter().flatten() {
            assert!(check(token).is_err(), "{path:?} passed");
        }
        let named = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if named.starts_with("oidc-") {
            // The hostile tokens are well-formed headers: what refuses them is the token.
            assert!(header.is_ok(), "{path:?}: {header:?}");
            tokens += 1;
        }
    }
    assert!(
        replayed >= 7,
        "only {replayed} regression inputs in {dir:?}"
    );
    assert!(tokens >= 2, "only {tokens} hostile tokens in {dir:?}");
}

proptest::proptest! {
    /// Whatever the header value, the parse ends in a token or a refusal that
    /// does not echo it; and what passes is exactly the claims' shape.
    #[test]
    fn any_header_value_is_refused_cleanly(value in ".{0,300}") {
        if let Ok(token) = bearer(Some(&value))
            && let Ok(checked) = check_token(token, &expected(), NOW)
        {
            proptest::prop_assert_eq!(checked.identity.email.as_str(), EMAIL);
        }
    }

    /// Any mangled push token is refused or, if it still decodes to the same
    /// claims, hands back the bytes it was given.
    #[test]
    fn a_flipped_character_never_changes_what_is_signed(pos in 0usize..2000, c in proptest::char::range('!', '~')) {
        let token = token_of(&header(), &claims());
        let mut chars: Vec<char> = token.chars().collect();
        let pos = pos % chars.len();
        chars[pos] = c;
        let mangled: String = chars.into_iter().collect();
        if let Ok(checked) = check(&mangled) {
            let signed_len = checked.signing_input.len();
            proptest::prop_assert_eq!(checked.signing_input, &mangled.as_bytes()[..signed_len]);
            proptest::prop_assert_eq!(checked.identity.email.as_str(), EMAIL);
        }
    }
}

/// The service's URL and the subscription's audience, as `PUSH_AUDIENCE`
/// lists them.
const SERVICE: &str = "https://node-fencer-abc123-ew.a.run.app";
const PUSHED_TO: &str = "https://push.node-fencer.example/gce";

fn listed() -> Expected {
    Expected::new(&format!(" {SERVICE}/ , {PUSHED_TO}"), EMAIL).expect("two audiences")
}

fn for_audience(aud: &str) -> String {
    with_claim("aud", json!(aud))
}

#[test]
fn only_a_configured_audience_is_accepted() {
    let at = listed().at_path("/eventarc");
    for aud in [SERVICE, PUSHED_TO] {
        assert!(
            check_token(&for_audience(aud), &listed(), NOW).is_ok(),
            "{aud}"
        );
        assert!(check_token(&for_audience(aud), &at, NOW).is_ok(), "{aud}");
    }
    // A list in `aud` passes when one of it is ours.
    let both = with_claim("aud", json!(["https://elsewhere.example", PUSHED_TO]));
    assert!(check_token(&both, &listed(), NOW).is_ok());
    let elsewhere = for_audience("https://elsewhere.example");
    assert_eq!(
        check_token(&elsewhere, &at, NOW).err(),
        Some(TokenError::Audience {
            expected: format!("{SERVICE}, {PUSHED_TO}")
        })
    );
}

/// Pub/Sub and Cloud Scheduler default a token's audience to the full URL
/// they push to: a configured URL without a path stands for itself with
/// the request's path too, and for no other path.
#[test]
fn a_url_without_a_path_also_stands_for_the_request_path() {
    let at = listed().at_path("/eventarc");
    let own = format!("{SERVICE}/eventarc");
    assert!(check_token(&for_audience(&own), &at, NOW).is_ok());
    assert!(
        check_token(&for_audience(&own), &listed(), NOW).is_err(),
        "no path known"
    );
    for (aud, why) in [
        (format!("{SERVICE}/sweep"), "another path"),
        (format!("{SERVICE}/eventarc/"), "another path"),
        (
            format!("{PUSHED_TO}/eventarc"),
            "a configured URL with a path is taken as it is",
        ),
        (
            format!("http://{}/eventarc", &SERVICE[8..]),
            "another scheme",
        ),
        (SERVICE.to_uppercase(), "another spelling"),
    ] {
        assert!(
            check_token(&for_audience(&aud), &at, NOW).is_err(),
            "{why}: {aud}"
        );
    }
    // A path of another shape adds nothing.
    for odd in ["/", "//x", "/x?y", "/x#y", "/../x", "/x%2F", "x"] {
        let token = for_audience(&format!("{SERVICE}{odd}"));
        assert!(
            check_token(&token, &listed().at_path(odd), NOW).is_err(),
            "{odd:?}"
        );
    }
}

/// Regression (issue 33, item 11): the URL a request names in its `Host`
/// header is the caller's to choose behind a load balancer or a custom
/// domain, so a token for it is refused unless that URL is configured.
#[test]
fn a_token_for_the_host_the_request_names_is_refused() {
    let at = listed().at_path("/eventarc");
    for aud in [
        "https://lb.attacker.example",
        "https://lb.attacker.example/eventarc",
        "https://node-fencer-abc123-ew.a.run.app.attacker.example",
    ] {
        assert!(
            matches!(
                check_token(&for_audience(aud), &at, NOW),
                Err(TokenError::Audience { .. })
            ),
            "{aud}"
        );
    }
}

#[test]
fn every_audience_is_checked_when_built() {
    for (raw, bad) in [
        ("node-fencer-push", "node-fencer-push"),
        ("http://svc.example", "http://svc.example"),
        ("https://", "https://"),
        ("https://svc.example?x=1", "https://svc.example?x=1"),
        ("https://svc.example/a#b", "https://svc.example/a#b"),
        ("https://user@svc.example", "https://user@svc.example"),
        ("https://Svc.example", "https://Svc.example"),
        ("https://svc.example:0", "https://svc.example:0"),
        ("https://svc.example//x", "https://svc.example//x"),
        ("https://svc.example/a b", "https://svc.example/a b"),
        (&format!("{SERVICE}, ftp://x"), "ftp://x"),
    ] {
        assert_eq!(
            Expected::new(raw, EMAIL),
            Err(ExpectedError::NotAUrl(bad.into())),
            "{raw:?}"
        );
    }
    for raw in [
        " ",
        ",",
        &format!("{SERVICE},"),
        &format!("{SERVICE},,{PUSHED_TO}"),
    ] {
        assert_eq!(
            Expected::new(raw, EMAIL),
            Err(ExpectedError::EmptyAudience),
            "{raw:?}"
        );
    }
    let e =
        Expected::new("https://svc.example:8443/push/", EMAIL).expect("a URL with port and path");
    assert_eq!(e.audiences(), ["https://svc.example:8443/push"]);
    assert_eq!(listed().audiences(), [SERVICE, PUSHED_TO]);
}
