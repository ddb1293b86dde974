//! W3C Trace Context over the real stack: a client on mosquitto listening
//! on the store's request topic reads the user properties of the requests
//! each HTTP request causes; with span export on, a real OTLP/HTTP
//! receiver gets the gateway's spans.

use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;
use statestore_gateway::protocol::{REQUEST_TOPIC, Request};

use crate::support::emulator::{RawClient, WAIT, start_emulator, user_property};
use crate::support::gateway::{Gateway, Stack, encode, http_client};
use crate::support::gateway_process::GatewayProcess;
use crate::support::otlp::{OtlpReceiver, ReceivedSpan};
use crate::support::{Mosquitto, free_port};

const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

/// A sampled `traceparent` of trace `n`.
fn traceparent(n: u8) -> String {
    format!("00-{n:032x}-b7ad6b7169203331-01")
}

/// Listens on the request topic, as the store does.
struct Spy(RawClient);

impl Spy {
    async fn start(broker: &Mosquitto) -> Self {
        let mut spy = RawClient::connect(broker, "trace-spy").await;
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
    let mut spy = Spy::start(&stack.broker).await;
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
    let mut spy = Spy::start(&stack.broker).await;

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

/// The binary's own JSON logs (`--log-format json`, in its own process: the
/// log subscriber is process-wide): a traced request's failure line sits in
/// a span with the caller's trace and span ids, an untraced one's in none.
#[tokio::test]
async fn json_log_lines_of_a_traced_request_carry_its_trace_and_span_ids() {
    let broker = Mosquitto::start().await;
    let gateway = GatewayProcess::start_keeping_stderr(
        broker.port(),
        &["--log-format", "json"],
        &[("RUST_LOG", "info")],
    )
    .await;
    for traceparent in [
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        None,
    ] {
        let mut request = gateway.http.get(gateway.url("/nothing"));
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        assert_eq!(request.send().await.unwrap().status(), 404);
    }
    let failures = |lines: &[String]| -> Vec<serde_json::Value> {
        lines
            .iter()
            .filter_map(|line| serde_json::from_str(line).ok())
            .filter(|line: &serde_json::Value| line["message"] == "request failed")
            .collect()
    };
    let lines = gateway
        .stderr()
        .until(|lines| failures(lines).len() >= 2, WAIT)
        .await;
    let failures = failures(&lines);
    assert_eq!(failures.len(), 2, "{lines:#?}");
    assert_eq!(
        failures[0]["span"]["trace_id"], "0af7651916cd43dd8448eb211c80319c",
        "{}",
        failures[0]
    );
    assert_eq!(failures[0]["span"]["span_id"], "b7ad6b7169203331");
    assert!(failures[1].get("span").is_none(), "{}", failures[1]);
}

/// `count` distinct valid `tracestate` members (`abc=0`), joined: 6 bytes
/// each.
fn many_state_members(count: usize) -> String {
    const FIRST: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    const REST: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..count)
        .map(|n| {
            let key = [FIRST[n / (36 * 36) % 26], REST[n / 36 % 36], REST[n % 36]];
            format!("{}=0", String::from_utf8_lossy(&key))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A `tracestate` of 10,000 distinct members (60 KB) costs the gateway
/// about what any other header of that size costs: it stops reading at
/// the limits. Measured as the gateway's CPU time for requests refused
/// before authentication (401), against the same requests with the bytes
/// in another header.
#[tokio::test]
async fn a_huge_tracestate_costs_what_any_header_of_its_size_costs() {
    let broker = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t0ken").unwrap();
    let gateway = GatewayProcess::start(
        broker.port(),
        &["--api-token-file", token_file.to_str().unwrap()],
    )
    .await;
    let members = many_state_members(10_000);
    assert!(members.len() >= 59_000, "{}", members.len());
    const REQUESTS: usize = 3;
    let cpu_of = |header: &'static str| {
        let gateway = &gateway;
        let members = members.clone();
        async move {
            let before = gateway.cpu_time();
            for _ in 0..REQUESTS {
                let response = gateway
                    .http
                    .get(gateway.url("/keys/k"))
                    .header("traceparent", traceparent(1))
                    .header(header, &members)
                    .timeout(Duration::from_secs(120))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 401);
            }
            gateway.cpu_time() - before
        }
    };
    // Warm-up: the connection and the gateway's buffers.
    cpu_of("x-filler").await;
    let baseline = cpu_of("x-filler").await;
    let hostile = cpu_of("tracestate").await;
    eprintln!(
        "gateway CPU for {REQUESTS} requests: {baseline:?} with 60 KB in x-filler, {hostile:?} in tracestate"
    );
    assert!(
        hostile <= baseline * 2 + Duration::from_millis(150),
        "{REQUESTS} requests with a 60 KB tracestate took {hostile:?} of CPU, \
         against {baseline:?} with the bytes in another header"
    );
}

/// Span export settings for a test: batches go out within 100 ms.
fn export_env(endpoint: &str) -> Vec<(&str, &str)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment.name=test,host.name=gw-test",
        ),
    ]
}

