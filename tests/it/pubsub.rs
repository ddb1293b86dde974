//! Dapr's publish over HTTP and gRPC, as a plain MQTT subscriber on the
//! same broker sees it: CloudEvents with their MQTT5 content type, raw
//! payloads, TTLs as message expiry, bulk publishes with a failing entry,
//! and Dapr's refusals.

use std::collections::HashMap;
use std::time::Duration;

use prost::Message as _;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;
use serde_json::{Value, json};
use tonic_types::ErrorDetail;

use crate::support::MosquittoConfig;
use crate::support::gateway::{GatewayOptions, Stack, http_client};
use crate::support::grpc::GrpcClient;
use crate::support::topic_subscriber::TopicSubscriber;

const WAIT: Duration = Duration::from_secs(10);

/// gRPC status codes the tests name.
const INVALID_ARGUMENT: i32 = 3;
const INTERNAL: i32 = 13;

/// `dapr.proto.runtime.v1.PublishEventRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct PublishEventRequest {
    #[prost(string, tag = "1")]
    pubsub_name: String,
    #[prost(string, tag = "2")]
    topic: String,
    #[prost(bytes = "vec", tag = "3")]
    data: Vec<u8>,
    #[prost(string, tag = "4")]
    data_content_type: String,
    #[prost(map = "string, string", tag = "5")]
    metadata: HashMap<String, String>,
}

/// `dapr.proto.runtime.v1.BulkPublishRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct BulkPublishRequest {
    #[prost(string, tag = "1")]
    pubsub_name: String,
    #[prost(string, tag = "2")]
    topic: String,
    #[prost(message, repeated, tag = "3")]
    entries: Vec<BulkPublishRequestEntry>,
    #[prost(map = "string, string", tag = "4")]
    metadata: HashMap<String, String>,
}

/// `dapr.proto.runtime.v1.BulkPublishRequestEntry`.
#[derive(Clone, PartialEq, prost::Message)]
struct BulkPublishRequestEntry {
    #[prost(string, tag = "1")]
    entry_id: String,
    #[prost(bytes = "vec", tag = "2")]
    event: Vec<u8>,
    #[prost(string, tag = "3")]
    content_type: String,
    #[prost(map = "string, string", tag = "4")]
    metadata: HashMap<String, String>,
}

/// `dapr.proto.runtime.v1.BulkPublishResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct BulkPublishResponse {
    #[prost(message, repeated, tag = "1")]
    failed_entries: Vec<FailedEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FailedEntry {
    #[prost(string, tag = "1")]
    entry_id: String,
    #[prost(string, tag = "2")]
    error: String,
}

fn content_type(publish: &Publish) -> Option<&str> {
    publish.properties.as_ref()?.content_type.as_deref()
}

fn expiry(publish: &Publish) -> Option<u32> {
    publish.properties.as_ref()?.message_expiry_interval
}

fn cloud_event(publish: &Publish) -> Value {
    serde_json::from_slice(&publish.payload).unwrap()
}

async fn dapr_error(response: reqwest::Response, status: u16) -> Value {
    assert_eq!(response.status().as_u16(), status);
    let body: Value = response.json().await.unwrap();
    assert!(body["message"].is_string(), "{body}");
    body
}

#[tokio::test]
async fn an_http_publish_reaches_an_mqtt_subscriber_as_daprs_cloudevent() {
    let stack = Stack::start().await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, "orders/#").await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let response = http_client()
        .post(stack.gateway.url("/v1.0/publish/pubsub/orders/eu"))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .body(r#"{"id": 1, "big": 12345678901234567890}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let message = subscriber.next(WAIT).await;
    assert_eq!(&message.topic[..], b"orders/eu");
    assert_eq!(message.qos, QoS::AtLeastOnce);
    assert!(!message.retain);
    assert_eq!(content_type(&message), Some("application/cloudevents+json"));
    assert_eq!(expiry(&message), None);
    let event = cloud_event(&message);
    assert_eq!(event["data"]["id"], 1);
    assert!(
        std::str::from_utf8(&message.payload)
            .unwrap()
            .contains("\"big\":12345678901234567890"),
        "numbers as sent"
    );
    assert_eq!(event["datacontenttype"], "application/json");
    assert_eq!(event["source"], "statestore-gateway");
    assert_eq!(event["type"], "com.dapr.event.sent");
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["topic"], "orders/eu");
    assert_eq!(event["pubsubname"], "pubsub");
    assert_eq!(event["id"].as_str().unwrap().len(), 36);
    assert!(event["time"].as_str().unwrap().ends_with('Z'));
    // A span of the caller's trace, as daprd's.
    let traceparent = event["traceparent"].as_str().unwrap();
    assert!(
        traceparent.starts_with(&format!("00-{trace_id}-")),
        "{traceparent}"
    );
    assert!(traceparent.ends_with("-01"), "{traceparent}");
    assert_eq!(event["traceid"], event["traceparent"]);
}

