//! The emulator over a real mosquitto, driven with raw MQTT5 requests: exact
//! payload bytes, envelopes, error strings, and what it does with bad input.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};
use statestore_gateway::emulator::AccessList;
use statestore_gateway::protocol::resp::encode_array;
use statestore_gateway::protocol::{
    CONTENT_TYPE, Hlc, NOTIFY_TOPIC_ROOT, REQUEST_TOPIC, hlc, notify_topic, property,
    response_topic,
};

use crate::support::Mosquitto;
use crate::support::emulator::{
    EmulatorProcess, RawClient, WAIT, get_payload, start_emulator, start_emulator_with,
    user_property,
};

const SET: &[u8] = b"*3\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n";
const GET: &[u8] = b"*2\r\n$3\r\nGET\r\n$7\r\ntestkey\r\n";
const DEL: &[u8] = b"*2\r\n$3\r\nDEL\r\n$7\r\ntestkey\r\n";
const VDEL: &[u8] = b"*3\r\n$4\r\nVDEL\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n";
const KEYNOTIFY: &[u8] = b"*2\r\n$9\r\nKEYNOTIFY\r\n$7\r\ntestkey\r\n";
const KEYNOTIFY_STOP: &[u8] = b"*3\r\n$9\r\nKEYNOTIFY\r\n$7\r\ntestkey\r\n$4\r\nSTOP\r\n";

fn version(publish: &Publish) -> Option<Hlc> {
    user_property(publish, property::TIMESTAMP).map(|text| Hlc::parse(text).unwrap())
}

fn payload(publish: &Publish) -> &[u8] {
    &publish.payload
}

fn err(message: &str) -> Vec<u8> {
    format!("-ERR {message}\r\n").into_bytes()
}

#[tokio::test]
async fn set_get_del_vdel_replies_are_byte_exact_with_the_services_envelope() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-1").await;

    let request = client.envelope(&[]);
    let correlation = request.correlation_data.clone().unwrap();
    let request_ts = Hlc::parse(&user_property_of(&request, property::TIMESTAMP)).unwrap();
    client.publish(SET, request, QoS::AtLeastOnce).await;
    let reply = client
        .reply_to(&correlation, WAIT)
        .await
        .expect("SET reply");
    assert_eq!(payload(&reply), b"+OK\r\n");
    assert_eq!(reply.topic, response_topic("raw-1").as_bytes());
    assert_eq!(reply.qos, QoS::AtLeastOnce);
    let properties = reply.properties.as_ref().unwrap();
    assert_eq!(properties.correlation_data.as_ref(), Some(&correlation));
    assert_eq!(properties.content_type.as_deref(), Some(CONTENT_TYPE));
    assert_eq!(user_property(&reply, property::STATUS), Some("200"));
    assert_eq!(
        user_property(&reply, property::PROTOCOL_VERSION),
        Some("1.0")
    );
    let set_version = version(&reply).expect("SET reply carries __ts");
    assert_eq!(set_version.node, "StateStore");
    assert!((set_version.wall_ms, set_version.counter) > (request_ts.wall_ms, request_ts.counter));

    let reply = client.request(GET, &[]).await;
    assert_eq!(payload(&reply), b"$9\r\ntestvalue\r\n");
    assert_eq!(version(&reply), Some(set_version.clone()));

    let vdel_other = encode_array(&[b"VDEL", b"testkey", b"other"]);
    let reply = client.request(&vdel_other, &[]).await;
    assert_eq!(payload(&reply), b":-1\r\n");
    let reply = client.request(VDEL, &[]).await;
    assert_eq!(payload(&reply), b":1\r\n");
    assert!(version(&reply).unwrap() > set_version);
    let reply = client.request(VDEL, &[]).await;
    assert_eq!(payload(&reply), b":0\r\n");

    client.request(SET, &[]).await;
    let reply = client.request(DEL, &[]).await;
    assert_eq!(payload(&reply), b":1\r\n");
    let reply = client.request(DEL, &[]).await;
    assert_eq!(payload(&reply), b":0\r\n");
    let reply = client.request(GET, &[]).await;
    assert_eq!(payload(&reply), b"$-1\r\n");
    assert_eq!(version(&reply), None, "a GET miss carries no __ts");
    assert_eq!(user_property(&reply, property::STATUS), Some("200"));
}

