//! The MQTT pool against a real mosquitto, with a responder peer standing
//! in for the state store.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use statestore_gateway::mqtt::{MemberEvent, PoolError, RequestOptions};
use statestore_gateway::protocol::{
    self, Hlc, Notification, REQUEST_TOPIC, Reply, Request, SetOptions,
};
use tokio::sync::broadcast;

use crate::support::sdk::SdkClient;
use crate::support::{
    Answer, Mosquitto, MosquittoConfig, Responder, init_logging, pool_settings, start_pool,
    wait_until,
};

fn set(key: &str, value: &str) -> Request {
    Request::Set {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        options: SetOptions::default(),
    }
}

fn get(key: &str) -> Request {
    Request::Get {
        key: Bytes::copy_from_slice(key.as_bytes()),
    }
}

fn user_property<'a>(publish: &'a rumqttc::v5::mqttbytes::v5::Publish, name: &str) -> &'a str {
    publish
        .properties
        .as_ref()
        .expect("requests carry properties")
        .user_properties
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name}"))
}

fn property_names(publish: &rumqttc::v5::mqttbytes::v5::Publish) -> Vec<String> {
    publish
        .properties
        .as_ref()
        .expect("requests carry properties")
        .user_properties
        .iter()
        .map(|(name, _)| name.clone())
        .collect()
}

