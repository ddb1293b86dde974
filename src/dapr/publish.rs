//! Dapr's publish over the broker: each event is one MQTT5 message at QoS
//! 1 on the topic of the Dapr topic's name, as a CloudEvent made as daprd
//! makes it (`components-contrib/pubsub/envelope.go`), or as the bytes
//! themselves with `metadata.rawPayload=true`.
//!
//! - Data that is already a CloudEvent (content type
//!   `application/cloudevents+json`) is completed: `topic` and
//!   `pubsubname` set, `time`, `traceid`/`traceparent`, `tracestate`,
//!   `source`, `type` and `specversion` added when absent.
//! - Any other data is wrapped: `id` (a UUID v4, or `cloudevent.id`),
//!   `source` (the app id), `type` (`com.dapr.event.sent`), `specversion`
//!   `1.0`, `datacontenttype` (`text/plain` when none), `data` (JSON
//!   inline for a JSON content type, `data_base64` for
//!   `application/octet-stream`, text otherwise), `topic`, `pubsubname`,
//!   `traceid` = `traceparent` (a span of the caller's trace, or a new
//!   trace), `tracestate`, `time`; `metadata.cloudevent.*` overrides `id`,
//!   `source`, `type`, `subject`, `traceid`, `traceparent` and
//!   `tracestate`, as in daprd.
//! - `metadata.ttlInSeconds` sets the message expiry interval, and the
//!   CloudEvent's `expiration`, as daprd adds it for a component that has
//!   no TTL of its own.
//!
//! The event's keys are written in order (as Go's `encoding/json` writes a
//! map); JSON data is embedded as sent, without its whitespace.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use serde_json::value::RawValue;
use thiserror::Error;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::mqtt::{Message, PublishError};
use crate::trace;

/// The MQTT5 content type of a CloudEvent, and the content type that
/// marks data as one already.
pub const CLOUDEVENT_CONTENT_TYPE: &str = "application/cloudevents+json";

/// The pub/sub component's type in Dapr's metadata.
pub const PUBSUB_COMPONENT_TYPE: &str = "pubsub.azure.iotoperations";

/// daprd's default event type (of an event it wraps).
pub const DEFAULT_EVENT_TYPE: &str = "com.dapr.event.sent";

/// One event to publish, as either front end reads it off the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// The Dapr topic (checked: a topic MQTT allows in a publish).
    pub topic: String,
    /// The data.
    pub data: Bytes,
    /// Its content type (empty: none).
    pub content_type: String,
    /// The request's metadata (`rawPayload`, `ttlInSeconds`,
    /// `cloudevent.*`).
    pub metadata: HashMap<String, String>,
}

/// Why an event was not published (or may not have been).
#[derive(Debug, Clone, Error)]
pub enum PubsubError {
    /// `rawPayload` or `ttlInSeconds` cannot be read.
    #[error("failed deserializing metadata. Error: {0}")]
    Metadata(String),
    /// Data sent as a CloudEvent is not a JSON object (why, as daprd
    /// names it in the error's details).
    #[error("cannot create cloudevent")]
    CloudEvent(String),
    /// The broker did not take the message.
    #[error(transparent)]
    Publish(#[from] PublishError),
}

/// `metadata.rawPayload`, read as Go's `strconv.ParseBool` reads it.
fn raw_payload(metadata: &HashMap<String, String>) -> Result<bool, PubsubError> {
    match metadata.get("rawPayload").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
        Some(other) => Err(PubsubError::Metadata(format!(
            "rawPayload value must be a valid boolean: actual is '{other}'"
        ))),
    }
}

/// `metadata.ttlInSeconds` (any case, as Dapr reads it): whole seconds,
/// more than zero.
fn ttl_seconds(metadata: &HashMap<String, String>) -> Result<Option<u64>, PubsubError> {
    let Some((_, value)) = metadata
        .iter()
        .find(|(name, value)| name.eq_ignore_ascii_case("ttlInSeconds") && !value.is_empty())
    else {
        return Ok(None);
    };
    let seconds: i64 = value.trim().parse().map_err(|_| {
        PubsubError::Metadata(format!(
            "ttlInSeconds value must be a valid integer: actual is '{value}'"
        ))
    })?;
    match u64::try_from(seconds) {
        Ok(seconds) if seconds > 0 => Ok(Some(seconds)),
        _ => Err(PubsubError::Metadata(format!(
            "ttlInSeconds value must be higher than zero: actual is '{seconds}'"
        ))),
    }
}

