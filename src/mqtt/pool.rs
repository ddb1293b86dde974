//! The gateway's pool of MQTT5 connections to the broker.
//!
//! `size` members (client ids `<client_id>-<i>`), each subscribed to its own
//! response topic and notification filter. A request goes to the
//! least-loaded subscribed member, waits briefly for a slot in that member's
//! bounded in-flight window (then fails as `Overloaded`, never queues
//! without bound), and is matched to its reply by 16 random bytes of
//! correlation data. A member that drops fails its requests at once and
//! reconnects on its own (see [`super::connection`]); when the SAT token
//! file changes, members reconnect one at a time, each after finishing its
//! requests, so the pool keeps serving. Members connect with clean start:
//! they subscribe again after every CONNACK (and the watch hub re-registers
//! its keys on `MemberEvent::Subscribed`), so an old session would only
//! hold replies nobody waits for.
//!
//! The envelope is the official SDK's, in its order: `__ft` and
//! `aio-persistence` (when asked), then `__srcId`, `__ts`, `__protVer`,
//! `$partition`, `$high_priority`, then the caller's `traceparent` and
//! `tracestate` (see [`crate::trace`]); content type `application/octet-stream`,
//! message expiry = the request timeout rounded up to whole seconds, QoS 1.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{PubAckReason, Publish, PublishProperties};
use tokio::sync::{Notify, broadcast, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::auth;
use super::connection::{
    self, Awaits, CorrelationId, Delivery, Member, MemberContext, ReplyMessage, Status,
};
use super::error::{PoolError, PoolStartError, PublishError};
use super::events::{KeyNotification, MemberEvent, TopicMessage};
use super::options::{CONNECT_TIMEOUT, MAX_PACKET_SIZE, REQUEST_CHANNEL_CAPACITY};
use super::settings::PoolSettings;
use crate::metrics::Metrics;
use crate::protocol::{
    CONTENT_TYPE, Hlc, HybridClock, PROTOCOL_VERSION, REQUEST_TOPIC, Reply, Request, STATUS_OK,
    StoreError, property,
};
use crate::trace;

/// Bytes of a SET's packet that are not the value: topic, response topic,
/// correlation data, user properties (the caller's trace context among
/// them: at most about 600 bytes), the key and RESP framing. Covers keys up
/// to about 1 KiB; [`Pool::request`] checks each packet exactly.
pub const ENVELOPE_ALLOWANCE: usize = 2048 + 640;

/// Notifications buffered per receiver before it lags.
const NOTIFICATION_BUFFER: usize = 4096;

/// Topic messages buffered (shared by every receiver) before a slow
/// receiver lags: at most this many messages are held, whatever the
/// number of receivers.
const TOPIC_MESSAGE_BUFFER: usize = 256;

/// Member events buffered per receiver before it lags.
const EVENT_BUFFER: usize = 256;

/// How long `shutdown` waits for members to send DISCONNECT.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// How often a SAT rollout checks whether the reconnected member is back.
const ROLLOUT_POLL: Duration = Duration::from_millis(20);

/// Per-request envelope options.
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// `__ft`
    pub fencing_token: Option<Hlc>,
    /// `aio-persistence: true` (SET only)
    pub persist: bool,
    /// Send on this member only (`None`: the least-loaded one). KEYNOTIFY
    /// registrations belong to the member (client id) that sent them.
    pub member: Option<usize>,
}

/// A pub/sub message: published at QoS 1, not retained.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// The MQTT topic (checked by the caller: no wildcards, not empty).
    pub topic: String,
    /// The payload, as it goes out.
    pub payload: Bytes,
    /// The MQTT5 content type property.
    pub content_type: Option<String>,
    /// The MQTT5 message expiry interval, in seconds.
    pub expiry_seconds: Option<u32>,
    /// MQTT5 user properties, in order.
    pub user_properties: Vec<(String, String)>,
}

/// What the broker's PUBACK said of a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Accepted (PUBACK success).
    Accepted,
    /// Accepted, and nobody subscribes to the topic now (PUBACK 0x10): a
    /// success for pub/sub, where publishers do not wait for subscribers.
    NoSubscribers,
}

/// A decoded reply and the key's version from its `__ts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreResponse {
    /// The payload.
    pub reply: Reply,
    /// `__ts` of the reply: the key's version (absent on a GET miss).
    pub version: Option<Hlc>,
}