#[tokio::test]
async fn round_trip_carries_the_sdks_envelope() {
    init_logging();
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    let mut settings = pool_settings(broker.addr, "env");
    settings.size = 1;
    let (pool, metrics) = start_pool(settings).await;

    let fencing_token = Hlc::parse("1700000000000:7:holder").unwrap();
    let options = RequestOptions {
        fencing_token: Some(fencing_token.clone()),
        persist: true,
        ..RequestOptions::default()
    };
    let request = set("key", "value");
    let response = pool
        .request(&request, &options, |response| response)
        .await
        .unwrap();
    assert_eq!(response.reply, Reply::Ok);
    let set_version = response.version.expect("SET returns the key's version");

    let got = pool
        .request(&get("key"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();
    assert_eq!(got.reply, Reply::Value(Bytes::from_static(b"value")));
    assert_eq!(got.version.as_ref(), Some(&set_version));

    let requests = responder.wait_for_requests(2, Duration::from_secs(1)).await;
    let (set_seen, get_seen) = (&requests[0], &requests[1]);
    assert_eq!(&set_seen.topic[..], REQUEST_TOPIC.as_bytes());
    assert_eq!(set_seen.qos, QoS::AtLeastOnce);
    assert!(!set_seen.retain);
    assert_eq!(&set_seen.payload[..], &request.encode()[..]);
    let properties = set_seen.properties.as_ref().unwrap();
    assert_eq!(
        properties.correlation_data.as_ref().map(Bytes::len),
        Some(16)
    );
    assert_eq!(
        properties.response_topic.as_deref(),
        Some(protocol::response_topic("env-0").as_str())
    );
    assert_eq!(
        properties.content_type.as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(properties.message_expiry_interval, Some(5));
    assert_eq!(properties.payload_format_indicator, None);
    assert_eq!(
        property_names(set_seen),
        [
            "__ft",
            "aio-persistence",
            "__srcId",
            "__ts",
            "__protVer",
            "$partition",
            "$high_priority"
        ]
    );
    assert_eq!(user_property(set_seen, "__ft"), fencing_token.to_string());
    assert_eq!(user_property(set_seen, "aio-persistence"), "true");
    assert_eq!(user_property(set_seen, "__srcId"), "env-0");
    assert_eq!(user_property(set_seen, "__protVer"), "1.0");
    assert_eq!(user_property(set_seen, "$partition"), "env-0");
    assert_eq!(user_property(set_seen, "$high_priority"), "");
    let set_ts = Hlc::parse(user_property(set_seen, "__ts")).unwrap();
    assert_eq!(
        set_ts.node, "env",
        "the clock's node id is the base client id"
    );

    // GET: no fencing token, no persistence; a new correlation id; the
    // clock moved past the version the SET returned.
    assert_eq!(&get_seen.payload[..], &get("key").encode()[..]);
    assert_eq!(
        property_names(get_seen),
        [
            "__srcId",
            "__ts",
            "__protVer",
            "$partition",
            "$high_priority"
        ]
    );
    assert_ne!(
        get_seen.properties.as_ref().unwrap().correlation_data,
        properties.correlation_data
    );
    let get_ts = Hlc::parse(user_property(get_seen, "__ts")).unwrap();
    assert!(
        (get_ts.wall_ms, get_ts.counter) > (set_version.wall_ms, set_version.counter),
        "{get_ts} is not after the merged version {set_version}"
    );

    let rendered = metrics.render();
    assert!(
        rendered.contains("store_request_duration_seconds_count{op=\"SET\",outcome=\"ok\"} 1"),
        "{rendered}"
    );
    assert_eq!(metrics.in_flight.get(), 0);
    pool.shutdown().await;
}

#[tokio::test]
async fn persistence_is_only_requested_on_set() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    let (pool, _) = start_pool(pool_settings(broker.addr, "persist")).await;
    let options = RequestOptions {
        fencing_token: None,
        persist: true,
        ..RequestOptions::default()
    };
    pool.request(&get("k"), &options, |response| response)
        .await
        .unwrap();
    let requests = responder.wait_for_requests(1, Duration::from_secs(1)).await;
    assert!(!property_names(&requests[0]).contains(&"aio-persistence".to_owned()));
}

#[tokio::test]
async fn envelope_matches_the_official_sdk() {
    use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
    use azure_iot_operations_services::state_store;

    init_logging();
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;

    let sdk = SdkClient::connect(broker.port(), "sdk-client");

    let token: HybridLogicalClock = "1700000000000:1:holder".parse().unwrap();
    let sdk_options = state_store::SetOptions {
        persist: true,
        ..Default::default()
    };
    tokio::time::timeout(
        Duration::from_secs(10),
        sdk.set(
            b"key".to_vec(),
            b"value".to_vec(),
            Duration::from_secs(5),
            Some(token),
            sdk_options,
        ),
    )
    .await
    .expect("the SDK's SET completes")
    .expect("the SDK's SET succeeds");
    tokio::time::timeout(
        Duration::from_secs(10),
        sdk.get(b"key".to_vec(), Duration::from_secs(5)),
    )
    .await
    .expect("the SDK's GET completes")
    .expect("the SDK's GET succeeds");

    let mut settings = pool_settings(broker.addr, "ours");
    settings.size = 1;
    let (pool, _) = start_pool(settings).await;
    let options = RequestOptions {
        fencing_token: Some(Hlc::parse("1700000000000:1:holder").unwrap()),
        persist: true,
        ..RequestOptions::default()
    };
    pool.request(&set("key", "value"), &options, |response| response)
        .await
        .unwrap();
    pool.request(&get("key"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();

    let requests = responder.wait_for_requests(4, Duration::from_secs(1)).await;
    for (sdk_request, our_request) in [(&requests[0], &requests[2]), (&requests[1], &requests[3])] {
        assert_eq!(
            sdk_request.payload, our_request.payload,
            "payloads are byte-identical"
        );
        assert_eq!(property_names(sdk_request), property_names(our_request));
        assert_eq!(sdk_request.qos, our_request.qos);
        let (sdk_properties, our_properties) = (
            sdk_request.properties.as_ref().unwrap(),
            our_request.properties.as_ref().unwrap(),
        );
        assert_eq!(sdk_properties.content_type, our_properties.content_type);
        assert_eq!(
            sdk_properties.payload_format_indicator,
            our_properties.payload_format_indicator
        );
        assert_eq!(
            sdk_properties.message_expiry_interval,
            our_properties.message_expiry_interval
        );
        assert_eq!(
            sdk_properties.correlation_data.as_ref().map(Bytes::len),
            our_properties.correlation_data.as_ref().map(Bytes::len)
        );
        for name in ["__ft", "aio-persistence", "__protVer", "$high_priority"] {
            let value = |publish| {
                property_names(publish)
                    .contains(&name.to_owned())
                    .then(|| user_property(publish, name).to_owned())
            };
            assert_eq!(value(sdk_request), value(our_request), "{name}");
        }
    }
    assert_eq!(
        requests[0]
            .properties
            .as_ref()
            .unwrap()
            .response_topic
            .as_deref(),
        Some(protocol::response_topic("sdk-client").as_str()),
        "the SDK's response topic is the one we use"
    );
    pool.shutdown().await;
    sdk.close().await;
}

#[tokio::test]
async fn requests_go_to_the_least_loaded_member() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    responder.set_delay(Duration::from_millis(200));
    let mut settings = pool_settings(broker.addr, "spread");
    settings.size = 4;
    let (pool, _) = start_pool(settings).await;

    let concurrent: Vec<_> = (0..8)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.request(
                    &get(&format!("k{i}")),
                    &RequestOptions::default(),
                    |response| response,
                )
                .await
            })
        })
        .collect();
    for task in concurrent {
        assert!(task.await.unwrap().is_ok());
    }
    let per_member = |requests: &[rumqttc::v5::mqttbytes::v5::Publish]| {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for request in requests {
            *counts
                .entry(user_property(request, "__srcId").to_owned())
                .or_default() += 1;
        }
        counts
    };
    let counts = per_member(&responder.requests());
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts.values().all(|&n| n == 2), "{counts:?}");

    // Sequential requests tie on load; ties rotate over the members.
    responder.set_delay(Duration::ZERO);
    for i in 0..8 {
        pool.request(
            &get(&format!("s{i}")),
            &RequestOptions::default(),
            |response| response,
        )
        .await
        .unwrap();
    }
    let counts = per_member(&responder.requests()[8..]);
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts.values().all(|&n| n == 2), "{counts:?}");
}

