//! `/locks/{name}` against the official SDK's `leased_lock` clients as
//! peers: the same key, value and commands, so both sides contend for one
//! lock; waiters that block, hand-over on release and expiry, a waiter
//! whose client goes away, and fenced writes under mixed contention.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use azure_iot_operations_services::leased_lock::{lease, lock};
use azure_iot_operations_services::state_store::SetOptions;
use rand::Rng as _;
use reqwest::StatusCode;
use statestore_gateway::protocol::Hlc;
use tokio::io::AsyncWriteExt as _;

use crate::support::Mosquitto;
use crate::support::emulator::EmulatorProcess;
use crate::support::gateway::{Gateway, GatewayOptions, Stack, encode};
use crate::support::sdk::{SdkClient, hlc};

const TIMEOUT: Duration = Duration::from_secs(5);

/// What the helpers need of a gateway, cheap to clone into tasks.
#[derive(Debug, Clone)]
struct Api {
    http: reqwest::Client,
    gateway: SocketAddr,
    admin: SocketAddr,
}

impl Api {
    fn of(gateway: &Gateway) -> Self {
        Self {
            http: gateway.http.clone(),
            gateway: gateway.api,
            admin: gateway.admin,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.gateway)
    }
}

fn lock_url(gateway: &Api, name: &str, query: &str) -> String {
    gateway.url(&format!("/locks/{}?{query}", encode(name.as_bytes())))
}

/// `PUT /locks/{name}`: status and JSON body.
async fn put_lock(
    gateway: &Api,
    name: &str,
    query: &str,
) -> (StatusCode, serde_json::Value, Option<String>) {
    let response = gateway
        .http
        .put(lock_url(gateway, name, query))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let header = response
        .headers()
        .get("fencing-token")
        .map(|value| value.to_str().unwrap().to_owned());
    let body =
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or(serde_json::Value::Null);
    (status, body, header)
}

/// Acquires for `holder`, waiting up to `wait`: the fencing token, or
/// `None` on 409.
async fn acquire(gateway: &Api, name: &str, holder: &str, ttl: &str, wait: &str) -> Option<Hlc> {
    let (status, body, header) = put_lock(
        gateway,
        name,
        &format!("holder={holder}&ttl={ttl}&wait={wait}"),
    )
    .await;
    match status {
        StatusCode::OK => {
            assert_eq!(body["holder"], holder);
            let token = body["fencing_token"].as_str().unwrap();
            assert_eq!(header.as_deref(), Some(token));
            Some(Hlc::parse(token).unwrap())
        }
        StatusCode::CONFLICT => None,
        other => panic!("acquire {name} by {holder}: {other} {body}"),
    }
}

async fn release(gateway: &Api, name: &str, holder: &str) -> StatusCode {
    gateway
        .http
        .delete(lock_url(gateway, name, &format!("holder={holder}")))
        .send()
        .await
        .unwrap()
        .status()
}

