//! Pub/sub delivery to the app, over a real mosquitto: events published
//! by `mosquitto_pub` reach an HTTP app (an axum server in the test) as
//! daprd delivers them, with routing rules, RETRY/DROP answers, retries
//! and dead letters, replicas sharing a subscription, declarative
//! subscriptions, and at least once across a gateway killed mid-delivery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use serde_json::{Value, json};

use crate::support::Mosquitto;
use crate::support::gateway_process::GatewayProcess;

/// One event as the app got it.
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    pub(crate) path: String,
    content_type: String,
    pubsubname: String,
    pub(crate) event: Value,
}

impl Delivered {
    /// The `n` the tests put in each event's data.
    fn n(&self) -> Option<i64> {
        self.event["data"]["n"].as_i64()
    }

    fn is_warmup(&self) -> bool {
        self.event["data"]["warmup"].is_boolean()
    }
}

/// How the app answers the `attempt`-th delivery (1 for the first) of an
/// event: its HTTP status and body, after a while.
pub(crate) type Answer = Arc<dyn Fn(&Delivered, usize) -> Reply + Send + Sync>;

pub(crate) struct Reply {
    status: u16,
    body: String,
    after: Duration,
}

fn reply(status: u16, body: &str) -> Reply {
    Reply {
        status,
        body: body.to_owned(),
        after: Duration::ZERO,
    }
}

#[derive(Clone)]
struct AppState {
    subscriptions: Option<Value>,
    delivered: Arc<Mutex<Vec<Delivered>>>,
    answer: Answer,
}

/// An HTTP app: `GET /dapr/subscribe` answers its subscriptions (404
/// without), every POST is recorded and answered by `answer`.
pub(crate) struct TestApp {
    pub(crate) port: u16,
    delivered: Arc<Mutex<Vec<Delivered>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn subscribe(State(state): State<AppState>) -> (StatusCode, String) {
    match &state.subscriptions {
        Some(list) => (StatusCode::OK, list.to_string()),
        None => (StatusCode::NOT_FOUND, String::new()),
    }
}

async fn event(
    State(state): State<AppState>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, String) {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let delivered = Delivered {
        path: format!("/{path}"),
        content_type: header("content-type"),
        pubsubname: header("pubsubname"),
        event: serde_json::from_str(&body).unwrap_or(Value::Null),
    };
    let attempt = {
        let mut all = state.delivered.lock().unwrap();
        all.push(delivered.clone());
        all.iter()
            .filter(|other| other.event["id"] == delivered.event["id"])
            .count()
    };
    if delivered.is_warmup() {
        return (StatusCode::OK, String::new());
    }
    let reply = (state.answer)(&delivered, attempt);
    tokio::time::sleep(reply.after).await;
    (StatusCode::from_u16(reply.status).unwrap(), reply.body)
}

impl TestApp {
    pub(crate) async fn start(subscriptions: Option<Value>, answer: Answer) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let state = AppState {
            subscriptions,
            delivered: delivered.clone(),
            answer,
        };
        let router = Router::new()
            .route("/dapr/subscribe", get(subscribe))
            .route("/{*path}", post(event))
            .with_state(state);
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Self {
            port,
            delivered,
            task,
        }
    }

    /// The events delivered so far, warm-ups left out.
    pub(crate) fn events(&self) -> Vec<Delivered> {
        self.delivered
            .lock()
            .unwrap()
            .iter()
            .filter(|event| !event.is_warmup())
            .cloned()
            .collect()
    }

    fn warmups(&self) -> usize {
        self.delivered
            .lock()
            .unwrap()
            .iter()
            .filter(|event| event.is_warmup())
            .count()
    }

