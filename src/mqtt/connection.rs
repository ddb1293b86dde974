//! One pool member: an MQTT5 connection with its own client id, its
//! pending requests (by correlation data) and its reconnect loop.
//!
//! Every connection attempt gets a fresh `AsyncClient`/`EventLoop` pair
//! built from freshly read settings. That is how a rotated SAT token or
//! certificate reaches the next CONNECT (rumqttc fixes options per event
//! loop), and it makes rumqttc's reconnect livelock (issues #1014/#1056: a
//! clean-session reconnect stuck in `CollisionTimeout`) impossible: no event
//! loop ever outlives the connection it made. We back off ourselves, with
//! jitter, because rumqttc reconnects immediately.
//!
//! The poll task never awaits the client (rumqttc #1025): it subscribes and
//! disconnects with the non-blocking `try_` calls and hands replies to the
//! waiting request through a oneshot channel.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{
    ConnAck, Filter, Packet, PubAck, PubAckReason, Publish, PublishProperties, SubscribeReasonCode,
};
use rumqttc::v5::{AsyncClient, Event, EventLoop};
use tokio::sync::{Notify, broadcast, oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use super::auth;
use super::backoff::Backoff;
use super::error::PoolError;
use super::events::{KeyNotification, MemberEvent, TopicMessage};
use super::options::{CONNECT_TIMEOUT, MAX_PACKET_SIZE, REQUEST_CHANNEL_CAPACITY};
use super::settings::BrokerSettings;
use super::takeover::{self, Ending, Evidence, TakeoverWatch};
use crate::metrics::Metrics;
use crate::protocol::{self, Hlc, Notification, property};

/// Correlation data: 16 random bytes, as the SDKs send (a UUID v4).
pub(crate) type CorrelationId = [u8; 16];

/// A reply as it arrived, interpreted by the waiting request's task so the
/// poll loop stays light.
#[derive(Debug)]
pub(crate) struct ReplyMessage {
    pub payload: Bytes,
    pub user_properties: Vec<(String, String)>,
}

/// What a request gets back from its member.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// The store's reply.
    Reply(ReplyMessage),
    /// The broker refused the request in its PUBACK (not authorized, no
    /// subscriber on the request topic, ...): it never reached the store.
    Refused(PubAckReason),
    /// The PUBACK of a message that awaits no reply (a pub/sub event),
    /// whatever its reason.
    Acknowledged(PubAckReason),
}

/// What a published message waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Awaits {
    /// A store request: the reply on the response topic (a refusing
    /// PUBACK ends it early).
    Reply,
    /// A pub/sub message: its PUBACK.
    Ack,
}

type ReplySender = oneshot::Sender<Result<Delivery, PoolError>>;

/// A request awaiting its reply.
#[derive(Debug)]
struct Waiter {
    reply: ReplySender,
    /// Whether rumqttc may have written the request to the network. Only a
    /// request that surely never left may fail as "not sent" (503, safe to
    /// retry); any other failure is an unknown outcome.
    may_have_left: bool,
}

/// The member that subscribes to the callers' topic filters (one broker
/// subscription per filter for the whole pool).
pub(crate) const TOPIC_MEMBER: usize = 0;

/// How long after CONNACK the SUBACK may take before the connection is
/// considered stuck and rebuilt.
const SUBACK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a DISCONNECT may take to go out before the socket is dropped.
const DISCONNECT_GRACE: Duration = Duration::from_secs(1);
/// How often a member looks for requests the broker never acknowledged.
const ACK_CHECK: Duration = Duration::from_millis(250);
/// How long the same connect failure stays quiet before it is warned again.
const REPEAT_WARNING_AFTER: Duration = Duration::from_secs(60);
/// How often a draining member checks whether its requests are done.
const DRAIN_CHECK: Duration = Duration::from_millis(5);

/// A member's connection state, as the `pool_members{state}` gauge shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Status {
    /// Connecting, or connected and waiting for SUBACK.
    Connecting = 0,
    /// Connected and subscribed: takes requests.
    Subscribed = 1,
    /// Disconnected, waiting to reconnect.
    Down = 2,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Connecting => "connecting",
            Status::Subscribed => "subscribed",
            Status::Down => "down",
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            1 => Status::Subscribed,
            2 => Status::Down,
            _ => Status::Connecting,
        }
    }
}

