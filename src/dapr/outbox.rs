//! Dapr's transactional outbox, as daprd does it
//! (`pkg/runtime/pubsub/outbox.go`): a state store with an outbox
//! (`--dapr-outbox-pubsub`, `--dapr-outbox-topic`: daprd's
//! `outboxPublishPubsub` and `outboxPublishTopic` metadata) publishes the
//! upserts of a transaction that committed, never of one that did not.
//!
//! 1. **Before the commit**, each upsert of the transaction becomes a
//!    CloudEvent ([`internal_event`]) with the id `outbox-<uuid>`,
//!    published to the internal topic `<app id><topic>outbox` and
//!    acknowledged by the broker; a publish that fails fails the
//!    transaction, which then never runs.
//! 2. **The commit** carries one marker per event: the key
//!    `dapr-outbox||<event id>` ([`OUTBOX_PREFIX`], reserved) set to `0`,
//!    `first-write`, as ops of the transaction itself, so they are
//!    committed (and rolled forward by whoever finds the transaction)
//!    with it, or not at all.
//! 3. **The relay** ([`relay`]): the internal topic's shared subscription
//!    (`$share/<app id>/<internal topic>`, so each event reaches one
//!    replica of the app), on a connection of its own with a persistent
//!    session and manual acknowledgements. For each event it waits a
//!    second, as daprd, then reads the marker the way a Dapr read reads a
//!    key (resolving a transaction that holds it). A marker present: the
//!    event goes out on the outbox's topic with `topic` and `pubsubname`
//!    set to the outbox's, and once the broker acknowledged it the marker
//!    is deleted and the internal event acknowledged (at least once). A
//!    marker still absent once the transaction's lease time has passed:
//!    the relay **fences** it, writing `aborted` in its place with
//!    `first-write` (kept a day), so the transaction can no longer commit
//!    (its marker op finds the key present), and the event is dropped.
//!    The marker's own lease orders the fence and the commit, so exactly
//!    the committed transactions are published.
//!
//! Deletes publish nothing, as in daprd. An upsert with the metadata
//! `outbox.projection: true` is not written: its value (and content type)
//! is what the event of the same key's other upsert carries instead of the
//! value the store gets.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::stream::{self, StreamExt as _};
use tokio::time::Instant;

use super::conditional::{self, Write};
use super::error::DaprError;
use super::keys::prefixed;
use super::publish::{
    CLOUDEVENT_CONTENT_TYPE, CloudEvent, DEFAULT_EVENT_TYPE, Trace, data_attribute,
    is_content_type, json_string, rfc3339, uuid_v4,
};
use super::settings::{DaprSettings, OutboxSettings};
use super::transaction::{self, RESOLVE, TxOp};
use crate::mqtt::{
    BrokerSettings, Message, Pool, Published, Received, Subscriber, SubscriberSettings,
};
use crate::protocol::{SetCondition, SetOptions};
use crate::store::StoreClient;
use crate::store::reserved::OUTBOX_PREFIX;

/// The metadata that makes an upsert a projection (any truthy value).
pub const PROJECTION: &str = "outbox.projection";

/// A committed marker's value, as daprd's.
const COMMITTED: &[u8] = b"0";
/// What the relay writes in place of a marker that never came.
const FENCED: &[u8] = b"aborted";
/// How long a fence stays: longer than any pause a transaction's gateway
/// could come back from (the transactions' abort markers' time).
const FENCE_KEPT: Duration = Duration::from_secs(24 * 3600);

/// daprd's wait before it first looks for the marker
/// (`defaultStateScanDelay`).
const SCAN_DELAY: Duration = Duration::from_secs(1);
/// The relay's in-flight limit (its receive maximum).
const RELAY_IN_FLIGHT: u16 = 64;
/// How long the broker keeps the relay's session while the gateway is
/// away: internal events published meanwhile wait that long.
const SESSION_EXPIRY: Duration = Duration::from_secs(3600);
/// The first pause between two looks at a marker, or two tries of a
/// relay step that failed.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two looks at a marker not there yet.
const LONGEST_LOOK: Duration = Duration::from_secs(1);
/// The longest pause between two tries of a relay step that failed.
const LONGEST_PAUSE: Duration = Duration::from_secs(30);
/// Internal events published at once, per transaction.
const PUBLISH_PARALLELISM: usize = 16;

/// One upsert of a transaction as the outbox reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The key as the app names it.
    pub key: String,
    /// The value as an event carries it: an HTTP value that is a JSON
    /// string, as its text (daprd formats the decoded value), anything
    /// else as sent.
    pub data: Bytes,
    /// The operation's metadata (the request's over it, over HTTP).
    pub metadata: HashMap<String, String>,
}

