//! The state store emulator: the AIO state store protocol served by an MQTT5
//! client of any broker, so that the gateway and the official SDK clients
//! can be developed and tested without an AIO cluster.
//!
//! Two tasks: the *poll loop* drives the rumqttc event loop and never awaits
//! the client (rumqttc can freeze otherwise); it forwards requests to the
//! *worker*, which takes every request that is waiting (a batch), runs them
//! on the [`Store`] under a mutex, makes persisted changes durable with one
//! `fsync` for the whole batch, then publishes replies and notifications and
//! acknowledges the requests (manual acks: a request is acked once handled).
//!
//! KEYNOTIFY registrations belong to the client id of the request's
//! `__srcId`. The real service drops a client's registrations when it
//! disconnects; an MQTT client cannot see other clients disconnect, so with
//! an external broker **registrations persist until `KEYNOTIFY STOP` or an
//! emulator restart** (a reconnecting SDK client registers again, which is
//! harmless). An embedded broker that does see disconnects calls
//! [`EmulatorHandle::client_disconnected`].
//!
//! SCAN pages are sized to the broker's maximum packet size (from CONNACK)
//! less each reply's topic and properties, so that no reply is too large to
//! publish; see [`Store::scan`] for the rest of its rules.

mod acl;
mod entry;
mod persist;
mod store;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, Event, EventLoop};
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use acl::{Access, AccessList, AclError, Grant};
pub use entry::Entry;
pub use persist::{ID_FILE, LOG_FILE, Log, PersistError, Record};
pub use store::{
    Answer, Envelope, KEY_TOO_LONG_TO_LIST, KEY_TOO_LONG_TO_WATCH, MAX_TOPIC_BYTES, NODE_ID,
    Outcome, Quota, ScanLimits, Store, WatcherNotice,
};

use crate::mqtt::{MAX_PACKET_SIZE, REQUEST_CHANNEL_CAPACITY, base_options};
use crate::protocol::{
    CONTENT_TYPE, PROTOCOL_VERSION, REQUEST_TOPIC, Request, STATUS_OK, StoreError, hlc,
    is_forbidden_response_topic, notify_topic, property,
};

/// How long [`Emulator::start`] waits by default to be connected and subscribed.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Requests the broker may send before we ack (MQTT5 receive maximum). Acks
/// go out once a request is handled, so this bounds the requests held in
/// memory; a flood waits in the broker's queue instead.
const RECEIVE_MAXIMUM: u16 = 1024;

/// Most requests handled (and made durable) together.
const MAX_BATCH: usize = 256;

/// Requests queued between the poll loop and the worker by default: room
/// for every QoS 1 request the broker may have in flight to us, and then some.
const REQUEST_QUEUE: usize = 4 * RECEIVE_MAXIMUM as usize;

/// How long shutdown waits for the worker to finish its batch.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Keep-alive of the emulator's connection.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// Longest pause between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// AIO RPC properties of replies that reject the envelope (not the payload).
mod status {
    /// `__stMsg`: why.
    pub const MESSAGE: &str = super::property::STATUS_MESSAGE;
    /// `__propName`: which property was wrong.
    pub const PROPERTY_NAME: &str = "__propName";
    /// `__supProtMajVer`: the protocol major versions served.
    pub const SUPPORTED_MAJOR_VERSIONS: &str = "__supProtMajVer";
    /// `__requestProtVer`: the version the request asked for.
    pub const REQUEST_PROTOCOL_VERSION: &str = "__requestProtVer";
    /// Bad request.
    pub const BAD_REQUEST: &str = "400";
    /// Overloaded, try again (what the SDK executors send on clock drift).
    pub const SERVICE_UNAVAILABLE: &str = "503";
    /// Protocol version not supported.
    pub const VERSION_NOT_SUPPORTED: &str = "505";
}

