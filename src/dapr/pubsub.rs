//! Dapr's pub/sub delivery rules, apart from any wire: the subscriptions
//! (programmatic, declarative, streaming), the routing rules (CEL over the
//! event), the event an MQTT message becomes, what an app's answer means
//! and how long a failed delivery waits before it is tried again.
//! `http::dapr::delivery` runs them against the app and the broker.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use thiserror::Error;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

pub use super::publish::{CLOUDEVENT_CONTENT_TYPE as CLOUD_EVENT_CONTENT_TYPE, DEFAULT_EVENT_TYPE};

/// The `type` of a bulk call to the app (components-contrib's
/// `DefaultBulkEventType`).
pub const DEFAULT_BULK_EVENT_TYPE: &str = "com.dapr.event.sent.bulk";

/// The key under which daprd names the pub/sub in a bulk call's metadata
/// (its `MetadataKeyPubSub`); an HTTP call also carries it as a header.
pub const BULK_METADATA_PUBSUB: &str = "pubsubName";

/// How a subscription was made, as daprd's metadata names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionKind {
    /// A `Subscription` resource (`--dapr-subscriptions`).
    Declarative,
    /// Asked of the app (`GET /dapr/subscribe`, `ListTopicSubscriptions`).
    Programmatic,
    /// Opened by the app (`SubscribeTopicEventsAlpha1`).
    Streaming,
}

impl SubscriptionKind {
    /// `DECLARATIVE`, `PROGRAMMATIC` or `STREAMING`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Declarative => "DECLARATIVE",
            Self::Programmatic => "PROGRAMMATIC",
            Self::Streaming => "STREAMING",
        }
    }
}

/// A subscription that cannot be used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SubscriptionError {
    /// The app's or the file's text is not a subscription list.
    #[error("malformed subscriptions: {0}")]
    Malformed(String),
    /// A routing rule does not compile.
    #[error("routing rule `{rule}` of topic {topic}: {message}")]
    Rule {
        /// The topic.
        topic: String,
        /// The rule's text.
        rule: String,
        /// The compiler's message.
        message: String,
    },
    /// A subscription names no topic or no pub/sub.
    #[error("a subscription needs a pubsubname and a topic")]
    Incomplete,
    /// A declarative subscription's file could not be read.
    #[error("cannot read {path}: {message}")]
    Unreadable {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
}

/// A routing rule's condition: a compiled CEL expression.
#[derive(Clone)]
pub struct Match {
    source: String,
    program: Arc<cel::Program>,
}

impl std::fmt::Debug for Match {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Match").field(&self.source).finish()
    }
}

impl PartialEq for Match {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Match {
    /// Compiles `source`.
    fn compile(topic: &str, source: &str) -> Result<Self, SubscriptionError> {
        let program = cel::Program::compile(source).map_err(|error| SubscriptionError::Rule {
            topic: topic.to_owned(),
            rule: source.to_owned(),
            message: error.to_string(),
        })?;
        Ok(Self {
            source: source.to_owned(),
            program: Arc::new(program),
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the event matches: an error when the expression fails or is
    /// not a boolean (daprd: the event goes to the dead letter or is retried).
    fn matches(&self, event: &cel::Value) -> Result<bool, String> {
        let mut context = cel::Context::default();
        context.add_variable_from_value("event", event.clone());
        match self.program.execute(&context) {
            Ok(cel::Value::Bool(matched)) => Ok(matched),
            Ok(other) => Err(format!(
                "the result of match expression {} was not a boolean: {other:?}",
                self.source
            )),
            Err(error) => Err(format!("{}: {error}", self.source)),
        }
    }
}

/// A route: the app's path for the events that match (every event when
/// there is no condition: the default route, always last).
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The condition; none for the default route.
    pub matcher: Option<Match>,
    /// The app's path (HTTP) or the event's `path` (gRPC).
    pub path: String,
}

/// Bulk delivery (`bulkSubscribe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkSubscribe {
    /// Events per call at most (daprd's default: 100).
    pub max_messages: usize,
    /// How long the first event of a call waits for others (daprd's
    /// default: 1 s).
    pub max_await: Duration,
}

/// One subscription.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    /// The pub/sub component's name.
    pub pubsub_name: String,
    /// The topic (an MQTT topic).
    pub topic: String,
    /// The subscription's metadata (`rawPayload`, ...).
    pub metadata: BTreeMap<String, String>,
    /// The routes, in order; the default (no condition) last.
    pub rules: Vec<Rule>,
    /// Where events go whose delivery failed for good.
    pub dead_letter_topic: Option<String>,
    /// Bulk delivery, when enabled.
    pub bulk: Option<BulkSubscribe>,
    /// How it was made.
    pub kind: SubscriptionKind,
}

/// The parts of a subscription as the three ways give them.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionParts {
    /// `pubsubname`.
    pub pubsub_name: String,
    /// `topic`.
    pub topic: String,
    /// `metadata`.
    pub metadata: BTreeMap<String, String>,
    /// `routes.rules`: (match, path).
    pub rules: Vec<(String, String)>,
    /// `routes.default`, or v1's `route`.
    pub default_path: String,
    /// `deadLetterTopic`.
    pub dead_letter_topic: String,
    /// `bulkSubscribe`: enabled, max messages, max await in ms.
    pub bulk: Option<(bool, i64, i64)>,
}

