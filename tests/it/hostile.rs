//! Hostile input: raw HTTP the gateway must refuse cleanly (never a 5xx but
//! the documented store failures, never a panic or a hang), and MQTT
//! requests the emulator must answer or drop while it keeps serving others.
//! What tests/it/emulator.rs already covers (garbage payloads, huge declared
//! lengths, QoS 0, missing correlation data or response topic, forbidden
//! response topics, bad protocol versions) is not repeated here.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::net::SocketAddr;
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use statestore_gateway::protocol::resp::encode_array;
use statestore_gateway::protocol::{Hlc, hlc, property};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::Mosquitto;
use crate::support::emulator::{RawClient, WAIT, start_emulator, user_property};
use crate::support::gateway::{GatewayOptions, Stack};

/// What came back on a raw connection.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl RawResponse {
    fn problem_type(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|json| json["type"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// Sends `request` as is on a new connection and reads the response until
/// the server closes (requests say `Connection: close`), or only its head
/// with `head_only` (streams). `None`: the server closed without answering.
async fn raw(addr: SocketAddr, request: &[u8], head_only: bool) -> Option<RawResponse> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before reading everything we send.
    let _ = stream.write_all(request).await;
    let mut received = Vec::new();
    let read = async {
        let mut buffer = [0u8; 8192];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
            if head_only && received.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the gateway answers (or closes) within 20 s");
    let end = received.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&received[..end]).into_owned();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some(RawResponse {
        status,
        head,
        body: received[end + 4..].to_vec(),
    })
}

/// A request with `Connection: close`, the given extra header lines (each
/// ending in CRLF) and body.
fn request(method: &str, target: &[u8], headers: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target);
    out.extend_from_slice(b" HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n");
    out.extend_from_slice(headers);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// A 5xx that is not one of the documented store failures is a bug.
fn assert_no_server_error(what: &str, response: &RawResponse) {
    assert!(
        response.status < 500 || matches!(response.status, 502..=504),
        "{what}: {}\n{}",
        response.head,
        String::from_utf8_lossy(&response.body)
    );
}

/// The gateway still reads and writes keys.
async fn assert_still_serving(stack: &Stack) {
    let gw = &stack.gateway;
    let response = gw
        .http
        .put(gw.key(b"still-serving"))
        .body("yes")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let response = gw.http.get(gw.key(b"still-serving")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "yes");
}

fn quick_gateway() -> GatewayOptions {
    GatewayOptions {
        request_timeout: Duration::from_secs(2),
        ..GatewayOptions::default()
    }
}

/// Sends each case and checks its status (and problem type, if given);
/// `None` as status: any answer but a 5xx.
async fn check_cases(stack: &Stack, cases: &[(&str, Vec<u8>, Option<u16>, &str)]) {
    for (what, bytes, status, kind) in cases {
        let response = raw(stack.gateway.api, bytes, false).await;
        match (status, response) {
            (None, Some(response)) => assert_no_server_error(what, &response),
            (Some(expected), Some(response)) => {
                assert_eq!(response.status, *expected, "{what}: {}", response.head);
                if !kind.is_empty() {
                    assert_eq!(response.problem_type(), *kind, "{what}");
                }
            }
            // A handler that panics drops the connection without an answer;
            // even the HTTP parser answers what it refuses.
            (_, None) => panic!("{what}: the connection closed without an answer"),
        }
    }
    assert_no_5xx_counted(stack);
    assert_still_serving(stack).await;
}

/// The request metrics count no 5xx at all (the store is healthy here).
fn assert_no_5xx_counted(stack: &Stack) {
    const FAMILY: &str = "statestore_gateway_http_requests_total{";
    let metrics = stack.gateway.metrics.render();
    let counted: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with(FAMILY))
        .collect();
    // Else a renamed family would make the check below pass vacuously.
    assert!(!counted.is_empty(), "no {FAMILY} samples in\n{metrics}");
    let server_errors: Vec<&&str> = counted
        .iter()
        .filter(|line| line.contains("status=\"5"))
        .collect();
    assert!(server_errors.is_empty(), "{server_errors:?}");
}