async fn get_lock(gateway: &Api, name: &str) -> (StatusCode, serde_json::Value) {
    let response = gateway
        .http
        .get(lock_url(gateway, name, ""))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body =
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// `PUT /keys/{key}` with `Fencing-Token: token`: the status.
async fn fenced_put(gateway: &Api, key: &str, token: &Hlc, value: String) -> StatusCode {
    gateway
        .http
        .put(gateway.url(&format!("/keys/{key}")))
        .header("fencing-token", token.to_string())
        .body(value)
        .send()
        .await
        .unwrap()
        .status()
}

/// A metric's value from `/metrics` (0 when absent).
async fn metric(gateway: &Api, line_start: &str) -> f64 {
    let text = gateway
        .http
        .get(format!("http://{}/metrics", gateway.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(line_start))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until a metric reads `value`.
async fn wait_metric(gateway: &Api, line_start: &str, value: f64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = metric(gateway, line_start).await;
        if now == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{line_start} is {now}, not {value}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const WAITERS: &str = "statestore_gateway_lock_waiters ";

#[tokio::test]
async fn bad_lock_requests_are_400() {
    let stack = Stack::start().await;
    let gateway = &Api::of(&stack.gateway);
    for (query, kind) in [
        ("ttl=1s", "/problems/invalid-holder"),
        ("holder=&ttl=1s", "/problems/invalid-holder"),
        ("holder=a", "/problems/invalid-ttl"),
        ("holder=a&ttl=0", "/problems/invalid-ttl"),
        ("holder=a&ttl=soon", "/problems/invalid-ttl"),
        ("holder=a&ttl=1s&wait=later", "/problems/invalid-wait"),
        ("holder=a&ttl=1s&wait=6m", "/problems/invalid-wait"),
        ("holder=a&ttl=1s&tll=1", "/problems/invalid-query"),
    ] {
        let (status, body, _) = put_lock(gateway, "bad", query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["type"], kind, "{query}");
    }
    let long = "h".repeat(1025);
    let (status, body, _) = put_lock(gateway, "bad", &format!("holder={long}&ttl=1s")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["type"], "/problems/invalid-holder");
    let status = gateway
        .http
        .delete(lock_url(gateway, "bad", ""))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(get_lock(gateway, "bad").await.0, StatusCode::NOT_FOUND);
    assert_eq!(release(gateway, "bad", "a").await, StatusCode::NOT_FOUND);
}

/// A key written with a `Fencing-Token` is a fenced resource: the store
/// wants that token for every write, so it cannot be taken or released as
/// a lock; that is a conflict with the key, not a missing header of the
/// lock request (the lock API takes none).
#[tokio::test]
async fn a_fenced_resource_is_not_a_lock() {
    let stack = Stack::start().await;
    let gateway = &Api::of(&stack.gateway);
    let token = acquire(gateway, "guard", "writer", "30s", "0s")
        .await
        .expect("a free lock");
    assert_eq!(
        fenced_put(gateway, "fenced-resource", &token, "42".into()).await,
        StatusCode::OK
    );
    let (status, body, _) = put_lock(gateway, "fenced-resource", "holder=a&ttl=10s").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["type"], "/problems/not-a-lock", "{body}");
    let response = gateway
        .http
        .delete(lock_url(gateway, "fenced-resource", "holder=a"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["type"], "/problems/not-a-lock", "{body}");
}

#[tokio::test]
async fn an_sdk_lease_holder_refuses_an_http_acquire_and_get_shows_its_token() {
    let stack = Stack::start().await;
    let gateway = &Api::of(&stack.gateway);
    let sdk = SdkClient::connect(stack.broker.port(), "sdk-lease-holder");
    let lease = lease::Client::new(
        sdk.client.clone(),
        b"shared".to_vec(),
        b"sdk-lease-holder".to_vec(),
    )
    .unwrap();
    let token = lease
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .unwrap();

    let (status, body, _) = put_lock(gateway, "shared", "holder=http-client&ttl=5s").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["type"], "/problems/lock-held");
    assert_eq!(body["holder"], "sdk-lease-holder");
    assert_eq!(body["fencing_token"], token.to_string());

    let (status, body) = get_lock(gateway, "shared").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["name"], "shared");
    assert_eq!(body["holder"], "sdk-lease-holder");
    assert_eq!(body["fencing_token"], token.to_string());

    // Only the holder's own release deletes it.
    assert_eq!(
        release(gateway, "shared", "http-client").await,
        StatusCode::CONFLICT
    );
    lease.release(TIMEOUT).await.unwrap();
    assert_eq!(get_lock(gateway, "shared").await.0, StatusCode::NOT_FOUND);
    sdk.close().await;
}

#[tokio::test]
async fn a_holder_that_is_not_utf8_is_named_in_base64() {
    let stack = Stack::start().await;
    let gateway = &Api::of(&stack.gateway);
    let sdk = SdkClient::connect(stack.broker.port(), "sdk-binary-holder");
    let holder = b"sdk-\xff\x00-holder".to_vec();
    let lease = lease::Client::new(sdk.client.clone(), b"binary".to_vec(), holder.clone()).unwrap();
    let token = lease
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .unwrap();
    let expected = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &holder);

    let (status, body, _) = put_lock(gateway, "binary", "holder=http-client&ttl=5s").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["type"], "/problems/lock-held");
    assert_eq!(body["holder"], serde_json::Value::Null);
    assert_eq!(body["holder_base64"], expected);
    assert_eq!(body["fencing_token"], token.to_string());

    let (status, body) = get_lock(gateway, "binary").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["holder"], serde_json::Value::Null);
    assert_eq!(body["holder_base64"], expected);
    lease.release(TIMEOUT).await.unwrap();
    sdk.close().await;
}

