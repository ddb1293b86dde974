//! `/watch`: key changes as Server-Sent Events, over the real stack.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use statestore_gateway::protocol::{Hlc, Request, SetOptions, hlc};
use statestore_gateway::watch::{WatchSettings, WatchedValue};

use crate::support::emulator::RawClient;
use crate::support::gateway::{GatewayOptions, Stack, encode};
use crate::support::scripted_store::{Script, Scripted};
use crate::support::sse;

fn options(watch: WatchSettings) -> GatewayOptions {
    GatewayOptions {
        watch,
        ..GatewayOptions::default()
    }
}

async fn put(stack: &Stack, key: &str, value: &str) -> String {
    let response = stack
        .gateway
        .http
        .put(stack.gateway.url(&format!("/keys/{key}")))
        .body(value.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let etag = response.headers()["etag"].to_str().unwrap();
    etag.trim_matches('"').to_owned()
}

async fn delete(stack: &Stack, key: &str) {
    let response = stack
        .gateway
        .http
        .delete(stack.gateway.url(&format!("/keys/{key}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
}

async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sync_first_then_set_and_delete_with_versions() {
    let stack = Stack::start().await;
    let v1 = put(&stack, "greeting", "hello").await;
    let mut stream = sse::open(
        &stack.gateway.http,
        &stack.gateway.url("/watch/greeting"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(stream.headers["content-type"], "text/event-stream");
    assert_eq!(stream.headers["cache-control"], "no-store");
    assert_eq!(stream.headers["x-accel-buffering"], "no");

    let sync = stream.expect("sync").await;
    assert_eq!(stream.retries.len(), 1, "retry: once at the start");
    assert_eq!(sync.id.as_deref(), Some(v1.as_str()));
    assert_eq!(sync.data["key"], "greeting");
    assert_eq!(sync.data["value"], "hello");
    assert_eq!(sync.data["value_base64"], "aGVsbG8=");
    assert_eq!(sync.data["exists"], true);
    assert_eq!(sync.data["resync"], false);
    assert_eq!(sync.data["version"], v1.as_str());

    let v2 = put(&stack, "greeting", "bonjour").await;
    let set = stream.expect("set").await;
    assert_eq!(set.data["value"], "bonjour");
    assert_eq!(set.id.as_deref(), Some(v2.as_str()));
    assert!(v2 > v1, "versions grow: {v2} > {v1}");

    delete(&stack, "greeting").await;
    let deleted = stream.expect("delete").await;
    assert_eq!(deleted.data["op"], "delete");
    assert_eq!(deleted.data["value"], serde_json::Value::Null);
    let deleted_version = deleted.id.expect("a delete carries its version");
    assert!(deleted_version > v2);
}

#[tokio::test]
async fn absent_key_syncs_as_absent_and_binary_values_come_as_base64() {
    let stack = Stack::start().await;
    let key = encode(&[0xff, b'/', 0]);
    let mut stream = sse::open(
        &stack.gateway.http,
        &stack.gateway.url(&format!("/watch/{key}")),
        None,
    )
    .await
    .unwrap();
    let sync = stream.expect("sync").await;
    assert_eq!(sync.data["exists"], false);
    assert_eq!(sync.data["key"], serde_json::Value::Null);
    assert_eq!(sync.data["key_base64"], "/y8A");
    assert_eq!(sync.id, None);

    let response = stack
        .gateway
        .http
        .put(stack.gateway.url(&format!("/keys/{key}")))
        .body(vec![0u8, 159, 146, 150])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let set = stream.expect("set").await;
    assert_eq!(set.data["value"], serde_json::Value::Null);
    assert_eq!(set.data["value_base64"], "AJ+Slg==");
}

#[tokio::test]
async fn one_stream_watches_several_keys() {
    let stack = Stack::start().await;
    put(&stack, "a", "1").await;
    let url = stack.gateway.url("/watch?key=a&key=b+c&key=a");
    let mut stream = sse::open(&stack.gateway.http, &url, None).await.unwrap();
    let first = stream.expect("sync").await;
    let second = stream.expect("sync").await;
    let mut keys = [first.data["key"].clone(), second.data["key"].clone()];
    keys.sort_by_key(|key| key.to_string());
    assert_eq!(keys, [serde_json::json!("a"), serde_json::json!("b c")]);
    put(&stack, "b%20c", "2").await;
    let set = stream.expect("set").await;
    assert_eq!(set.data["key"], "b c");
    put(&stack, "a", "3").await;
    let set = stream.expect("set").await;
    assert_eq!(set.data["key"], "a");
    assert_eq!(set.data["value"], "3");
}

#[tokio::test]
async fn watchers_of_a_key_share_one_registration_released_by_the_last() {
    let stack = Stack::start().await;
    let hub = stack.gateway.server().state().hub.clone();
    let emulator = stack.emulator.as_ref().unwrap().handle();
    let url = stack.gateway.url("/watch/shared");
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut stream = sse::open(&stack.gateway.http, &url, None).await.unwrap();
        stream.expect("sync").await;
        streams.push(stream);
    }
    assert_eq!(hub.watchers(), 3);
    assert_eq!(hub.watched_keys(), 1);
    assert_eq!(
        emulator.registrations(),
        1,
        "one KEYNOTIFY for three watchers"
    );

    put(&stack, "shared", "x").await;
    for stream in &mut streams {
        assert_eq!(stream.expect("set").await.data["value"], "x");
    }

    drop(streams);
    wait_until("the hub forgets the key", || {
        hub.watchers() == 0 && hub.watched_keys() == 0
    })
    .await;
    wait_until("KEYNOTIFY STOP reaches the store", || {
        emulator.registrations() == 0
    })
    .await;

    // And a new watcher registers again.
    let mut stream = sse::open(&stack.gateway.http, &url, None).await.unwrap();
    assert_eq!(stream.expect("sync").await.data["value"], "x");
    put(&stack, "shared", "y").await;
    assert_eq!(stream.expect("set").await.data["value"], "y");
}

#[tokio::test]
async fn over_max_watched_keys_a_new_key_is_429_but_a_followed_one_is_not() {
    let stack = Stack::builder()
        .gateway(options(WatchSettings {
            max_watched_keys: 1,
            ..WatchSettings::default()
        }))
        .start()
        .await;
    let client = &stack.gateway.http;
    let mut first = sse::open(client, &stack.gateway.url("/watch/a"), None)
        .await
        .unwrap();
    first.expect("sync").await;
    let (status, headers, body) = sse::open(client, &stack.gateway.url("/watch/b"), None)
        .await
        .unwrap_err();
    assert_eq!(status, 429);
    assert!(headers.contains_key("retry-after"));
    assert!(body.contains("/problems/too-many-watched-keys"), "{body}");
    // A second watcher of the key already followed costs no new key.
    let mut second = sse::open(client, &stack.gateway.url("/watch/a"), None)
        .await
        .unwrap();
    second.expect("sync").await;
}

#[tokio::test]
async fn last_event_id_skips_the_sync_unless_the_key_changed() {
    let stack = Stack::start().await;
    let version = put(&stack, "resume", "one").await;
    let url = stack.gateway.url("/watch/resume");
    let mut stream = sse::open(&stack.gateway.http, &url, Some(&version))
        .await
        .unwrap();
    stream.expect_silence(Duration::from_millis(300)).await;
    let newer = put(&stack, "resume", "two").await;
    assert_eq!(
        stream.expect("set").await.id.as_deref(),
        Some(newer.as_str())
    );
    drop(stream);

    // Reconnecting with an older id: the key changed meanwhile, so a sync.
    let mut stream = sse::open(&stack.gateway.http, &url, Some(&version))
        .await
        .unwrap();
    let sync = stream.expect("sync").await;
    assert_eq!(sync.data["value"], "two");
}

#[tokio::test]
async fn limits_answer_429_with_retry_after_before_streaming() {
    let stack = Stack::builder()
        .gateway(options(WatchSettings {
            max_watchers: 1,
            max_keys_per_stream: 2,
            ..WatchSettings::default()
        }))
        .start()
        .await;
    let client = &stack.gateway.http;
    let (status, headers, body) =
        sse::open(client, &stack.gateway.url("/watch?key=a&key=b&key=c"), None)
            .await
            .unwrap_err();
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "1");
    assert!(body.contains("at most 2 keys"), "{body}");

    let mut first = sse::open(client, &stack.gateway.url("/watch/a"), None)
        .await
        .unwrap();
    first.expect("sync").await;
    let (status, headers, body) = sse::open(client, &stack.gateway.url("/watch/b"), None)
        .await
        .unwrap_err();
    assert_eq!(status, 429);
    assert!(headers.contains_key("retry-after"));
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(body.contains("too-many-watchers"), "{body}");

    drop(first);
    let hub = stack.gateway.server().state().hub.clone();
    wait_until("the watcher leaves", || hub.watchers() == 0).await;
    let mut again = sse::open(client, &stack.gateway.url("/watch/b"), None)
        .await
        .unwrap();
    again.expect("sync").await;
}

#[tokio::test]
async fn bad_watch_requests_are_400() {
    let stack = Stack::start().await;
    let client = &stack.gateway.http;
    for path in [
        "/watch",
        "/watch?key=",
        "/watch?nope=1",
        "/watch/%zz",
        "/watch/",
        "/watch/config?tll=30s",
        "/watch/config?key=other",
    ] {
        let (status, _, body) = sse::open(client, &stack.gateway.url(path), None)
            .await
            .unwrap_err();
        assert_eq!(status, 400, "{path}: {body}");
    }
    // The token parameter is the one a single-key stream takes.
    let mut stream = sse::open(
        client,
        &stack.gateway.url("/watch/config?access_token=unused"),
        None,
    )
    .await
    .unwrap();
    stream.expect("sync").await;
}

/// A key named twice on one stream is one key: it counts once against
/// `--max-keys-per-watch`, and gets one `sync`.
#[tokio::test]
async fn a_key_repeated_in_the_query_is_watched_once() {
    let stack = Stack::builder()
        .gateway(options(WatchSettings {
            max_keys_per_stream: 2,
            ..WatchSettings::default()
        }))
        .start()
        .await;
    let query = vec!["key=a"; 500].join("&");
    let mut stream = sse::open(
        &stack.gateway.http,
        &stack.gateway.url(&format!("/watch?{query}&key=b")),
        None,
    )
    .await
    .unwrap();
    let mut synced = vec![
        stream.expect("sync").await.data["key"].clone(),
        stream.expect("sync").await.data["key"].clone(),
    ];
    synced.sort_by_key(ToString::to_string);
    assert_eq!(synced, ["a", "b"]);
    stream.expect_silence(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn watch_comes_back_after_a_broker_restart() {
    let mut stack = Stack::start().await;
    put(&stack, "durable", "before").await;
    let mut stream = sse::open(
        &stack.gateway.http,
        &stack.gateway.url("/watch/durable"),
        None,
    )
    .await
    .unwrap();
    stream.expect("sync").await;

    stack.broker.restart().await;
    stack
        .gateway
        .wait_readyz(200, Duration::from_secs(10))
        .await;
    // The store is reachable again once a PUT goes through.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let version = loop {
        let response = stack
            .gateway
            .http
            .put(stack.gateway.url("/keys/durable"))
            .body("after")
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            break response.headers()["etag"]
                .to_str()
                .unwrap()
                .trim_matches('"')
                .to_owned();
        }
        assert!(tokio::time::Instant::now() < deadline, "PUT works again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The change arrives either as a `set` (registered again first) or as
    // a resync `sync` (changed while the registration was being restored).
    // While the store is still coming back the stream may say so with
    // `error` events; they are not the change.
    let event = loop {
        let event = stream
            .next(Duration::from_secs(10))
            .await
            .expect("an event");
        if event.event != "error" {
            break event;
        }
    };
    assert!(event.event == "set" || event.event == "sync", "{event:?}");
    assert_eq!(event.data["value"], "after");
    assert_eq!(event.id.as_deref(), Some(version.as_str()));
    // And later changes keep coming.
    put(&stack, "durable", "later").await;
    assert_eq!(stream.expect("set").await.data["value"], "later");
}

#[tokio::test]
async fn a_store_that_lost_its_registrations_is_resynced() {
    let mut stack = Stack::builder()
        .gateway(options(WatchSettings {
            resync_interval: Some(Duration::from_millis(300)),
            ..WatchSettings::default()
        }))
        .start()
        .await;
    put(&stack, "volatile", "v1").await;
    let mut stream = sse::open(
        &stack.gateway.http,
        &stack.gateway.url("/watch/volatile"),
        None,
    )
    .await
    .unwrap();
    stream.expect("sync").await;

    // A restarted in-memory emulator forgets the key and the registration,
    // and the gateway's connection never dropped.
    stack.restart_emulator().await;
    let resync = stream.expect("sync").await;
    assert_eq!(resync.data["resync"], true);
    assert_eq!(resync.data["exists"], false);

    // The registration is back: a change arrives as a set.
    put(&stack, "volatile", "v2").await;
    let set = stream.expect("set").await;
    assert_eq!(set.data["value"], "v2");
    let metrics = stack
        .gateway
        .http
        .get(stack.gateway.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("statestore_gateway_watch_resyncs_total 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_slow_watcher_skips_to_a_sync_of_the_latest_state() {
    let stack = Stack::builder()
        .gateway(options(WatchSettings {
            buffer: 4,
            ..WatchSettings::default()
        }))
        .start()
        .await;
    let mut slow = sse::open(&stack.gateway.http, &stack.gateway.url("/watch/busy"), None)
        .await
        .unwrap();
    slow.expect("sync").await;
    // Not reading `slow` while 300 changes of 64 KiB happen; TCP buffers hold a few
    // events, the per-key buffer holds 4, the rest are skipped.
    let mut last = String::new();
    for i in 0..300 {
        last = put(
            &stack,
            "busy",
            &format!("value-{i}-{}", "x".repeat(64 * 1024)),
        )
        .await;
    }
    let mut saw_lagged = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let event = slow
            .next(Duration::from_secs(5))
            .await
            .expect("events keep coming");
        if event.data["lagged"] == true {
            saw_lagged = true;
        }
        if event.id.as_deref() == Some(last.as_str()) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
    }
    assert!(saw_lagged, "the slow watcher was told it skipped events");
}

#[tokio::test]
async fn multi_key_streams_always_start_with_a_sync_per_key() {
    let stack = Stack::start().await;
    put(&stack, "left", "l").await;
    let newest = put(&stack, "right", "r").await;
    // One id cannot tell what a multi-key stream saw of each key.
    let url = stack.gateway.url("/watch?key=left&key=right");
    let mut stream = sse::open(&stack.gateway.http, &url, Some(&newest))
        .await
        .unwrap();
    stream.expect("sync").await;
    stream.expect("sync").await;
}

#[tokio::test]
async fn watch_without_a_broker_is_503_at_once() {
    let mut stack = Stack::start().await;
    stack.broker.kill();
    stack
        .gateway
        .wait_readyz(503, Duration::from_secs(10))
        .await;
    let started = std::time::Instant::now();
    let (status, headers, _) = sse::open(&stack.gateway.http, &stack.gateway.url("/watch/k"), None)
        .await
        .unwrap_err();
    assert_eq!(status, 503);
    assert!(headers.contains_key("retry-after"));
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// A watch that opens its connection is written by the gateway itself
/// (not hyper): check the wire form a browser or proxy sees.
#[tokio::test]
async fn a_watch_opening_its_connection_is_chunked_and_closes_after() {
    let stack = Stack::start().await;
    let hub = stack.gateway.server().state().hub.clone();
    let v1 = put(&stack, "wire", "one").await;
    let mut raw = sse::open_raw(
        stack.gateway.api,
        &["GET /watch/wire HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n"],
    )
    .await;
    assert_eq!(raw.status, 200, "{}", raw.head);
    assert!(raw.head.starts_with("HTTP/1.1 200 OK\n"), "{}", raw.head);
    let headers = &raw.stream.headers;
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(headers["transfer-encoding"], "chunked");
    assert_eq!(headers["connection"], "close");
    assert!(headers.contains_key("date"));
    assert!(!headers.contains_key("content-length"));

    let sync = raw.stream.expect("sync").await;
    assert_eq!(raw.stream.retries, [2000]);
    assert_eq!(sync.id.as_deref(), Some(v1.as_str()));
    let v2 = put(&stack, "wire", "two").await;
    let set = raw.stream.expect("set").await;
    assert_eq!(
        (set.id.as_deref(), &set.data["value"]),
        (Some(v2.as_str()), &"two".into())
    );

    // The gateway notices the client leaving without waiting for a write.
    assert_eq!(hub.watchers(), 1);
    drop(raw);
    wait_until("the watcher leaves", || hub.watchers() == 0).await;
}

#[tokio::test]
async fn an_http_1_0_watch_is_delimited_by_the_close() {
    let stack = Stack::start().await;
    put(&stack, "old", "client").await;
    let mut raw = sse::open_raw(stack.gateway.api, &["GET /watch/old HTTP/1.0\r\n\r\n"]).await;
    assert_eq!(raw.status, 200, "{}", raw.head);
    assert!(!raw.stream.headers.contains_key("transfer-encoding"));
    assert_eq!(raw.stream.expect("sync").await.data["value"], "client");
    put(&stack, "old", "still").await;
    assert_eq!(raw.stream.expect("set").await.data["value"], "still");
}

#[tokio::test]
async fn a_refused_watch_on_a_new_connection_gets_the_same_problem_and_a_length() {
    let options = GatewayOptions {
        cors_allow_origins: vec!["*".into()],
        ..GatewayOptions::default()
    };
    let stack = Stack::builder().gateway(options).start().await;
    let mut raw = sse::open_raw(
        stack.gateway.api,
        &["GET /watch?colour=red HTTP/1.1\r\nHost: x\r\nOrigin: http://dash.example\r\n\r\n"],
    )
    .await;
    assert_eq!(raw.status, 400, "{}", raw.head);
    let headers = raw.stream.headers.clone();
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(headers["connection"], "close");
    // CORS comes from the same router as every other answer.
    assert_eq!(headers["access-control-allow-origin"], "*");
    let body = raw.stream.text().await;
    assert_eq!(headers["content-length"], body.len().to_string().as_str());
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("colour"),
        "{problem}"
    );
}

/// After another request on a keep-alive connection, hyper serves the
/// watch: same events, hyper's framing.
#[tokio::test]
async fn a_watch_after_another_request_on_the_connection_also_streams() {
    let stack = Stack::start().await;
    put(&stack, "reuse", "one").await;
    let mut raw = sse::open_raw(
        stack.gateway.api,
        &[
            "GET /keys/reuse HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /watch/reuse HTTP/1.1\r\nHost: x\r\n\r\n",
        ],
    )
    .await;
    assert_eq!(raw.status, 200, "{}", raw.head);
    assert_eq!(raw.stream.headers["content-type"], "text/event-stream");
    assert!(
        !raw.stream.headers.contains_key("connection"),
        "{}",
        raw.head
    );
    assert_eq!(raw.stream.expect("sync").await.data["value"], "one");
    put(&stack, "reuse", "two").await;
    assert_eq!(raw.stream.expect("set").await.data["value"], "two");
}

/// A head that arrives in pieces, with a pipelined request behind it (which
/// is read and dropped: the stream never ends to answer it).
#[tokio::test]
async fn a_watch_head_in_pieces_with_bytes_behind_it_streams() {
    let stack = Stack::start().await;
    put(&stack, "pieces", "one").await;
    let mut tcp = tokio::net::TcpStream::connect(stack.gateway.api)
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    for piece in [
        "GE",
        "T /wat",
        "ch/pieces HTTP/1.1\r\nHo",
        "st: x\r\n",
        "\r\nGET /keys/pieces HTTP/1.1\r\n\r\n",
    ] {
        tcp.write_all(piece.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&received).contains("event: sync") {
        let n = tokio::time::timeout_at(deadline, tcp.read(&mut buffer))
            .await
            .expect("the sync within 10 s")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&received));
        received.extend_from_slice(&buffer[..n]);
    }
    let text = String::from_utf8_lossy(&received);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("\"value\":\"one\""), "{text}");
    assert_eq!(text.matches("HTTP/1.1").count(), 1, "{text}");
}

#[tokio::test]
async fn streams_end_with_their_last_chunk_at_shutdown() {
    let stack = Stack::start().await;
    put(&stack, "bye", "one").await;
    // Both ways a stream is served (on a new connection, and by hyper after
    // another request), a key's stream and a pattern's.
    let mut streams = Vec::new();
    for (first, watch) in [
        (None, "/watch/bye"),
        (Some("/keys/bye"), "/watch/bye"),
        (Some("/keys/bye"), "/watch?match=by*"),
    ] {
        let requests: Vec<String> = first
            .into_iter()
            .chain([watch])
            .map(|path| format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"))
            .collect();
        let requests: Vec<&str> = requests.iter().map(String::as_str).collect();
        let mut raw = sse::open_raw(stack.gateway.api, &requests).await;
        raw.stream.expect("sync").await;
        streams.push((watch, raw));
    }
    let Stack {
        gateway,
        broker,
        emulator,
        ..
    } = stack;
    let shutdown = tokio::spawn(gateway.shutdown());
    // Well before the grace period (5 s), whose end would cut them short.
    for (watch, mut raw) in streams {
        assert!(
            raw.stream
                .ends_with_last_chunk_within(Duration::from_secs(3))
                .await,
            "{watch} ends with its last chunk"
        );
    }
    shutdown.await.unwrap();
    drop((broker, emulator));
}

#[tokio::test]
async fn a_quiet_stream_gets_keep_alive_comments() {
    let keep_alive = Duration::from_millis(200);
    let stack = Stack::builder()
        .gateway(options(WatchSettings {
            keep_alive,
            ..WatchSettings::default()
        }))
        .start()
        .await;
    // Both ways a stream is served: on a new connection, and by hyper
    // after another request on the same connection.
    let fresh = sse::open_raw(
        stack.gateway.api,
        &["GET /watch/quiet HTTP/1.1\r\nHost: x\r\n\r\n"],
    )
    .await;
    let reused = sse::open_raw(
        stack.gateway.api,
        &[
            "GET /keys/quiet HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /watch/quiet HTTP/1.1\r\nHost: x\r\n\r\n",
        ],
    )
    .await;
    for mut raw in [fresh, reused] {
        assert_eq!(raw.status, 200, "{}", raw.head);
        raw.stream.expect("sync").await;
        // At most two periods without a write.
        raw.stream.expect_silence(keep_alive * 5).await;
        assert!(
            raw.stream.comments >= 1,
            "no keep-alive in {:?}",
            keep_alive * 5
        );
    }
}

fn resync_options() -> GatewayOptions {
    options(WatchSettings {
        resync_interval: Some(Duration::from_millis(300)),
        ..WatchSettings::default()
    })
}

fn id_of(event: &sse::SseEvent) -> Hlc {
    Hlc::parse(event.id.as_deref().expect("the event has an id")).unwrap()
}

/// A delete found only by a resync has its own id, after the SET's, so a
/// client resuming with the SET's id still learns of it.
#[tokio::test]
async fn a_delete_found_by_a_resync_has_its_own_id_and_reaches_resuming_clients() {
    let mut stack = Stack::builder().gateway(resync_options()).start().await;
    put(&stack, "gone", "v1").await;
    let url = stack.gateway.url("/watch/gone");
    let mut stream = sse::open(&stack.gateway.http, &url, None).await.unwrap();
    let first = stream.expect("sync").await;
    let set_id = id_of(&first);

    stack.restart_emulator().await;
    let resync = stream.expect("sync").await;
    assert_eq!(resync.data["exists"], false);
    assert!(id_of(&resync) > set_id, "{resync:?} after {first:?}");

    // The first stream keeps the key's state in the hub; a client that
    // saw only the SET resumes from its id and must hear of the delete.
    let set_id = first.id.clone().unwrap();
    let mut resumed = sse::open(&stack.gateway.http, &url, Some(&set_id))
        .await
        .unwrap();
    let caught_up = resumed.expect("sync").await;
    assert_eq!(caught_up.data["exists"], false, "{caught_up:?}");
}

/// After an in-memory store restart the key's versions can be lower than
/// ones the hub saw (here the first SET carried a clock 30 s ahead); the
/// hub still follows later changes.
#[tokio::test]
async fn after_a_store_restart_lower_versions_still_reach_watchers() {
    let mut stack = Stack::builder().gateway(resync_options()).start().await;
    // The gateway learns of the SET from its notification only, so its
    // own clock stays behind.
    let url = stack.gateway.url("/watch/behind");
    let mut stream = sse::open(&stack.gateway.http, &url, None).await.unwrap();
    stream.expect("sync").await;
    let mut raw = RawClient::connect(&stack.broker, "ahead").await;
    let mut properties = raw.envelope(&[]);
    let ahead = Hlc::new(hlc::now_ms() + 30_000, "ahead").to_string();
    for (name, value) in &mut properties.user_properties {
        if name == "__ts" {
            value.clone_from(&ahead);
        }
    }
    let correlation = properties.correlation_data.clone().unwrap();
    let set = Request::Set {
        key: Bytes::from_static(b"behind"),
        value: Bytes::from_static(b"ahead"),
        options: SetOptions::default(),
    };
    raw.publish(&set.encode(), properties, QoS::AtLeastOnce)
        .await;
    raw.reply_to(&correlation, Duration::from_secs(5))
        .await
        .expect("the SET is answered");
    assert_eq!(stream.expect("set").await.data["value"], "ahead");

    stack.restart_emulator().await;
    // Whatever the resync reports first, the later value must arrive.
    put(&stack, "behind", "later").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let event = stream
            .next(deadline - tokio::time::Instant::now())
            .await
            .expect("the value written after the restart reaches the watcher");
        if event.data["value"] == "later" {
            break;
        }
    }
    put(&stack, "behind", "again").await;
    let next = stream.next(Duration::from_secs(5)).await.expect("a set");
    assert_eq!(next.data["value"], "again", "{next:?}");
}

/// A KEYNOTIFY the store applied is stopped when the GET after it fails
/// (the watch is refused, so nothing else would stop it).
#[tokio::test]
async fn a_registration_whose_get_failed_is_stopped() {
    let seen: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let script: Script = {
        let seen = seen.clone();
        Arc::new(move |request: &Request, _: Option<&str>| {
            seen.lock().unwrap().push(request.verb());
            match request {
                Request::Get { .. } => Scripted::Reply(b"-ERR syntax error\r\n".to_vec()),
                _ => Scripted::Reply(b"+OK\r\n".to_vec()),
            }
        })
    };
    let stack = Stack::builder().scripted(script).start().await;
    let response = stack
        .gateway
        .http
        .get(stack.gateway.url("/watch/leaky"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    wait_until("a KEYNOTIFY STOP after the failed GET", || {
        let seen = seen.lock().unwrap();
        let registered = seen.iter().position(|verb| *verb == "KEYNOTIFY");
        let stopped = seen.iter().rposition(|verb| *verb == "KEYNOTIFY STOP");
        matches!((registered, stopped), (Some(r), Some(s)) if s > r)
    })
    .await;
}

/// When many watched keys are released at once, their KEYNOTIFY STOPs go
/// out together, and a new watch is not stuck behind them. The store here
/// answers every STOP after 50 ms (concurrently, as a store does): 1,000
/// STOPs one after the other would take 50 s, far beyond the new watch's
/// 3 s registration timeout.
#[tokio::test]
async fn a_new_watch_is_not_stuck_behind_the_stops_of_many_released_keys() {
    let script: Script = Arc::new(|request: &Request, _: Option<&str>| match request {
        Request::KeyNotify { stop: true, .. } => {
            Scripted::ReplyAfter(Duration::from_millis(50), b"+OK\r\n".to_vec())
        }
        Request::Get { .. } => Scripted::Reply(b"$-1\r\n".to_vec()),
        _ => Scripted::Reply(b"+OK\r\n".to_vec()),
    });
    let stack = Stack::builder()
        .scripted(script)
        .gateway(GatewayOptions {
            // The registration timeout follows it.
            request_timeout: Duration::from_secs(3),
            ..options(WatchSettings {
                max_keys_per_stream: 1_000,
                resync_interval: None,
                ..WatchSettings::default()
            })
        })
        .start()
        .await;
    let hub = stack.gateway.server().state().hub.clone();
    let keys: Vec<Bytes> = (0..1_000)
        .map(|i| Bytes::from(format!("released/{i:04}")))
        .collect();
    let watcher = hub.watch(keys, None).await.expect("1,000 keys registered");
    assert_eq!(hub.watched_keys(), 1_000);
    drop(watcher);
    // Let the reconciler start on the STOPs.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let fresh = hub
        .watch(vec![Bytes::from_static(b"fresh")], None)
        .await
        .expect("a new watch registers while the STOPs are out");
    drop(fresh);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// What a key keeps for watchers that fall behind is bounded in bytes, not
/// only in events. With a 64 KiB budget, ten 32 KiB values are never all
/// held for a watcher that does not read: it skips to a sync of the latest
/// state instead.
#[tokio::test]
async fn a_key_keeps_a_bounded_number_of_bytes_for_a_watcher_that_does_not_read() {
    let stack = Stack::builder()
        .gateway(options(WatchSettings {
            buffer_bytes: 64 * 1024,
            ..WatchSettings::default()
        }))
        .start()
        .await;
    let hub = stack.gateway.server().state().hub.clone();
    let key = || vec![Bytes::from_static(b"big")];
    let mut idle = hub.watch(key(), None).await.unwrap();
    let mut reader = hub.watch(key(), None).await.unwrap();
    let last = format!("{:032768}", 10);
    for i in 1..=10 {
        put(&stack, "big", &format!("{i:032768}")).await;
    }
    // The active reader sees the last value (as a set, or a sync if even it
    // fell behind), so the hub has applied every change.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout_at(deadline, reader.next())
            .await
            .expect("the last value within 10 s")
            .unwrap();
        if event.value.as_ref().and_then(WatchedValue::bytes) == Some(&Bytes::from(last.clone())) {
            break;
        }
    }
    let mut seen = Vec::new();
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(300), idle.next()).await
    {
        seen.push(event);
    }
    let newest = seen.last().expect("events for the idle watcher");
    assert_eq!(
        newest.value.as_ref().and_then(WatchedValue::bytes),
        Some(&Bytes::from(last.clone()))
    );
    assert!(
        seen.len() <= 3,
        "{} events held for a watcher that did not read: {:?}",
        seen.len(),
        seen.iter().map(|event| event.kind).collect::<Vec<_>>()
    );
    assert!(
        seen.iter().any(|event| matches!(
            event.kind,
            statestore_gateway::watch::EventKind::Sync { lagged: true, .. }
        )),
        "{:?}",
        seen.iter().map(|event| event.kind).collect::<Vec<_>>()
    );
}