    /// Waits until `done` holds for the events delivered (panics after `within`).
    pub(crate) async fn until(
        &self,
        what: &str,
        within: Duration,
        done: impl Fn(&[Delivered]) -> bool,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let events = self.events();
            if done(&events) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}; delivered: {events:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub(crate) fn success() -> Answer {
    Arc::new(|_, _| reply(200, ""))
}

/// `mosquitto_pub` of `message` to `topic`, QoS 1, MQTT5, with a content
/// type when given.
async fn publish(broker: &Mosquitto, topic: &str, message: &str, content_type: Option<&str>) {
    let mut command = tokio::process::Command::new("mosquitto_pub");
    command
        .args(["-h", "127.0.0.1", "-p", &broker.addr.port().to_string()])
        .args(["-V", "mqttv5", "-q", "1", "-t", topic, "-m", message]);
    if let Some(content_type) = content_type {
        command.args(["-D", "publish", "content-type", content_type]);
    }
    let status = tokio::time::timeout(Duration::from_secs(10), command.status())
        .await
        .expect("mosquitto_pub finishes")
        .expect("mosquitto_pub runs");
    assert!(status.success(), "mosquitto_pub failed: {status}");
}

/// Publishes warm-up events to `topic` until the app got one: the
/// gateway's subscription is in place from then on.
pub(crate) async fn until_subscribed(broker: &Mosquitto, app: &TestApp, topic: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let before = app.warmups();
    loop {
        // Every field a test's rules read, so that no rule fails on it.
        publish(
            broker,
            topic,
            r#"{"warmup":true,"n":-1,"kind":"warmup","level":"warmup"}"#,
            None,
        )
        .await;
        let wait = Instant::now() + Duration::from_millis(300);
        while Instant::now() < wait {
            if app.warmups() > before {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway did not subscribe to {topic} within 20 s"
        );
    }
}

/// A gateway delivering to the app on `app_port`.
async fn gateway(broker: &Mosquitto, app_port: u16, extra: &[&str]) -> GatewayProcess {
    let port = app_port.to_string();
    let mut args = vec!["--dapr-app-port", port.as_str()];
    args.extend_from_slice(extra);
    GatewayProcess::start(broker.addr.port(), &args).await
}

/// An MQTT client subscribed to `topic` (SUBACK received), whose messages
/// come on the receiver.
async fn listen(broker: &Mosquitto, topic: &str) -> tokio::sync::mpsc::UnboundedReceiver<Vec<u8>> {
    let mut options = MqttOptions::new(
        format!("listener-{:08x}", rand::random::<u32>()),
        "127.0.0.1",
        broker.addr.port(),
    );
    options.set_max_packet_size(Some(1 << 20));
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    client.subscribe(topic, QoS::AtLeastOnce).await.unwrap();
    let (messages, received) = tokio::sync::mpsc::unbounded_channel();
    let (subscribed, acked) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _client = client;
        let mut subscribed = Some(subscribed);
        while let Ok(event) = eventloop.poll().await {
            match event {
                Event::Incoming(Packet::SubAck(_)) => {
                    if let Some(subscribed) = subscribed.take() {
                        let _ = subscribed.send(());
                    }
                }
                Event::Incoming(Packet::Publish(publish))
                    if messages.send(publish.payload.to_vec()).is_err() =>
                {
                    return;
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(10), acked)
        .await
        .expect("SUBACK")
        .unwrap();
    received
}

/// Waits until metric `name` reaches `value` (the warm-up counts too).
async fn until_metric(gateway: &GatewayProcess, name: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = gateway.metric(name).await;
        if now >= value {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {now}, not {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn count_of(events: &[Delivered], n: i64) -> usize {
    events.iter().filter(|event| event.n() == Some(n)).count()
}

#[tokio::test]
async fn an_event_from_mosquitto_pub_reaches_the_apps_route_as_a_cloud_event() {
    let broker = Mosquitto::start().await;
    let app = TestApp::start(
        Some(json!([{"pubsubname": "pubsub", "topic": "orders", "route": "/orders"}])),
        success(),
    )
    .await;
    let _gateway = gateway(&broker, app.port, &[]).await;
    until_subscribed(&broker, &app, "orders").await;
    publish(&broker, "orders", r#"{"n":1}"#, None).await;
    let published = json!({"specversion": "1.0", "id": "ce-2", "source": "checkout", "type": "order.placed",
        "datacontenttype": "application/json", "data": {"n": 2}, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"});
    publish(
        &broker,
        "orders",
        &published.to_string(),
        Some("application/cloudevents+json"),
    )
    .await;
    publish(&broker, "orders", "plain text", None).await;
    app.until("three events", Duration::from_secs(10), |events| {
        events.len() >= 3
    })
    .await;
    let events = app.events();
    assert_eq!(events.len(), 3, "{events:#?}");
    for delivered in &events {
        assert_eq!(delivered.path, "/orders");
        assert_eq!(delivered.content_type, "application/cloudevents+json");
        assert_eq!(delivered.pubsubname, "pubsub");
    }
    // Not a CloudEvent: wrapped, as daprd wraps a published body.
    let wrapped = &events[0].event;
    assert_eq!(wrapped["specversion"], "1.0");
    assert_eq!(wrapped["topic"], "orders");
    assert_eq!(wrapped["pubsubname"], "pubsub");
    assert_eq!(wrapped["type"], "com.dapr.event.sent");
    assert_eq!(wrapped["datacontenttype"], "application/json");
    assert!(!wrapped["id"].as_str().unwrap().is_empty());
    // A CloudEvent: as it was published.
    assert_eq!(events[1].event, published);
    assert_eq!(events[2].event["data"], "plain text");
    assert_eq!(events[2].event["datacontenttype"], "text/plain");
}

#[tokio::test]
async fn routing_rules_send_each_event_to_the_first_route_it_matches() {
    let broker = Mosquitto::start().await;
    let app = TestApp::start(
        Some(
            json!([{"pubsubname": "pubsub", "topic": "things", "routes": {
            "rules": [
                {"match": "event.data.kind == \"widget\"", "path": "/widgets"},
                {"match": "event.type == \"special\" || event.data.n > 100", "path": "/special"}
            ],
            "default": "/things"}}]),
        ),
        success(),
    )
    .await;
    let _gateway = gateway(&broker, app.port, &[]).await;
    until_subscribed(&broker, &app, "things").await;
    publish(&broker, "things", r#"{"n":1,"kind":"widget"}"#, None).await;
    publish(&broker, "things", r#"{"n":2,"kind":"gadget"}"#, None).await;
    publish(&broker, "things", r#"{"n":300,"kind":"gadget"}"#, None).await;
    app.until("three events", Duration::from_secs(10), |events| {
        events.len() >= 3
    })
    .await;
    let paths: HashMap<i64, String> = app
        .events()
        .iter()
        .map(|event| (event.n().unwrap(), event.path.clone()))
        .collect();
    assert_eq!(paths[&1], "/widgets");
    assert_eq!(paths[&2], "/things");
    assert_eq!(paths[&300], "/special");
}

#[tokio::test]
async fn retry_then_success_is_delivered_twice_and_acknowledged_once() {
    let broker = Mosquitto::start().await;
    let subscriptions = json!([{"pubsubname": "pubsub", "topic": "jobs", "route": "/jobs"}]);
    // Event 1: RETRY (a 200 with the status), then 500, then SUCCESS.
    let answer: Answer = Arc::new(|delivered, attempt| match (delivered.n(), attempt) {
        (Some(1), 1) => reply(200, r#"{"status":"RETRY"}"#),
        (Some(1), 2) => reply(500, "busy"),
        _ => reply(200, r#"{"status":"SUCCESS"}"#),
    });
    let app = TestApp::start(Some(subscriptions), answer).await;
    let client_id = format!("gw-retry-{:08x}", rand::random::<u32>());
    let mut first = gateway(&broker, app.port, &["--client-id", &client_id]).await;
    until_subscribed(&broker, &app, "jobs").await;
    publish(&broker, "jobs", r#"{"n":1}"#, None).await;
    app.until("three attempts", Duration::from_secs(15), |events| {
        count_of(events, 1) >= 3
    })
    .await;
    // Every warm-up and event 1 acknowledged (a warm-up is one success).
    let successes = app.warmups() as f64 + 1.0;
    until_metric(
        &first,
        "statestore_gateway_pubsub_events_total{outcome=\"success\"}",
        successes,
    )
    .await;
    // Acknowledged once it succeeded: a gateway killed and started again
    // on the same session gets the events after it, not this one again.
    crate::support::send_signal(first.pid(), "KILL");
    first
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    let _second = gateway(&broker, app.port, &["--client-id", &client_id]).await;
    publish(&broker, "jobs", r#"{"n":2}"#, None).await;
    app.until("the next event", Duration::from_secs(15), |events| {
        count_of(events, 2) == 1
    })
    .await;
    let events = app.events();
    assert_eq!(count_of(&events, 1), 3, "{events:#?}");
    assert_eq!(count_of(&events, 2), 1, "{events:#?}");
}

#[tokio::test]
async fn a_dropped_event_goes_to_the_dead_letter_topic_and_is_not_delivered_again() {
    let broker = Mosquitto::start().await;
    let subscriptions = json!([{"pubsubname": "pubsub", "topic": "mail", "route": "/mail",
        "deadLetterTopic": "mail-dead"}]);
    let answer: Answer = Arc::new(|delivered, _| match delivered.n() {
        Some(1) => reply(200, r#"{"status":"DROP"}"#),
        Some(2) => reply(404, ""),
        _ => reply(200, ""),
    });
    let app = TestApp::start(Some(subscriptions), answer).await;
    let mut dead = listen(&broker, "mail-dead").await;
    let _gateway = gateway(&broker, app.port, &[]).await;
    until_subscribed(&broker, &app, "mail").await;
    publish(&broker, "mail", r#"{"n":1}"#, None).await;
    publish(&broker, "mail", r#"{"n":2}"#, None).await;
    publish(&broker, "mail", r#"{"n":3}"#, None).await;
    let mut letters = Vec::new();
    for _ in 0..2 {
        let letter = tokio::time::timeout(Duration::from_secs(10), dead.recv())
            .await
            .expect("a dead letter")
            .unwrap();
        letters.push(serde_json::from_slice::<Value>(&letter).unwrap()["n"].as_i64());
    }
    letters.sort();
    // The message as it was published.
    assert_eq!(letters, [Some(1), Some(2)]);
    app.until("event 3", Duration::from_secs(10), |events| {
        count_of(events, 3) == 1
    })
    .await;
    let events = app.events();
    assert_eq!(count_of(&events, 1), 1, "{events:#?}");
    assert_eq!(count_of(&events, 2), 1, "{events:#?}");
}

#[tokio::test]
async fn an_event_the_app_keeps_refusing_goes_to_the_dead_letter_topic_after_its_retries() {
    let broker = Mosquitto::start().await;
    let subscriptions = json!([{"pubsubname": "pubsub", "topic": "bills", "route": "/bills",
        "deadLetterTopic": "bills-dead"}]);
    let answer: Answer = Arc::new(|_, _| reply(503, "down"));
    let app = TestApp::start(Some(subscriptions), answer).await;
    let mut dead = listen(&broker, "bills-dead").await;
    let _gateway = gateway(&broker, app.port, &[]).await;
    until_subscribed(&broker, &app, "bills").await;
    publish(&broker, "bills", r#"{"n":7}"#, None).await;
    let letter = tokio::time::timeout(Duration::from_secs(30), dead.recv())
        .await
        .expect("a dead letter once the retries are spent")
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&letter).unwrap(),
        json!({"n": 7})
    );
    // Five calls (Dapr's policy as the gateway applies it), then no more.
    let events = app.events();
    assert_eq!(count_of(&events, 7), 5, "{events:#?}");
}

#[tokio::test]
async fn replicas_of_one_app_share_a_subscription_each_event_reaches_one() {
    let broker = Mosquitto::start().await;
    let subscriptions = json!([{"pubsubname": "pubsub", "topic": "shared", "route": "/shared"}]);
    let app_a = TestApp::start(Some(subscriptions.clone()), success()).await;
    let app_b = TestApp::start(Some(subscriptions), success()).await;
    let _a = gateway(&broker, app_a.port, &["--dapr-app-id", "billing"]).await;
    let _b = gateway(&broker, app_b.port, &["--dapr-app-id", "billing"]).await;
    until_subscribed(&broker, &app_a, "shared").await;
    until_subscribed(&broker, &app_b, "shared").await;
    for n in 0..20 {
        publish(&broker, "shared", &format!(r#"{{"n":{n}}}"#), None).await;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let total = app_a.events().len() + app_b.events().len();
        if total >= 20 {
            break;
        }
        assert!(Instant::now() < deadline, "{total} of 20 events delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut all: Vec<i64> = app_a
        .events()
        .iter()
        .chain(app_b.events().iter())
        .map(|event| event.n().unwrap())
        .collect();
    all.sort();
    assert_eq!(all, (0..20).collect::<Vec<_>>(), "each event exactly once");
    assert!(!app_a.events().is_empty() && !app_b.events().is_empty());
}

#[tokio::test]
async fn a_gateway_killed_mid_delivery_delivers_again_and_events_published_while_down_arrive() {
    let broker = Mosquitto::start().await;
    let subscriptions =
        json!([{"pubsubname": "pubsub", "topic": "payments", "route": "/payments"}]);
    // The first delivery of event 1 is never answered in time: the
    // gateway is killed while the app holds it.
    let answer: Answer = Arc::new(|delivered, attempt| {
        let mut answer = reply(200, "");
        if delivered.n() == Some(1) && attempt == 1 {
            answer.after = Duration::from_secs(30);
        }
        answer
    });
    let app = TestApp::start(Some(subscriptions), answer).await;
    let client_id = format!("gw-kill-{:08x}", rand::random::<u32>());
    let mut first = gateway(&broker, app.port, &["--client-id", &client_id]).await;
    until_subscribed(&broker, &app, "payments").await;
    publish(&broker, "payments", r#"{"n":1}"#, None).await;
    app.until("the first delivery", Duration::from_secs(10), |events| {
        count_of(events, 1) == 1
    })
    .await;
    crate::support::send_signal(first.pid(), "KILL");
    first
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    // Published while no gateway runs: kept in the session.
    publish(&broker, "payments", r#"{"n":2}"#, None).await;
    let _second = gateway(&broker, app.port, &["--client-id", &client_id]).await;
    app.until(
        "event 1 again and event 2",
        Duration::from_secs(20),
        |events| count_of(events, 1) == 2 && count_of(events, 2) == 1,
    )
    .await;
}

#[tokio::test]
async fn declarative_subscriptions_are_read_from_yaml_with_their_scopes() {
    let broker = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("subscriptions.yaml"),
        r#"apiVersion: dapr.io/v2alpha1
kind: Subscription
metadata:
  name: telemetry
spec:
  pubsubname: pubsub
  topic: telemetry
  routes:
    rules:
      - match: event.data.level == "alarm"
        path: /alarms
    default: /telemetry
scopes:
  - monitor
---
apiVersion: dapr.io/v1alpha1
kind: Subscription
metadata:
  name: not-ours
spec:
  pubsubname: pubsub
  topic: elsewhere
  route: /elsewhere
scopes:
  - someone-else
"#,
    )
    .unwrap();
    // The app itself subscribes to nothing (404).
    let app = TestApp::start(None, success()).await;
    let path = dir.path().to_str().unwrap().to_owned();
    let gateway = gateway(
        &broker,
        app.port,
        &["--dapr-subscriptions", &path, "--dapr-app-id", "monitor"],
    )
    .await;
    until_subscribed(&broker, &app, "telemetry").await;
    // Metadata lists it as daprd does.
    let metadata: Value = gateway
        .http
        .get(gateway.url("/v1.0/metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        metadata["subscriptions"],
        json!([{"pubsubname": "pubsub", "topic": "telemetry", "deadLetterTopic": "",
            "type": "DECLARATIVE", "rules": [
                {"match": "event.data.level == \"alarm\"", "path": "/alarms"},
                {"path": "/telemetry"}]}])
    );
    assert_eq!(
        metadata["appConnectionProperties"],
        json!({"port": app.port, "protocol": "http", "channelAddress": "127.0.0.1"})
    );
    publish(&broker, "elsewhere", r#"{"n":9}"#, None).await;
    publish(&broker, "telemetry", r#"{"n":1,"level":"alarm"}"#, None).await;
    publish(&broker, "telemetry", r#"{"n":2,"level":"info"}"#, None).await;
    app.until("two events", Duration::from_secs(10), |events| {
        events.len() >= 2
    })
    .await;
    let events = app.events();
    let paths: HashMap<i64, String> = events
        .iter()
        .map(|event| (event.n().unwrap(), event.path.clone()))
        .collect();
    assert_eq!(paths.get(&1).map(String::as_str), Some("/alarms"));
    assert_eq!(paths.get(&2).map(String::as_str), Some("/telemetry"));
    assert!(!paths.contains_key(&9), "{events:#?}");
}

/// A gRPC app written with the Python SDK's `dapr-ext-grpc` (`App`,
/// `@app.subscribe`): prints each event it gets as a JSON line; asks for
/// event 1 again once (RETRY), drops event 2.
const PYTHON_GRPC_APP: &str = r#"
import json, sys
from dapr.ext.grpc import App
from dapr.clients.grpc._response import TopicEventResponse

app = App()
seen = {}

@app.subscribe(pubsub_name="pubsub", topic="grpc-orders")
def orders(event):
    data = json.loads(event.data)
    seen[event.id] = seen.get(event.id, 0) + 1
    print(json.dumps({"id": event.id, "type": event.type, "topic": event.subject,
                      "content_type": event.content_type, "data": data,
                      "attempt": seen[event.id]}), flush=True)
    if data.get("n") == 1 and seen[event.id] == 1:
        return TopicEventResponse("retry")
    if data.get("n") == 2:
        return TopicEventResponse("drop")
    return TopicEventResponse("success")

app.run(int(sys.argv[1]))
"#;

#[tokio::test]
async fn a_grpc_app_of_the_python_sdk_gets_its_events_through_on_topic_event() {
    let broker = Mosquitto::start().await;
    let port = crate::support::free_port();
    let port_text = port.to_string();
    let (_child, lines) = python(PYTHON_GRPC_APP, &[&port_text], &[]);
    let _gateway = GatewayProcess::start(
        broker.addr.port(),
        &["--dapr-app-port", &port_text, "--dapr-app-protocol", "grpc"],
    )
    .await;
    let got = |n: i64| with_n(&lines, n);
    warm_up(&broker, "grpc-orders", &lines).await;
    publish(&broker, "grpc-orders", r#"{"n":1}"#, None).await;
    publish(&broker, "grpc-orders", r#"{"n":2}"#, None).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while got(1).len() < 2 || got(2).is_empty() {
        assert!(
            Instant::now() < deadline,
            "events 1 (twice) and 2 not delivered: {:?}",
            lines.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = &got(1)[0];
    assert_eq!(first["topic"], "grpc-orders");
    assert_eq!(first["type"], "com.dapr.event.sent");
    assert_eq!(first["content_type"], "application/json");
    assert_eq!(got(1)[1]["attempt"], 2);
    assert_eq!(got(1)[0]["id"], got(1)[1]["id"]);
    assert_eq!(got(2).len(), 1);
}

/// The Python SDK's streaming subscription (`client.subscribe`): an app
/// with no server of its own. Answers RETRY to event 1's first delivery,
/// DROP to event 2, SUCCESS otherwise; prints each message as a JSON line.
const PYTHON_STREAMING: &str = r#"
import json, sys, time
from dapr.clients import DaprClient

with DaprClient() as client:
    subscription = client.subscribe(pubsub_name="pubsub", topic="streamed", dead_letter_topic="streamed-dead")
    print(json.dumps({"subscribed": True}), flush=True)
    seen = {}
    deadline = time.time() + 60
    while time.time() < deadline:
        message = subscription.next_message()
        if message is None:
            continue
        data = message.data()
        seen[message.id()] = seen.get(message.id(), 0) + 1
        print(json.dumps({"id": message.id(), "topic": message.topic(), "data": data,
                          "attempt": seen[message.id()]}), flush=True)
        n = data.get("n") if isinstance(data, dict) else None
        if n == 1 and seen[message.id()] == 1:
            subscription.respond_retry(message)
        elif n == 2:
            subscription.respond_drop(message)
        else:
            subscription.respond_success(message)
        if n == 3:
            break
    subscription.close()
"#;

#[tokio::test]
async fn the_python_sdks_streaming_subscription_gets_events_and_answers_them() {
    let broker = Mosquitto::start().await;
    // No app port: the app has no server, only the stream.
    let gateway = GatewayProcess::start(broker.addr.port(), &[]).await;
    let mut dead = listen(&broker, "streamed-dead").await;
    let port = gateway.api.port().to_string();
    let (mut child, lines) = python(
        PYTHON_STREAMING,
        &[],
        &[
            ("DAPR_RUNTIME_HOST", "127.0.0.1"),
            ("DAPR_HTTP_PORT", &port),
            ("DAPR_GRPC_PORT", &port),
        ],
    );
    let got = |n: i64| with_n(&lines, n);
    warm_up(&broker, "streamed", &lines).await;
    // Listed as a streaming subscription while it lasts.
    let metadata: Value = gateway
        .http
        .get(gateway.url("/v1.0/metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["subscriptions"][0]["type"], "STREAMING");
    assert_eq!(metadata["subscriptions"][0]["topic"], "streamed");
    publish(&broker, "streamed", r#"{"n":1}"#, None).await;
    publish(&broker, "streamed", r#"{"n":2}"#, None).await;
    let letter = tokio::time::timeout(Duration::from_secs(15), dead.recv())
        .await
        .expect("the dropped event on the dead letter topic")
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&letter).unwrap(),
        json!({"n": 2})
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while got(1).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "event 1 not sent again: {:?}",
            lines.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got(1)[0]["id"], got(1)[1]["id"]);
    assert_eq!(got(1)[0]["topic"], "streamed");
    publish(&broker, "streamed", r#"{"n":3}"#, None).await;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the script ends after event 3")
        .unwrap();
    assert!(status.success(), "{:?}", lines.lock().unwrap());
    assert_eq!(got(2).len(), 1);
}

#[tokio::test]
async fn a_bulk_subscription_gets_events_in_calls_and_answers_each_entry() {
    let broker = Mosquitto::start().await;
    let subscriptions = json!([{"pubsubname": "pubsub", "topic": "batch", "route": "/bulk",
        "deadLetterTopic": "batch-dead",
        "bulkSubscribe": {"enabled": true, "maxMessagesCount": 10, "maxAwaitDurationMs": 500}}]);
    // Per entry: event 2 RETRY once, event 3 DROP, the others SUCCESS.
    let retried = Arc::new(Mutex::new(false));
    let answer: Answer = Arc::new(move |delivered, _| {
        let statuses: Vec<Value> = delivered.event["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|entry| {
                let status = match entry["event"]["data"]["n"].as_i64() {
                    Some(2) if !std::mem::replace(&mut *retried.lock().unwrap(), true) => "RETRY",
                    Some(3) => "DROP",
                    _ => "SUCCESS",
                };
                json!({"entryId": entry["entryId"], "status": status})
            })
            .collect();
        reply(200, &json!({ "statuses": statuses }).to_string())
    });
    let app = TestApp::start(Some(subscriptions), answer).await;
    let mut dead = listen(&broker, "batch-dead").await;
    let _gateway = gateway(&broker, app.port, &[]).await;
    let ns = |events: &[Delivered]| -> Vec<i64> {
        events
            .iter()
            .flat_map(|call| {
                call.event["entries"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|entry| entry["event"]["data"]["n"].as_i64())
            .collect()
    };
    // Warm up until a call arrived.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ns(&app.events()).contains(&0) {
        assert!(Instant::now() < deadline, "no bulk call within 20 s");
        publish(&broker, "batch", r#"{"n":0}"#, None).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let calls_before = app.events().len();
    for n in 1..=4 {
        publish(&broker, "batch", &format!(r#"{{"n":{n}}}"#), None).await;
    }
    let letter = tokio::time::timeout(Duration::from_secs(10), dead.recv())
        .await
        .expect("the dropped entry on the dead letter topic")
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&letter).unwrap(),
        json!({"n": 3})
    );
    app.until("event 2 again", Duration::from_secs(10), |events| {
        ns(events).iter().filter(|&&n| n == 2).count() == 2
    })
    .await;
    let calls = app.events();
    let later = &calls[calls_before..];
    // Daprd's bulk shape: one call held several events.
    assert_eq!(later[0].path, "/bulk");
    assert_eq!(later[0].content_type, "application/json");
    assert_eq!(later[0].event["topic"], "batch");
    assert_eq!(later[0].event["pubsubname"], "pubsub");
    assert_eq!(later[0].event["type"], "com.dapr.event.sent.bulk");
    // daprd adds the pub/sub's name to a bulk message's metadata, which
    // also goes out as a header.
    assert_eq!(later[0].event["metadata"], json!({"pubsubName": "pubsub"}));
    assert_eq!(later[0].pubsubname, "pubsub");
    assert!(
        later
            .iter()
            .any(|call| call.event["entries"].as_array().unwrap().len() > 1),
        "{later:#?}"
    );
    let entry = &later[0].event["entries"][0];
    assert_eq!(entry["contentType"], "application/cloudevents+json");
    assert!(entry["entryId"].is_string());
    // Warm-ups published meanwhile may come in these calls too.
    let mut delivered: Vec<i64> = ns(later).into_iter().filter(|&n| n != 0).collect();
    delivered.sort();
    assert_eq!(delivered, [1, 2, 2, 3, 4]);
}

/// A gRPC app of the Python SDK's `dapr-ext-grpc` with a bulk
/// subscription (declarative: the SDK's `subscribe` has no bulk option):
/// prints each `OnBulkTopicEvent` call's entry count and each event as
/// JSON lines; answers RETRY to event 2's first delivery, DROP to event 3.
const PYTHON_GRPC_BULK_APP: &str = r#"
import json, sys
from dapr.ext.grpc import App, _servicer
from dapr.clients.grpc._response import TopicEventResponse

bulk = _servicer._CallbackServicer.OnBulkTopicEvent
def counted(self, request, context):
    print(json.dumps({"bulk_call": len(request.entries), "type": request.type,
                      "path": request.path, "metadata": dict(request.metadata)}), flush=True)
    return bulk(self, request, context)
_servicer._CallbackServicer.OnBulkTopicEvent = counted

app = App()
seen = {}

@app.subscribe(pubsub_name="pubsub", topic="grpc-batch")
def batch(event):
    data = json.loads(event.data)
    seen[event.id] = seen.get(event.id, 0) + 1
    print(json.dumps({"id": event.id, "data": data, "attempt": seen[event.id]}), flush=True)
    if data.get("n") == 2 and seen[event.id] == 1:
        return TopicEventResponse("retry")
    if data.get("n") == 3:
        return TopicEventResponse("drop")
    return TopicEventResponse("success")

app.run(int(sys.argv[1]))
"#;

#[tokio::test]
async fn a_grpc_apps_bulk_subscription_gets_on_bulk_topic_event_and_answers_each_entry() {
    let broker = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The route is the topic: the path the SDK files its handler under.
    std::fs::write(
        dir.path().join("bulk.yaml"),
        r#"apiVersion: dapr.io/v2alpha1
kind: Subscription
metadata:
  name: grpc-batch
spec:
  pubsubname: pubsub
  topic: grpc-batch
  routes:
    default: grpc-batch
  deadLetterTopic: grpc-batch-dead
  bulkSubscribe:
    enabled: true
    maxMessagesCount: 10
    maxAwaitDurationMs: 500
"#,
    )
    .unwrap();
    let mut dead = listen(&broker, "grpc-batch-dead").await;
    let port = crate::support::free_port();
    let port_text = port.to_string();
    let (_child, lines) = python(PYTHON_GRPC_BULK_APP, &[&port_text], &[]);
    let path = dir.path().to_str().unwrap().to_owned();
    let _gateway = GatewayProcess::start(
        broker.addr.port(),
        &[
            "--dapr-app-port",
            &port_text,
            "--dapr-app-protocol",
            "grpc",
            "--dapr-subscriptions",
            &path,
        ],
    )
    .await;
    let got = |n: i64| with_n(&lines, n);
    warm_up(&broker, "grpc-batch", &lines).await;
    let calls_before = lines.lock().unwrap().len();
    for n in 1..=4 {
        publish(&broker, "grpc-batch", &format!(r#"{{"n":{n}}}"#), None).await;
    }
    let letter = tokio::time::timeout(Duration::from_secs(15), dead.recv())
        .await
        .expect("the dropped entry on the dead letter topic")
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&letter).unwrap(),
        json!({"n": 3})
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while got(2).len() < 2 || got(1).is_empty() || got(4).is_empty() {
        assert!(
            Instant::now() < deadline,
            "events 1, 2 (twice) and 4 not delivered: {:?}",
            lines.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every event came in a bulk call (entries counted = events printed,
    // once the calls in flight printed theirs).
    let in_bulk = |lines: &[Value]| {
        let entries: u64 = lines
            .iter()
            .filter_map(|line| line["bulk_call"].as_u64())
            .sum();
        let events = lines
            .iter()
            .filter(|line| line.get("data").is_some())
            .count();
        (entries, events as u64)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while {
        let (entries, events) = in_bulk(&lines.lock().unwrap());
        entries != events
    } {
        assert!(
            Instant::now() < deadline,
            "events not delivered in bulk calls: {:?}",
            lines.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = lines.lock().unwrap().clone();
    let calls: Vec<&Value> = all[calls_before..]
        .iter()
        .filter(|line| line.get("bulk_call").is_some())
        .collect();
    assert!(
        calls
            .iter()
            .any(|call| call["bulk_call"].as_u64() > Some(1)),
        "one call held several events: {all:?}"
    );
    assert_eq!(calls[0]["type"], "com.dapr.event.sent.bulk");
    assert_eq!(calls[0]["path"], "grpc-batch");
    assert_eq!(calls[0]["metadata"], json!({"pubsubName": "pubsub"}));
    assert_eq!(got(2)[0]["id"], got(2)[1]["id"]);
    assert_eq!(got(3).len(), 1);
    assert_eq!(got(1).len(), 1);
}

/// The JS SDK's `DaprServer` with one `server.pubsub.subscribe` handler:
/// prints each event's data as a JSON line, and exits once it got event 1.
const JS_SERVER: &str = r#"
import { CommunicationProtocolEnum, DaprServer } from "@dapr/dapr";
const server = new DaprServer({
  serverHost: "127.0.0.1",
  serverPort: process.env.APP_PORT,
  communicationProtocol: CommunicationProtocolEnum.HTTP,
  clientOptions: { daprHost: "127.0.0.1", daprPort: process.env.DAPR_HTTP_PORT,
                   communicationProtocol: CommunicationProtocolEnum.HTTP },
});
await server.pubsub.subscribe("pubsub", "js-orders", async (data) => {
  console.log(JSON.stringify({ data }));
  if (data && data.n === 1) { setTimeout(() => process.exit(0), 100); }
});
await server.start();
"#;

#[tokio::test]
async fn the_js_sdks_dapr_server_gets_its_subscribed_events() {
    let dapr_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dapr");
    assert!(
        dapr_dir
            .join("node_modules/@dapr/dapr/package.json")
            .is_file(),
        "the npm packages of tests/dapr are missing: run scripts/install-dapr-sdks"
    );
    let broker = Mosquitto::start().await;
    let app_port = crate::support::free_port();
    // The gateway starts first and waits for the app's port, as daprd does.
    let gateway = gateway(&broker, app_port, &[]).await;
    let mut child = tokio::process::Command::new("node")
        .args(["--input-type=module", "-e", JS_SERVER])
        .current_dir(&dapr_dir)
        .env("APP_PORT", app_port.to_string())
        .env("DAPR_HTTP_PORT", gateway.api.port().to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let lines = json_lines(&mut child);
    let got = |n: i64| {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|line| line["data"]["n"] == n)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !got(0) {
        assert!(
            Instant::now() < deadline,
            "the JS app got no event within 30 s"
        );
        publish(&broker, "js-orders", r#"{"n":0}"#, None).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    publish(&broker, "js-orders", r#"{"n":1}"#, None).await;
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the JS app ends once it got event 1")
        .unwrap();
    assert!(status.success());
    assert!(got(1));
}

/// A Python program run by the SDK tests' environment (`tests/dapr/.venv`)
/// with `args` and `envs`, and the JSON lines it prints, gathered as they
/// come; killed when the child is dropped.
fn python(
    script: &str,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (tokio::process::Child, Arc<Mutex<Vec<Value>>>) {
    let venv_python =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dapr/.venv/bin/python");
    assert!(
        venv_python.is_file(),
        "the Python environment tests/dapr/.venv is missing: run scripts/install-dapr-sdks"
    );
    let mut child = tokio::process::Command::new(venv_python)
        .arg("-c")
        .arg(script)
        .args(args)
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs");
    let lines = json_lines(&mut child);
    (child, lines)
}

/// The lines about event `n` (`data.n`).
fn with_n(lines: &Mutex<Vec<Value>>, n: i64) -> Vec<Value> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line["data"]["n"] == n)
        .cloned()
        .collect()
}

/// Publishes event 0 on `topic` until a line tells of it: the
/// subscription is in place.
async fn warm_up(broker: &Mosquitto, topic: &str, lines: &Mutex<Vec<Value>>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while with_n(lines, 0).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no event on {topic} within 30 s: {:?}",
            lines.lock().unwrap()
        );
        publish(broker, topic, r#"{"n":0}"#, None).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The JSON lines a child prints on its stdout, gathered as they come.
fn json_lines(child: &mut tokio::process::Child) -> Arc<Mutex<Vec<Value>>> {
    let lines = Arc::new(Mutex::new(Vec::<Value>::new()));
    let gathered = lines.clone();
    let stdout = child.stdout.take().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt as _;
        let mut reader = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if let Ok(value) = serde_json::from_str(&line) {
                gathered.lock().unwrap().push(value);
            }
        }
    });
    lines
}

/// The subscriber's connection cut by the fault proxy while it holds an
/// unacknowledged message: that copy says it is stale (whoever retries it
/// stops, instead of running beside the copy the broker sends again), and
/// the copy of the resumed session is not.
#[tokio::test]
async fn a_message_from_a_lost_connection_is_stale_and_the_resumed_sessions_copy_is_not() {
    use statestore_gateway::mqtt::{BrokerSettings, Subscriber, SubscriberSettings};
    const WAIT: Duration = Duration::from_secs(15);

    let broker = Mosquitto::start().await;
    let proxy = crate::support::fault_proxy::FaultProxy::start(broker.addr).await;
    let settings = SubscriberSettings {
        broker: BrokerSettings::new("127.0.0.1", proxy.port()),
        client_id: format!("stale-{:08x}", rand::random::<u32>()),
        session_expiry: Duration::from_secs(60),
        receive_maximum: 8,
        filters: vec!["stale/t".to_owned()],
    };
    let (subscriber, mut received) = Subscriber::start(settings);
    let mut subscribed = subscriber.subscribed();
    tokio::time::timeout(WAIT, subscribed.wait_for(|granted| *granted))
        .await
        .expect("subscribed within the wait")
        .expect("the subscriber runs");

    publish(&broker, "stale/t", "one", None).await;
    let first = tokio::time::timeout(WAIT, received.recv())
        .await
        .expect("delivered within the wait")
        .expect("the subscriber runs");
    assert_eq!(&first.payload[..], b"one");
    assert!(!first.is_stale());

    proxy.cut_all();
    let again = tokio::time::timeout(WAIT, received.recv())
        .await
        .expect("sent again within the wait")
        .expect("the subscriber runs");
    assert_eq!(&again.payload[..], b"one");
    assert!(again.redelivered);
    assert!(first.is_stale(), "the first copy's connection is gone");
    assert!(!again.is_stale());
    again.ack();
    drop(first);
    subscriber.shutdown().await;
}
