//! SCAN against the emulator over mosquitto: the official client's
//! `list_keys` (1.5.0-beta1) as the peer, the payloads it sends compared
//! byte for byte with our codec, and raw requests for what the SDK never
//! sends (bad input, forged tokens) and for page sizes.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::collections::BTreeSet;
use std::time::Duration;

use azure_iot_operations_services::state_store::{self, ErrorKind, SetOptions};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use statestore_gateway::emulator::ScanLimits;
use statestore_gateway::protocol::glob;
use statestore_gateway::protocol::{
    KeyPage, REQUEST_TOPIC, Request, ScanReply, StoreError, response_topic,
};

use crate::support::emulator::{RawClient, WAIT, start_emulator_with};
use crate::support::sdk::SdkClient;
use crate::support::{Mosquitto, MosquittoConfig};

const TIMEOUT: Duration = Duration::from_secs(5);

fn small_pages(max_keys: usize) -> ScanLimits {
    ScanLimits {
        max_keys,
        ..ScanLimits::default()
    }
}

async fn sdk_set(client: &state_store::Client, key: &[u8], options: SetOptions) {
    let set = client
        .set(key.to_vec(), b"v".to_vec(), TIMEOUT, None, options)
        .await
        .unwrap();
    assert!(set.response, "SET {key:?} applied");
}

/// Every page `list_keys` returns for `pattern`.
async fn sdk_pages(client: &state_store::Client, pattern: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut pager = client.list_keys(pattern.to_vec(), TIMEOUT).unwrap();
    let mut pages = Vec::new();
    while let Some(keys) = pager.next().await.unwrap() {
        pages.push(keys);
        assert!(pages.len() < 10_000, "the listing does not end");
    }
    pages
}

async fn sdk_list(client: &state_store::Client, pattern: &[u8]) -> Vec<Vec<u8>> {
    sdk_pages(client, pattern).await.concat()
}

/// One SCAN sent raw; its reply decoded with our codec.
async fn raw_scan(
    raw: &mut RawClient,
    pattern: &[u8],
    token: Option<&Bytes>,
) -> (ScanReply, usize) {
    let request = Request::Scan {
        pattern: Bytes::copy_from_slice(pattern),
        token: token.cloned(),
    };
    let reply = raw.request(&request.encode(), &[]).await;
    (
        ScanReply::decode(&reply.payload).unwrap(),
        reply.payload.len(),
    )
}

fn page(reply: ScanReply) -> KeyPage {
    match reply {
        ScanReply::Page(page) => page,
        ScanReply::Error(error) => panic!("not a page: {error}"),
    }
}

#[tokio::test]
async fn official_client_lists_every_key_once_over_many_pages() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator_with(&broker, |c| c.scan_limits = small_pages(7)).await;
    let sdk = SdkClient::connect(broker.port(), "sdk-scan-pages");
    let mut written = BTreeSet::new();
    for i in 0..100 {
        let key = format!("sensor/{i:03}").into_bytes();
        sdk_set(&sdk.client, &key, SetOptions::default()).await;
        written.insert(key);
    }
    for key in [&b"\x00\xff\r\n$1"[..], b"\xc3\x28", b"sensor/\xff"] {
        sdk_set(&sdk.client, key, SetOptions::default()).await;
        written.insert(key.to_vec());
    }

    let pages = sdk_pages(&sdk.client, b"*").await;
    assert!(pages.len() >= 15, "{} pages of at most 7 keys", pages.len());
    assert!(pages.iter().all(|page| page.len() <= 7));
    let listed = pages.concat();
    assert_eq!(
        listed,
        written.iter().cloned().collect::<Vec<_>>(),
        "each key once, in byte order"
    );

    let sensors = sdk_list(&sdk.client, b"sensor/*").await;
    assert_eq!(sensors.len(), 101);
    assert!(sensors.iter().all(|key| key.starts_with(b"sensor/")));
    sdk.close().await;
}