/// The spans of trace `trace_id` (hex).
fn of_trace<'a>(spans: &'a [ReceivedSpan], trace_id: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.trace_id() == trace_id).collect()
}

/// The one span named `name` among `spans`.
fn named<'a>(spans: &[&'a ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    let found: Vec<_> = spans.iter().filter(|s| s.span.name == name).collect();
    assert_eq!(found.len(), 1, "one {name} span in {spans:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_spans_chain_the_caller_the_request_and_its_store_requests() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let receiver = OtlpReceiver::start().await;
    let endpoint = receiver.endpoint();
    let gateway = GatewayProcess::start_with_env(broker.port(), &[], &export_env(&endpoint)).await;
    let mut spy = Spy::start(&broker).await;
    let caller_span = "b7ad6b7169203331";

    // A sampled caller: server span under the caller's, client span under it.
    let put = gateway
        .http
        .put(gateway.url("/keys/exported"))
        .header("traceparent", traceparent(1))
        .header("tracestate", TRACESTATE)
        .body("v");
    assert_eq!(put.send().await.unwrap().status(), 200);
    let trace_1 = format!("{:032x}", 1);
    let spans = receiver
        .spans_until(WAIT, |spans| of_trace(spans, &trace_1).len() >= 2)
        .await;
    let spans = of_trace(&spans, &trace_1);
    let server = named(&spans, "PUT /keys/{*key}");
    assert_eq!(server.parent_id(), caller_span);
    assert_eq!(server.span.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(
        server.attribute("http.request.method").as_deref(),
        Some("PUT")
    );
    assert_eq!(
        server.attribute("http.route").as_deref(),
        Some("/keys/{*key}")
    );
    assert_eq!(
        server.attribute("http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(server.span.trace_state, TRACESTATE);
    let client = named(&spans, "SET");
    assert_eq!(client.parent_id(), server.span_id());
    assert_eq!(client.span.kind, 3, "SPAN_KIND_CLIENT");
    assert_eq!(
        client.attribute("db.operation.name").as_deref(),
        Some("SET")
    );
    assert_eq!(
        client.attribute("statestore.outcome").as_deref(),
        Some("ok")
    );
    assert!(client.attribute("statestore.pool.member").is_some());
    assert!(client.attribute("messaging.client.id").is_some());
    assert!(client.attribute("statestore.pool.wait_us").is_some());
    for span in [server, client] {
        assert_eq!(span.resource("service.name"), Some("statestore-gateway"));
        assert_eq!(span.resource("deployment.environment.name"), Some("test"));
        assert_eq!(span.resource("host.name"), Some("gw-test"));
    }
    // The store request names the client span as its parent.
    let seen = spy.until(|seen| !seen.is_empty()).await;
    let sent = format!("00-{trace_1}-{}-01", client.span_id());
    assert_eq!(user_property(&seen[0], "traceparent"), Some(sent.as_str()));
    assert_eq!(user_property(&seen[0], "tracestate"), Some(TRACESTATE));

    // An unsampled caller: propagated unchanged, nothing exported.
    let unsampled = traceparent(2).replace("-01", "-00");
    let get = gateway
        .http
        .get(gateway.url("/keys/exported"))
        .header("traceparent", &unsampled);
    assert_eq!(get.send().await.unwrap().status(), 200);
    let seen = spy.until(|seen| !seen.is_empty()).await;
    assert_eq!(
        user_property(&seen[0], "traceparent"),
        Some(unsampled.as_str())
    );

    // No context: a new trace, its store request in it.
    let delete = gateway.http.delete(gateway.url("/keys/exported"));
    assert_eq!(delete.send().await.unwrap().status(), 204);
    let spans = receiver
        .spans_until(WAIT, |spans| {
            spans.iter().any(|s| s.span.name == "DELETE /keys/{*key}")
        })
        .await;
    let root = spans
        .iter()
        .find(|s| s.span.name == "DELETE /keys/{*key}")
        .unwrap();
    assert_eq!(root.parent_id(), "", "a root span");
    assert!(root.trace_id() != trace_1);
    let new_trace = of_trace(&spans, &root.trace_id());
    let del = named(&new_trace, "DEL");
    assert_eq!(del.parent_id(), root.span_id());
    let seen = spy.until(|seen| !seen.is_empty()).await;
    let sent = format!("00-{}-{}-01", root.trace_id(), del.span_id());
    assert_eq!(user_property(&seen[0], "traceparent"), Some(sent.as_str()));
    // Batches go out in order: the unsampled request's would be here by now.
    assert!(of_trace(&spans, &format!("{:032x}", 2)).is_empty());

    // A watch's server span ends once its stream is set up, while the
    // stream stays open.
    let watch = http_client()
        .get(format!("http://{}/watch/exported", gateway.api))
        .header("traceparent", traceparent(3))
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let trace_3 = format!("{:032x}", 3);
    let spans = receiver
        .spans_until(WAIT, |spans| {
            of_trace(spans, &trace_3)
                .iter()
                .any(|s| s.span.name == "GET /watch/{*key}")
        })
        .await;
    let spans = of_trace(&spans, &trace_3);
    let server = named(&spans, "GET /watch/{*key}");
    assert_eq!(server.parent_id(), caller_span);
    drop(watch);

    // A lock wait: one span with its outcome, under the request's span.
    let take = gateway
        .http
        .put(gateway.url("/locks/door?holder=a&ttl=10s"));
    assert_eq!(take.send().await.unwrap().status(), 200);
    let wait = gateway
        .http
        .put(gateway.url("/locks/door?holder=b&ttl=10s&wait=300ms"))
        .header("traceparent", traceparent(4));
    assert_eq!(wait.send().await.unwrap().status(), 409);
    let trace_4 = format!("{:032x}", 4);
    let spans = receiver
        .spans_until(WAIT, |spans| {
            of_trace(spans, &trace_4)
                .iter()
                .any(|s| s.span.name == "PUT /locks/{*name}")
        })
        .await;
    let spans = of_trace(&spans, &trace_4);
    let server = named(&spans, "PUT /locks/{*name}");
    assert_eq!(
        server.attribute("http.response.status_code").as_deref(),
        Some("409")
    );
    let waited = named(&spans, "lock wait");
    assert_eq!(waited.parent_id(), server.span_id());
    assert_eq!(
        waited.attribute("statestore.outcome").as_deref(),
        Some("timeout")
    );
    // The first try is the server span's; the line's registration is the wait's.
    let tries: Vec<_> = spans.iter().filter(|s| s.span.name == "SET").collect();
    assert!(tries.iter().any(|s| s.parent_id() == server.span_id()));
    assert!(
        spans
            .iter()
            .any(|s| s.span.name == "KEYNOTIFY" && s.parent_id() == waited.span_id()),
        "{spans:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_or_dead_collector_slows_no_request_and_its_lost_spans_are_counted() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    // A collector that takes connections and never answers.
    let stuck = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stuck_endpoint = format!("http://{}", stuck.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = stuck.accept().await {
            open.push(socket);
        }
    });
    let dead_endpoint = format!("http://127.0.0.1:{}", free_port());
    for (endpoint, reason) in [
        (&stuck_endpoint, "queue_full"),
        (&dead_endpoint, "export_failed"),
    ] {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "8"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ];
        let gateway = GatewayProcess::start_with_env(broker.port(), &[], &env).await;
        let mut slowest = Duration::ZERO;
        for i in 0..200 {
            let started = Instant::now();
            let put = gateway
                .http
                .put(gateway.url(&format!("/keys/lost-{i}")))
                .header("traceparent", traceparent(5))
                .body("v");
            assert_eq!(put.send().await.unwrap().status(), 200);
            slowest = slowest.max(started.elapsed());
        }
        // The export timeout is 10 s: a request waiting on it would show.
        assert!(
            slowest < Duration::from_millis(500),
            "{reason}: slowest request {slowest:?}"
        );
        let deadline = Instant::now() + WAIT;
        let metric = format!("statestore_gateway_trace_spans_dropped_total{{reason=\"{reason}\"}}");
        loop {
            let dropped = gateway.metric(&metric).await;
            if dropped > 0.0 {
                break;
            }
            assert!(Instant::now() < deadline, "{metric} stays at 0");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    held.abort();
}

/// A collector that takes connections and never answers holds an export
/// for its 10 s timeout; SIGTERM with `--shutdown-grace 2s` still ends the
/// process within the grace period and a second, spans left unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_stuck_collector_no_longer_than_the_grace_period() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let stuck = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", stuck.local_addr().unwrap());
    let (accepted, mut connections) = tokio::sync::mpsc::unbounded_channel();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = stuck.accept().await {
            open.push(socket);
            let _ = accepted.send(());
        }
    });
    let grace = Duration::from_secs(2);
    let mut gateway = GatewayProcess::start_with_env(
        broker.port(),
        &["--shutdown-grace", "2s"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    )
    .await;
    let put = gateway
        .http
        .put(gateway.url("/keys/stuck"))
        .header("traceparent", traceparent(6))
        .body("v");
    assert_eq!(put.send().await.unwrap().status(), 200);
    // An export is out, and its collector will never answer.
    tokio::time::timeout(WAIT, connections.recv())
        .await
        .expect("the gateway connects to the collector");
    let started = Instant::now();
    gateway.terminate();
    let exited = gateway.wait_exit(Duration::from_secs(15)).await;
    let took = started.elapsed();
    eprintln!("exited {took:?} after SIGTERM");
    assert!(exited.is_some_and(|status| status.success()), "{exited:?}");
    assert!(
        took <= grace + Duration::from_secs(1),
        "exited {took:?} after SIGTERM with a grace period of {grace:?}"
    );
    held.abort();
}

#[tokio::test]
async fn an_unsupported_export_protocol_stops_the_gateway_at_start() {
    let binary = env!("CARGO_BIN_EXE_statestore-gateway");
    for (name, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
    ] {
        let output = tokio::process::Command::new(binary)
            .arg("serve")
            .env_clear()
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            .env(name, value)
            .output();
        let output = tokio::time::timeout(WAIT, output).await.unwrap().unwrap();
        assert_eq!(output.status.code(), Some(2), "{name}={value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(name) && stderr.contains(value), "{stderr}");
    }
}
