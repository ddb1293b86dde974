//! The state store emulator for tests (in-process or the real binary), and
//! a raw MQTT5 client that speaks the protocol byte by byte.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event};
use statestore_gateway::emulator::{Emulator, EmulatorConfig};
use statestore_gateway::mqtt::base_options;
use statestore_gateway::protocol::{
    CONTENT_TYPE, HybridClock, PROTOCOL_VERSION, REQUEST_TOPIC, notify_filter, property,
    response_topic,
};
use tokio::sync::mpsc;

use super::{Mosquitto, init_logging};

/// How long a test waits for any one reply or notification.
pub const WAIT: Duration = Duration::from_secs(5);

/// An in-process emulator on `broker`, with `configure` applied to the
/// default config.
pub async fn start_emulator_with(
    broker: &Mosquitto,
    configure: impl FnOnce(&mut EmulatorConfig),
) -> Emulator {
    init_logging();
    let mut config = EmulatorConfig::new("127.0.0.1", broker.port());
    configure(&mut config);
    Emulator::start(config).await.expect("the emulator starts")
}

/// An in-process emulator with the default config.
pub async fn start_emulator(broker: &Mosquitto) -> Emulator {
    start_emulator_with(broker, |_| {}).await
}

/// The `statestore-gateway emulator` binary; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct EmulatorProcess {
    child: Child,
}

impl EmulatorProcess {
    /// Starts the binary against `broker` with extra arguments, and waits
    /// until it answers a GET.
    pub async fn start(broker: &Mosquitto, extra_args: &[&str]) -> Self {
        Self::start_through(broker.port(), broker, extra_args).await
    }

    /// Like [`EmulatorProcess::start`], connecting to `port` (a proxy in
    /// front of `broker`) instead of the broker itself.
    pub async fn start_through(port: u16, broker: &Mosquitto, extra_args: &[&str]) -> Self {
        let stderr = if std::env::var_os("TEST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let child = Command::new(env!("CARGO_BIN_EXE_statestore-gateway"))
            .arg("emulator")
            .arg("--broker")
            .arg(format!("127.0.0.1:{port}"))
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the emulator binary");
        let process = Self { child };
        let mut probe = RawClient::connect(broker, "readiness-probe").await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let correlation = probe.send(&get_payload(b"probe"), &[]).await;
            if probe
                .reply_to(&correlation, Duration::from_millis(500))
                .await
                .is_some()
            {
                return process;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the emulator binary did not answer within 20 s"
            );
        }
    }

    /// Kills it at once (SIGKILL): no clean shutdown, no final flush.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks it to stop (SIGTERM) and waits for its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        super::terminate_and_wait(&mut self.child, Duration::from_secs(10))
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes the store (SIGSTOP) and returns once it is stopped: its
    /// connection stays open, it answers nothing until
    /// [`EmulatorProcess::resume`].
    pub fn pause(&self) {
        super::freeze(self.child.id());
    }

    /// Thaws a paused store (SIGCONT): it answers what arrived meanwhile.
    pub fn resume(&self) {
        super::thaw(self.child.id());
    }
}

/// A test that ends (or panics) must not leave the binary running.
impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `*2 GET key`.
pub fn get_payload(key: &[u8]) -> Vec<u8> {
    statestore_gateway::protocol::Request::Get {
        key: Bytes::copy_from_slice(key),
    }
    .encode()
}

/// A raw MQTT5 client subscribed to its SDK-style response topic and its
/// notification topics; messages land in two queues.
#[derive(Debug)]
pub struct RawClient {
    /// Its MQTT client id (also sent as `__srcId`).
    pub id: String,
    /// The rumqttc client, to publish anything at all.
    pub client: AsyncClient,
    clock: HybridClock,
    replies: mpsc::UnboundedReceiver<Publish>,
    notifications: mpsc::UnboundedReceiver<Publish>,
    poll: tokio::task::JoinHandle<()>,
}

impl Drop for RawClient {
    fn drop(&mut self) {
        self.poll.abort();
    }
}

impl RawClient {
    /// Connects to `broker`, subscribes, and waits for both SUBACKs.
    pub async fn connect(broker: &Mosquitto, id: &str) -> Self {
        Self::connect_port(broker.port(), id).await
    }

