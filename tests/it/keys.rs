//! The key API over real TCP: mosquitto, the emulator (or a scripted store)
//! and the gateway, driven with reqwest. Every row of the API's request and
//! failure tables has a test here.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header;
use serde_json::Value;
use statestore_gateway::emulator::AccessList;
use statestore_gateway::protocol::{Hlc, Request, hlc};

use crate::support::gateway::{GatewayOptions, Stack, encode, etag, json, problem};
use crate::support::mosquitto::MosquittoConfig;
use crate::support::scripted_store::{Script, Scripted};

#[tokio::test]
async fn get_returns_the_raw_value_with_its_version_and_headers() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let response = gw.put(b"greeting", "hello").await;
    assert_eq!(response.status(), StatusCode::OK);
    let version = etag(response.headers());
    let body = json(response).await;
    assert_eq!(body["version"], version.as_str());
    Hlc::parse(&version).expect("the version is an HLC");

    let response = gw.get(b"greeting").await;
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers[header::CONTENT_TYPE], "application/octet-stream");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers[header::CACHE_CONTROL], "no-store");
    assert_eq!(etag(&headers), version);
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"hello");
}

#[tokio::test]
async fn head_has_the_headers_and_no_body() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let version = etag(gw.put(b"k", "12345").await.headers());
    let response = gw.at(b"k").head().await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_LENGTH], "5");
    assert_eq!(etag(response.headers()), version);
    assert!(response.bytes().await.unwrap().is_empty());

    let missing = gw.at(b"nope").head().await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(missing.bytes().await.unwrap().is_empty());
}

#[tokio::test]
async fn if_none_match_with_the_current_version_is_304() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let version = etag(gw.put(b"k", "v1").await.headers());
    let conditional = |value: String| {
        gw.http
            .get(gw.key(b"k"))
            .header(header::IF_NONE_MATCH, value)
            .send()
    };
    for matching in [
        format!("\"{version}\""),
        format!("W/\"{version}\""),
        format!("\"other\", W/\"{version}\""),
        "*".to_owned(),
    ] {
        let response = conditional(matching.clone()).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED, "{matching}");
        assert_eq!(etag(response.headers()), version);
        assert!(response.bytes().await.unwrap().is_empty());
    }
    let response = conditional("\"000000000000001:00000:x\"".into())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"v1");

    // A new value has a new version: the old tag no longer matches.
    let newer = etag(gw.put(b"k", "v2").await.headers());
    assert!(Hlc::parse(&newer).unwrap() > Hlc::parse(&version).unwrap());
    let response = conditional(format!("\"{version}\"")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(etag(response.headers()), newer);

    let response = gw
        .at(b"absent")
        .header(header::IF_NONE_MATCH, "*")
        .get()
        .await;
    problem(response, 404, "/problems/key-not-found").await;

    let response = conditional("not-a-tag".into()).await.unwrap();
    problem(response, 400, "/problems/invalid-header").await;
}

#[tokio::test]
async fn accept_json_gives_text_and_base64() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let version = etag(gw.put(b"text", "caf\u{e9}").await.headers());
    let response = gw
        .at(b"text")
        .header(header::ACCEPT, "application/json")
        .get()
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    let body = json(response).await;
    assert_eq!(body["key"], "text");
    assert!(body.get("key_base64").is_none());
    assert_eq!(body["value"], "caf\u{e9}");
    assert_eq!(body["value_base64"], "Y2Fmw6k=");
    assert_eq!(body["version"], version.as_str());

    gw.put(b"bin\xff", vec![0u8, 0xfe]).await;
    let body = json(
        gw.at(b"bin\xff")
            .header(header::ACCEPT, "application/json")
            .get()
            .await,
    )
    .await;
    assert_eq!(body["key"], Value::Null);
    assert_eq!(body["key_base64"], "Ymlu/w==");
    assert_eq!(body["value"], Value::Null);
    assert_eq!(body["value_base64"], "AP4=");
}