fn user_property_of(properties: &PublishProperties, name: &str) -> String {
    properties
        .user_properties
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.clone())
        .unwrap()
}

#[tokio::test]
async fn nx_nex_px_binary_keys_and_empty_values() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-2").await;

    let nx = b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n";
    let nex = b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$3\r\nNEX\r\n";
    assert_eq!(payload(&client.request(nx, &[]).await), b"+OK\r\n");
    assert_eq!(payload(&client.request(nx, &[]).await), b":-1\r\n");
    assert_eq!(payload(&client.request(nex, &[]).await), b"+OK\r\n");
    let other = encode_array(&[b"SET", b"testkey", b"other", b"NEX"]);
    assert_eq!(payload(&client.request(&other, &[]).await), b":-1\r\n");

    let key: Vec<u8> = (0..=255).collect();
    let value: Vec<u8> = (0..=255).rev().cycle().take(100_000).collect();
    let set = encode_array(&[b"SET", &key, &value, b"PX", b"60000"]);
    assert_eq!(payload(&client.request(&set, &[]).await), b"+OK\r\n");
    let reply = client.request(&get_payload(&key), &[]).await;
    let mut expected = format!("${}\r\n", value.len()).into_bytes();
    expected.extend_from_slice(&value);
    expected.extend_from_slice(b"\r\n");
    assert_eq!(payload(&reply), expected);

    let empty = encode_array(&[b"SET", b"empty", b""]);
    assert_eq!(payload(&client.request(&empty, &[]).await), b"+OK\r\n");
    assert_eq!(
        payload(&client.request(&get_payload(b"empty"), &[]).await),
        b"$0\r\n\r\n"
    );
}

#[tokio::test]
async fn timestamp_and_fencing_errors_are_the_services_strings() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-3").await;

    // SET without __ts.
    let mut properties = client.envelope(&[]);
    properties
        .user_properties
        .retain(|(name, _)| name != property::TIMESTAMP);
    let correlation = properties.correlation_data.clone().unwrap();
    client.publish(SET, properties, QoS::AtLeastOnce).await;
    let reply = client.reply_to(&correlation, WAIT).await.unwrap();
    assert_eq!(payload(&reply), err("missing timestamp"));
    assert_eq!(user_property(&reply, property::STATUS), Some("200"));

    // The raw client sends its __ts first; the emulator reads the first one,
    // so replace it instead of appending another.
    for (ts, expected) in [
        ("garbage", "malformed timestamp"),
        ("1:2", "malformed timestamp"),
        (
            &*Hlc::new(hlc::now_ms() + 120_000, "c").to_string(),
            "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized",
        ),
    ] {
        let mut properties = client.envelope(&[]);
        for (name, value) in &mut properties.user_properties {
            if name == property::TIMESTAMP {
                *value = ts.to_owned();
            }
        }
        let correlation = properties.correlation_data.clone().unwrap();
        client.publish(SET, properties, QoS::AtLeastOnce).await;
        let reply = client.reply_to(&correlation, WAIT).await.unwrap();
        assert_eq!(payload(&reply), err(expected), "__ts {ts}");
    }

    // Fencing: the first SET with __ft protects the key.
    let token = Hlc::new(hlc::now_ms(), "lock").to_string();
    let reply = client
        .request(SET, &[(property::FENCING_TOKEN, &token)])
        .await;
    assert_eq!(payload(&reply), b"+OK\r\n");
    for request in [SET, DEL, VDEL] {
        assert_eq!(
            payload(&client.request(request, &[]).await),
            err("a fencing token is required for this request")
        );
    }
    let older = Hlc::new(hlc::now_ms() - 10_000, "lock").to_string();
    assert_eq!(
        payload(
            &client
                .request(DEL, &[(property::FENCING_TOKEN, &older)])
                .await
        ),
        err(
            "the request fencing token is a lower version than the fencing token protecting the resource"
        )
    );
    let future = Hlc::new(hlc::now_ms() + 120_000, "lock").to_string();
    assert_eq!(
        payload(
            &client
                .request(DEL, &[(property::FENCING_TOKEN, &future)])
                .await
        ),
        err(
            "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
        )
    );
    assert_eq!(
        payload(&client.request(DEL, &[(property::FENCING_TOKEN, "x")]).await),
        err("malformed timestamp")
    );
    assert_eq!(
        payload(
            &client
                .request(DEL, &[(property::FENCING_TOKEN, &token)])
                .await
        ),
        b":1\r\n"
    );
}