/// What the emulator connects to and how it behaves.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// Broker host name or address.
    pub broker_host: String,
    /// Broker MQTT port (plain TCP).
    pub broker_port: u16,
    /// The emulator's own MQTT client id.
    pub client_id: String,
    /// Broker user name, if it wants one.
    pub username: Option<String>,
    /// Broker password (with `username`).
    pub password: Option<String>,
    /// Where keys SET with `aio-persistence: true` are kept; `None` keeps
    /// everything in memory, like the real service's default.
    pub data_dir: Option<PathBuf>,
    /// Most keys before `the quota has been exceeded`.
    pub max_keys: Option<usize>,
    /// Most bytes (keys plus values) before `the quota has been exceeded`.
    pub max_bytes: Option<usize>,
    /// Who may read and write which keys; `None` allows everything.
    pub acl: Option<AccessList>,
    /// How many keys a SCAN page holds and looks at.
    pub scan_limits: ScanLimits,
    /// How long [`Emulator::start`] tries to connect and subscribe.
    pub startup_timeout: Duration,
    /// Requests held between the connection and the worker; a request
    /// arriving when it is full is refused (`__stat` 503) and acknowledged.
    pub request_queue: usize,
}

impl EmulatorConfig {
    /// In-memory, unlimited, open to all, client id `statestore-emulator`.
    pub fn new(broker_host: impl Into<String>, broker_port: u16) -> Self {
        Self {
            broker_host: broker_host.into(),
            broker_port,
            client_id: "statestore-emulator".into(),
            username: None,
            password: None,
            data_dir: None,
            max_keys: None,
            max_bytes: None,
            acl: None,
            scan_limits: ScanLimits::default(),
            startup_timeout: STARTUP_TIMEOUT,
            request_queue: REQUEST_QUEUE,
        }
    }
}

/// Why the emulator did not start or stopped.
#[derive(Debug, Error)]
pub enum EmulatorError {
    /// The persistence log could not be read, written or synced.
    #[error(transparent)]
    Persist(#[from] PersistError),
    /// No broker connection and subscription in time.
    #[error(
        "not connected and subscribed to the broker within {timeout:?} (last error: {last_error})"
    )]
    NotServing {
        /// How long it tried.
        timeout: Duration,
        /// The last connection error, if any.
        last_error: String,
    },
    /// The broker refused the subscription to the request topic.
    #[error("the broker refused the subscription to the request topic: {0}")]
    SubscriptionRefused(String),
    /// A task of the emulator ended unexpectedly.
    #[error("the emulator stopped unexpectedly: {0}")]
    Stopped(String),
}

/// The connection's state, as the poll loop reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Connecting { last_error: String },
    Serving,
    Refused(String),
}

/// A cheap handle on a running emulator's store, for whoever sees clients
/// disconnect (the dev mode's embedded broker).
#[derive(Debug, Clone)]
pub struct EmulatorHandle {
    store: Arc<Mutex<Store>>,
}

impl EmulatorHandle {
    fn store(&self) -> MutexGuard<'_, Store> {
        // The store is consistent between commands, so a poisoned lock is usable.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops every KEYNOTIFY registration of `client_id`, as the real
    /// service does when a client disconnects.
    pub fn client_disconnected(&self, client_id: &str) {
        self.store().client_disconnected(client_id);
    }

    /// Number of keys held.
    pub fn key_count(&self) -> usize {
        self.store().len()
    }

    /// Number of (client, key) KEYNOTIFY registrations.
    pub fn registrations(&self) -> usize {
        self.store().registrations()
    }
}

/// A running emulator.
#[derive(Debug)]
pub struct Emulator {
    client: AsyncClient,
    handle: EmulatorHandle,
    stop: watch::Sender<bool>,
    poll: JoinHandle<()>,
    worker: Option<JoinHandle<Result<(), EmulatorError>>>,
}