impl SubscriptionParts {
    /// The subscription, its rules compiled.
    pub fn build(self, kind: SubscriptionKind) -> Result<Subscription, SubscriptionError> {
        if self.pubsub_name.is_empty() || self.topic.is_empty() {
            return Err(SubscriptionError::Incomplete);
        }
        let mut rules = Vec::with_capacity(self.rules.len() + 1);
        for (source, path) in self.rules {
            let matcher = if source.trim().is_empty() {
                None
            } else {
                Some(Match::compile(&self.topic, &source)?)
            };
            rules.push(Rule { matcher, path });
        }
        if !self.default_path.is_empty() {
            rules.push(Rule {
                matcher: None,
                path: self.default_path,
            });
        }
        let bulk = match self.bulk {
            Some((true, max_messages, max_await_ms)) => Some(BulkSubscribe {
                max_messages: usize::try_from(max_messages)
                    .ok()
                    .filter(|&n| n > 0)
                    .unwrap_or(100),
                max_await: Duration::from_millis(
                    u64::try_from(max_await_ms)
                        .ok()
                        .filter(|&n| n > 0)
                        .unwrap_or(1000),
                ),
            }),
            _ => None,
        };
        Ok(Subscription {
            pubsub_name: self.pubsub_name,
            topic: self.topic,
            metadata: self.metadata,
            rules,
            dead_letter_topic: Some(self.dead_letter_topic).filter(|topic| !topic.is_empty()),
            bulk,
            kind,
        })
    }
}

impl Subscription {
    /// `metadata.rawPayload=true`: the events are the bytes published, not
    /// CloudEvents.
    pub fn raw_payload(&self) -> bool {
        self.metadata
            .get("rawPayload")
            .is_some_and(|value| value.eq_ignore_ascii_case("true"))
    }

    /// The path of the first route the event matches; `None` when none
    /// does (daprd drops the event); an error when a rule fails.
    pub fn route(&self, event: &Map<String, Value>) -> Result<Option<&str>, String> {
        let mut value = None;
        for rule in &self.rules {
            let Some(matcher) = &rule.matcher else {
                return Ok(Some(&rule.path));
            };
            let value = match &value {
                Some(value) => value,
                None => {
                    value.insert(cel::to_value(event).map_err(|error| format!("event: {error}"))?)
                }
            };
            if matcher.matches(value)? {
                return Ok(Some(&rule.path));
            }
        }
        Ok(None)
    }

    /// The default route's path, if any.
    pub fn default_path(&self) -> Option<&str> {
        self.rules
            .iter()
            .rev()
            .find(|rule| rule.matcher.is_none())
            .map(|rule| rule.path.as_str())
    }

    /// The conditional routes (match, path), as metadata lists them.
    pub fn conditional_rules(&self) -> impl Iterator<Item = (&str, &str)> {
        self.rules.iter().filter_map(|rule| {
            rule.matcher
                .as_ref()
                .map(|matcher| (matcher.source(), rule.path.as_str()))
        })
    }
}