/// The pool. Cheap to clone; every clone is the same pool. Dropping the
/// last clone stops the members (without waiting); call
/// [`Pool::shutdown`] to disconnect cleanly.
#[derive(Debug, Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    client_id: String,
    slot_wait: Duration,
    max_in_flight: usize,
    members: Vec<Arc<Member>>,
    ctx: Arc<MemberContext>,
    /// One HLC for every request of the gateway (node id = the base client id).
    clock: HybridClock,
    shutting_down: AtomicBool,
    /// Rotates the starting member so equal loads spread evenly.
    next: AtomicUsize,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("client_id", &self.client_id)
            .field("size", &self.members.len())
            .field("shutting_down", &self.shutting_down)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ctx.shutdown.send_replace(true);
    }
}

/// A taken request slot on one member; frees it (and forgets the reply
/// waiter, if still registered) when the request ends in any way,
/// including the caller dropping the future.
struct Slot {
    member: Arc<Member>,
    ctx: Arc<MemberContext>,
    correlation: Option<CorrelationId>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(correlation) = self.correlation {
            self.member.forget(&correlation);
        }
        // SeqCst with the waiter count: either a waiter sees this slot free
        // or we see the waiter (see `Waiting`).
        self.member.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.ctx.metrics.in_flight.dec();
        if self.ctx.slot_waiters.load(Ordering::SeqCst) > 0 {
            self.ctx.slot_freed.notify_waiters();
        }
    }
}

/// A request waiting for a slot, counted in `slot_waiters` for as long as
/// it waits.
struct Waiting<'a>(&'a MemberContext);