#[tokio::test]
async fn official_client_lists_with_glob_patterns_binary_keys_and_escapes() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator_with(&broker, |c| c.scan_limits = small_pages(3)).await;
    let sdk = SdkClient::connect(broker.port(), "sdk-scan-globs");
    let keys: [&[u8]; 10] = [
        b"room1/temp",
        b"room2/temp",
        b"roomA/temp",
        b"room1/hum",
        b"room*/temp",
        b"room?/temp",
        b"room[1]/temp",
        b"bin\x00\x01",
        b"bin\xff\xfe",
        b"other",
    ];
    for key in keys {
        sdk_set(&sdk.client, key, SetOptions::default()).await;
    }
    let cases: [(&[u8], &[&[u8]]); 9] = [
        (
            b"room?/temp",
            &[
                b"room*/temp",
                b"room1/temp",
                b"room2/temp",
                b"room?/temp",
                b"roomA/temp",
            ],
        ),
        (
            b"room[0-9]/*",
            &[b"room1/hum", b"room1/temp", b"room2/temp"],
        ),
        (
            b"room[^0-9]/temp",
            &[b"room*/temp", b"room?/temp", b"roomA/temp"],
        ),
        (b"room[12]/temp", &[b"room1/temp", b"room2/temp"]),
        (b"room\\*/temp", &[b"room*/temp"]),
        (b"room\\?/*", &[b"room?/temp"]),
        (b"room\\[1]/temp", &[b"room[1]/temp"]),
        (b"bin[\x00-\x7f]*", &[b"bin\x00\x01"]),
        (b"bin?\xfe", &[b"bin\xff\xfe"]),
    ];
    for (pattern, expected) in cases {
        let listed = sdk_list(&sdk.client, pattern).await;
        let expected: Vec<Vec<u8>> = expected.iter().map(|key| key.to_vec()).collect();
        assert_eq!(
            listed,
            expected,
            "pattern {:?}",
            String::from_utf8_lossy(pattern)
        );
        // The matcher the emulator uses agrees with the listing.
        let by_glob: Vec<Vec<u8>> = {
            let mut all: Vec<Vec<u8>> = keys.iter().map(|key| key.to_vec()).collect();
            all.sort();
            all.into_iter()
                .filter(|key| glob::matches(pattern, key))
                .collect()
        };
        assert_eq!(listed, by_glob);
    }
    assert!(sdk_list(&sdk.client, b"nothing*").await.is_empty());
    // The SDK itself refuses an empty pattern.
    assert!(matches!(
        sdk.client
            .list_keys(Vec::new(), TIMEOUT)
            .map(|_| ())
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument(_)
    ));
    sdk.close().await;
}

#[tokio::test]
async fn deleted_and_expired_keys_are_not_listed() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator_with(&broker, |c| c.scan_limits = small_pages(2)).await;
    let sdk = SdkClient::connect(broker.port(), "sdk-scan-gone");
    for key in [b"k1", b"k2", b"k3", b"k4"] {
        sdk_set(&sdk.client, key, SetOptions::default()).await;
    }
    let short = SetOptions {
        expires: Some(Duration::from_millis(200)),
        ..SetOptions::default()
    };
    sdk_set(&sdk.client, b"k5", short).await;
    assert_eq!(sdk_list(&sdk.client, b"k*").await.len(), 5);
    assert_eq!(
        sdk.client
            .del(b"k2".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        sdk_list(&sdk.client, b"k*").await,
        [b"k1".to_vec(), b"k3".to_vec(), b"k4".to_vec()]
    );
    sdk.close().await;
}

/// What the SDK publishes for SCAN, recorded by a subscriber to the
/// request topic, equals our encoding; the emulator's replies it got
/// decode with our codec, and it sends their tokens back verbatim.
#[tokio::test]
async fn the_sdks_scan_payloads_equal_our_encoding() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator_with(&broker, |c| c.scan_limits = small_pages(2)).await;
    let sdk = SdkClient::connect(broker.port(), "sdk-scan-wire");
    for key in [&b"key1"[..], b"key2", b"key3", b"other"] {
        sdk_set(&sdk.client, key, SetOptions::default()).await;
    }
    let mut spy = RawClient::connect(&broker, "scan-spy").await;
    for filter in [REQUEST_TOPIC.to_owned(), response_topic("sdk-scan-wire")] {
        spy.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .unwrap();
    }
    // Our own request coming back proves the subscriptions are in place.
    spy.send(b"*2\r\n$3\r\nGET\r\n$5\r\nready\r\n", &[]).await;
    let echo = spy.next_notification(WAIT).await.expect("own request seen");
    assert_eq!(echo.topic, REQUEST_TOPIC.as_bytes());

    let pattern = b"key*";
    let listed = sdk_list(&sdk.client, pattern).await;
    assert_eq!(
        listed,
        [b"key1".to_vec(), b"key2".to_vec(), b"key3".to_vec()]
    );

    let mut token = None;
    let mut scans = 0;
    loop {
        let sent = spy.next_notification(WAIT).await.expect("the SDK's SCAN");
        if sent.topic != REQUEST_TOPIC.as_bytes() || !sent.payload.starts_with(b"*") {
            continue;
        }
        let expected = Request::Scan {
            pattern: Bytes::from_static(pattern),
            token: token.clone(),
        };
        assert_eq!(
            sent.payload,
            Bytes::from(expected.encode()),
            "SCAN #{scans}: {:?}",
            String::from_utf8_lossy(&sent.payload)
        );
        scans += 1;
        let reply = spy
            .next_notification(WAIT)
            .await
            .expect("the emulator's reply");
        assert_eq!(reply.topic, response_topic("sdk-scan-wire").as_bytes());
        token = page(ScanReply::decode(&reply.payload).unwrap()).token;
        if token.is_none() {
            break;
        }
    }
    assert_eq!(
        scans, 2,
        "pages of two: key1 key2 | key3 (the next key, other, ends it)"
    );
    // The first page's exact bytes, the shape of the SDK vector in docs/protocol.md.
    assert_eq!(
        Request::Scan {
            pattern: Bytes::from_static(pattern),
            token: None
        }
        .encode(),
        b"*2\r\n$4\r\nSCAN\r\n$4\r\nkey*\r\n"
    );
    sdk.close().await;
}