/// Whether an MQTT topic filter (`+` and `#` wildcards) matches a topic.
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    let mut filter_levels = filter.split('/');
    let mut topic_levels = topic.split('/');
    loop {
        match (filter_levels.next(), topic_levels.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(level), Some(other)) if level == other => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The subscriptions in force, as metadata lists them.
#[derive(Debug, Default)]
pub struct SubscriptionTable {
    current: std::sync::RwLock<Vec<Subscription>>,
}

impl SubscriptionTable {
    /// The subscriptions now.
    pub fn list(&self) -> Vec<Subscription> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Adds one (a stream's).
    pub fn add(&self, subscription: Subscription) {
        self.current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(subscription);
    }

    /// Removes one (a stream's, when it ends).
    pub fn remove(&self, subscription: &Subscription) {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = current.iter().position(|other| other == subscription) {
            current.remove(at);
        }
    }

    /// Replaces the app's and the declarative ones, keeping the streams'.
    pub fn set_delivered(&self, subscriptions: Vec<Subscription>) {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        current.retain(|subscription| subscription.kind == SubscriptionKind::Streaming);
        current.extend(subscriptions);
    }
}

/// `GET /dapr/subscribe`'s entry: v1 (`route`) and v2 (`routes`) shapes.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubscriptionJson {
    #[serde(default)]
    pubsubname: String,
    #[serde(default)]
    topic: String,
    #[serde(default)]
    dead_letter_topic: String,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    route: String,
    #[serde(default)]
    routes: RoutesJson,
    #[serde(default)]
    bulk_subscribe: Option<BulkJson>,
}

#[derive(Debug, Default, Deserialize)]
struct RoutesJson {
    #[serde(default)]
    rules: Vec<RuleJson>,
    #[serde(default)]
    default: String,
}

#[derive(Debug, Deserialize)]
struct RuleJson {
    #[serde(default, rename = "match")]
    matches: String,
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BulkJson {
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    max_messages_count: i64,
    #[serde(default)]
    max_await_duration_ms: i64,
}

impl SubscriptionJson {
    fn parts(self) -> SubscriptionParts {
        SubscriptionParts {
            pubsub_name: self.pubsubname,
            topic: self.topic,
            metadata: self.metadata,
            rules: self
                .routes
                .rules
                .into_iter()
                .map(|rule| (rule.matches, rule.path))
                .collect(),
            // v2's default wins over v1's route, as in daprd.
            default_path: if self.routes.default.is_empty() {
                self.route
            } else {
                self.routes.default
            },
            dead_letter_topic: self.dead_letter_topic,
            bulk: self.bulk_subscribe.map(|bulk| {
                (
                    bulk.enabled,
                    bulk.max_messages_count,
                    bulk.max_await_duration_ms,
                )
            }),
        }
    }
}

/// The app's answer to `GET /dapr/subscribe` (an empty body: none).
pub fn programmatic(body: &[u8]) -> Result<Vec<Subscription>, SubscriptionError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let entries: Vec<SubscriptionJson> = serde_json::from_slice(body)
        .map_err(|error| SubscriptionError::Malformed(error.to_string()))?;
    entries
        .into_iter()
        .map(|entry| entry.parts().build(SubscriptionKind::Programmatic))
        .collect()
}

/// A `Subscription` resource (v1alpha1 or v2alpha1).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Resource {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    spec: Option<ResourceSpec>,
    #[serde(default)]
    scopes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResourceSpec {
    #[serde(default)]
    pubsubname: String,
    #[serde(default)]
    topic: String,
    #[serde(default)]
    dead_letter_topic: String,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    /// v1alpha1.
    #[serde(default)]
    route: String,
    /// v2alpha1.
    #[serde(default)]
    routes: RoutesJson,
    #[serde(default)]
    bulk_subscribe: Option<BulkJson>,
}

/// The `Subscription` resources of one YAML text (several documents
/// allowed; other kinds skipped) that apply to `app_id` (no scopes: every
/// app).
pub fn declarative(text: &str, app_id: &str) -> Result<Vec<Subscription>, SubscriptionError> {
    let resources: Vec<Resource> = serde_saphyr::from_multiple(text)
        .map_err(|error| SubscriptionError::Malformed(error.to_string()))?;
    let mut subscriptions = Vec::new();
    for resource in resources {
        if resource.kind != "Subscription" || !resource.api_version.starts_with("dapr.io/") {
            continue;
        }
        if !resource.scopes.is_empty() && !resource.scopes.iter().any(|scope| scope == app_id) {
            continue;
        }
        let Some(spec) = resource.spec else {
            return Err(SubscriptionError::Incomplete);
        };
        let parts = SubscriptionJson {
            pubsubname: spec.pubsubname,
            topic: spec.topic,
            dead_letter_topic: spec.dead_letter_topic,
            metadata: spec.metadata,
            route: spec.route,
            routes: spec.routes,
            bulk_subscribe: spec.bulk_subscribe,
        }
        .parts();
        subscriptions.push(parts.build(SubscriptionKind::Declarative)?);
    }
    Ok(subscriptions)
}

/// The declarative subscriptions of a file, or of every `.yaml`/`.yml`
/// file of a directory (in name order).
pub fn declarative_from_path(
    path: &Path,
    app_id: &str,
) -> Result<Vec<Subscription>, SubscriptionError> {
    let unreadable = |path: &Path, error: std::io::Error| SubscriptionError::Unreadable {
        path: path.display().to_string(),
        message: error.to_string(),
    };
    let files = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(|error| unreadable(path, error))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|file| {
                file.extension()
                    .is_some_and(|ext| ext == "yaml" || ext == "yml")
            })
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut subscriptions = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|error| unreadable(&file, error))?;
        subscriptions.extend(declarative(&text, app_id).map_err(|error| match error {
            SubscriptionError::Malformed(message) => {
                SubscriptionError::Malformed(format!("{}: {message}", file.display()))
            }
            other => other,
        })?);
    }
    Ok(subscriptions)
}

