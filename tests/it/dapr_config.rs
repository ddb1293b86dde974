//! Dapr's sidecar metadata set, state query (alpha) and configuration API
//! over the real stack: raw HTTP and gRPC for the shapes and bounds, the
//! real SDKs' own calls (`@dapr/dapr`, `dapr` for Python) for what apps
//! run, a real broker underneath.

use serde_json::{Value, json};
use statestore_gateway::emulator::ScanLimits;

use crate::dapr::{TOKEN, dapr_client, error_code, grpc_python, stack_with_token};
use crate::support::gateway::{Gateway, GatewayOptions, Stack};
use crate::support::{broker_store, raw_set};

#[tokio::test]
async fn metadata_set_over_http_and_grpc_is_read_back_over_both_within_its_bounds() {
    let stack = stack_with_token().await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let set = client
        .put(gw.url("/v1.0/metadata/team"))
        .header("content-type", "text/plain")
        .body("orders and more")
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 204);
    let printed = grpc_python(
        gw.api,
        r#"
stub.SetMetadata(api_v1.SetMetadataRequest(key="lang", value="python"), metadata=md)
read = stub.GetMetadata(api_v1.GetMetadataRequest(), metadata=md)
print(json.dumps(dict(read.extended_metadata), sort_keys=True))
too_long = code_of(lambda: stub.SetMetadata(api_v1.SetMetadataRequest(key="big", value="x" * 70000), metadata=md))
print(too_long)
"#,
        &[],
    )
    .await;
    let lines: Vec<&str> = printed.lines().collect();
    let extended: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(
        extended,
        json!({"lang": "python", "team": "orders and more"})
    );
    assert_eq!(lines[1], "INVALID_ARGUMENT");
    let metadata: Value = client
        .get(gw.url("/v1.0/metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        metadata["extended"],
        json!({"lang": "python", "team": "orders and more"})
    );

    // Bounds: a value past 64 KiB, a name past 256 bytes, a 65th name.
    let too_large = client
        .put(gw.url("/v1.0/metadata/big"))
        .body(vec![b'x'; 64 * 1024 + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(too_large, 400).await, "ERR_MALFORMED_REQUEST");
    let long_name = client
        .put(gw.url(&format!("/v1.0/metadata/{}", "n".repeat(257))))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(long_name, 400).await, "ERR_MALFORMED_REQUEST");
    for n in 0..62 {
        let set = client
            .put(gw.url(&format!("/v1.0/metadata/k{n}")))
            .body("v")
            .send()
            .await
            .unwrap();
        assert_eq!(set.status(), 204, "attribute {n}");
    }
    let full = client
        .put(gw.url("/v1.0/metadata/one-more"))
        .body("v")
        .send()
        .await
        .unwrap();
    let body: Value = full.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST");
    assert!(
        body["message"].as_str().unwrap().contains("at most 64"),
        "{body}"
    );
    // Replacing one that exists still works.
    let replace = client
        .put(gw.url("/v1.0/metadata/team"))
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(replace.status(), 204);
    let metadata: Value = client
        .get(gw.url("/v1.0/metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["extended"]["team"], "");
    assert_eq!(metadata["extended"].as_object().unwrap().len(), 64);
}

/// A stack with the API token whose emulator's SCAN pages hold `max_keys`
/// keys, so one query page takes several SCANs and tokens land inside
/// store pages.
async fn stack_with_pages(max_keys: usize) -> Stack {
    Stack::builder()
        .emulator(move |config| {
            config.scan_limits = ScanLimits {
                max_keys,
                ..ScanLimits::default()
            }
        })
        .gateway(GatewayOptions {
            api_token: Some(TOKEN.into()),
            ..GatewayOptions::default()
        })
        .start()
        .await
}

async fn save(client: &reqwest::Client, gw: &Gateway, items: Value) {
    let saved = client
        .post(gw.url("/v1.0/state/statestore"))
        .json(&items)
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), 204);
}

async fn query(
    client: &reqwest::Client,
    gw: &Gateway,
    query: &Value,
) -> (Vec<Value>, Option<String>) {
    let answer = client
        .post(gw.url("/v1.0-alpha1/state/statestore/query"))
        .json(query)
        .send()
        .await
        .unwrap();
    if answer.status() == 204 {
        return (Vec::new(), None);
    }
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    let results = body["results"].as_array().unwrap().clone();
    (results, body["token"].as_str().map(str::to_owned))
}