impl Change {
    /// The change of an upsert of `key` to `value`, a JSON value (Dapr's
    /// HTTP API): a JSON string carried as its text (daprd formats the
    /// value it decoded), unless the operation's `contentType` is JSON;
    /// anything else as its JSON text.
    pub fn of_json(key: String, value: &Bytes, metadata: HashMap<String, String>) -> Self {
        let json = metadata
            .get("contentType")
            .is_some_and(|content_type| is_content_type(content_type, "application/json"));
        let data = match value.first() {
            Some(b'"') if !json => {
                serde_json::from_slice::<String>(value).map_or_else(|_| value.clone(), Bytes::from)
            }
            _ => value.clone(),
        };
        Self {
            key,
            data,
            metadata,
        }
    }

    /// Whether the upsert is a projection (`outbox.projection`, truthy as
    /// Dapr reads it).
    pub fn is_projection(&self) -> bool {
        self.metadata
            .get(PROJECTION)
            .is_some_and(|value| is_truthy(value))
    }

    /// `contentType`, the one metadata daprd reads an event's content type
    /// from (empty: none).
    fn content_type(&self) -> &str {
        self.metadata.get("contentType").map_or("", String::as_str)
    }
}

/// Dapr's `IsTruthy`: `1`, `true`, `t`, `yes`, `y`, `on`, any case.
fn is_truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "t" | "yes" | "y" | "on"
    )
}

/// The internal topic of `app_id`'s outbox on `topic`, as daprd names it
/// (without a namespace): `<app id><topic>outbox`.
pub fn internal_topic(app_id: &str, topic: &str) -> String {
    format!("{app_id}{topic}outbox")
}

/// The marker key of the event `id`.
fn marker_key(id: &str) -> Bytes {
    prefixed(OUTBOX_PREFIX, id.as_bytes())
}

/// The internal event of `change` (the projection's value and content
/// type instead of its own, when the transaction has one for its key), as
/// daprd's `PublishInternal` makes it: `id` (`outbox-<uuid>`), `source`
/// (the app id), `type` `com.dapr.event.sent`, `specversion` `1.0`,
/// `datacontenttype` (`text/plain` when none), the data as a publish puts
/// it, an empty `topic`, `pubsubname` the outbox's, `traceid` the
/// request's trace, an empty `traceparent`, `tracestate`, `time`; then
/// every metadata entry of the operation as an attribute of its own but
/// `data` and `id`.
fn internal_event(
    id: &str,
    app_id: &str,
    pubsub: &str,
    change: &Change,
    projection: Option<&Change>,
    trace: &Trace,
    now: SystemTime,
) -> CloudEvent {
    let carried = projection.unwrap_or(change);
    let content_type = match carried.content_type() {
        "" => "text/plain",
        content_type => content_type,
    };
    let mut event = CloudEvent::new();
    let mut set = |name: &str, value: &str| {
        event.insert(name.to_owned(), json_string(value));
    };
    set("id", id);
    set("specversion", "1.0");
    set("datacontenttype", content_type);
    set("source", app_id);
    set("type", DEFAULT_EVENT_TYPE);
    set("topic", "");
    set("pubsubname", pubsub);
    set("traceid", &trace.traceparent);
    set("traceparent", "");
    set("tracestate", &trace.tracestate);
    set("time", &rfc3339(now));
    let (field, data) = data_attribute(content_type, &carried.data);
    event.insert(field.to_owned(), data);
    for (name, value) in &change.metadata {
        if name != "data" && name != "id" {
            event.insert(name.clone(), json_string(value));
        }
    }
    event
}

/// A transaction's changes made ready for its commit: the events to
/// publish before it, and the ops it commits with.
#[derive(Debug)]
pub(super) struct Prepared {
    /// The internal topic's messages.
    events: Vec<Message>,
    /// One marker op per event.
    pub markers: Vec<TxOp>,
}

