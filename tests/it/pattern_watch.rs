//! `/watch?match=<glob>`: following a key space over the real stack
//! (mosquitto, the emulator, the gateway), with the official client as a
//! writer the gateway does not see.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use azure_iot_operations_services::state_store::SetOptions;
use statestore_gateway::watch::WatchSettings;

use crate::support::gateway::{GatewayOptions, Stack};
use crate::support::sdk::SdkClient;
use crate::support::sse::{self, SseEvent, SseStream};

/// A stack whose patterns are rescanned every `rescan`, with `limit` keys
/// per pattern.
async fn stack(rescan: Duration, limit: usize) -> Stack {
    stack_with(WatchSettings {
        rescan_interval: rescan,
        max_keys_per_pattern: limit,
        ..WatchSettings::default()
    })
    .await
}

async fn stack_with(watch: WatchSettings) -> Stack {
    Stack::builder()
        .gateway(GatewayOptions {
            watch,
            ..GatewayOptions::default()
        })
        .start()
        .await
}

async fn put(stack: &Stack, key: &str, value: &str) {
    let response = stack.gateway.put(key.as_bytes(), value.to_owned()).await;
    assert_eq!(response.status(), 200, "PUT {key}");
}

async fn sdk_set(sdk: &SdkClient, key: &str, value: &str) {
    let set = sdk
        .client
        .set(
            key.as_bytes().to_vec(),
            value.as_bytes().to_vec(),
            Duration::from_secs(5),
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set.response, "SDK SET {key}");
}

