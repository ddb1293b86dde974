//! W3C Trace Context over the real stack: a client on mosquitto listening
//! on the store's request topic reads the user properties of the requests
//! each HTTP request causes.

use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;
use statestore_gateway::protocol::{REQUEST_TOPIC, Request};

use crate::support::emulator::{RawClient, WAIT, user_property};
use crate::support::gateway::{Gateway, Stack, encode, http_client};

const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

/// A sampled `traceparent` of trace `n`.
fn traceparent(n: u8) -> String {
    format!("00-{n:032x}-b7ad6b7169203331-01")
}

/// Listens on the request topic, as the store does.
struct Spy(RawClient);

impl Spy {
    async fn start(stack: &Stack) -> Self {
        let mut spy = RawClient::connect(&stack.broker, "trace-spy").await;
        spy.client
            .subscribe(REQUEST_TOPIC, QoS::AtLeastOnce)
            .await
            .unwrap();
        // Its own request coming back says the subscription is in place.
        let own = Request::Get {
            key: Bytes::from_static(b"spy-ready"),
        };
        spy.send(&own.encode(), &[]).await;
        spy.next_notification(WAIT).await.expect("own request seen");
        Self(spy)
    }

    /// The gateway's requests until `done` holds for what was seen, or
    /// the wait ends.
    async fn until(&mut self, done: impl Fn(&[Publish]) -> bool) -> Vec<Publish> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        while !done(&seen) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(publish) = self.0.next_notification(left).await else {
                break;
            };
            if publish.topic == REQUEST_TOPIC.as_bytes() {
                seen.push(publish);
            }
        }
        seen
    }

    /// What arrived within a short while.
    async fn drain(&mut self) -> Vec<Publish> {
        let mut seen = Vec::new();
        while let Some(publish) = self.0.next_notification(Duration::from_millis(300)).await {
            if publish.topic == REQUEST_TOPIC.as_bytes() {
                seen.push(publish);
            }
        }
        seen
    }
}

/// A request's verb (`KEYNOTIFY` with `STOP` as `STOP`).
fn verb(publish: &Publish) -> String {
    let text = String::from_utf8_lossy(&publish.payload);
    let parts: Vec<&str> = text.split("\r\n").collect();
    if parts.get(2) == Some(&"KEYNOTIFY") && parts.get(6) == Some(&"STOP") {
        return "STOP".into();
    }
    parts
        .get(2)
        .map_or_else(String::new, |verb| (*verb).to_owned())
}

/// The verbs of the requests carrying trace `n`.
fn verbs_of(seen: &[Publish], n: u8) -> Vec<String> {
    let parent = traceparent(n);
    seen.iter()
        .filter(|publish| user_property(publish, "traceparent") == Some(parent.as_str()))
        .map(verb)
        .collect()
}

fn traced(
    gateway: &Gateway,
    method: reqwest::Method,
    path: &str,
    n: u8,
) -> reqwest::RequestBuilder {
    gateway
        .http
        .request(method, gateway.url(path))
        .header("traceparent", traceparent(n))
        .header("tracestate", TRACESTATE)
}