impl Emulator {
    /// Replays the persistence log (if any), connects, subscribes to the
    /// request topic, and returns once requests are being served.
    pub async fn start(config: EmulatorConfig) -> Result<Emulator, EmulatorError> {
        let quota = Quota {
            max_keys: config.max_keys,
            max_bytes: config.max_bytes,
        };
        let mut store = Store::new(quota, hlc::now_ms());
        store.set_scan_limits(config.scan_limits);
        let log = match &config.data_dir {
            Some(dir) => Some(open_log(dir, &mut store)?),
            None => None,
        };
        let store = Arc::new(Mutex::new(store));
        let broker_max_packet = Arc::new(AtomicU32::new(0));

        let mut options = base_options(
            config.client_id.clone(),
            config.broker_host.clone(),
            config.broker_port,
            KEEP_ALIVE,
        );
        options
            .set_manual_acks(true)
            .set_receive_maximum(Some(RECEIVE_MAXIMUM))
            .set_clean_start(true);
        if let Some(username) = &config.username {
            options.set_credentials(
                username.clone(),
                config.password.clone().unwrap_or_default(),
            );
        }
        let (client, eventloop) = AsyncClient::new(options, REQUEST_CHANNEL_CAPACITY);
        let (requests_tx, requests_rx) = mpsc::channel(config.request_queue.max(1));
        let (status_tx, mut status_rx) = watch::channel(Status::Connecting {
            last_error: "none yet".into(),
        });
        let (stop, stop_rx) = watch::channel(false);

        let poll = tokio::spawn(poll_loop(
            eventloop,
            client.clone(),
            requests_tx,
            status_tx,
            Arc::clone(&broker_max_packet),
        ));
        let worker = Worker {
            client: client.clone(),
            store: Arc::clone(&store),
            acl: config.acl,
            log,
            broker_max_packet,
        };
        let worker = tokio::spawn(worker.run(requests_rx, stop_rx));
        let emulator = Emulator {
            client,
            handle: EmulatorHandle { store },
            stop,
            poll,
            worker: Some(worker),
        };

        let _ = tokio::time::timeout(
            config.startup_timeout,
            status_rx.wait_for(|status| !matches!(status, Status::Connecting { .. })),
        )
        .await;
        let status = status_rx.borrow().clone();
        match status {
            Status::Serving if !emulator.poll.is_finished() => {
                tracing::info!(
                    broker = %format!("{}:{}", config.broker_host, config.broker_port),
                    client_id = %config.client_id,
                    persistence = ?config.data_dir,
                    "state store emulator serving {REQUEST_TOPIC}"
                );
                Ok(emulator)
            }
            Status::Serving => Err(EmulatorError::Stopped(
                "the connection task ended during start-up".into(),
            )),
            Status::Refused(reason) => Err(EmulatorError::SubscriptionRefused(reason)),
            Status::Connecting { last_error } => Err(EmulatorError::NotServing {
                timeout: config.startup_timeout,
                last_error,
            }),
        }
    }

    /// A handle for reporting disconnects and reading counters.
    pub fn handle(&self) -> EmulatorHandle {
        self.handle.clone()
    }

    /// Drops every KEYNOTIFY registration of `client_id` (see the module
    /// documentation for when this is called).
    pub fn client_disconnected(&self, client_id: &str) {
        self.handle.client_disconnected(client_id);
    }

    /// Resolves if the emulator stops by itself, which only a persistence
    /// failure does (it cannot promise durability any more).
    pub async fn stopped(&mut self) -> Result<(), EmulatorError> {
        match self.worker.as_mut() {
            Some(worker) => {
                let result = worker.await;
                self.worker = None;
                flatten(result)
            }
            None => std::future::pending().await,
        }
    }

    /// Stops serving, disconnects cleanly and closes the log.
    pub async fn shutdown(mut self) -> Result<(), EmulatorError> {
        let _ = self.stop.send(true);
        let result = match self.worker.take() {
            // A worker stuck publishing to a wedged broker must not hold
            // shutdown forever.
            Some(mut worker) => match tokio::time::timeout(SHUTDOWN_TIMEOUT, &mut worker).await {
                Ok(joined) => flatten(joined),
                Err(_) => {
                    worker.abort();
                    tracing::warn!("the emulator's worker did not stop in time; aborted");
                    Ok(())
                }
            },
            None => Ok(()),
        };
        if self.client.try_disconnect().is_ok() {
            // The poll loop ends once it has sent the DISCONNECT.
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.poll).await;
        }
        self.poll.abort();
        tracing::info!("state store emulator stopped");
        result
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.poll.abort();
        if let Some(worker) = &self.worker {
            worker.abort();
        }
    }
}

fn flatten(
    result: Result<Result<(), EmulatorError>, tokio::task::JoinError>,
) -> Result<(), EmulatorError> {
    result.map_err(|error| EmulatorError::Stopped(error.to_string()))?
}

/// Opens the log in `dir`, replays it into `store` and compacts it.
fn open_log(dir: &std::path::Path, store: &mut Store) -> Result<Log, EmulatorError> {
    let (mut log, records) = Log::open(dir)?;
    store.set_id(log.store_id(store.id())?);
    let replayed = records.len();
    let now = hlc::now_ms();
    for record in records {
        match record {
            Record::Set { key, entry } => store.restore(key, entry, now),
            Record::Delete { key } => store.forget(&key),
        }
    }
    let live = live_records(store);
    log.compact(&live)?;
    tracing::info!(
        dir = %dir.display(),
        records = replayed,
        keys = live.len(),
        "replayed the persistence log"
    );
    Ok(log)
}