#[tokio::test]
async fn a_raw_payload_goes_out_as_sent_and_a_ttl_is_the_message_expiry() {
    let stack = Stack::start().await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, "telemetry").await;
    let client = http_client();
    let raw = client
        .post(stack.gateway.url(
            "/v1.0/publish/pubsub/telemetry?metadata.rawPayload=true&metadata.ttlInSeconds=30",
        ))
        .header("content-type", "application/octet-stream")
        .body(vec![0u8, 159, 146, 150])
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 204);
    let message = subscriber.next(WAIT).await;
    assert_eq!(&message.payload[..], &[0u8, 159, 146, 150]);
    assert_eq!(content_type(&message), Some("application/octet-stream"));
    assert!(matches!(expiry(&message), Some(29..=30)), "{message:?}");

    let wrapped = client
        .post(
            stack
                .gateway
                .url("/v1.0/publish/pubsub/telemetry?metadata.ttlInSeconds=60"),
        )
        .header("content-type", "application/octet-stream")
        .body(vec![1u8, 2])
        .send()
        .await
        .unwrap();
    assert_eq!(wrapped.status(), 204);
    let message = subscriber.next(WAIT).await;
    assert!(matches!(expiry(&message), Some(59..=60)), "{message:?}");
    let event = cloud_event(&message);
    assert_eq!(event["data_base64"], "AQI=");
    assert!(event["expiration"].as_str().unwrap().ends_with('Z'));

    // An event that is a CloudEvent already is completed, not wrapped.
    let completed = client
        .post(stack.gateway.url("/v1.0/publish/pubsub/telemetry"))
        .header("content-type", "application/cloudevents+json")
        .body(r#"{"id":"mine-1","source":"sensor","specversion":"1.0","type":"t","data":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(completed.status(), 204);
    let event = cloud_event(&subscriber.next(WAIT).await);
    assert_eq!(
        (
            &event["id"],
            &event["source"],
            &event["type"],
            &event["data"]
        ),
        (&"mine-1".into(), &"sensor".into(), &"t".into(), &"x".into())
    );
    assert_eq!(event["topic"], "telemetry");
    assert_eq!(event["pubsubname"], "pubsub");
}