#[tokio::test]
async fn bad_payloads_get_errors_and_the_emulator_keeps_serving() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-4").await;

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"garbage".to_vec(), "syntax error"),
        (Vec::new(), "syntax error"),
        (
            b"*2\r\n$3\r\nGET\r\n$99999999999\r\nk\r\n".to_vec(),
            "syntax error",
        ),
        (
            b"*2\r\n$3\r\nGET\r\n$9223372036854775807\r\nk\r\n".to_vec(),
            "syntax error",
        ),
        (b"*2000000000\r\n".to_vec(), "syntax error"),
        (b"*2\r\n$3\r\nGET\r\n$-1\r\n".to_vec(), "syntax error"),
        (b"$3\r\nGET\r\n".to_vec(), "syntax error"),
        (encode_array(&[b"FLUSHALL"]), "unknown command"),
        (encode_array(&[b"get", b"k"]), "unknown command"),
        (encode_array(&[b"GET"]), "wrong number of arguments"),
        (encode_array(&[b"SET", b"k"]), "wrong number of arguments"),
        (
            encode_array(&[b"SET", b"k", b"v", b"PX", b"soon"]),
            "syntax error",
        ),
        (encode_array(&[b"SET", b"", b"v"]), "the key length is zero"),
        (encode_array(&[b"KEYNOTIFY", b""]), "the key length is zero"),
    ];
    for (request, expected) in &cases {
        let reply = client.request(request, &[]).await;
        assert_eq!(
            payload(&reply),
            err(expected),
            "{:?}",
            String::from_utf8_lossy(request)
        );
        assert_eq!(user_property(&reply, property::STATUS), Some("200"));
        assert_eq!(version(&reply), None);
    }
    // Random bytes, including a valid prefix cut anywhere: always a reply.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..200 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let junk: Vec<u8> = if i % 2 == 0 {
            SET[..(seed as usize % SET.len())].to_vec()
        } else {
            seed.to_le_bytes().repeat(1 + i % 5)
        };
        let reply = client.request(&junk, &[]).await;
        assert!(payload(&reply).starts_with(b"-ERR "), "{junk:?}");
    }
    assert_eq!(payload(&client.request(SET, &[]).await), b"+OK\r\n");
}