#[tokio::test]
async fn other_methods_get_405_problem_json_with_allow_on_every_path() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    for (method, target) in [
        ("POST", "/keys/k"),
        ("PATCH", "/keys/"),
        ("BREW", "/keys/k"),
        ("POST", "/watch"),
        ("DELETE", "/watch/k"),
        ("PUT", "/openapi.json"),
    ] {
        let response = raw(
            stack.gateway.api,
            &request(method, target.as_bytes(), b"", b""),
            false,
        )
        .await
        .expect("a response");
        assert_eq!(response.status, 405, "{method} {target}: {}", response.head);
        assert_eq!(response.problem_type(), "/problems/method-not-allowed");
        let head = response.head.to_ascii_lowercase();
        assert!(head.contains("\nallow: get"), "{method} {target}: {head}");
    }
}

#[tokio::test]
async fn percent_edge_cases_are_400_or_a_key() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    let bad = "/problems/bad-percent-encoding";
    let missing = "/problems/key-not-found";
    let get = |target: &str| request("GET", target.as_bytes(), b"", b"");
    let cases = [
        ("%", get("/keys/%"), Some(400), bad),
        ("%0", get("/keys/%0"), Some(400), bad),
        ("%zz", get("/keys/%zz"), Some(400), bad),
        ("%G1", get("/keys/%G1"), Some(400), bad),
        ("a%", get("/keys/a%"), Some(400), bad),
        ("%%", get("/keys/%%"), Some(400), bad),
        ("%%41", get("/keys/%%41"), Some(400), bad),
        ("%4%41", get("/keys/%4%41"), Some(400), bad),
        ("%2F is the key /", get("/keys/%2F"), Some(404), missing),
        ("%2f%2F", get("/keys/%2f%2F"), Some(404), missing),
        ("%00", get("/keys/%00"), Some(404), missing),
        ("invalid UTF-8", get("/keys/%C3%28%FF"), Some(404), missing),
        ("a/b/c", get("/keys/a/b/c"), Some(404), missing),
        ("watch %", get("/watch/%"), Some(400), bad),
        ("watch ?key=%", get("/watch?key=%"), Some(400), bad),
        ("watch ?key=%zz", get("/watch?key=%zz"), Some(400), bad),
        (
            "DELETE ?value=%",
            request("DELETE", b"/keys/k?value=%", b"", b""),
            Some(400),
            bad,
        ),
        ("query name %", get("/keys/k?%=1"), Some(400), bad),
        ("query value %1", get("/keys/k?x=%1"), Some(400), bad),
    ];
    check_cases(&stack, &cases).await;
}

#[tokio::test]
async fn every_byte_raw_in_the_path_is_refused_or_served() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    let mut cases = Vec::new();
    for byte in 0..=255u8 {
        let mut target = b"/keys/a".to_vec();
        target.push(byte);
        target.push(b'b');
        let what = format!("raw byte 0x{byte:02x} in the path");
        cases.push((what, request("GET", &target, b"", b"")));
        let mut target = b"/keys/".to_vec();
        target.push(byte);
        let what = format!("raw byte 0x{byte:02x} as the key");
        cases.push((
            what,
            request("PUT", &target, b"Content-Length: 1\r\n", b"v"),
        ));
    }
    let cases: Vec<(&str, Vec<u8>, Option<u16>, &str)> = cases
        .iter()
        .map(|(what, bytes)| (what.as_str(), bytes.clone(), None, ""))
        .collect();
    check_cases(&stack, &cases).await;
    // And every byte escaped is a key of its own (sent raw: an HTTP client
    // library would turn `%2E` into a dot segment and remove it).
    let api = stack.gateway.api;
    for byte in 0..=255u8 {
        let target = format!("/keys/%{byte:02X}");
        let put = request("PUT", target.as_bytes(), b"Content-Length: 1\r\n", &[byte]);
        let response = raw(api, &put, false).await.expect("a response");
        assert_eq!(response.status, 200, "PUT {target}: {}", response.head);
        let response = raw(api, &request("GET", target.as_bytes(), b"", b""), false)
            .await
            .expect("a response");
        assert_eq!(
            (response.status, &response.body[..]),
            (200, &[byte][..]),
            "{target}"
        );
    }
}