#[tokio::test]
async fn a_grpc_publish_reaches_an_mqtt_subscriber_and_refusals_are_daprs() {
    let stack = Stack::start().await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, "orders").await;
    let mut grpc = GrpcClient::connect(stack.gateway.api).await;
    let request = PublishEventRequest {
        pubsub_name: "pubsub".into(),
        topic: "orders".into(),
        data: b"hello".to_vec(),
        data_content_type: "text/plain".into(),
        metadata: HashMap::from([("cloudevent.type".to_owned(), "order.placed".to_owned())]),
    };
    grpc.call("PublishEvent", &request.encode_to_vec())
        .await
        .expect(0);
    let message = subscriber.next(WAIT).await;
    assert_eq!(content_type(&message), Some("application/cloudevents+json"));
    let event = cloud_event(&message);
    assert_eq!(
        (&event["data"], &event["type"], &event["datacontenttype"]),
        (
            &"hello".into(),
            &"order.placed".into(),
            &"text/plain".into()
        )
    );

    // A pub/sub the gateway does not have; a topic MQTT forbids.
    let unknown = PublishEventRequest {
        pubsub_name: "kafka".into(),
        ..request.clone()
    };
    let answer = grpc
        .call("PublishEvent", &unknown.encode_to_vec())
        .await
        .expect(INVALID_ARGUMENT);
    assert!(
        answer.message.contains("pubsub%20kafka%20is%20not%20found"),
        "{}",
        answer.message
    );
    let wildcard = PublishEventRequest {
        topic: "orders/+".into(),
        ..request.clone()
    };
    grpc.call("PublishEvent", &wildcard.encode_to_vec())
        .await
        .expect(INVALID_ARGUMENT);
    let bad_metadata = PublishEventRequest {
        metadata: HashMap::from([("rawPayload".to_owned(), "maybe".to_owned())]),
        ..request
    };
    grpc.call("PublishEvent", &bad_metadata.encode_to_vec())
        .await
        .expect(INVALID_ARGUMENT);

    let client = http_client();
    let url = |path: &str| stack.gateway.url(path);
    let body = dapr_error(
        client
            .post(url("/v1.0/publish/kafka/orders"))
            .body("x")
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(body["errorCode"], "ERR_PUBSUB_NOT_FOUND");
    assert_eq!(body["message"], "pubsub kafka is not found");
    let body = dapr_error(
        client
            .post(url("/v1.0/publish/pubsub/"))
            .body("x")
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(body["errorCode"], "ERR_TOPIC_NAME_EMPTY");
    for topic in ["a%2B", "a/%23", "a%00b"] {
        let body = dapr_error(
            client
                .post(url(&format!("/v1.0/publish/pubsub/{topic}")))
                .body("x")
                .send()
                .await
                .unwrap(),
            400,
        )
        .await;
        assert_eq!(body["errorCode"], "ERR_PUBSUB_PUBLISH_MESSAGE", "{topic}");
    }
    let body = dapr_error(
        client
            .post(url(
                "/v1.0/publish/pubsub/orders?metadata.ttlInSeconds=soon",
            ))
            .body("x")
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(body["errorCode"], "ERR_PUBSUB_REQUEST_METADATA");
    // Nothing refused reached the broker.
    assert!(subscriber.try_next().is_none());
}

/// gRPC error details written as daprd's errors kit writes them in its
/// HTTP answers (`details`), so both protocols compare to one expectation.
fn details_json(details: &[ErrorDetail]) -> Value {
    details
        .iter()
        .map(|detail| match detail {
            ErrorDetail::ResourceInfo(info) => json!({
                "@type": "type.googleapis.com/google.rpc.ResourceInfo",
                "resource_type": info.resource_type,
                "resource_name": info.resource_name,
                "owner": info.owner,
                "description": info.description,
            }),
            ErrorDetail::ErrorInfo(info) => json!({
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": info.reason,
                "domain": info.domain,
                "metadata": info.metadata,
            }),
            other => json!({ "other": format!("{other:?}") }),
        })
        .collect()
}

/// daprd's details of a pub/sub error: a `ResourceInfo` of the pub/sub
/// named `pubsub` (described by the message), unless `resource` is
/// false, and an `ErrorInfo`.
fn pubsub_details(resource: bool, message: &str, reason: &str, metadata: Value) -> Value {
    let mut details = Vec::new();
    if resource {
        details.push(json!({
            "@type": "type.googleapis.com/google.rpc.ResourceInfo",
            "resource_type": "pubsub",
            "resource_name": "pubsub",
            "owner": "",
            "description": message,
        }));
    }
    details.push(json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "dapr.io",
        "metadata": metadata,
    }));
    Value::Array(details)
}

