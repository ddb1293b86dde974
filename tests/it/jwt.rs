//! Callers identified by JWTs, over real HTTP: keys from a JWKS file
//! (rotated by rewriting it) or a JWKS URL served by a real server (over
//! TLS, refetched for an unknown `kid`), every refused kind of token with
//! its RFC 6750 challenge, `access_token` on a watch, and the API token
//! beside JWTs.

use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, Header};
use reqwest::{StatusCode, header};
use serde_json::json;

use crate::support::gateway::{GatewayOptions, Stack, problem};
use crate::support::gateway_process::{GatewayProcess, binary_command};
use crate::support::sse;
use crate::support::tokens::{
    AUDIENCE, ISSUER, JwksServer, SigningKey, claims, claims_with, hmac_token, jwt_settings, now,
    service_account_claims, unsigned_token, write_jwks,
};
use crate::support::{Mosquitto, Responder, TestPki, wait_until};

/// A stack whose gateway accepts tokens signed by `keys` (a JWKS file in
/// the returned directory) and, with `api_token`, that token too.
async fn stack_with_keys(
    keys: &[&SigningKey],
    api_token: Option<&str>,
) -> (Stack, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    write_jwks(&path, keys);
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            jwt: Some(jwt_settings(&path)),
            api_token: api_token.map(str::to_owned),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    (stack, dir, path)
}

/// `PUT /keys/k` with `token` as the bearer.
async fn put_as(stack: &Stack, token: &str) -> reqwest::Response {
    let gw = &stack.gateway;
    gw.http
        .put(gw.key(b"k"))
        .bearer_auth(token)
        .body("v")
        .send()
        .await
        .unwrap()
}

/// The challenge of a refused token, checked whole.
fn assert_refused_because(response: &reqwest::Response, description: &str) {
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.headers()[header::WWW_AUTHENTICATE],
        format!(
            "Bearer realm=\"statestore-gateway\", error=\"invalid_token\", error_description=\"{description}\""
        )
        .as_str()
    );
}

async fn refusals(stack: &Stack, reason: &str) -> u64 {
    stack
        .gateway
        .metrics
        .auth_failures
        .with_label_values(&[reason])
        .get()
}

