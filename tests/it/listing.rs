//! `GET /keys?match=` over real TCP: mosquitto, the emulator with small
//! SCAN pages (so one response takes several SCANs and cursors land inside
//! store pages), the gateway; and the official client as the peer that
//! writes keys and whose SCAN bytes the gateway's must equal.

use std::collections::BTreeSet;
use std::time::Duration;

use azure_iot_operations_services::state_store::SetOptions;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64URL};
use bytes::Bytes;
use reqwest::header;
use rumqttc::v5::mqttbytes::QoS;
use serde_json::Value;
use sha2::{Digest, Sha256};
use statestore_gateway::emulator::ScanLimits;
use statestore_gateway::protocol::{REQUEST_TOPIC, Request};

use crate::support::emulator::{RawClient, WAIT};
use crate::support::gateway::{Gateway, GatewayOptions, Stack, encode};
use crate::support::sdk::SdkClient;

/// An emulator whose SCAN pages hold `max_keys` keys.
async fn stack_with_pages(max_keys: usize) -> Stack {
    Stack::builder()
        .emulator(move |config| {
            config.scan_limits = ScanLimits {
                max_keys,
                ..ScanLimits::default()
            }
        })
        .start()
        .await
}

async fn put(gateway: &Gateway, key: &[u8]) {
    let response = gateway
        .http
        .put(gateway.key(key))
        .body("1")
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "PUT {key:?}: {response:?}");
}

async fn json(response: reqwest::Response) -> Value {
    let bytes = response.bytes().await.unwrap();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|error| panic!("not JSON ({error}): {}", String::from_utf8_lossy(&bytes)))
}

/// The keys of one JSON page, as bytes: from `key_base64`, or from `key`
/// in an entry without it (`key_base64=if_not_utf8`).
fn keys_of(page: &Value) -> Vec<Vec<u8>> {
    page["keys"]
        .as_array()
        .expect("a keys array")
        .iter()
        .map(|entry| match entry.get("key_base64") {
            Some(base64) => BASE64.decode(base64.as_str().unwrap()).unwrap(),
            None => entry["key"]
                .as_str()
                .expect("a text key")
                .as_bytes()
                .to_vec(),
        })
        .collect()
}

/// The most bytes a `next` cursor or a `Link` (with a short `match`) has,
/// whatever the key lengths.
const SMALL: usize = 8 * 1024;

