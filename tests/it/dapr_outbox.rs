//! Dapr's transactional outbox over the broker: a committed transaction's
//! upserts reach a plain MQTT subscriber of the outbox topic as daprd's
//! CloudEvents, a transaction that did not commit publishes nothing, a
//! projection is published while the state keeps the real value, a
//! gateway killed between its commit and the publish publishes once it is
//! back, a Dapr app gets the events through delivery, and the Python and
//! JS SDKs run unchanged.

use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::v5::Publish;
use serde_json::{Value, json};
use statestore_gateway::dapr::{
    Change, DaprError, DaprSettings, DaprStore, OutboxSettings, Save, TxOperation, internal_topic,
};

use crate::pubsub_delivery::{TestApp, success, until_subscribed};
use crate::support::gateway::{GatewayOptions, Stack, http_client};
use crate::support::gateway_process::GatewayProcess;
use crate::support::topic_subscriber::TopicSubscriber;
use crate::support::{broker_store, raw_get, raw_set};

const WAIT: Duration = Duration::from_secs(15);
const APP_ID: &str = "checkout";
const TOPIC: &str = "orders-done";

/// A gateway with transactions and an outbox on `TOPIC` through `pubsub`.
async fn outbox_stack(etag_lease: Duration) -> Stack {
    Stack::builder()
        .gateway(GatewayOptions {
            dapr: DaprSettings {
                app_id: APP_ID.into(),
                transactions: true,
                etag_lease,
                outbox: Some(OutboxSettings {
                    pubsub: "pubsub".into(),
                    topic: TOPIC.into(),
                }),
                ..DaprSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await
}

fn cloud_event(message: &Publish) -> Value {
    let content_type = message
        .properties
        .as_ref()
        .and_then(|properties| properties.content_type.as_deref());
    assert_eq!(content_type, Some("application/cloudevents+json"));
    serde_json::from_slice(&message.payload).expect("a JSON CloudEvent")
}

async fn transaction(api: std::net::SocketAddr, body: Value) -> reqwest::Response {
    http_client()
        .post(format!("http://{api}/v1.0/state/statestore/transaction"))
        .json(&body)
        .send()
        .await
        .expect("the gateway answers")
}

async fn state(api: std::net::SocketAddr, key: &str) -> Value {
    let response = http_client()
        .get(format!("http://{api}/v1.0/state/statestore/{key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "GET {key}");
    response.json().await.unwrap()
}

/// The marker key of the event `id`.
fn marker(id: &str) -> Vec<u8> {
    format!("dapr-outbox||{id}").into_bytes()
}

/// The next `count` events on `subscriber`, in the order of their
/// content types (the relay publishes a transaction's events concurrently).
async fn events_by_content_type(subscriber: &mut TopicSubscriber, count: usize) -> Vec<Value> {
    let mut events = Vec::new();
    for _ in 0..count {
        events.push(cloud_event(&subscriber.next(WAIT).await));
    }
    events.sort_by_key(|event| event["datacontenttype"].as_str().map(str::to_owned));
    events
}

/// Waits until the marker of event `id` holds `value` (`None`: gone).
async fn until_marker(stack_broker: std::net::SocketAddr, id: &str, value: Option<&[u8]>) {
    let store = broker_store(stack_broker).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let now = raw_get(&store, &marker(id)).await;
        if now.as_deref() == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the marker of {id} is {now:?}, not {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_committed_transactions_upserts_are_published_as_daprs_cloudevents() {
    let stack = outbox_stack(Duration::from_secs(5)).await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, TOPIC).await;
    let response = transaction(
        stack.gateway.api,
        json!({"operations": [
            {"operation": "upsert", "request": {"key": "order-1", "value": "2",
                "metadata": {"outbox.cloudevent.myapp": "myapp1", "data": "a", "id": "b"}}},
            {"operation": "upsert", "request": {"key": "order-2", "value": {"n": 1},
                "metadata": {"contentType": "application/json"}}},
            {"operation": "delete", "request": {"key": "order-3"}},
        ]}),
    )
    .await;
    assert_eq!(response.status(), 204);
    let events = events_by_content_type(&mut subscriber, 2).await;
    let (json_event, text_event) = (&events[0], &events[1]);
    for event in &events {
        assert!(
            event["id"].as_str().unwrap().starts_with("outbox-"),
            "{event}"
        );
        assert_eq!(event["source"], APP_ID);
        assert_eq!(event["type"], "com.dapr.event.sent");
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["topic"], TOPIC);
        assert_eq!(event["pubsubname"], "pubsub");
        assert_eq!(event["traceid"].as_str().unwrap().len(), 55, "{event}");
        assert!(event["time"].is_string());
    }
    // daprd's basic outbox test: the op's metadata as attributes, but
    // `data` and `id`.
    assert_eq!(text_event["data"], "2");
    assert_eq!(text_event["datacontenttype"], "text/plain");
    assert_eq!(text_event["outbox.cloudevent.myapp"], "myapp1");
    assert_eq!(json_event["data"], json!({"n": 1}));
    assert_eq!(json_event["datacontenttype"], "application/json");
    assert_eq!(state(stack.gateway.api, "order-1").await, json!("2"));
    // Each marker is deleted once its event is out; the delete published
    // nothing.
    for event in &events {
        until_marker(stack.broker.addr, event["id"].as_str().unwrap(), None).await;
    }
    assert!(subscriber.try_next().is_none(), "only the two upserts");
}

#[tokio::test]
async fn a_transaction_refused_for_an_etag_mismatch_publishes_nothing() {
    // A short lease: the relay gives up on a marker that never came after
    // the lease and a second. Not shorter: a transaction still committing
    // when the relay first looks (a second after its event) must not be
    // past its lease on a loaded machine.
    let stack = outbox_stack(Duration::from_secs(3)).await;
    let api = stack.gateway.api;
    let mut published = TopicSubscriber::start(stack.broker.addr, TOPIC).await;
    let mut internal =
        TopicSubscriber::start(stack.broker.addr, &internal_topic(APP_ID, TOPIC)).await;
    let save = |value: i64| async move {
        let response = http_client()
            .post(format!("http://{api}/v1.0/state/statestore"))
            .json(&json!([{"key": "order-9", "value": value}]))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
    };
    save(1).await;
    let stale = http_client()
        .get(format!("http://{api}/v1.0/state/statestore/order-9"))
        .send()
        .await
        .unwrap()
        .headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    save(2).await;
    let refused = transaction(
        api,
        json!({"operations": [
            {"operation": "upsert", "request": {"key": "order-9", "value": 3, "etag": stale}},
        ]}),
    )
    .await;
    assert_eq!(refused.status(), 500);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_STATE_TRANSACTION");
    // Its internal event went out before the commit; the relay fences its
    // marker instead of publishing it.
    let internal_event = cloud_event(&internal.next(WAIT).await);
    let id = internal_event["id"].as_str().unwrap().to_owned();
    until_marker(stack.broker.addr, &id, Some(b"aborted")).await;
    assert_eq!(state(api, "order-9").await, json!(2));
    // The relay still publishes a committed transaction, and only it.
    let committed = transaction(
        api,
        json!({"operations": [{"operation": "upsert", "request": {"key": "order-10", "value": 10}}]}),
    )
    .await;
    assert_eq!(committed.status(), 204);
    let event = cloud_event(&published.next(WAIT).await);
    assert_eq!(event["data"], "10");
    assert_ne!(event["id"], json!(id));
    until_marker(stack.broker.addr, event["id"].as_str().unwrap(), None).await;
    assert!(published.try_next().is_none(), "the refused one never came");
}

#[tokio::test]
async fn a_projection_is_published_while_the_state_holds_the_real_value() {
    let stack = outbox_stack(Duration::from_secs(5)).await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, TOPIC).await;
    let response = transaction(
        stack.gateway.api,
        json!({"operations": [
            {"operation": "upsert", "request": {"key": "order-7", "value": {"card": "4111-1111"},
                "metadata": {"contentType": "application/json"}}},
            {"operation": "upsert", "request": {"key": "order-7", "value": {"card": "****"},
                "metadata": {"outbox.projection": "true", "contentType": "application/json"}}},
        ]}),
    )
    .await;
    assert_eq!(response.status(), 204);
    let event = cloud_event(&subscriber.next(WAIT).await);
    assert_eq!(event["data"], json!({"card": "****"}));
    assert_eq!(event["datacontenttype"], "application/json");
    assert_eq!(
        state(stack.gateway.api, "order-7").await,
        json!({"card": "4111-1111"})
    );
    until_marker(stack.broker.addr, event["id"].as_str().unwrap(), None).await;
    assert!(subscriber.try_next().is_none(), "one event for the key");
}

#[tokio::test]
async fn a_gateway_killed_after_its_commit_publishes_once_it_is_back() {
    // The store and broker of a stack whose own gateway has no outbox.
    let stack = Stack::start().await;
    let port = stack.broker.addr.port();
    let client_id = format!("outbox-kill-{:08x}", rand::random::<u32>());
    let args = [
        "--client-id",
        client_id.as_str(),
        "--dapr-app-id",
        APP_ID,
        "--dapr-transactions",
        "true",
        "--dapr-outbox-pubsub",
        "pubsub",
        "--dapr-outbox-topic",
        TOPIC,
    ];
    let gateway = GatewayProcess::start(port, &args).await;
    let mut published = TopicSubscriber::start(stack.broker.addr, TOPIC).await;
    let mut internal =
        TopicSubscriber::start(stack.broker.addr, &internal_topic(APP_ID, TOPIC)).await;
    // The relay is subscribed once a first transaction is published.
    let warm_up = transaction(
        gateway.api,
        json!({"operations": [{"operation": "upsert", "request": {"key": "warm-up", "value": 0}}]}),
    )
    .await;
    assert_eq!(warm_up.status(), 204);
    assert_eq!(cloud_event(&published.next(WAIT).await)["data"], "0");
    let warm_up_id = cloud_event(&internal.next(WAIT).await)["id"].clone();

    let response = transaction(
        gateway.api,
        json!({"operations": [{"operation": "upsert", "request": {"key": "order-5", "value": 5}}]}),
    )
    .await;
    assert_eq!(response.status(), 204);
    // Killed at once: the relay waits a second before it looks at a marker.
    drop(gateway);
    let id = cloud_event(&internal.next(WAIT).await)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(json!(id), warm_up_id);
    let store = broker_store(stack.broker.addr).await;
    assert_eq!(
        raw_get(&store, &marker(&id)).await.as_deref(),
        Some(&b"0"[..]),
        "committed and not yet relayed"
    );
    assert!(
        published.try_next().is_none(),
        "nothing published before the restart"
    );

    // Back with the same client id: its relay's session gets the event again.
    let gateway = GatewayProcess::start(port, &args).await;
    let event = cloud_event(&published.next(WAIT).await);
    assert_eq!(event["id"], json!(id));
    assert_eq!(event["data"], "5");
    until_marker(stack.broker.addr, &id, None).await;
    assert_eq!(state(gateway.api, "order-5").await, json!(5));
}

#[tokio::test]
async fn a_relay_rolls_forward_a_transaction_committed_but_not_applied_and_publishes_it() {
    // What a gateway killed between its commit and its apply leaves: the
    // leases of a key and of a marker, the intent record naming both, and
    // the internal event it published before the commit. The relay that
    // gets the event applies the transaction, marker included, and
    // publishes.
    let stack = outbox_stack(Duration::from_secs(5)).await;
    let store = broker_store(stack.broker.addr).await;
    let mut published = TopicSubscriber::start(stack.broker.addr, TOPIC).await;
    let id = format!("outbox-{:032x}", rand::random::<u128>());
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000;
    let transaction_id = format!("{:032x}", rand::random::<u128>());
    let lease_value = format!("txn:{transaction_id}:{deadline}");
    // The record's bytes: its format's name, then length-prefixed fields
    // (u32, big-endian): the lease, the ops (each key, its token, kind 1:
    // a set without expiry, the value).
    let field = |record: &mut Vec<u8>, bytes: &[u8]| {
        record.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_be_bytes());
        record.extend_from_slice(bytes);
    };
    let mut record = b"dapr-txn/2\n".to_vec();
    field(&mut record, lease_value.as_bytes());
    let marker_key = marker(&id);
    let ops: [(&[u8], &[u8]); 2] = [(b"order-8", b"8"), (&marker_key, b"0")];
    record.extend_from_slice(&2u32.to_be_bytes());
    for (key, value) in ops {
        let mut lease = b"dapr-etag-lease||".to_vec();
        lease.extend_from_slice(key);
        let token = raw_set(&store, &lease, lease_value.as_bytes())
            .await
            .encode();
        field(&mut record, key);
        field(&mut record, token.as_bytes());
        record.push(1);
        field(&mut record, value);
    }
    raw_set(
        &store,
        format!("dapr-txn||{transaction_id}").as_bytes(),
        &record,
    )
    .await;
    let internal_event = json!({
        "id": id, "specversion": "1.0", "datacontenttype": "text/plain", "source": APP_ID,
        "type": "com.dapr.event.sent", "topic": "", "pubsubname": "pubsub", "traceid": "",
        "traceparent": "", "tracestate": "", "time": "2026-01-01T00:00:00Z", "data": "8",
    });
    crate::pubsub::mosquitto_pub(
        stack.broker.addr,
        &internal_topic(APP_ID, TOPIC),
        &internal_event.to_string(),
        "application/cloudevents+json",
    );
    let event = cloud_event(&published.next(WAIT).await);
    assert_eq!(event["id"], json!(id));
    assert_eq!(event["data"], "8");
    assert_eq!(event["topic"], TOPIC);
    assert_eq!(state(stack.gateway.api, "order-8").await, json!(8));
    until_marker(stack.broker.addr, &id, None).await;
}

#[tokio::test]
async fn a_dapr_app_subscribed_to_the_outbox_topic_gets_its_events() {
    let stack = Stack::start().await;
    let app = TestApp::start(
        Some(json!([{"pubsubname": "pubsub", "topic": TOPIC, "route": "/outbox"}])),
        success(),
    )
    .await;
    let app_port = app.port.to_string();
    let gateway = GatewayProcess::start(
        stack.broker.addr.port(),
        &[
            "--dapr-app-port",
            &app_port,
            "--dapr-app-id",
            APP_ID,
            "--dapr-transactions",
            "true",
            "--dapr-outbox-pubsub",
            "pubsub",
            "--dapr-outbox-topic",
            TOPIC,
        ],
    )
    .await;
    until_subscribed(&stack.broker, &app, TOPIC).await;
    let response = transaction(
        gateway.api,
        json!({"operations": [{"operation": "upsert", "request": {"key": "order-4",
            "value": {"n": 4}, "metadata": {"contentType": "application/json"}}}]}),
    )
    .await;
    assert_eq!(response.status(), 204);
    app.until("the outbox event", WAIT, |events| !events.is_empty())
        .await;
    let events = app.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].path, "/outbox");
    let event = &events[0].event;
    assert_eq!(event["data"], json!({"n": 4}));
    assert_eq!(event["topic"], TOPIC);
    assert_eq!(event["source"], APP_ID);
    assert!(event["id"].as_str().unwrap().starts_with("outbox-"));
}

#[tokio::test]
async fn with_no_relay_subscribed_a_transaction_fails_and_writes_nothing() {
    // The store and broker of a stack whose gateway has no outbox, and the
    // Dapr operations of an outbox whose relay never started: the broker
    // answers the internal event with "no matching subscribers".
    let stack = Stack::start().await;
    let store = broker_store(stack.broker.addr).await;
    let dapr = DaprStore::new(
        store.clone(),
        DaprSettings {
            app_id: "unrelayed".into(),
            transactions: true,
            outbox: Some(OutboxSettings {
                pubsub: "pubsub".into(),
                topic: TOPIC.into(),
            }),
            ..DaprSettings::default()
        },
    );
    let operation = TxOperation {
        save: Save {
            key: "unrelayed-1".into(),
            value: "1".into(),
            etag: None,
            concurrency: Default::default(),
            ttl_ms: None,
        },
        delete: false,
        change: Change {
            key: "unrelayed-1".into(),
            data: "1".into(),
            metadata: Default::default(),
        },
    };
    let error = dapr.transaction(vec![operation]).await.unwrap_err();
    assert!(
        matches!(&error, DaprError::Outbox { error: why, .. } if why.contains("no outbox relay subscribes to unrelayedorders-doneoutbox")),
        "{error}"
    );
    assert_eq!(raw_get(&store, b"unrelayed-1").await, None);
}

/// The Python SDK's `execute_state_transaction` with outbox metadata, as
/// an app written for daprd calls it.
const PYTHON_TRANSACTION: &str = r#"
from dapr.clients import DaprClient
from dapr.clients.grpc._request import TransactionalStateOperation, TransactionOperationType

with DaprClient() as client:
    client.execute_state_transaction(
        store_name="statestore",
        operations=[
            TransactionalStateOperation(key="py-1", data='{"n": 1}',
                metadata={"contentType": "application/json", "outbox.cloudevent.kind": "order"}),
            TransactionalStateOperation(key="py-2", data="secret"),
            TransactionalStateOperation(key="py-2", data="hidden",
                metadata={"outbox.projection": "true"}),
            TransactionalStateOperation(key="py-3", operation_type=TransactionOperationType.delete),
        ],
    )
    print(client.get_state(store_name="statestore", key="py-2").data.decode())
print("ok")
"#;

#[tokio::test]
async fn the_python_sdks_transaction_with_outbox_metadata_runs_unchanged() {
    let stack = outbox_stack(Duration::from_secs(5)).await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, TOPIC).await;
    let python = crate::dapr::python();
    assert!(
        python.is_file(),
        "the Python environment tests/dapr/.venv is missing: run scripts/install-dapr-sdks"
    );
    let port = stack.gateway.api.port().to_string();
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python)
            .arg("-c")
            .arg(PYTHON_TRANSACTION)
            .env("DAPR_RUNTIME_HOST", "127.0.0.1")
            .env("DAPR_HTTP_PORT", &port)
            .env("DAPR_GRPC_PORT", &port)
            .env("DAPR_HEALTH_TIMEOUT", "30")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the script finishes")
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.lines().collect::<Vec<_>>() == ["secret", "ok"],
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events = events_by_content_type(&mut subscriber, 2).await;
    assert_eq!(events[0]["data"], json!({"n": 1}));
    assert_eq!(events[0]["datacontenttype"], "application/json");
    assert_eq!(events[0]["outbox.cloudevent.kind"], "order");
    assert_eq!(events[1]["data"], "hidden");
    assert_eq!(events[1]["datacontenttype"], "text/plain");
    for event in &events {
        until_marker(stack.broker.addr, event["id"].as_str().unwrap(), None).await;
    }
    assert!(
        subscriber.try_next().is_none(),
        "the delete published nothing"
    );
}

