//! A plain MQTT5 subscriber (rumqttc) on a real broker: what any MQTT
//! client of the topic sees of the gateway's pub/sub messages.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event};
use statestore_gateway::mqtt::base_options;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// A subscriber to one topic filter; stops when dropped.
pub struct TopicSubscriber {
    messages: mpsc::UnboundedReceiver<Publish>,
    task: JoinHandle<()>,
}

impl TopicSubscriber {
    /// Connects to the broker at `addr`, subscribes to `filter` (QoS 1)
    /// and returns once the broker acknowledged the subscription.
    pub async fn start(addr: SocketAddr, filter: &str) -> Self {
        let id = format!("subscriber-{:08x}", rand::random::<u32>());
        let mut options = base_options(
            id,
            addr.ip().to_string(),
            addr.port(),
            Duration::from_secs(30),
        );
        options.set_max_packet_size(Some(16 << 20));
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        let (messages_tx, messages) = mpsc::unbounded_channel();
        let (subscribed_tx, subscribed) = oneshot::channel();
        let filter = filter.to_owned();
        let task = tokio::spawn(async move {
            let mut subscribed_tx = Some(subscribed_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        client
                            .try_subscribe(filter.clone(), QoS::AtLeastOnce)
                            .unwrap();
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(tx) = subscribed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        let _ = messages_tx.send(publish);
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), subscribed)
            .await
            .expect("subscribed within 10 s")
            .unwrap();
        Self { messages, task }
    }

    /// The next message, within `within`.
    pub async fn next(&mut self, within: Duration) -> Publish {
        tokio::time::timeout(within, self.messages.recv())
            .await
            .expect("a message in time")
            .unwrap()
    }

    /// A message already received, if any.
    pub fn try_next(&mut self) -> Option<Publish> {
        self.messages.try_recv().ok()
    }
}

impl Drop for TopicSubscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}