/// The events and markers of a transaction's upserts (`changes`, in
/// order) and projections: one event per upsert, as daprd.
pub(super) fn prepare(
    settings: &DaprSettings,
    outbox: &OutboxSettings,
    changes: &[Change],
    projections: &[Change],
) -> Prepared {
    let trace = Trace::of_request();
    let now = SystemTime::now();
    let topic = internal_topic(&settings.app_id, &outbox.topic);
    let mut prepared = Prepared {
        events: Vec::with_capacity(changes.len()),
        markers: Vec::with_capacity(changes.len()),
    };
    for change in changes {
        let id = format!("outbox-{}", uuid_v4());
        let projection = projections.iter().rev().find(|p| p.key == change.key);
        let event = internal_event(
            &id,
            &settings.app_id,
            &outbox.pubsub,
            change,
            projection,
            &trace,
            now,
        );
        prepared.events.push(Message {
            topic: topic.clone(),
            payload: Bytes::from(serde_json::to_vec(&event).unwrap_or_default()),
            content_type: Some(CLOUDEVENT_CONTENT_TYPE.to_owned()),
            expiry_seconds: None,
            user_properties: Vec::new(),
        });
        prepared.markers.push(TxOp {
            key: marker_key(&id),
            value: Some(Bytes::from_static(COMMITTED)),
            ttl_ms: None,
            etag: None,
            only_if_absent: true,
        });
    }
    prepared
}

/// Publishes the internal events, a few at once; the first failure is the
/// answer (the transaction then does not run). An event the broker says
/// nobody subscribes to (PUBACK 0x10: no relay's session exists yet, as
/// on a gateway that has just started) fails too: its marker would never
/// be looked at.
pub(super) async fn publish_internal(
    pool: &Pool,
    app_id: &str,
    prepared: &Prepared,
) -> Result<(), DaprError> {
    let failures: Vec<String> = stream::iter(prepared.events.iter().cloned())
        .map(|message| async move {
            match pool.publish(message.clone()).await {
                Ok(Published::Accepted) => None,
                Ok(Published::NoSubscribers) => Some(format!(
                    "no outbox relay subscribes to {} yet",
                    message.topic
                )),
                Err(error) => Some(error.to_string()),
            }
        })
        .buffer_unordered(PUBLISH_PARALLELISM)
        .filter_map(std::future::ready)
        .collect()
        .await;
    match failures.into_iter().next() {
        None => Ok(()),
        Some(error) => Err(DaprError::Outbox {
            app_id: app_id.to_owned(),
            error,
        }),
    }
}

/// The relay's work, shared by its per-event tasks.
#[derive(Debug)]
struct Relay {
    store: StoreClient,
    settings: Arc<DaprSettings>,
    outbox: OutboxSettings,
    /// How long after an event arrived its marker is fenced, if absent:
    /// past the transaction's lease time.
    fence_after: Duration,
}

/// Relays the internal events of the outbox until the task is aborted
/// (shutdown): events in flight then stay unacknowledged, and the broker
/// sends them again to the next session.
pub(super) async fn relay(
    store: StoreClient,
    settings: Arc<DaprSettings>,
    outbox: OutboxSettings,
    broker: BrokerSettings,
    client_id: String,
    ready: Arc<AtomicBool>,
) {
    let topic = internal_topic(&settings.app_id, &outbox.topic);
    let (subscriber, mut received) = Subscriber::start(SubscriberSettings {
        broker,
        client_id,
        session_expiry: SESSION_EXPIRY,
        receive_maximum: RELAY_IN_FLIGHT,
        filters: vec![format!("$share/{}/{topic}", settings.app_id)],
    });
    tracing::info!(%topic, pubsub = %outbox.pubsub, publish_topic = %outbox.topic, "outbox relay started");
    let relay = Arc::new(Relay {
        fence_after: settings.etag_lease + SCAN_DELAY,
        store,
        settings,
        outbox,
    });
    // Aborting this task drops the set (and every relay of an event) and
    // the subscriber, which then disconnects.
    let mut subscribed = subscriber.subscribed();
    let _subscriber = subscriber;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(async move {
        if subscribed.wait_for(|subscribed| *subscribed).await.is_ok() {
            ready.store(true, Ordering::Release);
        }
    });
    while let Some(message) = received.recv().await {
        while tasks.try_join_next().is_some() {}
        tasks.spawn(relay.clone().relay(message));
    }
}

/// What became of one internal event.
enum Relayed {
    /// Its transaction committed: published, marker deleted.
    Published,
    /// Its transaction never committed (or the event was published and
    /// its marker deleted before): nothing to publish.
    NotCommitted,
}