/// The MQTT message of `event` on the pub/sub component `pubsub`, from
/// the app `app_id`, at `now`.
pub fn message(
    app_id: &str,
    pubsub: &str,
    event: Event,
    now: SystemTime,
) -> Result<Message, PubsubError> {
    let ttl = ttl_seconds(&event.metadata)?;
    let expiry_seconds = ttl.map(|seconds| u32::try_from(seconds).unwrap_or(u32::MAX));
    if raw_payload(&event.metadata)? {
        return Ok(Message {
            topic: event.topic,
            payload: event.data,
            content_type: Some(event.content_type).filter(|content_type| !content_type.is_empty()),
            expiry_seconds,
            user_properties: Vec::new(),
        });
    }
    let trace = Trace::of_request();
    let mut cloud_event = if is_content_type(&event.content_type, CLOUDEVENT_CONTENT_TYPE) {
        complete(&event, pubsub, &trace, now)?
    } else {
        wrap(&event, app_id, pubsub, &trace, now)
    };
    if let Some(seconds) = ttl {
        let expiration = now + std::time::Duration::from_secs(seconds.min(u64::from(u32::MAX)));
        cloud_event.insert("expiration".into(), json_string(&rfc3339(expiration)));
    }
    let payload = serde_json::to_vec(&cloud_event)
        .map_err(|error| PubsubError::CloudEvent(error.to_string()))?;
    Ok(Message {
        topic: event.topic,
        payload: Bytes::from(payload),
        content_type: Some(CLOUDEVENT_CONTENT_TYPE.to_owned()),
        expiry_seconds,
        user_properties: Vec::new(),
    })
}

/// A CloudEvent: its attributes by name, each as its JSON text.
pub(super) type CloudEvent = BTreeMap<String, Box<RawValue>>;

/// The trace context an event carries: a span of the caller's trace (as
/// daprd's own span of the request), or of a new trace.
pub(super) struct Trace {
    pub(super) traceparent: String,
    pub(super) tracestate: String,
}

impl Trace {
    pub(super) fn of_request() -> Self {
        let span_id: [u8; 8] = rand::random();
        let (trace_id, flags, tracestate) = trace::with_current(|context| {
            (
                context.trace_id(),
                context.flags(),
                context.tracestate().unwrap_or_default().to_owned(),
            )
        })
        .unwrap_or_else(|| (rand::random(), 0, String::new()));
        Self {
            traceparent: format!(
                "00-{}-{}-{:02x}",
                hex::encode(trace_id),
                hex::encode(span_id),
                flags
            ),
            tracestate,
        }
    }
}

/// Wraps data that is not a CloudEvent.
fn wrap(event: &Event, app_id: &str, pubsub: &str, trace: &Trace, now: SystemTime) -> CloudEvent {
    // `cloudevent.<attribute>` metadata overrides, names in any case.
    let overridden = |attribute: &str| {
        event
            .metadata
            .iter()
            .find(|(name, value)| {
                !value.is_empty()
                    && name
                        .strip_prefix("cloudevent.")
                        .is_some_and(|name| name.eq_ignore_ascii_case(attribute))
            })
            .map(|(_, value)| value.clone())
    };
    let content_type = if event.content_type.is_empty() {
        "text/plain"
    } else {
        event.content_type.as_str()
    };
    let traceparent = overridden("traceparent")
        .or_else(|| overridden("traceid"))
        .unwrap_or_else(|| trace.traceparent.clone());
    let mut cloud_event = CloudEvent::new();
    let mut set = |name: &str, value: &str| {
        cloud_event.insert(name.to_owned(), json_string(value));
    };
    set("id", &overridden("id").unwrap_or_else(uuid_v4));
    set("specversion", "1.0");
    set("datacontenttype", content_type);
    set(
        "source",
        &overridden("source").unwrap_or_else(|| app_id.to_owned()),
    );
    set(
        "type",
        &overridden("type").unwrap_or_else(|| DEFAULT_EVENT_TYPE.to_owned()),
    );
    set("topic", &event.topic);
    set("pubsubname", pubsub);
    set("traceid", &traceparent);
    set("traceparent", &traceparent);
    set(
        "tracestate",
        &overridden("tracestate").unwrap_or_else(|| trace.tracestate.clone()),
    );
    set("time", &rfc3339(now));
    if let Some(subject) = overridden("subject") {
        set("subject", &subject);
    }
    let (field, data) = data_attribute(content_type, &event.data);
    cloud_event.insert(field.to_owned(), data);
    cloud_event
}

