//! Dapr's sidecar metadata set, state query (alpha) and configuration API
//! over the real stack: raw HTTP and gRPC for the shapes and bounds, the
//! real SDKs' own calls (`@dapr/dapr`, `dapr` for Python) for what apps
//! run, a real broker underneath.

use std::path::PathBuf;
use std::time::Duration;

use azure_iot_operations_services::state_store::SetOptions;
use serde_json::{Value, json};
use statestore_gateway::access::rules::AuthzSettings;
use statestore_gateway::dapr::{AppProtocol, AppSettings, DEFAULT_APP_CALL_TIMEOUT, DaprSettings};
use statestore_gateway::emulator::ScanLimits;
use tokio::io::AsyncBufReadExt as _;

use crate::dapr::{
    TOKEN, assert_script_ok, dapr_client, error_code, grpc_python, python, run_sdk,
    stack_with_token,
};
use crate::support::emulator::start_emulator;
use crate::support::fault_proxy::FaultProxy;
use crate::support::gateway::{Gateway, GatewayOptions, Stack};
use crate::support::sdk::{Calls as _, SdkClient};
use crate::support::{Mosquitto, broker_store, init_logging, raw_set};

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

/// Gateway options with the API token and configuration items under
/// `cfg/`.
fn config_options() -> GatewayOptions {
    GatewayOptions {
        api_token: Some(TOKEN.into()),
        dapr: DaprSettings {
            configuration_key_prefix: "cfg/".into(),
            ..DaprSettings::default()
        },
        ..GatewayOptions::default()
    }
}

/// [`config_options`] with the app on `port`, called over `protocol`.
fn with_app(port: u16, protocol: AppProtocol) -> GatewayOptions {
    let mut options = config_options();
    options.dapr.app = Some(AppSettings {
        port,
        protocol,
        call_timeout: DEFAULT_APP_CALL_TIMEOUT,
    });
    options
}

/// `PUT /keys/<key>` with the token; the new version.
async fn put_key(gw: &Gateway, key: &str, value: &str) -> String {
    let put = gw
        .http
        .put(gw.key(key.as_bytes()))
        .bearer_auth(TOKEN)
        .body(value.to_owned())
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "PUT {key}: {put:?}");
    put.headers()["etag"]
        .to_str()
        .unwrap()
        .trim_matches('"')
        .to_owned()
}