/// A record for every persisted key: the content of a rewritten log.
fn live_records(store: &Store) -> Vec<Record> {
    store
        .persistent_entries()
        .map(|(key, entry)| Record::Set {
            key: key.clone(),
            entry: entry.clone(),
        })
        .collect()
}

/// Drives the MQTT connection: (re)subscribes after every CONNACK and
/// forwards requests to the worker. It never awaits the client.
async fn poll_loop(
    mut eventloop: EventLoop,
    client: AsyncClient,
    requests: mpsc::Sender<Publish>,
    status: watch::Sender<Status>,
    broker_max_packet: Arc<AtomicU32>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                // The broker holds QoS 1 requests back at our receive
                // maximum, so mostly a QoS 0 flood fills the queue: refuse
                // rather than grow.
                match requests.try_send(publish) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(dropped)) => {
                        tracing::warn!(topic = ?dropped.topic, "request queue full; refusing a request");
                        refuse_overloaded(&client, dropped);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return, // the worker is gone
                }
            }
            Ok(Event::Incoming(Packet::ConnAck(connack))) => {
                let max_packet = connack.properties.and_then(|p| p.max_packet_size);
                tracing::info!(?max_packet, "connected to the broker");
                broker_max_packet.store(max_packet.unwrap_or(0), Ordering::Release);
                backoff = Duration::from_millis(50);
                // Subscribing awaits the client, so not here.
                let client = client.clone();
                tokio::spawn(async move {
                    if let Err(error) = client.subscribe(REQUEST_TOPIC, QoS::AtLeastOnce).await {
                        tracing::warn!(%error, "could not send the SUBSCRIBE");
                    }
                });
            }
            Ok(Event::Incoming(Packet::SubAck(suback))) => match suback.return_codes.first() {
                Some(SubscribeReasonCode::Success(_)) => {
                    tracing::info!("subscribed to the request topic");
                    status.send_replace(Status::Serving);
                }
                other => {
                    tracing::error!(reason = ?other, "the broker refused the subscription");
                    status.send_replace(Status::Refused(format!("{other:?}")));
                }
            },
            Ok(Event::Incoming(Packet::Disconnect(disconnect))) => {
                tracing::warn!(reason = ?disconnect.reason_code, "the broker disconnected us");
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, retry_in = ?backoff, "broker connection failed");
                status.send_replace(Status::Connecting {
                    last_error: error.to_string(),
                });
                if requests.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Answers a request that found the queue full with `__stat` 503 and
/// acknowledges it: unacknowledged, it would hold one of the broker's
/// in-flight slots to us for good. A QoS 0 request is just dropped. The
/// client is awaited in a task of its own (never in the poll loop); there
/// are at most [`RECEIVE_MAXIMUM`] of those, as each holds a QoS 1 request.
fn refuse_overloaded(client: &AsyncClient, mut request: Publish) {
    if request.qos != QoS::AtLeastOnce {
        return;
    }
    request.payload = Bytes::new();
    let properties = request.properties.take().unwrap_or_default();
    let reply = properties
        .response_topic
        .filter(|topic| !is_forbidden_response_topic(topic))
        .map(|topic| {
            rejection_message(
                topic,
                properties.correlation_data,
                status::SERVICE_UNAVAILABLE,
                &[(
                    status::MESSAGE,
                    "the state store is overloaded; retry later",
                )],
            )
        });
    let client = client.clone();
    tokio::spawn(async move {
        if let Some(reply) = reply {
            let _ = client
                .publish_with_properties(
                    reply.topic,
                    QoS::AtLeastOnce,
                    false,
                    reply.payload,
                    reply.properties,
                )
                .await;
        }
        let _ = client.ack(&request).await;
    });
}

/// One MQTT message to send.
struct Message {
    topic: String,
    payload: Vec<u8>,
    properties: PublishProperties,
}

/// Handles batches of requests and expiries.
struct Worker {
    client: AsyncClient,
    store: Arc<Mutex<Store>>,
    acl: Option<AccessList>,
    log: Option<Log>,
    /// The broker's maximum packet size from the last CONNACK (0: none).
    broker_max_packet: Arc<AtomicU32>,
}