/// RFC 9110 8.8.3: the raw and the JSON form of a key are two
/// representations, so they need two entity tags, and caches must know
/// that `Accept` picks between them.
#[tokio::test]
async fn raw_and_json_representations_have_their_own_etags_and_vary_on_accept() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let version = etag(gw.put(b"k", "v1").await.headers());
    let read = |accept: &'static str, if_none_match: Option<String>| {
        let mut request = gw.http.get(gw.key(b"k")).header(header::ACCEPT, accept);
        if let Some(tag) = if_none_match {
            request = request.header(header::IF_NONE_MATCH, tag);
        }
        request.send()
    };
    let raw = read("application/octet-stream", None).await.unwrap();
    let json = read("application/json", None).await.unwrap();
    for response in [&raw, &json] {
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[header::VARY], "Accept");
    }
    let raw_tag = raw.headers()[header::ETAG].to_str().unwrap().to_owned();
    let json_tag = json.headers()[header::ETAG].to_str().unwrap().to_owned();
    assert_eq!(raw_tag, format!("\"{version}\""));
    assert_ne!(raw_tag, json_tag);

    // Each tag validates its own representation, and only that one.
    for (accept, tag, expected) in [
        (
            "application/octet-stream",
            &raw_tag,
            StatusCode::NOT_MODIFIED,
        ),
        ("application/json", &json_tag, StatusCode::NOT_MODIFIED),
        ("application/json", &raw_tag, StatusCode::OK),
        ("application/octet-stream", &json_tag, StatusCode::OK),
    ] {
        let response = read(accept, Some(tag.clone())).await.unwrap();
        assert_eq!(response.status(), expected, "{accept} with {tag}");
        assert_eq!(response.headers()[header::VARY], "Accept");
        let own = if accept == "application/json" {
            &json_tag
        } else {
            &raw_tag
        };
        assert_eq!(&response.headers()[header::ETAG], own.as_str());
    }
}

#[tokio::test]
async fn missing_key_is_404() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let body = problem(gw.get(b"never-set").await, 404, "/problems/key-not-found").await;
    assert!(body.get("store_error").is_none());
    let response = gw.at(b"never-set").delete().await;
    problem(response, 404, "/problems/key-not-found").await;
}

#[tokio::test]
async fn if_none_match_star_creates_once() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let create = || {
        gw.http
            .put(gw.key(b"once"))
            .header(header::IF_NONE_MATCH, "*")
            .body("first")
            .send()
    };
    let response = create().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let version = etag(response.headers());
    let body = json(response).await;
    assert_eq!(body["version"], version.as_str());

    problem(
        create().await.unwrap(),
        412,
        "/problems/precondition-failed",
    )
    .await;
    let value = gw.get(b"once").await.bytes().await.unwrap();
    assert_eq!(value.as_ref(), b"first");
}

#[tokio::test]
async fn ttl_expires_the_key() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let short = gw.at(b"short").query("ttl=300").put("x").await;
    assert_eq!(short.status(), StatusCode::OK);
    let long = gw.at(b"long").query("ttl=30s").put("x").await;
    assert_eq!(long.status(), StatusCode::OK);
    assert_eq!(gw.get(b"short").await.status(), StatusCode::OK);

    let deadline = Instant::now() + Duration::from_secs(5);
    while gw.get(b"short").await.status() == StatusCode::OK {
        assert!(Instant::now() < deadline, "a 300 ms key outlived 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gw.get(b"long").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn nex_sets_when_absent_or_equal() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let nex = |value: &'static str| {
        gw.http
            .put(format!("{}?nex=true&ttl=10s", gw.key(b"lease")))
            .body(value)
            .send()
    };
    assert_eq!(nex("holder-a").await.unwrap().status(), StatusCode::OK);
    assert_eq!(nex("holder-a").await.unwrap().status(), StatusCode::OK);
    problem(
        nex("holder-b").await.unwrap(),
        412,
        "/problems/precondition-failed",
    )
    .await;
}

