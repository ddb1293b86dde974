//! Faults under load, with real processes: the broker killed or frozen,
//! the store killed and restarted, SIGTERM to the gateway binary. Each
//! test checks the promises the gateway makes when that happens: every
//! request is answered within the request timeout, no acknowledged write
//! is lost, readiness and watches follow the broker.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt as _;
use statestore_gateway::emulator::Emulator;
use statestore_gateway::protocol::Reply;
use statestore_gateway::watch::WatchSettings;
use tokio::sync::mpsc;

use crate::support::emulator::{EmulatorProcess, RawClient, get_payload, start_emulator};
use crate::support::fault_proxy::FaultProxy;
use crate::support::gateway::{Gateway, GatewayOptions, Stack};
use crate::support::gateway_process::GatewayProcess;
use crate::support::load::{Outcome, WriteLoad, tally};
use crate::support::sse::{self, SseEvent, SseStream};
use crate::support::{Mosquitto, init_logging};

/// The gateway's store request timeout in these tests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What HTTP and scheduling may add to a deadline on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(1);

/// The client gives up later than the gateway could ever answer, so a
/// request the gateway forgot shows up as a client-side timeout.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);

fn options() -> GatewayOptions {
    GatewayOptions {
        request_timeout: REQUEST_TIMEOUT,
        ..GatewayOptions::default()
    }
}

/// Every request got one of `allowed` within `bound`.
fn assert_answered_in_time(outcomes: &[Outcome], allowed: &[u16], bound: Duration) {
    for outcome in outcomes {
        let key = String::from_utf8_lossy(&outcome.key);
        match &outcome.result {
            Ok(status) => assert!(
                allowed.contains(status),
                "PUT {key}: {status} is not one of {allowed:?}"
            ),
            Err(error) => panic!("PUT {key}: no answer after {:?}: {error}", outcome.elapsed),
        }
        assert!(
            outcome.elapsed <= bound,
            "PUT {key}: answered {} after {:?}, over {bound:?}",
            outcome.result.as_ref().map_or(0, |s| *s),
            outcome.elapsed
        );
    }
}

/// The longest any request waited for its answer.
fn slowest(outcomes: &[Outcome]) -> Duration {
    outcomes
        .iter()
        .map(|outcome| outcome.elapsed)
        .max()
        .unwrap_or_default()
}