impl Relay {
    /// Relays one internal event, then acknowledges it.
    async fn relay(self: Arc<Self>, message: Received) {
        let arrived = Instant::now();
        let Some((id, event)) = read_event(&message.payload) else {
            tracing::warn!(topic = %message.topic, "an outbox event that is not a gateway's internal event: dropped");
            message.ack();
            return;
        };
        tokio::time::sleep(SCAN_DELAY).await;
        let (mut looking, mut failing) = (FIRST_PAUSE, FIRST_PAUSE);
        let mut published = false;
        let outcome = loop {
            let pause = match self.step(&id, &event, arrived, &mut published).await {
                Ok(Some(outcome)) => break outcome,
                Ok(None) => {
                    looking = (looking * 2).min(LONGEST_LOOK);
                    looking
                }
                Err(error) => {
                    tracing::warn!(%id, %error, "outbox: relaying an event failed; trying again");
                    failing = (failing * 2).min(LONGEST_PAUSE);
                    failing
                }
            };
            if message.is_stale() {
                // The broker sends it again on the resumed session.
                tracing::debug!(%id, "outbox: relay left to the copy the broker sends again");
                return;
            }
            tokio::time::sleep(pause).await;
        };
        match outcome {
            Relayed::Published => tracing::debug!(%id, "outbox event published"),
            Relayed::NotCommitted => {
                tracing::info!(%id, "outbox event dropped: its transaction did not commit");
            }
        }
        message.ack();
    }

    /// One look at the marker and what follows; `None`: look again.
    /// `published`: the event went out in an earlier step (whose marker
    /// delete failed), so it is not published twice by this relay.
    async fn step(
        &self,
        id: &str,
        event: &CloudEvent,
        arrived: Instant,
        published: &mut bool,
    ) -> Result<Option<Relayed>, String> {
        let key = marker_key(id);
        let marker = transaction::read(&self.store, key.clone(), self.settings.lease_wait)
            .await
            .map_err(|error| error.to_string())?;
        match marker {
            Some(marker) if marker.value.as_ref() == COMMITTED => {
                if !*published {
                    self.publish(event).await?;
                    *published = true;
                }
                conditional::run(
                    &self.store,
                    &self.settings,
                    key,
                    None,
                    Write::Delete,
                    RESOLVE,
                )
                .await
                .map_err(|error| format!("published, but deleting its marker failed: {error}"))?;
                Ok(Some(Relayed::Published))
            }
            Some(_) => Ok(Some(Relayed::NotCommitted)),
            // The delete of an earlier step landed after all.
            None if *published => Ok(Some(Relayed::Published)),
            None if arrived.elapsed() < self.fence_after => Ok(None),
            None => match self.fence(key).await {
                Ok(()) => Ok(Some(Relayed::NotCommitted)),
                // The marker came meanwhile: look again.
                Err(DaprError::EtagMismatch) => Ok(None),
                Err(error) => Err(format!("fencing its marker failed: {error}")),
            },
        }
    }

    /// Publishes the user-facing event: the internal one with `topic` and
    /// `pubsubname` the outbox's, awaiting the broker's acknowledgement.
    async fn publish(&self, event: &CloudEvent) -> Result<(), String> {
        let mut event = event.clone();
        event.insert("topic".into(), json_string(&self.outbox.topic));
        event.insert("pubsubname".into(), json_string(&self.outbox.pubsub));
        let payload = serde_json::to_vec(&event).map_err(|error| error.to_string())?;
        self.store
            .pool()
            .publish(Message {
                topic: self.outbox.topic.clone(),
                payload: Bytes::from(payload),
                content_type: Some(CLOUDEVENT_CONTENT_TYPE.to_owned()),
                expiry_seconds: None,
                user_properties: Vec::new(),
            })
            .await
            .map(drop)
            .map_err(|error| format!("publishing to {} failed: {error}", self.outbox.topic))
    }

    /// Writes the fence in place of the absent marker, `first-write`
    /// under the marker's lease: `EtagMismatch` when the marker is there.
    async fn fence(&self, key: Bytes) -> Result<(), DaprError> {
        let write = Write::Set {
            value: Bytes::from_static(FENCED),
            options: SetOptions {
                condition: SetCondition::OnlyIfMissing,
                expires_in_ms: Some(u64::try_from(FENCE_KEPT.as_millis()).unwrap_or(u64::MAX)),
            },
        };
        conditional::run(&self.store, &self.settings, key, None, write, RESOLVE).await
    }
}