#[tokio::test]
async fn request_on_uses_the_given_member() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    let (pool, _) = start_pool(pool_settings(broker.addr, "on")).await;
    for _ in 0..3 {
        pool.request(
            &get("k"),
            &RequestOptions {
                member: Some(1),
                ..RequestOptions::default()
            },
            |response| response,
        )
        .await
        .unwrap();
    }
    assert!(
        responder
            .requests()
            .iter()
            .all(|request| user_property(request, "__srcId") == "on-1")
    );
    assert_eq!(pool.subscribed_member(Some(1)), Some(1));
    assert!(matches!(
        pool.request(
            &get("k"),
            &RequestOptions {
                member: Some(7),
                ..RequestOptions::default()
            },
            |response| response,
        )
        .await,
        Err(PoolError::Unavailable)
    ));
}

#[tokio::test]
async fn a_full_window_fails_as_overloaded_after_the_slot_wait() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    responder.set_handler(|_, _| None);
    let mut settings = pool_settings(broker.addr, "window");
    settings.size = 1;
    settings.max_in_flight_per_member = 2;
    settings.slot_wait = Duration::from_millis(200);
    let (pool, metrics) = start_pool(settings).await;

    let hanging: Vec<_> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.request(&get("hang"), &RequestOptions::default(), |response| {
                    response
                })
                .await
            })
        })
        .collect();
    responder.wait_for_requests(2, Duration::from_secs(1)).await;
    assert_eq!(metrics.in_flight.get(), 2);

    let started = Instant::now();
    let third = pool
        .request(&get("third"), &RequestOptions::default(), |response| {
            response
        })
        .await;
    let waited = started.elapsed();
    assert!(matches!(third, Err(PoolError::Overloaded)), "{third:?}");
    assert!(
        waited >= Duration::from_millis(190),
        "gave up after {waited:?}"
    );
    assert!(waited < Duration::from_secs(1), "waited {waited:?}");
    assert_eq!(
        responder.requests().len(),
        2,
        "the third request was never sent"
    );
    assert!(
        metrics
            .render()
            .contains("store_errors_total{kind=\"overloaded\"} 1")
    );
    for task in hanging {
        task.abort();
    }
    // Cancelled requests give their slots back.
    wait_until(Duration::from_secs(1), "slots freed", || {
        metrics.in_flight.get() == 0
    })
    .await;
}