/// Every write that got a 2xx reads back with its value, through `gateway`.
async fn assert_acknowledged_writes_readable(gateway: &Gateway, outcomes: &[Outcome]) {
    let acknowledged: Vec<&Outcome> = outcomes
        .iter()
        .filter(|outcome| matches!(outcome.result, Ok(200..=299)))
        .collect();
    assert!(!acknowledged.is_empty(), "no write was acknowledged");
    let lost: Vec<String> = futures_util::stream::iter(acknowledged)
        .map(|outcome| async move {
            let response = gateway
                .http
                .get(gateway.key(&outcome.key))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.bytes().await.unwrap();
            (status == 200 && body == outcome.value.as_bytes())
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "{}: {status} {:?}",
                        String::from_utf8_lossy(&outcome.key),
                        String::from_utf8_lossy(&body)
                    )
                })
        })
        .buffer_unordered(32)
        .filter_map(|result| async move { result.err() })
        .collect()
        .await;
    assert!(
        lost.is_empty(),
        "{} acknowledged writes are not readable, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}

/// PUTs until the store answers 200 (it may still be coming back); the
/// version from the ETag.
async fn put_until_ok(gateway: &Gateway, key: &[u8], value: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let response = gateway
            .http
            .put(gateway.key(key))
            .body(value.to_owned())
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            return response.headers()["etag"]
                .to_str()
                .unwrap()
                .trim_matches('"')
                .to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "PUT {} still {} after {within:?}",
            String::from_utf8_lossy(key),
            response.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The next event that is not an `error` (the hub reports with those that
/// it cannot follow the key right now; the state comes after).
async fn next_state(stream: &mut SseStream, within: Duration) -> SseEvent {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = stream
            .next(left)
            .await
            .unwrap_or_else(|| panic!("no event within {within:?}"));
        if event.event != "error" {
            return event;
        }
    }
}

/// The broker dies for 5 s under a steady write load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_for_5s_under_load_answers_every_request_and_loses_no_acknowledged_write() {
    let Stack {
        mut broker,
        gateway,
        emulator: _emulator,
        ..
    } = Stack::builder()
        .gateway(
            // One connection: /readyz waits for that very one to come back.
            GatewayOptions {
                pool_size: 1,
                ..options()
            },
        )
        .start()
        .await;

    // A watcher, and a change the gateway cannot see happening: the key
    // expires while the broker is down.
    let mut watch = sse::open(&gateway.http, &gateway.url("/watch/watched"), None)
        .await
        .unwrap();
    assert_eq!(watch.expect("sync").await.data["exists"], false);
    let response = gateway
        .http
        .put(format!("{}?ttl=3s", gateway.key(b"watched")))
        .body("before")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(watch.expect("set").await.data["value"], "before");

    // 24 writers every 80 ms: 300 requests/s while the store answers.
    let load = WriteLoad::start(
        gateway.api,
        "kill",
        24,
        Duration::from_millis(80),
        CLIENT_TIMEOUT,
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    broker.kill();
    let killed = Instant::now();
    gateway.wait_readyz(503, Duration::from_secs(2)).await;
    tokio::time::sleep_until((killed + Duration::from_secs(5)).into()).await;
    // `restart` returns as soon as the new broker accepts connections.
    broker.restart().await;
    let back = Instant::now();
    let ready_after = loop {
        if gateway.readyz().await == 200 {
            break back.elapsed();
        }
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "/readyz not 200 within 10 s of the broker's return"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        ready_after <= Duration::from_secs(2),
        "/readyz back to 200 only {ready_after:?} after the broker's return"
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    let outcomes = load.stop().await;
    let counts = tally(&outcomes);
    let rate = outcomes.iter().filter(|o| o.started < killed).count() as f64 / 1.5;
    eprintln!(
        "broker kill: {counts:?}, {rate:.0} requests/s before the kill, slowest answer {:?}, \
         /readyz 200 again {ready_after:?} after the broker's return",
        slowest(&outcomes)
    );
    assert_answered_in_time(&outcomes, &[200, 503, 504], REQUEST_TIMEOUT + SLACK);
    let ok_before = outcomes
        .iter()
        .any(|o| o.started < killed && o.result == Ok(200));
    let unavailable_during = outcomes
        .iter()
        .any(|o| o.started > killed && o.started < back && o.result == Ok(503));
    let ok_after = outcomes
        .iter()
        .any(|o| o.started > back + Duration::from_secs(2) && o.result == Ok(200));
    assert!(
        ok_before && unavailable_during && ok_after,
        "the load did not see all three phases: {counts:?}"
    );
    assert_acknowledged_writes_readable(&gateway, &outcomes).await;

    // The watcher hears that the key went away while it could not look:
    // a resync `sync` (re-registered, read, found moved) or the store's
    // own delete notification if it got through.
    let gone = next_state(&mut watch, Duration::from_secs(15)).await;
    let resynced = gone.event == "sync" && gone.data["resync"] == true;
    eprintln!(
        "broker kill: the watcher heard of the expiry as {}",
        gone.event
    );
    assert!(
        resynced || gone.event == "delete",
        "expected a resync or delete, got {gone:?}"
    );
    assert_eq!(gone.data["value"], serde_json::Value::Null, "{gone:?}");
    // Then the later changes.
    let version = put_until_ok(&gateway, b"watched", "after", Duration::from_secs(10)).await;
    let after = next_state(&mut watch, Duration::from_secs(10)).await;
    assert!(after.event == "set" || after.event == "sync", "{after:?}");
    assert_eq!(after.data["value"], "after");
    assert_eq!(after.id.as_deref(), Some(version.as_str()));
    put_until_ok(&gateway, b"watched", "later", Duration::from_secs(5)).await;
    let later = next_state(&mut watch, Duration::from_secs(10)).await;
    assert_eq!(later.event, "set", "{later:?}");
    assert_eq!(later.data["value"], "later");
}

/// The broker is frozen (SIGSTOP) for longer than the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_broker_gives_504s_within_the_timeout_and_recovers_after_sigcont() {
    let Stack {
        broker,
        gateway,
        emulator: _emulator,
        ..
    } = Stack::builder().gateway(options()).start().await;
    let load = WriteLoad::start(
        gateway.api,
        "freeze",
        16,
        Duration::from_millis(100),
        CLIENT_TIMEOUT,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    broker.pause();
    let paused = Instant::now();
    // A broker that acknowledges nothing is given up on within the request
    // timeout: the members reconnect and /readyz tells the load balancer.
    gateway
        .wait_readyz(503, REQUEST_TIMEOUT + Duration::from_secs(2))
        .await;
    tokio::time::sleep_until((paused + REQUEST_TIMEOUT * 2 + Duration::from_secs(1)).into()).await;
    broker.resume();
    let resumed = Instant::now();

    let recovered_after = loop {
        let response = gateway
            .http
            .put(gateway.key(b"probe"))
            .body("x")
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            break resumed.elapsed();
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(15),
            "no PUT succeeds within 15 s of SIGCONT"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    gateway.wait_readyz(200, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outcomes = load.stop().await;
    let counts = tally(&outcomes);
    eprintln!(
        "broker freeze: {counts:?}, slowest answer {:?}, writes succeed again \
         {recovered_after:?} after SIGCONT",
        slowest(&outcomes)
    );

    assert_answered_in_time(&outcomes, &[200, 503, 504], REQUEST_TIMEOUT + SLACK);
    // A 504 is either the request timeout or, earlier, a request that was
    // in flight when the pool rebuilt the silent connection (outcome
    // unknown); both happen only to requests started during the freeze.
    let gateway_timeouts: Vec<&Outcome> = outcomes.iter().filter(|o| o.result == Ok(504)).collect();
    let timeouts: Vec<&&Outcome> = gateway_timeouts
        .iter()
        .filter(|o| o.elapsed >= REQUEST_TIMEOUT.mul_f64(0.9))
        .collect();
    assert!(
        !timeouts.is_empty(),
        "no request timed out during the freeze: {counts:?}"
    );
    for outcome in &gateway_timeouts {
        assert!(outcome.started >= paused - SLACK && outcome.started < resumed);
    }
    assert!(
        outcomes
            .iter()
            .any(|o| o.started > resumed + recovered_after && o.result == Ok(200)),
        "the load did not recover: {counts:?}"
    );
    assert_acknowledged_writes_readable(&gateway, &outcomes).await;
}

/// The store (the emulator binary, persisting to a data directory) is
/// killed with SIGKILL and started again; the gateway keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_store_keeps_persisted_keys_and_watches_resume() {
    init_logging();
    let broker = Mosquitto::start().await;
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap().to_owned();
    let args = ["--data-dir", dir.as_str()];
    let mut store = EmulatorProcess::start(&broker, &args).await;
    let resync_interval = Duration::from_secs(1);
    let gateway = Gateway::start(
        broker.port(),
        GatewayOptions {
            watch: WatchSettings {
                resync_interval: Some(resync_interval),
                ..WatchSettings::default()
            },
            ..options()
        },
    )
    .await;
    gateway.wait_ready().await;

    let response = gateway
        .http
        .put(format!("{}?persist=true", gateway.key(b"durable")))
        .body("kept")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    put_until_ok(&gateway, b"volatile", "lost", Duration::from_secs(1)).await;
    let mut durable = sse::open(&gateway.http, &gateway.url("/watch/durable"), None)
        .await
        .unwrap();
    assert_eq!(durable.expect("sync").await.data["value"], "kept");
    let mut volatile = sse::open(&gateway.http, &gateway.url("/watch/volatile"), None)
        .await
        .unwrap();
    assert_eq!(volatile.expect("sync").await.data["value"], "lost");

    store.kill();
    // Nothing serves the store's topic: requests fail fast, none hangs.
    for key in [&b"durable"[..], b"other"] {
        let started = Instant::now();
        let response = gateway.http.get(gateway.key(key)).send().await.unwrap();
        assert_eq!(response.status(), 503);
        assert!(started.elapsed() <= REQUEST_TIMEOUT + SLACK);
    }

    let mut store = EmulatorProcess::start(&broker, &args).await;
    // The gateway recovers by itself: same process, same connections.
    let response = gateway
        .http
        .get(gateway.key(b"durable"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"kept");
    let response = gateway
        .http
        .get(gateway.key(b"volatile"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        404,
        "the store did restart (memory lost)"
    );

    // The restarted store forgot the registrations while the gateway's
    // connection never dropped: the periodic resync re-registers every
    // key and tells the watchers what moved.
    let resync = next_state(&mut volatile, resync_interval + Duration::from_secs(10)).await;
    assert_eq!(resync.event, "sync", "{resync:?}");
    assert_eq!(resync.data["resync"], true);
    assert_eq!(resync.data["exists"], false);
    // That pass registered `durable` again too: its changes flow.
    let version = put_until_ok(&gateway, b"durable", "changed", Duration::from_secs(5)).await;
    let set = loop {
        let event = next_state(&mut durable, Duration::from_secs(10)).await;
        // A resync of the unchanged value may come first.
        if event.data["value"] != "kept" {
            break event;
        }
    };
    assert_eq!(set.event, "set", "{set:?}");
    assert_eq!(set.data["value"], "changed");
    assert_eq!(set.id.as_deref(), Some(version.as_str()));
    store.kill();
}

/// The value of `key` read straight from the store over MQTT.
async fn read_from_store(raw: &mut RawClient, key: &[u8]) -> Option<Bytes> {
    let reply = raw.request(&get_payload(key), &[]).await;
    match Reply::decode(&reply.payload).unwrap() {
        Reply::Value(value) => Some(value),
        Reply::NotFound => None,
        other => panic!("GET {}: {other:?}", String::from_utf8_lossy(key)),
    }
}

/// A PUT whose body arrives in two parts; the second when `finish` is sent.
struct SlowUpload {
    finish: mpsc::Sender<Result<Bytes, std::io::Error>>,
    response: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
}

async fn slow_upload(http: &reqwest::Client, url: String, first: &'static str) -> SlowUpload {
    let (finish, parts) = mpsc::channel(2);
    finish
        .send(Ok(Bytes::from_static(first.as_bytes())))
        .await
        .unwrap();
    let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(parts));
    let request = http.put(url).body(body);
    let response = tokio::spawn(request.send());
    SlowUpload { finish, response }
}

/// SIGTERM to the gateway binary during a write load, with uploads in
/// flight and SSE streams open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_ends_streams_and_exits_within_the_grace_period() {
    init_logging();
    let broker = Mosquitto::start().await;
    let _store = start_emulator(&broker).await;
    let grace = Duration::from_secs(5);
    let mut gateway = GatewayProcess::start(
        broker.port(),
        &["--shutdown-grace", "5s", "--request-timeout", "5s"],
    )
    .await;

    let mut streams = Vec::new();
    for key in ["s1", "s2", "s3"] {
        let mut stream = sse::open(&gateway.http, &gateway.url(&format!("/watch/{key}")), None)
            .await
            .unwrap();
        stream.expect("sync").await;
        streams.push(stream);
    }
    let mut uploads = Vec::new();
    for n in 0..4 {
        let url = gateway.key(format!("upload/{n}").as_bytes());
        uploads.push(slow_upload(&gateway.http, url, "first half, ").await);
    }
    let load = WriteLoad::start(
        gateway.api,
        "term",
        16,
        Duration::from_millis(50),
        CLIENT_TIMEOUT,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    gateway.terminate();
    let terminated = Instant::now();
    // The uploads were in flight at SIGTERM; they finish a second later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for upload in &uploads {
        upload
            .finish
            .send(Ok(Bytes::from_static(b"second half")))
            .await
            .unwrap();
    }
    for upload in uploads {
        drop(upload.finish);
        let response = tokio::time::timeout(Duration::from_secs(10), upload.response)
            .await
            .expect("the upload is answered")
            .unwrap()
            .expect("the in-flight upload gets a response");
        assert_eq!(response.status(), 200);
    }
    // Streams end (they do not just go quiet).
    for stream in &mut streams {
        let started = Instant::now();
        while stream.next(Duration::from_secs(8)).await.is_some() {}
        assert!(
            started.elapsed() < Duration::from_secs(7),
            "an SSE stream stayed open after SIGTERM"
        );
    }
    let status = gateway
        .wait_exit(grace + SLACK)
        .await
        .expect("the gateway exits after SIGTERM");
    let exited_after = terminated.elapsed();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        exited_after <= grace,
        "exited {exited_after:?} after SIGTERM, over the {grace:?} grace period"
    );

    let outcomes = load.stop().await;
    eprintln!(
        "sigterm: {:?}, exit {exited_after:?} after SIGTERM",
        tally(&outcomes)
    );
    for outcome in &outcomes {
        let key = String::from_utf8_lossy(&outcome.key);
        match &outcome.result {
            Ok(status) => assert!(
                *status == 200 || *status == 503,
                "PUT {key} during shutdown: {status}"
            ),
            // Closed or refused connections, for requests that raced the
            // shutdown: never a request the gateway had accepted.
            Err(error) => assert!(
                outcome.started + Duration::from_millis(500) >= terminated,
                "PUT {key} sent {:?} before SIGTERM failed: {error}",
                terminated - outcome.started
            ),
        }
        assert!(
            outcome.elapsed <= Duration::from_secs(5) + SLACK,
            "PUT {key}"
        );
    }

    // Everything acknowledged is in the store.
    let mut raw = RawClient::connect(&broker, "checker").await;
    for n in 0..4 {
        let value = read_from_store(&mut raw, format!("upload/{n}").as_bytes()).await;
        assert_eq!(value.as_deref(), Some(&b"first half, second half"[..]));
    }
    for outcome in outcomes.iter().filter(|o| o.result == Ok(200)) {
        let value = read_from_store(&mut raw, &outcome.key).await;
        assert_eq!(
            value.as_deref(),
            Some(outcome.value.as_bytes()),
            "{}",
            String::from_utf8_lossy(&outcome.key)
        );
    }
}

/// A request that would outlive the grace period does not hold the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_stuck_upload_still_exits_within_the_grace_period() {
    init_logging();
    let broker = Mosquitto::start().await;
    let _store = start_emulator(&broker).await;
    let mut gateway = GatewayProcess::start(
        broker.port(),
        &["--shutdown-grace", "1s", "--request-timeout", "30s"],
    )
    .await;
    let mut stream = sse::open(&gateway.http, &gateway.url("/watch/k"), None)
        .await
        .unwrap();
    stream.expect("sync").await;
    let stuck = slow_upload(&gateway.http, gateway.key(b"stuck"), "never finished").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    gateway.terminate();
    let terminated = Instant::now();
    let status = gateway
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the gateway exits");
    let exited_after = terminated.elapsed();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        exited_after <= Duration::from_secs(1) + SLACK,
        "exited {exited_after:?} after SIGTERM with a 1 s grace period"
    );
    // The client is not left hanging either.
    let outcome = tokio::time::timeout(Duration::from_secs(5), stuck.response)
        .await
        .expect("the stuck upload ends with the process")
        .unwrap();
    assert!(outcome.is_err() || outcome.unwrap().status() == 503);
    drop(stuck.finish);
}

/// mosquitto and the emulator, and a ready gateway whose broker
/// connections all pass through a fault proxy.
async fn behind_a_fault_proxy() -> (Mosquitto, Emulator, FaultProxy, Gateway) {
    init_logging();
    let broker = Mosquitto::start().await;
    let store = start_emulator(&broker).await;
    let proxy = FaultProxy::start(broker.addr).await;
    let gateway = Gateway::start(proxy.port(), options()).await;
    gateway.wait_ready().await;
    (broker, store, proxy, gateway)
}

/// A request the broker may have received when the connection dropped is
/// an unknown outcome (504, no `Retry-After`), never "not processed,
/// retry" (503): here it did take effect, and a client that retried its
/// `If-None-Match: *` would get 412 for its own write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_off_after_it_left_is_an_unknown_outcome_not_a_503() {
    let (_broker, _store, proxy, gateway) = behind_a_fault_proxy().await;
    let client = reqwest::Client::new();

    proxy.cut_after_publishes(1);
    let response = client
        .put(gateway.key(b"cut/created"))
        .header("If-None-Match", "*")
        .body("mine")
        .send()
        .await
        .unwrap();
    assert!(proxy.stats().cuts >= 1, "the proxy cut the connections");
    assert_eq!(response.status().as_u16(), 504, "{response:?}");
    assert!(
        response.headers().get("retry-after").is_none(),
        "an unknown outcome must not invite a blind retry: {response:?}"
    );
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["type"], "/problems/outcome-unknown", "{body}");

    // The write did take effect.
    gateway.wait_ready().await;
    let read = client
        .get(gateway.key(b"cut/created"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status().as_u16(), 200);
    assert_eq!(read.text().await.unwrap(), "mine");
}