#[tokio::test]
async fn envelope_violations_are_refused_or_dropped_and_others_still_served() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-5").await;

    // QoS 0: refused with the AIO RPC status 400.
    let properties = client.envelope(&[]);
    let correlation = properties.correlation_data.clone().unwrap();
    client.publish(SET, properties, QoS::AtMostOnce).await;
    let reply = client
        .reply_to(&correlation, WAIT)
        .await
        .expect("a refusal");
    assert_eq!(user_property(&reply, property::STATUS), Some("400"));
    assert!(user_property(&reply, "__stMsg").unwrap().contains("QoS 1"));
    assert!(reply.payload.is_empty());

    // No correlation data: refused, without correlation data.
    let mut properties = client.envelope(&[]);
    properties.correlation_data = None;
    client.publish(SET, properties, QoS::AtLeastOnce).await;
    let reply = client.next_reply(WAIT).await.expect("a refusal");
    assert_eq!(user_property(&reply, property::STATUS), Some("400"));
    assert_eq!(
        user_property(&reply, "__propName"),
        Some("Correlation Data")
    );
    assert_eq!(reply.properties.unwrap().correlation_data, None);

    // An unsupported protocol version: 505.
    let mut properties = client.envelope(&[]);
    for (name, value) in &mut properties.user_properties {
        if name == property::PROTOCOL_VERSION {
            *value = "2.0".into();
        }
    }
    let correlation = properties.correlation_data.clone().unwrap();
    client.publish(GET, properties, QoS::AtLeastOnce).await;
    let reply = client
        .reply_to(&correlation, WAIT)
        .await
        .expect("a refusal");
    assert_eq!(user_property(&reply, property::STATUS), Some("505"));
    assert_eq!(user_property(&reply, "__supProtMajVer"), Some("1"));

    // No response topic, or a forbidden one: nothing can be answered.
    client
        .client
        .subscribe(format!("{NOTIFY_TOPIC_ROOT}/#"), QoS::AtLeastOnce)
        .await
        .unwrap();
    let mut properties = client.envelope(&[]);
    properties.response_topic = None;
    client.publish(SET, properties, QoS::AtLeastOnce).await;
    for forbidden in [
        REQUEST_TOPIC.to_owned(),
        notify_topic("raw-5", b"testkey"),
        NOTIFY_TOPIC_ROOT.to_owned(),
    ] {
        let mut properties = client.envelope(&[]);
        properties.response_topic = Some(forbidden);
        client.publish(SET, properties, QoS::AtLeastOnce).await;
    }
    // A valid request afterwards is answered, and nothing else came back.
    let reply = client.request(GET, &[]).await;
    assert_eq!(payload(&reply), b"$-1\r\n", "none of the dropped SETs ran");
    assert!(
        client
            .next_reply(Duration::from_millis(300))
            .await
            .is_none()
    );
    assert!(
        client
            .next_notification(Duration::from_millis(100))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn keynotify_delivers_set_and_delete_notifications_with_versions() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut watcher = RawClient::connect(&broker, "watcher-1").await;
    let mut writer = RawClient::connect(&broker, "writer-1").await;

    assert_eq!(payload(&watcher.request(KEYNOTIFY, &[]).await), b"+OK\r\n");
    let set = writer.request(SET, &[]).await;
    let notification = watcher
        .next_notification(WAIT)
        .await
        .expect("SET notification");
    assert_eq!(
        notification.topic,
        notify_topic("watcher-1", b"testkey").as_bytes()
    );
    assert_eq!(
        payload(&notification),
        b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$9\r\ntestvalue\r\n"
    );
    assert_eq!(version(&notification), version(&set));
    assert_eq!(
        notification
            .properties
            .as_ref()
            .unwrap()
            .content_type
            .as_deref(),
        Some(CONTENT_TYPE)
    );

    let del = writer.request(DEL, &[]).await;
    let notification = watcher
        .next_notification(WAIT)
        .await
        .expect("DELETE notification");
    assert_eq!(
        payload(&notification),
        b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
    );
    assert_eq!(version(&notification), version(&del));
    assert!(version(&del) > version(&set));

    // The writer watches nothing and got nothing.
    assert!(
        writer
            .next_notification(Duration::from_millis(200))
            .await
            .is_none()
    );

    assert_eq!(
        payload(&watcher.request(KEYNOTIFY_STOP, &[]).await),
        b"+OK\r\n"
    );
    assert_eq!(
        payload(&watcher.request(KEYNOTIFY_STOP, &[]).await),
        b":0\r\n"
    );
    writer.request(SET, &[]).await;
    assert!(
        watcher
            .next_notification(Duration::from_millis(300))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn registrations_of_a_disconnected_client_are_dropped() {
    let broker = Mosquitto::start().await;
    let emulator = start_emulator(&broker).await;
    let mut watcher = RawClient::connect(&broker, "watcher-2").await;
    let mut writer = RawClient::connect(&broker, "writer-2").await;
    watcher.request(KEYNOTIFY, &[]).await;
    assert_eq!(emulator.handle().registrations(), 1);
    emulator.client_disconnected("watcher-2");
    assert_eq!(emulator.handle().registrations(), 0);
    writer.request(SET, &[]).await;
    assert!(
        watcher
            .next_notification(Duration::from_millis(300))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn px_expiry_happens_on_time_without_reads_and_notifies() {
    let broker = Mosquitto::start().await;
    let emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-6").await;
    client.request(KEYNOTIFY, &[]).await;
    let set = encode_array(&[b"SET", b"testkey", b"v", b"PX", b"300"]);
    let started = std::time::Instant::now();
    let reply = client.request(&set, &[]).await;
    assert_eq!(payload(&reply), b"+OK\r\n");
    let first = client.next_notification(WAIT).await.unwrap();
    assert!(payload(&first).starts_with(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET"));
    let expired = client
        .next_notification(WAIT)
        .await
        .expect("expiry notification");
    let elapsed = started.elapsed();
    assert_eq!(payload(&expired), b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
    assert!(version(&expired) > version(&reply));
    assert!(
        elapsed >= Duration::from_millis(290) && elapsed < Duration::from_millis(1_500),
        "expired after {elapsed:?}"
    );
    assert_eq!(emulator.handle().key_count(), 0);
    assert_eq!(payload(&client.request(GET, &[]).await), b"$-1\r\n");
}

#[tokio::test]
async fn quota_and_access_list_refusals() {
    let broker = Mosquitto::start().await;
    let acl = AccessList::from_json(
        r#"{
            "owner": { "read": [""], "write": [""] },
            "reader-*": { "read": ["test"] }
        }"#,
    )
    .unwrap();
    let _emulator = start_emulator_with(&broker, |config| {
        config.max_keys = Some(2);
        config.max_bytes = Some(1_000);
        config.acl = Some(acl);
    })
    .await;
    let mut owner = RawClient::connect(&broker, "owner").await;
    let mut reader = RawClient::connect(&broker, "reader-1").await;
    let mut stranger = RawClient::connect(&broker, "stranger").await;

    assert_eq!(payload(&owner.request(SET, &[]).await), b"+OK\r\n");
    assert_eq!(
        payload(&reader.request(GET, &[]).await),
        b"$9\r\ntestvalue\r\n"
    );
    assert_eq!(payload(&reader.request(KEYNOTIFY, &[]).await), b"+OK\r\n");
    for request in [SET, DEL, VDEL] {
        assert_eq!(
            payload(&reader.request(request, &[]).await),
            err("not authorized")
        );
    }
    assert_eq!(
        payload(&stranger.request(GET, &[]).await),
        err("not authorized")
    );
    assert_eq!(
        payload(&reader.request(&get_payload(b"other"), &[]).await),
        err("not authorized")
    );

    let second = encode_array(&[b"SET", b"k2", b"v"]);
    let third = encode_array(&[b"SET", b"k3", b"v"]);
    assert_eq!(payload(&owner.request(&second, &[]).await), b"+OK\r\n");
    assert_eq!(
        payload(&owner.request(&third, &[]).await),
        err("the quota has been exceeded")
    );
    let big = encode_array(&[b"SET", b"k2", &[b'x'; 1_000]]);
    assert_eq!(
        payload(&owner.request(&big, &[]).await),
        err("the quota has been exceeded")
    );
    assert_eq!(payload(&owner.request(DEL, &[]).await), b":1\r\n");
    assert_eq!(payload(&owner.request(&third, &[]).await), b"+OK\r\n");
}

#[tokio::test]
async fn persisted_keys_survive_a_restart_and_plain_ones_do_not() {
    let broker = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_owned();
    let persist = [(property::PERSISTENCE, "true")];

    let emulator = start_emulator_with(&broker, |c| c.data_dir = Some(data_dir.clone())).await;
    let mut client = RawClient::connect(&broker, "raw-7").await;
    let kept = client.request(SET, &persist).await;
    let plain = encode_array(&[b"SET", b"plain", b"v"]);
    client.request(&plain, &[]).await;
    let token = Hlc::new(hlc::now_ms(), "lock").to_string();
    let fenced = encode_array(&[b"SET", b"fenced", b"v"]);
    let fenced_persist = [
        (property::PERSISTENCE, "true"),
        (property::FENCING_TOKEN, &*token),
    ];
    client.request(&fenced, &fenced_persist).await;
    let gone = encode_array(&[b"SET", b"gone", b"v"]);
    client.request(&gone, &persist).await;
    client.request(&encode_array(&[b"DEL", b"gone"]), &[]).await;
    let unpersisted = encode_array(&[b"SET", b"unpersisted", b"v1"]);
    client.request(&unpersisted, &persist).await;
    client
        .request(&encode_array(&[b"SET", b"unpersisted", b"v2"]), &[])
        .await;
    emulator.shutdown().await.unwrap();

    let _emulator = start_emulator_with(&broker, |c| c.data_dir = Some(data_dir.clone())).await;
    let reply = client.request(GET, &[]).await;
    assert_eq!(payload(&reply), b"$9\r\ntestvalue\r\n");
    assert_eq!(version(&reply), version(&kept), "the version survives too");
    for missing in [&b"plain"[..], b"gone", b"unpersisted"] {
        assert_eq!(
            payload(&client.request(&get_payload(missing), &[]).await),
            b"$-1\r\n",
            "{}",
            String::from_utf8_lossy(missing)
        );
    }
    // The fencing token survives: a write without it is refused.
    assert_eq!(
        payload(
            &client
                .request(&encode_array(&[b"DEL", b"fenced"]), &[])
                .await
        ),
        err("a fencing token is required for this request")
    );
    // New versions stay above the restored ones.
    let again = client.request(SET, &persist).await;
    assert!(version(&again) > version(&kept));
}

#[tokio::test]
async fn the_binary_serves_and_loses_no_acknowledged_write_when_killed() {
    let broker = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().display().to_string();
    let args = ["--data-dir", &*data_dir, "--client-id", "emulator-binary"];
    let mut process = EmulatorProcess::start(&broker, &args).await;
    let mut client = RawClient::connect(&broker, "raw-8").await;
    let persist = [(property::PERSISTENCE, "true")];
    let mut versions = Vec::new();
    for i in 0..50u32 {
        let key = format!("key-{i}");
        let set = encode_array(&[b"SET", key.as_bytes(), &i.to_le_bytes()]);
        let reply = client.request(&set, &persist).await;
        assert_eq!(payload(&reply), b"+OK\r\n");
        versions.push(version(&reply));
    }
    // SIGKILL right after the last reply: no shutdown path runs.
    process.kill();

    let mut process = EmulatorProcess::start(&broker, &args).await;
    for (i, version_then) in versions.iter().enumerate() {
        let key = format!("key-{i}");
        let reply = client.request(&get_payload(key.as_bytes()), &[]).await;
        let mut expected = b"$4\r\n".to_vec();
        expected.extend_from_slice(&(i as u32).to_le_bytes());
        expected.extend_from_slice(b"\r\n");
        assert_eq!(payload(&reply), expected, "{key}");
        assert_eq!(&version(&reply), version_then);
    }
    assert!(process.terminate().success(), "SIGTERM is a clean exit");
}

/// The byte offsets at which the records of a log image start (after the
/// 8-byte header; each record is `[len u32 LE][crc32 u32 LE][body]`).
fn record_offsets(image: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut pos = 8;
    while pos + 8 <= image.len() {
        offsets.push(pos);
        let len = u32::from_le_bytes(image[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 8 + len;
    }
    offsets
}

#[tokio::test]
async fn a_damaged_record_in_the_middle_of_the_log_loses_only_itself_and_is_kept_aside() {
    let broker = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().display().to_string();
    let args = ["--data-dir", &*data_dir, "--client-id", "emulator-damaged"];
    let mut process = EmulatorProcess::start(&broker, &args).await;
    let mut client = RawClient::connect(&broker, "raw-damaged").await;
    let persist = [(property::PERSISTENCE, "true")];
    for i in 0..50u32 {
        let key = format!("key-{i}");
        let set = encode_array(&[b"SET", key.as_bytes(), format!("value-{i}").as_bytes()]);
        assert_eq!(payload(&client.request(&set, &persist).await), b"+OK\r\n");
    }
    process.kill();

    // One byte flipped inside the body of record 3 of 50: its checksum fails.
    let log = dir.path().join(statestore_gateway::emulator::LOG_FILE);
    let mut image = std::fs::read(&log).unwrap();
    let offsets = record_offsets(&image);
    assert_eq!(offsets.len(), 50, "one record per SET");
    image[offsets[2] + 12] ^= 0x40;
    std::fs::write(&log, &image).unwrap();

    let mut process = EmulatorProcess::start(&broker, &args).await;
    for i in 0..50u32 {
        let key = format!("key-{i}");
        let reply = payload(&client.request(&get_payload(key.as_bytes()), &[]).await).to_vec();
        if i == 2 {
            assert_eq!(reply, b"$-1\r\n", "the damaged record is not replayed");
        } else {
            let value = format!("value-{i}");
            let expected = format!("${}\r\n{value}\r\n", value.len());
            assert_eq!(reply, expected.as_bytes(), "{key} survives the damage");
        }
    }
    // The damaged file is kept, byte for byte, beside the log.
    let copies: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("statestore.log.damaged"))
        })
        .collect();
    assert_eq!(copies.len(), 1, "one copy of the damaged log: {copies:?}");
    assert_eq!(std::fs::read(&copies[0]).unwrap(), image);
    // Writes after the repair persist as usual, and the next start finds a
    // clean log (no second copy).
    let set = encode_array(&[b"SET", b"after", b"v"]);
    assert_eq!(payload(&client.request(&set, &persist).await), b"+OK\r\n");
    assert!(process.terminate().success());
    let _process = EmulatorProcess::start(&broker, &args).await;
    assert_eq!(
        payload(&client.request(&get_payload(b"after"), &[]).await),
        b"$1\r\nv\r\n"
    );
    assert_eq!(
        payload(&client.request(&get_payload(b"key-49"), &[]).await),
        b"$8\r\nvalue-49\r\n"
    );
    let copies = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("statestore.log.damaged")
        })
        .count();
    assert_eq!(copies, 1);
}

#[tokio::test]
async fn the_client_id_falls_back_to_the_response_topic() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "no-src-id").await;
    let mut properties = client.envelope(&[]);
    properties
        .user_properties
        .retain(|(name, _)| name != property::SOURCE_ID);
    let correlation = properties.correlation_data.clone().unwrap();
    client
        .publish(KEYNOTIFY, properties, QoS::AtLeastOnce)
        .await;
    assert_eq!(
        payload(&client.reply_to(&correlation, WAIT).await.unwrap()),
        b"+OK\r\n"
    );
    client.request(SET, &[]).await;
    let notification = client.next_notification(WAIT).await.expect("notification");
    assert_eq!(
        notification.topic,
        notify_topic("no-src-id", b"testkey").as_bytes()
    );
}

#[tokio::test]
async fn pipelined_requests_are_all_answered_in_order() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-9").await;
    let mut correlations = Vec::new();
    for i in 0..500u32 {
        let set = encode_array(&[b"SET", b"counter", i.to_string().as_bytes()]);
        correlations.push(client.send(&set, &[]).await);
    }
    let mut last = None;
    for correlation in &correlations {
        let reply = client
            .reply_to(correlation, WAIT)
            .await
            .expect("every reply");
        assert_eq!(payload(&reply), b"+OK\r\n");
        let v = version(&reply);
        assert!(v > last, "versions grow in request order");
        last = v;
    }
    let reply = client.request(&get_payload(b"counter"), &[]).await;
    assert_eq!(payload(&reply), b"$3\r\n499\r\n");
}