impl<'a> Waiting<'a> {
    fn new(ctx: &'a MemberContext) -> Self {
        ctx.slot_waiters.fetch_add(1, Ordering::SeqCst);
        Self(ctx)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.slot_waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pool {
    /// Starts `size` members connecting in the background; returns at once.
    ///
    /// Fails if a setting cannot work (unreadable CA or token file, TLS
    /// without a host name, ...): every file is read once here so the error
    /// names the setting. Must be called inside a Tokio runtime.
    ///
    /// `max_in_flight_per_member` is capped at half the rumqttc request
    /// channel so that publishing never waits on the channel.
    pub fn start(settings: PoolSettings, metrics: Metrics) -> Result<Pool, PoolStartError> {
        settings.check()?;
        auth::check(&settings.broker)?;
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| PoolStartError::NoRuntime)?;

        let members: Vec<Arc<Member>> = (0..settings.size)
            .map(|index| {
                Arc::new(Member::new(
                    index,
                    format!("{}-{index}", settings.client_id),
                ))
            })
            .collect();
        metrics
            .pool_members
            .with_label_values(&["connecting"])
            .add(members.len() as i64);
        let ctx = Arc::new(MemberContext {
            broker: settings.broker.clone(),
            metrics,
            notifications: broadcast::channel(NOTIFICATION_BUFFER).0,
            events: broadcast::channel(EVENT_BUFFER).0,
            messages: broadcast::channel(TOPIC_MESSAGE_BUFFER).0,
            topic_filters: Mutex::default(),
            slot_freed: Notify::new(),
            slot_waiters: AtomicUsize::new(0),
            shutdown: watch::channel(false).0,
            request_timeout: settings.request_timeout,
            broker_limit: Default::default(),
            takeover_logged: Mutex::new(None),
        });
        let mut tasks: Vec<JoinHandle<()>> = members
            .iter()
            .map(|member| runtime.spawn(connection::run(member.clone(), ctx.clone())))
            .collect();
        if let Some(sat_file) = settings.broker.sat_file.clone() {
            tasks.push(runtime.spawn(watch_sat(
                sat_file,
                settings.sat_check_interval,
                members.clone(),
                ctx.clone(),
            )));
        }
        Ok(Pool {
            inner: Arc::new(Inner {
                clock: HybridClock::new(settings.client_id.clone()),
                client_id: settings.client_id,
                slot_wait: settings.slot_wait,
                max_in_flight: settings
                    .max_in_flight_per_member
                    .min(REQUEST_CHANNEL_CAPACITY / 2),
                members,
                ctx,
                shutting_down: AtomicBool::new(false),
                next: AtomicUsize::new(0),
                tasks: Mutex::new(tasks),
            }),
        })
    }

    /// Sends a request on the least-loaded subscribed member (or on
    /// `options.member`, waiting up to the slot wait for it to be subscribed
    /// and to have a free slot) and waits for its reply (bounded by the
    /// request timeout). The reply is read by `read` (the store client's
    /// decoding; `|response| response` keeps it as is): the metrics are
    /// labelled from what it makes of it.
    ///
    /// A reply whose `__stat` is present and not `200` (the SDK executors'
    /// way of reporting a failed invocation) becomes
    /// `Reply::Error(StoreError::Unknown("state store status <code>: <__stMsg>"))`
    /// without a version, so callers handle it like any `-ERR` reply. A
    /// reply version is merged into the pool's clock; one too far ahead to
    /// merge is logged and still returned (the store did apply the request).
    ///
    /// A request the broker refuses in its PUBACK fails at once instead of
    /// timing out: nothing subscribed to the request topic gives
    /// `Unavailable`, "not authorized" and "quota exceeded" give the store's
    /// errors of those names, other reasons an unknown store error.
    ///
    /// `ConnectionLost` means the request never left the gateway;
    /// `OutcomeUnknown` and `Timeout` that it may have reached the store.
    pub async fn request<T: Labelled>(
        &self,
        request: &Request,
        options: &RequestOptions,
        read: impl FnOnce(StoreResponse) -> T,
    ) -> Result<T, PoolError> {
        if options
            .member
            .is_some_and(|member| member >= self.inner.members.len())
        {
            return Err(PoolError::Unavailable);
        }
        let started = std::time::Instant::now();
        // With span export, the request's client span (`None` otherwise).
        let mut span = trace::Span::store(request.verb());
        let result = self
            .exchange(options.member, request, options, span.as_mut())
            .await
            .map(read);
        let (outcome, error_kind) = self.record(request, &result, started.elapsed());
        if let Some(span) = span {
            span.end_with(outcome, error_kind);
        }
        result
    }

    /// The broker the members connect to (other connections of the
    /// gateway, such as pub/sub subscribers, connect there too).
    pub fn broker(&self) -> &super::BrokerSettings {
        &self.inner.ctx.broker
    }

    /// The base client id (members are `<id>-<n>`).
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    /// Publishes `message` at QoS 1 on the least-loaded member (sharing
    /// the in-flight windows with store requests) and waits for its PUBACK,
    /// bounded by the request timeout. "No matching subscribers" is
    /// success; "not authorized" and other refusals are errors.
    ///
    /// `ConnectionLost` means the message never left the gateway;
    /// `OutcomeUnknown` and `Timeout` that it may have been published.
    pub async fn publish(&self, message: Message) -> Result<Published, PublishError> {
        if self.inner.shutting_down.load(Ordering::Acquire) {
            return Err(PublishError::ShuttingDown);
        }
        let mut slot = self.acquire(None).await?;
        let member = slot.member.clone();
        let properties = PublishProperties {
            message_expiry_interval: message.expiry_seconds,
            content_type: message.content_type,
            user_properties: message.user_properties,
            ..Default::default()
        };
        let max = member
            .max_packet_size()
            .unwrap_or(MAX_PACKET_SIZE)
            .min(MAX_PACKET_SIZE) as usize;
        if message.payload.len() + envelope_bound(&message.topic, &properties) > max {
            let size = Publish::new(
                message.topic.as_str(),
                QoS::AtLeastOnce,
                message.payload.clone(),
                Some(properties.clone()),
            )
            .size()
                + 2;
            if size > max {
                return Err(PublishError::TooLarge { size, max });
            }
        }
        // Keys the PUBACK's waiter only: nothing of it goes on the wire.
        let correlation: CorrelationId = rand::random();
        let (ack_tx, ack_rx) = oneshot::channel();
        member.publish(
            correlation,
            ack_tx,
            Awaits::Ack,
            message.topic,
            message.payload,
            properties,
        )?;
        slot.correlation = Some(correlation);
        let timeout = self.inner.ctx.request_timeout;
        let delivery = match tokio::time::timeout(timeout, ack_rx).await {
            Err(_) => return Err(PublishError::Timeout(timeout)),
            Ok(Err(_)) => return Err(PublishError::OutcomeUnknown),
            Ok(Ok(result)) => {
                slot.correlation = None;
                result?
            }
        };
        match delivery {
            Delivery::Acknowledged(reason) => acknowledgement(reason),
            // Only store requests get replies or early refusals.
            Delivery::Reply(_) | Delivery::Refused(_) => Err(PublishError::OutcomeUnknown),
        }
    }

    /// Subscribes the pool (one member: the first) to a caller's topic
    /// filter, now and after every reconnect, until
    /// [`Pool::remove_topic_filter`]. Messages arrive on
    /// [`Pool::topic_messages`]. Callers count their users of a filter:
    /// the pool holds each once.
    pub fn add_topic_filter(&self, filter: &str) {
        self.inner
            .ctx
            .topic_filters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(filter.to_owned());
        self.inner.members[connection::TOPIC_MEMBER].subscribe_topic(filter);
    }

    /// Unsubscribes from a filter [`Pool::add_topic_filter`] added.
    pub fn remove_topic_filter(&self, filter: &str) {
        self.inner
            .ctx
            .topic_filters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(filter);
        self.inner.members[connection::TOPIC_MEMBER].unsubscribe_topic(filter);
    }

    /// The messages of every topic filter added, from now on (a receiver
    /// that falls 256 messages behind lags).
    pub fn topic_messages(&self) -> broadcast::Receiver<Arc<TopicMessage>> {
        self.inner.ctx.messages.subscribe()
    }

    /// The request timeout: how long a request may wait for its reply.
    pub fn request_timeout(&self) -> Duration {
        self.inner.ctx.request_timeout
    }

    /// Requests the pool carries at once when every member is up: members
    /// times each one's in-flight window.
    pub fn capacity(&self) -> usize {
        self.inner.members.len() * self.inner.max_in_flight
    }

    /// A subscribed member, preferring the given one (for KEYNOTIFY);
    /// otherwise the least-loaded one that is not about to reconnect.
    pub fn subscribed_member(&self, preferred: Option<usize>) -> Option<usize> {
        let members = &self.inner.members;
        if let Some(member) = preferred.and_then(|index| members.get(index))
            && member.status() == Status::Subscribed
        {
            return Some(member.index);
        }
        members
            .iter()
            .filter(|member| member.is_routable())
            .min_by_key(|member| member.in_flight.load(Ordering::Acquire))
            .or_else(|| {
                members
                    .iter()
                    .find(|member| member.status() == Status::Subscribed)
            })
            .map(|member| member.index)
    }

    /// Notifications received by any member.
    pub fn notifications(&self) -> broadcast::Receiver<KeyNotification> {
        self.inner.ctx.notifications.subscribe()
    }

    /// Member state changes.
    pub fn member_events(&self) -> broadcast::Receiver<MemberEvent> {
        self.inner.ctx.events.subscribe()
    }

    /// Reply waiters held by all members: requests sent and not yet
    /// answered, timed out or failed. Zero whenever nothing is in flight;
    /// anything else is a leak (the `store_pending_replies` gauge).
    pub fn pending_replies(&self) -> usize {
        self.inner
            .members
            .iter()
            .map(|member| member.pending_replies())
            .sum()
    }

    /// Whether at least one member is subscribed (`/readyz`).
    pub fn is_ready(&self) -> bool {
        !self.inner.shutting_down.load(Ordering::Acquire)
            && self
                .inner
                .members
                .iter()
                .any(|member| member.status() == Status::Subscribed)
    }

    /// The client id of a member whose MQTT session another client with
    /// the same client id took within the last few seconds, if any:
    /// `/readyz` answers 503 while two clients keep taking the session
    /// from each other.
    pub fn session_taken_over(&self) -> Option<&str> {
        self.inner
            .members
            .iter()
            .find(|member| member.recently_taken_over())
            .map(|member| member.client_id.as_str())
    }

    /// The largest value a SET can carry: the broker's CONNACK maximum
    /// packet size, capped by our own (a GET reply must fit the packets we
    /// accept), minus [`ENVELOPE_ALLOWANCE`]. `None` until a member has
    /// connected. Unlike a broker without a limit, we always have one, so
    /// this is never unlimited.
    pub fn max_value_bytes(&self) -> Option<usize> {
        let limit = self.inner.ctx.broker_limit.get()?;
        Some(limit.saturating_sub(ENVELOPE_ALLOWANCE))
    }

    /// Disconnects every member cleanly; pending requests fail with
    /// `ShuttingDown`, new ones too. Members stop polling after their
    /// DISCONNECT is out. Bounded by a few seconds.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::Release);
        self.inner.ctx.shutdown.send_replace(true);
        self.inner.ctx.slot_freed.notify_waiters();
        let tasks = std::mem::take(
            &mut *self
                .inner
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        for mut task in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                tracing::warn!("a pool member did not stop in time; aborting it");
                task.abort();
            }
        }
    }

    async fn exchange(
        &self,
        target: Option<usize>,
        request: &Request,
        options: &RequestOptions,
        span: Option<&mut trace::Span>,
    ) -> Result<StoreResponse, PoolError> {
        if self.inner.shutting_down.load(Ordering::Acquire) {
            return Err(PoolError::ShuttingDown);
        }
        let acquiring = span.is_some().then(std::time::Instant::now);
        let mut slot = self.acquire(target).await?;
        let member = slot.member.clone();
        let propagated = match (span, acquiring) {
            (Some(span), Some(acquiring)) => {
                span.set_member(member.index, &member.client_id, acquiring.elapsed());
                Some(&*span)
            }
            _ => None,
        };
        let correlation: CorrelationId = rand::random();
        let stamp = self.inner.clock.now();
        if stamp.fell_back {
            self.inner.ctx.metrics.clock_fallbacks.inc();
        }
        let timestamp = stamp.hlc;
        let properties = self.properties(
            &member,
            request,
            options,
            &timestamp,
            correlation,
            propagated.map(trace::Span::context),
        );
        let payload = Bytes::from(request.encode());

        let max = member
            .max_packet_size()
            .unwrap_or(MAX_PACKET_SIZE)
            .min(MAX_PACKET_SIZE) as usize;
        if payload.len() + envelope_bound(REQUEST_TOPIC, &properties) > max {
            // Close to the limit: size the packet exactly as it will go out
            // (packet id included).
            let size = Publish::new(
                REQUEST_TOPIC,
                QoS::AtLeastOnce,
                payload.clone(),
                Some(properties.clone()),
            )
            .size()
                + 2;
            if size > max {
                return Err(PoolError::TooLarge { size, max });
            }
        }

        let (reply_tx, reply_rx) = oneshot::channel();
        member.publish(
            correlation,
            reply_tx,
            Awaits::Reply,
            REQUEST_TOPIC,
            payload,
            properties,
        )?;
        slot.correlation = Some(correlation);

        let timeout = self.inner.ctx.request_timeout;
        let delivery = match tokio::time::timeout(timeout, reply_rx).await {
            Err(_) => return Err(PoolError::Timeout(timeout)),
            // The member dropped the waiter without an answer: it is gone,
            // and nobody can tell whether the request went out.
            Ok(Err(_)) => return Err(PoolError::OutcomeUnknown),
            Ok(Ok(result)) => {
                // Whoever answered removed the waiter already.
                slot.correlation = None;
                result?
            }
        };
        drop(slot);
        match delivery {
            Delivery::Reply(message) => self.interpret(request, message),
            Delivery::Refused(reason) => refusal(reason),
            // Only pub/sub messages await their PUBACK alone.
            Delivery::Acknowledged(_) => Err(PoolError::OutcomeUnknown),
        }
    }

    /// Takes a slot on the least-loaded usable member (or on `target`),
    /// waiting up to the slot wait for one to free up.
    async fn acquire(&self, target: Option<usize>) -> Result<Slot, PoolError> {
        if let Ok(slot) = self.try_acquire(target) {
            return Ok(slot);
        }
        let deadline = Instant::now() + self.inner.slot_wait;
        // Counted so that freeing a slot only wakes anyone when someone waits.
        let _waiting = Waiting::new(&self.inner.ctx);
        loop {
            let notified = self.inner.ctx.slot_freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let error = match self.try_acquire(target) {
                Ok(slot) => return Ok(slot),
                Err(error) => error,
            };
            if self.inner.shutting_down.load(Ordering::Acquire) {
                return Err(PoolError::ShuttingDown);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(error);
            }
        }
    }

    fn try_acquire(&self, target: Option<usize>) -> Result<Slot, PoolError> {
        let members = &self.inner.members;
        let max = self.inner.max_in_flight;
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        // A few rounds in case other requests take the chosen slot first.
        for _ in 0..4 {
            let mut usable = false;
            let mut best: Option<(&Arc<Member>, usize)> = None;
            let candidates: Box<dyn Iterator<Item = &Arc<Member>>> = match target {
                Some(index) => Box::new(members.get(index).into_iter()),
                None => Box::new((0..members.len()).map(|i| &members[(start + i) % members.len()])),
            };
            for member in candidates {
                // A targeted request may use a draining member: it is
                // still connected and the request belongs there.
                let routable = match target {
                    Some(_) => member.status() == Status::Subscribed,
                    None => member.is_routable(),
                };
                if !routable {
                    continue;
                }
                usable = true;
                let load = member.in_flight.load(Ordering::SeqCst);
                if load < max && best.is_none_or(|(_, least)| load < least) {
                    best = Some((member, load));
                }
            }
            let Some((member, _)) = best else {
                return Err(if usable {
                    PoolError::Overloaded
                } else {
                    PoolError::Unavailable
                });
            };
            let taken = member
                .in_flight
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok();
            if taken {
                self.inner.ctx.metrics.in_flight.inc();
                return Ok(Slot {
                    member: member.clone(),
                    ctx: self.inner.ctx.clone(),
                    correlation: None,
                });
            }
        }
        Err(PoolError::Overloaded)
    }

    /// The request's MQTT properties, in the SDK's order. `traced`: the
    /// request's own span's context, which goes out instead of the
    /// current one.
    fn properties(
        &self,
        member: &Member,
        request: &Request,
        options: &RequestOptions,
        timestamp: &Hlc,
        correlation: CorrelationId,
        traced: Option<&trace::TraceContext>,
    ) -> PublishProperties {
        let mut user_properties = Vec::with_capacity(9);
        if let Some(token) = &options.fencing_token {
            user_properties.push((property::FENCING_TOKEN.to_owned(), token.encode()));
        }
        // The SDK only offers persistence on SET.
        if options.persist && matches!(request, Request::Set { .. }) {
            user_properties.push((property::PERSISTENCE.to_owned(), "true".to_owned()));
        }
        user_properties.extend([
            (property::SOURCE_ID.to_owned(), member.client_id.clone()),
            (property::TIMESTAMP.to_owned(), timestamp.encode()),
            (
                property::PROTOCOL_VERSION.to_owned(),
                PROTOCOL_VERSION.to_owned(),
            ),
            (property::PARTITION.to_owned(), member.client_id.clone()),
            (property::HIGH_PRIORITY.to_owned(), String::new()),
        ]);
        // The HTTP request's trace context, if it has one.
        let mut propagate = |context: &trace::TraceContext| {
            user_properties.push((trace::TRACEPARENT.to_owned(), context.traceparent()));
            if let Some(state) = context.tracestate() {
                user_properties.push((trace::TRACESTATE.to_owned(), state.to_owned()));
            }
        };
        match traced {
            Some(context) => propagate(context),
            None => {
                trace::with_current(propagate);
            }
        }
        PublishProperties {
            // The SDK leaves the indicator out for bytes (= 0, unspecified).
            payload_format_indicator: None,
            message_expiry_interval: Some(message_expiry(self.inner.ctx.request_timeout)),
            topic_alias: None,
            response_topic: Some(member.response_topic.clone()),
            correlation_data: Some(Bytes::copy_from_slice(&correlation)),
            user_properties,
            subscription_identifiers: Vec::new(),
            content_type: Some(CONTENT_TYPE.to_owned()),
        }
    }

    fn interpret(
        &self,
        request: &Request,
        message: ReplyMessage,
    ) -> Result<StoreResponse, PoolError> {
        let mut status = None;
        let mut status_message = None;
        let mut timestamp = None;
        for (name, value) in &message.user_properties {
            match name.as_str() {
                property::STATUS => status = Some(value.as_str()),
                property::STATUS_MESSAGE => status_message = Some(value.as_str()),
                property::TIMESTAMP => timestamp = Some(value.as_str()),
                _ => {}
            }
        }
        if let Some(code) = status
            && code != STATUS_OK
        {
            let message = format!(
                "state store status {code}: {}",
                status_message.unwrap_or("no status message")
            );
            return Ok(StoreResponse {
                reply: Reply::Error(StoreError::Unknown(message)),
                version: None,
            });
        }
        let version = timestamp
            .map(Hlc::parse)
            .transpose()
            .map_err(PoolError::BadVersion)?;
        let reply = Reply::decode_for(request, &message.payload)?;
        if let Some(version) = &version
            && let Err(error) = self.inner.clock.observe(version)
        {
            tracing::warn!(%version, %error, "reply version not merged into the clock");
        }
        Ok(StoreResponse { reply, version })
    }

    /// Records a request in the metrics; returns its outcome and error
    /// kind (for its span).
    fn record<T: Labelled>(
        &self,
        request: &Request,
        result: &Result<T, PoolError>,
        elapsed: Duration,
    ) -> (&'static str, Option<&'static str>) {
        let metrics = &self.inner.ctx.metrics;
        let (outcome, error_kind) = match result {
            Ok(read) => (read.outcome(), read.store_error()),
            Err(error) => (error.kind(), Some(error.kind())),
        };
        if let Some(kind) = error_kind {
            metrics.store_errors.with_label_values(&[kind]).inc();
        }
        metrics
            .store_latency
            .with_label_values(&[request.verb(), outcome])
            .observe(elapsed.as_secs_f64());
        (outcome, error_kind)
    }
}