#[tokio::test]
async fn pages_fit_the_brokers_maximum_packet_size() {
    let broker = Mosquitto::start_with(MosquittoConfig {
        extra: "max_packet_size 2048\n".into(),
        ..MosquittoConfig::default()
    })
    .await;
    let _emulator = start_emulator_with(&broker, |_| {}).await;
    let sdk = SdkClient::connect(broker.port(), "sdk-scan-big");
    let mut written = Vec::new();
    for i in 0..40 {
        let key = format!("big/{i:02}/{}", "x".repeat(200)).into_bytes();
        sdk_set(&sdk.client, &key, SetOptions::default()).await;
        written.push(key);
    }
    // 40 keys of ~210 bytes fit no 2 KiB packet at once.
    let pages = sdk_pages(&sdk.client, b"big/*").await;
    assert!(pages.len() >= 5, "{} pages", pages.len());
    assert_eq!(pages.concat(), written);

    let mut raw = RawClient::connect(&broker, "scan-raw-big").await;
    let mut token = None;
    let mut listed = 0;
    loop {
        let (reply, size) = raw_scan(&mut raw, b"*", token.as_ref()).await;
        assert!(size <= 2048 - 128, "a {size}-byte reply");
        let page = page(reply);
        listed += page.keys.len();
        token = page.token;
        if token.is_none() {
            break;
        }
    }
    assert_eq!(listed, 40);
    sdk.close().await;
}

#[tokio::test]
async fn bad_scans_get_error_replies() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator_with(&broker, |_| {}).await;
    let mut raw = RawClient::connect(&broker, "scan-raw-bad").await;
    raw.request(
        &Request::Set {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            options: Default::default(),
        }
        .encode(),
        &[],
    )
    .await;
    let cases: [(&[u8], StoreError); 5] = [
        (b"*1\r\n$4\r\nSCAN\r\n", StoreError::WrongNumberOfArguments),
        (b"*2\r\n$4\r\nSCAN\r\n$0\r\n\r\n", StoreError::SyntaxError),
        (
            b"*3\r\n$4\r\nSCAN\r\n$1\r\n*\r\n$6\r\nforged\r\n",
            StoreError::SyntaxError,
        ),
        (
            b"*3\r\n$4\r\nSCAN\r\n$1\r\n*\r\n$3\r\n1;k\r\n",
            StoreError::SyntaxError,
        ),
        (
            b"*4\r\n$4\r\nSCAN\r\n$1\r\n*\r\n$1\r\nt\r\n$1\r\nx\r\n",
            StoreError::WrongNumberOfArguments,
        ),
    ];
    for (payload, expected) in cases {
        let reply = raw.request(payload, &[]).await;
        assert_eq!(
            ScanReply::decode(&reply.payload),
            Ok(ScanReply::Error(expected)),
            "{}",
            String::from_utf8_lossy(payload)
        );
    }
    // Still serving.
    let (reply, _) = raw_scan(&mut raw, b"*", None).await;
    assert_eq!(page(reply).keys, [Bytes::from_static(b"k")]);
}

/// A listing started before a restart of an emulator with a data
/// directory goes on after it with the token it had.
#[tokio::test]
async fn a_listing_survives_a_restart_with_a_data_directory() {
    let broker = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    let configure = |c: &mut statestore_gateway::emulator::EmulatorConfig| {
        c.data_dir = Some(dir.path().to_owned());
        c.scan_limits = small_pages(2);
    };
    let emulator = start_emulator_with(&broker, configure).await;
    let sdk = SdkClient::connect(broker.port(), "sdk-scan-restart");
    let persisted = SetOptions {
        persist: true,
        ..SetOptions::default()
    };
    for key in [b"p1", b"p2", b"p3", b"p4", b"p5"] {
        sdk_set(&sdk.client, key, persisted.clone()).await;
    }
    sdk.close().await;
    let mut raw = RawClient::connect(&broker, "scan-raw-restart").await;
    let first = page(raw_scan(&mut raw, b"p*", None).await.0);
    assert_eq!(
        first.keys,
        [Bytes::from_static(b"p1"), Bytes::from_static(b"p2")]
    );
    emulator.shutdown().await.unwrap();

    let _emulator = start_emulator_with(&broker, configure).await;
    let mut keys = first.keys;
    let mut token = first.token;
    while let Some(next) = token {
        let page = page(raw_scan(&mut raw, b"p*", Some(&next)).await.0);
        keys.extend(page.keys);
        token = page.token;
    }
    let expected: Vec<Bytes> = ["p1", "p2", "p3", "p4", "p5"]
        .into_iter()
        .map(|key| Bytes::from(key.as_bytes()))
        .collect();
    assert_eq!(keys, expected);
}