/// Requests the emulator cannot queue are refused and acknowledged: an
/// unacknowledged QoS 1 request holds one of the broker's in-flight slots
/// to the emulator for good, and once the receive maximum (1,024) is used
/// up that way the broker sends it nothing any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_dropped_on_a_full_queue_are_refused_and_acknowledged() {
    let broker = Mosquitto::start().await;
    // A queue of one request: a burst overflows it for sure.
    let _emulator = start_emulator_with(&broker, |config| config.request_queue = 1).await;
    let mut client = RawClient::connect(&broker, "raw-overflow").await;
    let mut waiting = std::collections::HashSet::new();
    for i in 0..3_000u32 {
        let set = encode_array(&[b"SET", b"burst", i.to_string().as_bytes()]);
        waiting.insert(client.send(&set, &[]).await);
    }
    let (mut served, mut refused) = (0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !waiting.is_empty() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Some(reply) = client.next_reply(left).await else {
            panic!(
                "{} of 3,000 requests got no reply ({served} served, {refused} refused)",
                waiting.len()
            );
        };
        let correlation = reply.properties.as_ref().unwrap().correlation_data.clone();
        assert!(
            waiting.remove(&correlation.unwrap()),
            "one reply per request"
        );
        match user_property(&reply, property::STATUS) {
            Some("200") => served += 1,
            Some("503") => {
                refused += 1;
                assert!(payload(&reply).is_empty());
                assert!(user_property(&reply, property::STATUS_MESSAGE).is_some());
            }
            other => panic!("status {other:?}"),
        }
    }
    assert!(
        refused > 0,
        "the queue never overflowed: the test proves nothing"
    );
    eprintln!("burst of 3,000 over a queue of 1: {served} served, {refused} refused");
    // The broker still sends requests: none holds an in-flight slot.
    let reply = client.request(&get_payload(b"burst"), &[]).await;
    assert_eq!(user_property(&reply, property::STATUS), Some("200"));
}