/// What a reply meant, for the metrics: the `outcome` label of
/// `store_request_duration_seconds` and the `kind` of `store_errors_total`.
/// The store client's decoded outcomes implement it, so the labels follow
/// the one reading of replies.
pub trait Labelled {
    /// `ok`, `not_found`, `not_applied`, `error`, ...
    fn outcome(&self) -> &'static str;
    /// The store error's kind, when the store refused the request.
    fn store_error(&self) -> Option<&'static str>;
}

/// A raw reply (tests and tools that speak the protocol themselves): only
/// shapes that mean the same for every request are named.
impl Labelled for StoreResponse {
    fn outcome(&self) -> &'static str {
        match &self.reply {
            Reply::NotFound => "not_found",
            Reply::Error(_) => "error",
            _ => "ok",
        }
    }

    fn store_error(&self) -> Option<&'static str> {
        match &self.reply {
            Reply::Error(error) => Some(error.kind()),
            _ => None,
        }
    }
}

/// What a request the broker refused in its PUBACK becomes: the broker
/// never delivered it, so no store saw it.
///
/// - no matching subscribers: nothing serves the request topic (the store,
///   or in development the emulator, is not running) → `Unavailable`;
/// - not authorized (the broker's authorization policy) → the store's
///   `not authorized` error;
/// - quota exceeded → the store's `the quota has been exceeded` error;
/// - anything else → an unknown store error naming the reason.
fn refusal(reason: PubAckReason) -> Result<StoreResponse, PoolError> {
    let error = match reason {
        PubAckReason::NoMatchingSubscribers => return Err(PoolError::Unavailable),
        PubAckReason::NotAuthorized => StoreError::NotAuthorized,
        PubAckReason::QuotaExceeded => StoreError::QuotaExceeded,
        other => StoreError::Unknown(format!("the broker refused the request: {other:?}")),
    };
    Ok(StoreResponse {
        reply: Reply::Error(error),
        version: None,
    })
}

