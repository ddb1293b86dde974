//! A test peer that answers state store requests through a real broker: a
//! rumqttc client subscribed to the request topic that replies with the
//! service's envelope (`__stat`, `__protVer`, `__ts` = the key's version).
//! It records every request it receives, for envelope assertions.
//!
//! Its default answers come from a tiny in-memory map; tests swap in a
//! handler to stay silent, fail, or send odd envelopes.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event};
use statestore_gateway::mqtt::base_options;
use statestore_gateway::protocol::{
    self, CONTENT_TYPE, HybridClock, Notification, PROTOCOL_VERSION, REQUEST_TOPIC, Reply, Request,
    property,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What to send back for one request; `None` from a handler = no reply.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The payload.
    pub reply: Reply,
    /// `__ts`; the default handler sends the key's version.
    pub version: Option<String>,
    /// `__stat`; `None` leaves it out.
    pub status: Option<String>,
    /// Extra user properties after the standard ones.
    pub extra: Vec<(String, String)>,
}

impl Answer {
    /// A 200 reply without a version.
    pub fn plain(reply: Reply) -> Self {
        Self {
            reply,
            version: None,
            status: Some("200".into()),
            extra: Vec::new(),
        }
    }
}

/// Decides the answer to a request (`None`: stay silent).
pub type Handler = Arc<dyn Fn(&Request, &Publish) -> Option<Answer> + Send + Sync>;

/// The responder.
pub struct Responder {
    client: AsyncClient,
    requests: Arc<Mutex<Vec<Publish>>>,
    handler: Arc<Mutex<Handler>>,
    delay: Arc<Mutex<Duration>>,
    subscribed: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").finish_non_exhaustive()
    }
}