/// What every member shares with the pool.
#[derive(Debug)]
pub(crate) struct MemberContext {
    pub broker: BrokerSettings,
    pub metrics: Metrics,
    pub notifications: broadcast::Sender<KeyNotification>,
    pub events: broadcast::Sender<MemberEvent>,
    /// Messages on the callers' topic filters (received by the topic
    /// member, [`TOPIC_MEMBER`]).
    pub messages: broadcast::Sender<Arc<TopicMessage>>,
    /// The callers' topic filters: the topic member subscribes to them
    /// after every CONNACK.
    pub topic_filters: Mutex<BTreeSet<String>>,
    /// Woken when a request slot frees up or a member becomes usable.
    pub slot_freed: Notify,
    /// Requests waiting for a slot (frees only notify when there are any).
    pub slot_waiters: AtomicUsize,
    /// `true` once the pool shuts down.
    pub shutdown: watch::Sender<bool>,
    /// The request timeout: how long a draining member waits for its
    /// requests, and how long the broker may leave a request un-acked
    /// before the connection counts as dead.
    pub request_timeout: Duration,
    /// The largest packet both sides accept, from the latest CONNACK.
    pub broker_limit: PacketLimit,
    /// When a session takeover was last logged as an error (by any
    /// member: one line for the pool, at most once a minute).
    pub takeover_logged: Mutex<Option<Instant>>,
}

/// The largest packet the broker accepts, capped by our own
/// [`MAX_PACKET_SIZE`]; unknown until a CONNACK arrived.
#[derive(Debug, Default)]
pub(crate) struct PacketLimit(AtomicUsize);

impl PacketLimit {
    fn set(&self, broker_max: Option<u32>) {
        let ours = MAX_PACKET_SIZE as usize;
        let limit = broker_max.map_or(ours, |max| (max as usize).min(ours));
        self.0.store(limit, Ordering::Release);
    }

    /// `None` until known.
    pub(crate) fn get(&self) -> Option<usize> {
        match self.0.load(Ordering::Acquire) {
            0 => None,
            limit => Some(limit),
        }
    }
}

/// One member of the pool.
#[derive(Debug)]
pub(crate) struct Member {
    pub index: usize,
    pub client_id: String,
    pub response_topic: String,
    notify_filter: String,
    /// [`Status`] as a `u8`, readable without the lock for request routing.
    status: AtomicU8,
    /// Taken request slots.
    pub in_flight: AtomicUsize,
    /// Set while the member finishes its requests before a planned
    /// reconnect: routing skips it.
    pub draining: AtomicBool,
    /// The broker's CONNACK maximum packet size; 0 when none or unknown.
    max_packet_size: AtomicU32,
    /// Asks the member to drain and reconnect (new SAT token).
    reconnect: Notify,
    /// Whether any connection got a CONNACK (later ones are reconnects).
    ever_connected: AtomicBool,
    /// When another client with this client id last took the session.
    taken_over_at: Mutex<Option<Instant>>,
    state: Mutex<MemberState>,
}

#[derive(Debug)]
struct MemberState {
    /// The client of the current connection, once CONNACK arrived.
    client: Option<AsyncClient>,
    /// Replies awaited on the current connection.
    pending: HashMap<CorrelationId, Waiter>,
    /// Requests handed to rumqttc, in channel order, not yet seen going
    /// out. rumqttc sends publishes in channel order (it takes no new one
    /// while a packet id collides), so the n-th `Outgoing::Publish` event is
    /// the n-th request here: that is how a PUBACK's packet id finds its
    /// request.
    queued: VecDeque<(CorrelationId, Awaits)>,
    /// The token the current connection authenticated with.
    sat_token: Option<Bytes>,
}

/// How far one connection got.
#[derive(Debug, Default)]
struct Progress {
    /// CONNACK received.
    connected: bool,
    /// When CONNACK arrived.
    connected_at: Option<Instant>,
    /// When SUBACK arrived.
    subscribed_at: Option<Instant>,
}

/// Why a connection ended.
enum End {
    /// The pool is shutting down.
    Shutdown,
    /// A planned reconnect (new SAT token); requests were drained.
    Reconnect,
    /// The connection failed or was lost: why, and how it ended as far
    /// as session takeovers go.
    Lost(String, Ending),
}

impl End {
    /// Lost for a reason of our own (a deadline, a refused subscription).
    fn lost(reason: impl Into<String>) -> Self {
        End::Lost(reason.into(), Ending::Other)
    }
}