#[tokio::test]
async fn rs256_es256_and_the_other_asymmetric_tokens_pass() {
    let rsa = SigningKey::rsa("rsa");
    let ec = SigningKey::ec("ec");
    let ec384 = SigningKey::ec384("ec384");
    let ed = SigningKey::ed25519("ed");
    let (stack, _dir, _) = stack_with_keys(&[&rsa, &ec, &ec384, &ed], None).await;
    let signers = [
        rsa.clone(),
        rsa.clone().with_alg(Algorithm::RS384),
        rsa.clone().with_alg(Algorithm::RS512),
        rsa.clone().with_alg(Algorithm::PS256),
        rsa.clone().with_alg(Algorithm::PS384),
        rsa.clone().with_alg(Algorithm::PS512),
        ec.clone(),
        ec384.clone(),
        ed.clone(),
    ];
    for key in &signers {
        let response = put_as(&stack, &key.sign(&claims("alice"))).await;
        assert_eq!(response.status(), StatusCode::OK, "{key:?}");
    }
    // The same token again passes (that it comes from the cache is the
    // cache's unit tests' to show).
    let token = ec.sign(&claims("alice"));
    for _ in 0..3 {
        assert_eq!(put_as(&stack, &token).await.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn a_service_account_token_passes() {
    let key = SigningKey::rsa("cluster");
    let (stack, _dir, _) = stack_with_keys(&[&key], None).await;
    let token = key.sign(&service_account_claims("apps", "dashboard"));
    assert_eq!(put_as(&stack, &token).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn without_a_token_the_challenge_has_no_error() {
    let key = SigningKey::rsa("k");
    let (stack, _dir, _) = stack_with_keys(&[&key], None).await;
    let response = stack.gateway.put(b"k", "v").await;
    assert_eq!(
        response.headers()[header::WWW_AUTHENTICATE],
        "Bearer realm=\"statestore-gateway\""
    );
    problem(response, 401, "/problems/unauthorized").await;
    assert_eq!(refusals(&stack, "missing").await, 1);
}

#[tokio::test]
async fn every_refused_kind_of_token_is_401_invalid_token_saying_why() {
    let key = SigningKey::rsa("k");
    let other = SigningKey::rsa("k"); // same kid, another key
    let ec = SigningKey::ec("ec");
    let (stack, _dir, _) = stack_with_keys(&[&key, &ec], None).await;
    let hour = 3600;
    // HMAC keyed with the public key's own modulus: the classic confusion.
    let public_n = key.jwk()["n"].as_str().unwrap().as_bytes().to_vec();
    let mut no_kid = Header::new(Algorithm::RS256);
    no_kid.kid = None;
    let es_with_rsa_key = {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("k".into());
        ec.sign_with(header, &claims("alice"))
    };
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "alg none",
            unsigned_token("k", &claims("alice")),
            "algorithm",
            "the token's algorithm is not accepted (only RS, PS, ES and EdDSA signatures are)",
        ),
        (
            "HMAC with the public key",
            hmac_token(&public_n, "k", &claims("alice")),
            "algorithm",
            "the token's algorithm is not accepted (only RS, PS, ES and EdDSA signatures are)",
        ),
        (
            "an ES256 token naming an RSA key",
            es_with_rsa_key,
            "algorithm",
            "the token's algorithm is not accepted (only RS, PS, ES and EdDSA signatures are)",
        ),
        (
            "unknown kid",
            SigningKey::rsa("nobody").sign(&claims("alice")),
            "unknown_key",
            "the token's signing key is not in the key set",
        ),
        (
            "no kid, two keys",
            key.sign_with(no_kid, &claims("alice")),
            "unknown_key",
            "the token's signing key is not in the key set",
        ),
        (
            "bad signature",
            other.sign(&claims("alice")),
            "signature",
            "the token's signature does not verify",
        ),
        (
            "wrong issuer",
            key.sign(&claims_with(
                "alice",
                json!({"iss": "https://elsewhere.invalid"}),
            )),
            "issuer",
            "the token's issuer is not accepted",
        ),
        (
            "wrong audience",
            key.sign(&claims_with("alice", json!({"aud": ["someone-else"]}))),
            "audience",
            "the token's audience does not include this gateway",
        ),
        (
            "expired",
            key.sign(&claims_with("alice", json!({"exp": now() - hour}))),
            "expired",
            "the token has expired",
        ),
        (
            "not yet valid",
            key.sign(&claims_with("alice", json!({"nbf": now() + hour}))),
            "not_yet_valid",
            "the token is not valid yet",
        ),
        (
            "no sub",
            key.sign(&claims_with("alice", json!({"sub": null}))),
            "claims",
            "the token lacks a required claim (sub, exp, iss, aud) or has a malformed one",
        ),
        (
            "no exp",
            key.sign(&claims_with("alice", json!({"exp": null}))),
            "claims",
            "the token lacks a required claim (sub, exp, iss, aud) or has a malformed one",
        ),
        (
            "not a JWT",
            "opaque-token".to_owned(),
            "malformed",
            "the token is not a well-formed JWT",
        ),
    ];
    for (what, token, reason, description) in cases {
        let before = refusals(&stack, reason).await;
        let response = put_as(&stack, &token).await;
        assert_refused_because(&response, description);
        let body = problem(response, 401, "/problems/unauthorized").await;
        assert_eq!(body["detail"], description, "{what}");
        assert_eq!(refusals(&stack, reason).await, before + 1, "{what}");
    }
}

#[tokio::test]
async fn clock_skew_within_the_leeway_is_tolerated() {
    let key = SigningKey::ec("k");
    let (stack, _dir, _) = stack_with_keys(&[&key], None).await;
    let just_expired = key.sign(&claims_with("alice", json!({"exp": now() - 10})));
    assert_eq!(put_as(&stack, &just_expired).await.status(), StatusCode::OK);
    let nearly_valid = key.sign(&claims_with("alice", json!({"nbf": now() + 10})));
    assert_eq!(put_as(&stack, &nearly_valid).await.status(), StatusCode::OK);
    let long_expired = key.sign(&claims_with("alice", json!({"exp": now() - 120})));
    assert_refused_because(
        &put_as(&stack, &long_expired).await,
        "the token has expired",
    );
}

/// Waits until `token` gets `status`, for a file change to be noticed.
async fn wait_for_status(stack: &Stack, token: &str, status: StatusCode) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if put_as(stack, token).await.status() == status {
            return;
        }
        assert!(Instant::now() < deadline, "no {status} within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn rewriting_the_jwks_file_rotates_keys_without_a_restart() {
    let old = SigningKey::rsa("2024");
    let new = SigningKey::ec("2025");
    let (stack, _dir, path) = stack_with_keys(&[&old], None).await;
    let old_token = old.sign(&claims("alice"));
    let new_token = new.sign(&claims("alice"));
    // Verified once, so cached.
    assert_eq!(put_as(&stack, &old_token).await.status(), StatusCode::OK);
    assert_eq!(put_as(&stack, &old_token).await.status(), StatusCode::OK);
    assert_refused_because(
        &put_as(&stack, &new_token).await,
        "the token's signing key is not in the key set",
    );

    // Both during the rollover, then only the new one.
    write_jwks(&path, &[&old, &new]);
    wait_for_status(&stack, &new_token, StatusCode::OK).await;
    assert_eq!(put_as(&stack, &old_token).await.status(), StatusCode::OK);
    write_jwks(&path, &[&new]);
    wait_for_status(&stack, &old_token, StatusCode::UNAUTHORIZED).await;
    assert_refused_because(
        &put_as(&stack, &old_token).await,
        "the token's signing key is not in the key set",
    );
    assert_eq!(put_as(&stack, &new_token).await.status(), StatusCode::OK);

    // A broken file keeps the keys in use.
    std::fs::write(&path, "{not json").unwrap();
    let failed = stack
        .gateway
        .metrics
        .jwks_updates
        .with_label_values(&["failed"]);
    wait_until(Duration::from_secs(10), "the broken file is read", || {
        failed.get() >= 1
    })
    .await;
    assert_eq!(put_as(&stack, &new_token).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_jwks_url_over_tls_is_fetched_again_for_an_unknown_kid_at_a_bounded_rate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "jwks");
    let first = SigningKey::rsa("first");
    let second = SigningKey::ec("second");
    let server = JwksServer::tls(&[&first], &pki).await;
    let mut settings = server.settings(Some(&pki.ca));
    settings.min_refetch_interval = Duration::from_secs(2);
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            jwt: Some(settings),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    // The first fetch happens at start.
    crate::support::wait_until(Duration::from_secs(10), "the first fetch", || {
        server.fetches() == 1
    })
    .await;
    assert_eq!(
        put_as(&stack, &first.sign(&claims("alice"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(server.fetches(), 1);

    // A new key at the issuer: the first token naming it brings a fetch.
    server.set_keys(&[&first, &second]);
    assert_eq!(
        put_as(&stack, &second.sign(&claims("bob"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(server.fetches(), 2);

    // Made-up key ids do not make a fetch each.
    for kid in ["x1", "x2", "x3"] {
        let response = put_as(&stack, &SigningKey::ec(kid).sign(&claims("eve"))).await;
        assert_refused_because(&response, "the token's signing key is not in the key set");
    }
    assert_eq!(server.fetches(), 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let response = put_as(&stack, &SigningKey::ec("x4").sign(&claims("eve"))).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(server.fetches(), 3);

    // A key the issuer dropped stops working at the next fetch.
    server.set_keys(&[&second]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = put_as(&stack, &SigningKey::ec("x5").sign(&claims("eve"))).await;
    assert_eq!(server.fetches(), 4);
    assert_refused_because(
        &put_as(&stack, &first.sign(&claims("alice"))).await,
        "the token's signing key is not in the key set",
    );
}

#[tokio::test]
async fn the_binary_fetches_the_jwks_url_with_the_ca_and_token_files() {
    let broker = Mosquitto::start().await;
    let _responder = Responder::start(broker.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "jwks");
    let key = SigningKey::rsa("sa-key");
    let server = JwksServer::tls(&[&key], &pki).await;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "pod-token\n").unwrap();
    let gateway = GatewayProcess::start(
        broker.addr.port(),
        &[
            "--jwt-jwks-url",
            &server.url,
            "--jwt-jwks-ca-file",
            pki.ca.to_str().unwrap(),
            "--jwt-jwks-token-file",
            token_file.to_str().unwrap(),
            "--jwt-issuer",
            ISSUER,
            "--jwt-audience",
            AUDIENCE,
        ],
    )
    .await;
    let token = key.sign(&service_account_claims("apps", "dashboard"));
    let response = gateway
        .http
        .get(gateway.key(b"k"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    // The responder answers every GET as a missing key.
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let unsigned = gateway
        .http
        .get(gateway.key(b"k"))
        .bearer_auth(unsigned_token("sa-key", &claims("eve")))
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), StatusCode::UNAUTHORIZED);
    assert!(server.fetches() >= 1);
    assert!(
        server
            .authorizations()
            .iter()
            .all(|sent| sent.as_deref() == Some("Bearer pod-token"))
    );
}

#[tokio::test]
async fn a_jwks_file_without_issuer_and_audience_stops_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    write_jwks(&path, &[&SigningKey::ec("k")]);
    let output = binary_command()
        .args(["serve", "--use-tls", "false", "--jwt-jwks-file"])
        .arg(&path)
        .args(["--jwt-issuer", ISSUER])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("invalid --jwt-audience (STATESTORE_GATEWAY_JWT_AUDIENCE): required"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_watch_takes_the_jwt_as_access_token() {
    let key = SigningKey::rsa("k");
    let (stack, _dir, _) = stack_with_keys(&[&key], None).await;
    let gw = &stack.gateway;
    let token = key.sign(&claims("browser"));
    let mut stream = sse::open(
        &gw.http,
        &gw.url(&format!("/watch/config?access_token={token}")),
        None,
    )
    .await
    .unwrap();
    stream.expect("sync").await;

    let expired = key.sign(&claims_with("browser", json!({"exp": now() - 3600})));
    let (status, headers, _) = sse::open(
        &gw.http,
        &gw.url(&format!("/watch/config?access_token={expired}")),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(status, 401);
    assert!(
        headers[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .contains("error_description=\"the token has expired\"")
    );
    // Only watch routes take it.
    let keys = gw
        .http
        .get(gw.url(&format!("/keys/config?access_token={token}")))
        .send()
        .await
        .unwrap();
    assert_eq!(keys.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_api_token_keeps_working_beside_jwts() {
    let key = SigningKey::ec("k");
    let (stack, _dir, _) = stack_with_keys(&[&key], Some("shared-s3cret")).await;
    assert_eq!(
        put_as(&stack, "shared-s3cret").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        put_as(&stack, &key.sign(&claims("alice"))).await.status(),
        StatusCode::OK
    );
    // Anything else is checked as a JWT.
    assert_refused_because(
        &put_as(&stack, "shared-s3cre").await,
        "the token is not a well-formed JWT",
    );
}

#[tokio::test]
async fn a_wrong_api_token_alone_is_invalid_token() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some("shared-s3cret".into()),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    assert_refused_because(
        &put_as(&stack, "guess").await,
        "the bearer token is not the API token",
    );
    assert_eq!(refusals(&stack, "api_token").await, 1);
    // A JWT means nothing to a gateway without a key set.
    let key = SigningKey::ec("k");
    assert_eq!(
        put_as(&stack, &key.sign(&claims("alice"))).await.status(),
        StatusCode::UNAUTHORIZED
    );
}