#[tokio::test]
async fn persist_true_keeps_the_key_across_a_store_restart() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_owned();
    let mut stack = Stack::builder()
        .emulator(move |config| config.data_dir = Some(dir))
        .start()
        .await;
    let gw = &stack.gateway;
    let response = gw.at(b"durable").query("persist=true").put("kept").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(gw.put(b"volatile", "lost").await.status(), StatusCode::OK);

    stack.restart_emulator().await;
    let gw = &stack.gateway;
    let response = gw.get(b"durable").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"kept");
    assert_eq!(gw.get(b"volatile").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn delete_is_204_with_the_deleted_version() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let written = etag(gw.put(b"k", "v").await.headers());
    let response = gw.at(b"k").delete().await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let deleted = etag(response.headers());
    assert!(Hlc::parse(&deleted).unwrap() >= Hlc::parse(&written).unwrap());
    assert!(response.bytes().await.unwrap().is_empty());
    assert_eq!(gw.get(b"k").await.status(), StatusCode::NOT_FOUND);
    let again = gw.at(b"k").delete().await;
    problem(again, 404, "/problems/key-not-found").await;
}

#[tokio::test]
async fn delete_with_value_deletes_only_that_value() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let value: Vec<u8> = vec![0, b'+', b' ', b'&', b'=', 0xff, b'%'];
    gw.put(b"k", value.clone()).await;
    let vdel = |expected: &[u8]| {
        gw.http
            .delete(format!("{}?value={}", gw.key(b"k"), encode(expected)))
            .send()
    };
    problem(
        vdel(b"something else").await.unwrap(),
        412,
        "/problems/precondition-failed",
    )
    .await;
    assert_eq!(gw.get(b"k").await.status(), StatusCode::OK);
    let response = vdel(&value).await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    etag(response.headers());
    problem(vdel(&value).await.unwrap(), 404, "/problems/key-not-found").await;

    // Form encoding: `+` is a space in the query.
    gw.put(b"k", "a b").await;
    let response = gw.at(b"k").query("value=a+b").delete().await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn fencing_tokens_guard_writes() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    // A lease: its version is the fencing token.
    let lease = gw.at(b"lock").query("nex=true&ttl=30s").put("holder").await;
    let token = etag(lease.headers());

    let write = |token: Option<String>, value: &'static str| {
        let mut request = gw.http.put(gw.key(b"resource")).body(value);
        if let Some(token) = token {
            request = request.header("Fencing-Token", token);
        }
        request.send()
    };
    // The first fenced write stores the token with the key.
    let first = write(Some(token.clone()), "one").await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);

    let body = problem(
        write(None, "unfenced").await.unwrap(),
        428,
        "/problems/fencing-token-required",
    )
    .await;
    assert_eq!(
        body["store_error"],
        "a fencing token is required for this request"
    );

    let mut older = Hlc::parse(&token).unwrap();
    older.wall_ms -= 1_000;
    let body = problem(
        write(Some(older.to_string()), "stale").await.unwrap(),
        409,
        "/problems/fencing-token-outdated",
    )
    .await;
    assert!(
        body["store_error"]
            .as_str()
            .unwrap()
            .contains("lower version")
    );

    // Renewing the lease gives a newer token; the ETag form (quoted) works.
    let renewed = gw.at(b"lock").query("nex=true&ttl=30s").put("holder").await;
    let newer = renewed.headers()[header::ETAG].to_str().unwrap().to_owned();
    assert_eq!(
        write(Some(newer.clone()), "two").await.unwrap().status(),
        StatusCode::OK
    );

    let unfenced_delete = gw.at(b"resource").delete().await;
    problem(unfenced_delete, 428, "/problems/fencing-token-required").await;
    let fenced_delete = gw
        .at(b"resource")
        .header("Fencing-Token", newer)
        .delete()
        .await;
    assert_eq!(fenced_delete.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn bad_input_is_400() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let far_ahead = Hlc::new(hlc::now_ms() + 120_000, "client").to_string();
    let cases = [
        (
            gw.http
                .put(gw.key(b"k"))
                .header("Fencing-Token", "not-a-clock"),
            "/problems/invalid-fencing-token",
        ),
        (
            gw.http.put(gw.key(b"k")).header("Fencing-Token", far_ahead),
            "/problems/fencing-token-too-far-ahead",
        ),
        (
            gw.http.put(format!("{}?ttl=soon", gw.key(b"k"))),
            "/problems/invalid-ttl",
        ),
        (
            gw.http.put(format!("{}?ttl=-5", gw.key(b"k"))),
            "/problems/invalid-ttl",
        ),
        (gw.http.put(gw.url("/keys/")), "/problems/empty-key"),
        (gw.http.get(gw.url("/keys/")), "/problems/empty-key"),
        (
            gw.http.get(gw.url("/keys/%zz")),
            "/problems/bad-percent-encoding",
        ),
        (
            gw.http.get(gw.url("/keys/abc%4")),
            "/problems/bad-percent-encoding",
        ),
        (
            gw.http
                .put(format!("{}?nex=true", gw.key(b"k")))
                .header(header::IF_NONE_MATCH, "*"),
            "/problems/conflicting-conditions",
        ),
        (
            gw.http.put(format!("{}?expire=1s", gw.key(b"k"))),
            "/problems/invalid-query",
        ),
        (
            gw.http.put(gw.key(b"k")).header(header::IF_MATCH, "\"x\""),
            "/problems/invalid-header",
        ),
    ];
    for (request, kind) in cases {
        let response = request.body("v").send().await.unwrap();
        problem(response, 400, kind).await;
    }
    // Nothing was written by any of them.
    assert_eq!(gw.get(b"k").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn key_over_the_limit_is_414() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            max_key_bytes: 64,
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    assert_eq!(gw.put(&[b'k'; 64], "v").await.status(), StatusCode::OK);
    let body = problem(
        gw.put(&[b'k'; 65], "v").await,
        414,
        "/problems/key-too-long",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("64"));
    // Escapes count as the bytes they decode to.
    assert_eq!(gw.put(&[0xff; 64], "v").await.status(), StatusCode::OK);
}

async fn stack_with_value_limit(max: usize) -> Stack {
    Stack::builder()
        .gateway(GatewayOptions {
            max_value_bytes: Some(max),
            ..GatewayOptions::default()
        })
        .start()
        .await
}

#[tokio::test]
async fn value_over_the_configured_limit_is_413() {
    let stack = stack_with_value_limit(1000).await;
    let gw = &stack.gateway;
    assert_eq!(gw.put(b"k", vec![7u8; 1000]).await.status(), StatusCode::OK);
    problem(
        gw.put(b"k", vec![7u8; 1001]).await,
        413,
        "/problems/value-too-large",
    )
    .await;
    // A chunked body (no Content-Length) is cut off at the limit too.
    let chunks = futures_util::stream::iter(
        (0..4).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![1u8; 300]))),
    );
    let response = gw.at(b"k").put(reqwest::Body::wrap_stream(chunks)).await;
    problem(response, 413, "/problems/value-too-large").await;
    assert_eq!(
        gw.get(b"k").await.bytes().await.unwrap().as_ref(),
        &[7u8; 1000][..]
    );
}