#[tokio::test]
async fn pubsub_errors_carry_daprds_details_over_http_and_grpc() {
    let stack = Stack::start().await;
    let client = http_client();
    let post = |path: &str, content_type: &str, body: &'static str| {
        client
            .post(stack.gateway.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    // Over HTTP: the errors kit's JSON, its message as it is.
    let cases: [(&str, &str, &str, u16, &str, &str, Value); 6] = [
        (
            "/v1.0/publish/kafka/orders?metadata.key=value",
            "text/plain",
            "x",
            404,
            "ERR_PUBSUB_NOT_FOUND",
            "pubsub kafka is not found",
            json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "DAPR_PUBSUB_NOT_FOUND", "domain": "dapr.io",
                    "metadata": {"key": "value"}}]),
        ),
        (
            "/v1.0/publish/pubsub/",
            "text/plain",
            "x",
            404,
            "ERR_TOPIC_NAME_EMPTY",
            "topic is empty in pubsub pubsub",
            pubsub_details(
                true,
                "topic is empty in pubsub pubsub",
                "DAPR_PUBSUB_TOPIC_NAME_EMPTY",
                json!({}),
            ),
        ),
        (
            "/v1.0/publish/pubsub/orders?metadata.rawPayload=maybe",
            "text/plain",
            "x",
            400,
            "ERR_PUBSUB_REQUEST_METADATA",
            "failed deserializing metadata. Error: rawPayload value must be a valid boolean: actual is 'maybe'",
            pubsub_details(
                true,
                "failed deserializing metadata. Error: rawPayload value must be a valid boolean: actual is 'maybe'",
                "DAPR_PUBSUB_METADATA_DESERIALIZATION",
                json!({"rawPayload": "maybe"}),
            ),
        ),
        (
            "/v1.0/publish/pubsub/orders/%2B",
            "text/plain",
            "x",
            400,
            "ERR_PUBSUB_PUBLISH_MESSAGE",
            "error when publishing to topic orders/+ in pubsub pubsub: an MQTT topic name holds no '+', '#' or NUL and has at most 65535 bytes",
            pubsub_details(
                true,
                "error when publishing to topic orders/+ in pubsub pubsub: an MQTT topic name holds no '+', '#' or NUL and has at most 65535 bytes",
                "DAPR_PUBSUB_PUBLISH_MESSAGE",
                json!({"topic": "orders/+", "error": "an MQTT topic name holds no '+', '#' or NUL and has at most 65535 bytes"}),
            ),
        ),
        (
            "/v1.0-alpha1/publish/bulk/pubsub/orders",
            "application/json",
            r#"[{"entryId": "1", "event": "a", "contentType": "text/plain"},
                {"entryId": "1", "event": "b", "contentType": "text/plain"}]"#,
            400,
            "ERR_PUBSUB_EVENTS_SER",
            "error marshaling events to bytes for topic orders pubsub pubsub. error: entryId is duplicated or not present for entry",
            pubsub_details(
                true,
                "error marshaling events to bytes for topic orders pubsub pubsub. error: entryId is duplicated or not present for entry",
                "DAPR_PUBSUB_MARSHAL_EVENTS",
                json!({"appID": "statestore-gateway", "error": "entryId is duplicated or not present for entry"}),
            ),
        ),
        (
            "/v1.0-alpha1/publish/bulk/pubsub/orders",
            "application/json",
            r#"[{"entryId": "1", "event": 5, "contentType": "text/plain"}]"#,
            400,
            "ERR_PUBSUB_EVENTS_SER",
            "error when marshalling cloud event envelope for topic orders pubsub pubsub: error: mismatch between contentType and event",
            pubsub_details(
                true,
                "error when marshalling cloud event envelope for topic orders pubsub pubsub: error: mismatch between contentType and event",
                "DAPR_PUBSUB_MARSHAL_ENVELOPE",
                json!({"appID": "statestore-gateway", "error": "error: mismatch between contentType and event"}),
            ),
        ),
    ];
    for (path, content_type, body, status, code, message, details) in cases {
        let body = dapr_error(post(path, content_type, body).await.unwrap(), status).await;
        assert_eq!(
            body,
            json!({"errorCode": code, "message": message, "details": details}),
            "{path}"
        );
    }
    // Data sent as a CloudEvent that is not a JSON object: the reason is
    // the JSON parser's, named in the metadata.
    let body = dapr_error(
        post(
            "/v1.0/publish/pubsub/orders",
            "application/cloudevents+json",
            "[1]",
        )
        .await
        .unwrap(),
        500,
    )
    .await;
    assert_eq!(body["errorCode"], "ERR_PUBSUB_CLOUD_EVENTS_SER");
    assert_eq!(body["message"], "cannot create cloudevent");
    assert_eq!(
        body["details"][1]["reason"],
        "DAPR_PUBSUB_CLOUD_EVENT_CREATION"
    );
    assert_eq!(
        body["details"][1]["metadata"]["appID"],
        "statestore-gateway"
    );
    assert!(
        body["details"][1]["metadata"]["error"].is_string(),
        "{body}"
    );
    // A body that is not a list of entries: the app only, no error.
    let body = dapr_error(
        post(
            "/v1.0-alpha1/publish/bulk/pubsub/orders",
            "application/json",
            "{}",
        )
        .await
        .unwrap(),
        400,
    )
    .await;
    assert_eq!(body["details"][1]["reason"], "DAPR_PUBSUB_UNMARSHAL_EVENTS");
    assert_eq!(
        body["details"][1]["metadata"],
        json!({"appID": "statestore-gateway"})
    );

    // Over gRPC: the same details in the status.
    let mut grpc = GrpcClient::connect(stack.gateway.api).await;
    let request = PublishEventRequest {
        pubsub_name: "kafka".into(),
        topic: "orders".into(),
        data: b"x".to_vec(),
        data_content_type: "text/plain".into(),
        metadata: HashMap::from([("key".to_owned(), "value".to_owned())]),
    };
    let bad_metadata = PublishEventRequest {
        pubsub_name: "pubsub".into(),
        metadata: HashMap::from([("ttlInSeconds".to_owned(), "soon".to_owned())]),
        ..request.clone()
    };
    let no_topic = PublishEventRequest {
        pubsub_name: "pubsub".into(),
        topic: String::new(),
        ..request.clone()
    };
    let entry = |id: &str| BulkPublishRequestEntry {
        entry_id: id.into(),
        event: b"x".to_vec(),
        content_type: "text/plain".into(),
        metadata: HashMap::new(),
    };
    let duplicated = BulkPublishRequest {
        pubsub_name: "pubsub".into(),
        topic: "orders".into(),
        entries: vec![entry("a"), entry("")],
        metadata: HashMap::new(),
    };
    let cases = [
        (
            "PublishEvent",
            request.encode_to_vec(),
            // daprd's gRPC API names no metadata here.
            json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "DAPR_PUBSUB_NOT_FOUND", "domain": "dapr.io", "metadata": {}}]),
        ),
        (
            "PublishEvent",
            bad_metadata.encode_to_vec(),
            pubsub_details(
                true,
                "failed deserializing metadata. Error: ttlInSeconds value must be a valid integer: actual is 'soon'",
                "DAPR_PUBSUB_METADATA_DESERIALIZATION",
                json!({"ttlInSeconds": "soon"}),
            ),
        ),
        (
            "PublishEvent",
            no_topic.encode_to_vec(),
            pubsub_details(
                true,
                "topic is empty in pubsub pubsub",
                "DAPR_PUBSUB_TOPIC_NAME_EMPTY",
                json!({"key": "value"}),
            ),
        ),
        (
            "BulkPublishEvent",
            duplicated.encode_to_vec(),
            pubsub_details(
                true,
                "error marshaling events to bytes for topic orders pubsub pubsub. error: entryId is duplicated or not present for entry",
                "DAPR_PUBSUB_MARSHAL_EVENTS",
                json!({"appID": "statestore-gateway", "error": "entryId is duplicated or not present for entry"}),
            ),
        ),
    ];
    for (method, message, details) in cases {
        let answer = grpc.call(method, &message).await.expect(INVALID_ARGUMENT);
        assert_eq!(details_json(&answer.details), details, "{method}");
    }
}