/// An internal event's id (`outbox-...`, a marker's name) and attributes.
fn read_event(payload: &[u8]) -> Option<(String, CloudEvent)> {
    let event: CloudEvent = serde_json::from_slice(payload).ok()?;
    let id: String = serde_json::from_str(event.get("id").map(|id| id.get())?).ok()?;
    if !id.starts_with("outbox-") {
        return None;
    }
    Some((id, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(key: &str, data: &str, metadata: &[(&str, &str)]) -> Change {
        Change {
            key: key.into(),
            data: Bytes::copy_from_slice(data.as_bytes()),
            metadata: metadata
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
        }
    }

    fn trace() -> Trace {
        Trace {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: "k=v".into(),
        }
    }

    fn json(event: &CloudEvent) -> serde_json::Value {
        serde_json::from_slice(&serde_json::to_vec(event).unwrap()).unwrap()
    }

    #[test]
    fn an_upsert_becomes_daprds_internal_event() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let upsert = change(
            "1",
            "2",
            &[
                ("outbox.cloudevent.myapp", "myapp1"),
                ("data", "a"),
                ("id", "b"),
            ],
        );
        let event = json(&internal_event(
            "outbox-x",
            "checkout",
            "pubsub",
            &upsert,
            None,
            &trace(),
            at,
        ));
        assert_eq!(
            event,
            serde_json::json!({
                "id": "outbox-x",
                "specversion": "1.0",
                "datacontenttype": "text/plain",
                "source": "checkout",
                "type": "com.dapr.event.sent",
                "topic": "",
                "pubsubname": "pubsub",
                "traceid": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "traceparent": "",
                "tracestate": "k=v",
                "time": "2023-11-14T22:13:20Z",
                "data": "2",
                "outbox.cloudevent.myapp": "myapp1",
            })
        );
    }

    #[test]
    fn a_projection_gives_the_event_its_value_and_content_type() {
        let upsert = change(
            "1",
            "{\"real\":true}",
            &[("contentType", "application/json")],
        );
        let projection = change(
            "1",
            "{\"shown\": 1}",
            &[(PROJECTION, "true"), ("contentType", "application/json")],
        );
        assert!(projection.is_projection() && !upsert.is_projection());
        let event = json(&internal_event(
            "outbox-x",
            "a",
            "p",
            &upsert,
            Some(&projection),
            &trace(),
            SystemTime::now(),
        ));
        assert_eq!(event["data"], serde_json::json!({"shown": 1}));
        assert_eq!(event["datacontenttype"], "application/json");
        // The operation's own metadata, not the projection's.
        assert_eq!(event.get(PROJECTION), None);
        assert_eq!(event["contentType"], "application/json");
    }

    #[test]
    fn prepare_makes_one_event_and_one_first_write_marker_per_upsert() {
        let settings = DaprSettings {
            app_id: "orders".into(),
            ..DaprSettings::default()
        };
        let outbox = OutboxSettings {
            pubsub: "pubsub".into(),
            topic: "done".into(),
        };
        let prepared = prepare(
            &settings,
            &outbox,
            &[change("a", "1", &[]), change("a", "2", &[])],
            &[],
        );
        assert_eq!(prepared.events.len(), 2);
        assert_eq!(prepared.markers.len(), 2);
        for (message, marker) in prepared.events.iter().zip(&prepared.markers) {
            assert_eq!(message.topic, "ordersdoneoutbox");
            let (id, _) = read_event(&message.payload).unwrap();
            assert_eq!(marker.key, marker_key(&id));
            assert!(marker.key.starts_with(OUTBOX_PREFIX.as_bytes()));
            assert!(marker.only_if_absent);
            assert_eq!(marker.value.as_deref(), Some(COMMITTED));
        }
        assert_ne!(prepared.markers[0].key, prepared.markers[1].key);
    }

    #[test]
    fn an_http_string_value_is_carried_as_its_text_unless_typed_json() {
        let text = Change::of_json("k".into(), &Bytes::from_static(b"\"2\""), HashMap::new());
        assert_eq!(&text.data[..], b"2");
        let typed = HashMap::from([("contentType".to_owned(), "application/json".to_owned())]);
        let json = Change::of_json("k".into(), &Bytes::from_static(b"\"2\""), typed);
        assert_eq!(&json.data[..], b"\"2\"");
        let object = Change::of_json(
            "k".into(),
            &Bytes::from_static(b"{\"a\":1}"),
            HashMap::new(),
        );
        assert_eq!(&object.data[..], b"{\"a\":1}");
    }

    #[test]
    fn truthy_is_read_as_dapr_reads_it() {
        for yes in ["true", "TRUE", "1", "y", "on", "t", "Yes"] {
            assert!(is_truthy(yes), "{yes}");
        }
        for no in ["false", "0", "", "no", "maybe"] {
            assert!(!is_truthy(no), "{no}");
        }
    }

    #[test]
    fn only_internal_events_are_relayed() {
        assert!(read_event(b"{\"id\":\"outbox-1\",\"data\":1}").is_some());
        assert!(read_event(b"{\"id\":\"other\"}").is_none());
        assert!(read_event(b"{\"id\":1}").is_none());
        assert!(read_event(b"not json").is_none());
    }
}