impl Responder {
    /// Connects to the broker at `addr` and waits until it is subscribed.
    pub async fn start(addr: SocketAddr) -> Self {
        let id = format!("responder-{}", rand::random::<u32>());
        let options = base_options(
            id,
            addr.ip().to_string(),
            addr.port(),
            Duration::from_secs(30),
        );
        let (client, mut eventloop) = AsyncClient::new(options, 4096);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Mutex<Handler>> = Arc::new(Mutex::new(store_handler()));
        let delay = Arc::new(Mutex::new(Duration::ZERO));
        let (subscribed_tx, subscribed) = watch::channel(false);
        let task = tokio::spawn({
            let client = client.clone();
            let requests = requests.clone();
            let handler = handler.clone();
            let delay = delay.clone();
            async move {
                loop {
                    match eventloop.poll().await {
                        Ok(Event::Incoming(Packet::ConnAck(_))) => {
                            let _ = client.try_subscribe(REQUEST_TOPIC, QoS::AtLeastOnce);
                        }
                        Ok(Event::Incoming(Packet::SubAck(_))) => {
                            subscribed_tx.send_replace(true);
                        }
                        Ok(Event::Incoming(Packet::Publish(publish))) => {
                            requests.lock().unwrap().push(publish.clone());
                            let handler = handler.lock().unwrap().clone();
                            let delay = *delay.lock().unwrap();
                            answer(&client, publish, &handler, delay);
                        }
                        Ok(_) => {}
                        Err(_) => {
                            subscribed_tx.send_replace(false);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        });
        let responder = Self {
            client,
            requests,
            handler,
            delay,
            subscribed,
            task,
        };
        responder.wait_subscribed(Duration::from_secs(5)).await;
        responder
    }

    /// Waits until the responder is (again) subscribed to the request topic.
    pub async fn wait_subscribed(&self, within: Duration) {
        let mut subscribed = self.subscribed.clone();
        tokio::time::timeout(within, subscribed.wait_for(|s| *s))
            .await
            .expect("the responder subscribes in time")
            .expect("the responder runs");
    }

    /// Replaces the handler.
    pub fn set_handler(
        &self,
        handler: impl Fn(&Request, &Publish) -> Option<Answer> + Send + Sync + 'static,
    ) {
        *self.handler.lock().unwrap() = Arc::new(handler);
    }

    /// Delays every reply.
    pub fn set_delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Publish> {
        self.requests.lock().unwrap().clone()
    }

    /// Waits until at least `count` requests arrived.
    pub async fn wait_for_requests(&self, count: usize, within: Duration) -> Vec<Publish> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let requests = self.requests();
            if requests.len() >= count {
                return requests;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {count} requests arrived within {within:?}",
                requests.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Publishes a KEYNOTIFY notification for `client_id` and `key`.
    pub async fn notify(
        &self,
        client_id: &str,
        key: &[u8],
        notification: &Notification,
        version: Option<&str>,
    ) {
        let mut user_properties = vec![(
            property::PROTOCOL_VERSION.to_owned(),
            PROTOCOL_VERSION.to_owned(),
        )];
        if let Some(version) = version {
            user_properties.push((property::TIMESTAMP.to_owned(), version.to_owned()));
        }
        let properties = PublishProperties {
            content_type: Some(CONTENT_TYPE.into()),
            user_properties,
            ..Default::default()
        };
        self.client
            .publish_with_properties(
                protocol::notify_topic(client_id, key),
                QoS::AtLeastOnce,
                false,
                notification.encode(),
                properties,
            )
            .await
            .expect("publish a notification");
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(client: &AsyncClient, publish: Publish, handler: &Handler, delay: Duration) {
    let properties = publish.properties.clone().unwrap_or_default();
    let Some(response_topic) = properties.response_topic.clone() else {
        return;
    };
    let answer = match Request::decode(&publish.payload) {
        Ok(request) => handler(&request, &publish),
        Err(error) => Some(Answer::plain(Reply::Error(error))),
    };
    let Some(answer) = answer else { return };
    let mut user_properties = Vec::new();
    if let Some(status) = answer.status {
        user_properties.push((property::STATUS.to_owned(), status));
    }
    user_properties.push((
        property::PROTOCOL_VERSION.to_owned(),
        PROTOCOL_VERSION.to_owned(),
    ));
    if let Some(version) = answer.version {
        user_properties.push((property::TIMESTAMP.to_owned(), version));
    }
    user_properties.extend(answer.extra);
    let reply_properties = PublishProperties {
        correlation_data: properties.correlation_data.clone(),
        content_type: Some(CONTENT_TYPE.into()),
        user_properties,
        ..Default::default()
    };
    let client = client.clone();
    let payload = answer.reply.encode();
    // Never await the client on the polling task.
    tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let _ = client
            .publish_with_properties(
                response_topic,
                QoS::AtLeastOnce,
                false,
                payload,
                reply_properties,
            )
            .await;
    });
}

/// Answers like the store, from a map in memory (no fencing, no expiry).
pub fn store_handler() -> Handler {
    let clock = HybridClock::new("StateStore");
    let values: Mutex<HashMap<Bytes, (Bytes, String)>> = Mutex::new(HashMap::new());
    Arc::new(move |request, _publish| {
        let mut values = values.lock().unwrap();
        let version = clock.now().hlc.to_string();
        let (reply, version) = match request {
            Request::Set { key, value, .. } => {
                values.insert(key.clone(), (value.clone(), version.clone()));
                (Reply::Ok, Some(version))
            }
            Request::Get { key } => match values.get(key) {
                Some((value, version)) => (Reply::Value(value.clone()), Some(version.clone())),
                None => (Reply::NotFound, None),
            },
            Request::Del { key } => (
                Reply::Integer(i64::from(values.remove(key).is_some())),
                Some(version),
            ),
            Request::VDel { key, value } => match values.get(key) {
                Some((current, _)) if current == value => {
                    values.remove(key);
                    (Reply::Integer(1), Some(version))
                }
                Some(_) => (Reply::Integer(-1), Some(version)),
                None => (Reply::Integer(0), Some(version)),
            },
            Request::KeyNotify { .. } => (Reply::Ok, None),
            // Like a service from before SCAN.
            Request::Scan { .. } => (Reply::Error(protocol::StoreError::UnknownCommand), None),
        };
        Some(Answer {
            reply,
            version,
            status: Some("200".into()),
            extra: Vec::new(),
        })
    })
}