/// A stack whose broker takes packets of at most 8 KiB, so one large
/// event of a bulk publish fails while the others are published.
async fn small_packet_stack() -> Stack {
    Stack::builder()
        .broker(MosquittoConfig {
            extra: "max_packet_size 8192\n".into(),
            ..MosquittoConfig::default()
        })
        .gateway(GatewayOptions::default())
        .start()
        .await
}

#[tokio::test]
async fn a_bulk_publish_reports_the_entry_the_broker_did_not_take() {
    let stack = small_packet_stack().await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, "bulk").await;
    let large = "x".repeat(20_000);
    let body = serde_json::json!([
        {"entryId": "1", "event": {"n": 1}, "contentType": "application/json"},
        {"entryId": "2", "event": large, "contentType": "text/plain"},
        {"entryId": "3", "event": "AQI=", "contentType": "application/octet-stream",
         "metadata": {"rawPayload": "true"}},
    ]);
    let response = http_client()
        .post(stack.gateway.url("/v1.0-alpha1/publish/bulk/pubsub/bulk"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["errorCode"], "ERR_PUBSUB_PUBLISH_MESSAGE");
    let failed = answer["failedEntries"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{answer}");
    assert_eq!(failed[0]["entryId"], "2");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("maximum packet size"),
        "{answer}"
    );
    let mut received = [subscriber.next(WAIT).await, subscriber.next(WAIT).await];
    received.sort_by_key(|message| message.payload.len());
    assert_eq!(&received[0].payload[..], &[1u8, 2]);
    assert_eq!(cloud_event(&received[1])["data"]["n"], 1);

    // The same over gRPC (both method names): the call fails, as daprd's.
    let mut grpc = GrpcClient::connect(stack.gateway.api).await;
    let entry = |id: &str, event: &[u8]| BulkPublishRequestEntry {
        entry_id: id.into(),
        event: event.to_vec(),
        content_type: "text/plain".into(),
        metadata: HashMap::new(),
    };
    let request = BulkPublishRequest {
        pubsub_name: "pubsub".into(),
        topic: "bulk".into(),
        entries: vec![entry("a", b"one"), entry("b", b"two")],
        metadata: HashMap::new(),
    };
    for method in ["BulkPublishEventAlpha1", "BulkPublishEvent"] {
        let answer = grpc.call(method, &request.encode_to_vec()).await.expect(0);
        assert!(
            answer
                .decode::<BulkPublishResponse>()
                .failed_entries
                .is_empty()
        );
        for _ in 0..2 {
            let event = cloud_event(&subscriber.next(WAIT).await);
            assert!(event["data"] == "one" || event["data"] == "two", "{event}");
        }
    }
    let failing = BulkPublishRequest {
        entries: vec![entry("a", b"one"), entry("b", large.as_bytes())],
        ..request.clone()
    };
    let answer = grpc
        .call("BulkPublishEventAlpha1", &failing.encode_to_vec())
        .await
        .expect(INTERNAL);
    assert!(
        answer.message.contains("maximum%20packet%20size"),
        "{}",
        answer.message
    );
    let details = details_json(&answer.details);
    assert_eq!(details[0]["resource_type"], "pubsub");
    assert_eq!(details[1]["reason"], "DAPR_PUBSUB_PUBLISH_MESSAGE");
    assert_eq!(details[1]["metadata"]["topic"], "bulk");
    assert!(
        details[1]["metadata"]["error"]
            .as_str()
            .unwrap()
            .contains("maximum packet size"),
        "{details}"
    );
    subscriber.next(WAIT).await;
    let duplicated = BulkPublishRequest {
        entries: vec![entry("a", b"one"), entry("a", b"two")],
        ..request
    };
    grpc.call("BulkPublishEvent", &duplicated.encode_to_vec())
        .await
        .expect(INVALID_ARGUMENT);
}

