//! The subscriber: the gateway's MQTT5 connection for pub/sub delivery,
//! apart from the pool (whose members start clean and keep nothing).
//!
//! - A persistent session: clean start false, a bounded session expiry and
//!   a stable client id of its own (`<client id>-sub`), so a restarted
//!   gateway resumes it, and the events published while it was down (and
//!   those it had not acknowledged) arrive then.
//! - Manual acknowledgements: a message is PUBACKed only when its
//!   [`Received::ack`] is called, once its outcome is final: at least once.
//! - Receive maximum as the in-flight limit: the broker sends no more
//!   unacknowledged messages than that, so a slow app slows its
//!   subscription and the gateway holds a bounded number of messages.
//! - Shared subscriptions are the caller's filters (`$share/<group>/...`).
//! - Reconnects with the pool's backoff; subscribes after every CONNACK
//!   without a session, and after the first one of the process (the
//!   filters may have changed since the session was made).
//! - [`Subscriber::publish`] sends a QoS 1 message on the same connection
//!   and resolves once the broker acknowledged it (dead letters).
//!
//! As in the pool, every attempt gets a fresh client and event loop, and
//! the poll loop never awaits the client (rumqttc #1025).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, PubAckReason, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::auth;
use super::backoff::Backoff;
use super::connection::{disconnect, wait_or_shutdown};
use super::options::REQUEST_CHANNEL_CAPACITY;
use super::settings::BrokerSettings;

/// How the subscriber connects and what it subscribes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberSettings {
    /// The broker (the pool's).
    pub broker: BrokerSettings,
    /// Its own client id, stable across restarts (`<client id>-sub`).
    pub client_id: String,
    /// How long the broker keeps the session while the gateway is away.
    pub session_expiry: Duration,
    /// Unacknowledged messages the broker may send at once.
    pub receive_maximum: u16,
    /// The topic filters, QoS 1 (`$share/<app id>/<topic>`).
    pub filters: Vec<String>,
}

/// Why a publish of the subscriber was not acknowledged.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SubscriberError {
    /// Not connected now, or the connection was lost before the PUBACK.
    #[error("the subscriber's connection to the broker is down")]
    ConnectionLost,
    /// The broker refused the message in its PUBACK.
    #[error("the broker refused the message: {0:?}")]
    Refused(PubAckReason),
    /// The subscriber stopped.
    #[error("the subscriber stopped")]
    Stopped,
}

/// A message as it arrived, to be acknowledged once its outcome is final.
#[derive(Debug)]
pub struct Received {
    /// The topic it was published to.
    pub topic: String,
    /// Its payload.
    pub payload: Bytes,
    /// Its MQTT5 properties (content type, user properties, ...).
    pub properties: PublishProperties,
    /// Whether the broker sent it before (redelivered after a reconnect).
    pub redelivered: bool,
    ack: Acker,
}

/// What acknowledges one message: the client of the connection it came on.
#[derive(Debug)]
struct Acker {
    client: AsyncClient,
    publish: Publish,
    /// Set once the connection it came on is gone.
    lost: Arc<AtomicBool>,
}

impl Received {
    /// Whether the connection it came on is gone: the broker sends it
    /// again on the resumed session, so whoever still works on this copy
    /// can stop (an ack would do nothing) instead of running beside the
    /// new one.
    pub fn is_stale(&self) -> bool {
        self.ack.lost.load(Ordering::Acquire)
    }

    /// Acknowledges the message (PUBACK). On a connection since lost this
    /// does nothing: the broker sends the message again on the resumed
    /// session.
    pub fn ack(self) {
        if self.ack.client.try_ack(&self.ack.publish).is_err() {
            tracing::debug!(topic = %self.topic, "ack not sent: the connection it came on is gone");
        }
    }
}

type PublishReply = oneshot::Sender<Result<(), SubscriberError>>;

/// The current connection, shared with publishers.
#[derive(Debug, Default)]
struct Connection {
    client: Option<AsyncClient>,
    /// Publishes handed to rumqttc, in channel order, not yet seen going out.
    queued: VecDeque<PublishReply>,
    /// Publishes gone out, by packet id, awaiting their PUBACK.
    sent: HashMap<u16, PublishReply>,
}

impl Connection {
    fn lost(&mut self) {
        self.client = None;
        for reply in self
            .queued
            .drain(..)
            .chain(self.sent.drain().map(|(_, reply)| reply))
        {
            let _ = reply.send(Err(SubscriberError::ConnectionLost));
        }
    }
}