#[tokio::test]
async fn a_request_waiting_for_a_slot_gets_the_next_free_one() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    responder.set_delay(Duration::from_millis(100));
    let mut settings = pool_settings(broker.addr, "waiter");
    settings.size = 1;
    settings.max_in_flight_per_member = 1;
    settings.slot_wait = Duration::from_secs(2);
    let (pool, _) = start_pool(settings).await;
    let (a, b, options) = (get("a"), get("b"), RequestOptions::default());
    let (first, second) = tokio::join!(
        pool.request(&a, &options, |response| response),
        pool.request(&b, &options, |response| response)
    );
    assert!(first.is_ok() && second.is_ok(), "{first:?} {second:?}");
}

#[tokio::test]
async fn a_silent_store_times_out_and_the_slot_is_freed() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    responder.set_handler(|_, _| None);
    let mut settings = pool_settings(broker.addr, "timeout");
    settings.request_timeout = Duration::from_millis(300);
    let (pool, metrics) = start_pool(settings).await;
    let started = Instant::now();
    let result = pool
        .request(&get("k"), &RequestOptions::default(), |response| response)
        .await;
    assert!(
        matches!(result, Err(PoolError::Timeout(t)) if t == Duration::from_millis(300)),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let requests = responder.requests();
    assert_eq!(
        requests[0]
            .properties
            .as_ref()
            .unwrap()
            .message_expiry_interval,
        Some(1),
        "sub-second timeouts expire after one second"
    );
    assert_eq!(metrics.in_flight.get(), 0);
    assert!(
        metrics
            .render()
            .contains("store_request_duration_seconds_count{op=\"GET\",outcome=\"timeout\"} 1")
    );
}