/// A stack whose gateway takes `token` and grants its caller `method` on
/// the topic filter `filter` only; the rules file lives as long as the
/// directory returned.
async fn stack_with_topic_rule(
    token: &str,
    method: &str,
    filter: &str,
) -> (Stack, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        format!(
            "rules:\n  - principals: {{apiToken: true}}\n    brokerResources:\n      - {{method: {method}, topics: [\"{filter}\"]}}\n"
        ),
    )
    .unwrap();
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some(token.into()),
            authz: Some(statestore_gateway::access::rules::AuthzSettings::new(rules)),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    (stack, dir)
}

#[tokio::test]
async fn callers_publish_only_on_the_topics_their_rules_grant() {
    const TOKEN: &str = "pubsub-api-t0ken";
    let (stack, _rules) = stack_with_topic_rule(TOKEN, "Publish", "orders/+").await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, "#").await;
    let publish = |topic: &str| {
        http_client()
            .post(stack.gateway.url(&format!("/v1.0/publish/pubsub/{topic}")))
            .header("dapr-api-token", TOKEN)
            .body("x")
            .send()
    };
    let body = dapr_error(publish("payments/eu").await.unwrap(), 403).await;
    let forbidden = "topic payments/eu is not allowed for app id statestore-gateway";
    let details = |topic: &str| {
        let message = format!("topic {topic} is not allowed for app id statestore-gateway");
        pubsub_details(
            true,
            &message,
            "DAPR_PUBSUB_FORBIDDEN",
            json!({"topic": topic, "error": message}),
        )
    };
    assert_eq!(
        body,
        json!({"errorCode": "ERR_PUBSUB_FORBIDDEN", "message": forbidden,
               "details": details("payments/eu")})
    );
    assert_eq!(publish("orders/eu").await.unwrap().status(), 204);

    let mut grpc = GrpcClient::connect_with_token(stack.gateway.api, TOKEN).await;
    let request = |topic: &str| PublishEventRequest {
        pubsub_name: "pubsub".into(),
        topic: topic.into(),
        data: b"y".to_vec(),
        ..PublishEventRequest::default()
    };
    const PERMISSION_DENIED: i32 = 7;
    let answer = grpc
        .call("PublishEvent", &request("orders/eu/1").encode_to_vec())
        .await
        .expect(PERMISSION_DENIED);
    assert_eq!(details_json(&answer.details), details("orders/eu/1"));
    grpc.call("PublishEvent", &request("orders/us").encode_to_vec())
        .await
        .expect(0);
    // Only the two granted events reached the broker, in order (the
    // store's own traffic aside).
    let mut topics = Vec::new();
    while topics.len() < 2 {
        let topic = subscriber.next(WAIT).await.topic;
        if topic.starts_with(b"orders/") || topic.starts_with(b"payments/") {
            topics.push(topic);
        }
    }
    assert_eq!(topics, [&b"orders/eu"[..], &b"orders/us"[..]]);
}

/// Runs an SDK's publish script against a gateway with the SDK tests'
/// API token, and returns what a plain MQTT subscriber of its topic got.
async fn sdk_publishes(program: std::path::PathBuf, script: &str, prefix: &str) -> Vec<Value> {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some(crate::dapr::TOKEN.into()),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let mut subscriber =
        TopicSubscriber::start(stack.broker.addr, &format!("{prefix}/orders")).await;
    let output = crate::dapr::run_sdk(&program, script, stack.gateway.api, prefix).await;
    crate::dapr::assert_script_ok(script, &output);
    let mut events = Vec::new();
    for _ in 0..3 {
        let message = subscriber.next(WAIT).await;
        assert_eq!(content_type(&message), Some("application/cloudevents+json"));
        events.push(cloud_event(&message));
    }
    assert!(subscriber.try_next().is_none(), "only the three events");
    events
}