/// The attribute `data` of `content_type` goes in, as daprd puts it:
/// JSON inline for `application/json` (a string when it is not JSON),
/// `data_base64` for `application/octet-stream`, text otherwise.
pub(super) fn data_attribute(content_type: &str, data: &[u8]) -> (&'static str, Box<RawValue>) {
    if is_content_type(content_type, "application/json") {
        match std::str::from_utf8(data)
            .ok()
            .and_then(|text| RawValue::from_string(compact_json(text)).ok())
        {
            Some(json) => ("data", json),
            None => ("data", json_string(&String::from_utf8_lossy(data))),
        }
    } else if is_content_type(content_type, "application/octet-stream") {
        ("data_base64", json_string(&BASE64.encode(data)))
    } else {
        ("data", json_string(&String::from_utf8_lossy(data)))
    }
}

/// Completes data that is a CloudEvent already.
fn complete(
    event: &Event,
    pubsub: &str,
    trace: &Trace,
    now: SystemTime,
) -> Result<CloudEvent, PubsubError> {
    let mut cloud_event: CloudEvent = serde_json::from_slice(&event.data)
        .map_err(|error| PubsubError::CloudEvent(error.to_string()))?;
    cloud_event
        .entry("time".to_owned())
        .or_insert_with(|| json_string(&rfc3339(now)));
    if !cloud_event.contains_key("traceid") {
        cloud_event.insert("traceid".into(), json_string(&trace.traceparent));
        cloud_event.insert("traceparent".into(), json_string(&trace.traceparent));
    }
    cloud_event
        .entry("tracestate".to_owned())
        .or_insert_with(|| json_string(&trace.tracestate));
    cloud_event.insert("topic".into(), json_string(&event.topic));
    cloud_event.insert("pubsubname".into(), json_string(pubsub));
    // Absent or null: daprd's defaults.
    for (name, default) in [
        ("source", "Dapr"),
        ("type", DEFAULT_EVENT_TYPE),
        ("specversion", "1.0"),
    ] {
        if cloud_event
            .get(name)
            .is_none_or(|value| value.get() == "null")
        {
            cloud_event.insert(name.to_owned(), json_string(default));
        }
    }
    Ok(cloud_event)
}

/// Whether `content_type` is `expected`, parameters aside, in any case.
pub(super) fn is_content_type(content_type: &str, expected: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default();
    essence.trim().eq_ignore_ascii_case(expected)
}

pub(super) fn json_string(text: &str) -> Box<RawValue> {
    serde_json::value::to_raw_value(text).expect("a string always serializes")
}

/// `json` without the whitespace between its tokens (strings kept as
/// written).
fn compact_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if matches!(c, ' ' | '\t' | '\n' | '\r') {
            continue;
        }
        out.push(c);
    }
    out
}

