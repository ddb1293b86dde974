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
use statestore_gateway::emulator::ScanLimits;
use statestore_gateway::protocol::{REQUEST_TOPIC, Request};

use crate::support::emulator::{RawClient, WAIT};
use crate::support::gateway::{Gateway, Stack, encode};
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

/// The keys of one JSON page, as bytes (from `key_base64`).
fn keys_of(page: &Value) -> Vec<Vec<u8>> {
    page["keys"]
        .as_array()
        .expect("a keys array")
        .iter()
        .map(|entry| {
            BASE64
                .decode(entry["key_base64"].as_str().unwrap())
                .unwrap()
        })
        .collect()
}

/// Follows `Link: <...>; rel="next"` from `path` to the end; every page's
/// keys in order, and how many responses it took.
async fn list_all(gateway: &Gateway, path: &str) -> (Vec<Vec<u8>>, usize) {
    let mut next = Some(path.to_owned());
    let (mut keys, mut responses) = (Vec::new(), 0);
    while let Some(path) = next.take() {
        let response = gateway.http.get(gateway.url(&path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let link = response
            .headers()
            .get(header::LINK)
            .map(|value| value.to_str().unwrap().to_owned());
        let page = json(response).await;
        keys.extend(keys_of(&page));
        responses += 1;
        match (&page["next"], link) {
            (Value::Null, None) => {}
            (Value::String(cursor), Some(link)) => {
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
    assert_eq!(text, "bin/a b\nbin/x%0Ay\nbin/é%25\nbin/%FF%00\n");
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
    ] {
        problem(gw, path, "/problems/invalid-query").await;
    }
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
    // version 1, skip 0, a 4-byte token, no last key, the pattern.
    let mut forged = vec![1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0];
    forged.extend_from_slice(b"x;k0k*");
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
