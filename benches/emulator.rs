//! How fast the emulator answers: a real mosquitto (`set_tcp_nodelay true`)
//! on a free port, the emulator in-process, and one rumqttc client sending
//! requests with the SDKs' envelope.
//!
//! `cargo bench --bench emulator` measures sequential GET and SET round trips
//! (p50/p99) and pipelined throughput with 64 requests in flight, in memory
//! and with persisted SETs (fsync per batch). It first measures a bare echo
//! responder (rumqttc answering `+OK` at once) on the same broker and client:
//! the floor of this topology on this machine, so that the emulator's own
//! cost reads as the difference. Then the store alone, in process (SET and
//! GET of 100,000 keys, no MQTT: what the store's ordered map costs), and
//! SCAN through the broker over a store of 100,000 keys: listing them all
//! with `*`, and a selective pattern that lists 1 in 100 (every key is
//! looked at; pages are bounded by keys looked at, so most come back empty).
//! Under `cargo test` it does a tiny run that only checks the replies.

#![allow(clippy::unwrap_used, clippy::print_stdout)] // a benchmark program

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event};
use statestore_gateway::emulator::{Emulator, EmulatorConfig, Envelope, Keyspace, Quota};
use statestore_gateway::mqtt::base_options;
use statestore_gateway::protocol::resp::encode_array;
use statestore_gateway::protocol::{
    CONTENT_TYPE, HybridClock, KeyPage, PROTOCOL_VERSION, REQUEST_TOPIC, Request, ScanReply,
    property, response_topic,
};
use tokio::sync::mpsc;

const IN_FLIGHT: usize = 64;
const CLIENT_ID: &str = "bench-client";

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(full));
}

async fn run(full: bool) {
    let (sequential, pipelined) = if full { (10_000, 100_000) } else { (20, 200) };
    let broker = Broker::start();
    let mut client = BenchClient::connect(broker.port).await;
    let set = encode_array(&[b"SET", b"bench-key", &[b'v'; 64]]);
    let get = encode_array(&[b"GET", b"bench-key"]);

    println!("one client, mosquitto, {IN_FLIGHT} requests in flight when pipelined");
    let echo = EchoResponder::start(broker.port).await;
    client
        .sequential(&get, &[], sequential / 10 + 1, b"+OK\r\n")
        .await;
    report(
        "echo sequential (floor)",
        client.sequential(&get, &[], sequential, b"+OK\r\n").await,
    );
    report(
        "echo pipelined (floor)",
        client.pipelined(&get, &[], pipelined, b"+OK\r\n").await,
    );
    echo.stop().await;

    let emulator = Emulator::start(EmulatorConfig::new("127.0.0.1", broker.port))
        .await
        .unwrap();
    // Warm up.
    client
        .sequential(&set, &[], sequential / 10 + 1, b"+OK\r\n")
        .await;
    report(
        "GET sequential",
        client.sequential(&get, &[], sequential, b"$64\r\n").await,
    );
    report(
        "SET sequential",
        client.sequential(&set, &[], sequential, b"+OK\r\n").await,
    );
    report(
        "GET pipelined",
        client.pipelined(&get, &[], pipelined, b"$64\r\n").await,
    );
    report(
        "SET pipelined",
        client.pipelined(&set, &[], pipelined, b"+OK\r\n").await,
    );
    emulator.shutdown().await.unwrap();

    // Persisted SETs: every reply waits for its batch's fsync.
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let mut config = EmulatorConfig::new("127.0.0.1", broker.port);
    config.data_dir = Some(dir.path().to_owned());
    let emulator = Emulator::start(config).await.unwrap();
    let persist = [(property::PERSISTENCE, "true")];
    let (sequential, pipelined) = (sequential / 10 + 1, pipelined / 10 + 1);
    report(
        "SET persisted sequential",
        client
            .sequential(&set, &persist, sequential, b"+OK\r\n")
            .await,
    );
    report(
        "SET persisted pipelined",
        client
            .pipelined(&set, &persist, pipelined, b"+OK\r\n")
            .await,
    );
    emulator.shutdown().await.unwrap();

    let keys = if full { 100_000 } else { 1_000 };
    store_alone(keys);
    scan(&mut client, broker.port, keys).await;
}