impl Worker {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn run(
        mut self,
        mut requests: mpsc::Receiver<Publish>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), EmulatorError> {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let next_expiry = self.store().next_expiry();
            let expiry = async {
                match next_expiry {
                    Some(at) => {
                        let wait = at.saturating_sub(hlc::now_ms());
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stop.changed() => return Ok(()),
                received = requests.recv_many(&mut batch, MAX_BATCH) => {
                    if received == 0 {
                        return Ok(());
                    }
                    self.handle_batch(&mut batch).await?;
                }
                () = expiry => self.handle_batch(&mut batch).await?,
            }
        }
    }

    /// Runs the requests (and any due expiry), syncs what must be durable,
    /// then publishes and acks.
    async fn handle_batch(&mut self, batch: &mut Vec<Publish>) -> Result<(), EmulatorError> {
        let mut messages = Vec::with_capacity(batch.len() * 2);
        let mut records = Vec::new();
        {
            let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
            let now = hlc::now_ms();
            let expired = store.expire(now);
            collect(expired, None, &mut messages, &mut records);
            let limits = Limits {
                acl: self.acl.as_ref(),
                broker_max_packet: match self.broker_max_packet.load(Ordering::Acquire) {
                    0 => None,
                    max => Some(max),
                },
            };
            for request in batch.iter_mut() {
                match handle_request(&mut store, &limits, request, now) {
                    Handled::Dropped => {}
                    Handled::Refused(message) => messages.push(message),
                    Handled::Served(outcome, reply_to) => {
                        collect(outcome, Some(reply_to), &mut messages, &mut records);
                    }
                }
            }
        }
        if let (Some(log), false) = (&mut self.log, records.is_empty()) {
            let mut encoded = Vec::new();
            for record in &records {
                record.encode(&mut encoded);
            }
            if let Err(error) = log.append(encoded).await {
                tracing::error!(%error, "cannot make changes durable; stopping");
                return Err(error.into());
            }
            if log.needs_compaction() {
                let live = live_records(&self.store.lock().unwrap_or_else(PoisonError::into_inner));
                if let Err(error) = log.compact_async(live).await {
                    tracing::error!(%error, "cannot rewrite the persistence log; stopping");
                    return Err(error.into());
                }
            }
        }
        for message in messages {
            let published = self
                .client
                .publish_with_properties(
                    message.topic,
                    QoS::AtLeastOnce,
                    false,
                    message.payload,
                    message.properties,
                )
                .await;
            // Topics were checked (no wildcards), so only a closed channel fails.
            if published.is_err() {
                return Err(EmulatorError::Stopped("the MQTT client is gone".into()));
            }
        }
        for request in batch.drain(..) {
            if self.client.ack(&request).await.is_err() {
                return Err(EmulatorError::Stopped("the MQTT client is gone".into()));
            }
        }
        Ok(())
    }
}

/// Adds an outcome's reply and notifications to the batch's messages.
fn collect(
    outcome: Outcome,
    reply: Option<ReplyTo>,
    messages: &mut Vec<Message>,
    records: &mut Vec<Record>,
) {
    if let Some(reply) = reply {
        let mut user_properties = vec![
            (property::STATUS.into(), STATUS_OK.into()),
            (property::PROTOCOL_VERSION.into(), PROTOCOL_VERSION.into()),
        ];
        if let Some(version) = &outcome.version {
            user_properties.push((property::TIMESTAMP.into(), version.to_string()));
        }
        messages.push(Message {
            topic: reply.topic,
            payload: outcome.reply.encode(),
            properties: PublishProperties {
                correlation_data: Some(reply.correlation_data),
                content_type: Some(CONTENT_TYPE.into()),
                message_expiry_interval: reply.message_expiry_interval,
                user_properties,
                ..PublishProperties::default()
            },
        });
    }
    for event in outcome.events {
        messages.push(Message {
            topic: notify_topic(&event.client_id, &event.key),
            payload: event.notification.encode(),
            properties: PublishProperties {
                content_type: Some(CONTENT_TYPE.into()),
                user_properties: vec![
                    (property::TIMESTAMP.into(), event.version.to_string()),
                    (property::PROTOCOL_VERSION.into(), PROTOCOL_VERSION.into()),
                ],
                ..PublishProperties::default()
            },
        });
    }
    records.extend(outcome.records);
}

/// Where a reply goes.
struct ReplyTo {
    topic: String,
    correlation_data: Bytes,
    message_expiry_interval: Option<u32>,
}

/// What became of one request.
enum Handled {
    /// No usable response topic: logged and dropped.
    Dropped,
    /// The envelope is wrong: answered the AIO RPC way (`__stat` 400 or 505
    /// with `__stMsg`) without running the request.
    Refused(Message),
    /// Run; the outcome goes back to the requester.
    Served(Outcome, ReplyTo),
}

/// What bounds the requests of a batch.
#[derive(Debug, Clone, Copy, Default)]
struct Limits<'a> {
    /// Who may read and write which keys.
    acl: Option<&'a AccessList>,
    /// The broker's maximum packet size, if it announced one.
    broker_max_packet: Option<u32>,
}

