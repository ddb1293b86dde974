//! A state store whose replies a test scripts: it serves the real wire
//! protocol on the real broker, for replies the emulator never sends (clock
//! skew, `syntax error`, unparsable payloads, late replies).

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event};
use statestore_gateway::mqtt::base_options;
use statestore_gateway::protocol::{Hlc, REQUEST_TOPIC, Request, hlc, property};
use tokio::task::JoinHandle;

/// What to do with one request.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// Reply with this payload (and `__ts` = now, as a version).
    Reply(Vec<u8>),
    /// Reply with this payload after a delay.
    ReplyAfter(Duration, Vec<u8>),
    /// Never reply.
    Silent,
}

/// Decides the reply to a decoded request and its `__ft` (if any).
pub type Script = Arc<dyn Fn(&Request, Option<&str>) -> Scripted + Send + Sync>;

/// A running scripted store; stops when dropped.
#[derive(Debug)]
pub struct ScriptedStore {
    task: JoinHandle<()>,
}

impl ScriptedStore {
    /// Subscribes to the request topic and answers by `script`; returns once
    /// the subscription is acknowledged.
    pub async fn start(port: u16, script: Script) -> ScriptedStore {
        let client_id = format!("scripted-store-{:08x}", rand::random::<u32>());
        let options = base_options(client_id, "127.0.0.1", port, Duration::from_secs(30));
        let (client, mut events) = AsyncClient::new(options, 1024);
        client
            .subscribe(REQUEST_TOPIC, QoS::AtLeastOnce)
            .await
            .expect("queue subscribe");
        let subscribed = async {
            loop {
                if let Event::Incoming(Packet::SubAck(_)) =
                    events.poll().await.expect("scripted store connects")
                {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), subscribed)
            .await
            .expect("scripted store subscribed");
        let task = tokio::spawn(async move {
            loop {
                let event = match events.poll().await {
                    Ok(event) => event,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Event::Incoming(Packet::Publish(publish)) = event else {
                    continue;
                };
                let Some(properties) = publish.properties else {
                    continue;
                };
                let Some(response_topic) = properties.response_topic else {
                    continue;
                };
                let token = properties
                    .user_properties
                    .iter()
                    .find(|(name, _)| name == property::FENCING_TOKEN)
                    .map(|(_, value)| value.clone());
                let Ok(request) = Request::decode(&publish.payload) else {
                    continue;
                };
                let (delay, payload) = match script(&request, token.as_deref()) {
                    Scripted::Reply(payload) => (Duration::ZERO, payload),
                    Scripted::ReplyAfter(delay, payload) => (delay, payload),
                    Scripted::Silent => continue,
                };
                let reply = PublishProperties {
                    correlation_data: properties.correlation_data,
                    content_type: Some("application/octet-stream".into()),
                    user_properties: vec![
                        ("__stat".into(), "200".into()),
                        ("__protVer".into(), "1.0".into()),
                        (
                            property::TIMESTAMP.into(),
                            Hlc::new(hlc::now_ms(), "StateStore").to_string(),
                        ),
                    ],
                    ..PublishProperties::default()
                };
                // Publish from another task: never await the client from
                // the task that polls its event loop.
                let client = client.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = client
                        .publish_with_properties(
                            response_topic,
                            QoS::AtLeastOnce,
                            false,
                            Bytes::from(payload),
                            reply,
                        )
                        .await;
                });
            }
        });
        ScriptedStore { task }
    }
}

impl Drop for ScriptedStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}