/// `sensor/{i:06}`: keys in byte order by number.
fn sensor_key(i: usize) -> Vec<u8> {
    format!("sensor/{i:06}").into_bytes()
}

/// SET then GET of `keys` distinct keys on a [`Keyspace`] in process.
fn store_alone(keys: usize) {
    let now = statestore_gateway::protocol::hlc::now_ms();
    let mut store = Keyspace::new(Quota::default(), now);
    let clock = HybridClock::new(CLIENT_ID);
    let timestamp = clock.now().hlc.to_string();
    let envelope = Envelope {
        client_id: CLIENT_ID,
        timestamp: Some(&timestamp),
        ..Envelope::default()
    };
    // A fixed shuffle, so that inserts and reads are not in key order.
    let order: Vec<usize> = (0..keys).map(|i| (i * 7_919) % keys).collect();
    let requests: Vec<Request> = order
        .iter()
        .map(|&i| Request::Set {
            key: Bytes::from(sensor_key(i)),
            value: Bytes::from_static(&[b'v'; 64]),
            options: Default::default(),
        })
        .collect();
    let started = Instant::now();
    for request in requests {
        store.execute(request, &envelope, now);
    }
    let set = started.elapsed();
    assert_eq!(store.len(), keys);
    let requests: Vec<Request> = order
        .iter()
        .map(|&i| Request::Get {
            key: Bytes::from(sensor_key(i)),
        })
        .collect();
    let started = Instant::now();
    for request in requests {
        store.execute(request, &envelope, now);
    }
    let get = started.elapsed();
    println!(
        "store alone, {keys} keys: SET {:>10.0} ops/s   GET {:>10.0} ops/s",
        keys as f64 / set.as_secs_f64(),
        keys as f64 / get.as_secs_f64()
    );
}

/// Lists `keys` keys through the broker, sequentially page by page.
async fn scan(client: &mut BenchClient, port: u16, keys: usize) {
    let emulator = Emulator::start(EmulatorConfig::new("127.0.0.1", port))
        .await
        .unwrap();
    // Load through the broker, 64 in flight.
    let mut in_flight = 0;
    for i in 0..keys {
        let set = encode_array(&[b"SET", &sensor_key(i), &[b'v'; 16]]);
        client.send(&set, &[]).await;
        in_flight += 1;
        if in_flight == IN_FLIGHT {
            client.receive(b"+OK\r\n").await;
            in_flight -= 1;
        }
    }
    for _ in 0..in_flight {
        client.receive(b"+OK\r\n").await;
    }
    // Warm up, then measure.
    client.list(b"sensor/00000*").await;
    for (name, pattern, expected) in [
        ("SCAN `*`", &b"*"[..], keys),
        ("SCAN `sensor/*77`", b"sensor/*77", keys / 100),
    ] {
        let started = Instant::now();
        let (listed, pages, empty) = client.list(pattern).await;
        let elapsed = started.elapsed();
        assert_eq!(listed, expected, "{name}");
        println!(
            "{name:<26} {:>9.0} keys/s looked at   {:>9.0} keys/s listed   {pages} pages ({empty} empty), {:.2} ms/page",
            keys as f64 / elapsed.as_secs_f64(),
            listed as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64() * 1e3 / pages as f64
        );
    }
    emulator.shutdown().await.unwrap();
}

/// The least a responder can do: answer every request with `+OK` from a
/// task beside its poll loop.
struct EchoResponder {
    client: AsyncClient,
    poll: tokio::task::JoinHandle<()>,
}