#[tokio::test]
async fn overlong_keys_are_414_and_huge_heads_are_refused() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    let too_long = "/problems/key-too-long";
    let key = |len: usize| {
        let mut target = b"/keys/".to_vec();
        target.extend(std::iter::repeat_n(b'k', len));
        target
    };
    let escaped = format!("/keys/{}", "%41".repeat(1025));
    let watch = format!("/watch?key={}", "k".repeat(1025));
    let cases = [
        (
            "1024 bytes",
            request("GET", &key(1024), b"", b""),
            Some(404),
            "/problems/key-not-found",
        ),
        (
            "1025 bytes",
            request("GET", &key(1025), b"", b""),
            Some(414),
            too_long,
        ),
        (
            "1025 escapes",
            request("GET", escaped.as_bytes(), b"", b""),
            Some(414),
            too_long,
        ),
        (
            "PUT 60 KB",
            request("PUT", &key(60_000), b"Content-Length: 1\r\n", b"v"),
            Some(414),
            too_long,
        ),
        (
            "DELETE 60 KB",
            request("DELETE", &key(60_000), b"", b""),
            Some(414),
            too_long,
        ),
        (
            "watch 60 KB",
            request(
                "GET",
                &[b"/watch".as_slice(), &key(60_000)[5..]].concat(),
                b"",
                b"",
            ),
            Some(414),
            too_long,
        ),
        // Past the 64 KiB head limit the server answers 431 before routing.
        (
            "PUT 100 KB",
            request("PUT", &key(100_000), b"Content-Length: 1\r\n", b"v"),
            Some(431),
            "",
        ),
        (
            "watch ?key= 1025",
            request("GET", watch.as_bytes(), b"", b""),
            Some(414),
            too_long,
        ),
        // Beyond what the HTTP parser buffers: refused (431), never served.
        (
            "1 MB path",
            request("GET", &key(1 << 20), b"", b""),
            None,
            "",
        ),
    ];
    check_cases(&stack, &cases).await;
}

#[tokio::test]
async fn huge_or_lying_content_lengths_are_refused_without_waiting_forever() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    let put = |headers: &[u8], body: &[u8]| request("PUT", b"/keys/k", headers, body);
    let cases = [
        (
            "1 TB declared, nothing sent",
            put(b"Content-Length: 1000000000000\r\n", b""),
            Some(413),
            "/problems/value-too-large",
        ),
        (
            "u64 overflow",
            put(b"Content-Length: 99999999999999999999999\r\n", b""),
            Some(400),
            "",
        ),
        (
            "two lengths",
            put(b"Content-Length: 1\r\nContent-Length: 2\r\n", b"vv"),
            Some(400),
            "",
        ),
        (
            "100 declared, 10 sent: the body read times out",
            put(b"Content-Length: 100\r\n", b"0123456789"),
            Some(408),
            "/problems/request-timeout",
        ),
        (
            "bad chunk size",
            put(b"Transfer-Encoding: chunked\r\n", b"zz\r\nabc\r\n0\r\n\r\n"),
            None,
            "",
        ),
        (
            "2^64-1 chunk",
            put(
                b"Transfer-Encoding: chunked\r\n",
                b"FFFFFFFFFFFFFFFF\r\nabc",
            ),
            None,
            "",
        ),
        (
            "GET with 1 GB declared",
            request("GET", b"/keys/k", b"Content-Length: 1000000000\r\n", b""),
            Some(404),
            "/problems/key-not-found",
        ),
    ];
    check_cases(&stack, &cases).await;
}

