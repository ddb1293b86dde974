//! What one Dapr request may cost the gateway, against the real `serve`
//! binary (its peak resident memory, `VmHWM`, over a baseline taken in the
//! same test): a request, refused or served, over HTTP or gRPC, costs
//! about its body plus the values it carries; counts are checked while the
//! body is read, before anything is held for each element; bulk answers
//! hold a few values at a time; and Dapr's message size limit holds.

use std::time::Duration;

use bytes::Bytes;

use crate::support::Mosquitto;
use crate::support::emulator::start_emulator;
use crate::support::gateway_process::GatewayProcess;
use crate::support::grpc::{GetBulkStateResponse, GetStateResponse, GrpcClient, code};

/// Dapr's default largest request body and gRPC message, both ways.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// Lets the allocator give back what the set-up used, then takes the
/// baseline and starts measuring the peak from it.
async fn baseline(gateway: &GatewayProcess) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = gateway.rss_kib();
    gateway.reset_peak_rss();
    baseline
}

/// Asserts that the peak since [`baseline`] grew by at most `bound` bytes.
fn assert_grew_at_most(gateway: &GatewayProcess, what: &str, baseline_kib: u64, bound: usize) {
    let peak = gateway.peak_rss_kib();
    let grown = peak.saturating_sub(baseline_kib) * 1024;
    eprintln!(
        "{what}: peak VmHWM {peak} KiB, {:.1} MB over the baseline (bound {:.1} MB)",
        grown as f64 / 1e6,
        bound as f64 / 1e6
    );
    assert!(
        grown <= bound as u64,
        "{what}: peak memory grew by {:.1} MB, over {:.1} MB",
        grown as f64 / 1e6,
        bound as f64 / 1e6
    );
}

/// A gateway with default settings on a new broker and emulator.
async fn start() -> (
    Mosquitto,
    statestore_gateway::emulator::Emulator,
    GatewayProcess,
) {
    let broker = Mosquitto::start().await;
    let emulator = start_emulator(&broker).await;
    // Large bodies through debug builds on a busy machine can take longer
    // than the default request timeout; these tests are about memory.
    let gateway = GatewayProcess::start(broker.port(), &["--request-timeout", "60s"]).await;
    (broker, emulator, gateway)
}

/// Protobuf's length-delimited field `number` holding `payload`.
fn field(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 6);
    varint(&mut out, u64::from(number << 3 | 2));
    varint(&mut out, payload.len() as u64);
    out.extend_from_slice(payload);
    out
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A `SaveStateRequest` to `statestore` of `items` empty items, built by
/// hand (two bytes each).
fn empty_items(items: usize) -> Vec<u8> {
    let mut message = field(1, b"statestore");
    message.reserve(items * 2);
    for _ in 0..items {
        message.extend_from_slice(&[0x12, 0x00]);
    }
    message
}

