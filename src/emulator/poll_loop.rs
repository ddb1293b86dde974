//! The MQTT side of the emulator: the connection's options and the poll
//! loop, which (re)subscribes after every CONNACK and forwards requests to
//! the worker without ever awaiting the client (rumqttc can freeze
//! otherwise).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use tokio::sync::{mpsc, watch};

use super::config::{EmulatorConfig, RECEIVE_MAXIMUM};
use super::request::{rejection_message, status};
use crate::mqtt::{Backoff, base_options};
use crate::protocol::{REQUEST_TOPIC, is_forbidden_response_topic};

/// Keep-alive of the emulator's connection.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The connection's state, as the poll loop reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Status {
    Connecting { last_error: String },
    Serving,
    Refused(String),
}

/// The connection's options: manual acks (a request is acked once handled)
/// and a receive maximum that bounds the requests held in memory.
pub(super) fn options(config: &EmulatorConfig) -> MqttOptions {
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
    options
}

/// Drives the MQTT connection: (re)subscribes after every CONNACK and
/// forwards requests to the worker. It never awaits the client.
pub(super) async fn run(
    mut eventloop: EventLoop,
    client: AsyncClient,
    requests: mpsc::Sender<Publish>,
    status: watch::Sender<Status>,
    broker_max_packet: Arc<AtomicU32>,
) {
    let mut backoff = Backoff::default();
    // Since when the connection has served requests (subscribed).
    let mut served_since = None;
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
                    served_since = Some(tokio::time::Instant::now());
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
                backoff.connection_ended(served_since.take());
                let retry_in = backoff.next_delay();
                tracing::warn!(%error, ?retry_in, "broker connection failed");
                status.send_replace(Status::Connecting {
                    last_error: error.to_string(),
                });
                if requests.is_closed() {
                    return;
                }
                tokio::time::sleep(retry_in).await;
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