#[derive(Debug)]
struct Shared {
    connection: Mutex<Connection>,
    /// Whether the broker granted every filter (once true, the session
    /// keeps them).
    subscribed: watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The running subscriber.
#[derive(Debug)]
pub struct Subscriber {
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Subscriber {
    /// Starts connecting in the background; messages arrive on the
    /// receiver (at most `receive_maximum` unacknowledged per connection).
    pub fn start(settings: SubscriberSettings) -> (Self, mpsc::UnboundedReceiver<Received>) {
        let shared = Arc::new(Shared {
            connection: Mutex::new(Connection::default()),
            subscribed: watch::channel(false).0,
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (messages, received) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(settings, shared.clone(), messages, shutdown_rx));
        (
            Self {
                shared,
                shutdown,
                task,
            },
            received,
        )
    }

    /// Whether the broker granted every filter: false until its SUBACK.
    pub fn subscribed(&self) -> watch::Receiver<bool> {
        self.shared.subscribed.subscribe()
    }

    /// Publishes `payload` to `topic` at QoS 1; resolves once the broker
    /// acknowledged it.
    pub async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        properties: PublishProperties,
    ) -> Result<(), SubscriberError> {
        let (reply, acked) = oneshot::channel();
        {
            let mut connection = self.shared.lock();
            let client = connection
                .client
                .as_ref()
                .ok_or(SubscriberError::ConnectionLost)?;
            // Under the lock, so `queued` is in channel order.
            client
                .try_publish_with_properties(topic, QoS::AtLeastOnce, false, payload, properties)
                .map_err(|_| SubscriberError::ConnectionLost)?;
            connection.queued.push_back(reply);
        }
        acked.await.unwrap_or(Err(SubscriberError::Stopped))
    }

    /// Disconnects cleanly (the session stays for the next start).
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Connects, polls and reconnects until shutdown.
async fn run(
    settings: SubscriberSettings,
    shared: Arc<Shared>,
    messages: mpsc::UnboundedSender<Received>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::default();
    let mut subscribed_once = false;
    let filters: Vec<Filter> = settings
        .filters
        .iter()
        .map(|filter| Filter::new(filter.clone(), QoS::AtLeastOnce))
        .collect();
    loop {
        if *shutdown.borrow() {
            break;
        }
        let mut options = match auth::connect_options(&settings.broker, &settings.client_id) {
            Ok(built) => built.options,
            Err(error) => {
                tracing::error!(%error, "subscriber: cannot build the connection settings; retrying");
                if wait_or_shutdown(backoff.next_delay(), &mut shutdown).await {
                    break;
                }
                continue;
            }
        };
        options
            .set_clean_start(false)
            .set_session_expiry_interval(Some(
                u32::try_from(settings.session_expiry.as_secs()).unwrap_or(u32::MAX),
            ))
            .set_receive_maximum(Some(settings.receive_maximum))
            .set_manual_acks(true);
        let (client, mut eventloop) = AsyncClient::new(options, REQUEST_CHANNEL_CAPACITY);
        let lost = Arc::new(AtomicBool::new(false));
        let mut served_since = None;
        let ending = loop {
            let event = tokio::select! {
                biased;
                _ = shutdown.wait_for(|down| *down) => break None,
                event = eventloop.poll() => event,
            };
            match event {
                Err(error) => break Some(error.to_string()),
                Ok(Event::Incoming(Packet::ConnAck(connack))) => {
                    served_since = Some(tokio::time::Instant::now());
                    let resumed = connack.session_present;
                    if (!resumed || !subscribed_once)
                        && !filters.is_empty()
                        && let Err(error) = client.try_subscribe_many(filters.clone())
                    {
                        break Some(format!("cannot queue SUBSCRIBE: {error}"));
                    }
                    shared.lock().client = Some(client.clone());
                    tracing::info!(client_id = %settings.client_id, resumed, "subscriber connected");
                }
                Ok(Event::Incoming(Packet::SubAck(suback))) => {
                    subscribed_once = true;
                    let mut granted = true;
                    for (filter, code) in settings.filters.iter().zip(&suback.return_codes) {
                        if !matches!(
                            code,
                            rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                        ) {
                            granted = false;
                            tracing::error!(filter, ?code, "the broker refused a subscription");
                        }
                    }
                    shared.subscribed.send_replace(granted);
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    let Ok(topic) = std::str::from_utf8(&publish.topic) else {
                        tracing::debug!("message with a non-UTF-8 topic acknowledged and dropped");
                        let _ = client.try_ack(&publish);
                        continue;
                    };
                    tracing::debug!(
                        topic,
                        pkid = publish.pkid,
                        redelivered = publish.dup,
                        "message received"
                    );
                    let received = Received {
                        topic: topic.to_owned(),
                        payload: publish.payload.clone(),
                        properties: publish.properties.clone().unwrap_or_default(),
                        redelivered: publish.dup,
                        ack: Acker {
                            client: client.clone(),
                            publish,
                            lost: lost.clone(),
                        },
                    };
                    if messages.send(received).is_err() {
                        // Nobody delivers any more: leave it unacknowledged.
                        break None;
                    }
                }
                Ok(Event::Outgoing(Outgoing::Publish(packet_id))) => {
                    let mut connection = shared.lock();
                    if let Some(reply) = connection.queued.pop_front() {
                        connection.sent.insert(packet_id, reply);
                    }
                }
                Ok(Event::Incoming(Packet::PubAck(ack))) => {
                    if let Some(reply) = shared.lock().sent.remove(&ack.pkid) {
                        let outcome = match ack.reason {
                            PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
                            other => Err(SubscriberError::Refused(other)),
                        };
                        let _ = reply.send(outcome);
                    }
                }
                Ok(Event::Incoming(Packet::Disconnect(disconnect))) => {
                    break Some(format!(
                        "the broker disconnected: {:?}",
                        disconnect.reason_code
                    ));
                }
                Ok(_) => {}
            }
        };
        shared.lock().lost();
        lost.store(true, Ordering::Release);
        backoff.connection_ended(served_since);
        match ending {
            None => {
                if served_since.is_some() {
                    disconnect(&client, &mut eventloop).await;
                }
                break;
            }
            Some(reason) => {
                tracing::warn!(client_id = %settings.client_id, %reason, "subscriber: broker connection lost");
                drop(eventloop);
                if wait_or_shutdown(backoff.next_delay(), &mut shutdown).await {
                    break;
                }
            }
        }
    }
    shared.lock().lost();
}