/// A gRPC request is checked before it is decoded: a message of millions
/// of empty items, or of one item with hundreds of thousands of metadata
/// entries, is refused (`INVALID_ARGUMENT`) at about its own size; a
/// message over Dapr's 4 MiB is refused (`RESOURCE_EXHAUSTED`) before it
/// is read; a method the gateway does not serve is `UNIMPLEMENTED`
/// without reading its message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requests_are_counted_and_sized_before_they_are_decoded() {
    let (_broker, _emulator, gateway) = start().await;
    let mut client = GrpcClient::connect(gateway.api).await;
    client.save(&[("g/small", b"v")]).await.expect(code::OK);

    // Two bytes an item, up to Dapr's message size.
    let items = (MAX_BODY - 64) / 2;
    let message = Bytes::from(empty_items(items));
    let baseline_kib = baseline(&gateway).await;
    let refused = client
        .call("SaveState", &message)
        .await
        .expect(code::INVALID_ARGUMENT);
    assert!(refused.message.contains("1000"), "{}", refused.message);
    assert_grew_at_most(
        &gateway,
        &format!("a SaveState of {items} empty items"),
        baseline_kib,
        3 * message.len(),
    );

    // One item, its metadata hundreds of thousands of distinct entries.
    let mut metadata = Vec::new();
    let mut entries = 0;
    while metadata.len() < MAX_BODY - 1024 {
        let entry = [field(1, format!("{entries:x}").as_bytes()), field(2, b"")].concat();
        metadata.extend_from_slice(&field(4, &entry));
        entries += 1;
    }
    let item = [field(1, b"g/meta"), metadata].concat();
    let message = [field(1, b"statestore"), field(2, &item)].concat();
    assert!(message.len() <= MAX_BODY);
    let baseline_kib = baseline(&gateway).await;
    client
        .call("SaveState", &message)
        .await
        .expect(code::INVALID_ARGUMENT);
    assert_grew_at_most(
        &gateway,
        &format!("a SaveState of one item with {entries} metadata entries"),
        baseline_kib,
        3 * message.len(),
    );

    // Over Dapr's message size: refused on its length prefix.
    let message = Bytes::from(empty_items(4 * MAX_BODY / 2));
    let baseline_kib = baseline(&gateway).await;
    client
        .call("SaveState", &message)
        .await
        .expect(code::RESOURCE_EXHAUSTED);
    assert_grew_at_most(&gateway, "a 16 MiB SaveState", baseline_kib, 2 * MAX_BODY);

    // A method not served is not decoded.
    let message = Bytes::from(vec![0u8; MAX_BODY]);
    let baseline_kib = baseline(&gateway).await;
    client
        .call("GetSecret", &message)
        .await
        .expect(code::UNIMPLEMENTED);
    assert_grew_at_most(&gateway, "a 4 MiB GetSecret", baseline_kib, 2 * MAX_BODY);

    // What may be saved still is.
    let value = vec![b'v'; MAX_BODY - 1024];
    let baseline_kib = baseline(&gateway).await;
    client.save(&[("g/large", &value)]).await.expect(code::OK);
    assert_grew_at_most(
        &gateway,
        "a SaveState of one 4 MB value",
        baseline_kib,
        5 * value.len(),
    );
}

/// `[0,0,...]` of `bytes` bytes.
fn zeros_array(bytes: usize) -> Vec<u8> {
    let mut array = Vec::with_capacity(bytes);
    array.push(b'[');
    while array.len() + 3 <= bytes {
        array.extend_from_slice(b"0,");
    }
    array.extend_from_slice(b"0]");
    array
}

/// Saves `body` over HTTP (204), growing the gateway's peak memory by at
/// most `multiple` times the body.
async fn save_costing_at_most(
    gateway: &GatewayProcess,
    what: &str,
    body: Vec<u8>,
    multiple: usize,
) {
    let size = body.len();
    let baseline_kib = baseline(gateway).await;
    let saved = gateway
        .http
        .post(gateway.url("/v1.0/state/statestore"))
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), 204, "{what}");
    assert_grew_at_most(
        gateway,
        &format!("{what} ({size} bytes)"),
        baseline_kib,
        multiple * size,
    );
}