/// Room in a reply packet for everything but the payload: fixed header,
/// packet id, property lengths, content type, message expiry, `__stat`
/// and `__protVer` take under 100 bytes; topic and correlation data are
/// added to it.
const REPLY_OVERHEAD: usize = 128;

/// The largest payload a reply to `reply_to` can carry: what the broker
/// accepts, and never more than what this crate's clients accept.
fn reply_limit(broker_max_packet: Option<u32>, reply_to: &ReplyTo) -> usize {
    let max_packet = broker_max_packet.map_or(MAX_PACKET_SIZE, |max| max.min(MAX_PACKET_SIZE));
    usize::try_from(max_packet)
        .unwrap_or(usize::MAX)
        .saturating_sub(REPLY_OVERHEAD + reply_to.topic.len() + reply_to.correlation_data.len())
}

/// Checks one request's envelope and runs it.
fn handle_request(
    store: &mut Store,
    limits: &Limits<'_>,
    request: &mut Publish,
    now_ms: u64,
) -> Handled {
    let properties = request.properties.take().unwrap_or_default();
    let Some(topic) = properties.response_topic else {
        tracing::warn!("request without a response topic dropped");
        return Handled::Dropped;
    };
    if is_forbidden_response_topic(&topic) {
        // The real service disconnects such a client; we cannot, so we drop.
        tracing::warn!(%topic, "request naming a forbidden response topic dropped");
        return Handled::Dropped;
    }
    let Some(correlation_data) = properties.correlation_data else {
        return rejection(
            topic,
            None,
            status::BAD_REQUEST,
            &[
                (status::MESSAGE, "Correlation data missing"),
                (status::PROPERTY_NAME, "Correlation Data"),
            ],
        );
    };
    let reply_to = ReplyTo {
        topic,
        correlation_data,
        message_expiry_interval: properties.message_expiry_interval,
    };
    if request.qos != QoS::AtLeastOnce {
        return rejection(
            reply_to.topic,
            Some(reply_to.correlation_data),
            status::BAD_REQUEST,
            &[(
                status::MESSAGE,
                "state store requests must be published at QoS 1",
            )],
        );
    }

    let mut envelope = Envelope {
        reply_limit: Some(reply_limit(limits.broker_max_packet, &reply_to)),
        acl: limits.acl,
        ..Envelope::default()
    };
    let mut client_id = None;
    for (name, value) in &properties.user_properties {
        match name.as_str() {
            property::SOURCE_ID => client_id = Some(value.as_str()),
            property::TIMESTAMP => envelope.timestamp = Some(value.as_str()),
            property::FENCING_TOKEN => envelope.fencing_token = Some(value.as_str()),
            property::PERSISTENCE => envelope.persist = value.eq_ignore_ascii_case("true"),
            property::PROTOCOL_VERSION if !is_supported_version(value) => {
                return rejection(
                    reply_to.topic,
                    Some(reply_to.correlation_data),
                    status::VERSION_NOT_SUPPORTED,
                    &[
                        (status::MESSAGE, "unsupported protocol version"),
                        (status::SUPPORTED_MAJOR_VERSIONS, "1"),
                        (status::REQUEST_PROTOCOL_VERSION, value),
                    ],
                );
            }
            _ => {}
        }
    }
    // Without `__srcId`, the SDKs' response topic `clients/{id}/...` names
    // the client; failing that, KEYNOTIFY registers the empty client id.
    envelope.client_id = client_id
        .or_else(|| client_of_response_topic(&reply_to.topic))
        .unwrap_or_default();

    let outcome = match Request::decode(&request.payload) {
        Err(error) => Outcome::error(error),
        Ok(command) => {
            let access = if command.is_write() {
                Access::Write
            } else {
                Access::Read
            };
            // SCAN has no key: it lists only what the client may read.
            let refused = command
                .key()
                .zip(limits.acl)
                .is_some_and(|(key, acl)| !acl.allows(envelope.client_id, key, access));
            if refused {
                Outcome::error(StoreError::NotAuthorized)
            } else {
                tracing::trace!(
                    verb = command.verb(),
                    client = envelope.client_id,
                    "request"
                );
                store.execute(command, &envelope, now_ms)
            }
        }
    };
    Handled::Served(outcome, reply_to)
}