/// Follows `Link: <...>; rel="next"` from `path` to the end; every page's
/// keys in order, and how many responses it took. Every cursor and `Link`
/// on the way is under [`SMALL`].
async fn list_all(gateway: &Gateway, path: &str) -> (Vec<Vec<u8>>, usize) {
    let mut next = Some(path.to_owned());
    let (mut keys, mut responses) = (Vec::new(), 0);
    while let Some(path) = next.take() {
        let response = gateway.http.get(gateway.url(&path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{} bytes: {path:.200}", path.len());
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let link = response
            .headers()
            .get(header::LINK)
            .map(|value| value.to_str().unwrap().to_owned());
        let page = json(response).await;
        if path.contains("key_base64=if_not_utf8") {
            for entry in page["keys"].as_array().unwrap() {
                assert_eq!(
                    entry.get("key_base64").is_some(),
                    entry["key"].is_null(),
                    "{path:.200}: {entry}"
                );
            }
        }
        keys.extend(keys_of(&page));
        responses += 1;
        match (&page["next"], link) {
            (Value::Null, None) => {}
            (Value::String(cursor), Some(link)) => {
                assert!(cursor.len() < SMALL, "next is {} bytes", cursor.len());
                assert!(link.len() < SMALL, "Link is {} bytes", link.len());
                let target = link
                    .strip_prefix('<')
                    .and_then(|rest| rest.strip_suffix(">; rel=\"next\""))
                    .unwrap_or_else(|| panic!("a next link: {link}"));
                assert!(target.ends_with(&format!("&cursor={cursor}")), "{link}");
                next = Some(target.to_owned());
            }
            (next, link) => panic!("next {next} and Link {link:?} disagree"),
        }
        assert!(responses < 1_000, "the listing does not end");
    }
    (keys, responses)
}

#[tokio::test]
async fn a_chain_of_pages_lists_every_matching_key_once() {
    // Store pages of 7 keys, responses of 10: most cursors point inside a
    // store page that was only partly returned.
    let stack = stack_with_pages(7).await;
    let gw = &stack.gateway;
    let mut expected = BTreeSet::new();
    for n in 0..53 {
        let key = format!("sensor/{n:02}").into_bytes();
        put(gw, &key).await;
        expected.insert(key);
    }
    for other in ["sensors", "other/1", "sensor"] {
        put(gw, other.as_bytes()).await;
    }

    let (keys, responses) = list_all(gw, "/keys?match=sensor%2F*&limit=10").await;
    assert_eq!(keys.len(), 53, "no key repeated");
    assert_eq!(keys.iter().cloned().collect::<BTreeSet<_>>(), expected);
    assert_eq!(responses, 6, "five full pages of ten and one of three");

    for limit in [1, 3, 7, 14, 1000] {
        let (keys, _) = list_all(gw, &format!("/keys?match=sensor/*&limit={limit}")).await;
        assert_eq!(keys.len(), 53, "limit {limit}");
        assert_eq!(keys.into_iter().collect::<BTreeSet<_>>(), expected);
    }

    // Without `match`, every key; `?` and `[...]` are globs.
    let (all, _) = list_all(gw, "/keys").await;
    assert_eq!(all.len(), 56);
    let (some, _) = list_all(gw, "/keys?match=sensor/0%3F").await;
    assert_eq!(some.len(), 10);
    let (ranged, _) = list_all(gw, "/keys?match=sensor/[1-2]5").await;
    assert_eq!(ranged, [b"sensor/15".to_vec(), b"sensor/25".to_vec()]);

    // A page that stops exactly where the store's listing ends has no next.
    let (none, responses) = list_all(gw, "/keys?match=nothing*").await;
    assert!(none.is_empty());
    assert_eq!(responses, 1);
}

#[tokio::test]
async fn binary_keys_list_as_base64_and_text_lines_escape_them() {
    let stack = stack_with_pages(1_000).await;
    let gw = &stack.gateway;
    for key in [
        &b"bin/\xff\x00"[..],
        b"bin/a b",
        "bin/é%".as_bytes(),
        b"bin/x\ny",
        "bin/\u{2028}\u{2029}\u{feff}".as_bytes(),
    ] {
        put(gw, key).await;
    }
    let response = gw
        .http
        .get(gw.url("/keys?match=bin/*"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
    let page = json(response).await;
    assert_eq!(page["next"], Value::Null);
    let entries = page["keys"].as_array().unwrap();
    let by_base64 = |key: &[u8]| {
        entries
            .iter()
            .find(|entry| entry["key_base64"] == BASE64.encode(key))
            .unwrap_or_else(|| panic!("{key:?} listed: {page}"))
            .clone()
    };
    assert_eq!(by_base64(b"bin/\xff\x00")["key"], Value::Null);
    assert_eq!(by_base64(b"bin/a b")["key"], "bin/a b");
    assert_eq!(by_base64("bin/é%".as_bytes())["key"], "bin/é%");

    let response = gw
        .http
        .get(gw.url("/keys?match=bin%2F*"))
        .header(header::ACCEPT, "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/plain; charset=utf-8"
    );
    let text = response.text().await.unwrap();
    // Byte order, as the emulator lists.
    // Line and paragraph separators and the byte-order mark break lines
    // (or vanish) in many tools: escaped like control characters.
    assert_eq!(
        text,
        "bin/a b\nbin/x%0Ay\nbin/é%25\nbin/%E2%80%A8%E2%80%A9%EF%BB%BF\nbin/%FF%00\n"
    );
}

/// The negotiated form without base64 for text keys lists exactly the keys
/// the default form lists, across a chain of pages whose links keep it;
/// `key_base64=always` is the default document.
#[tokio::test]
async fn key_base64_if_not_utf8_carries_each_key_once_across_the_chain() {
    let stack = stack_with_pages(7).await;
    let gw = &stack.gateway;
    let mut expected = BTreeSet::new();
    for n in 0..20 {
        expected.insert(format!("c/{n:02}").into_bytes());
    }
    for key in [
        &b"c/\xff\x00"[..],
        b"c/\xc3",
        "c/é%".as_bytes(),
        b"c/q\"uote\\",
        b"c/x\ny",
    ] {
        expected.insert(key.to_vec());
    }
    for key in &expected {
        put(gw, key).await;
    }
    let (default, _) = list_all(gw, "/keys?match=c/*&limit=6").await;
    let (always, _) = list_all(gw, "/keys?match=c/*&limit=6&key_base64=always").await;
    let (once, responses) = list_all(gw, "/keys?match=c/*&limit=6&key_base64=if_not_utf8").await;
    assert_eq!(responses, 5, "four pages of six and one of one");
    assert_eq!(default, always);
    assert_eq!(once, default, "the same keys in the same order");
    assert_eq!(once.into_iter().collect::<BTreeSet<_>>(), expected);

    let page = json(
        gw.http
            .get(gw.url("/keys?match=c/*&limit=3&key_base64=if_not_utf8"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        page["keys"],
        serde_json::json!([{"key": "c/00"}, {"key": "c/01"}, {"key": "c/02"}])
    );

    // With values too: the key once, the value as always.
    let response = gw
        .http
        .get(gw.url("/keys?match=c/*&limit=30&values=true&key_base64=if_not_utf8"))
        .send()
        .await
        .unwrap();
    let page = json(response).await;
    let entries = page["keys"].as_array().unwrap();
    assert_eq!(entries.len(), expected.len());
    for entry in entries {
        assert_eq!(entry["value"], "1", "{entry}");
        assert_eq!(entry["value_base64"], "MQ==", "{entry}");
        assert_eq!(
            entry.get("key_base64").is_some(),
            entry["key"].is_null(),
            "{entry}"
        );
    }
    let binary = entries
        .iter()
        .find(|entry| entry["key_base64"] == BASE64.encode(b"c/\xff\x00"))
        .expect("the binary key listed");
    let fields: BTreeSet<&str> = binary
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        BTreeSet::from(["key", "key_base64", "value", "value_base64", "version"])
    );
    assert_eq!(binary["key"], Value::Null);
}

#[tokio::test]
async fn text_pages_carry_the_next_link() {
    let stack = stack_with_pages(4).await;
    let gw = &stack.gateway;
    for n in 0..5 {
        put(gw, format!("t/{n}").as_bytes()).await;
    }
    let response = gw
        .http
        .get(gw.url("/keys?match=t/*&limit=3"))
        .header(header::ACCEPT, "text/plain")
        .send()
        .await
        .unwrap();
    let link = response.headers()[header::LINK]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(response.text().await.unwrap(), "t/0\nt/1\nt/2\n");
    let target = link
        .strip_prefix("</keys?match=t/*&limit=3&cursor=")
        .and_then(|rest| rest.strip_suffix(">; rel=\"next\""))
        .unwrap_or_else(|| panic!("{link}"));
    let response = gw
        .http
        .get(gw.url(&format!("/keys?match=t/*&limit=3&cursor={target}")))
        .header(header::ACCEPT, "text/plain")
        .send()
        .await
        .unwrap();
    assert!(response.headers().get(header::LINK).is_none());
    assert_eq!(response.text().await.unwrap(), "t/3\nt/4\n");
}

async fn problem(gw: &Gateway, path: &str, kind: &str) -> Value {
    let response = gw.http.get(gw.url(path)).send().await.unwrap();
    assert_eq!(response.status(), 400, "{path}");
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body = json(response).await;
    assert_eq!(body["type"], kind, "{path}: {body}");
    body
}

#[tokio::test]
async fn bad_listing_requests_are_400_problems() {
    let stack = stack_with_pages(2).await;
    let gw = &stack.gateway;
    for n in 0..5 {
        put(gw, format!("k{n}").as_bytes()).await;
    }
    for path in [
        "/keys?match=",
        "/keys?limit=0",
        "/keys?limit=10001",
        "/keys?limit=ten",
        "/keys?limit=-1",
        "/keys?match=*&match=k*",
        "/keys?pattern=k*",
        "/keys?key_base64=never",
        "/keys?key_base64=",
        "/keys?key_base64=always&key_base64=if_not_utf8",
    ] {
        problem(gw, path, "/problems/invalid-query").await;
    }
    // key_base64 shapes JSON entries: the text form refuses it.
    let response = gw
        .http
        .get(gw.url("/keys?key_base64=if_not_utf8"))
        .header(header::ACCEPT, "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body = json(response).await;
    assert_eq!(body["type"], "/problems/invalid-query", "{body}");
    problem(gw, "/keys?match=%zz", "/problems/bad-percent-encoding").await;
    for cursor in ["garbage!", "AAAA", "", "%00"] {
        problem(
            gw,
            &format!("/keys?cursor={cursor}"),
            "/problems/invalid-cursor",
        )
        .await;
    }

    // A cursor of one listing used with another match.
    let first = json(
        gw.http
            .get(gw.url("/keys?match=k*&limit=1"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let cursor = first["next"].as_str().unwrap();
    let body = problem(
        gw,
        &format!("/keys?match=j*&cursor={cursor}"),
        "/problems/invalid-cursor",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("another match"));

    // A well-formed cursor whose store token the store did not issue:
    // version 2, skip 0, a 4-byte token, no last key, the pattern's SHA-256.
    let mut forged = vec![2, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0];
    forged.extend_from_slice(b"x;k0");
    forged.extend_from_slice(&Sha256::digest(b"k*"));
    let body = problem(
        gw,
        &format!("/keys?match=k*&cursor={}", BASE64URL.encode(forged)),
        "/problems/invalid-cursor",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("state store"));

    // Other methods on the listing.
    let response = gw.http.post(gw.url("/keys")).send().await.unwrap();
    assert_eq!(response.status(), 405);
}

#[tokio::test]
async fn listing_metrics_label_the_op_scan() {
    let stack = stack_with_pages(3).await;
    let gw = &stack.gateway;
    for n in 0..7 {
        put(gw, format!("m/{n}").as_bytes()).await;
    }
    let (keys, _) = list_all(gw, "/keys?match=m/*").await;
    assert_eq!(keys.len(), 7);
    let metrics = gw
        .http
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |prefix: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{prefix} in:\n{metrics}"))
    };
    // Seven keys in pages of three: three SCANs.
    assert_eq!(
        count(
            "statestore_gateway_store_request_duration_seconds_count{op=\"SCAN\",outcome=\"ok\"}"
        ),
        3.0
    );
    assert_eq!(
        count(
            "statestore_gateway_http_requests_total{method=\"GET\",route=\"/keys\",status=\"200\"}"
        ),
        1.0
    );
}

/// The gateway lists what the official client wrote, and the SCAN payloads
/// it sends for a pattern are byte for byte those the official client's
/// `list_keys` sends for it (tokens included, the store being the same).
#[tokio::test]
async fn the_gateway_lists_what_the_sdk_wrote_with_the_sdks_scan_bytes() {
    let stack = stack_with_pages(3).await;
    let gw = &stack.gateway;
    let sdk = SdkClient::connect(stack.broker.port(), "sdk-listing");
    let mut written = BTreeSet::new();
    for n in 0..8 {
        let key = format!("room/{n}/temp").into_bytes();
        let set = sdk
            .client
            .set(
                key.clone(),
                b"21".to_vec(),
                Duration::from_secs(5),
                None,
                SetOptions::default(),
            )
            .await
            .unwrap();
        assert!(set.response);
        written.insert(key);
    }
    sdk.client
        .set(
            b"room/\xfe".to_vec(),
            b"x".to_vec(),
            Duration::from_secs(5),
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    written.insert(b"room/\xfe".to_vec());

    let mut spy = RawClient::connect(&stack.broker, "listing-spy").await;
    spy.client
        .subscribe(REQUEST_TOPIC, QoS::AtLeastOnce)
        .await
        .unwrap();
    spy.send(
        &Request::Get {
            key: Bytes::from_static(b"ready"),
        }
        .encode(),
        &[],
    )
    .await;
    spy.next_notification(WAIT).await.expect("own request seen");
    let pattern = b"room/*";
    let scans = |spy: &mut RawClient| {
        let mut payloads = Vec::new();
        while let Some(sent) = spy.received_notification() {
            if sent.topic == REQUEST_TOPIC.as_bytes() && sent.payload.starts_with(b"*") {
                payloads.push(sent.payload);
            }
        }
        payloads
    };

    let mut pager = sdk
        .client
        .list_keys(pattern.to_vec(), Duration::from_secs(5))
        .unwrap();
    let mut by_sdk = BTreeSet::new();
    while let Some(keys) = pager.next().await.unwrap() {
        by_sdk.extend(keys);
    }
    assert_eq!(by_sdk, written);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sdk_scans = scans(&mut spy);

    let (by_gateway, _) = list_all(gw, &format!("/keys?match={}", encode(pattern))).await;
    assert_eq!(by_gateway.into_iter().collect::<BTreeSet<_>>(), written);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let gateway_scans = scans(&mut spy);

    assert_eq!(sdk_scans.len(), 3, "nine keys in pages of three");
    assert_eq!(gateway_scans, sdk_scans);
    sdk.close().await;
}

/// A key deleted from the page a cursor points into shifts nothing: the
/// next response resumes after the last key returned, not by count.
#[tokio::test]
async fn deleting_a_listed_key_does_not_skip_the_rest_of_its_page() {
    let stack = stack_with_pages(5).await;
    let gw = &stack.gateway;
    for n in 0..10 {
        put(gw, format!("d/{n}").as_bytes()).await;
    }
    let first = json(
        gw.http
            .get(gw.url("/keys?match=d/*&limit=2"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(keys_of(&first), [b"d/0".to_vec(), b"d/1".to_vec()]);
    let response = gw.http.delete(gw.key(b"d/0")).send().await.unwrap();
    assert_eq!(response.status(), 204);
    let cursor = first["next"].as_str().unwrap();
    let (rest, _) = list_all(gw, &format!("/keys?match=d/*&limit=2&cursor={cursor}")).await;
    let expected: Vec<Vec<u8>> = (2..10).map(|n| format!("d/{n}").into_bytes()).collect();
    assert_eq!(rest, expected);
}

/// A pattern that makes the glob backtrack over every byte of every key
/// (`*` then 1,000 `a` and a `b`, over 4,000 keys of 1,000 `a`-heavy
/// bytes) does not hold the store: SCAN pages end once the matcher spent
/// its budget, so an unrelated GET meanwhile is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pathological_glob_does_not_delay_other_requests() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    put(gw, b"unrelated").await;
    let keys: Vec<String> = (0..4_000)
        .map(|n| format!("{}{n:04}", "a".repeat(996)))
        .collect();
    put_many(gw, &keys).await;

    let pattern = format!("*{}b", "a".repeat(1_000));
    let listing = tokio::spawn({
        let (http, url) = (gw.http.clone(), gw.url(&format!("/keys?match={pattern}")));
        async move { http.get(url).send().await.unwrap().status() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = std::time::Instant::now();
        let response = gw
            .http
            .get(gw.key(b"unrelated"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A few milliseconds in a release build; the bound leaves room for a
    // debug build on a loaded machine (without the budget: over 5 s, 504).
    assert!(
        slowest < Duration::from_secs(1),
        "a GET waited {slowest:?} behind the glob"
    );
    assert_eq!(listing.await.unwrap(), 200);
}

/// PUTs every key (`1` as the value), 32 at a time.
async fn put_many(gateway: &Gateway, keys: &[String]) {
    let mut puts = tokio::task::JoinSet::new();
    for chunk in keys.chunks(keys.len().div_ceil(32).max(1)) {
        let (http, api, chunk) = (gateway.http.clone(), gateway.api, chunk.to_vec());
        puts.spawn(async move {
            for key in chunk {
                let url = format!("http://{api}/keys/{}", encode(key.as_bytes()));
                let response = http.put(url).body("1").send().await.unwrap();
                assert_eq!(response.status(), 200, "PUT {key}");
            }
        });
    }
    while let Some(done) = puts.join_next().await {
        done.unwrap();
    }
}

/// Keys inserted before a cursor's key push it out of the store page the
/// cursor names: the next response still resumes after it, so every key
/// present for the whole listing is listed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_inserted_before_the_cursor_repeat_nothing() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let present: Vec<String> = (1_000..3_000).map(|n| format!("k/{n}")).collect();
    put_many(gw, &present).await;
    let first = json(
        gw.http
            .get(gw.url("/keys?match=k/*&limit=500"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let mut listed = keys_of(&first);
    assert_eq!(listed.len(), 500);
    let inserted: Vec<String> = (400..1_000).map(|n| format!("k/0{n}")).collect();
    put_many(gw, &inserted).await;
    let cursor = first["next"].as_str().expect("a next cursor");
    let (rest, _) = list_all(gw, &format!("/keys?match=k/*&limit=500&cursor={cursor}")).await;
    listed.extend(rest);
    for key in &present {
        let times = listed.iter().filter(|k| *k == key.as_bytes()).count();
        assert_eq!(times, 1, "{key} listed {times} times");
    }
    let unique: BTreeSet<_> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "no key listed twice");
}

/// `values=true`: each entry carries the value (null when not UTF-8), its
/// base64 and the version the key has in the store, across a chain of
/// pages whose links keep `values=true`; keys written by the official
/// client are read like the gateway's own.
#[tokio::test]
async fn values_true_lists_each_key_with_its_value_and_version() {
    let stack = stack_with_pages(3).await;
    let gw = &stack.gateway;
    let sdk = SdkClient::connect(stack.broker.port(), "sdk-listing-values");
    let mut expected = std::collections::BTreeMap::new();
    for n in 0..7 {
        let key = format!("meter/{n}");
        let value = format!("{}.5", 20 + n);
        let response = gw.put(key.as_bytes(), value.clone()).await;
        assert_eq!(response.status(), 200);
        let version = json(response).await["version"].as_str().unwrap().to_owned();
        expected.insert(key.into_bytes(), (value.into_bytes(), version));
    }
    let set = sdk
        .client
        .set(
            b"meter/\xff".to_vec(),
            vec![0xfe, 0x00],
            Duration::from_secs(5),
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    expected.insert(
        b"meter/\xff".to_vec(),
        (
            vec![0xfe, 0x00],
            crate::support::sdk::hlc(&set.version.unwrap()).to_string(),
        ),
    );
    put(gw, b"other").await;

    let mut next = Some("/keys?match=meter/*&limit=2&values=true".to_owned());
    let mut listed = std::collections::BTreeMap::new();
    while let Some(path) = next.take() {
        let response = gw.http.get(gw.url(&path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let link = response
            .headers()
            .get(header::LINK)
            .map(|value| value.to_str().unwrap().to_owned());
        let page = json(response).await;
        for entry in page["keys"].as_array().unwrap() {
            let key = BASE64
                .decode(entry["key_base64"].as_str().unwrap())
                .unwrap();
            let value = BASE64
                .decode(entry["value_base64"].as_str().unwrap())
                .unwrap();
            let text = std::str::from_utf8(&value).ok();
            assert_eq!(entry["value"].as_str(), text, "{entry}");
            let version = entry["version"].as_str().unwrap().to_owned();
            assert!(
                listed.insert(key, (value, version)).is_none(),
                "listed twice"
            );
        }
        if let Some(link) = link {
            assert!(link.contains("&values=true&cursor="), "{link}");
            next = Some(
                link.strip_prefix('<')
                    .and_then(|rest| rest.strip_suffix(">; rel=\"next\""))
                    .unwrap()
                    .to_owned(),
            );
        }
    }
    assert_eq!(listed, expected);

    // Without values=true, entries are keys only, as before.
    let plain = json(
        gw.http
            .get(gw.url("/keys?match=meter/0"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        plain["keys"][0],
        serde_json::json!({"key": "meter/0", "key_base64": "bWV0ZXIvMA=="})
    );
    // Values are JSON only; a bad boolean is a bad query.
    let text = gw
        .http
        .get(gw.url("/keys?match=meter/*&values=true"))
        .header(header::ACCEPT, "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(text.status(), 400);
    problem(gw, "/keys?values=maybe", "/problems/invalid-query").await;
    sdk.close().await;
}

/// Keys of 50,000 bytes (sharing their first 49,990) among short ones,
/// listed two at a time over store pages of three: every key once, and
/// every `next` and `Link` small enough to follow, whatever the key length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_stay_small_whatever_the_key_length() {
    let stack = Stack::builder()
        .emulator(|config| {
            config.scan_limits = ScanLimits {
                max_keys: 3,
                ..ScanLimits::default()
            }
        })
        .gateway(GatewayOptions {
            max_key_bytes: 60_000,
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    let long = |n: usize| format!("k/{}{n:08}", "x".repeat(49_990));
    let mut expected: BTreeSet<Vec<u8>> = BTreeSet::new();
    for n in 0..5 {
        expected.insert(long(n).into_bytes());
        expected.insert(format!("k/{n}").into_bytes());
        expected.insert(format!("k/y{n}").into_bytes());
    }
    for key in &expected {
        assert_eq!(key.len() > 100, key.len() == 50_000);
        put(gw, key).await;
    }
    let (listed, _) = list_all(gw, "/keys?match=k/*&limit=2").await;
    assert_eq!(listed.len(), expected.len(), "every key once");
    assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), expected);
}

/// The gateway's count of SCANs the store answered.
fn scans_sent(gw: &Gateway) -> f64 {
    gw.metric("statestore_gateway_store_request_duration_seconds_count{op=\"SCAN\",outcome=\"ok\"}")
        .unwrap_or(0.0)
}

/// Waits until the store has answered `scans` SCANs in all.
async fn wait_for_scans(gw: &Gateway, scans: f64) {
    let deadline = std::time::Instant::now() + WAIT;
    while scans_sent(gw) < scans {
        assert!(std::time::Instant::now() < deadline, "{scans} SCANs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A response that stops at the end of a store page has the next page
/// read already, and the listing's next request uses it: three pages,
/// three SCANs, the second sent before anyone asked for its page.
#[tokio::test]
async fn the_next_store_page_is_read_ahead_and_used_by_the_next_request() {
    let stack = stack_with_pages(3).await;
    let gw = &stack.gateway;
    for n in 0..9 {
        put(gw, format!("r/{n}").as_bytes()).await;
    }
    let first = json(
        gw.http
            .get(gw.url("/keys?match=r/*&limit=3"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(keys_of(&first).len(), 3);
    wait_for_scans(gw, 2.0).await;
    let cursor = first["next"].as_str().expect("a next cursor");
    let (rest, responses) = list_all(gw, &format!("/keys?match=r/*&limit=3&cursor={cursor}")).await;
    let expected: Vec<Vec<u8>> = (3..9).map(|n| format!("r/{n}").into_bytes()).collect();
    assert_eq!(rest, expected);
    assert_eq!(responses, 2);
    assert_eq!(scans_sent(gw), 3.0, "each page read once");
}

/// A page read ahead for one listing is not handed to another listing
/// that reaches the same store token: a key deleted before that listing
/// started is not in it.
#[tokio::test]
async fn a_page_read_ahead_for_one_listing_is_not_given_to_another() {
    let stack = stack_with_pages(3).await;
    let gw = &stack.gateway;
    for n in 0..6 {
        put(gw, format!("s/{n}").as_bytes()).await;
    }
    let first = json(
        gw.http
            .get(gw.url("/keys?match=s/*&limit=3"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(keys_of(&first).len(), 3);
    // The second page (s/3 to s/5) is read and parked for that listing.
    wait_for_scans(gw, 2.0).await;
    let response = gw.http.delete(gw.key(b"s/4")).send().await.unwrap();
    assert_eq!(response.status(), 204);

    let (listed, _) = list_all(gw, "/keys?match=s/*&limit=3").await;
    let expected: Vec<Vec<u8>> = [0, 1, 2, 3, 5]
        .iter()
        .map(|n| format!("s/{n}").into_bytes())
        .collect();
    assert_eq!(listed, expected);

    // The first listing goes on with its own page (s/4 deleted meanwhile:
    // it may or may not be there).
    let cursor = first["next"].as_str().unwrap();
    let (rest, _) = list_all(gw, &format!("/keys?match=s/*&limit=3&cursor={cursor}")).await;
    let rest: Vec<Vec<u8>> = rest.into_iter().filter(|key| key != b"s/4").collect();
    assert_eq!(rest, [b"s/3".to_vec(), b"s/5".to_vec()]);
}