/// An HTTP save keeps its value as the bytes it came in (compacted), not
/// as a parsed tree: a save of a value of a million numbers costs about
/// its body and its value, and is stored compact; of an item's metadata
/// only `ttlInSeconds` is read. A save, bulk read or
/// transaction refused for its count costs about its body: items past the
/// limit are never held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_keep_values_as_bytes_and_count_while_reading() {
    let (_broker, _emulator, gateway) = start().await;
    let post = |path: &str, body: Vec<u8>| {
        gateway
            .http
            .post(gateway.url(path))
            .header("content-type", "application/json")
            .body(body)
            .timeout(Duration::from_secs(60))
            .send()
    };
    let small = post(
        "/v1.0/state/statestore",
        br#"[{"key":"h/small","value":[0, 0]}]"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(small.status(), 204);

    let value = zeros_array(MAX_BODY - 64);
    let mut body = br#"[{"key":"h/zeros","value":"#.to_vec();
    body.extend_from_slice(&value);
    body.extend_from_slice(b"}]");
    assert!(body.len() <= MAX_BODY);
    save_costing_at_most(
        &gateway,
        "an HTTP save of a value of a million numbers",
        body,
        5,
    )
    .await;
    let stored = gateway
        .http
        .get(gateway.key(b"h/zeros"))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(stored.status(), 200);
    assert!(stored.bytes().await.unwrap() == value, "stored as sent");
    let spaced = post(
        "/v1.0/state/statestore",
        br#"[{"key": "h/spaced", "value": { "a" : [ 1 , "b c" ] } }]"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(spaced.status(), 204);
    let stored = gateway
        .http
        .get(gateway.key(b"h/spaced"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        stored.bytes().await.unwrap().as_ref(),
        br#"{"a":[1,"b c"]}"#,
        "stored compact"
    );

    // Metadata of hundreds of thousands of entries: all but
    // `ttlInSeconds` skipped unread.
    let mut body = br#"[{"key":"h/meta","value":1,"metadata":{"ttlInSeconds":"60""#.to_vec();
    let mut entries = 0;
    while body.len() < MAX_BODY - 64 {
        body.extend_from_slice(format!(r#","{entries:x}":"""#).as_bytes());
        entries += 1;
    }
    body.extend_from_slice(b"}}]");
    let what = format!("an HTTP save of one item with {entries} metadata entries");
    save_costing_at_most(&gateway, &what, body, 3).await;
    // A `ttlInSeconds` that is not text is read as its raw JSON, not a tree.
    let mut body = br#"[{"key":"h/meta","value":1,"metadata":{"ttlInSeconds":"#.to_vec();
    body.extend_from_slice(&zeros_array(MAX_BODY - 64));
    body.extend_from_slice(b"}}]");
    let what = "an HTTP save whose ttlInSeconds is a million numbers";
    save_costing_at_most(&gateway, what, body, 3).await;

    // Refused for their counts, as the body is read.
    let repeated = |open: &[u8], element: &[u8], close: &[u8]| {
        let mut body = open.to_vec();
        while body.len() + 2 * (element.len() + 1) + close.len() <= MAX_BODY {
            body.extend_from_slice(element);
            body.push(b',');
        }
        body.extend_from_slice(element);
        body.extend_from_slice(close);
        body
    };
    for (what, path, body) in [
        (
            "a save",
            "/v1.0/state/statestore",
            repeated(b"[", br#"{"key":"k"}"#, b"]"),
        ),
        (
            "a bulk read",
            "/v1.0/state/statestore/bulk",
            repeated(br#"{"keys":["#, br#""""#, b"]}"),
        ),
        (
            "a transaction",
            "/v1.0/state/statestore/transaction",
            repeated(
                br#"{"operations":["#,
                br#"{"operation":"upsert","request":{"key":"k"}}"#,
                b"]}",
            ),
        ),
    ] {
        let size = body.len();
        let baseline_kib = baseline(&gateway).await;
        let refused = post(path, body).await.unwrap();
        let status = refused.status();
        let answer: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(status, 413, "{what}: {answer}");
        assert_eq!(answer["errorCode"], "ERR_MALFORMED_REQUEST", "{what}");
        assert!(
            answer["message"].as_str().unwrap().contains("at most 1000"),
            "{what}: {answer}"
        );
        assert_grew_at_most(
            &gateway,
            &format!("{what} of {size} bytes refused for its count"),
            baseline_kib,
            3 * size,
        );
    }
}

/// Writes `value` to `key` through `/keys`.
async fn put(gateway: &GatewayProcess, key: &str, value: Vec<u8>) {
    let written = gateway
        .http
        .put(gateway.key(key.as_bytes()))
        .body(value)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(written.status(), 200);
}

/// A bulk read is answered a few values at a time: over HTTP as the reads
/// are done, written as the client takes them, so 100 copies of a 1 MB
/// value cost a few of them, and a value carried as a JSON string is
/// escaped piece by piece, never whole; over gRPC, whose answer is one message, the
/// answer may carry at most Dapr's 4 MiB (`RESOURCE_EXHAUSTED` past it,
/// as Dapr answers), found out without reading every value: 1,000 copies
/// of a 16 MiB value, asked in one small request, cost about one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_reads_hold_a_few_values_at_a_time() {
    const VALUE: usize = 1_000_000;
    const COPIES: usize = 100;
    let (_broker, _emulator, gateway) = start().await;
    let text = vec![b'x'; VALUE];
    put(
        &gateway,
        "b/mb",
        serde_json::to_vec(&String::from_utf8(text.clone()).unwrap()).unwrap(),
    )
    .await;
    let bulk = |keys: Vec<&str>| {
        gateway
            .http
            .post(gateway.url("/v1.0/state/statestore/bulk"))
            .json(&serde_json::json!({ "keys": keys }))
            .timeout(Duration::from_secs(120))
            .send()
    };
    let warm = bulk(vec!["b/mb", "b/none"]).await.unwrap();
    assert_eq!(warm.status(), 200);
    drop(warm.bytes().await.unwrap());

    let baseline_kib = baseline(&gateway).await;
    let answer = bulk(vec!["b/mb"; COPIES]).await.unwrap();
    assert_eq!(answer.status(), 200);
    let items: serde_json::Value = answer.json().await.unwrap();
    let items = items.as_array().unwrap();
    assert_eq!(items.len(), COPIES);
    for item in items {
        assert_eq!(item["key"], "b/mb");
        assert_eq!(item["data"].as_str().map(str::len), Some(VALUE));
        assert!(item["etag"].is_string());
    }
    assert_grew_at_most(
        &gateway,
        &format!("an HTTP bulk read of {COPIES} copies of a 1 MB value"),
        baseline_kib,
        20 * VALUE,
    );

    let mut client = GrpcClient::connect(gateway.api).await;
    let answer: GetBulkStateResponse = client
        .get_bulk(&["b/mb", "b/mb", "b/none"])
        .await
        .expect(code::OK)
        .decode();
    assert_eq!(answer.items.len(), 3);
    assert_eq!(answer.items[1].data.len(), VALUE + 2);
    assert!(answer.items[2].data.is_empty());

    let baseline_kib = baseline(&gateway).await;
    client
        .get_bulk(&["b/mb"; COPIES])
        .await
        .expect(code::RESOURCE_EXHAUSTED);
    assert_grew_at_most(
        &gateway,
        &format!("a gRPC bulk read of {COPIES} copies of a 1 MB value"),
        baseline_kib,
        20 * VALUE,
    );

    const LARGE: usize = 16 * 1024 * 1024 - 4096;
    put(&gateway, "b/large", vec![b'y'; LARGE]).await;
    let baseline_kib = baseline(&gateway).await;
    client
        .get_bulk(&["b/large"; 1_000])
        .await
        .expect(code::RESOURCE_EXHAUSTED);
    client.get("b/large").await.expect(code::RESOURCE_EXHAUSTED);
    assert_grew_at_most(
        &gateway,
        "a gRPC bulk read of 1,000 copies of a 16 MiB value, and one read of it",
        baseline_kib,
        3 * LARGE,
    );
    let small: GetStateResponse = client.get("b/mb").await.expect(code::OK).decode();
    assert_eq!(small.data.len(), VALUE + 2);

    // Text that is not JSON goes out as a JSON string, escaped as it is
    // written: 16 MiB of zero bytes are 96 MiB of `\u0000`.
    put(&gateway, "b/zeros", vec![0; LARGE]).await;
    let baseline_kib = baseline(&gateway).await;
    let answer = bulk(vec!["b/zeros"]).await.unwrap();
    assert_eq!(answer.status(), 200);
    let items: serde_json::Value = answer.json().await.unwrap();
    let data = items[0]["data"].as_str().unwrap();
    assert!(data.len() == LARGE && data.bytes().all(|byte| byte == 0));
    assert_grew_at_most(
        &gateway,
        "an HTTP bulk read of a 16 MiB value carried as a JSON string",
        baseline_kib,
        2 * LARGE,
    );
    // Under the chart's 128 MiB limit, with room to spare.
    let peak = gateway.peak_rss_kib();
    assert!(peak <= 96 * 1024, "peak VmHWM {peak} KiB");
}

/// Every HTTP bulk answer is JSON, whatever the values it carries: a
/// value that is JSON is carried as it is, text that is not JSON as a
/// string, and bytes that are not UTF-8 (saved over gRPC) as an `error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_bulk_answer_is_json_whatever_the_values() {
    let (_broker, _emulator, gateway) = start().await;
    let mut client = GrpcClient::connect(gateway.api).await;
    client
        .save(&[
            ("u/quoted", b"\"\xff\xfe\""),
            ("u/raw", b"\xff\xfe"),
            ("u/text", b"not json"),
            ("u/json", br#"{"a":1}"#),
        ])
        .await
        .expect(code::OK);
    let answer = gateway
        .http
        .post(gateway.url("/v1.0/state/statestore/bulk"))
        .json(&serde_json::json!({"keys": ["u/quoted", "u/raw", "u/text", "u/json"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let body = answer.bytes().await.unwrap();
    let items: serde_json::Value = serde_json::from_slice(&body)
        .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&body)));
    assert_eq!(items[0]["key"], "u/quoted");
    assert!(items[0]["data"].is_null(), "{items}");
    assert!(items[0]["error"].is_string(), "{items}");
    assert!(items[1]["error"].is_string(), "{items}");
    assert_eq!(items[2]["data"], "not json");
    assert_eq!(items[3]["data"], serde_json::json!({"a": 1}));
}

/// `--dapr-max-body-size` holds requests and gRPC answers to its size, as
/// Dapr's `--max-body-size` does: a larger HTTP body is 400 `stream too
/// large`, a larger gRPC message either way `RESOURCE_EXHAUSTED`; HTTP
/// answers are not limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_size_setting_bounds_bodies_and_grpc_messages_either_way() {
    const MAX: usize = 2_000;
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let gateway =
        GatewayProcess::start(broker.port(), &["--dapr-max-body-size", &MAX.to_string()]).await;
    let value = |bytes: usize| format!("\"{}\"", "v".repeat(bytes - 2)).into_bytes();
    put(&gateway, "s/small", value(MAX / 2)).await;
    put(&gateway, "s/large", value(MAX + 1)).await;

    let save = |body: String| {
        gateway
            .http
            .post(gateway.url("/v1.0/state/statestore"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let fits = format!(
        r#"[{{"key":"s/saved","value":"{}"}}]"#,
        "v".repeat(MAX - 40)
    );
    assert!(fits.len() <= MAX);
    assert_eq!(save(fits).await.unwrap().status(), 204);
    let over = format!(r#"[{{"key":"s/saved","value":"{}"}}]"#, "v".repeat(MAX));
    let refused = save(over).await.unwrap();
    assert_eq!(refused.status(), 400);
    let answer: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(answer["errorCode"], "ERR_MALFORMED_REQUEST");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .starts_with("stream too large"),
        "{answer}"
    );

    let mut client = GrpcClient::connect(gateway.api).await;
    client
        .save(&[("s/g", &value(MAX - 40))])
        .await
        .expect(code::OK);
    client
        .save(&[("s/g", &value(MAX))])
        .await
        .expect(code::RESOURCE_EXHAUSTED);
    let small: GetStateResponse = client.get("s/small").await.expect(code::OK).decode();
    assert_eq!(small.data, value(MAX / 2));
    client.get("s/large").await.expect(code::RESOURCE_EXHAUSTED);
    client
        .get_bulk(&["s/small"; 3])
        .await
        .expect(code::RESOURCE_EXHAUSTED);

    let answer = gateway
        .http
        .post(gateway.url("/v1.0/state/statestore/bulk"))
        .json(&serde_json::json!({"keys": ["s/small", "s/small", "s/large"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let items: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(items.as_array().unwrap().len(), 3);
    assert_eq!(items[2]["data"].as_str().map(str::len), Some(MAX - 1));
}