/// What a pub/sub message's PUBACK means.
fn acknowledgement(reason: PubAckReason) -> Result<Published, PublishError> {
    match reason {
        PubAckReason::Success => Ok(Published::Accepted),
        PubAckReason::NoMatchingSubscribers => Ok(Published::NoSubscribers),
        PubAckReason::NotAuthorized => Err(PublishError::NotAuthorized),
        other => Err(PublishError::Refused(format!("{other:?}"))),
    }
}

/// An upper bound of a packet's bytes besides its payload: fixed header,
/// topic, packet id and properties (each with its id and lengths).
fn envelope_bound(topic: &str, properties: &PublishProperties) -> usize {
    let strings = |value: &Option<String>| value.as_ref().map_or(0, |text| text.len() + 3);
    64 + topic.len()
        + strings(&properties.response_topic)
        + strings(&properties.content_type)
        + properties
            .correlation_data
            .as_ref()
            .map_or(0, |data| data.len() + 3)
        + properties
            .user_properties
            .iter()
            .map(|(name, value)| name.len() + value.len() + 5)
            .sum::<usize>()
}

/// The message expiry the SDK sends: the timeout rounded up to whole
/// seconds, at least one.
fn message_expiry(timeout: Duration) -> u32 {
    let seconds = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
    u32::try_from(seconds.max(1)).unwrap_or(u32::MAX)
}