/// An event ready for delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The CloudEvent (rules and gRPC read it).
    pub cloud_event: Map<String, Value>,
    /// What an HTTP app gets: the bytes published when they are a
    /// CloudEvent, the CloudEvent the gateway made of them otherwise.
    pub body: Bytes,
}

impl Event {
    /// The event's `id`.
    pub fn id(&self) -> &str {
        self.text("id")
    }

    /// A text attribute of the event, empty when absent.
    pub fn text(&self, name: &str) -> &str {
        self.cloud_event
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The event's data as bytes (gRPC's `data`): `data_base64` decoded, a
    /// text as it is, any other JSON value as JSON.
    pub fn data_bytes(&self) -> Bytes {
        if let Some(encoded) = self.cloud_event.get("data_base64").and_then(Value::as_str) {
            return base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map(Bytes::from)
                .unwrap_or_default();
        }
        match self.cloud_event.get("data") {
            None | Some(Value::Null) => Bytes::new(),
            Some(Value::String(text)) => Bytes::from(text.clone()),
            Some(other) => Bytes::from(other.to_string()),
        }
    }

    /// Whether the event carries an `expiration` in the past (daprd drops it).
    pub fn has_expired(&self, now: std::time::SystemTime) -> bool {
        self.cloud_event
            .get("expiration")
            .and_then(Value::as_str)
            .and_then(rfc3339)
            .is_some_and(|expiry| expiry < now)
    }
}

/// An RFC 3339 time (`2024-01-01T00:00:00Z`, with an optional fraction and
/// offset), as daprd writes and reads `expiration` (Go's `time.RFC3339`).
fn rfc3339(text: &str) -> Option<std::time::SystemTime> {
    // The crate also reads RFC 3339's other separator, a space; Go does not.
    if !matches!(text.as_bytes().get(10), Some(b'T' | b't')) {
        return None;
    }
    OffsetDateTime::parse(text, &Rfc3339)
        .ok()
        .map(std::time::SystemTime::from)
}