fn keys_of(results: &[Value]) -> Vec<String> {
    results
        .iter()
        .map(|result| result["key"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_query_pages_through_tokens_while_keys_are_added_and_skips_what_is_not_json() {
    let stack = stack_with_pages(3).await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let items: Vec<Value> = (0..30)
        .map(|n| json!({"key": format!("q/{n:02}"), "value": {"n": n, "kind": if n % 2 == 0 { "even" } else { "odd" }}}))
        .collect();
    save(&client, gw, Value::Array(items)).await;
    // Not JSON, written outside the Dapr API: never a result.
    let raw = gw
        .http
        .put(gw.key(b"q/text"))
        .bearer_auth(TOKEN)
        .body("even, but not JSON")
        .send()
        .await
        .unwrap();
    assert!(raw.status().is_success());
    // The gateway's own records never appear, JSON or not.
    let store = broker_store(stack.broker.addr).await;
    raw_set(&store, b"dapr-expiry||q/00", br#"{"kind":"even","n":0}"#).await;
    // A lock key (with `||`) is no state key.
    raw_set(&store, b"lock||app||q", br#"{"kind":"even"}"#).await;

    let filter = json!({"EQ": {"kind": "even"}});
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut asked = json!({"filter": filter, "page": {"limit": 4}});
        if let Some(token) = &token {
            asked["page"]["token"] = json!(token);
        }
        let (results, next) = query(&client, gw, &asked).await;
        pages += 1;
        assert!(results.len() <= 4, "{results:?}");
        for result in &results {
            assert_eq!(result["data"]["kind"], "even", "{result}");
            assert!(result["etag"].is_string(), "{result}");
        }
        seen.extend(keys_of(&results));
        // Keys added between pages: before and after where the query is.
        if pages == 2 {
            save(
                &client,
                gw,
                json!([{"key": "q/00a", "value": {"kind": "even", "n": -1}}, {"key": "q/99", "value": {"kind": "even", "n": 99}}]),
            )
            .await;
        }
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
        assert!(pages < 40, "the query does not end");
    }
    assert!(pages >= 4, "{pages} pages");
    let unique: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "a key came twice: {seen:?}");
    for n in (0..30).step_by(2) {
        assert!(
            seen.contains(&format!("q/{n:02}")),
            "q/{n:02} missing: {seen:?}"
        );
    }
    // Added past where the query stood: found; before it: not.
    assert!(seen.contains(&"q/99".to_owned()), "{seen:?}");
    assert!(!seen.contains(&"q/00a".to_owned()), "{seen:?}");
    assert!(!seen.iter().any(|key| key.contains("||") || key == "q/text"));

    // Sorted: every match ordered, paged by offset.
    let mut sorted = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut asked = json!({"filter": {"AND": [{"IN": {"kind": ["even"]}}, {"GTE": {"n": 10}}]}, "sort": [{"key": "n", "order": "DESC"}], "page": {"limit": 5}});
        if let Some(token) = &token {
            asked["page"]["token"] = json!(token);
        }
        let (results, next) = query(&client, gw, &asked).await;
        sorted.extend(
            results
                .iter()
                .map(|result| result["data"]["n"].as_i64().unwrap()),
        );
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    let expected: Vec<i64> = std::iter::once(99)
        .chain((10..30).rev().filter(|n| n % 2 == 0))
        .collect();
    assert_eq!(sorted, expected);

    // Nothing matches: 204, as Dapr answers.
    let none = client
        .post(gw.url("/v1.0-alpha1/state/statestore/query"))
        .json(&json!({"filter": {"EQ": {"kind": "none"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 204);
    // A malformed query and an unknown store, in Dapr's shapes.
    let malformed = client
        .post(gw.url("/v1.0-alpha1/state/statestore/query"))
        .json(&json!({"filter": {"LIKE": {"kind": "e%"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(malformed, 500).await, "ERR_STATE_QUERY");
    let unknown = client
        .post(gw.url("/v1.0-alpha1/state/other/query"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(unknown, 400).await, "ERR_STATE_STORE_NOT_FOUND");

    // gRPC: the same query, its token resuming.
    let printed = grpc_python(
        gw.api,
        r#"
q = {"filter": {"EQ": {"kind": "odd"}}, "page": {"limit": 10}}
keys, token = [], ""
while True:
    if token:
        q["page"]["token"] = token
    answer = stub.QueryStateAlpha1(api_v1.QueryStateRequest(store_name="statestore", query=json.dumps(q)), metadata=md)
    for item in answer.results:
        assert json.loads(item.data)["kind"] == "odd" and item.etag
        keys.append(item.key)
    token = answer.token
    if not token:
        break
print(json.dumps(sorted(keys)))
print(code_of(lambda: stub.QueryStateAlpha1(api_v1.QueryStateRequest(store_name="other", query="{}"), metadata=md)))
print(code_of(lambda: stub.QueryStateAlpha1(api_v1.QueryStateRequest(store_name="statestore", query="{"), metadata=md)))
"#,
        &[],
    )
    .await;
    let lines: Vec<&str> = printed.lines().collect();
    let odd: Vec<String> = serde_json::from_str(lines[0]).unwrap();
    let expected: Vec<String> = (1..30).step_by(2).map(|n| format!("q/{n:02}")).collect();
    assert_eq!(odd, expected);
    assert_eq!(lines[1..], ["INVALID_ARGUMENT", "INTERNAL"]);
}