/// A reply that refuses the envelope: `__stat` other than 200, no payload.
fn rejection(
    topic: String,
    correlation_data: Option<Bytes>,
    status_code: &str,
    details: &[(&str, &str)],
) -> Handled {
    tracing::debug!(%topic, status = status_code, ?details, "request refused");
    Handled::Refused(rejection_message(
        topic,
        correlation_data,
        status_code,
        details,
    ))
}

/// The message of a [`rejection`].
fn rejection_message(
    topic: String,
    correlation_data: Option<Bytes>,
    status_code: &str,
    details: &[(&str, &str)],
) -> Message {
    let mut user_properties = vec![
        (property::STATUS.to_owned(), status_code.to_owned()),
        (
            property::PROTOCOL_VERSION.to_owned(),
            PROTOCOL_VERSION.to_owned(),
        ),
    ];
    user_properties.extend(
        details
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
    );
    Message {
        topic,
        payload: Vec::new(),
        properties: PublishProperties {
            correlation_data,
            user_properties,
            ..PublishProperties::default()
        },
    }
}

fn is_supported_version(version: &str) -> bool {
    let mut parts = version.split('.');
    parts.next() == Some("1")
        && parts.all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

fn client_of_response_topic(topic: &str) -> Option<&str> {
    let rest = topic.strip_prefix("clients/")?;
    let (client, _) = rest.split_once('/')?;
    (!client.is_empty()).then_some(client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Hlc, Reply, response_topic};

    const NOW: u64 = 1_700_000_000_000;

    fn request(payload: &[u8], qos: QoS, edit: impl FnOnce(&mut PublishProperties)) -> Publish {
        let mut properties = PublishProperties {
            response_topic: Some(response_topic("app")),
            correlation_data: Some(Bytes::from_static(&[7; 16])),
            content_type: Some(CONTENT_TYPE.into()),
            user_properties: vec![
                (property::SOURCE_ID.into(), "app".into()),
                (property::TIMESTAMP.into(), Hlc::new(NOW, "app").to_string()),
                (property::PROTOCOL_VERSION.into(), "1.0".into()),
            ],
            ..PublishProperties::default()
        };
        edit(&mut properties);
        Publish::new(REQUEST_TOPIC, qos, payload.to_vec(), Some(properties))
    }

    fn handle(publish: Publish, acl: Option<&AccessList>) -> Handled {
        let mut store = Store::new(Quota::default(), NOW);
        let mut publish = publish;
        let limits = Limits {
            acl,
            ..Limits::default()
        };
        handle_request(&mut store, &limits, &mut publish, NOW)
    }

    fn refusal(handled: Handled) -> (Option<Bytes>, Vec<(String, String)>) {
        match handled {
            Handled::Refused(message) => (
                message.properties.correlation_data,
                message.properties.user_properties,
            ),
            _ => panic!("not refused"),
        }
    }

    fn status_of(properties: &[(String, String)]) -> &str {
        &properties
            .iter()
            .find(|(name, _)| name == property::STATUS)
            .expect("__stat")
            .1
    }

    const GET: &[u8] = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";

    #[test]
    fn requests_without_a_usable_response_topic_are_dropped() {
        let edits: [fn(&mut PublishProperties); 4] = [
            |p| p.response_topic = None,
            |p| p.response_topic = Some(REQUEST_TOPIC.into()),
            |p| p.response_topic = Some(format!("{}/x", crate::protocol::NOTIFY_TOPIC_ROOT)),
            |p| p.response_topic = Some("replies/#".into()),
        ];
        for edit in edits {
            assert!(matches!(
                handle(request(GET, QoS::AtLeastOnce, edit), None),
                Handled::Dropped
            ));
        }
        let mut store = Store::new(Quota::default(), NOW);
        let mut bare = Publish::new(REQUEST_TOPIC, QoS::AtLeastOnce, GET.to_vec(), None);
        assert!(matches!(
            handle_request(&mut store, &Limits::default(), &mut bare, NOW),
            Handled::Dropped
        ));
    }

    #[test]
    fn missing_correlation_data_and_qos_0_are_refused_with_400() {
        let (correlation, properties) = refusal(handle(
            request(GET, QoS::AtLeastOnce, |p| p.correlation_data = None),
            None,
        ));
        assert_eq!(correlation, None);
        assert_eq!(status_of(&properties), "400");
        let (correlation, properties) =
            refusal(handle(request(GET, QoS::AtMostOnce, |_| {}), None));
        assert_eq!(correlation, Some(Bytes::from_static(&[7; 16])));
        assert_eq!(status_of(&properties), "400");
    }

    #[test]
    fn unsupported_protocol_versions_are_refused_with_505() {
        for version in ["2.0", "x", "1.", ""] {
            let (_, properties) = refusal(handle(
                request(GET, QoS::AtLeastOnce, |p| {
                    p.user_properties[2].1 = version.into();
                }),
                None,
            ));
            assert_eq!(status_of(&properties), "505", "{version:?}");
        }
        for version in ["1.0", "1", "1.5"] {
            let handled = handle(
                request(GET, QoS::AtLeastOnce, |p| {
                    p.user_properties[2].1 = version.into()
                }),
                None,
            );
            assert!(matches!(handled, Handled::Served(..)), "{version:?}");
        }
    }

    #[test]
    fn payload_errors_and_access_refusals_are_served_as_replies() {
        let Handled::Served(outcome, reply_to) =
            handle(request(b"nonsense", QoS::AtLeastOnce, |_| {}), None)
        else {
            panic!("not served");
        };
        assert_eq!(outcome.reply, Reply::Error(StoreError::SyntaxError));
        assert_eq!(reply_to.topic, response_topic("app"));
        let acl = AccessList::from_json(r#"{ "other": { "read": [""] } }"#).unwrap();
        let Handled::Served(outcome, _) =
            handle(request(GET, QoS::AtLeastOnce, |_| {}), Some(&acl))
        else {
            panic!("not served");
        };
        assert_eq!(outcome.reply, Reply::Error(StoreError::NotAuthorized));
    }

    #[test]
    fn the_client_id_comes_from_src_id_then_the_response_topic() {
        assert_eq!(
            client_of_response_topic(&response_topic("gw-1")),
            Some("gw-1")
        );
        assert_eq!(client_of_response_topic("clients//x"), None);
        assert_eq!(client_of_response_topic("replies/gw-1"), None);
        let acl = AccessList::from_json(r#"{ "app": { "read": [""] } }"#).unwrap();
        let without_src_id = request(GET, QoS::AtLeastOnce, |p| {
            p.user_properties
                .retain(|(name, _)| name != property::SOURCE_ID);
        });
        let Handled::Served(outcome, _) = handle(without_src_id, Some(&acl)) else {
            panic!("not served");
        };
        assert_eq!(outcome.reply, Reply::NotFound);
    }

    #[test]
    fn replies_carry_status_version_and_the_key_version() {
        let mut messages = Vec::new();
        let mut records = Vec::new();
        let version = Hlc::new(NOW, NODE_ID);
        let outcome = Outcome {
            reply: Reply::Ok.into(),
            version: Some(version.clone()),
            events: vec![WatcherNotice {
                client_id: "w".into(),
                key: Bytes::from_static(b"k"),
                notification: crate::protocol::Notification::Delete,
                version: version.clone(),
            }],
            records: Vec::new(),
        };
        let reply_to = ReplyTo {
            topic: "r".into(),
            correlation_data: Bytes::from_static(b"c"),
            message_expiry_interval: Some(9),
        };
        collect(outcome, Some(reply_to), &mut messages, &mut records);
        let [reply, notification] = &messages[..] else {
            panic!("two messages");
        };
        assert_eq!(reply.payload, b"+OK\r\n");
        assert_eq!(
            reply.properties.user_properties,
            vec![
                ("__stat".to_owned(), "200".to_owned()),
                ("__protVer".to_owned(), "1.0".to_owned()),
                ("__ts".to_owned(), version.to_string()),
            ]
        );
        assert_eq!(reply.properties.message_expiry_interval, Some(9));
        assert_eq!(notification.topic, notify_topic("w", b"k"));
        assert_eq!(
            notification.payload,
            b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
        );
        assert_eq!(
            notification.properties.user_properties[0].1,
            version.to_string()
        );
    }
}