/// The event an MQTT message is for a subscription:
///
/// - `rawPayload`: wrapped as daprd wraps a component's raw message
///   (`data_base64`, `application/octet-stream`, source `unknown`);
/// - a JSON object with a `specversion`: the CloudEvent as published;
/// - anything else (a message from `mosquitto_pub`, an AIO SDK, a data
///   flow): wrapped as daprd wraps a published body that is not a
///   CloudEvent: JSON as `data`, text as a string, other bytes as
///   `data_base64`, typed by the message's MQTT content type.
pub fn event_of(
    payload: &Bytes,
    content_type: Option<&str>,
    topic: &str,
    pubsub: &str,
    raw_payload: bool,
    new_id: impl FnOnce() -> String,
) -> Event {
    if !raw_payload
        && let Ok(Value::Object(cloud_event)) = serde_json::from_slice::<Value>(payload)
        && cloud_event.contains_key("specversion")
    {
        return Event {
            cloud_event,
            body: payload.clone(),
        };
    }
    let mut cloud_event = Map::new();
    cloud_event.insert("id".into(), new_id().into());
    cloud_event.insert("specversion".into(), "1.0".into());
    cloud_event.insert("source".into(), "unknown".into());
    cloud_event.insert("type".into(), DEFAULT_EVENT_TYPE.into());
    cloud_event.insert("topic".into(), topic.into());
    cloud_event.insert("pubsubname".into(), pubsub.into());
    let content_type = content_type.filter(|text| !text.is_empty());
    let json_typed = content_type.is_none_or(|text| text.contains("json"));
    let text_typed = content_type.is_some_and(|text| text.starts_with("text/"));
    match serde_json::from_slice::<Value>(payload) {
        Ok(data) if !raw_payload && json_typed => {
            cloud_event.insert(
                "datacontenttype".into(),
                content_type.unwrap_or("application/json").into(),
            );
            cloud_event.insert("data".into(), data);
        }
        _ => match std::str::from_utf8(payload) {
            Ok(text) if !raw_payload && (text_typed || content_type.is_none()) => {
                cloud_event.insert(
                    "datacontenttype".into(),
                    content_type.unwrap_or("text/plain").into(),
                );
                cloud_event.insert("data".into(), text.into());
            }
            _ => {
                cloud_event.insert(
                    "datacontenttype".into(),
                    if raw_payload {
                        "application/octet-stream"
                    } else {
                        content_type.unwrap_or("application/octet-stream")
                    }
                    .into(),
                );
                cloud_event.insert(
                    "data_base64".into(),
                    base64::engine::general_purpose::STANDARD
                        .encode(payload)
                        .into(),
                );
            }
        },
    }
    let body = Bytes::from(Value::Object(cloud_event.clone()).to_string());
    Event { cloud_event, body }
}

/// What the app did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Processed: acknowledged.
    Success,
    /// To be tried again.
    Retry,
    /// Not to be tried again: acknowledged (and sent to the dead letter
    /// topic, if any).
    Drop,
}

impl Outcome {
    /// `SUCCESS`, `RETRY`, `DROP`: the status names of Dapr's answers.
    pub fn parse_status(status: &str) -> Option<Self> {
        match status {
            "SUCCESS" => Some(Self::Success),
            "RETRY" => Some(Self::Retry),
            "DROP" => Some(Self::Drop),
            _ => None,
        }
    }
}

/// An HTTP app's answer to one event, as daprd reads it: 2xx with no body,
/// a body that is not `{"status": ...}`, an empty or `SUCCESS` status is
/// success; `RETRY` and unknown statuses retry; `DROP` drops; 404 drops
/// (with a warning); any other status retries.
pub fn http_outcome(status: u16, body: &[u8]) -> Outcome {
    if (200..300).contains(&status) {
        #[derive(Deserialize)]
        struct AppResponse {
            #[serde(default)]
            status: String,
        }
        return match serde_json::from_slice::<AppResponse>(body) {
            Err(_) => Outcome::Success,
            Ok(answer) if answer.status.is_empty() => Outcome::Success,
            Ok(answer) => Outcome::parse_status(&answer.status)
                .filter(|outcome| *outcome != Outcome::Success || answer.status == "SUCCESS")
                .unwrap_or(Outcome::Retry),
        };
    }
    if status == 404 {
        Outcome::Drop
    } else {
        Outcome::Retry
    }
}

/// One entry of a bulk answer: (entryId, outcome).
pub fn http_bulk_outcomes(body: &[u8]) -> Option<Vec<(String, Outcome)>> {
    #[derive(Deserialize)]
    struct BulkAnswer {
        #[serde(default)]
        statuses: Vec<BulkStatus>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct BulkStatus {
        #[serde(default)]
        entry_id: String,
        #[serde(default)]
        status: String,
    }
    let answer: BulkAnswer = serde_json::from_slice(body).ok()?;
    Some(
        answer
            .statuses
            .into_iter()
            .map(|entry| {
                // An empty or unknown status retries, as in daprd.
                let outcome = Outcome::parse_status(&entry.status).unwrap_or(Outcome::Retry);
                (entry.entry_id, outcome)
            })
            .collect(),
    )
}

/// The body of a bulk delivery to an HTTP app, as daprd's: the entries,
/// each with its `entryId`, `event` (the CloudEvent, or the raw bytes as
/// base64 for `rawPayload`), `contentType` and `metadata`.
pub fn http_bulk_body(
    subscription: &Subscription,
    entries: &[(String, &Event, Option<&Bytes>)],
) -> Bytes {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(entry_id, event, raw)| match raw {
            Some(raw) => json!({
                "entryId": entry_id,
                "event": base64::engine::general_purpose::STANDARD.encode(raw),
                "contentType": "application/octet-stream",
                "metadata": {},
            }),
            None => json!({
                "entryId": entry_id,
                "event": event.cloud_event,
                "contentType": CLOUD_EVENT_CONTENT_TYPE,
                "metadata": {},
            }),
        })
        .collect();
    Bytes::from(
        json!({
            "id": format!("{:032x}", rand::random::<u128>()),
            "entries": entries,
            "topic": subscription.topic,
            "pubsubname": subscription.pubsub_name,
            "type": DEFAULT_BULK_EVENT_TYPE,
            "metadata": { BULK_METADATA_PUBSUB: subscription.pubsub_name },
        })
        .to_string(),
    )
}