#[tokio::test]
async fn absurd_query_strings_are_400_or_ignored() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    let query = "/problems/invalid-query";
    let target = |path: &str, query: String| format!("{path}?{query}").into_bytes();
    let cases = [
        (
            "60,000 empty pairs",
            request("GET", &target("/keys/k", "&".repeat(60_000)), b"", b""),
            Some(404),
            "/problems/key-not-found",
        ),
        (
            "a 100 KB query",
            request("GET", &target("/keys/k", "&".repeat(100_000)), b"", b""),
            Some(431),
            "",
        ),
        (
            "15,000 unknown pairs",
            request("GET", &target("/keys/k", "a=1&".repeat(15_000)), b"", b""),
            Some(400),
            query,
        ),
        (
            "nameless pairs",
            request("GET", &target("/keys/k", "=&=&=".into()), b"", b""),
            Some(400),
            query,
        ),
        (
            "5,000-digit ttl",
            request(
                "PUT",
                &target("/keys/k", format!("ttl={}", "9".repeat(5_000))),
                b"Content-Length: 1\r\n",
                b"v",
            ),
            Some(400),
            "/problems/invalid-ttl",
        ),
        (
            "ttl twice",
            request(
                "PUT",
                &target("/keys/k", "ttl=1s&ttl=2s".into()),
                b"Content-Length: 1\r\n",
                b"v",
            ),
            Some(400),
            query,
        ),
        (
            "nex=%FF",
            request(
                "PUT",
                &target("/keys/k", "nex=%FF".into()),
                b"Content-Length: 1\r\n",
                b"v",
            ),
            Some(400),
            query,
        ),
        (
            "a 60 KB value to compare",
            request(
                "DELETE",
                &target("/keys/k", format!("value={}", "v".repeat(60_000))),
                b"",
                b"",
            ),
            Some(404),
            "/problems/key-not-found",
        ),
        (
            "1,000 watched keys",
            request(
                "GET",
                &target("/watch", (0..1_000).map(|n| format!("key=k{n}&")).collect()),
                b"",
                b"",
            ),
            Some(429),
            "/problems/too-many-keys",
        ),
        (
            "an empty watched key",
            request("GET", &target("/watch", "key=".into()), b"", b""),
            Some(400),
            "/problems/empty-key",
        ),
        (
            "watch ?keys=",
            request("GET", &target("/watch", "keys=a".into()), b"", b""),
            Some(400),
            query,
        ),
        (
            "watch with no key",
            request("GET", b"/watch", b"", b""),
            Some(400),
            query,
        ),
    ];
    check_cases(&stack, &cases).await;
}

#[tokio::test]
async fn many_huge_and_non_utf8_headers_are_refused_or_ignored() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    let header_lines = |count: usize, name: &str| -> Vec<u8> {
        (0..count)
            .flat_map(|i| format!("{name}{i}: v\r\n").into_bytes())
            .collect()
    };
    let get = |headers: &[u8]| request("GET", b"/keys/k", headers, b"");
    let missing = "/problems/key-not-found";
    let big = format!("X-Big: {}\r\n", "b".repeat(200_000));
    let huge = format!("X-Huge: {}\r\n", "h".repeat(1 << 20));
    let inm: Vec<u8> = (0..90)
        .flat_map(|i| format!("If-None-Match: \"t{i}\"\r\n").into_bytes())
        .collect();
    let cases = [
        (
            "90 headers",
            get(&header_lines(90, "X-Junk-")),
            Some(404),
            missing,
        ),
        (
            "1,000 headers",
            get(&header_lines(1_000, "X-Junk-")),
            None,
            "",
        ),
        ("90 If-None-Match lines", get(&inm), Some(404), missing),
        ("a 200 KB header", get(big.as_bytes()), Some(431), ""),
        ("a 1 MB header", get(huge.as_bytes()), None, ""),
        (
            "If-None-Match not UTF-8",
            get(b"If-None-Match: \xff\xfe\r\n"),
            Some(400),
            "/problems/invalid-header",
        ),
        (
            "Accept not UTF-8",
            get(b"Accept: \xff\r\n"),
            Some(404),
            missing,
        ),
        (
            "Authorization not UTF-8",
            get(b"Authorization: Bearer \xff\r\n"),
            Some(404),
            missing,
        ),
        (
            "Fencing-Token not UTF-8",
            request(
                "PUT",
                b"/keys/k",
                b"Fencing-Token: \xff\xfe\r\nContent-Length: 1\r\n",
                b"v",
            ),
            Some(400),
            "/problems/invalid-fencing-token",
        ),
        (
            "Content-Type not UTF-8",
            request(
                "PUT",
                b"/keys/ct",
                b"Content-Type: \xff\r\nContent-Length: 1\r\n",
                b"v",
            ),
            Some(200),
            "",
        ),
        ("a header name not a token", get(b"X-\xff: 1\r\n"), None, ""),
        (
            "a NUL in a value",
            get(b"If-None-Match: \"a\x00b\"\r\n"),
            None,
            "",
        ),
        (
            "a bare CR in a value",
            get(b"If-None-Match: \"a\rb\"\r\n"),
            None,
            "",
        ),
    ];
    check_cases(&stack, &cases).await;
}