impl Member {
    pub(crate) fn new(index: usize, client_id: String) -> Self {
        Self {
            index,
            response_topic: protocol::response_topic(&client_id),
            notify_filter: protocol::notify_filter(&client_id),
            client_id,
            status: AtomicU8::new(Status::Connecting as u8),
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            max_packet_size: AtomicU32::new(0),
            reconnect: Notify::new(),
            ever_connected: AtomicBool::new(false),
            taken_over_at: Mutex::new(None),
            state: Mutex::new(MemberState {
                client: None,
                pending: HashMap::new(),
                queued: VecDeque::new(),
                sat_token: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, MemberState> {
        // Every critical section leaves the state consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn status(&self) -> Status {
        Status::from_u8(self.status.load(Ordering::Acquire))
    }

    /// Whether requests may be routed here by load (not while draining).
    pub(crate) fn is_routable(&self) -> bool {
        self.status() == Status::Subscribed && !self.draining.load(Ordering::Acquire)
    }

    /// The broker's maximum packet size on the current connection.
    pub(crate) fn max_packet_size(&self) -> Option<u32> {
        match self.max_packet_size.load(Ordering::Acquire) {
            0 => None,
            max => Some(max),
        }
    }

    /// The SAT token the current connection authenticated with.
    pub(crate) fn sat_token(&self) -> Option<Bytes> {
        self.lock().sat_token.clone()
    }

    /// Asks the member to finish its requests and reconnect.
    pub(crate) fn request_reconnect(&self) {
        self.reconnect.notify_one();
    }

    /// Whether another client with this client id took the session within
    /// the last [`takeover::UNREADY_FOR`].
    pub(crate) fn recently_taken_over(&self) -> bool {
        self.taken_over_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < takeover::UNREADY_FOR)
    }

    /// Another client took the session: counted, remembered for
    /// `/readyz`, and logged as an error at most once a minute for the
    /// pool (repeats at debug), naming the client id and the setting.
    fn taken_over(&self, evidence: Evidence, reason: &str, ctx: &MemberContext) {
        ctx.metrics
            .session_takeovers
            .with_label_values(&[evidence.label()])
            .inc();
        let now = Instant::now();
        *self
            .taken_over_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(now);
        let log_now = {
            let mut logged = ctx
                .takeover_logged
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let due = logged.is_none_or(|at| now.duration_since(at) >= REPEAT_WARNING_AFTER);
            if due {
                *logged = Some(now);
            }
            due
        };
        let client_id = &self.client_id;
        let what = match evidence {
            Evidence::ReasonCode => {
                "the broker gave this connection's MQTT session to another client with the same \
                 client id (DISCONNECT reason 0x8E, session taken over)"
                    .to_owned()
            }
            Evidence::QuickCloses(times) => format!(
                "the broker closed this connection {times} times in a row within seconds of \
                 accepting it, without a reason: most likely another client with the same client \
                 id takes the MQTT session over each time it connects"
            ),
        };
        if log_now {
            tracing::error!(
                member = self.index,
                %client_id,
                %reason,
                "{what}. Another gateway (or any MQTT client) connects as {client_id}, and the two \
                 keep taking the session from each other: requests fail and /readyz answers 503. \
                 Give each gateway its own client id (--client-id, AIO_MQTT_CLIENT_ID, Helm value \
                 broker.clientId), or leave it unset: the default is one per process and host. \
                 (Repeats within a minute are logged at debug.)"
            );
        } else {
            tracing::debug!(member = self.index, %client_id, %reason, "{what}");
        }
    }

    /// Registers the waiter (`awaits`: the reply or the PUBACK;
    /// `correlation` keys it either way) and hands the message to rumqttc
    /// without waiting; `ConnectionLost` if the member is no longer
    /// subscribed.
    pub(crate) fn publish(
        &self,
        correlation: CorrelationId,
        reply: ReplySender,
        awaits: Awaits,
        topic: impl Into<String>,
        payload: Bytes,
        properties: PublishProperties,
    ) -> Result<(), PoolError> {
        let mut state = self.lock();
        if self.status() != Status::Subscribed {
            return Err(PoolError::ConnectionLost);
        }
        let client = state.client.as_ref().ok_or(PoolError::ConnectionLost)?;
        // Under the lock, so `queued` is in channel order.
        client
            .try_publish_with_properties(topic, QoS::AtLeastOnce, false, payload, properties)
            .map_err(|_| PoolError::ConnectionLost)?;
        state.pending.insert(
            correlation,
            Waiter {
                reply,
                may_have_left: false,
            },
        );
        state.queued.push_back((correlation, awaits));
        Ok(())
    }

    /// Subscribes to a caller's topic filter now, if connected (otherwise
    /// the next CONNACK does).
    pub(crate) fn subscribe_topic(&self, filter: &str) {
        let state = self.lock();
        if self.status() == Status::Subscribed
            && let Some(client) = &state.client
            && let Err(error) = client.try_subscribe(filter, QoS::AtLeastOnce)
        {
            tracing::warn!(member = self.index, %error, filter, "cannot queue SUBSCRIBE for a topic filter");
        }
    }

    /// Unsubscribes from a caller's topic filter, if connected.
    pub(crate) fn unsubscribe_topic(&self, filter: &str) {
        let state = self.lock();
        if let Some(client) = &state.client {
            let _ = client.try_unsubscribe(filter);
        }
    }

    /// The message behind the next `Outgoing::Publish` event: it has been
    /// written to the network.
    fn next_queued(&self) -> Option<(CorrelationId, Awaits)> {
        let mut state = self.lock();
        let queued = state.queued.pop_front()?;
        if let Some(waiter) = state.pending.get_mut(&queued.0) {
            waiter.may_have_left = true;
        }
        Some(queued)
    }

    /// A message awaiting its PUBACK got it: tell the waiter.
    fn acknowledged(&self, correlation: CorrelationId, reason: PubAckReason) {
        if let Some(waiter) = self.lock().pending.remove(&correlation) {
            let _ = waiter.reply.send(Ok(Delivery::Acknowledged(reason)));
        }
    }

    /// The broker refused a request in its PUBACK: tell the waiter now
    /// rather than letting it time out.
    fn refused(&self, correlation: CorrelationId, reason: PubAckReason) {
        if let Some(waiter) = self.lock().pending.remove(&correlation) {
            let _ = waiter.reply.send(Ok(Delivery::Refused(reason)));
        }
    }

    /// Forgets a reply waiter (timed out, cancelled or failed to publish).
    pub(crate) fn forget(&self, correlation: &CorrelationId) {
        self.lock().pending.remove(correlation);
    }

    /// Reply waiters registered now.
    pub(crate) fn pending_replies(&self) -> usize {
        self.lock().pending.len()
    }

    fn set_status(&self, new: Status, metrics: &Metrics) {
        let old = Status::from_u8(self.status.swap(new as u8, Ordering::AcqRel));
        if old != new {
            metrics.pool_members.with_label_values(&[old.label()]).dec();
            metrics.pool_members.with_label_values(&[new.label()]).inc();
        }
    }

    /// A connection attempt starts (authenticating with `sat_token`, if any).
    fn begin(&self, sat_token: Option<Bytes>, ctx: &MemberContext) {
        let mut state = self.lock();
        state.sat_token = sat_token;
        state.client = None;
        state.queued.clear();
        self.set_status(Status::Connecting, &ctx.metrics);
    }

    fn on_connack(&self, connack: &ConnAck, client: &AsyncClient, ctx: &MemberContext) {
        if self.ever_connected.swap(true, Ordering::AcqRel) {
            ctx.metrics.reconnects.inc();
        }
        let max = connack
            .properties
            .as_ref()
            .and_then(|properties| properties.max_packet_size);
        self.max_packet_size
            .store(max.unwrap_or(0), Ordering::Release);
        ctx.broker_limit.set(max);
        let mut state = self.lock();
        state.client = Some(client.clone());
    }

    fn on_subscribed(&self, ctx: &MemberContext) {
        {
            let _state = self.lock();
            self.draining.store(false, Ordering::Release);
            self.set_status(Status::Subscribed, &ctx.metrics);
        }
        let _ = ctx
            .events
            .send(MemberEvent::Subscribed { member: self.index });
        ctx.slot_freed.notify_waiters();
    }

    /// The connection is gone: fail its requests at once, with `error` those
    /// that never left and as an unknown outcome those that may have.
    fn lost(&self, error: fn() -> PoolError, ctx: &MemberContext) {
        let mut state = self.lock();
        // A client is set from CONNACK on: losing it is a `Down` event.
        let was_connected = state.client.is_some();
        state.client = None;
        // rumqttc takes one request at a time from its channel and reports
        // it (`Outgoing::Publish`) after writing it: the oldest request not
        // yet reported may be half written when the connection fails. The
        // ones behind it are still in the channel.
        if let Some((first, _)) = state.queued.front().copied()
            && let Some(waiter) = state.pending.get_mut(&first)
        {
            waiter.may_have_left = true;
        }
        state.queued.clear();
        let pending: Vec<(ReplySender, PoolError)> = state
            .pending
            .drain()
            .map(|(_, waiter)| {
                let failure = if waiter.may_have_left {
                    PoolError::OutcomeUnknown
                } else {
                    error()
                };
                (waiter.reply, failure)
            })
            .collect();
        self.draining.store(false, Ordering::Release);
        self.max_packet_size.store(0, Ordering::Release);
        self.set_status(Status::Down, &ctx.metrics);
        drop(state);
        for (reply, failure) in pending {
            let _ = reply.send(Err(failure));
        }
        if was_connected {
            let _ = ctx.events.send(MemberEvent::Down { member: self.index });
        }
    }

    /// Routes an incoming PUBLISH: a reply to its waiter, a notification to
    /// the broadcast.
    fn route(&self, publish: Publish, ctx: &MemberContext) {
        let Ok(topic) = std::str::from_utf8(&publish.topic) else {
            tracing::debug!(
                member = self.index,
                "message with a non-UTF-8 topic dropped"
            );
            return;
        };
        let properties = publish.properties.unwrap_or_default();
        if topic == self.response_topic {
            let correlation: Option<CorrelationId> = properties
                .correlation_data
                .as_deref()
                .and_then(|data| data.try_into().ok());
            let waiter = correlation.and_then(|id| self.lock().pending.remove(&id));
            match waiter {
                Some(waiter) => {
                    let _ = waiter.reply.send(Ok(Delivery::Reply(ReplyMessage {
                        payload: publish.payload,
                        user_properties: properties.user_properties,
                    })));
                }
                None => tracing::debug!(
                    member = self.index,
                    correlation = ?properties.correlation_data.as_deref().map(hex::encode),
                    "reply with unknown correlation data dropped (timed out or not ours)"
                ),
            }
            return;
        }
        let Some(key) = protocol::notify_topic_key(topic, &self.client_id) else {
            if self.index == TOPIC_MEMBER {
                // No receiver is fine: nobody follows topics now.
                let _ = ctx.messages.send(Arc::new(TopicMessage::new(
                    topic.to_owned(),
                    publish.payload,
                    properties.content_type,
                )));
                return;
            }
            tracing::debug!(
                member = self.index,
                topic,
                "message on an unexpected topic dropped"
            );
            return;
        };
        let notification = match Notification::decode(&publish.payload) {
            Ok(notification) => notification,
            Err(error) => {
                tracing::warn!(member = self.index, %error, "undecodable notification dropped");
                return;
            }
        };
        let version = properties
            .user_properties
            .iter()
            .find(|(name, _)| name == property::TIMESTAMP)
            .and_then(|(_, value)| match Hlc::parse(value) {
                Ok(version) => Some(version),
                Err(error) => {
                    tracing::warn!(member = self.index, %error, "notification with a malformed __ts; version dropped");
                    None
                }
            });
        // No receiver is fine: nobody watches.
        let _ = ctx.notifications.send(KeyNotification {
            member: self.index,
            key: Bytes::from(key),
            notification,
            version,
        });
    }
}

/// Runs a member until the pool shuts down.
pub(crate) async fn run(member: Arc<Member>, ctx: Arc<MemberContext>) {
    let mut shutdown = ctx.shutdown.subscribe();
    let mut backoff = Backoff::default();
    let mut repeated = RepeatedFailure::default();
    let mut takeovers = TakeoverWatch::default();
    loop {
        if *shutdown.borrow() {
            break;
        }
        let built = match auth::connect_options(&ctx.broker, &member.client_id) {
            Ok(built) => built,
            Err(error) => {
                if repeated.is_new(&error.to_string()) {
                    tracing::error!(member = member.index, %error, "cannot build the connection settings; retrying");
                }
                member.lost(|| PoolError::ConnectionLost, &ctx);
                if wait_or_shutdown(backoff.next_delay(), &mut shutdown).await {
                    break;
                }
                continue;
            }
        };
        member.begin(built.sat_token, &ctx);
        // A reconnect asked for before this attempt is moot: it reads the
        // files anew anyway.
        let _ = member.reconnect.notified().now_or_never();
        let (client, mut eventloop) = AsyncClient::new(built.options, REQUEST_CHANNEL_CAPACITY);
        let mut progress = Progress::default();
        let end = drive(
            &member,
            &ctx,
            &client,
            &mut eventloop,
            &mut shutdown,
            &mut progress,
        )
        .await;
        backoff.connection_ended(progress.subscribed_at);
        let connected = progress.connected;
        match end {
            End::Shutdown => {
                member.lost(|| PoolError::ShuttingDown, &ctx);
                if connected {
                    disconnect(&client, &mut eventloop).await;
                }
                break;
            }
            End::Reconnect => {
                tracing::info!(member = member.index, "reconnecting with new credentials");
                if connected {
                    disconnect(&client, &mut eventloop).await;
                }
                member.lost(|| PoolError::ConnectionLost, &ctx);
            }
            End::Lost(reason, ending) => {
                let connected_for = progress.connected_at.map(|at| at.elapsed());
                if let Some(evidence) = takeovers.connection_ended(ending, connected_for) {
                    member.taken_over(evidence, &reason, &ctx);
                    repeated.clear();
                } else if connected {
                    tracing::warn!(member = member.index, client_id = %member.client_id, %reason, "broker connection lost");
                    repeated.clear();
                } else if repeated.is_new(&reason) {
                    tracing::warn!(member = member.index, client_id = %member.client_id, %reason, "cannot connect to the broker (repeats are logged at debug)");
                } else {
                    tracing::debug!(member = member.index, client_id = %member.client_id, %reason, "cannot connect to the broker");
                }
                member.lost(|| PoolError::ConnectionLost, &ctx);
                // The event loop is dropped here, never polled again.
                drop(eventloop);
                if wait_or_shutdown(backoff.next_delay(), &mut shutdown).await {
                    break;
                }
            }
        }
    }
    member.lost(|| PoolError::ShuttingDown, &ctx);
}

/// Polls one connection until it ends.
async fn drive(
    member: &Member,
    ctx: &MemberContext,
    client: &AsyncClient,
    eventloop: &mut EventLoop,
    shutdown: &mut watch::Receiver<bool>,
    progress: &mut Progress,
) -> End {
    // rumqttc bounds TCP/TLS + CONNACK by the connection timeout; this
    // bounds the whole way to SUBACK.
    let connect_deadline = sleep_until(Instant::now() + CONNECT_TIMEOUT + SUBACK_TIMEOUT);
    let mut subscribed = false;
    let mut drain_deadline: Option<Instant> = None;
    // Requests published and not yet PUBACKed, by packet id. A broker that
    // stops acknowledging (frozen, or a half-open connection after a node
    // died) is noticed within the request timeout rather than after two
    // keep-alive periods, and a refusing PUBACK fails its request at once.
    let mut unacked: HashMap<u16, (Option<(CorrelationId, Awaits)>, Instant)> = HashMap::new();
    let ack_check = sleep_until(Instant::now() + ACK_CHECK);
    let mut refusals = RepeatedFailure::default();
    // Made once per connection, not once per event: every request brings
    // about four events, and a fresh `Notified` or `Sleep` each time would
    // register and deregister with tokio (a lock apiece) for nothing. A
    // timer pushed later only updates its deadline. The price: the ack
    // check stays armed after the last PUBACK and wakes the task once,
    // within 250 ms, for nothing.
    let shutdown_signal = shutdown.wait_for(|down| *down);
    let reconnect = member.reconnect.notified();
    tokio::pin!(connect_deadline, ack_check, shutdown_signal, reconnect);
    loop {
        let event = {
            // One poll future per event, kept alive while timers fire: a
            // cancelled poll can lose a packet it took from the request
            // channel. It is only dropped unfinished when the connection
            // ends anyway.
            let poll = eventloop.poll();
            tokio::pin!(poll);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut shutdown_signal => return End::Shutdown,
                    // Fires once: draining ends the connection.
                    () = &mut reconnect, if drain_deadline.is_none() => {
                        if !subscribed {
                            // Not serving yet: the next attempt reads the new token anyway.
                            return End::Reconnect;
                        }
                        member.draining.store(true, Ordering::Release);
                        drain_deadline = Some(Instant::now() + ctx.request_timeout);
                    }
                    () = &mut connect_deadline, if !subscribed => {
                        return End::lost("no CONNACK and SUBACK within the connect deadline");
                    }
                    () = sleep(DRAIN_CHECK), if drain_deadline.is_some() => {
                        if drain_deadline.is_some_and(|deadline| {
                            member.in_flight.load(Ordering::Acquire) == 0 || Instant::now() >= deadline
                        }) {
                            return End::Reconnect;
                        }
                    }
                    () = &mut ack_check, if !unacked.is_empty() => {
                        let now = Instant::now();
                        ack_check.as_mut().reset(now + ACK_CHECK);
                        if unacked.values().any(|(_, sent)| now.duration_since(*sent) >= ctx.request_timeout) {
                            return End::lost(format!(
                                "the broker acknowledged no request for {:?}",
                                ctx.request_timeout
                            ));
                        }
                    }
                    event = &mut poll => break event,
                }
            }
        };
        match event {
            Err(error) => return End::Lost(error.to_string(), Ending::of(&error)),
            Ok(Event::Incoming(Packet::ConnAck(connack))) => {
                progress.connected = true;
                progress.connected_at = Some(Instant::now());
                member.on_connack(&connack, client, ctx);
                let filters = [
                    Filter::new(member.response_topic.clone(), QoS::AtLeastOnce),
                    Filter::new(member.notify_filter.clone(), QoS::AtLeastOnce),
                ];
                if let Err(error) = client.try_subscribe_many(filters) {
                    return End::lost(format!("cannot queue SUBSCRIBE: {error}"));
                }
                connect_deadline
                    .as_mut()
                    .reset(Instant::now() + SUBACK_TIMEOUT);
            }
            Ok(Event::Incoming(Packet::SubAck(suback))) if subscribed => {
                // A caller's topic filter: a refusal is the broker's
                // authorization of the gateway, not a broken connection.
                if let Some(code) = suback
                    .return_codes
                    .iter()
                    .find(|code| !matches!(code, SubscribeReasonCode::Success(_)))
                {
                    tracing::warn!(member = member.index, reason = ?code, "the broker refused a topic subscription");
                }
            }
            Ok(Event::Incoming(Packet::SubAck(suback))) => {
                let refused: Vec<&SubscribeReasonCode> = suback
                    .return_codes
                    .iter()
                    .filter(|code| !matches!(code, SubscribeReasonCode::Success(_)))
                    .collect();
                if !refused.is_empty() {
                    return End::lost(format!("the broker refused the subscriptions: {refused:?}"));
                }
                subscribed = true;
                progress.subscribed_at = Some(Instant::now());
                member.on_subscribed(ctx);
                if member.index == TOPIC_MEMBER {
                    // After `on_subscribed`: a filter added meanwhile is
                    // either in this set or subscribed by its adder.
                    let filters: Vec<Filter> = ctx
                        .topic_filters
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .iter()
                        .map(|filter| Filter::new(filter.clone(), QoS::AtLeastOnce))
                        .collect();
                    if !filters.is_empty()
                        && let Err(error) = client.try_subscribe_many(filters)
                    {
                        return End::lost(format!(
                            "cannot queue SUBSCRIBE for topic filters: {error}"
                        ));
                    }
                }
                if member.recently_taken_over() {
                    // Again and again while another client takes it back.
                    tracing::debug!(member = member.index, client_id = %member.client_id, "connected and subscribed");
                } else {
                    tracing::info!(member = member.index, client_id = %member.client_id, "connected and subscribed");
                }
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => member.route(publish, ctx),
            Ok(Event::Outgoing(Outgoing::Publish(packet_id))) => {
                if unacked.is_empty() {
                    ack_check.as_mut().reset(Instant::now() + ACK_CHECK);
                }
                unacked.insert(packet_id, (member.next_queued(), Instant::now()));
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                if let Some((queued, _)) = unacked.remove(&ack.pkid) {
                    on_puback(member, &ack, queued, &mut refusals);
                }
            }
            Ok(_) => {}
        }
    }
}

/// A message awaiting its PUBACK gets it, whatever the reason. For a
/// store request, a PUBACK other than success (or "no matching
/// subscribers", which rumqttc also counts as success but means no store
/// is listening) ends it.
fn on_puback(
    member: &Member,
    ack: &PubAck,
    queued: Option<(CorrelationId, Awaits)>,
    refusals: &mut RepeatedFailure,
) {
    let correlation = match queued {
        Some((correlation, Awaits::Ack)) => return member.acknowledged(correlation, ack.reason),
        Some((correlation, Awaits::Reply)) => Some(correlation),
        None => None,
    };
    if ack.reason == PubAckReason::Success {
        return;
    }
    let reason = format!("{:?}", ack.reason);
    if refusals.is_new(&reason) {
        tracing::warn!(
            member = member.index,
            %reason,
            detail = ?ack.properties.as_ref().and_then(|p| p.reason_string.as_deref()),
            "the broker refused a state store request (repeats within a minute are not logged)"
        );
    }
    if let Some(correlation) = correlation {
        member.refused(correlation, ack.reason);
    }
}

/// Sends DISCONNECT on a connected event loop and polls only until it is
/// out: a loop polled after `disconnect()` would reconnect and fight the
/// next connection with the same client id.
pub(super) async fn disconnect(client: &AsyncClient, eventloop: &mut EventLoop) {
    if client.try_disconnect().is_err() {
        return;
    }
    let _ = timeout(DISCONNECT_GRACE, async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

/// Sleeps for `delay` unless the pool shuts down first; `true` on shutdown.
pub(super) async fn wait_or_shutdown(
    delay: Duration,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        _ = shutdown.wait_for(|down| *down) => true,
        () = sleep(delay) => false,
    }
}

/// Keeps a member that cannot connect from logging the same warning every
/// backoff period: a reason is new if it differs from the last one logged
/// or that was logged more than [`REPEAT_WARNING_AFTER`] ago.
#[derive(Debug, Default)]
struct RepeatedFailure {
    last: Option<(String, Instant)>,
}

impl RepeatedFailure {
    fn is_new(&mut self, reason: &str) -> bool {
        let now = Instant::now();
        let new = match &self.last {
            Some((last, at)) => last != reason || now.duration_since(*at) >= REPEAT_WARNING_AFTER,
            None => true,
        };
        if new {
            self.last = Some((reason.to_owned(), now));
        }
        new
    }

    fn clear(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_failure_is_new_only_once() {
        let mut repeated = RepeatedFailure::default();
        assert!(repeated.is_new("refused"));
        assert!(!repeated.is_new("refused"));
        assert!(repeated.is_new("timeout"));
        repeated.clear();
        assert!(repeated.is_new("timeout"));
    }

    fn context() -> (MemberContext, broadcast::Receiver<KeyNotification>) {
        let (notifications, receiver) = broadcast::channel(16);
        let context = MemberContext {
            broker: BrokerSettings::new("localhost", 1883),
            metrics: Metrics::new(),
            notifications,
            events: broadcast::channel(16).0,
            messages: broadcast::channel(16).0,
            topic_filters: Mutex::default(),
            slot_freed: Notify::new(),
            slot_waiters: AtomicUsize::new(0),
            shutdown: watch::channel(false).0,
            request_timeout: Duration::from_secs(1),
            broker_limit: PacketLimit::default(),
            takeover_logged: Mutex::new(None),
        };
        (context, receiver)
    }

    /// Registers a waiter through the real publish path (the client's
    /// channel has room and nobody polls it).
    fn register(member: &Member, correlation: CorrelationId, reply: ReplySender) {
        member
            .publish(
                correlation,
                reply,
                Awaits::Reply,
                "t",
                Bytes::new(),
                PublishProperties::default(),
            )
            .unwrap();
        assert_eq!(member.next_queued(), Some((correlation, Awaits::Reply)));
    }

    fn publish(
        topic: &str,
        payload: &[u8],
        properties: rumqttc::v5::mqttbytes::v5::PublishProperties,
    ) -> Publish {
        Publish::new(topic, QoS::AtLeastOnce, payload.to_vec(), Some(properties))
    }

    #[test]
    fn replies_reach_their_waiter_by_correlation_data() {
        let (ctx, _) = context();
        let member = Member::new(0, "gw-0".into());
        member.set_status(Status::Subscribed, &ctx.metrics);
        let (client, _eventloop) =
            AsyncClient::new(rumqttc::v5::MqttOptions::new("x", "localhost", 1), 1);
        member.lock().client = Some(client);
        let (tx, mut rx) = oneshot::channel();
        register(&member, [7; 16], tx);
        let properties = rumqttc::v5::mqttbytes::v5::PublishProperties {
            correlation_data: Some(Bytes::from_static(&[7; 16])),
            user_properties: vec![("__stat".into(), "200".into())],
            ..Default::default()
        };
        // Unknown correlation data is dropped without touching the waiter.
        member.route(
            publish(
                &member.response_topic.clone(),
                b"+OK\r\n",
                rumqttc::v5::mqttbytes::v5::PublishProperties {
                    correlation_data: Some(Bytes::from_static(&[8; 16])),
                    ..Default::default()
                },
            ),
            &ctx,
        );
        assert!(rx.try_recv().is_err());
        member.route(
            publish(&member.response_topic.clone(), b"+OK\r\n", properties),
            &ctx,
        );
        let Delivery::Reply(reply) = rx.try_recv().unwrap().unwrap() else {
            panic!("not a reply")
        };
        assert_eq!(&reply.payload[..], b"+OK\r\n");
        assert_eq!(
            reply.user_properties,
            vec![("__stat".to_owned(), "200".to_owned())]
        );
        assert!(member.lock().pending.is_empty());
    }

    #[test]
    fn losing_the_connection_fails_pending_requests_at_once() {
        let (ctx, _) = context();
        let member = Member::new(1, "gw-1".into());
        member.set_status(Status::Subscribed, &ctx.metrics);
        let (client, _eventloop) =
            AsyncClient::new(rumqttc::v5::MqttOptions::new("x", "localhost", 1), 4);
        member.lock().client = Some(client);
        // Written to the network, taken by rumqttc but not reported yet, and
        // still in the channel.
        let (sent_tx, mut sent) = oneshot::channel();
        register(&member, [1; 16], sent_tx);
        let queue = |correlation| {
            let (tx, rx) = oneshot::channel();
            member
                .publish(
                    correlation,
                    tx,
                    Awaits::Reply,
                    "t",
                    Bytes::new(),
                    PublishProperties::default(),
                )
                .unwrap();
            rx
        };
        let mut taken = queue([3; 16]);
        let mut waiting = queue([4; 16]);
        member.lost(|| PoolError::ConnectionLost, &ctx);
        assert!(matches!(
            sent.try_recv(),
            Ok(Err(PoolError::OutcomeUnknown))
        ));
        assert!(matches!(
            taken.try_recv(),
            Ok(Err(PoolError::OutcomeUnknown))
        ));
        assert!(matches!(
            waiting.try_recv(),
            Ok(Err(PoolError::ConnectionLost))
        ));
        assert_eq!(member.status(), Status::Down);
        let (tx, _rx) = oneshot::channel();
        assert!(matches!(
            member.publish(
                [2; 16],
                tx,
                Awaits::Reply,
                "t",
                Bytes::new(),
                PublishProperties::default()
            ),
            Err(PoolError::ConnectionLost)
        ));
    }

    #[test]
    fn notifications_are_decoded_with_key_and_version() {
        let (ctx, mut notifications) = context();
        let member = Member::new(2, "gw-2".into());
        let topic = protocol::notify_topic("gw-2", b"k/1");
        let properties = rumqttc::v5::mqttbytes::v5::PublishProperties {
            user_properties: vec![("__ts".into(), "1700000000000:3:StateStore".into())],
            ..Default::default()
        };
        let payload = Notification::Set {
            value: Bytes::from_static(b"v"),
        }
        .encode();
        member.route(publish(&topic, &payload, properties), &ctx);
        let got = notifications.try_recv().unwrap();
        assert_eq!(got.member, 2);
        assert_eq!(&got.key[..], b"k/1");
        assert_eq!(
            got.notification,
            Notification::Set {
                value: Bytes::from_static(b"v")
            }
        );
        assert_eq!(
            got.version,
            Some(Hlc::parse("1700000000000:3:StateStore").unwrap())
        );
        // A notification for another client id is not ours.
        member.route(
            publish(
                &protocol::notify_topic("gw-3", b"k"),
                &Notification::Delete.encode(),
                Default::default(),
            ),
            &ctx,
        );
        assert!(notifications.try_recv().is_err());
    }

    #[test]
    fn status_changes_keep_the_member_gauge_exact() {
        let (ctx, _) = context();
        ctx.metrics
            .pool_members
            .with_label_values(&["connecting"])
            .inc();
        let member = Member::new(0, "gw-0".into());
        member.set_status(Status::Subscribed, &ctx.metrics);
        member.set_status(Status::Subscribed, &ctx.metrics);
        member.set_status(Status::Down, &ctx.metrics);
        let gauge = |state: &str| ctx.metrics.pool_members.with_label_values(&[state]).get();
        assert_eq!(
            (gauge("connecting"), gauge("subscribed"), gauge("down")),
            (0, 0, 1)
        );
    }
}