#[tokio::test]
async fn a_waiter_keeps_waiting_across_a_broker_restart_and_gets_the_lock() {
    let mut stack = Stack::start().await;
    let gateway = Api::of(&stack.gateway);
    acquire(&gateway, "rejoin", "first", "30s", "0")
        .await
        .unwrap();
    let waiter = {
        let gateway = gateway.clone();
        tokio::spawn(async move { acquire(&gateway, "rejoin", "second", "30s", "30s").await })
    };
    wait_metric(&gateway, WAITERS, 1.0, Duration::from_secs(5)).await;

    // Every connection drops, with them the waiter's KEYNOTIFY registration.
    stack.broker.restart().await;
    stack
        .gateway
        .wait_readyz(200, Duration::from_secs(10))
        .await;
    // The release reaches the store once the emulator is back too.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match release(&gateway, "rejoin", "first").await {
            StatusCode::NO_CONTENT => break,
            StatusCode::SERVICE_UNAVAILABLE if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("release after the restart: {other}"),
        }
    }
    let token = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter returns well before its 30 s wait ends")
        .unwrap();
    assert!(token.is_some(), "the waiter got the lock after the restart");
    let (status, body) = get_lock(&gateway, "rejoin").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["holder"], "second");
    assert_eq!(metric(&gateway, WAITERS).await, 0.0);
}

#[tokio::test]
async fn an_http_waiter_gets_the_lock_soon_after_the_sdk_releases() {
    let stack = Stack::start().await;
    let gateway = Api::of(&stack.gateway);
    let sdk = SdkClient::connect(stack.broker.port(), "sdk-releaser");
    let lease =
        lease::Client::new(sdk.client.clone(), b"handover".to_vec(), b"sdk".to_vec()).unwrap();
    let sdk_token = lease
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let token = acquire(&gateway, "handover", "http-waiter", "10s", "20s").await;
        (token, Instant::now())
    });
    wait_metric(
        &Api::of(&stack.gateway),
        WAITERS,
        1.0,
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    lease.release(TIMEOUT).await.unwrap();
    let (token, acquired) = waiter.await.unwrap();
    let handover = acquired.duration_since(released);
    eprintln!("hand-over from the SDK's release to the HTTP waiter: {handover:?}");
    assert!(token.unwrap() > hlc(&sdk_token));
    // Woken by the release's notification: nothing else wakes a waiter
    // before its 20 s wait ends. The bound leaves room for a loaded machine.
    assert!(handover < Duration::from_secs(1), "{handover:?}");
    sdk.close().await;
}

#[tokio::test]
async fn the_sdk_lock_client_gets_the_lock_after_an_http_release() {
    let stack = Stack::start().await;
    let gateway = &Api::of(&stack.gateway);
    let http_token = acquire(gateway, "handback", "http-holder", "10s", "0")
        .await
        .unwrap();
    let sdk = SdkClient::connect(stack.broker.port(), "sdk-locker");
    let lock = lock::Client::new(
        sdk.client.clone(),
        b"handback".to_vec(),
        b"sdk-locker".to_vec(),
    )
    .unwrap();
    let locking = tokio::spawn(async move {
        let token = lock.lock(Duration::from_secs(10), TIMEOUT, None).await;
        (token, Instant::now(), lock)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !locking.is_finished(),
        "the SDK must wait while HTTP holds the lock"
    );
    let released = Instant::now();
    assert_eq!(
        release(gateway, "handback", "http-holder").await,
        StatusCode::NO_CONTENT
    );
    let (token, acquired, lock) = tokio::time::timeout(Duration::from_secs(5), locking)
        .await
        .unwrap()
        .unwrap();
    let token = token.unwrap();
    eprintln!(
        "hand-over from the HTTP release to the SDK's lock: {:?}",
        acquired.duration_since(released)
    );
    assert!(hlc(&token) > http_token);
    let (status, body) = get_lock(gateway, "handback").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["holder"], "sdk-locker");
    lock.unlock(TIMEOUT).await.unwrap();
    sdk.close().await;
}