#[tokio::test]
async fn non_clock_fencing_tokens_are_400_and_last_event_ids_are_ignored() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    let invalid = "/problems/invalid-fencing-token";
    let far = Hlc::new(hlc::now_ms() + 120_000, "x").to_string();
    let mut cases = Vec::new();
    for token in [
        "abc",
        "",
        "1:2",
        "1:2:3:4",
        "99999999999999999999:0:x",
        "18446744073709551616:0:x",
        "-1:0:x",
        "1.5:0:x",
        " :0:x",
        "\"1:0:x",
        "\"\"",
        "1:0:x, 2:0:y",
    ] {
        for method in ["PUT", "DELETE"] {
            let headers = format!("Fencing-Token: {token}\r\nContent-Length: 1\r\n");
            cases.push((
                format!("{method} Fencing-Token {token:?}"),
                request(method, b"/keys/fenced", headers.as_bytes(), b"v"),
                invalid,
            ));
        }
    }
    let headers = format!("Fencing-Token: {far}\r\nContent-Length: 1\r\n");
    cases.push((
        "a token two minutes ahead".into(),
        request("PUT", b"/keys/fenced", headers.as_bytes(), b"v"),
        "/problems/fencing-token-too-far-ahead",
    ));
    cases.push((
        "two tokens".into(),
        request(
            "PUT",
            b"/keys/fenced",
            b"Fencing-Token: 1:0:x\r\nFencing-Token: 1:0:x\r\nContent-Length: 1\r\n",
            b"v",
        ),
        invalid,
    ));
    let cases: Vec<(&str, Vec<u8>, Option<u16>, &str)> = cases
        .iter()
        .map(|(what, bytes, kind)| (what.as_str(), bytes.clone(), Some(400), *kind))
        .collect();
    check_cases(&stack, &cases).await;

    // An unusable Last-Event-ID starts the stream afresh.
    let ids: [&[u8]; 6] = [
        b"garbage",
        b"",
        b"1:2",
        b"99999999999999999999:0:x",
        b"-",
        b"\xff\xfe",
    ];
    for id in ids {
        let headers = [b"Last-Event-ID: ".as_slice(), id, b"\r\n"].concat();
        for target in [&b"/watch/lei"[..], b"/watch?key=lei"] {
            let response = raw(
                stack.gateway.api,
                &request("GET", target, &headers, b""),
                true,
            )
            .await
            .expect("a response");
            assert_eq!(
                response.status, 200,
                "Last-Event-ID {id:?}: {}",
                response.head
            );
            assert!(
                response.head.contains("text/event-stream"),
                "{}",
                response.head
            );
        }
    }
    assert_no_5xx_counted(&stack);
}

#[tokio::test]
async fn an_oversized_fencing_token_is_refused_and_does_not_drop_a_broker_connection() {
    let stack = Stack::builder().gateway(quick_gateway()).start().await;
    let api = stack.gateway.api;
    // An MQTT5 string holds at most 65,535 bytes: a longer `__ft` cannot be
    // sent, and a client library that truncates it corrupts the connection.
    let token = format!("{}:0:{}", hlc::now_ms(), "n".repeat(70_000));
    for method in ["PUT", "DELETE"] {
        let header = format!("Fencing-Token: {token}\r\n");
        let response = raw(
            api,
            &request(method, b"/keys/k", header.as_bytes(), b""),
            false,
        )
        .await
        .expect("a response");
        // The 64 KiB head limit refuses it before the handler's own check
        // (which stays, for a larger limit).
        assert_eq!(response.status, 431, "{method}: {}", response.head);
        // Within the head limit, the handler refuses anything over 1 KiB.
        let header = format!(
            "Fencing-Token: {}:0:{}\r\n",
            hlc::now_ms(),
            "n".repeat(2_000)
        );
        let response = raw(
            api,
            &request(method, b"/keys/k", header.as_bytes(), b""),
            false,
        )
        .await
        .expect("a response");
        assert_eq!(response.status, 400, "{method}: {}", response.head);
        assert_eq!(response.problem_type(), "/problems/invalid-fencing-token");
    }
    // Give a broken connection time to show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        stack.gateway.metrics.reconnects.get(),
        0,
        "no pool member lost its connection"
    );
    assert_still_serving(&stack).await;
}