#[tokio::test]
async fn the_js_sdk_publishes_unchanged_over_http() {
    let events = sdk_publishes("node".into(), "publish.mjs", "js-pub").await;
    // The single event first; the bulk's two in either order.
    assert_eq!(
        events[0]["data"],
        serde_json::json!({"id": 1, "item": "book"})
    );
    assert_eq!(events[0]["datacontenttype"], "application/json");
    assert_eq!(events[0]["topic"], "js-pub/orders");
    let mut bulk: Vec<String> = events[1..]
        .iter()
        .map(|event| event["data"].to_string())
        .collect();
    bulk.sort();
    assert_eq!(bulk, ["\"three\"", "{\"id\":2}"]);
}

#[tokio::test]
async fn the_python_sdk_publishes_unchanged_over_grpc() {
    let events = sdk_publishes(crate::dapr::python(), "publish.py", "py-pub").await;
    assert_eq!(
        events[0]["data"],
        serde_json::json!({"id": 1, "item": "book"})
    );
    assert_eq!(events[0]["source"], "statestore-gateway");
    let mut bulk: Vec<&str> = events[1..]
        .iter()
        .map(|event| event["data"].as_str().unwrap())
        .collect();
    bulk.sort_unstable();
    assert_eq!(bulk, ["three", "two"]);
}