#[tokio::test]
async fn broker_loss_fails_requests_at_once_and_members_come_back() {
    init_logging();
    let mut broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    responder.set_handler(|request, _| match request {
        Request::Get { key } if &key[..] == b"hang" => None,
        _ => Some(Answer::plain(Reply::Ok)),
    });
    let mut settings = pool_settings(broker.addr, "loss");
    settings.request_timeout = Duration::from_secs(10);
    let (pool, metrics) = start_pool(settings).await;
    let mut events = pool.member_events();

    let hanging: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let result = pool
                    .request(&get("hang"), &RequestOptions::default(), |response| {
                        response
                    })
                    .await;
                (result, started.elapsed())
            })
        })
        .collect();
    responder.wait_for_requests(4, Duration::from_secs(1)).await;

    broker.kill();
    for task in hanging {
        let (result, took) = tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("requests fail at once, not after the request timeout")
            .unwrap();
        // The responder received them: they left, so their outcome is
        // unknown (a 504 over HTTP), not "never sent" (503).
        assert!(
            matches!(result, Err(PoolError::OutcomeUnknown)),
            "{result:?}"
        );
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }
    wait_until(Duration::from_secs(1), "pool not ready", || {
        !pool.is_ready()
    })
    .await;
    assert!(matches!(
        pool.request(&get("k"), &RequestOptions::default(), |response| response)
            .await,
        Err(PoolError::Unavailable)
    ));

    broker.restart().await;
    let restarted = Instant::now();
    wait_until(Duration::from_secs(3), "pool ready again", || {
        pool.is_ready()
    })
    .await;
    wait_until(Duration::from_secs(3), "both members subscribed", || {
        metrics
            .pool_members
            .with_label_values(&["subscribed"])
            .get()
            == 2
    })
    .await;
    let back_after = restarted.elapsed();
    assert!(
        back_after < Duration::from_millis(2500),
        "back after {back_after:?}"
    );
    responder.wait_subscribed(Duration::from_secs(3)).await;
    let response = pool
        .request(&get("k"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();
    assert_eq!(response.reply, Reply::Ok);

    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    for member in 0..2 {
        let down = seen.iter().position(|e| *e == MemberEvent::Down { member });
        let up = seen
            .iter()
            .position(|e| *e == MemberEvent::Subscribed { member });
        assert!(
            matches!((down, up), (Some(d), Some(u)) if d < u),
            "member {member}: {seen:?}"
        );
    }
    assert!(metrics.reconnects.get() >= 2);
    assert_eq!(metrics.pool_members.with_label_values(&["down"]).get(), 0);
    assert_eq!(
        metrics
            .pool_members
            .with_label_values(&["connecting"])
            .get(),
        0
    );
    assert!(
        metrics
            .render()
            .contains("store_errors_total{kind=\"outcome_unknown\"} 4")
    );
    pool.shutdown().await;
}

#[tokio::test]
async fn notifications_are_forwarded_with_member_key_and_version() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    let (pool, _) = start_pool(pool_settings(broker.addr, "notes")).await;
    let mut notifications = pool.notifications();

    let version = "1700000000000:4:StateStore";
    responder
        .notify(
            "notes-1",
            b"\x00bin/key",
            &Notification::Set {
                value: Bytes::from_static(b"v1"),
            },
            Some(version),
        )
        .await;
    responder
        .notify("notes-0", b"gone", &Notification::Delete, None)
        .await;

    let mut received = Vec::new();
    for _ in 0..2 {
        received.push(
            tokio::time::timeout(Duration::from_secs(2), notifications.recv())
                .await
                .expect("a notification in time")
                .unwrap(),
        );
    }
    received.sort_by_key(|n| n.member);
    assert_eq!(received[0].member, 0);
    assert_eq!(&received[0].key[..], b"gone");
    assert_eq!(received[0].notification, Notification::Delete);
    assert_eq!(received[0].version, None);
    assert_eq!(received[1].member, 1);
    assert_eq!(&received[1].key[..], b"\x00bin/key");
    assert_eq!(
        received[1].notification,
        Notification::Set {
            value: Bytes::from_static(b"v1")
        }
    );
    assert_eq!(received[1].version, Some(Hlc::parse(version).unwrap()));
}

#[tokio::test]
async fn odd_replies_become_clear_errors() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    responder.set_handler(|request, _| {
        let Request::Get { key } = request else {
            return None;
        };
        Some(match &key[..] {
            b"status" => Answer {
                reply: Reply::Ok,
                version: None,
                status: Some("500".into()),
                extra: vec![("__stMsg".into(), "executor failed".into())],
            },
            b"no-status" => Answer {
                reply: Reply::NotFound,
                version: None,
                status: None,
                extra: Vec::new(),
            },
            b"bad-version" => Answer {
                reply: Reply::Ok,
                version: Some("yesterday".into()),
                status: Some("200".into()),
                extra: Vec::new(),
            },
            _ => Answer::plain(Reply::Value(Bytes::from_static(b"x"))),
        })
    });
    let (pool, metrics) = start_pool(pool_settings(broker.addr, "odd")).await;
    let ask = |key: &'static str| {
        let pool = pool.clone();
        async move {
            pool.request(&get(key), &RequestOptions::default(), |response| response)
                .await
        }
    };
    let status = ask("status").await.unwrap();
    assert_eq!(
        status.reply,
        Reply::Error(protocol::StoreError::Unknown(
            "state store status 500: executor failed".into()
        ))
    );
    assert_eq!(ask("no-status").await.unwrap().reply, Reply::NotFound);
    assert!(matches!(
        ask("bad-version").await,
        Err(PoolError::BadVersion(_))
    ));
    assert_eq!(
        ask("plain").await.unwrap().reply,
        Reply::Value(Bytes::from_static(b"x"))
    );
    let rendered = metrics.render();
    assert!(
        rendered.contains("store_errors_total{kind=\"unknown\"} 1"),
        "{rendered}"
    );
    assert!(
        rendered.contains("store_errors_total{kind=\"bad_version\"} 1"),
        "{rendered}"
    );
    assert!(rendered.contains("outcome=\"not_found\"} 1"), "{rendered}");
}