async fn sdk_del(sdk: &SdkClient, key: &str) {
    let deleted = sdk
        .client
        .del(key.as_bytes().to_vec(), None, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(deleted.response, 1, "SDK DEL {key}");
}

async fn open(stack: &Stack, query: &str) -> SseStream {
    sse::open(
        &stack.gateway.http,
        &stack.gateway.url(&format!("/watch?{query}")),
        None,
    )
    .await
    .unwrap_or_else(|(status, _, body)| panic!("{query}: {status} {body}"))
}

/// The initial picture: every `sync` up to the `listed` of each of
/// `patterns`, as key -> value.
async fn initial(
    stream: &mut SseStream,
    patterns: usize,
) -> (BTreeMap<String, String>, Vec<SseEvent>) {
    let mut synced = BTreeMap::new();
    let mut listed = Vec::new();
    while listed.len() < patterns {
        let event = stream
            .next(Duration::from_secs(10))
            .await
            .expect("the initial listing ends");
        match event.event.as_str() {
            "sync" => {
                assert_eq!(event.data["exists"], true, "{event:?}");
                let key = event.data["key"].as_str().unwrap().to_owned();
                let value = event.data["value"].as_str().unwrap().to_owned();
                assert!(synced.insert(key, value).is_none(), "one sync per key");
            }
            "listed" => listed.push(event),
            _ => panic!("only syncs before listed: {event:?}"),
        }
    }
    (synced, listed)
}

fn metric(stack: &Stack, name: &str) -> f64 {
    stack
        .gateway
        .metric(name)
        .unwrap_or_else(|| panic!("no {name} in\n{}", stack.gateway.metrics.render()))
}

async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_pattern_syncs_its_keys_then_lists_then_follows_keys_written_here_at_once() {
    // Rescans far apart: what arrives came from the gateway's own writes.
    let stack = stack(Duration::from_secs(600), 100).await;
    put(&stack, "sensor/1", "20").await;
    put(&stack, "sensor/2", "21").await;
    put(&stack, "sensors", "outside").await;
    put(&stack, "other/1", "outside").await;

    let mut stream = open(&stack, "match=sensor%2F*").await;
    let (synced, listed) = initial(&mut stream, 1).await;
    assert_eq!(
        synced,
        BTreeMap::from([
            ("sensor/1".to_owned(), "20".to_owned()),
            ("sensor/2".to_owned(), "21".to_owned())
        ])
    );
    assert_eq!(
        listed[0].data,
        serde_json::json!({"match": "sensor/*", "keys": 2})
    );
    assert_eq!(listed[0].id, None);

    // A key created through the gateway: a sync with its value, at once.
    let written = Instant::now();
    put(&stack, "sensor/3", "22").await;
    let sync = stream.expect("sync").await;
    assert!(
        written.elapsed() < Duration::from_secs(2),
        "{:?}",
        written.elapsed()
    );
    assert_eq!(sync.data["key"], "sensor/3");
    assert_eq!(sync.data["value"], "22");
    assert_eq!(sync.data["exists"], true);
    assert_eq!(sync.id.as_deref(), sync.data["version"].as_str());

    // Changes of followed keys, as on a key watch; nothing outside.
    put(&stack, "other/2", "outside").await;
    put(&stack, "sensors", "still outside").await;
    put(&stack, "sensor/1", "25").await;
    let set = stream.expect("set").await;
    assert_eq!(
        (&set.data["key"], &set.data["value"]),
        (&"sensor/1".into(), &"25".into())
    );
    let deleted = stack.gateway.delete(b"sensor/2").await;
    assert_eq!(deleted.status(), 204);
    let delete = stream.expect("delete").await;
    assert_eq!(delete.data["key"], "sensor/2");
    stream.expect_silence(Duration::from_millis(300)).await;

    // A lock whose name matches is a key created here too.
    let lock = stack
        .gateway
        .http
        .put(stack.gateway.url("/locks/sensor%2Flock?holder=me&ttl=30s"))
        .send()
        .await
        .unwrap();
    assert_eq!(lock.status(), 200);
    let sync = stream.expect("sync").await;
    assert_eq!(
        (&sync.data["key"], &sync.data["value"]),
        (&"sensor/lock".into(), &"me".into())
    );
}

#[tokio::test]
async fn keys_the_sdk_writes_are_found_by_the_next_rescan_and_deleted_ones_stop_being_followed() {
    let rescan = Duration::from_millis(500);
    let stack = stack(rescan, 100).await;
    let hub = stack.gateway.server().state().hub.clone();
    let emulator = stack.emulator.as_ref().unwrap().handle();
    let sdk = SdkClient::connect(stack.broker.port(), "sdk-pattern-writer");
    sdk_set(&sdk, "room/1", "a").await;

    let mut stream = open(&stack, "match=room/*").await;
    let (synced, _) = initial(&mut stream, 1).await;
    assert_eq!(synced.keys().collect::<Vec<_>>(), ["room/1"]);

    // Created by a client the gateway does not see: within a rescan.
    let written = Instant::now();
    sdk_set(&sdk, "room/2", "b").await;
    let sync = stream.expect("sync").await;
    let took = written.elapsed();
    assert_eq!(
        (&sync.data["key"], &sync.data["value"]),
        (&"room/2".into(), &"b".into())
    );
    assert!(
        took <= rescan + Duration::from_millis(400),
        "found after {took:?}"
    );
    assert_eq!(hub.watched_keys(), 2);
    assert_eq!(
        emulator.registrations(),
        2,
        "one KEYNOTIFY per followed key"
    );

    // Deleted: the delete event, then the next rescan lets the key go.
    sdk_del(&sdk, "room/2").await;
    assert_eq!(stream.expect("delete").await.data["key"], "room/2");
    wait_until("the deleted key is no longer followed", || {
        hub.watched_keys() == 1 && emulator.registrations() == 1
    })
    .await;
    assert_eq!(metric(&stack, "statestore_gateway_watch_pattern_keys"), 1.0);

    // Created again: announced afresh with a sync, never a bare set.
    sdk_set(&sdk, "room/2", "c").await;
    let sync = stream.expect("sync").await;
    assert_eq!(
        (&sync.data["key"], &sync.data["value"]),
        (&"room/2".into(), &"c".into())
    );
    sdk_set(&sdk, "room/2", "d").await;
    assert_eq!(stream.expect("set").await.data["value"], "d");
    sdk_set(&sdk, "hall/1", "outside").await;
    stream.expect_silence(rescan * 2).await;
    sdk.close().await;
}

#[tokio::test]
async fn keys_deleted_while_their_notifications_were_lost_get_a_delete_by_the_next_rescan() {
    let rescan = Duration::from_millis(500);
    let keys: Vec<String> = (0..50).map(|n| format!("lost/{n}")).collect();
    let mut stack = Stack::builder()
        .gateway(GatewayOptions {
            watch: WatchSettings {
                rescan_interval: rescan,
                // Only the rescan may notice.
                resync_interval: None,
                ..WatchSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let hub = stack.gateway.server().state().hub.clone();
    for key in &keys {
        put(&stack, key, "1").await;
    }
    let mut streams = vec![
        open(&stack, "match=lost/*").await,
        open(&stack, "match=lost/*").await,
    ];
    for stream in &mut streams {
        let (synced, _) = initial(stream, 1).await;
        assert_eq!(synced.len(), keys.len());
    }

    // The store comes back empty: every key is gone and no notification
    // of it was ever sent (the same as a broker dropping a burst of them).
    stack.restart_emulator().await;
    let restarted = Instant::now();
    for stream in &mut streams {
        let mut pending: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
        while !pending.is_empty() {
            let Some(event) = stream.next(rescan * 2 + Duration::from_secs(2)).await else {
                panic!(
                    "{} keys got no delete within {:?}, e.g. {:?}",
                    pending.len(),
                    restarted.elapsed(),
                    pending.first()
                );
            };
            assert_eq!(event.event, "delete", "{event:?}");
            assert!(
                pending.remove(event.data["key"].as_str().unwrap()),
                "one delete per key: {event:?}"
            );
        }
    }
    wait_until("deleted keys are no longer followed", || {
        hub.watched_keys() == 0
    })
    .await;
    assert_eq!(metric(&stack, "statestore_gateway_watch_pattern_keys"), 0.0);

    // Created again: announced afresh.
    put(&stack, "lost/0", "2").await;
    for stream in &mut streams {
        let sync = stream.expect("sync").await;
        assert_eq!(
            (&sync.data["key"], &sync.data["value"]),
            (&"lost/0".into(), &"2".into())
        );
    }
}

#[tokio::test]
async fn streams_on_one_pattern_share_one_rescan_loop_and_keys_share_one_keynotify() {
    let rescan = Duration::from_millis(200);
    let stack = stack(rescan, 100).await;
    let hub = stack.gateway.server().state().hub.clone();
    let emulator = stack.emulator.as_ref().unwrap().handle();
    for n in 0..5 {
        put(&stack, &format!("line/{n}"), "0").await;
    }
    let mut streams = Vec::new();
    for _ in 0..20 {
        let mut stream = open(&stack, "match=line/*").await;
        assert_eq!(initial(&mut stream, 1).await.0.len(), 5);
        streams.push(stream);
    }
    // A key watcher and a second pattern over the same keys.
    let mut key_stream = open(&stack, "key=line/0").await;
    key_stream.expect("sync").await;
    let mut other = open(&stack, "match=line/[0-2]").await;
    assert_eq!(initial(&mut other, 1).await.0.len(), 3);

    assert_eq!(hub.watched_keys(), 5);
    assert_eq!(emulator.registrations(), 5, "one KEYNOTIFY per key");
    assert_eq!(metric(&stack, "statestore_gateway_watch_patterns"), 2.0);
    assert_eq!(metric(&stack, "statestore_gateway_watch_pattern_keys"), 8.0);

    // Rescans run per pattern, not per stream.
    let before = metric(&stack, "statestore_gateway_watch_rescans_total");
    tokio::time::sleep(rescan * 10).await;
    let rescans = metric(&stack, "statestore_gateway_watch_rescans_total") - before;
    assert!(
        (10.0..=24.0).contains(&rescans),
        "two patterns, 2 s of 200 ms rescans: {rescans}"
    );

    put(&stack, "line/1", "1").await;
    for stream in streams.iter_mut().chain([&mut other]) {
        let set = stream.expect("set").await;
        assert_eq!(
            (&set.data["key"], &set.data["value"]),
            (&"line/1".into(), &"1".into())
        );
    }

    drop(streams);
    drop(other);
    wait_until("the patterns let their keys go", || {
        hub.watched_keys() == 1 && emulator.registrations() == 1
    })
    .await;
    assert_eq!(metric(&stack, "statestore_gateway_watch_patterns"), 0.0);
    assert_eq!(metric(&stack, "statestore_gateway_watch_pattern_keys"), 0.0);
    // The key watcher still hears of its key.
    put(&stack, "line/0", "1").await;
    assert_eq!(key_stream.expect("set").await.data["value"], "1");
}

#[tokio::test]
async fn keys_and_patterns_share_a_stream_and_each_key_is_synced_once() {
    let stack = stack(Duration::from_secs(600), 100).await;
    put(&stack, "a/1", "x").await;
    put(&stack, "a/2", "y").await;
    put(&stack, "b", "z").await;
    let mut stream = open(&stack, "key=b&key=a%2F1&match=a/*&match=a/%5B1%5D").await;
    let (synced, listed) = initial(&mut stream, 2).await;
    assert_eq!(
        synced.keys().collect::<BTreeSet<_>>(),
        BTreeSet::from([&"a/1".to_owned(), &"a/2".to_owned(), &"b".to_owned()])
    );
    let listed: BTreeMap<String, u64> = listed
        .iter()
        .map(|event| {
            (
                event.data["match"].as_str().unwrap().to_owned(),
                event.data["keys"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        BTreeMap::from([("a/*".to_owned(), 2), ("a/[1]".to_owned(), 1)])
    );
    // One event per change, whatever the number of reasons to follow it.
    put(&stack, "a/1", "x2").await;
    assert_eq!(stream.expect("set").await.data["key"], "a/1");
    stream.expect_silence(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_pattern_over_its_key_limit_is_refused_and_one_growing_past_it_is_told() {
    let stack = stack(Duration::from_millis(200), 3).await;
    for n in 0..4 {
        put(&stack, &format!("big/{n}"), "1").await;
    }
    let (status, headers, body) = sse::open(
        &stack.gateway.http,
        &stack.gateway.url("/watch?match=big/*"),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(status, 429, "{body}");
    assert!(headers.contains_key("retry-after"));
    assert!(body.contains("/problems/too-many-pattern-keys"), "{body}");
    assert!(body.contains("--max-keys-per-pattern"), "{body}");

    put(&stack, "small/1", "1").await;
    put(&stack, "small/2", "1").await;
    let mut stream = open(&stack, "match=small/*").await;
    assert_eq!(initial(&mut stream, 1).await.0.len(), 2);
    put(&stack, "small/3", "1").await;
    assert_eq!(stream.expect("sync").await.data["key"], "small/3");
    // The fourth key is one too many: an error naming the limit, once.
    put(&stack, "small/4", "1").await;
    let error = stream.expect("error").await;
    assert_eq!(error.data["match"], "small/*");
    assert!(
        error.data["error"]
            .as_str()
            .unwrap()
            .contains("--max-keys-per-pattern"),
        "{error:?}"
    );
    // The keys it follows still come; the one past the limit does not.
    put(&stack, "small/1", "2").await;
    let set = stream.expect("set").await;
    assert_eq!(set.data["key"], "small/1");
    put(&stack, "small/4", "2").await;
    stream.expect_silence(Duration::from_millis(600)).await;
}

#[tokio::test]
async fn past_max_watch_patterns_a_new_pattern_is_429_but_a_followed_one_is_not() {
    let stack = stack_with(WatchSettings {
        rescan_interval: Duration::from_secs(600),
        max_patterns: 2,
        ..WatchSettings::default()
    })
    .await;
    let patterns = || metric(&stack, "statestore_gateway_watch_patterns");
    put(&stack, "p1/a", "1").await;
    let mut first = open(&stack, "match=p1/*").await;
    assert_eq!(initial(&mut first, 1).await.0.len(), 1);
    let mut second = open(&stack, "match=p2/*").await;
    initial(&mut second, 1).await;

    // A third distinct pattern, alone or beside a followed one, is refused
    // before it starts, and leaves nothing followed.
    for query in ["match=p3/*", "match=p1/*&match=p3/*"] {
        let (status, headers, body) = sse::open(
            &stack.gateway.http,
            &stack.gateway.url(&format!("/watch?{query}")),
            None,
        )
        .await
        .expect_err("a third distinct pattern is refused");
        assert_eq!(status, 429, "{query}: {body}");
        assert!(headers.contains_key("retry-after"), "{query}");
        assert!(body.contains("/problems/too-many-watch-patterns"), "{body}");
        assert!(body.contains("--max-watch-patterns"), "{body}");
        assert!(body.contains("maximum of 2 "), "{body}");
        assert_eq!(patterns(), 2.0, "{query}");
    }
    // Joining a followed pattern costs no rescan: allowed.
    let mut joined = open(&stack, "match=p1/*&match=p2/*").await;
    assert_eq!(initial(&mut joined, 2).await.0.len(), 1);

    // Once p2's last stream leaves, a new pattern takes its place.
    drop(second);
    drop(joined);
    wait_until("p2 is no longer followed", || patterns() == 1.0).await;
    put(&stack, "p3/a", "3").await;
    let mut third = open(&stack, "match=p3/*").await;
    assert_eq!(initial(&mut third, 1).await.0["p3/a"], "3");
    // And both still see their keys change.
    put(&stack, "p1/a", "2").await;
    assert_eq!(first.expect("set").await.data["value"], "2");
    put(&stack, "p3/a", "4").await;
    assert_eq!(third.expect("set").await.data["value"], "4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_opened_together_never_follow_more_patterns_than_allowed() {
    let stack = stack_with(WatchSettings {
        rescan_interval: Duration::from_secs(600),
        max_patterns: 3,
        ..WatchSettings::default()
    })
    .await;
    // Eight streams of two new patterns each, at once: whatever the
    // interleaving, the admitted ones follow at most three patterns.
    let opens = (0..8).map(|n| {
        let (http, url) = (
            stack.gateway.http.clone(),
            stack
                .gateway
                .url(&format!("/watch?match=race{n}/a/*&match=race{n}/b/*")),
        );
        tokio::spawn(async move { sse::open(&http, &url, None).await })
    });
    let mut opened = Vec::new();
    for open in opens {
        match open.await.unwrap() {
            Ok(mut stream) => {
                initial(&mut stream, 2).await;
                opened.push(stream);
            }
            Err((status, _, body)) => {
                assert_eq!(status, 429, "{body}");
                assert!(body.contains("/problems/too-many-watch-patterns"), "{body}");
            }
        }
    }
    assert_eq!(opened.len(), 1, "two streams of two new patterns exceed 3");
    assert_eq!(metric(&stack, "statestore_gateway_watch_patterns"), 2.0);
}

#[tokio::test]
async fn bad_pattern_watches_are_400() {
    let stack = stack(Duration::from_secs(600), 100).await;
    for query in ["match=", "match=a&bogus=1", "match=%zz"] {
        let (status, _, body) = sse::open(
            &stack.gateway.http,
            &stack.gateway.url(&format!("/watch?{query}")),
            None,
        )
        .await
        .unwrap_err();
        assert_eq!(status, 400, "{query}: {body}");
    }
}

#[tokio::test]
async fn a_stream_joining_a_pattern_past_its_key_limit_is_refused_as_a_new_one_is() {
    let stack = stack(Duration::from_secs(600), 3).await;
    put(&stack, "full/1", "1").await;
    put(&stack, "full/2", "1").await;
    let mut first = open(&stack, "match=full/*").await;
    assert_eq!(initial(&mut first, 1).await.0.len(), 2);
    put(&stack, "full/3", "1").await;
    assert_eq!(first.expect("sync").await.data["key"], "full/3");
    put(&stack, "full/4", "1").await;
    first.expect("error").await;

    // The pattern follows 3 of its 4 keys: a stream joining it would get
    // an incomplete picture, so it is answered as a first stream is.
    for query in ["match=full/*", "match=full/%2A"] {
        let (status, _, body) = sse::open(
            &stack.gateway.http,
            &stack.gateway.url(&format!("/watch?{query}")),
            None,
        )
        .await
        .expect_err("a stream joining a pattern past its limit is refused");
        assert_eq!(status, 429, "{query}: {body}");
        assert!(body.contains("/problems/too-many-pattern-keys"), "{body}");
    }
    // The first stream is still served the keys it follows.
    put(&stack, "full/1", "2").await;
    assert_eq!(first.expect("set").await.data["key"], "full/1");
}

#[tokio::test]
async fn a_key_written_here_after_the_store_restarted_empty_is_announced_at_once() {
    let rescan = Duration::from_secs(1);
    let mut stack = Stack::builder()
        .gateway(GatewayOptions {
            watch: WatchSettings {
                rescan_interval: rescan,
                // Only the rescans and the gateway's own writes may tell.
                resync_interval: None,
                ..WatchSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await;
    put(&stack, "reborn/1", "1").await;
    let mut stream = open(&stack, "match=reborn/*").await;
    assert_eq!(initial(&mut stream, 1).await.0.len(), 1);

    stack.restart_emulator().await;
    let delete = stream
        .next(rescan * 2 + Duration::from_secs(5))
        .await
        .expect("the next rescan tells the key is gone");
    assert_eq!(
        (delete.event.as_str(), &delete.data["key"]),
        ("delete", &"reborn/1".into())
    );

    // Written again through this gateway, before any later rescan could
    // release the key: the stream hears of it, and of what follows.
    put(&stack, "reborn/1", "2").await;
    let event = stream
        .next(rescan * 2 + Duration::from_secs(5))
        .await
        .expect("the key written again is announced");
    assert!(["sync", "set"].contains(&event.event.as_str()), "{event:?}");
    assert_eq!(
        (&event.data["key"], &event.data["value"]),
        (&"reborn/1".into(), &"2".into())
    );
    put(&stack, "reborn/1", "3").await;
    let set = stream.expect("set").await;
    assert_eq!(set.data["value"], "3");
}

/// Patterns a written key costs about pattern length times key length
/// steps to match (each is followed by its own stream's `match=`).
fn costly_patterns(stream: usize) -> Vec<String> {
    (0..64)
        .map(|n| format!("*{}b", "a".repeat(890 - stream * 64 - n)))
        .collect()
}

/// The median seconds of `rounds` rounds of a PUT of `written` followed by
/// a GET of another key (the median: one round slowed by a busy machine
/// does not count).
async fn write_and_read(stack: &Stack, written: &[u8], rounds: usize) -> f64 {
    let mut took = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let started = Instant::now();
        let put = tokio::time::timeout(
            Duration::from_secs(60),
            stack.gateway.put(written, round.to_string()),
        )
        .await
        .expect("the PUT answers within 60 s");
        assert_eq!(put.status(), 200);
        let get = tokio::time::timeout(Duration::from_secs(60), stack.gateway.get(b"unrelated"))
            .await
            .expect("the GET answers within 60 s");
        assert_eq!(get.status(), 200);
        took.push(started.elapsed().as_secs_f64());
    }
    took.sort_by(f64::total_cmp);
    took[rounds / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patterns_costly_to_match_leave_writes_and_unrelated_reads_as_fast_as_without() {
    let stack = stack_with(WatchSettings {
        rescan_interval: Duration::from_secs(600),
        max_keys_per_pattern: 100,
        max_patterns: 512,
        ..WatchSettings::default()
    })
    .await;
    put(&stack, "unrelated", "1").await;
    // Matches none of the patterns, at the full cost of each.
    let written = vec![b'a'; 1024];
    let rounds = 15;
    write_and_read(&stack, &written, 1).await;
    let without = write_and_read(&stack, &written, rounds).await;

    let mut streams = Vec::new();
    for stream in 0..8 {
        let query: Vec<String> = costly_patterns(stream)
            .iter()
            .map(|pattern| format!("match={pattern}"))
            .collect();
        let mut opened = open(&stack, &query.join("&")).await;
        assert_eq!(initial(&mut opened, 64).await.0.len(), 0);
        streams.push(opened);
    }
    assert_eq!(metric(&stack, "statestore_gateway_watch_patterns"), 512.0);
    let with = write_and_read(&stack, &written, rounds).await;
    // Within 10 times the same requests without the patterns, or within
    // 250 ms when a busy machine makes even that ratio noise: unbounded
    // matching took seconds here.
    assert!(
        with < (without * 10.0).max(0.25),
        "a write and a read took {with:.4} s (median of {rounds}) with 512 costly patterns followed, {without:.4} s without"
    );
    // A key that matches one of them is still followed at once.
    let matching = format!("{}b", "a".repeat(890));
    put(&stack, &matching, "1").await;
    let sync = streams[0].expect("sync").await;
    assert_eq!(sync.data["key"], matching.as_str());
}

#[tokio::test]
async fn a_delete_a_slow_stream_reads_after_a_rescan_dropped_its_key_still_reaches_it() {
    // A stream far behind (its client not reading) takes a key's `delete`
    // out of the pattern's channel only after a rescan found the key gone
    // and stopped following it: the stream must still be told.
    let stack = stack(Duration::from_millis(200), 100).await;
    put(&stack, "slow/victim", "v").await;
    put(&stack, "slow/filler", "f").await;
    let mut stream = open(&stack, "match=slow/*").await;
    let (synced, _) = initial(&mut stream, 1).await;
    assert_eq!(synced.len(), 2);
    // Read past the listing, then stop reading: the filler's values fill
    // the connection until the gateway's writes to it wait.
    stream.expect_silence(Duration::from_millis(300)).await;
    let big = "x".repeat(512 * 1024);
    for _ in 0..60 {
        put(&stack, "slow/filler", &big).await;
    }
    assert_eq!(stack.gateway.delete(b"slow/victim").await.status(), 204);
    // Rescans find the key gone and stop following it.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let event = stream
            .next(deadline.saturating_duration_since(Instant::now()))
            .await
            .expect("slow/victim's delete within 30 s");
        if event.data["key"] == "slow/victim" {
            assert_eq!(event.event, "delete", "{event:?}");
            break;
        }
    }
}