#[tokio::test]
async fn renewal_keeps_the_lock_expiry_hands_it_on_and_strangers_cannot_release() {
    let stack = Stack::start().await;
    let gateway = &Api::of(&stack.gateway);
    let mut token = acquire(gateway, "lease", "a", "600ms", "0").await.unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Another client is refused, and may not release it.
        assert_eq!(acquire(gateway, "lease", "b", "600ms", "0").await, None);
        assert_eq!(release(gateway, "lease", "b").await, StatusCode::CONFLICT);
        let renewed = acquire(gateway, "lease", "a", "600ms", "0").await.unwrap();
        assert!(renewed > token);
        token = renewed;
    }
    // Held for 1.2 s with a 600 ms ttl: the renewals kept it. Now `a`
    // stops renewing; `b` waits and gets it once the ttl runs out.
    let waited = Instant::now();
    let taken = acquire(gateway, "lease", "b", "10s", "5s").await.unwrap();
    let after = waited.elapsed();
    assert!(taken > token);
    assert!(after < Duration::from_millis(1_500), "{after:?}");
    assert_eq!(release(gateway, "lease", "a").await, StatusCode::CONFLICT);
    assert_eq!(release(gateway, "lease", "b").await, StatusCode::NO_CONTENT);
}

/// Sends a blocking acquire on a raw connection and returns the socket.
async fn raw_acquire(gateway: &Api, name: &str, holder: &str) -> tokio::net::TcpStream {
    let mut socket = tokio::net::TcpStream::connect(gateway.gateway)
        .await
        .unwrap();
    let request = format!(
        "PUT /locks/{name}?holder={holder}&ttl=10s&wait=60s HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    socket
}

#[tokio::test]
async fn a_waiter_whose_connection_closes_never_holds_the_lock() {
    let stack = Stack::start().await;
    let gateway = &Api::of(&stack.gateway);
    acquire(gateway, "gone", "owner", "10s", "0").await.unwrap();
    let socket = raw_acquire(gateway, "gone", "ghost").await;
    wait_metric(gateway, WAITERS, 1.0, Duration::from_secs(5)).await;
    drop(socket);
    // The gateway notices the closed connection and the waiter leaves.
    wait_metric(gateway, WAITERS, 0.0, Duration::from_secs(2)).await;
    assert_eq!(
        release(gateway, "gone", "owner").await,
        StatusCode::NO_CONTENT
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get_lock(gateway, "gone").await.0, StatusCode::NOT_FOUND);

    // A client that goes away while its SET is out (the broker frozen):
    // the SET applies once the broker moves again, and is released.
    let in_flight = "statestore_gateway_store_requests_in_flight ";
    stack.broker.pause();
    let socket = raw_acquire(gateway, "gone", "ghost").await;
    wait_metric(gateway, in_flight, 1.0, Duration::from_secs(5)).await;
    drop(socket);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stack.broker.resume();
    wait_metric(gateway, in_flight, 0.0, Duration::from_secs(5)).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (status, body) = get_lock(gateway, "gone").await;
        if status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ghost still holds the lock: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ghost_sets =
        "statestore_gateway_store_request_duration_seconds_count{op=\"VDEL\",outcome=\"ok\"} ";
    assert!(
        metric(gateway, ghost_sets).await >= 2.0,
        "the ghost's SET was released with VDEL"
    );
}

/// The most common client pattern: a request times out on the client
/// while its SET is out (the store frozen with SIGSTOP), and the client
/// retries as the same holder. The first request's clean-up must release
/// only what its own SET took, never the hold the retry was answered 200
/// for: afterwards the lock is the retry's, and another holder is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_holder_retry_after_a_client_timeout_keeps_the_lock() {
    let broker = Mosquitto::start().await;
    let store = EmulatorProcess::start(&broker, &[]).await;
    let gateway = Gateway::start(broker.port(), GatewayOptions::default()).await;
    gateway.wait_ready().await;
    let api = Api::of(&gateway);

    store.pause();
    let abandoned = api
        .http
        .put(lock_url(&api, "rr", "holder=W&ttl=60s"))
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    assert!(
        abandoned.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the client gives up while the store is frozen: {abandoned:?}"
    );
    let retry = tokio::spawn({
        let api = api.clone();
        async move { put_lock(&api, "rr", "holder=W&ttl=60s").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.resume();
    let (status, body, _) = tokio::time::timeout(Duration::from_secs(15), retry)
        .await
        .expect("the retry is answered")
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    // Let any clean-up of the abandoned request reach the store.
    wait_metric(
        &api,
        "statestore_gateway_store_requests_in_flight ",
        0.0,
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, body) = get_lock(&api, "rr").await;
    assert_eq!(status, StatusCode::OK, "the retry's hold is gone: {body}");
    assert_eq!(body["holder"], "W");
    let (status, body, _) = put_lock(&api, "rr", "holder=Z&ttl=60s").await;
    assert_eq!(status, StatusCode::CONFLICT, "a second holder: {body}");
}

#[tokio::test]
async fn many_waiters_share_one_registration_and_each_release_wakes_one() {
    const COUNT: usize = 1_000;
    // Both ends of 1,000 connections live in this process: more than the
    // usual soft limit of 1,024 open files.
    let limit = rlimit::increase_nofile_limit(u64::MAX).expect("raise the open-file limit");
    assert!(
        limit >= 2 * COUNT as u64 + 256,
        "the open-file limit {limit} is too low for {COUNT} waiters"
    );
    let stack = Stack::start().await;
    let gateway = &Api::of(&stack.gateway);
    acquire(gateway, "crowded", "first", "30s", "0")
        .await
        .unwrap();
    let keynotify =
        "statestore_gateway_store_request_duration_seconds_count{op=\"KEYNOTIFY\",outcome=\"ok\"} ";
    let before = metric(gateway, keynotify).await;
    let (done, mut results) = tokio::sync::mpsc::unbounded_channel();
    for index in 0..COUNT {
        let gateway = gateway.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let holder = format!("w{index}");
            let query = format!("holder={holder}&ttl=30s&wait=60s");
            let (status, _, _) = put_lock(&gateway, "crowded", &query).await;
            let _ = done.send((holder, status));
        });
    }
    wait_metric(gateway, WAITERS, COUNT as f64, Duration::from_secs(20)).await;
    assert_eq!(metric(gateway, keynotify).await - before, 1.0);
    assert_eq!(
        metric(gateway, "statestore_gateway_watched_keys ").await,
        1.0
    );
    let contention = "statestore_gateway_lock_contention_total ";
    let mut holder = "first".to_owned();
    for round in 0..5 {
        let contended = metric(gateway, contention).await;
        assert_eq!(
            release(gateway, "crowded", &holder).await,
            StatusCode::NO_CONTENT
        );
        let (next, status) = tokio::time::timeout(Duration::from_secs(5), results.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status, StatusCode::OK, "round {round}");
        // Exactly one waiter got it; the others stay parked.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            results.try_recv().is_err(),
            "round {round}: a second waiter returned"
        );
        assert_eq!(metric(gateway, WAITERS).await, (COUNT - round - 1) as f64);
        // No stampede: at most a couple of failed SETs per hand-over.
        let failed = metric(gateway, contention).await - contended;
        assert!(failed <= 2.0, "round {round}: {failed} failed SETs");
        holder = next;
    }
}