    /// Like [`RawClient::connect`], by port.
    pub async fn connect_port(port: u16, id: &str) -> Self {
        let options = base_options(id, "127.0.0.1", port, Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(options, 1024);
        let (replies_tx, replies) = mpsc::unbounded_channel();
        let (notifications_tx, notifications) = mpsc::unbounded_channel();
        let (subacks_tx, mut subacks) = mpsc::unbounded_channel();
        let own_responses = response_topic(id);
        let poll = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        let to = if publish.topic == own_responses.as_bytes() {
                            &replies_tx
                        } else {
                            &notifications_tx
                        };
                        let _ = to.send(publish);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = subacks_tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        client
            .subscribe(response_topic(id), QoS::AtLeastOnce)
            .await
            .unwrap();
        client
            .subscribe(notify_filter(id), QoS::AtLeastOnce)
            .await
            .unwrap();
        for _ in 0..2 {
            tokio::time::timeout(WAIT, subacks.recv())
                .await
                .expect("SUBACK in time")
                .expect("poll loop alive");
        }
        Self {
            id: id.to_owned(),
            client,
            clock: HybridClock::new(id),
            replies,
            notifications,
            poll,
        }
    }

    /// The client's clock now, for `__ts`.
    pub fn now(&self) -> String {
        self.clock.now().hlc.to_string()
    }

    /// The envelope the SDKs send: response topic, fresh correlation data,
    /// content type, `__srcId`, `__ts`, `__protVer`, then `extra`.
    pub fn envelope(&self, extra: &[(&str, &str)]) -> PublishProperties {
        let correlation: [u8; 16] = rand::random();
        let mut user_properties = vec![
            (property::SOURCE_ID.to_owned(), self.id.clone()),
            (property::TIMESTAMP.to_owned(), self.now()),
            (
                property::PROTOCOL_VERSION.to_owned(),
                PROTOCOL_VERSION.to_owned(),
            ),
        ];
        user_properties.extend(
            extra
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
        );
        PublishProperties {
            response_topic: Some(response_topic(&self.id)),
            correlation_data: Some(Bytes::copy_from_slice(&correlation)),
            content_type: Some(CONTENT_TYPE.to_owned()),
            message_expiry_interval: Some(10),
            user_properties,
            ..PublishProperties::default()
        }
    }

    /// Publishes `payload` with `properties` to the request topic.
    pub async fn publish(&self, payload: &[u8], properties: PublishProperties, qos: QoS) {
        self.client
            .publish_with_properties(REQUEST_TOPIC, qos, false, payload.to_vec(), properties)
            .await
            .unwrap();
    }

    /// Sends a well-formed request; returns its correlation data.
    pub async fn send(&self, payload: &[u8], extra: &[(&str, &str)]) -> Bytes {
        let properties = self.envelope(extra);
        let correlation = properties.correlation_data.clone().unwrap();
        self.publish(payload, properties, QoS::AtLeastOnce).await;
        correlation
    }

    /// The reply carrying `correlation`, skipping others.
    pub async fn reply_to(&mut self, correlation: &Bytes, within: Duration) -> Option<Publish> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let reply = tokio::time::timeout_at(deadline, self.replies.recv())
                .await
                .ok()??;
            let matches = reply
                .properties
                .as_ref()
                .and_then(|p| p.correlation_data.as_ref())
                == Some(correlation);
            if matches {
                return Some(reply);
            }
        }
    }

    /// Sends a well-formed request and returns its reply.
    pub async fn request(&mut self, payload: &[u8], extra: &[(&str, &str)]) -> Publish {
        let correlation = self.send(payload, extra).await;
        self.reply_to(&correlation, WAIT).await.unwrap_or_else(|| {
            panic!(
                "no reply to {:?} within {WAIT:?}",
                String::from_utf8_lossy(payload)
            )
        })
    }

    /// The next reply, whatever its correlation data.
    pub async fn next_reply(&mut self, within: Duration) -> Option<Publish> {
        tokio::time::timeout(within, self.replies.recv())
            .await
            .ok()?
    }

    /// A notification already received, without waiting.
    pub fn received_notification(&mut self) -> Option<Publish> {
        self.notifications.try_recv().ok()
    }

    /// The next notification.
    pub async fn next_notification(&mut self, within: Duration) -> Option<Publish> {
        tokio::time::timeout(within, self.notifications.recv())
            .await
            .ok()?
    }
}

/// The value of a user property, if present (the first one).
pub fn user_property<'a>(publish: &'a Publish, name: &str) -> Option<&'a str> {
    publish
        .properties
        .as_ref()?
        .user_properties
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}