#[tokio::test]
async fn every_store_request_carries_the_callers_trace_context() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let mut spy = Spy::start(&stack).await;
    use reqwest::Method;

    let put = traced(gw, Method::PUT, "/keys/traced", 1).body("v");
    assert!(put.send().await.unwrap().status().is_success());
    let get = traced(gw, Method::GET, "/keys/traced", 2);
    assert_eq!(get.send().await.unwrap().status(), 200);
    let list = traced(gw, Method::GET, "/keys?match=trac*", 3);
    assert_eq!(list.send().await.unwrap().status(), 200);
    let delete = traced(gw, Method::DELETE, "/keys/traced?value=v", 4);
    assert!(delete.send().await.unwrap().status().is_success());
    // Gone already: still a DEL.
    let delete = traced(gw, Method::DELETE, "/keys/traced", 9);
    assert_eq!(delete.send().await.unwrap().status(), 404);

    let seen = spy.until(|seen| seen.len() >= 5).await;
    assert_eq!(verbs_of(&seen, 1), ["SET"]);
    assert_eq!(verbs_of(&seen, 2), ["GET"]);
    assert_eq!(verbs_of(&seen, 3), ["SCAN"]);
    assert_eq!(verbs_of(&seen, 4), ["VDEL"]);
    assert_eq!(verbs_of(&seen, 9), ["DEL"]);
    for publish in &seen {
        assert_eq!(user_property(publish, "tracestate"), Some(TRACESTATE));
        // The store's envelope is all there beside it.
        for name in ["__srcId", "__ts", "__protVer"] {
            assert!(user_property(publish, name).is_some(), "{name}");
        }
    }

    // A batch: each op's request in the batch's trace.
    let batch = traced(gw, Method::POST, "/batch", 10)
        .header("content-type", "application/json")
        .body(r#"{"ops": [{"op": "set", "key": "b1", "value": "x"}, {"op": "get", "key": "b2"}]}"#);
    assert_eq!(batch.send().await.unwrap().status(), 200);
    let seen = spy.until(|seen| verbs_of(seen, 10).len() >= 2).await;
    let mut batched = verbs_of(&seen, 10);
    batched.sort();
    assert_eq!(batched, ["GET", "SET"]);

    // A watch registers its key (KEYNOTIFY, then GET) in the caller's
    // trace. On a new connection, so the listener's own head parser reads it.
    let watch = http_client()
        .get(gw.url("/watch/traced-watch"))
        .header("traceparent", traceparent(5))
        .header("tracestate", TRACESTATE)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let seen = spy.until(|seen| verbs_of(seen, 5).len() >= 2).await;
    assert_eq!(verbs_of(&seen, 5), ["KEYNOTIFY", "GET"]);
    drop(watch);
    spy.drain().await;

    // A lock: the try, the waiter's line (its KEYNOTIFY is the first
    // waiter's), and the release, each in its own request's trace.
    let take = traced(gw, Method::PUT, "/locks/door?holder=a&ttl=10s", 6);
    assert_eq!(take.send().await.unwrap().status(), 200);
    let waiter = traced(gw, Method::PUT, "/locks/door?holder=b&ttl=10s&wait=10s", 7).send();
    let waiter = tokio::spawn(waiter);
    let seen_waiting = spy
        .until(|seen| verbs_of(seen, 7).contains(&"KEYNOTIFY".into()))
        .await;
    let release = traced(gw, Method::DELETE, "/locks/door?holder=a", 8);
    assert!(release.send().await.unwrap().status().is_success());
    let acquired = tokio::time::timeout(WAIT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(acquired.status(), 200);
    let mut seen = seen_waiting;
    seen.extend(spy.drain().await);
    assert_eq!(verbs_of(&seen, 6), ["SET"]);
    let waited = verbs_of(&seen, 7);
    assert!(
        waited.starts_with(&["SET".into()]) && waited.contains(&"KEYNOTIFY".into()),
        "{waited:?}"
    );
    // It tried, queued, and took the lock after the release (the head of
    // the line may try once more in between).
    assert_eq!(waited.last().map(String::as_str), Some("SET"), "{waited:?}");
    assert!(
        waited.iter().filter(|v| *v == "SET").count() >= 2,
        "{waited:?}"
    );
    assert_eq!(verbs_of(&seen, 8), ["VDEL"]);
}

#[tokio::test]
async fn without_a_valid_traceparent_store_requests_carry_none() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let mut spy = Spy::start(&stack).await;

    let plain = gw.put(b"untraced", "v").await;
    assert!(plain.status().is_success());
    for malformed in [
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "garbage",
    ] {
        let response = gw
            .http
            .get(gw.url(&format!("/keys/{}", encode(b"untraced"))))
            .header("traceparent", malformed)
            .header("tracestate", TRACESTATE)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "a malformed traceparent is ignored");
    }
    let seen = spy.until(|seen| seen.len() >= 5).await;
    assert_eq!(seen.len(), 5);
    for publish in &seen {
        assert_eq!(user_property(publish, "traceparent"), None);
        assert_eq!(user_property(publish, "tracestate"), None);
    }
}