/// The JS SDK's `state.transaction` (HTTP) with outbox metadata, as an app
/// written for daprd calls it.
const JS_TRANSACTION: &str = r#"
import { CommunicationProtocolEnum, DaprClient } from "@dapr/dapr";
const client = new DaprClient({
  daprHost: "127.0.0.1",
  daprPort: process.env.DAPR_HTTP_PORT,
  communicationProtocol: CommunicationProtocolEnum.HTTP,
});
await client.start();
await client.state.transaction("statestore", [
  { operation: "upsert", request: { key: "js-1", value: { n: 1 },
    metadata: { contentType: "application/json", "outbox.cloudevent.kind": "order" } } },
  { operation: "upsert", request: { key: "js-2", value: "plain" } },
  { operation: "delete", request: { key: "js-3" } },
]);
console.log(JSON.stringify(await client.state.get("statestore", "js-1")));
console.log("ok");
"#;

#[tokio::test]
async fn the_js_sdks_transaction_with_outbox_metadata_runs_unchanged() {
    let stack = outbox_stack(Duration::from_secs(5)).await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, TOPIC).await;
    let dapr_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dapr");
    assert!(
        dapr_dir
            .join("node_modules/@dapr/dapr/package.json")
            .is_file(),
        "the npm packages of tests/dapr are missing: run scripts/install-dapr-sdks"
    );
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .args(["--input-type=module", "-e", JS_TRANSACTION])
            .current_dir(&dapr_dir)
            .env("DAPR_HTTP_PORT", stack.gateway.api.port().to_string())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the script finishes")
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        // The SDK logs on stdout too: the script's own lines are the last.
        output.status.success() && stdout.lines().rev().take(2).eq(["ok", "{\"n\":1}"]),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events = events_by_content_type(&mut subscriber, 2).await;
    assert_eq!(events[0]["data"], json!({"n": 1}));
    assert_eq!(events[0]["outbox.cloudevent.kind"], "order");
    assert_eq!(events[1]["data"], "plain");
    assert_eq!(events[1]["datacontenttype"], "text/plain");
    for event in &events {
        until_marker(stack.broker.addr, event["id"].as_str().unwrap(), None).await;
    }
    assert!(
        subscriber.try_next().is_none(),
        "the delete published nothing"
    );
}

#[tokio::test]
async fn dev_runs_the_outbox_on_its_embedded_broker() {
    let dev = crate::support::dev::DevProcess::start(&[
        "--dapr-transactions",
        "true",
        "--dapr-outbox-topic",
        TOPIC,
    ])
    .await;
    let mut subscriber = TopicSubscriber::start(dev.broker, TOPIC).await;
    let response = http_client()
        .post(dev.url("/v1.0/state/statestore/transaction"))
        .json(&json!({"operations": [{"operation": "upsert", "request": {"key": "dev-1", "value": 1}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let event = cloud_event(&subscriber.next(WAIT).await);
    assert_eq!(event["data"], "1");
    assert_eq!(event["topic"], TOPIC);
    assert_eq!(event["pubsubname"], "pubsub");
}