/// The envelope allowance covers the longest key, the largest trace
/// context and every other property: the largest value still goes out.
#[tokio::test]
async fn the_largest_value_fits_with_the_longest_key_and_trace_context() {
    use statestore_gateway::trace::{self, TraceContext};
    let broker = Mosquitto::start_with(MosquittoConfig {
        extra: "max_packet_size 20000\n".into(),
        ..Default::default()
    })
    .await;
    let responder = Responder::start(broker.addr).await;
    let mut settings = pool_settings(broker.addr, "big-traced");
    settings.size = 1;
    let (pool, _) = start_pool(settings).await;
    let fits = pool.max_value_bytes().unwrap();
    // 32 members of 15 bytes and their commas: 511 bytes, all kept.
    let state: Vec<String> = (0..32)
        .map(|i| format!("k{i:02}={}", "s".repeat(11)))
        .collect();
    let state = state.join(",");
    let context = TraceContext::parse(
        b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        std::iter::once(state.as_bytes()),
    )
    .unwrap();
    assert_eq!(context.tracestate(), Some(state.as_str()));
    let key = "k".repeat(statestore_gateway::settings::DEFAULT_MAX_KEY_BYTES);
    let options = RequestOptions {
        fencing_token: Some(Hlc::new(1_700_000_000_000, "a-fencing-node")),
        persist: true,
        ..RequestOptions::default()
    };
    let request = set(&key, &"x".repeat(fits));
    let response = trace::scope(
        Some(context),
        pool.request(&request, &options, |response| response),
    )
    .await
    .unwrap();
    assert_eq!(response.reply, Reply::Ok);
    let sent = responder.requests();
    assert_eq!(user_property(&sent[0], "tracestate"), state);
}