#[tokio::test]
async fn a_key_too_long_for_a_notification_topic_keeps_the_emulator_serving() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut watcher = RawClient::connect(&broker, "hostile-watch").await;
    let mut other = RawClient::connect(&broker, "hostile-other").await;
    // Its notification topic would be over 65,535 bytes (hex doubles it).
    let key = vec![b'k'; 40_000];
    let keynotify = watcher
        .request(&encode_array(&[b"KEYNOTIFY", &key]), &[])
        .await;
    let set = encode_array(&[b"SET", &key, b"v"]);
    let reply = watcher.request(&set, &[]).await;
    assert_eq!(
        &reply.payload[..],
        b"+OK\r\n",
        "KEYNOTIFY said {:?}",
        String::from_utf8_lossy(&keynotify.payload)
    );
    // Others are still answered.
    let reply = other
        .request(&encode_array(&[b"GET", b"missing"]), &[])
        .await;
    assert_eq!(&reply.payload[..], b"$-1\r\n");
    assert!(
        watcher
            .next_notification(Duration::from_millis(300))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_flood_of_garbage_from_one_client_does_not_starve_another() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut flooder = RawClient::connect(&broker, "hostile-flood").await;
    let mut other = RawClient::connect(&broker, "hostile-patient").await;
    // Fire and forget: junk of every size, declared lengths far beyond the
    // payload, and a megabyte of zeros.
    let flood = async {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for i in 0..1_500u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let junk = match i % 4 {
                0 => seed.to_le_bytes().repeat(1 + (i as usize % 9)),
                1 => format!("*3\r\n$3\r\nSET\r\n${seed}\r\nk\r\n").into_bytes(),
                2 => format!("*{seed}\r\n").into_bytes(),
                _ => encode_array(&[b"GET", &seed.to_le_bytes()]),
            };
            flooder.send(&junk, &[]).await;
        }
        flooder.send(&vec![0u8; 1 << 20], &[]).await;
    };
    let patient = async {
        let mut answered = 0;
        for i in 0..50u32 {
            let key = format!("patient-{i}");
            let reply = other
                .request(&encode_array(&[b"SET", key.as_bytes(), b"v"]), &[])
                .await;
            assert_eq!(&reply.payload[..], b"+OK\r\n");
            answered += 1;
        }
        answered
    };
    let ((), answered) = tokio::join!(flood, patient);
    assert_eq!(answered, 50);
    // Every piece of junk got its answer: an error, or `$-1` for the GETs.
    for i in 0..1_501 {
        let reply = flooder
            .next_reply(WAIT)
            .await
            .unwrap_or_else(|| panic!("only {i} of 1,501 answered"));
        assert!(
            reply.payload.starts_with(b"-ERR ") || &reply.payload[..] == b"$-1\r\n",
            "{:?}",
            String::from_utf8_lossy(&reply.payload)
        );
    }
}

#[tokio::test]
async fn malformed_envelope_values_get_the_services_errors() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "hostile-envelope").await;
    let set = encode_array(&[b"SET", b"k", b"v"]);
    let far = Hlc::new(hlc::now_ms() + 120_000, "x").to_string();
    let long_node = format!("{}:0:{}", hlc::now_ms(), "n".repeat(60_000));
    for (name, value, expected) in [
        (property::TIMESTAMP, "", "malformed timestamp"),
        (property::TIMESTAMP, "1:2", "malformed timestamp"),
        (
            property::TIMESTAMP,
            "99999999999999999999999:0:x",
            "malformed timestamp",
        ),
        (
            property::TIMESTAMP,
            far.as_str(),
            "the request timestamp is too far in the future",
        ),
        (property::FENCING_TOKEN, "-1:0:x", "malformed timestamp"),
        (
            property::FENCING_TOKEN,
            far.as_str(),
            "the request fencing token timestamp is too far",
        ),
        (property::FENCING_TOKEN, long_node.as_str(), "+OK"),
    ] {
        let mut properties = client.envelope(&[]);
        properties.user_properties.retain(|(n, _)| n != name);
        properties
            .user_properties
            .push((name.to_owned(), value.to_owned()));
        let correlation = properties.correlation_data.clone().unwrap();
        client.publish(&set, properties, QoS::AtLeastOnce).await;
        let reply = client.reply_to(&correlation, WAIT).await.expect("a reply");
        let text = String::from_utf8_lossy(&reply.payload).into_owned();
        assert!(
            text.starts_with(expected) || text.starts_with(&format!("-ERR {expected}")),
            "{name}={:.40}: {text}",
            value
        );
        assert_eq!(user_property(&reply, property::STATUS), Some("200"));
    }
}
