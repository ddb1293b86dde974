//! Dev mode: the embedded rmqtt broker, checked with real rumqttc clients.

#![cfg(feature = "embedded-broker")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event};
use statestore_gateway::dev::{DevSettings, DevStack, EmbeddedBroker};
use statestore_gateway::protocol::Request;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use crate::support::dev::DevProcess;
use crate::support::emulator::RawClient;
use crate::support::gateway::http_client;
use crate::support::init_logging;
use crate::support::sdk::SdkClient;

/// How long any single network wait in these tests may take.
const WAIT: Duration = Duration::from_secs(10);

async fn start_broker() -> EmbeddedBroker {
    init_logging();
    EmbeddedBroker::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("embedded broker starts on a free port")
}

/// A connected MQTT5 client whose poll task forwards what arrives.
struct TestClient {
    client: AsyncClient,
    publishes: mpsc::UnboundedReceiver<Publish>,
    acks: mpsc::UnboundedReceiver<Packet>,
    poll: JoinHandle<()>,
}

impl TestClient {
    /// Connects and waits for the CONNACK. Does not reconnect: when the
    /// connection ends, the channels close.
    async fn connect(addr: SocketAddr, client_id: &str) -> TestClient {
        let options = statestore_gateway::mqtt::base_options(
            client_id,
            addr.ip().to_string(),
            addr.port(),
            Duration::from_secs(30),
        );
        let (client, mut event_loop) = AsyncClient::new(options, 1024);
        let (publishes_tx, publishes) = mpsc::unbounded_channel();
        let (acks_tx, acks) = mpsc::unbounded_channel();
        let poll = tokio::spawn(async move {
            loop {
                match event_loop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        let _ = publishes_tx.send(publish);
                    }
                    Ok(Event::Incoming(
                        packet @ (Packet::ConnAck(_) | Packet::SubAck(_) | Packet::Disconnect(_)),
                    )) => {
                        let _ = acks_tx.send(packet);
                    }
                    // Polling on would reconnect.
                    Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        let mut test_client = TestClient {
            client,
            publishes,
            acks,
            poll,
        };
        match test_client.next_ack().await {
            Packet::ConnAck(_) => {}
            other => panic!("expected CONNACK, got {other:?}"),
        }
        test_client
    }

    async fn next_ack(&mut self) -> Packet {
        tokio::time::timeout(WAIT, self.acks.recv())
            .await
            .expect("an acknowledgement in time")
            .expect("the connection is up")
    }

    async fn subscribe(&mut self, filter: &str) {
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .expect("subscribe queued");
        match self.next_ack().await {
            Packet::SubAck(_) => {}
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    async fn next_publish(&mut self) -> Publish {
        tokio::time::timeout(WAIT, self.publishes.recv())
            .await
            .expect("a publish in time")
            .expect("the connection is up")
    }

    /// Ends the connection with an MQTT DISCONNECT.
    async fn disconnect(self) {
        self.client.disconnect().await.expect("disconnect queued");
        tokio::time::timeout(WAIT, self.poll)
            .await
            .expect("the poll task ends after DISCONNECT")
            .expect("the poll task does not panic");
    }
}

/// Answers every request on `topic` on its response topic, echoing the
/// properties and reversing the payload.
async fn spawn_echo_responder(addr: SocketAddr, topic: &str) -> JoinHandle<()> {
    let mut responder = TestClient::connect(addr, "dev-test-responder").await;
    responder.subscribe(topic).await;
    tokio::spawn(async move {
        while let Some(request) = responder.publishes.recv().await {
            let properties = request.properties.unwrap_or_default();
            let Some(response_topic) = properties.response_topic.clone() else {
                continue;
            };
            let mut payload = request.payload.to_vec();
            payload.reverse();
            let reply = PublishProperties {
                correlation_data: properties.correlation_data,
                user_properties: properties.user_properties,
                content_type: properties.content_type,
                ..Default::default()
            };
            if responder
                .client
                .publish_with_properties(response_topic, QoS::AtLeastOnce, false, payload, reply)
                .await
                .is_err()
            {
                return;
            }
        }
    })
}

async fn next_disconnect(disconnects: &mut broadcast::Receiver<String>) -> String {
    tokio::time::timeout(WAIT, disconnects.recv())
        .await
        .expect("a disconnect event in time")
        .expect("the disconnect channel is open")
}

#[tokio::test]
async fn broker_forwards_mqtt5_request_properties_intact_both_ways() {
    let broker = start_broker().await;
    let addr = broker.local_addr();
    assert_ne!(addr.port(), 0, "the bound port is known");

    let mut responder = TestClient::connect(addr, "dev-test-props-responder").await;
    responder.subscribe("dev-test/props/request").await;
    let mut invoker = TestClient::connect(addr, "dev-test-props-invoker").await;
    invoker.subscribe("dev-test/props/response/+").await;

    let user_properties = vec![
        (
            "__ts".to_owned(),
            "001696374425000:00000:client-7".to_owned(),
        ),
        ("__protVer".to_owned(), "1.0".to_owned()),
        ("dup".to_owned(), "first".to_owned()),
        ("dup".to_owned(), "second".to_owned()),
        ("ünïcödé".to_owned(), "välue with spaces".to_owned()),
    ];
    let correlation = Bytes::from_static(&[
        0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xfe, 0xff,
    ]);
    let request = PublishProperties {
        payload_format_indicator: Some(0),
        message_expiry_interval: Some(10),
        response_topic: Some("dev-test/props/response/invoker".to_owned()),
        correlation_data: Some(correlation.clone()),
        user_properties: user_properties.clone(),
        content_type: Some("application/octet-stream".to_owned()),
        ..Default::default()
    };
    let payload = Bytes::from_static(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
    invoker
        .client
        .publish_with_properties(
            "dev-test/props/request",
            QoS::AtLeastOnce,
            false,
            payload.clone(),
            request,
        )
        .await
        .unwrap();

    let received = responder.next_publish().await;
    assert_eq!(received.payload, payload);
    assert_eq!(received.qos, QoS::AtLeastOnce);
    let props = received.properties.expect("request properties arrive");
    assert_eq!(
        props.response_topic.as_deref(),
        Some("dev-test/props/response/invoker")
    );
    assert_eq!(props.correlation_data.as_ref(), Some(&correlation));
    assert_eq!(props.user_properties, user_properties);
    assert_eq!(
        props.content_type.as_deref(),
        Some("application/octet-stream")
    );
    // 0 (unspecified bytes) is the default; absent means the same.
    assert_eq!(props.payload_format_indicator.unwrap_or(0), 0);
    assert!(props.message_expiry_interval.is_some_and(|s| s <= 10));

    let reply = PublishProperties {
        correlation_data: props.correlation_data.clone(),
        user_properties: vec![
            ("__ts".to_owned(), "1696374425001:1:StateStore".to_owned()),
            ("__stat".to_owned(), "200".to_owned()),
        ],
        content_type: Some("application/octet-stream".to_owned()),
        ..Default::default()
    };
    responder
        .client
        .publish_with_properties(
            props.response_topic.clone().unwrap(),
            QoS::AtLeastOnce,
            false,
            Bytes::from_static(b"+OK\r\n"),
            reply,
        )
        .await
        .unwrap();

    let response = invoker.next_publish().await;
    assert_eq!(&response.topic[..], b"dev-test/props/response/invoker");
    assert_eq!(response.payload, Bytes::from_static(b"+OK\r\n"));
    let props = response.properties.expect("response properties arrive");
    assert_eq!(props.correlation_data.as_ref(), Some(&correlation));
    assert_eq!(
        props.user_properties,
        vec![
            ("__ts".to_owned(), "1696374425001:1:StateStore".to_owned()),
            ("__stat".to_owned(), "200".to_owned()),
        ]
    );
    assert_eq!(
        props.content_type.as_deref(),
        Some("application/octet-stream")
    );
}

#[tokio::test]
async fn broker_carries_payloads_of_1_4_and_15_mib() {
    let broker = start_broker().await;
    let mut client = TestClient::connect(broker.local_addr(), "dev-test-large").await;
    client.subscribe("dev-test/large").await;
    for mib in [1usize, 4, 15] {
        let payload: Bytes = (0..mib * 1024 * 1024)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        client
            .client
            .publish("dev-test/large", QoS::AtLeastOnce, false, payload.clone())
            .await
            .unwrap();
        let received = client.next_publish().await;
        assert_eq!(
            received.payload.len(),
            payload.len(),
            "{mib} MiB arrives whole"
        );
        assert!(received.payload == payload, "{mib} MiB arrives unchanged");
    }
}

#[tokio::test]
async fn disconnect_hook_reports_client_ids_of_ended_connections() {
    let broker = start_broker().await;
    let addr = broker.local_addr();
    let mut disconnects = broker.disconnects();

    // A polite MQTT DISCONNECT.
    let polite = TestClient::connect(addr, "dev-test-polite").await;
    polite.disconnect().await;
    assert_eq!(next_disconnect(&mut disconnects).await, "dev-test-polite");

    // A socket closed without DISCONNECT (a crashed client).
    let crashed = TestClient::connect(addr, "dev-test-crashed").await;
    crashed.poll.abort();
    assert_eq!(next_disconnect(&mut disconnects).await, "dev-test-crashed");
}

#[tokio::test]
async fn takeover_by_same_client_id_is_not_reported_as_disconnect() {
    let broker = start_broker().await;
    let addr = broker.local_addr();
    let mut disconnects = broker.disconnects();

    let first = TestClient::connect(addr, "dev-test-takeover").await;
    let second = TestClient::connect(addr, "dev-test-takeover").await;
    // The broker closes the first connection; its poll task ends.
    tokio::time::timeout(WAIT, first.poll)
        .await
        .expect("the taken-over connection is closed")
        .unwrap();
    let quiet = tokio::time::timeout(Duration::from_millis(500), disconnects.recv()).await;
    assert!(
        quiet.is_err(),
        "no disconnect reported for a takeover: {quiet:?}"
    );

    second.disconnect().await;
    assert_eq!(next_disconnect(&mut disconnects).await, "dev-test-takeover");
}

#[tokio::test]
async fn two_brokers_in_one_process_are_independent() {
    let first = start_broker().await;
    let second = start_broker().await;
    assert_ne!(first.local_addr(), second.local_addr());
    let mut first_disconnects = first.disconnects();
    let mut second_disconnects = second.disconnects();

    for (broker, name) in [(&first, "dev-test-twin-a"), (&second, "dev-test-twin-b")] {
        let mut client = TestClient::connect(broker.local_addr(), name).await;
        client.subscribe("dev-test/twin").await;
        client
            .client
            .publish(
                "dev-test/twin",
                QoS::AtLeastOnce,
                false,
                name.as_bytes().to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(&client.next_publish().await.payload[..], name.as_bytes());
        client.disconnect().await;
    }
    assert_eq!(
        next_disconnect(&mut first_disconnects).await,
        "dev-test-twin-a"
    );
    assert_eq!(
        next_disconnect(&mut second_disconnects).await,
        "dev-test-twin-b"
    );
}

#[tokio::test]
async fn shutdown_closes_clients_and_the_listener() {
    let broker = start_broker().await;
    let addr = broker.local_addr();
    let client = TestClient::connect(addr, "dev-test-shutdown").await;
    broker.shutdown().await;
    tokio::time::timeout(WAIT, client.poll)
        .await
        .expect("the client connection is closed by shutdown")
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "nothing listens on {addr} after shutdown"
    );
}

#[tokio::test]
async fn mqtt_3_1_1_clients_reach_mqtt5_subscribers() {
    let broker = start_broker().await;
    let addr = broker.local_addr();
    let mut subscriber = TestClient::connect(addr, "dev-test-v5-subscriber").await;
    subscriber.subscribe("dev-test/v311").await;

    let mut options = rumqttc::MqttOptions::new(
        "dev-test-v311-publisher",
        addr.ip().to_string(),
        addr.port(),
    );
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut event_loop) = rumqttc::AsyncClient::new(options, 16);
    let poll = tokio::spawn(async move { while event_loop.poll().await.is_ok() {} });
    client
        .publish(
            "dev-test/v311",
            rumqttc::QoS::AtLeastOnce,
            false,
            "from 3.1.1",
        )
        .await
        .unwrap();
    assert_eq!(&subscriber.next_publish().await.payload[..], b"from 3.1.1");
    poll.abort();
}

/// TCP_NODELAY on both sides: without it each round trip costs ~44 ms and
/// 200 of them take ~9 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_response_round_trips_are_not_delayed_by_nagle() {
    let broker = start_broker().await;
    let addr = broker.local_addr();
    let _responder = spawn_echo_responder(addr, "dev-test/rate/request").await;
    let mut invoker = TestClient::connect(addr, "dev-test-rate-invoker").await;
    invoker.subscribe("dev-test/rate/response").await;

    let request = |i: u32| PublishProperties {
        response_topic: Some("dev-test/rate/response".to_owned()),
        correlation_data: Some(Bytes::copy_from_slice(&i.to_be_bytes())),
        ..Default::default()
    };

    // Sequential: one request in flight.
    const SEQUENTIAL: u32 = 200;
    let started = Instant::now();
    for i in 0..SEQUENTIAL {
        invoker
            .client
            .publish_with_properties(
                "dev-test/rate/request",
                QoS::AtLeastOnce,
                false,
                &b"ping"[..],
                request(i),
            )
            .await
            .unwrap();
        let response = invoker.next_publish().await;
        let correlation = response.properties.and_then(|p| p.correlation_data);
        assert_eq!(correlation.as_deref(), Some(&i.to_be_bytes()[..]));
    }
    let sequential = started.elapsed();
    println!(
        "embedded broker: {SEQUENTIAL} sequential QoS 1 round trips in {sequential:?} ({:.0}/s)",
        f64::from(SEQUENTIAL) / sequential.as_secs_f64()
    );
    assert!(
        sequential < Duration::from_secs(5),
        "{SEQUENTIAL} round trips took {sequential:?}: TCP_NODELAY missing?"
    );

    // Pipelined: 64 requests in flight.
    const PIPELINED: u32 = 2000;
    const WINDOW: u32 = 64;
    let started = Instant::now();
    let mut sent = 0;
    let mut received = 0;
    while received < PIPELINED {
        while sent < PIPELINED && sent - received < WINDOW {
            invoker
                .client
                .publish_with_properties(
                    "dev-test/rate/request",
                    QoS::AtLeastOnce,
                    false,
                    &b"ping"[..],
                    request(sent),
                )
                .await
                .unwrap();
            sent += 1;
        }
        invoker.next_publish().await;
        received += 1;
    }
    let pipelined = started.elapsed();
    println!(
        "embedded broker: {PIPELINED} QoS 1 round trips with {WINDOW} in flight in {pipelined:?} ({:.0}/s)",
        f64::from(PIPELINED) / pipelined.as_secs_f64()
    );
    assert!(pipelined < Duration::from_secs(30));
}

/// Dev mode in-process, everything on port 0.
async fn start_stack(data_dir: Option<std::path::PathBuf>) -> DevStack {
    init_logging();
    let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
    let settings = DevSettings {
        listen: any_port,
        admin_listen: any_port,
        broker_listen: any_port,
        data_dir,
        dapr: Default::default(),
    };
    DevStack::start(&settings).await.expect("dev mode starts")
}

/// Polls `condition` every 20 ms until it holds or [`WAIT`] passes.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn dev_stack_serves_keys_over_http_once_started() {
    let stack = start_stack(None).await;
    let http = http_client();
    let url = format!("http://{}/keys/greeting", stack.api_addr());
    let put = http.put(&url).body("hello").send().await.unwrap();
    assert_eq!(put.status(), 200);
    let get = http.get(&url).send().await.unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.text().await.unwrap(), "hello");
    let ready = http
        .get(format!("http://{}/readyz", stack.admin_addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    assert!(stack.banner().contains(&format!(
        "localhost:{}/keys/greeting",
        stack.api_addr().port()
    )));
    stack.shutdown().await.unwrap();
}

#[tokio::test]
async fn dev_stack_drops_watches_of_clients_that_disconnect() {
    let stack = start_stack(None).await;
    let emulator = stack.emulator();
    let mut watcher = RawClient::connect_port(stack.broker_addr().port(), "dev-watcher").await;
    let keynotify = Request::KeyNotify {
        key: Bytes::from_static(b"watched"),
        stop: false,
    }
    .encode();
    watcher.request(&keynotify, &[]).await;
    assert_eq!(emulator.registrations(), 1);

    // Dropping the client closes its socket without DISCONNECT (a polite
    // DISCONNECT takes the same path: see the broker tests above).
    drop(watcher);
    eventually("the disconnected client's registration is dropped", || {
        emulator.registrations() == 0
    })
    .await;

    stack.shutdown().await.unwrap();
}

#[tokio::test]
async fn dev_stack_keeps_persisted_keys_in_its_data_dir_across_restarts() {
    let data = tempfile::tempdir().unwrap();
    let http = http_client();
    let stack = start_stack(Some(data.path().to_owned())).await;
    let put = http
        .put(format!(
            "http://{}/keys/kept?persist=true",
            stack.api_addr()
        ))
        .body("durable")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    stack.shutdown().await.unwrap();

    let stack = start_stack(Some(data.path().to_owned())).await;
    let get = http
        .get(format!("http://{}/keys/kept", stack.api_addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.text().await.unwrap(), "durable");
    stack.shutdown().await.unwrap();
}

#[tokio::test]
async fn dev_refuses_a_broker_port_in_use_with_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
    let settings = DevSettings {
        listen: any_port,
        admin_listen: any_port,
        broker_listen: taken.local_addr().unwrap(),
        data_dir: None,
        dapr: Default::default(),
    };
    let error = DevStack::start(&settings).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("cannot listen")
            && message.contains(&taken.local_addr().unwrap().to_string()),
        "{message}"
    );
}

/// The README's first command, for real: the binary, its banner, the curl
/// example (through reqwest), and a clean exit on SIGTERM.
#[tokio::test]
async fn dev_binary_prints_its_addresses_and_serves_the_readme_example() {
    init_logging();
    let mut dev = DevProcess::start(&[]).await;
    for address in [dev.api, dev.admin, dev.broker] {
        assert!(
            dev.banner.contains(&address.to_string()),
            "{address} in:\n{}",
            dev.banner
        );
    }
    let curl_put = format!(
        "curl -X PUT --data-binary hello localhost:{}/keys/greeting",
        dev.api.port()
    );
    assert!(dev.banner.contains(&curl_put), "{}", dev.banner);

    let http = http_client();
    let put = http
        .put(dev.url("/keys/greeting"))
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let get = http.get(dev.url("/keys/greeting")).send().await.unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.text().await.unwrap(), "hello");

    // Other MQTT clients reach the emulator through the embedded broker.
    let mut client = RawClient::connect_port(dev.broker.port(), "dev-binary-client").await;
    let reply = client
        .request(&crate::support::emulator::get_payload(b"greeting"), &[])
        .await;
    assert_eq!(&reply.payload[..], b"$5\r\nhello\r\n");
    drop(client);

    let status = dev.terminate();
    assert!(status.success(), "dev exits 0 on SIGTERM, got {status:?}");
}

/// The official AIO SDK state store client (its own MQTT session) through
/// the embedded broker: it sees what the gateway writes, and the gateway
/// sees what it writes.
#[tokio::test]
async fn official_sdk_client_and_gateway_share_the_dev_store() {
    use azure_iot_operations_services::state_store::{Operation, SetOptions};

    let stack = start_stack(None).await;
    let sdk = SdkClient::connect(stack.broker_addr().port(), "dev-sdk-client");

    let http = http_client();
    let url = format!("http://{}/keys/shared", stack.api_addr());
    let mut observation = sdk
        .observe(b"shared".to_vec(), WAIT)
        .await
        .unwrap()
        .response;
    assert_eq!(stack.emulator().registrations(), 1);

    let put = http.put(&url).body("from http").send().await.unwrap();
    assert_eq!(put.status(), 200);
    let (notification, _) = tokio::time::timeout(WAIT, observation.recv_notification())
        .await
        .expect("a notification in time")
        .expect("the observation is open");
    assert_eq!(
        notification.operation,
        Operation::Set(b"from http".to_vec())
    );

    let get = sdk.get(b"shared".to_vec(), WAIT).await.unwrap();
    assert_eq!(get.response, Some(b"from http".to_vec()));
    sdk.set(
        b"shared".to_vec(),
        b"from sdk".to_vec(),
        WAIT,
        None,
        SetOptions::default(),
    )
    .await
    .unwrap();
    let get = http.get(&url).send().await.unwrap();
    assert_eq!(get.text().await.unwrap(), "from sdk");

    sdk.close().await;
    eventually(
        "the SDK client's registration is dropped after it leaves",
        || stack.emulator().registrations() == 0,
    )
    .await;
    stack.shutdown().await.unwrap();
}