#[tokio::test]
async fn requests_beyond_the_brokers_packet_limit_fail_before_sending() {
    let broker = Mosquitto::start_with(MosquittoConfig {
        extra: "max_packet_size 20000\n".into(),
        ..Default::default()
    })
    .await;
    let responder = Responder::start(broker.addr).await;
    let mut settings = pool_settings(broker.addr, "big");
    settings.size = 1;
    let (pool, _) = start_pool(settings).await;
    assert_eq!(
        pool.max_value_bytes(),
        Some(20000 - statestore_gateway::mqtt::ENVELOPE_ALLOWANCE)
    );
    let fits = pool.max_value_bytes().unwrap();
    let response = pool
        .request(
            &set("big", &"x".repeat(fits)),
            &RequestOptions::default(),
            |response| response,
        )
        .await
        .unwrap();
    assert_eq!(response.reply, Reply::Ok);

    let result = pool
        .request(
            &set("big", &"x".repeat(20000)),
            &RequestOptions::default(),
            |response| response,
        )
        .await;
    match result {
        Err(PoolError::TooLarge { size, max }) => {
            assert_eq!(max, 20000);
            assert!(size > 20000);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        responder.requests().len(),
        1,
        "the large request was not sent"
    );
    // The connection survived.
    assert!(pool.is_ready());
    pool.request(&get("big"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();
}

#[tokio::test]
async fn shutdown_fails_pending_requests_and_refuses_new_ones() {
    let broker = Mosquitto::start().await;
    let responder = Responder::start(broker.addr).await;
    responder.set_handler(|_, _| None);
    let (pool, metrics) = start_pool(pool_settings(broker.addr, "bye")).await;
    let pending = tokio::spawn({
        let pool = pool.clone();
        async move {
            pool.request(&get("k"), &RequestOptions::default(), |response| response)
                .await
        }
    });
    responder.wait_for_requests(1, Duration::from_secs(1)).await;
    let mut events = pool.member_events();
    tokio::time::timeout(Duration::from_secs(5), pool.shutdown())
        .await
        .expect("shutdown is bounded");
    let result = tokio::time::timeout(Duration::from_secs(1), pending)
        .await
        .unwrap()
        .unwrap();
    // The responder received it before the shutdown: its outcome is unknown.
    assert!(
        matches!(result, Err(PoolError::OutcomeUnknown)),
        "{result:?}"
    );
    assert!(!pool.is_ready());
    assert!(matches!(
        pool.request(&get("k"), &RequestOptions::default(), |response| response)
            .await,
        Err(PoolError::ShuttingDown)
    ));
    assert_eq!(metrics.pool_members.with_label_values(&["down"]).get(), 2);
    assert_eq!(
        metrics
            .pool_members
            .with_label_values(&["subscribed"])
            .get(),
        0
    );
    // Both members said goodbye and nothing reconnects.
    let mut downs = 0;
    while let Ok(event) = events.try_recv() {
        assert!(matches!(event, MemberEvent::Down { .. }), "{event:?}");
        downs += 1;
    }
    assert_eq!(downs, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        events.try_recv(),
        Err(broadcast::error::TryRecvError::Empty)
    ));
}

#[tokio::test]
async fn nothing_serving_the_request_topic_fails_at_once_as_unavailable() {
    let broker = Mosquitto::start().await;
    let (pool, metrics) = start_pool(pool_settings(broker.addr, "alone")).await;
    let started = Instant::now();
    let result = pool
        .request(&get("k"), &RequestOptions::default(), |response| response)
        .await;
    assert!(matches!(result, Err(PoolError::Unavailable)), "{result:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}; the PUBACK said nobody listens",
        started.elapsed()
    );
    assert_eq!(metrics.in_flight.get(), 0);
    // The connection is fine.
    assert!(pool.is_ready());
}

#[tokio::test]
async fn a_request_the_broker_does_not_authorize_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl");
    // Anonymous clients may use their own topics but not the store's.
    std::fs::write(&acl, "topic readwrite clients/#\n").unwrap();
    let broker = Mosquitto::start_with(MosquittoConfig {
        extra: format!("acl_file {}\n", acl.display()),
        ..Default::default()
    })
    .await;
    let (pool, _) = start_pool(pool_settings(broker.addr, "denied")).await;
    let started = Instant::now();
    let response = pool
        .request(&get("k"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();
    assert_eq!(
        response.reply,
        Reply::Error(protocol::StoreError::NotAuthorized)
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(pool.is_ready());
}

#[tokio::test]
async fn a_frozen_broker_is_noticed_from_missing_acknowledgements() {
    init_logging();
    let broker = Mosquitto::start().await;
    let _responder = Responder::start(broker.addr).await;
    let mut settings = pool_settings(broker.addr, "frozen");
    settings.size = 1;
    settings.request_timeout = Duration::from_secs(1);
    let (pool, _) = start_pool(settings).await;
    pool.request(&get("k"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();

    broker.pause();
    let started = Instant::now();
    let result = pool
        .request(&get("k"), &RequestOptions::default(), |response| response)
        .await;
    assert!(matches!(result, Err(PoolError::Timeout(_))), "{result:?}");
    // Not after two keep-alive periods (120 s) but about one request timeout.
    wait_until(
        Duration::from_secs(2),
        "the member gives up on the frozen broker",
        || !pool.is_ready(),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(3));

    broker.resume();
    wait_until(Duration::from_secs(10), "the member is back", || {
        pool.is_ready()
    })
    .await;
    pool.request(&get("k"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();
}