#[tokio::test]
async fn configuration_get_over_http_and_grpc_names_keys_or_takes_every_item_under_the_prefix() {
    let stack = Stack::builder().gateway(config_options()).start().await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let version_a = put_key(gw, "cfg/a", "1").await;
    let version_b = put_key(gw, "cfg/b", r#"{"x": 2}"#).await;
    put_key(gw, "other", "not an item").await;

    let named: Value = client
        .get(gw.url("/v1.0/configuration/configstore?key=a&key=missing"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(named, json!({"a": {"value": "1", "version": version_a}}));
    // No key: every item under the prefix; the alpha path the SDKs call.
    let every: Value = client
        .get(gw.url("/v1.0-alpha1/configuration/configstore"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        every,
        json!({"a": {"value": "1", "version": version_a}, "b": {"value": r#"{"x": 2}"#, "version": version_b}})
    );
    let none = client
        .get(gw.url("/v1.0/configuration/configstore?key=missing"))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 204);
    let unknown = client
        .get(gw.url("/v1.0/configuration/other?key=a"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(unknown, 400).await,
        "ERR_CONFIGURATION_STORE_NOT_FOUND"
    );
    // An HTTP subscription needs an app to deliver to, as in Dapr.
    let no_app = client
        .get(gw.url("/v1.0/configuration/configstore/subscribe?key=a"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(no_app, 500).await, "ERR_APP_CHANNEL_NIL");
    // The metadata lists the configuration store.
    let metadata: Value = client
        .get(gw.url("/v1.0/metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let components = metadata["components"].as_array().unwrap();
    assert!(
        components
            .iter()
            .any(|component| component["name"] == "configstore"
                && component["type"]
                    .as_str()
                    .unwrap()
                    .starts_with("configuration.")),
        "{components:?}"
    );

    let printed = grpc_python(
        gw.api,
        r#"
def items(answer):
    return {k: [v.value, v.version] for k, v in answer.items.items()}
every = stub.GetConfiguration(api_v1.GetConfigurationRequest(store_name="configstore"), metadata=md)
print(json.dumps(items(every), sort_keys=True))
named = stub.GetConfigurationAlpha1(api_v1.GetConfigurationRequest(store_name="configstore", keys=["b", "missing"]), metadata=md)
print(json.dumps(items(named), sort_keys=True))
print(code_of(lambda: stub.GetConfiguration(api_v1.GetConfigurationRequest(store_name="other"), metadata=md)))
"#,
        &[],
    )
    .await;
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(
        serde_json::from_str::<Value>(lines[0]).unwrap(),
        json!({"a": ["1", version_a], "b": [r#"{"x": 2}"#, version_b]})
    );
    assert_eq!(
        serde_json::from_str::<Value>(lines[1]).unwrap(),
        json!({"b": [r#"{"x": 2}"#, version_b]})
    );
    assert_eq!(lines[2], "INVALID_ARGUMENT");
}

/// A Python process holding a gRPC `SubscribeConfiguration` stream open
/// (the SDKs' own stub), printing each message as a JSON line and `ended`
/// when the stream ends.
struct Subscriber {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    _child: tokio::process::Child,
}

impl Subscriber {
    async fn start(api: std::net::SocketAddr, keys: &[&str]) -> Self {
        const SCRIPT: &str = r#"
import json, os, grpc
from dapr.proto import api_service_v1, api_v1
stub = api_service_v1.DaprStub(grpc.insecure_channel(os.environ["GATEWAY"]))
md = [("dapr-api-token", os.environ["DAPR_API_TOKEN"])]
request = api_v1.SubscribeConfigurationRequest(store_name="configstore", keys=json.loads(os.environ["KEYS"]))
for message in stub.SubscribeConfiguration(request, metadata=md):
    items = {k: {"value": v.value, "version": v.version} for k, v in message.items.items()}
    print(json.dumps({"id": message.id, "items": items}), flush=True)
print("ended", flush=True)
"#;
        let mut child = tokio::process::Command::new(python())
            .arg("-c")
            .arg(SCRIPT)
            .env("GATEWAY", api.to_string())
            .env("DAPR_API_TOKEN", TOKEN)
            .env("KEYS", serde_json::to_string(keys).unwrap())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python runs");
        let stdout = child.stdout.take().unwrap();
        Self {
            lines: tokio::io::BufReader::new(stdout).lines(),
            _child: child,
        }
    }

    /// The next line, within 20 s.
    async fn line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("the subscriber prints within 20 s")
            .unwrap()
            .expect("the subscriber is still running")
    }

    /// The next message.
    async fn message(&mut self) -> Value {
        let line = self.line().await;
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("not a message: {line}"))
    }
}

#[tokio::test]
async fn a_grpc_subscription_sees_changes_from_keys_the_sdk_and_an_outage_until_unsubscribed() {
    init_logging();
    let broker = Mosquitto::start().await;
    let _store = start_emulator(&broker).await;
    let proxy = FaultProxy::start(broker.addr).await;
    let gateway = Gateway::start(proxy.port(), config_options()).await;
    gateway.wait_ready().await;
    let gw = &gateway;
    put_key(gw, "cfg/a", "1").await;

    let mut subscriber = Subscriber::start(gw.api, &["a", "b"]).await;
    // First the subscription's id alone, as Dapr sends it.
    let first = subscriber.message().await;
    let id = first["id"].as_str().unwrap().to_owned();
    assert!(!id.is_empty());
    assert_eq!(first["items"], json!({}));

    // A change through /keys.
    let version = put_key(gw, "cfg/a", "2").await;
    let change = subscriber.message().await;
    assert_eq!(change["id"], id.as_str());
    assert_eq!(
        change["items"],
        json!({"a": {"value": "2", "version": version}})
    );

    // One made directly on the store by the official client.
    let sdk = SdkClient::connect(broker.port(), "config-sdk-peer");
    sdk.set_ok(b"cfg/b", b"from-sdk", SetOptions::default())
        .await;
    let change = subscriber.message().await;
    assert_eq!(change["items"]["b"]["value"], "from-sdk");
    assert!(!change["items"]["b"]["version"].as_str().unwrap().is_empty());

    // A delete: the item with an empty value.
    let deleted = gw
        .http
        .delete(gw.key(b"cfg/a"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success());
    let change = subscriber.message().await;
    assert_eq!(change["items"]["a"]["value"], "");

    // One made while the gateway is cut off from the broker: told once the
    // hub registers the keys again and finds that b moved.
    proxy.set_refuse(true);
    proxy.cut_all();
    gw.wait_readyz(503, Duration::from_secs(20)).await;
    sdk.set_ok(b"cfg/b", b"missed", SetOptions::default()).await;
    proxy.set_refuse(false);
    let change = subscriber.message().await;
    assert_eq!(
        change["items"],
        json!({"b": {"value": "missed", "version": change["items"]["b"]["version"]}})
    );
    // And later changes keep coming.
    put_key(gw, "cfg/b", "after").await;
    assert_eq!(subscriber.message().await["items"]["b"]["value"], "after");

    // Unsubscribe over HTTP ends the stream; the id is then unknown.
    let client = dapr_client();
    let unsubscribed: Value = client
        .get(gw.url(&format!("/v1.0/configuration/configstore/{id}/unsubscribe")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(unsubscribed, json!({"ok": true}));
    assert_eq!(subscriber.line().await, "ended");
    let again = client
        .get(gw.url(&format!("/v1.0/configuration/configstore/{id}/unsubscribe")))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 500);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["ok"], false);

    // Unsubscribe over gRPC, of a subscription of every item.
    let mut every = Subscriber::start(gw.api, &[]).await;
    let id = every.message().await["id"].as_str().unwrap().to_owned();
    put_key(gw, "cfg/new", "created").await;
    assert_eq!(every.message().await["items"]["new"]["value"], "created");
    let printed = grpc_python(
        gw.api,
        r#"
ok = stub.UnsubscribeConfiguration(api_v1.UnsubscribeConfigurationRequest(store_name="configstore", id=os.environ["ID"]), metadata=md)
print(ok.ok)
again = stub.UnsubscribeConfigurationAlpha1(api_v1.UnsubscribeConfigurationRequest(store_name="configstore", id=os.environ["ID"]), metadata=md)
print(again.ok, bool(again.message))
"#,
        &[("ID", id)],
    )
    .await;
    assert_eq!(printed.lines().collect::<Vec<_>>(), ["True", "False True"]);
    assert_eq!(every.line().await, "ended");
    sdk.close().await;
}

#[tokio::test]
async fn the_js_sdk_sets_metadata_queries_state_and_follows_configuration_unchanged() {
    let stack = stack_with_token().await;
    let node = PathBuf::from("node");
    let output = run_sdk(&node, "config_sdk.mjs", stack.gateway.api, "js").await;
    assert_script_ok("config_sdk.mjs", &output);
}

/// Without an API token: the Python SDK sends its token on unary calls
/// only (its interceptor is not one of server streams), so its
/// `subscribe_configuration` cannot pass a sidecar that requires one,
/// daprd or the gateway.
#[tokio::test]
async fn the_python_sdk_sets_metadata_queries_state_and_follows_configuration_unchanged() {
    let stack = Stack::start().await;
    let output = run_sdk(&python(), "config_sdk.py", stack.gateway.api, "py").await;
    assert_script_ok("config_sdk.py", &output);
}

/// An HTTP app on a free port taking Dapr's configuration updates: each
/// `POST /configuration/{store}/{key}` as its path and JSON body.
async fn configuration_app() -> (u16, tokio::sync::mpsc::UnboundedReceiver<(String, Value)>) {
    let (updates, received) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/configuration/{store}/{*key}",
        axum::routing::post(
            move |uri: axum::http::Uri, axum::Json(body): axum::Json<Value>| {
                let updates = updates.clone();
                async move {
                    let _ = updates.send((uri.path().to_owned(), body));
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, received)
}

async fn next_update(
    received: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Value)>,
) -> (String, Value) {
    tokio::time::timeout(Duration::from_secs(20), received.recv())
        .await
        .expect("an update reaches the app within 20 s")
        .unwrap()
}

#[tokio::test]
async fn an_http_subscription_posts_each_change_to_the_app_until_unsubscribed() {
    let (port, mut received) = configuration_app().await;
    let stack = Stack::builder()
        .gateway(with_app(port, AppProtocol::Http))
        .start()
        .await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let subscribe = |path: &str| client.get(gw.url(path)).send();

    let subscribed: Value = subscribe("/v1.0/configuration/configstore/subscribe?key=a&key=b")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = subscribed["id"].as_str().unwrap().to_owned();
    let version = put_key(gw, "cfg/a", "on").await;
    let (path, update) = next_update(&mut received).await;
    assert_eq!(path, "/configuration/configstore/a");
    assert_eq!(
        update,
        json!({"id": id, "items": {"a": {"value": "on", "version": version}}})
    );
    // A delete: the item without a value.
    let deleted = gw
        .http
        .delete(gw.key(b"cfg/a"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success());
    let (path, update) = next_update(&mut received).await;
    assert_eq!(path, "/configuration/configstore/a");
    assert_eq!(update["items"]["a"].get("value"), None, "{update}");

    // Unsubscribed (the alpha path), it posts nothing more: the next
    // update the app gets is the new subscription's.
    let unsubscribed: Value = subscribe(&format!(
        "/v1.0-alpha1/configuration/configstore/{id}/unsubscribe"
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(unsubscribed, json!({"ok": true}));
    let again: Value = subscribe("/v1.0-alpha1/configuration/configstore/subscribe?key=b")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let again = again["id"].as_str().unwrap().to_owned();
    assert_ne!(again, id);
    put_key(gw, "cfg/a", "unheard").await;
    put_key(gw, "cfg/b", "heard").await;
    let (path, update) = next_update(&mut received).await;
    assert_eq!(path, "/configuration/configstore/b");
    assert_eq!(update["id"], again.as_str());
    assert_eq!(update["items"]["b"]["value"], "heard");
}

/// A gRPC app of the Python SDK's `dapr-ext-grpc` taking configuration
/// changes as daprd passes them to a gRPC app: `OnInvoke` of
/// `/configuration/configstore/{key}`; prints each call as a JSON line.
const PYTHON_GRPC_CONFIGURATION_APP: &str = r#"
import json, sys
from dapr.ext.grpc import App

app = App()

def taking(method):
    def handler(request):
        print(json.dumps({"method": method, "content_type": request.content_type,
                          "data": json.loads(request.text())}), flush=True)
    handler.__name__ = method
    return handler

for key in ["a", "b"]:
    method = "/configuration/configstore/" + key
    app.method(method)(taking(method))

app.run(int(sys.argv[1]))
"#;

#[tokio::test]
async fn an_http_subscription_of_a_grpc_app_calls_its_on_invoke_for_each_change() {
    let port = crate::support::free_port();
    let mut app = tokio::process::Command::new(python())
        .arg("-c")
        .arg(PYTHON_GRPC_CONFIGURATION_APP)
        .arg(port.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs (scripts/install-dapr-sdks)");
    let mut lines = tokio::io::BufReader::new(app.stdout.take().unwrap()).lines();
    let mut next_line = async || -> Value {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the app prints within 20 s")
            .unwrap()
            .expect("the app is still running");
        serde_json::from_str(&line).unwrap()
    };
    // A change is passed once, not retried: the app listens first.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the app listens within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stack = Stack::builder()
        .gateway(with_app(port, AppProtocol::Grpc))
        .start()
        .await;
    let gw = &stack.gateway;
    let subscribed: Value = dapr_client()
        .get(gw.url("/v1.0/configuration/configstore/subscribe?key=a&key=b"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = subscribed["id"].as_str().expect("an id").to_owned();
    let version = put_key(gw, "cfg/b", "on").await;
    assert_eq!(
        next_line().await,
        json!({"method": "/configuration/configstore/b", "content_type": "application/json",
               "data": {"id": id, "items": {"b": {"value": "on", "version": version}}}})
    );
    let version = put_key(gw, "cfg/a", "off").await;
    assert_eq!(
        next_line().await["data"],
        json!({"id": id, "items": {"a": {"value": "off", "version": version}}})
    );
}

/// The API token may read and write `t1/*` only.
const T1_RULES: &str = "rules:\n  - principals:\n      apiToken: true\n    stateStoreResources:\n      - {keyType: Pattern, keys: [\"t1/*\"], method: ReadWrite}\n";

#[tokio::test]
async fn queries_and_configuration_show_only_what_the_callers_rules_let_it_read() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, T1_RULES).unwrap();
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some(TOKEN.into()),
            authz: Some(AuthzSettings::new(rules)),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let store = broker_store(stack.broker.addr).await;
    raw_set(&store, b"t1/a", br#"{"team":1}"#).await;
    raw_set(&store, b"t2/b", br#"{"team":1}"#).await;

    let (results, _) = query(&client, gw, &json!({"filter": {"EQ": {"team": 1}}})).await;
    assert_eq!(keys_of(&results), ["t1/a"]);
    let every: Value = client
        .get(gw.url("/v1.0/configuration/configstore"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        every.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["t1/a"]
    );
    let denied = client
        .get(gw.url("/v1.0/configuration/configstore?key=t2/b"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(denied, 403).await, "ERR_PERMISSION_DENIED");

    // A subscription of every item is told of t1/a only.
    let mut every = Subscriber::start(gw.api, &[]).await;
    every.message().await;
    raw_set(&store, b"t2/b", br#"{"team":2}"#).await;
    raw_set(&store, b"t1/a", br#"{"team":3}"#).await;
    let change = every.message().await;
    assert_eq!(
        change["items"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["t1/a"],
        "{change}"
    );
    assert_eq!(change["items"]["t1/a"]["value"], r#"{"team":3}"#);
}