impl EchoResponder {
    async fn start(port: u16) -> Self {
        let options = base_options("bench-echo", "127.0.0.1", port, Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(options, 1024);
        let (requests_tx, mut requests) = mpsc::unbounded_channel::<Publish>();
        let (subscribed_tx, mut subscribed) = mpsc::unbounded_channel();
        let poll = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        let _ = requests_tx.send(publish);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = subscribed_tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        let replier = client.clone();
        tokio::spawn(async move {
            while let Some(request) = requests.recv().await {
                let request = request.properties.unwrap_or_default();
                let properties = PublishProperties {
                    correlation_data: request.correlation_data,
                    content_type: Some(CONTENT_TYPE.to_owned()),
                    user_properties: vec![
                        (property::STATUS.to_owned(), "200".to_owned()),
                        (
                            property::PROTOCOL_VERSION.to_owned(),
                            PROTOCOL_VERSION.to_owned(),
                        ),
                    ],
                    ..PublishProperties::default()
                };
                let topic = request.response_topic.unwrap_or_default();
                let reply = b"+OK\r\n".to_vec();
                let sent = replier
                    .publish_with_properties(topic, QoS::AtLeastOnce, false, reply, properties)
                    .await;
                if sent.is_err() {
                    return;
                }
            }
        });
        client
            .subscribe(REQUEST_TOPIC, QoS::AtLeastOnce)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), subscribed.recv())
            .await
            .unwrap();
        Self { client, poll }
    }

    async fn stop(self) {
        let _ = self.client.disconnect().await;
        let _ = tokio::time::timeout(Duration::from_secs(2), self.poll).await;
    }
}