/// A random UUID (version 4, RFC 9562), as daprd's event ids.
pub(super) fn uuid_v4() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// `time` as RFC 3339 in UTC, to the second (Go's `time.RFC3339`);
/// before 1970 is 1970, past 9999 is 9999's last second (RFC 3339 has
/// four-digit years).
pub(super) fn rfc3339(time: SystemTime) -> String {
    /// 9999-12-31T23:59:59Z.
    const LAST: i64 = 253_402_300_799;
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_secs()).unwrap_or(LAST));
    OffsetDateTime::from_unix_timestamp(seconds.min(LAST))
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        // Unreachable: every second from 1970 to 9999 has a text.
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn event(data: &str, content_type: &str, metadata: &[(&str, &str)]) -> Event {
        Event {
            topic: "orders".into(),
            data: Bytes::copy_from_slice(data.as_bytes()),
            content_type: content_type.into(),
            metadata: metadata
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
        }
    }

    fn published(event: Event) -> (Message, serde_json::Value) {
        let message = message("checkout", "pubsub", event, at(1_700_000_000)).unwrap();
        let json = serde_json::from_slice(&message.payload).unwrap();
        (message, json)
    }

    #[test]
    fn json_data_is_wrapped_inline_as_daprd_wraps_it() {
        let (message, json) = published(event("{ \"id\": 1 }", "application/json", &[]));
        assert_eq!(message.topic, "orders");
        assert_eq!(
            message.content_type.as_deref(),
            Some(CLOUDEVENT_CONTENT_TYPE)
        );
        assert_eq!(message.expiry_seconds, None);
        assert_eq!(json["data"], serde_json::json!({"id": 1}));
        assert_eq!(json["datacontenttype"], "application/json");
        assert_eq!(json["source"], "checkout");
        assert_eq!(json["type"], "com.dapr.event.sent");
        assert_eq!(json["specversion"], "1.0");
        assert_eq!(json["topic"], "orders");
        assert_eq!(json["pubsubname"], "pubsub");
        assert_eq!(json["time"], "2023-11-14T22:13:20Z");
        assert_eq!(json["traceid"], json["traceparent"]);
        assert_eq!(json["traceparent"].as_str().unwrap().len(), 55);
        assert_eq!(json["tracestate"], "");
        let id = json["id"].as_str().unwrap();
        assert_eq!((id.len(), &id[14..15]), (36, "4"));
        // Keys in order, JSON data compacted as sent.
        let text = std::str::from_utf8(&message.payload).unwrap();
        assert!(
            text.starts_with("{\"data\":{\"id\":1},\"datacontenttype\""),
            "{text}"
        );
    }

    #[test]
    fn binary_data_is_base64_and_text_is_a_string() {
        let (_, json) = published(event("\u{1}\u{2}", "application/octet-stream", &[]));
        assert_eq!(json["data_base64"], "AQI=");
        assert_eq!(json.get("data"), None);
        let (_, json) = published(event("not json", "application/json", &[]));
        assert_eq!(json["data"], "not json");
        let (_, json) = published(event("hello", "", &[]));
        assert_eq!(json["data"], "hello");
        assert_eq!(json["datacontenttype"], "text/plain");
    }

    #[test]
    fn a_cloudevent_is_completed_not_wrapped() {
        let data = r#"{"id":"e-1","source":"mine","data":{"n":12345678901234567890},"type":null}"#;
        let (completed, json) = published(event(data, "application/cloudevents+json", &[]));
        assert_eq!(json["id"], "e-1");
        assert_eq!(json["source"], "mine");
        assert_eq!(json["type"], "com.dapr.event.sent");
        assert_eq!(json["specversion"], "1.0");
        assert_eq!(json["topic"], "orders");
        assert_eq!(json["pubsubname"], "pubsub");
        assert_eq!(json["time"], "2023-11-14T22:13:20Z");
        // Numbers kept as written, beyond what a float holds.
        let text = std::str::from_utf8(&completed.payload).unwrap();
        assert!(text.contains("12345678901234567890"), "{text}");
        let refused = message(
            "checkout",
            "pubsub",
            event("[1]", "application/cloudevents+json", &[]),
            at(0),
        );
        assert!(matches!(refused, Err(PubsubError::CloudEvent(_))));
    }

    #[test]
    fn metadata_overrides_attributes_and_ttl_sets_expiry_and_expiration() {
        let (message, json) = published(event(
            "x",
            "text/plain",
            &[
                ("cloudevent.ID", "my-id"),
                ("cloudevent.type", "my.type"),
                ("cloudevent.subject", "s"),
                ("cloudevent.traceparent", "tp"),
                ("ttlInSeconds", "60"),
            ],
        ));
        assert_eq!(json["id"], "my-id");
        assert_eq!(json["type"], "my.type");
        assert_eq!(json["subject"], "s");
        assert_eq!(
            (&json["traceparent"], &json["traceid"]),
            (&"tp".into(), &"tp".into())
        );
        assert_eq!(json["expiration"], "2023-11-14T22:14:20Z");
        assert_eq!(message.expiry_seconds, Some(60));
    }

    #[test]
    fn a_raw_payload_goes_out_as_it_is() {
        let message = message(
            "checkout",
            "pubsub",
            event(
                "\u{0}raw",
                "application/x-thing",
                &[("rawPayload", "true"), ("ttlInSeconds", "5")],
            ),
            at(0),
        )
        .unwrap();
        assert_eq!(&message.payload[..], b"\0raw");
        assert_eq!(message.content_type.as_deref(), Some("application/x-thing"));
        assert_eq!(message.expiry_seconds, Some(5));
    }

    #[test]
    fn unreadable_metadata_is_refused_with_daprs_messages() {
        for (metadata, expected) in [
            (
                ("rawPayload", "yes"),
                "failed deserializing metadata. Error: rawPayload value must be a valid boolean: actual is 'yes'",
            ),
            (
                ("ttlInSeconds", "soon"),
                "failed deserializing metadata. Error: ttlInSeconds value must be a valid integer: actual is 'soon'",
            ),
            (
                ("ttlInSeconds", "0"),
                "failed deserializing metadata. Error: ttlInSeconds value must be higher than zero: actual is '0'",
            ),
        ] {
            let error = message("a", "p", event("x", "", &[metadata]), at(0)).unwrap_err();
            assert_eq!(error.to_string(), expected);
        }
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(at(4_102_444_799)), "2099-12-31T23:59:59Z");
        // To the second, and within RFC 3339's years.
        assert_eq!(
            rfc3339(at(1_700_000_000) + Duration::from_millis(999)),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(rfc3339(at(300_000_000_000)), "9999-12-31T23:59:59Z");
    }
}