#[tokio::test]
async fn the_emulator_serves_again_after_the_broker_restarts() {
    let mut broker = Mosquitto::start().await;
    let emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-10").await;
    assert_eq!(payload(&client.request(SET, &[]).await), b"+OK\r\n");
    drop(client);

    broker.restart().await;
    // The emulator reconnects and subscribes again by itself; the store
    // (in memory, in the emulator) is intact.
    let mut client = RawClient::connect(&broker, "raw-10").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let correlation = client.send(GET, &[]).await;
        if let Some(reply) = client
            .reply_to(&correlation, Duration::from_millis(500))
            .await
        {
            assert_eq!(payload(&reply), b"$9\r\ntestvalue\r\n");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reply 10 s after the broker restarted"
        );
    }
    emulator.shutdown().await.unwrap();
}

#[tokio::test]
async fn start_fails_clearly_when_no_broker_listens() {
    let port = crate::support::free_port();
    let mut config = statestore_gateway::emulator::EmulatorConfig::new("127.0.0.1", port);
    config.startup_timeout = Duration::from_millis(500);
    let error = statestore_gateway::emulator::Emulator::start(config)
        .await
        .expect_err("nothing to connect to");
    let text = error.to_string();
    assert!(text.contains("not connected and subscribed"), "{text}");
    assert!(
        text.contains("refused") || text.contains("onnection"),
        "{text}"
    );
}