/// Reads the SAT file every `interval`; when the token changed, reconnects
/// the members one at a time (rumqttc cannot re-authenticate in place).
async fn watch_sat(
    path: PathBuf,
    interval: Duration,
    members: Vec<Arc<Member>>,
    ctx: Arc<MemberContext>,
) {
    let mut shutdown = ctx.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|down| *down) => return,
            () = tokio::time::sleep(interval) => {}
        }
        let token = match auth::read_sat(&path) {
            Ok(token) => token,
            Err(error) => {
                tracing::warn!(%error, "cannot read the SAT file; keeping the current connections");
                continue;
            }
        };
        roll_out(&token, &members, &ctx, &mut shutdown).await;
    }
}

/// Reconnects each subscribed member whose connection used another token,
/// one at a time: a member drains its requests, reconnects with the new
/// token and must be subscribed again before the next one goes. A member
/// is only taken down while another one serves (unless it is alone). Gives
/// up until the next check if a member does not come back in time.
async fn roll_out(
    token: &Bytes,
    members: &[Arc<Member>],
    ctx: &MemberContext,
    shutdown: &mut watch::Receiver<bool>,
) {
    let deadline_per_member = ctx.request_timeout + CONNECT_TIMEOUT * 2;
    for member in members {
        let old = member.sat_token();
        if member.status() != Status::Subscribed || old.as_ref() == Some(token) {
            continue;
        }
        let others_serve = members
            .iter()
            .any(|other| other.index != member.index && other.is_routable());
        if members.len() > 1 && !others_serve {
            tracing::info!(
                member = member.index,
                "SAT token changed; postponing the reconnect while no other member serves"
            );
            return;
        }
        tracing::info!(
            member = member.index,
            "SAT token changed; reconnecting the member"
        );
        member.request_reconnect();
        let deadline = Instant::now() + deadline_per_member;
        loop {
            if *shutdown.borrow() {
                return;
            }
            if member.status() == Status::Subscribed && member.sat_token() != old {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    member = member.index,
                    "member not back with the new SAT token in time; the rollout resumes at the next check"
                );
                return;
            }
            tokio::time::sleep(ROLLOUT_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mqtt::BrokerSettings;

    #[test]
    fn the_envelope_bound_is_never_below_the_exact_size() {
        let properties = PublishProperties {
            message_expiry_interval: Some(10),
            response_topic: Some(crate::protocol::response_topic("a-rather-long-client-id-0")),
            correlation_data: Some(Bytes::from_static(&[9; 16])),
            content_type: Some(CONTENT_TYPE.into()),
            user_properties: vec![
                ("__ft".into(), "001700000000000:00001:holder".into()),
                ("aio-persistence".into(), "true".into()),
                ("__srcId".into(), "a-rather-long-client-id-0".into()),
                (
                    "__ts".into(),
                    "001700000000000:00001:a-rather-long-client-id".into(),
                ),
                ("__protVer".into(), "1.0".into()),
                ("$partition".into(), "a-rather-long-client-id-0".into()),
                ("$high_priority".into(), String::new()),
            ],
            ..Default::default()
        };
        for payload_len in [0, 100, 200_000] {
            let payload = Bytes::from(vec![0; payload_len]);
            let exact = Publish::new(
                REQUEST_TOPIC,
                QoS::AtLeastOnce,
                payload,
                Some(properties.clone()),
            )
            .size()
                + 2;
            assert!(payload_len + envelope_bound(REQUEST_TOPIC, &properties) >= exact);
        }
    }

    #[test]
    fn no_matching_subscribers_is_a_published_message_and_not_authorized_is_not() {
        assert_eq!(
            acknowledgement(PubAckReason::Success).unwrap(),
            Published::Accepted
        );
        assert_eq!(
            acknowledgement(PubAckReason::NoMatchingSubscribers).unwrap(),
            Published::NoSubscribers
        );
        assert!(matches!(
            acknowledgement(PubAckReason::NotAuthorized),
            Err(PublishError::NotAuthorized)
        ));
        assert!(matches!(
            acknowledgement(PubAckReason::QuotaExceeded),
            Err(PublishError::Refused(reason)) if reason == "QuotaExceeded"
        ));
    }

    #[test]
    fn message_expiry_rounds_up_to_whole_seconds() {
        assert_eq!(message_expiry(Duration::from_secs(10)), 10);
        assert_eq!(message_expiry(Duration::from_millis(10_001)), 11);
        assert_eq!(message_expiry(Duration::from_millis(200)), 1);
        assert_eq!(message_expiry(Duration::from_secs(u64::MAX / 2)), u32::MAX);
    }

    #[test]
    fn start_outside_a_runtime_is_an_error_not_a_panic() {
        let settings = PoolSettings::new(BrokerSettings::new("localhost", 1883), "gw");
        assert!(matches!(
            Pool::start(settings, Metrics::new()),
            Err(PoolStartError::NoRuntime)
        ));
    }
}