/// One hold in the mixed-contention run.
#[derive(Debug, Clone)]
struct Hold {
    holder: String,
    token: Hlc,
    acquired: Instant,
    releasing: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_sdk_contenders_never_hold_together_and_fencing_follows_acquisition() {
    let stack = Stack::start().await;
    let port = stack.broker.port();
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let fenced_off = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for index in 0..3 {
        let gateway = Api::of(&stack.gateway);
        let holds = Arc::clone(&holds);
        let fenced_off = Arc::clone(&fenced_off);
        tasks.push(tokio::spawn(async move {
            let holder = format!("http-{index}");
            while Instant::now() < until {
                let Some(token) = acquire(&gateway, "mixed", &holder, "10s", "10s").await else {
                    continue;
                };
                let acquired = Instant::now();
                assert_eq!(
                    fenced_put(
                        &gateway,
                        "fenced-counter",
                        &token,
                        format!("{holder} {token}")
                    )
                    .await,
                    StatusCode::OK,
                    "{holder}'s fenced write"
                );
                // While we hold it, the holders before us are fenced off.
                let earlier = holds
                    .lock()
                    .unwrap()
                    .last()
                    .map(|hold: &Hold| hold.token.clone());
                if let Some(earlier) = earlier {
                    assert_eq!(
                        fenced_put(&gateway, "fenced-counter", &earlier, "stale".into()).await,
                        StatusCode::CONFLICT,
                        "a write fenced by {earlier} while {holder} holds {token}"
                    );
                    fenced_off.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                hold_briefly().await;
                let releasing = Instant::now();
                holds.lock().unwrap().push(Hold {
                    holder: holder.clone(),
                    token,
                    acquired,
                    releasing,
                });
                assert_eq!(
                    release(&gateway, "mixed", &holder).await,
                    StatusCode::NO_CONTENT
                );
            }
        }));
    }
    for index in 0..2 {
        let holds = Arc::clone(&holds);
        tasks.push(tokio::spawn(async move {
            let holder = format!("sdk-{index}");
            let sdk = SdkClient::connect(port, &holder);
            let lock = lock::Client::new(
                sdk.client.clone(),
                b"mixed".to_vec(),
                holder.clone().into_bytes(),
            )
            .unwrap();
            while Instant::now() < until {
                let token = lock
                    .lock(Duration::from_secs(10), TIMEOUT, None)
                    .await
                    .unwrap();
                let acquired = Instant::now();
                let written = sdk
                    .client
                    .set(
                        b"fenced-counter".to_vec(),
                        format!("{holder} {token}").into_bytes(),
                        TIMEOUT,
                        Some(token.clone()),
                        SetOptions::default(),
                    )
                    .await
                    .unwrap();
                assert!(written.response, "{holder}'s fenced write");
                hold_briefly().await;
                let releasing = Instant::now();
                holds.lock().unwrap().push(Hold {
                    holder: holder.clone(),
                    token: hlc(&token),
                    acquired,
                    releasing,
                });
                lock.unlock(TIMEOUT).await.unwrap();
            }
            sdk.close().await;
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .unwrap()
            .unwrap();
    }
    let mut holds = holds.lock().unwrap().clone();
    holds.sort_by(|a, b| a.token.cmp(&b.token));
    let fenced_off = fenced_off.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "{} holds, {fenced_off} stale writes refused during the run",
        holds.len()
    );
    assert!(
        fenced_off > 0,
        "no stale write was tried while another held the lock"
    );
    for side in ["http-", "sdk-"] {
        assert!(
            holds.iter().any(|hold| hold.holder.starts_with(side)),
            "the {side} side never acquired"
        );
    }
    // In token order each hold began after the one before started to
    // release: never two holders at once, and tokens follow acquisition.
    for pair in holds.windows(2) {
        assert!(pair[0].token < pair[1].token);
        assert!(
            pair[1].acquired > pair[0].releasing,
            "{} acquired before {} released",
            pair[1].holder,
            pair[0].holder
        );
    }
    // Only the newest holder's token is accepted by the fenced key now.
    let gateway = &Api::of(&stack.gateway);
    for hold in &holds[..holds.len() - 1] {
        assert_eq!(
            fenced_put(gateway, "fenced-counter", &hold.token, "stale".into()).await,
            StatusCode::CONFLICT,
            "{}",
            hold.holder
        );
    }
}

async fn hold_briefly() {
    let pause = rand::rng().random_range(1..20);
    tokio::time::sleep(Duration::from_millis(pause)).await;
}