#[test]
fn the_binary_refuses_bad_settings_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.json");
    std::fs::write(&acl, r#"{ "app": { "read": "not-a-list" } }"#).unwrap();
    let cases: [(Vec<String>, &str); 3] = [
        (
            vec!["--acl".into(), acl.display().to_string()],
            "access list is not valid",
        ),
        (
            vec![
                "--acl".into(),
                dir.path().join("missing.json").display().to_string(),
            ],
            "missing.json",
        ),
        (vec!["--broker".into(), "no-port".into()], "HOST:PORT"),
    ];
    for (args, expected) in cases {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_statestore-gateway"))
            .arg("emulator")
            .args(&args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn a_request_larger_than_the_emulators_packet_limit_does_not_disturb_it() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let mut client = RawClient::connect(&broker, "raw-11").await;
    // The emulator advertises a 16 MiB maximum packet size, so the broker
    // drops this request instead of sending it (as the AIO broker would).
    let value = vec![b'x'; statestore_gateway::mqtt::MAX_PACKET_SIZE as usize];
    let huge = encode_array(&[b"SET", b"huge", &value]);
    let correlation = client.send(&huge, &[]).await;
    assert!(
        client
            .reply_to(&correlation, Duration::from_secs(2))
            .await
            .is_none()
    );
    // A value just inside the limit is stored and read back.
    let large = vec![b'y'; 8 * 1024 * 1024];
    let set = encode_array(&[b"SET", b"large", &large]);
    assert_eq!(payload(&client.request(&set, &[]).await), b"+OK\r\n");
    let reply = client.request(&get_payload(b"large"), &[]).await;
    let header = format!("${}\r\n", large.len());
    assert!(reply.payload.starts_with(header.as_bytes()));
    assert_eq!(reply.payload.len(), header.len() + large.len() + 2);
    assert_eq!(payload(&client.request(GET, &[]).await), b"$-1\r\n");
}

#[tokio::test]
async fn an_emulator_process_dies_with_its_handle() {
    let broker = Mosquitto::start().await;
    let process = EmulatorProcess::start(&broker, &[]).await;
    let proc_dir = std::path::PathBuf::from(format!("/proc/{}", process.pid()));
    assert!(proc_dir.exists());
    drop(process);
    // Killed and reaped: not even a zombie is left.
    assert!(!proc_dir.exists(), "{} still runs", proc_dir.display());
}