#[tokio::test]
async fn every_pubsub_name_is_the_broker_and_the_metadata_lists_each() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            dapr: statestore_gateway::dapr::DaprSettings {
                pubsubs: vec!["orders-bus".into(), "events".into()],
                ..statestore_gateway::dapr::DaprSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let mut subscriber = TopicSubscriber::start(stack.broker.addr, "news").await;
    let client = http_client();
    for pubsub in ["orders-bus", "events"] {
        let response = client
            .post(stack.gateway.url(&format!("/v1.0/publish/{pubsub}/news")))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
        assert_eq!(
            cloud_event(&subscriber.next(WAIT).await)["pubsubname"],
            pubsub
        );
    }
    let body = dapr_error(
        client
            .post(stack.gateway.url("/v1.0/publish/pubsub/news"))
            .body("x")
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(body["errorCode"], "ERR_PUBSUB_NOT_FOUND");

    let metadata: Value = client
        .get(stack.gateway.url("/v1.0/metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pubsubs: Vec<(&str, &str, &str)> = metadata["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|component| component["type"] == "pubsub.azure.iotoperations")
        .map(|component| {
            (
                component["name"].as_str().unwrap(),
                component["version"].as_str().unwrap(),
                component["type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        pubsubs,
        [
            ("orders-bus", "v1", "pubsub.azure.iotoperations"),
            ("events", "v1", "pubsub.azure.iotoperations"),
        ]
    );
}

#[tokio::test]
async fn dev_publishes_on_its_embedded_broker() {
    let dev = crate::support::dev::DevProcess::start(&[]).await;
    let mut subscriber = TopicSubscriber::start(dev.broker, "orders").await;
    let response = http_client()
        .post(dev.url("/v1.0/publish/pubsub/orders"))
        .header("content-type", "application/json")
        .body(r#"{"id":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let message = subscriber.next(WAIT).await;
    assert_eq!(content_type(&message), Some("application/cloudevents+json"));
    assert_eq!(cloud_event(&message)["data"]["id"], 1);
    // Nobody subscribes to this one: the broker's "no matching
    // subscribers" is a published event, not an error.
    let unheard = http_client()
        .post(dev.url("/v1.0/publish/pubsub/nobody-listens"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(unheard.status(), 204);
}

/// Publishes with the real `mosquitto_pub` (MQTT5, QoS 1).
pub fn mosquitto_pub(broker: std::net::SocketAddr, topic: &str, message: &str, content_type: &str) {
    let status = std::process::Command::new("mosquitto_pub")
        .args(["-V", "mqttv5", "-q", "1", "-h", "127.0.0.1"])
        .args(["-p", &broker.port().to_string()])
        .args(["-t", topic, "-m", message])
        .args(["-D", "publish", "content-type", content_type])
        .status()
        .expect("mosquitto_pub runs");
    assert!(status.success(), "mosquitto_pub failed");
}

/// Publishes `message` on `topic` until `stream` shows an event (the
/// broker subscription is made as the stream opens, not before it
/// answers): the first event. Then publishes a marker and reads up to it,
/// so that no later copy of `message` is left to read.
async fn first_event(
    stream: &mut crate::support::sse::SseStream,
    broker: std::net::SocketAddr,
    topic: &str,
    message: &str,
) -> crate::support::sse::SseEvent {
    let deadline = std::time::Instant::now() + WAIT;
    let first = loop {
        mosquitto_pub(broker, topic, message, "text/plain");
        if let Some(event) = stream.next(Duration::from_millis(200)).await {
            break event;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no event within {WAIT:?}"
        );
    };
    // mosquitto_pub -q 1 returns once the broker took its message: the
    // marker comes after every copy published before it.
    mosquitto_pub(broker, topic, "settled", "text/plain");
    while stream.expect("message").await.data["payload"] != "settled" {}
    first
}

#[tokio::test]
async fn subscribe_streams_mqtt_and_dapr_messages_of_wildcard_topics() {
    let stack = Stack::start().await;
    let broker = stack.broker.addr;
    let client = http_client();
    let url = stack
        .gateway
        .url("/subscribe?topic=sensors/+/temp&topic=orders/%23");
    let mut stream = crate::support::sse::open(&client, &url, None)
        .await
        .unwrap();
    let mut second = crate::support::sse::open(&client, &url, None)
        .await
        .unwrap();
    for opened in [&mut stream, &mut second] {
        let subscribed = opened.expect("subscribed").await;
        assert_eq!(
            subscribed.data,
            serde_json::json!({"topics": ["sensors/+/temp", "orders/#"]})
        );
    }
    let event = first_event(&mut stream, broker, "sensors/a/temp", "21.5").await;
    assert_eq!(event.event, "message");
    assert_eq!(
        event.data,
        serde_json::json!({"topic": "sensors/a/temp", "payload": "21.5", "encoding": "utf-8", "contentType": "text/plain"})
    );
    // One broker subscription per filter, whatever the number of streams.
    let hub = &stack.gateway.server().state().topics;
    assert_eq!(hub.filters(), 2);

    // A Dapr publish, a topic no filter matches, a binary payload.
    let published = client
        .post(stack.gateway.url("/v1.0/publish/pubsub/orders/eu"))
        .header("content-type", "application/json")
        .body(r#"{"id":7}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 204);
    let event = stream.expect("message").await;
    assert_eq!(event.data["topic"], "orders/eu");
    assert_eq!(event.data["contentType"], "application/cloudevents+json");
    let cloud_event: Value = serde_json::from_str(event.data["payload"].as_str().unwrap()).unwrap();
    assert_eq!(cloud_event["data"]["id"], 7);
    mosquitto_pub(broker, "sensors/a/humidity", "40", "text/plain");
    let raw = client
        .post(
            stack
                .gateway
                .url("/v1.0/publish/pubsub/sensors/b/temp?metadata.rawPayload=true"),
        )
        .header("content-type", "application/octet-stream")
        .body(vec![0xffu8, 0])
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 204);
    let event = stream.expect("message").await;
    assert_eq!(
        event.data,
        serde_json::json!({"topic": "sensors/b/temp", "payload": "/wA=", "encoding": "base64", "contentType": "application/octet-stream"})
    );

    // The second stream got the same, from its first event on.
    let mut topics = Vec::new();
    while let Some(event) = second.next(Duration::from_secs(2)).await {
        topics.push(event.data["topic"].as_str().unwrap().to_owned());
        if topics.last().map(String::as_str) == Some("sensors/b/temp") {
            break;
        }
    }
    assert_eq!(topics.last().map(String::as_str), Some("sensors/b/temp"));
    assert!(
        topics.iter().all(|topic| topic != "sensors/a/humidity"),
        "{topics:?}"
    );

    // The last stream to close ends the broker subscriptions.
    drop(stream);
    drop(second);
    let deadline = std::time::Instant::now() + WAIT;
    while hub.filters() != 0 {
        assert!(std::time::Instant::now() < deadline, "filters still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn subscribe_takes_valid_filters_the_callers_rules_grant() {
    const TOKEN: &str = "subscribe-api-t0ken";
    let (stack, _rules) = stack_with_topic_rule(TOKEN, "Subscribe", "orders/#").await;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .no_proxy()
        .build()
        .unwrap();
    let open = |query: &str| {
        let url = stack.gateway.url(&format!("/subscribe{query}"));
        let client = client.clone();
        async move { crate::support::sse::open(&client, &url, None).await }
    };
    for (query, status) in [
        ("", 400),
        ("?topic=orders/%23/eu", 400),
        ("?topic=orders&key=x", 400),
        ("?topic=%23", 403),
        ("?topic=orders/%23&topic=payments", 403),
    ] {
        let (got, _, body) = open(query).await.map(|_| ()).unwrap_err();
        assert_eq!(got, status, "{query}: {body}");
    }
    let mut stream = open("?topic=orders/+").await.unwrap();
    stream.expect("subscribed").await;
    let event = first_event(&mut stream, stack.broker.addr, "orders/eu", "x").await;
    assert_eq!(event.data["topic"], "orders/eu");
}