/// Sends `PUT {target}` with `body_len` bytes (and `headers`) on a raw
/// socket and returns the answer's head, lower case. The gateway may stop
/// reading (and close) before the whole body is sent.
async fn raw_put_head(
    api: std::net::SocketAddr,
    target: &str,
    headers: &str,
    body_len: usize,
) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = tokio::net::TcpStream::connect(api).await.unwrap();
    let (mut read, mut write) = socket.into_split();
    let head =
        format!("PUT {target} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {body_len}\r\n\r\n");
    let sender = tokio::spawn(async move {
        let _ = write.write_all(head.as_bytes()).await;
        let _ = write.write_all(&vec![b'v'; body_len]).await;
        write
    });
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(4).any(|window| window == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), read.read(&mut buffer))
            .await
            .expect("the answer arrives")
            .unwrap();
        assert!(n > 0, "closed before the answer: {answer:?}");
        answer.extend_from_slice(&buffer[..n]);
    }
    drop(sender);
    String::from_utf8_lossy(&answer).to_ascii_lowercase()
}

/// An answer given before the body was read to its end: the gateway will
/// not read a large remainder, so it must say `Connection: close` (RFC 9112
/// 9.6), or a client that sent the whole body reuses the connection and its
/// next request fails (seen with reqwest against the webhook). An answer
/// after the whole body keeps the connection.
#[tokio::test]
async fn an_answer_before_the_body_was_read_says_connection_close() {
    let stack = stack_with_value_limit(1000).await;
    let api = stack.gateway.api;
    let big = 4 * 1024 * 1024;
    for (target, headers, status) in [
        ("/keys/k", "", "413"),
        ("/keys/k?ttl=soon", "", "400"),
        ("/keys/k", "Fencing-Token: x\r\n", "400"),
        ("/nowhere", "", "404"),
    ] {
        let head = raw_put_head(api, target, headers, big).await;
        assert!(
            head.starts_with(&format!("http/1.1 {status}")),
            "{target}: {head}"
        );
        assert!(
            head.contains("\r\nconnection: close\r\n"),
            "{target}: {head}"
        );
    }
    // Read to its end, then refused: the connection stays open.
    assert_eq!(
        stack.gateway.put(b"made", "v").await.status(),
        StatusCode::OK
    );
    let head = raw_put_head(api, "/keys/made", "If-None-Match: *\r\n", 10).await;
    assert!(head.starts_with("http/1.1 412"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
}

#[tokio::test]
async fn value_limit_defaults_to_the_brokers_maximum_packet_size() {
    let stack = Stack::builder()
        .broker(MosquittoConfig {
            extra: "max_packet_size 65536\n".into(),
            ..MosquittoConfig::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    assert_eq!(
        gw.put(b"k", vec![1u8; 60_000]).await.status(),
        StatusCode::OK
    );
    problem(
        gw.put(b"k", vec![1u8; 70_000]).await,
        413,
        "/problems/value-too-large",
    )
    .await;
}

#[tokio::test]
async fn value_limit_without_a_broker_limit_is_the_gateways_packet_size() {
    // Mosquitto sets no maximum packet size: the pool's own 16 MiB bounds
    // values, not the 4 MiB used before any connection is up.
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let over_fallback = vec![3u8; 4 * 1024 * 1024 + 1];
    assert_eq!(
        gw.put(b"big", over_fallback.clone()).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        gw.get(b"big").await.bytes().await.unwrap().len(),
        over_fallback.len()
    );
    problem(
        gw.put(b"big", vec![0u8; 16 * 1024 * 1024 + 1]).await,
        413,
        "/problems/value-too-large",
    )
    .await;
}

#[tokio::test]
async fn configured_limit_above_the_brokers_is_still_413() {
    let stack = Stack::builder()
        .broker(MosquittoConfig {
            extra: "max_packet_size 65536\n".into(),
            ..MosquittoConfig::default()
        })
        .gateway(GatewayOptions {
            max_value_bytes: Some(1_000_000),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    let body = problem(
        gw.put(b"k", vec![1u8; 100_000]).await,
        413,
        "/problems/value-too-large",
    )
    .await;
    // The broker's limit (less the envelope) is the one reported.
    let detail = body["detail"].as_str().unwrap();
    assert!(!detail.contains("1000000"), "{detail}");
    assert_eq!(
        gw.put(b"k", vec![1u8; 1_000]).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn store_refusing_access_is_403() {
    let options = GatewayOptions::default();
    let acl = AccessList::from_json(&format!(
        r#"{{ "{}*": {{ "read": [""], "write": ["app/"] }} }}"#,
        options.client_id
    ))
    .unwrap();
    let stack = Stack::builder()
        .emulator(move |config| config.acl = Some(acl))
        .gateway(options)
        .start()
        .await;
    let gw = &stack.gateway;
    assert_eq!(gw.put(b"app/x", "v").await.status(), StatusCode::OK);
    let body = problem(gw.put(b"system/x", "v").await, 403, "/problems/forbidden").await;
    assert_eq!(body["store_error"], "not authorized");
    // Reading is allowed everywhere.
    assert_eq!(gw.get(b"system/x").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn store_over_quota_is_507() {
    let stack = Stack::builder()
        .emulator(|config| config.max_keys = Some(2))
        .start()
        .await;
    let gw = &stack.gateway;
    assert_eq!(gw.put(b"a", "1").await.status(), StatusCode::OK);
    assert_eq!(gw.put(b"b", "2").await.status(), StatusCode::OK);
    let body = problem(gw.put(b"c", "3").await, 507, "/problems/quota-exceeded").await;
    assert_eq!(body["store_error"], "the quota has been exceeded");
    // Overwriting an existing key still fits.
    assert_eq!(gw.put(b"a", "9").await.status(), StatusCode::OK);
}

fn reply_to_everything(payload: &'static [u8]) -> Script {
    Arc::new(move |_: &Request, _: Option<&str>| Scripted::Reply(payload.to_vec()))
}

#[tokio::test]
async fn store_clock_skew_is_503_logged_and_counted() {
    let stack = Stack::builder().scripted(reply_to_everything(b"-ERR the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n")).start()
    .await;
    let gw = &stack.gateway;
    let response = gw.put(b"k", "v").await;
    assert!(response.headers().get(header::RETRY_AFTER).is_none());
    let body = problem(response, 503, "/problems/clock-skew").await;
    assert!(
        body["store_error"]
            .as_str()
            .unwrap()
            .starts_with("the request timestamp is too far in the future")
    );
    assert!(
        gw.metrics
            .render()
            .contains(r#"store_errors_total{kind="timestamp_skew"} 1"#)
    );
}

#[tokio::test]
async fn store_protocol_failures_are_502() {
    // The key names the reply the scripted store sends.
    let script: Script = Arc::new(|request: &Request, _: Option<&str>| {
        let payload: &[u8] = match request.key().map(AsRef::as_ref).unwrap_or_default() {
            b"syntax" => b"-ERR syntax error\r\n",
            b"unknown-command" => b"-ERR unknown command\r\n",
            b"arguments" => b"-ERR wrong number of arguments\r\n",
            b"missing-ts" => b"-ERR missing timestamp\r\n",
            b"malformed-ts" => b"-ERR malformed timestamp\r\n",
            b"brand-new" => b"-ERR something nobody documented\r\n",
            b"garbage" => b"this is not RESP",
            b"wrong-shape" => b"+OK\r\n",
            _ => b"$-1\r\n",
        };
        Scripted::Reply(payload.to_vec())
    });
    let stack = Stack::builder().scripted(script).start().await;
    let gw = &stack.gateway;
    for (key, raw) in [
        (&b"syntax"[..], Some("syntax error")),
        (b"unknown-command", Some("unknown command")),
        (b"arguments", Some("wrong number of arguments")),
        (b"missing-ts", Some("missing timestamp")),
        (b"malformed-ts", Some("malformed timestamp")),
        (b"brand-new", Some("something nobody documented")),
        (b"garbage", None),
    ] {
        let body = problem(
            gw.put(key, "v").await,
            502,
            match raw {
                Some(_) => "/problems/store-error",
                None => "/problems/bad-store-reply",
            },
        )
        .await;
        assert_eq!(body["store_error"].as_str(), raw, "{body}");
    }
    // `+OK` does not answer a GET.
    problem(
        gw.get(b"wrong-shape").await,
        502,
        "/problems/bad-store-reply",
    )
    .await;
    // With a client token, `malformed timestamp` is the client's fault.
    let token = Hlc::new(hlc::now_ms(), "client").to_string();
    let response = gw
        .at(b"malformed-ts")
        .header("Fencing-Token", token)
        .put("v")
        .await;
    problem(response, 400, "/problems/invalid-fencing-token").await;
}

#[tokio::test]
async fn no_broker_connection_is_503_with_retry_after() {
    let mut stack = Stack::start().await;
    stack.broker.kill();
    let gw = &stack.gateway;
    gw.wait_readyz(503, Duration::from_secs(10)).await;
    let started = Instant::now();
    let response = gw.get(b"k").await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    problem(response, 503, "/problems/unavailable").await;
    problem(gw.put(b"k", "v").await, 503, "/problems/unavailable").await;
}

#[tokio::test]
async fn stopped_store_is_503_with_retry_after() {
    // The broker acknowledges requests nobody subscribes to with "no
    // matching subscribers": the pool fails them at once.
    // Until mosquitto has handled the store's disconnect it still delivers
    // to its subscription, and a request waits out its timeout (504): on a
    // loaded machine the first request after the stop can be that early.
    let mut stack = Stack::start().await;
    stack.stop_emulator().await;
    let gw = &stack.gateway;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let started = Instant::now();
        let response = gw.get(b"k").await;
        if response.status() == StatusCode::GATEWAY_TIMEOUT && Instant::now() < deadline {
            continue;
        }
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        problem(response, 503, "/problems/unavailable").await;
        break;
    }
}

#[tokio::test]
async fn silent_store_is_504_within_the_request_timeout() {
    let never: Script = Arc::new(|_: &Request, _: Option<&str>| Scripted::Silent);
    let stack = Stack::builder()
        .scripted(never)
        .gateway(GatewayOptions {
            request_timeout: Duration::from_millis(500),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    let started = Instant::now();
    let response = gw.put(b"k", "v").await;
    let elapsed = started.elapsed();
    let body = problem(response, 504, "/problems/store-timeout").await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("may or may not have been applied")
    );
    assert!(
        elapsed >= Duration::from_millis(450) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn frozen_broker_is_504_not_a_hang() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            request_timeout: Duration::from_millis(500),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    stack.broker.pause();
    let gw = &stack.gateway;
    let started = Instant::now();
    let response = gw.get(b"k").await;
    let elapsed = started.elapsed();
    stack.broker.resume();
    problem(response, 504, "/problems/store-timeout").await;
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test]
async fn every_byte_round_trips_in_keys_and_values() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(gw.put(&all, all.clone()).await.status(), StatusCode::OK);
    let response = gw.get(&all).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.bytes().await.unwrap().as_ref(), all.as_slice());

    // Each byte alone as a key, one request per byte value.
    for byte in 0..=255u8 {
        let key = [b'k', byte];
        assert_eq!(
            gw.put(&key, vec![byte]).await.status(),
            StatusCode::OK,
            "{byte}"
        );
    }
    for byte in 0..=255u8 {
        let value = gw.get(&[b'k', byte]).await.bytes().await.unwrap();
        assert_eq!(value.as_ref(), &[byte], "{byte}");
    }

    // `/` and `%` in keys, raw `/` separating path segments too.
    gw.put(b"a/b%c", "slash").await;
    let raw_path = gw.url("/keys/a/b%25c");
    let value = gw
        .http
        .get(raw_path)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(value.as_ref(), b"slash");

    // The empty value is a value.
    assert_eq!(gw.put(b"empty", Vec::new()).await.status(), StatusCode::OK);
    let response = gw.get(b"empty").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_LENGTH], "0");
    assert!(response.bytes().await.unwrap().is_empty());

    // A 1 MiB value of every byte.
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 256) as u8).collect();
    assert_eq!(gw.put(b"big", big.clone()).await.status(), StatusCode::OK);
    let value = gw.get(b"big").await.bytes().await.unwrap();
    assert_eq!(value.len(), big.len());
    assert!(value.as_ref() == big.as_slice());
}

#[tokio::test]
async fn concurrent_writers_each_see_their_writes_ordered() {
    let stack = Stack::start().await;
    let gw = Arc::new(stack.gateway.key(b""));
    let http = stack.gateway.http.clone();
    let writers = 8;
    let writes = 25;
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let http = http.clone();
        let base = gw.clone();
        tasks.push(tokio::spawn(async move {
            let mut last: Option<Hlc> = None;
            for n in 0..writes {
                for key in ["shared".to_owned(), format!("own-{writer}")] {
                    let response = http
                        .put(format!("{base}{key}"))
                        .body(format!("{writer}:{n}"))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    let version = Hlc::parse(&etag(response.headers())).unwrap();
                    if let Some(previous) = &last {
                        assert!(version > *previous, "versions go forward per writer");
                    }
                    last = Some(version);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let gw = &stack.gateway;
    for writer in 0..writers {
        let value = gw
            .get(format!("own-{writer}").as_bytes())
            .await
            .text()
            .await
            .unwrap();
        assert_eq!(value, format!("{writer}:{}", writes - 1));
    }
    let shared = gw.get(b"shared").await.text().await.unwrap();
    let (writer, n) = shared.split_once(':').unwrap();
    assert!(writer.parse::<usize>().unwrap() < writers);
    assert_eq!(n.parse::<usize>().unwrap(), writes - 1);
}

#[tokio::test]
async fn broker_restart_under_load_never_hangs_and_service_resumes() {
    let mut stack = Stack::builder()
        .gateway(GatewayOptions {
            request_timeout: Duration::from_secs(2),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let base = stack.gateway.key(b"");
    let http = stack.gateway.http.clone();
    let mut workers = Vec::new();
    for worker in 0..4 {
        let http = http.clone();
        let base = base.clone();
        workers.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            let until = Instant::now() + Duration::from_secs(4);
            let mut n = 0;
            while Instant::now() < until && n < 2_000 {
                n += 1;
                let started = Instant::now();
                let response = http
                    .put(format!("{base}load-{worker}"))
                    .body(format!("{n}"))
                    .send()
                    .await
                    .expect("the gateway always answers");
                let elapsed = started.elapsed();
                assert!(
                    elapsed < Duration::from_secs(6),
                    "a request took {elapsed:?}"
                );
                statuses.push(response.status().as_u16());
            }
            statuses
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stack.broker.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stack.broker.restart().await;
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    assert!(
        all.iter().all(|status| [200, 503, 504].contains(status)),
        "{all:?}"
    );
    assert!(all.contains(&200));

    let gw = &stack.gateway;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if gw.put(b"after", "restart").await.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "service did not resume");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The outage reached the gateway under load: its connections were lost
    // and made again. (Whether a request failed depends on whether one was
    // in flight at the kill; a short outage may be ridden through.)
    let reconnects = gw
        .metric("statestore_gateway_pool_reconnects_total")
        .expect("the reconnect counter");
    assert!(reconnects >= 1.0, "no pool member reconnected");
    let value = gw.get(b"after").await.bytes().await.unwrap();
    assert_eq!(value.as_ref(), b"restart");
    gw.wait_readyz(200, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn api_token_is_required_on_the_key_api_only() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some("s3cret-token".into()),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    let response = gw.put(b"k", "v").await;
    assert_eq!(
        response.headers()[header::WWW_AUTHENTICATE],
        "Bearer realm=\"statestore-gateway\""
    );
    problem(response, 401, "/problems/unauthorized").await;
    let wrong = gw
        .http
        .get(gw.key(b"k"))
        .bearer_auth("s3cret-tokem")
        .send()
        .await
        .unwrap();
    problem(wrong, 401, "/problems/unauthorized").await;
    let right = gw
        .http
        .put(gw.key(b"k"))
        .bearer_auth("s3cret-token")
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), StatusCode::OK);
    // The admin port needs no token.
    let metrics = gw.http.get(gw.admin_url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
}

#[tokio::test]
async fn other_methods_are_405_with_allow() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let response = gw.http.post(gw.key(b"k")).body("v").send().await.unwrap();
    let allow = response.headers()[header::ALLOW]
        .to_str()
        .unwrap()
        .to_owned();
    for method in ["GET", "HEAD", "PUT", "DELETE"] {
        assert!(allow.contains(method), "{allow}");
    }
    problem(response, 405, "/problems/method-not-allowed").await;
}