/// What one measurement produced.
struct Run {
    ops: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

fn report(name: &str, mut run: Run) {
    run.latencies.sort_unstable();
    let at = |q: f64| {
        let index = ((run.latencies.len() as f64 - 1.0) * q).round() as usize;
        run.latencies[index]
    };
    println!(
        "{name:<26} {:>9.0} ops/s   p50 {:>7.1} us   p99 {:>7.1} us   ({} ops)",
        run.ops as f64 / run.elapsed.as_secs_f64(),
        at(0.50).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        run.ops
    );
}

/// A mosquitto on a free port, killed on drop.
struct Broker {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Broker {
    fn start() -> Self {
        let binary = [
            "/usr/sbin/mosquitto",
            "/usr/bin/mosquitto",
            "/usr/local/sbin/mosquitto",
        ]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .expect("mosquitto is installed (scripts/test installs it)");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("mosquitto.conf");
        std::fs::write(
            &config,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n\
                 persistence false\nmax_inflight_messages 0\nmax_queued_messages 100000\n\
                 log_dest stderr\nlog_type error\n"
            ),
        )
        .unwrap();
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "mosquitto did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A rumqttc client that sends requests and matches replies by correlation.
struct BenchClient {
    client: AsyncClient,
    replies: mpsc::UnboundedReceiver<Publish>,
    clock: HybridClock,
    next_id: u64,
}

impl BenchClient {
    async fn connect(port: u16) -> Self {
        let options = base_options(CLIENT_ID, "127.0.0.1", port, Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(options, 1024);
        let (replies_tx, replies) = mpsc::unbounded_channel();
        let (subscribed_tx, mut subscribed) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        if replies_tx.send(publish).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = subscribed_tx.send(());
                    }
                    Ok(_) => {}
                    // Dropping the sender fails any pending receive loudly.
                    Err(_) => return,
                }
            }
        });
        client
            .subscribe(response_topic(CLIENT_ID), QoS::AtLeastOnce)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), subscribed.recv())
            .await
            .unwrap();
        Self {
            client,
            replies,
            clock: HybridClock::new(CLIENT_ID),
            next_id: 0,
        }
    }

    async fn send(&mut self, payload: &[u8], extra: &[(&str, &str)]) -> u64 {
        self.next_id += 1;
        let mut user_properties = vec![
            (property::SOURCE_ID.to_owned(), CLIENT_ID.to_owned()),
            (
                property::TIMESTAMP.to_owned(),
                self.clock.now().hlc.to_string(),
            ),
            (
                property::PROTOCOL_VERSION.to_owned(),
                PROTOCOL_VERSION.to_owned(),
            ),
        ];
        user_properties.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let mut correlation = [0u8; 16];
        correlation[..8].copy_from_slice(&self.next_id.to_le_bytes());
        let properties = PublishProperties {
            response_topic: Some(response_topic(CLIENT_ID)),
            correlation_data: Some(Bytes::copy_from_slice(&correlation)),
            content_type: Some(CONTENT_TYPE.to_owned()),
            message_expiry_interval: Some(10),
            user_properties,
            ..PublishProperties::default()
        };
        self.client
            .publish_with_properties(
                REQUEST_TOPIC,
                QoS::AtLeastOnce,
                false,
                payload.to_vec(),
                properties,
            )
            .await
            .unwrap();
        self.next_id
    }

    /// Every page of a listing: (keys listed, pages, empty pages).
    async fn list(&mut self, pattern: &[u8]) -> (usize, usize, usize) {
        let (mut listed, mut pages, mut empty) = (0, 0, 0);
        let mut token = None;
        loop {
            let request = Request::Scan {
                pattern: Bytes::copy_from_slice(pattern),
                token: token.take(),
            };
            self.send(&request.encode(), &[]).await;
            let reply = tokio::time::timeout(Duration::from_secs(10), self.replies.recv())
                .await
                .expect("a reply within 10 s")
                .expect("client alive");
            let ScanReply::Page(KeyPage { keys, token: next }) =
                ScanReply::decode(&reply.payload).unwrap()
            else {
                panic!("SCAN failed: {:?}", String::from_utf8_lossy(&reply.payload));
            };
            pages += 1;
            listed += keys.len();
            empty += usize::from(keys.is_empty());
            match next {
                Some(next) => token = Some(next),
                None => return (listed, pages, empty),
            }
        }
    }

    /// The next reply: its request id, after checking its payload.
    async fn receive(&mut self, expected_prefix: &[u8]) -> u64 {
        let reply = tokio::time::timeout(Duration::from_secs(10), self.replies.recv())
            .await
            .expect("a reply within 10 s")
            .expect("client alive");
        assert!(
            reply.payload.starts_with(expected_prefix),
            "unexpected reply {:?}",
            String::from_utf8_lossy(&reply.payload)
        );
        let correlation = reply.properties.unwrap().correlation_data.unwrap();
        u64::from_le_bytes(correlation[..8].try_into().unwrap())
    }

    async fn sequential(
        &mut self,
        payload: &[u8],
        extra: &[(&str, &str)],
        count: usize,
        expected: &[u8],
    ) -> Run {
        let mut latencies = Vec::with_capacity(count);
        let started = Instant::now();
        for _ in 0..count {
            let sent_at = Instant::now();
            let id = self.send(payload, extra).await;
            assert_eq!(self.receive(expected).await, id);
            latencies.push(sent_at.elapsed());
        }
        Run {
            ops: count,
            elapsed: started.elapsed(),
            latencies,
        }
    }

    async fn pipelined(
        &mut self,
        payload: &[u8],
        extra: &[(&str, &str)],
        count: usize,
        expected: &[u8],
    ) -> Run {
        let mut sent_at = HashMap::with_capacity(IN_FLIGHT);
        let mut latencies = Vec::with_capacity(count);
        let started = Instant::now();
        let mut sent = 0;
        while latencies.len() < count {
            while sent < count && sent_at.len() < IN_FLIGHT {
                let now = Instant::now();
                let id = self.send(payload, extra).await;
                sent_at.insert(id, now);
                sent += 1;
            }
            let id = self.receive(expected).await;
            let at = sent_at.remove(&id).expect("a reply to a request in flight");
            latencies.push(at.elapsed());
        }
        Run {
            ops: count,
            elapsed: started.elapsed(),
            latencies,
        }
    }
}