/// How long delivery waits before trying an event again, as Dapr's
/// default exponential resiliency policy (500 ms, times 1.5 each time, at
/// most 60 s, randomised by half either way), for at most
/// [`RetryPolicy::max_attempts`] calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// The first wait.
    pub initial: Duration,
    /// The factor between waits.
    pub multiplier: f64,
    /// The longest wait.
    pub max_interval: Duration,
    /// Calls to the app per event before it goes to the dead letter topic
    /// (without one: it is left unacknowledged, and the broker sends it
    /// again after the next reconnect).
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            multiplier: 1.5,
            max_interval: Duration::from_secs(60),
            max_attempts: 5,
        }
    }
}

impl RetryPolicy {
    /// The wait after the `attempt`-th failed call (1 for the first).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self
            .initial
            .mul_f64(self.multiplier.powi(exponent).min(1e6))
            .min(self.max_interval);
        // Randomised by half either way, as Dapr's (backoff's default).
        base.mul_f64(0.5 + rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(subscriptions: Vec<Subscription>) -> Subscription {
        assert_eq!(subscriptions.len(), 1, "{subscriptions:?}");
        subscriptions.into_iter().next().unwrap()
    }

    #[test]
    fn the_v1_and_v2_shapes_of_dapr_subscribe_are_read() {
        let v1 = only(
            programmatic(
                br#"[{"pubsubname":"pubsub","topic":"orders","route":"/orders","deadLetterTopic":"dead","metadata":{"rawPayload":"true"}}]"#,
            )
            .unwrap(),
        );
        assert_eq!(v1.default_path(), Some("/orders"));
        assert_eq!(v1.dead_letter_topic.as_deref(), Some("dead"));
        assert!(v1.raw_payload());
        assert_eq!(v1.kind, SubscriptionKind::Programmatic);
        let v2 = only(
            programmatic(
                br#"[{"pubsubname":"pubsub","topic":"orders","routes":{"rules":[{"match":"event.type == \"big\"","path":"/big"}],"default":"/other"},"bulkSubscribe":{"enabled":true,"maxMessagesCount":10}}]"#,
            )
            .unwrap(),
        );
        assert_eq!(
            v2.conditional_rules().collect::<Vec<_>>(),
            [("event.type == \"big\"", "/big")]
        );
        assert_eq!(v2.default_path(), Some("/other"));
        assert_eq!(
            v2.bulk,
            Some(BulkSubscribe {
                max_messages: 10,
                max_await: Duration::from_secs(1)
            })
        );
        assert!(programmatic(b"").unwrap().is_empty());
        assert!(matches!(
            programmatic(b"{").unwrap_err(),
            SubscriptionError::Malformed(_)
        ));
        assert_eq!(
            programmatic(br#"[{"topic":"orders"}]"#).unwrap_err(),
            SubscriptionError::Incomplete
        );
        assert!(matches!(
            programmatic(br#"[{"pubsubname":"p","topic":"t","routes":{"rules":[{"match":"event.type ==","path":"/x"}]}}]"#)
                .unwrap_err(),
            SubscriptionError::Rule { .. }
        ));
    }

    #[test]
    fn rules_are_cel_over_the_event_first_match_wins_and_default_last() {
        let subscription = only(
            programmatic(
                br#"[{"pubsubname":"pubsub","topic":"orders","routes":{"rules":[
                    {"match":"event.type == \"widget\"","path":"/widgets"},
                    {"match":"event.data.kind == \"gadget\" && event.data.size > 2","path":"/gadgets"}],
                    "default":"/orders"}}]"#,
            )
            .unwrap(),
        );
        let event = |value: Value| value.as_object().unwrap().clone();
        assert_eq!(
            subscription.route(&event(json!({"type": "widget"}))),
            Ok(Some("/widgets"))
        );
        assert_eq!(
            subscription.route(&event(
                json!({"type": "x", "data": {"kind": "gadget", "size": 3}})
            )),
            Ok(Some("/gadgets"))
        );
        assert_eq!(
            subscription.route(&event(
                json!({"type": "x", "data": {"kind": "gadget", "size": 1}})
            )),
            Ok(Some("/orders"))
        );
        let without_default = only(
            programmatic(
                br#"[{"pubsubname":"pubsub","topic":"orders","routes":{"rules":[{"match":"event.type == \"widget\"","path":"/widgets"}]}}]"#,
            )
            .unwrap(),
        );
        assert_eq!(
            without_default.route(&event(json!({"type": "x"}))),
            Ok(None)
        );
        let not_boolean = only(
            programmatic(
                br#"[{"pubsubname":"pubsub","topic":"orders","routes":{"rules":[{"match":"event.type","path":"/widgets"}]}}]"#,
            )
            .unwrap(),
        );
        assert!(not_boolean.route(&event(json!({"type": "x"}))).is_err());
    }

    #[test]
    fn declarative_resources_of_both_versions_with_scopes() {
        let yaml = r#"
apiVersion: dapr.io/v2alpha1
kind: Subscription
metadata:
  name: orders
spec:
  pubsubname: pubsub
  topic: orders
  routes:
    rules:
      - match: event.type == "big"
        path: /big
    default: /orders
  deadLetterTopic: orders-dead
scopes:
  - checkout
---
apiVersion: dapr.io/v1alpha1
kind: Subscription
metadata:
  name: audit
spec:
  pubsubname: pubsub
  topic: audit
  route: /audit
---
apiVersion: dapr.io/v1alpha1
kind: Component
metadata:
  name: other
spec:
  type: state.redis
---
apiVersion: dapr.io/v2alpha1
kind: Subscription
metadata:
  name: elsewhere
spec:
  pubsubname: pubsub
  topic: elsewhere
  routes:
    default: /elsewhere
scopes: [billing]
"#;
        let subscriptions = declarative(yaml, "checkout").unwrap();
        assert_eq!(subscriptions.len(), 2);
        assert_eq!(subscriptions[0].topic, "orders");
        assert_eq!(subscriptions[0].kind, SubscriptionKind::Declarative);
        assert_eq!(
            subscriptions[0].dead_letter_topic.as_deref(),
            Some("orders-dead")
        );
        assert_eq!(subscriptions[0].rules.len(), 2);
        assert_eq!(subscriptions[1].default_path(), Some("/audit"));
        assert_eq!(declarative(yaml, "billing").unwrap().len(), 2);
        assert!(declarative("a: [", "x").is_err());
    }

    #[test]
    fn messages_become_events_as_daprd_makes_them() {
        let id = || "id-1".to_owned();
        let published = Bytes::from_static(
            br#"{"specversion":"1.0","id":"e1","type":"t","source":"s","data":{"a":1}}"#,
        );
        let event = event_of(
            &published,
            Some(CLOUD_EVENT_CONTENT_TYPE),
            "orders",
            "pubsub",
            false,
            id,
        );
        assert_eq!(event.body, published);
        assert_eq!(event.id(), "e1");
        assert_eq!(event.data_bytes(), Bytes::from_static(br#"{"a":1}"#));

        let json_body = event_of(
            &Bytes::from_static(br#"{"kind":"x"}"#),
            None,
            "orders",
            "pubsub",
            false,
            id,
        );
        assert_eq!(json_body.cloud_event["data"], json!({"kind": "x"}));
        assert_eq!(json_body.cloud_event["datacontenttype"], "application/json");
        assert_eq!(json_body.cloud_event["topic"], "orders");
        assert_eq!(json_body.cloud_event["pubsubname"], "pubsub");
        assert_eq!(json_body.cloud_event["type"], DEFAULT_EVENT_TYPE);
        assert_eq!(
            serde_json::from_slice::<Value>(&json_body.body).unwrap(),
            Value::Object(json_body.cloud_event.clone())
        );

        let text = event_of(
            &Bytes::from_static(b"hello"),
            None,
            "orders",
            "pubsub",
            false,
            id,
        );
        assert_eq!(text.cloud_event["data"], "hello");
        assert_eq!(text.cloud_event["datacontenttype"], "text/plain");
        assert_eq!(text.data_bytes(), Bytes::from_static(b"hello"));

        let binary = event_of(
            &Bytes::from_static(&[0xff, 0x00]),
            None,
            "orders",
            "pubsub",
            false,
            id,
        );
        assert_eq!(binary.cloud_event["data_base64"], "/wA=");
        assert_eq!(binary.data_bytes(), Bytes::from_static(&[0xff, 0x00]));

        let raw = event_of(
            &published,
            Some(CLOUD_EVENT_CONTENT_TYPE),
            "orders",
            "pubsub",
            true,
            id,
        );
        assert_eq!(
            raw.cloud_event["datacontenttype"],
            "application/octet-stream"
        );
        assert_eq!(raw.data_bytes(), published);
    }

    #[test]
    fn app_answers_mean_what_they_mean_to_daprd() {
        assert_eq!(http_outcome(200, b""), Outcome::Success);
        assert_eq!(http_outcome(204, b"not json"), Outcome::Success);
        assert_eq!(
            http_outcome(200, br#"{"status":"SUCCESS"}"#),
            Outcome::Success
        );
        assert_eq!(http_outcome(200, br#"{"status":""}"#), Outcome::Success);
        assert_eq!(http_outcome(200, br#"{"status":"RETRY"}"#), Outcome::Retry);
        assert_eq!(http_outcome(200, br#"{"status":"DROP"}"#), Outcome::Drop);
        assert_eq!(http_outcome(200, br#"{"status":"MAYBE"}"#), Outcome::Retry);
        assert_eq!(http_outcome(404, b""), Outcome::Drop);
        assert_eq!(http_outcome(500, b""), Outcome::Retry);
        assert_eq!(
            http_outcome(400, br#"{"status":"SUCCESS"}"#),
            Outcome::Retry
        );
        assert_eq!(
            http_bulk_outcomes(br#"{"statuses":[{"entryId":"1","status":"SUCCESS"},{"entryId":"2","status":"DROP"},{"entryId":"3"}]}"#),
            Some(vec![
                ("1".to_owned(), Outcome::Success),
                ("2".to_owned(), Outcome::Drop),
                ("3".to_owned(), Outcome::Retry)
            ])
        );
    }

    #[test]
    fn retries_back_off_exponentially_within_bounds() {
        let policy = RetryPolicy::default();
        for attempt in 1..=30 {
            let base = Duration::from_millis(500)
                .mul_f64(1.5f64.powi(attempt - 1))
                .min(Duration::from_secs(60));
            let delay = policy.delay(attempt as u32);
            assert!(
                delay >= base / 2 && delay <= base.mul_f64(1.5),
                "{attempt}: {delay:?}"
            );
        }
    }

    #[test]
    fn topic_filters_match_as_mqtt_matches() {
        assert!(topic_matches("orders", "orders"));
        assert!(!topic_matches("orders", "orders/1"));
        assert!(topic_matches("orders/+", "orders/1"));
        assert!(topic_matches("orders/#", "orders/1/2"));
        assert!(!topic_matches("orders/+", "other/1"));
    }

    #[test]
    fn expired_events_are_told() {
        let event = |expiration: &str| Event {
            cloud_event: json!({"expiration": expiration})
                .as_object()
                .unwrap()
                .clone(),
            body: Bytes::new(),
        };
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert!(event("2023-11-14T22:13:19Z").has_expired(now));
        assert!(!event("2023-11-14T22:13:21Z").has_expired(now));
        assert!(!event("2023-11-14T23:13:19.5+01:00").has_expired(now - Duration::from_secs(2)));
        assert!(!event("garbage").has_expired(now));
        // Go's RFC 3339: lower-case separators read, other layouts not.
        assert!(event("2023-11-14t22:13:19z").has_expired(now));
        assert!(!event("2023-11-14 22:13:19Z").has_expired(now));
        assert!(!event("2023-11-14T22:13:19").has_expired(now));
        assert!(!event("2023-13-14T22:13:19Z").has_expired(now));
    }
}