/// The other half of the rule: a request refused before it could leave
/// (no usable connection) is 503 with `Retry-After`, and did not happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_left_is_503_and_did_not_happen() {
    let (_broker, _store, proxy, gateway) = behind_a_fault_proxy().await;
    let client = reqwest::Client::new();

    proxy.set_refuse(true);
    proxy.cut_all();
    gateway.wait_readyz(503, Duration::from_secs(10)).await;
    let response = client
        .put(gateway.key(b"cut/never"))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503, "{response:?}");
    assert_eq!(response.headers()["retry-after"], "1");
    proxy.set_refuse(false);
    gateway.wait_ready().await;
    let read = client.get(gateway.key(b"cut/never")).send().await.unwrap();
    assert_eq!(read.status().as_u16(), 404);
}

/// A lock waiter whose watch registration (KEYNOTIFY) is cut off with its
/// connection keeps waiting: the line registers again, and the waiter gets
/// the lock once it is released, instead of answering 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_waiter_whose_registration_was_cut_keeps_waiting() {
    let (_broker, _store, proxy, gateway) = behind_a_fault_proxy().await;
    let client = reqwest::Client::new();
    let lock = |query: &str| gateway.url(&format!("/locks/cut-line?{query}"));

    let first = client
        .put(lock("holder=first&ttl=30s"))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status().as_u16(), 200);
    // The waiter's SET is the first PUBLISH, its line's KEYNOTIFY the second.
    proxy.cut_after_publishes(2);
    let waiter = tokio::spawn(client.put(lock("holder=second&ttl=30s&wait=20s")).send());
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.stats().cuts == 0 {
        assert!(Instant::now() < deadline, "the proxy cut the registration");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gateway.wait_ready().await;
    loop {
        let released = client.delete(lock("holder=first")).send().await.unwrap();
        match released.status().as_u16() {
            204 => break,
            503 | 504 if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("release: {other}"),
        }
    }
    let response = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter answers once the lock is free")
        .unwrap()
        .unwrap();
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"second\""), "{body}");
}
