//! Dapr's state and lock API over the real stack: the real SDKs (`@dapr/dapr`
//! over HTTP, `dapr` for Python over gRPC) run their own client code against
//! a gateway, raw HTTP checks hold the statuses and bodies the SDKs hide,
//! and two gateways on one store show that etag writes stay correct when
//! one of them is paused past its lease in the middle of a write.
//!
//! Needs Node.js 20+ with `tests/dapr`'s npm packages and a Python virtual
//! environment with the `dapr` package: `scripts/install-dapr-sdks`
//! installs them (`scripts/test` calls it). When they are missing these
//! tests fail and say so; they never skip.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use statestore_gateway::access::rules::AuthzSettings;
use statestore_gateway::dapr::{DaprSettings, KeyPrefix, LOCK_KEY_PREFIX, LockKeyPrefix};
use statestore_gateway::store::StoreClient;
use statestore_gateway::store::reserved::{INTENT_PREFIX, LEASE_PREFIX};

use crate::support::fault_proxy::FaultProxy;
use crate::support::gateway::{Gateway, GatewayOptions, Stack, encode, http_client};
use crate::support::gateway_process::GatewayProcess;
use crate::support::{broker_store, freeze, raw_get, raw_set, thaw};

mod answers;

pub(crate) const TOKEN: &str = "dapr-api-t0ken";
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

fn dapr_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dapr")
}

pub(crate) fn python() -> PathBuf {
    dapr_dir().join(".venv/bin/python")
}

/// Panics, naming what is missing, unless both SDKs are installed.
fn require_sdks() {
    let mut missing = Vec::new();
    if !dapr_dir()
        .join("node_modules/@dapr/dapr/package.json")
        .is_file()
    {
        missing.push("the npm packages of tests/dapr (@dapr/dapr)");
    }
    if !python().is_file() {
        missing.push("the Python environment tests/dapr/.venv (dapr)");
    }
    assert!(
        missing.is_empty(),
        "the Dapr SDK tests cannot run: missing {}. Run scripts/install-dapr-sdks",
        missing.join(", ")
    );
}

/// Runs one SDK script against the gateway at `api` (bounded), with the
/// environment variables a Dapr app gets from its sidecar.
pub(crate) async fn run_sdk(
    program: &Path,
    script: &str,
    api: std::net::SocketAddr,
    prefix: &str,
) -> Output {
    require_sdks();
    let mut command = tokio::process::Command::new(program);
    command
        .arg(dapr_dir().join(script))
        .current_dir(dapr_dir())
        .env("DAPR_RUNTIME_HOST", "127.0.0.1")
        .env("DAPR_HTTP_PORT", api.port().to_string())
        .env("DAPR_GRPC_PORT", api.port().to_string())
        .env("DAPR_API_TOKEN", TOKEN)
        .env("DAPR_HEALTH_TIMEOUT", "30")
        .env("KEY_PREFIX", prefix)
        .kill_on_drop(true);
    tokio::time::timeout(SCRIPT_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {SCRIPT_TIMEOUT:?}"))
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", program.display()))
}

pub(crate) fn assert_script_ok(script: &str, output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.lines().last() == Some("ok"),
        "{script} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

pub(crate) async fn stack_with_token() -> Stack {
    Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some(TOKEN.into()),
            ..GatewayOptions::default()
        })
        .start()
        .await
}

/// A stack whose gateway has these Dapr settings (and no API token).
async fn stack_with_dapr(dapr: DaprSettings) -> Stack {
    Stack::builder()
        .gateway(GatewayOptions {
            dapr,
            ..GatewayOptions::default()
        })
        .start()
        .await
}

/// [`stack_with_token`] with Dapr transactions on.
async fn transactional_stack() -> Stack {
    Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some(TOKEN.into()),
            dapr: DaprSettings {
                transactions: true,
                ..DaprSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await
}

#[tokio::test]
async fn the_js_sdk_runs_unchanged_over_http() {
    let stack = transactional_stack().await;
    let node = PathBuf::from("node");
    let output = run_sdk(&node, "sdk.mjs", stack.gateway.api, "js").await;
    assert_script_ok("sdk.mjs", &output);
}

#[tokio::test]
async fn the_python_sdk_runs_unchanged_over_grpc() {
    let stack = transactional_stack().await;
    let output = run_sdk(&python(), "sdk.py", stack.gateway.api, "py").await;
    assert_script_ok("sdk.py", &output);
}

/// A client that sends the API token as Dapr's SDKs do.
pub(crate) fn dapr_client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("dapr-api-token", TOKEN.parse().unwrap());
    reqwest::Client::builder()
        .default_headers(headers)
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()
        .unwrap()
}

pub(crate) async fn error_code(response: reqwest::Response, status: u16) -> String {
    assert_eq!(response.status().as_u16(), status);
    let body: Value = response.json().await.unwrap();
    assert!(body["message"].is_string(), "{body}");
    body["errorCode"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn http_answers_with_daprs_statuses_and_bodies() {
    let stack = stack_with_token().await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let url = |path: &str| gw.url(path);

    // Health is public, as Dapr's is; everything else needs the token.
    let health = http_client()
        .get(url("/v1.0/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 204);
    let outbound = http_client()
        .get(url("/v1.0/healthz/outbound"))
        .send()
        .await
        .unwrap();
    assert_eq!(outbound.status(), 204);
    let anonymous = http_client()
        .get(url("/v1.0/metadata"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    // Metadata: id and both components, only true capabilities.
    let metadata: Value = client
        .get(url("/v1.0/metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["id"], "statestore-gateway");
    let components = metadata["components"].as_array().unwrap();
    assert_eq!(components[0]["name"], "statestore");
    assert_eq!(
        components[0]["capabilities"],
        json!(["ETAG", "TTL", "QUERY_API"])
    );
    assert_eq!(components[1]["name"], "lockstore");
    assert!(components[1]["type"].as_str().unwrap().starts_with("lock."));

    // A string value is stored as its JSON: the same key over /keys.
    let save = client
        .post(url("/v1.0/state/statestore"))
        .json(&json!([{"key": "d/text", "value": "hello"}, {"key": "d/obj", "value": {"b": 1, "a": [true]}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(save.status(), 204);
    let raw = gw
        .http
        .get(gw.key(b"d/text"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.bytes().await.unwrap().as_ref(), b"\"hello\"");
    let got = client
        .get(url("/v1.0/state/statestore/d/obj?"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], "application/json");
    let etag = got.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(
        got.bytes().await.unwrap().as_ref(),
        br#"{"a":[true],"b":1}"#
    );

    // An absent key is 204 without a body.
    let absent = client
        .get(url("/v1.0/state/statestore/d/none"))
        .send()
        .await
        .unwrap();
    assert_eq!(absent.status(), 204);
    assert!(absent.bytes().await.unwrap().is_empty());

    // Bulk: `data` and `etag`, an absent key alone.
    let bulk: Value = client
        .post(url("/v1.0/state/statestore/bulk"))
        .json(&json!({"keys": ["d/obj", "d/none"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        bulk,
        json!([{"key": "d/obj", "data": {"a": [true], "b": 1}, "etag": etag}, {"key": "d/none"}])
    );

    // Etags: a stale one is 409, a malformed one 400, the current one wins.
    let with_etag = |etag: &str, value: &str| json!([{"key": "d/obj", "value": value, "etag": etag, "options": {"concurrency": "first-write"}}]);
    let ok = client
        .post(url("/v1.0/state/statestore"))
        .json(&with_etag(&etag, "v2"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 204);
    let stale = client
        .post(url("/v1.0/state/statestore"))
        .json(&with_etag(&etag, "v3"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(stale, 409).await, "ERR_STATE_SAVE");
    let malformed = client
        .post(url("/v1.0/state/statestore"))
        .json(&with_etag("nope", "v3"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(malformed, 400).await, "ERR_STATE_SAVE");
    let stale_delete = client
        .delete(url("/v1.0/state/statestore/d/obj"))
        .header("If-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(stale_delete, 409).await, "ERR_STATE_DELETE");
    // An etag on an absent key never matches.
    let absent_etag = client
        .post(url("/v1.0/state/statestore"))
        .json(&json!([{"key": "d/none", "value": 1, "etag": etag}]))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(absent_etag, 409).await, "ERR_STATE_SAVE");

    // Unknown stores, bad bodies, transactions.
    let unknown = client.get(url("/v1.0/state/other/k")).send().await.unwrap();
    assert_eq!(error_code(unknown, 400).await, "ERR_STATE_STORE_NOT_FOUND");
    let bad_json = client
        .post(url("/v1.0/state/statestore"))
        .body("[{")
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(bad_json, 400).await, "ERR_MALFORMED_REQUEST");
    let empty_key = client
        .post(url("/v1.0/state/statestore"))
        .json(&json!([{"key": "", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(empty_key, 400).await, "ERR_MALFORMED_REQUEST");
    let transaction = json!({"operations": [{"operation": "upsert", "request": {"key": "d/tx", "value": 1}}], "metadata": null});
    let refused = client
        .post(url("/v1.0/state/statestore/transaction"))
        .json(&transaction)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(refused, 500).await, "ERR_STATE_TRANSACTION");
    let nothing = client
        .get(url("/v1.0/state/statestore/d/tx"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        nothing.status(),
        204,
        "a refused transaction applies nothing"
    );
    let unknown_op = json!({"operations": [{"operation": "merge", "request": {"key": "d/tx"}}]});
    let bad_op = client
        .put(url("/v1.0/state/statestore/transaction"))
        .json(&unknown_op)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(bad_op, 400).await, "ERR_MALFORMED_REQUEST");

    // Locks: `false` and `0` written out; snake_case accepted.
    let lock = |body: Value| {
        client
            .post(url("/v1.0-alpha1/lock/lockstore"))
            .json(&body)
            .send()
    };
    let first = lock(json!({"resourceId": "d/res", "lockOwner": "a", "expiryInSeconds": 10}))
        .await
        .unwrap();
    assert_eq!(first.text().await.unwrap(), r#"{"success":true}"#);
    let again = lock(json!({"resource_id": "d/res", "lock_owner": "a", "expiry_in_seconds": 10}))
        .await
        .unwrap();
    assert_eq!(again.text().await.unwrap(), r#"{"success":false}"#);
    let zero = lock(json!({"resourceId": "d/res", "lockOwner": "a", "expiryInSeconds": 0}))
        .await
        .unwrap();
    assert_eq!(error_code(zero, 400).await, "ERR_MALFORMED_REQUEST");
    let unlock = client
        .post(url("/v1.0-alpha1/unlock/lockstore"))
        .json(&json!({"resourceId": "d/res", "lockOwner": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unlock.text().await.unwrap(), r#"{"status":0}"#);
    let other_store = client
        .post(url("/v1.0-alpha1/lock/other"))
        .json(&json!({"resourceId": "d/res", "lockOwner": "a", "expiryInSeconds": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(other_store, 400).await,
        "ERR_LOCK_STORE_NOT_FOUND"
    );

    // The operations are named in the metrics, by route.
    let metrics = http_client()
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"route="/v1.0/state/{store}""#),
        "{metrics}"
    );
}

#[tokio::test]
async fn dapr_locks_and_the_locks_routes_exclude_each_other() {
    // A Dapr lock's store key is Dapr's: `lock||<app-id>||<resource>`.
    let stack = stack_with_token().await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let lock_url = gw.url(&format!(
        "/locks/{}?holder=http-app&ttl=5s",
        encode(format!("{LOCK_KEY_PREFIX}statestore-gateway||shared/lock").as_bytes())
    ));
    let lock = json!({"resourceId": "shared/lock", "lockOwner": "dapr-app", "expiryInSeconds": 30});
    let taken: Value = client
        .post(gw.url("/v1.0-alpha1/lock/lockstore"))
        .json(&lock)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(taken["success"], true);
    let http = gw
        .http
        .put(&lock_url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(http.status(), 409, "/locks sees the Dapr lock held");
    let unlock = json!({"resourceId": "shared/lock", "lockOwner": "dapr-app"});
    client
        .post(gw.url("/v1.0-alpha1/unlock/lockstore"))
        .json(&unlock)
        .send()
        .await
        .unwrap();
    let http = gw
        .http
        .put(&lock_url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(http.status(), 200);
    let refused: Value = client
        .post(gw.url("/v1.0-alpha1/lock/lockstore"))
        .json(&lock)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(refused["success"], false, "Dapr sees the /locks hold");
    let status: Value = client
        .post(gw.url("/v1.0-alpha1/unlock/lockstore"))
        .json(&unlock)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["status"], 2, "the lock belongs to the /locks holder");
}

/// A Dapr lock call over HTTP (`lock` or `unlock`): its JSON answer.
async fn lock_call(client: &reqwest::Client, gw: &Gateway, call: &str, body: Value) -> Value {
    let answer = client
        .post(gw.url(&format!("/v1.0-alpha1/{call}/lockstore")))
        .json(&body)
        .send()
        .await
        .unwrap();
    answer.json().await.unwrap()
}

/// A Dapr `tryLock` over HTTP: whether it was taken.
async fn try_lock(client: &reqwest::Client, gw: &Gateway, resource: &str, owner: &str) -> bool {
    let body = json!({"resourceId": resource, "lockOwner": owner, "expiryInSeconds": 30});
    let answer = lock_call(client, gw, "lock", body).await;
    answer["success"].as_bool().expect("success")
}

/// A Dapr `unlock` over HTTP: its status (0 released, 1 no such lock, 2
/// held by another).
async fn unlock(client: &reqwest::Client, gw: &Gateway, resource: &str, owner: &str) -> u64 {
    let body = json!({"resourceId": resource, "lockOwner": owner});
    let answer = lock_call(client, gw, "unlock", body).await;
    answer["status"].as_u64().expect("status")
}

#[tokio::test]
async fn locks_and_state_keep_apart_as_dapr_keeps_them() {
    let stack = stack_with_token().await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let state = gw.url("/v1.0/state/statestore");

    // A lock is not state: the state key of its name stays absent, and a
    // save of it leaves the lock held.
    assert!(try_lock(&client, gw, "order-42", "owner-1").await);
    let read = client
        .get(format!("{state}/order-42"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 204, "the lock's name read as state");
    save_one(&client, &state, "order-42", json!("state")).await;
    assert!(
        !try_lock(&client, gw, "order-42", "owner-2").await,
        "still held"
    );
    // `/locks` reaches the lock by its store key.
    let held = gw
        .http
        .get(gw.url(&format!(
            "/locks/{}",
            encode(b"lock||statestore-gateway||order-42")
        )))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    assert_eq!(held.json::<Value>().await.unwrap()["holder"], "owner-1");
    assert_eq!(
        unlock(&client, gw, "order-42", "owner-1").await,
        0,
        "owner-1 releases its lock"
    );
    let read = client
        .get(format!("{state}/order-42"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.text().await.unwrap(), "\"state\"");

    // State is not a lock: a key's value does not hold its name's lock.
    save_one(&client, &state, "cart-7", json!(1)).await;
    assert!(try_lock(&client, gw, "cart-7", "owner-1").await);

    // Over gRPC too.
    let script = r#"
taken = stub.TryLockAlpha1(api_v1.TryLockRequest(store_name="lockstore", resource_id="grpc-1", lock_owner="me", expiry_in_seconds=30), metadata=md).success
read = stub.GetState(api_v1.GetStateRequest(store_name="statestore", key="grpc-1"), metadata=md)
print(json.dumps([taken, read.data.decode(), read.etag]))
"#;
    let printed = grpc_python(gw.api, script, &[]).await;
    assert_eq!(
        serde_json::from_str::<Value>(printed.trim()).unwrap(),
        json!([true, "", ""])
    );
}

#[tokio::test]
async fn the_lock_key_prefix_names_lock_keys_as_daprs_lock_component_does() {
    // The lock prefix applies to locks only, the state prefix to state only.
    let stack = stack_with_dapr(DaprSettings {
        app_id: "myapp".into(),
        key_prefix: KeyPrefix::AppId,
        lock_key_prefix: LockKeyPrefix::Custom("team".into()),
        ..DaprSettings::default()
    })
    .await;
    let gw = &stack.gateway;
    let client = http_client();
    assert!(try_lock(&client, gw, "order-42", "owner-1").await);
    save_one(
        &client,
        &gw.url("/v1.0/state/statestore"),
        "order-42",
        json!("state"),
    )
    .await;
    let store = broker_store(stack.broker.addr).await;
    assert_eq!(
        raw_get(
            &store,
            format!("{LOCK_KEY_PREFIX}team||order-42").as_bytes()
        )
        .await
        .as_deref(),
        Some(&b"owner-1"[..])
    );
    assert_eq!(
        raw_get(&store, b"myapp||order-42").await.as_deref(),
        Some(&b"\"state\""[..])
    );
    assert_eq!(raw_get(&store, b"order-42").await, None);
}

#[tokio::test]
async fn per_key_rules_apply_to_the_dapr_routes() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "rules:\n  - principals:\n      apiToken: true\n    stateStoreResources:\n      - {keyType: Pattern, keys: [\"open/*\"], method: ReadWrite}\n",
    )
    .unwrap();
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
    let save = |key: &str| {
        client
            .post(gw.url("/v1.0/state/statestore"))
            .json(&json!([{"key": key, "value": 1}]))
            .send()
    };
    assert_eq!(save("open/a").await.unwrap().status(), 204);
    assert_eq!(
        error_code(save("closed/a").await.unwrap(), 403).await,
        "ERR_PERMISSION_DENIED"
    );
    let read = client
        .get(gw.url("/v1.0/state/statestore/closed/a"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(read, 403).await, "ERR_PERMISSION_DENIED");
    let lock = json!({"resourceId": "closed/lock", "lockOwner": "a", "expiryInSeconds": 5});
    let locked = client
        .post(gw.url("/v1.0-alpha1/lock/lockstore"))
        .json(&lock)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(locked, 403).await, "ERR_PERMISSION_DENIED");
}

/// Rules that give the API token's caller (a tenant) `*/orders/*` and
/// nothing else: `PUT /keys/admin/config` is 403 for it.
const TENANT_RULES: &str = "rules:\n  - principals:\n      apiToken: true\n    stateStoreResources:\n      - {keyType: Pattern, keys: [\"*/orders/*\"], method: ReadWrite}\n";

/// A tenant's gateway (its caller limited by [`TENANT_RULES`]), a gateway
/// without rules on the same store (the admin's), and a client with
/// broker credentials to look at the store itself.
struct Tenancy {
    stack: Stack,
    admin: Gateway,
    store: StoreClient,
    _rules: tempfile::TempDir,
}

impl Tenancy {
    async fn start(dapr: DaprSettings) -> Tenancy {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, TENANT_RULES).unwrap();
        let stack = Stack::builder()
            .gateway(GatewayOptions {
                api_token: Some(TOKEN.into()),
                authz: Some(AuthzSettings::new(rules)),
                dapr: dapr.clone(),
                ..GatewayOptions::default()
            })
            .start()
            .await;
        let admin = Gateway::start(
            stack.broker.port(),
            GatewayOptions {
                dapr,
                ..GatewayOptions::default()
            },
        )
        .await;
        admin.wait_ready().await;
        let store = broker_store(stack.broker.addr).await;
        Tenancy {
            stack,
            admin,
            store,
            _rules: dir,
        }
    }

    fn tenant(&self) -> &Gateway {
        &self.stack.gateway
    }

    /// The value the store holds under `key`, read past every gateway.
    async fn raw(&self, key: &[u8]) -> Option<Vec<u8>> {
        raw_get(&self.store, key).await
    }
}

/// How a tenant tries to write the gateway's own records.
#[derive(Debug, Clone, Copy)]
enum Through {
    /// `PUT /keys/...` of the record and the lease.
    Keys,
    /// A Dapr save of the record, a Dapr `tryLock` of the lease, over HTTP.
    DaprHttp,
    /// The same over gRPC.
    DaprGrpc,
}

/// Runs Python `code` after a prelude that gives it `stub`, Dapr's
/// generated gRPC stub on the gateway at `api`, `md`, the metadata that
/// carries the API token, and `code_of(call)`, a call's gRPC status code
/// name; `env` are environment variables for it. Returns what it printed.
pub(crate) async fn grpc_python(
    api: std::net::SocketAddr,
    code: &str,
    env: &[(&str, String)],
) -> String {
    const PRELUDE: &str = r#"
import base64, json, os, grpc
from dapr.proto import api_service_v1, api_v1, common_v1
stub = api_service_v1.DaprStub(grpc.insecure_channel(os.environ["GATEWAY"]))
md = [("dapr-api-token", os.environ["DAPR_API_TOKEN"])]
def code_of(call):
    try:
        call()
        return "OK"
    except grpc.RpcError as error:
        return error.code().name
"#;
    require_sdks();
    let mut command = tokio::process::Command::new(python());
    command
        .arg("-c")
        .arg(format!("{PRELUDE}\n{code}"))
        .env("GATEWAY", api.to_string())
        .env("DAPR_API_TOKEN", TOKEN)
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, command.output())
        .await
        .expect("the script finishes")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A tenant forges a committed transaction naming a key its rules refuse
/// (`admin/config`): an intent record and a lease on its own key pointing
/// at it, under keys its `*/orders/*` grant matches, written `through`
/// one route; then one etag save of its own key, which finds the lease.
/// Returns what each step answered.
async fn forge_a_transaction(tenancy: &Tenancy, through: Through) -> Vec<String> {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let gw = tenancy.tenant();
    let client = dapr_client();
    let state = gw.url("/v1.0/state/statestore");
    let etag = save_and_read_etag(&client, &gw.url(""), "t1/orders/1", "mine").await;
    let id = "x/orders/evil";
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000;
    let lease_value = format!("txn:{id}:{deadline}");
    let record_key = format!("{INTENT_PREFIX}{id}");
    let lease_key = format!("{LEASE_PREFIX}t1/orders/1");
    let record = json!({
        "lease": lease_value,
        "ops": [{"k": b64(b"admin/config"), "t": etag, "v": b64(b"\"pwned\""), "px": null}],
    });
    let bearer = format!("Bearer {TOKEN}");
    let status = |response: reqwest::Response| response.status().as_u16().to_string();
    match through {
        Through::Keys => {
            let put = |key: String, value: String| {
                gw.at(key.as_bytes())
                    .header("authorization", &bearer)
                    .put(value)
            };
            let record = put(record_key, record.to_string()).await;
            let lease = put(lease_key, lease_value).await;
            let trigger =
                save_with_etag(&client, &gw.url(""), "t1/orders/1", "mine-2", &etag).await;
            vec![status(record), status(lease), trigger.to_string()]
        }
        Through::DaprHttp => {
            let record = client
                .post(&state)
                .json(&json!([{"key": record_key, "value": record}]))
                .send()
                .await
                .unwrap();
            let lease = client
                .post(gw.url("/v1.0-alpha1/lock/lockstore"))
                .json(&json!({"resourceId": lease_key, "lockOwner": lease_value, "expiryInSeconds": 60}))
                .send()
                .await
                .unwrap();
            let lease = format!("{} {}", lease.status(), lease.text().await.unwrap());
            let trigger =
                save_with_etag(&client, &gw.url(""), "t1/orders/1", "mine-2", &etag).await;
            vec![status(record), lease, trigger.to_string()]
        }
        Through::DaprGrpc => {
            let script = r#"
record = code_of(lambda: stub.SaveState(api_v1.SaveStateRequest(store_name="statestore", states=[
    common_v1.StateItem(key=os.environ["RECORD_KEY"], value=os.environ["RECORD"].encode())]), metadata=md))
lease = []
lease.append(code_of(lambda: lease.append(stub.TryLockAlpha1(api_v1.TryLockRequest(store_name="lockstore",
    resource_id=os.environ["LEASE_KEY"], lock_owner=os.environ["LEASE_VALUE"], expiry_in_seconds=60), metadata=md).success)))
trigger = code_of(lambda: stub.SaveState(api_v1.SaveStateRequest(store_name="statestore", states=[
    common_v1.StateItem(key="t1/orders/1", value=b"mine-2", etag=common_v1.Etag(value=os.environ["ETAG"]))]), metadata=md))
print(json.dumps([record, " ".join(map(str, lease)), trigger]))
"#;
            let printed = grpc_python(
                gw.api,
                script,
                &[
                    ("RECORD_KEY", record_key),
                    ("RECORD", record.to_string()),
                    ("LEASE_KEY", lease_key),
                    ("LEASE_VALUE", lease_value),
                    ("ETAG", etag),
                ],
            )
            .await;
            serde_json::from_str(printed.trim()).expect("the script's answers")
        }
    }
}

/// The forged transaction of [`forge_a_transaction`] changed nothing but
/// the tenant's own key: the admin's key holds its value and takes plain
/// writes, and no record or lease of the tenant's is in the store.
async fn assert_forgery_changed_nothing(tenancy: &Tenancy, through: Through) {
    let admin = &tenancy.admin;
    assert_eq!(admin.put(b"admin/config", "original").await.status(), 200);
    let denied = tenancy
        .tenant()
        .at(b"admin/config")
        .header("authorization", format!("Bearer {TOKEN}"))
        .put("tenant")
        .await;
    assert_eq!(
        denied.status(),
        403,
        "the tenant's rules refuse admin/config"
    );

    let answers = forge_a_transaction(tenancy, through).await;
    assert_eq!(
        tenancy.raw(b"admin/config").await.as_deref(),
        Some(&b"original"[..]),
        "{through:?}: the forged transaction wrote a key the rules refuse ({answers:?})"
    );
    let put = admin.put(b"admin/config", "next").await;
    assert_eq!(
        put.status(),
        200,
        "{through:?}: the admin's own write ({answers:?})"
    );
    for key in [
        format!("{INTENT_PREFIX}x/orders/evil"),
        format!("{LEASE_PREFIX}t1/orders/1"),
    ] {
        assert_eq!(
            tenancy.raw(key.as_bytes()).await,
            None,
            "{through:?}: {key} ({answers:?})"
        );
    }
}

#[tokio::test]
async fn a_tenant_cannot_forge_the_gateways_records_through_the_key_routes() {
    let tenancy = Tenancy::start(DaprSettings::default()).await;
    assert_forgery_changed_nothing(&tenancy, Through::Keys).await;
}

#[tokio::test]
async fn a_tenant_cannot_forge_the_gateways_records_through_daprs_http_api() {
    let tenancy = Tenancy::start(DaprSettings::default()).await;
    assert_forgery_changed_nothing(&tenancy, Through::DaprHttp).await;
}

#[tokio::test]
async fn a_tenant_cannot_forge_the_gateways_records_through_daprs_grpc_api() {
    let tenancy = Tenancy::start(DaprSettings::default()).await;
    assert_forgery_changed_nothing(&tenancy, Through::DaprGrpc).await;
}

/// Dapr's refusal of a key with `||`, as its state API words it over gRPC.
fn illegal(key: &str) -> String {
    format!("input key/keyPrefix '{key}' can't contain '||'")
}

/// Asserts Dapr's HTTP answer to a state key with `||`: 400
/// `ERR_MALFORMED_REQUEST`, its message wrapped as Dapr's HTTP handlers
/// wrap it, and its three details.
async fn assert_illegal_key_over_http(response: reqwest::Response, key: &str, what: &str) {
    assert_eq!(response.status(), 400, "{what}");
    let body: Value = response.json().await.unwrap();
    let message = format!("api error: code = InvalidArgument desc = {}", illegal(key));
    assert_eq!(
        body,
        json!({
            "errorCode": "ERR_MALFORMED_REQUEST",
            "message": message,
            "details": [
                {"@type": "type.googleapis.com/google.rpc.BadRequest",
                 "field_violations": [{"field": key, "description": message}]},
                {"@type": "type.googleapis.com/google.rpc.ResourceInfo",
                 "resource_type": "state", "resource_name": "statestore", "owner": "", "description": ""},
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                 "reason": "DAPR_STATE_ILLEGAL_KEY", "domain": "dapr.io", "metadata": null},
            ],
        }),
        "{what}"
    );
}

#[tokio::test]
async fn keys_with_the_separator_are_refused_over_http_as_dapr_refuses_them() {
    let stack = transactional_stack().await;
    let gw = &stack.gateway;
    let client = dapr_client();
    let state = gw.url("/v1.0/state/statestore");
    let key = "dapr-etag-lease||victim";
    let get = client.get(format!("{state}/{key}")).send().await.unwrap();
    assert_illegal_key_over_http(get, key, "get").await;
    let delete = client
        .delete(format!("{state}/{key}"))
        .send()
        .await
        .unwrap();
    assert_illegal_key_over_http(delete, key, "delete").await;
    let save = client
        .post(&state)
        .json(&json!([{"key": "fine", "value": 1}, {"key": key, "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_illegal_key_over_http(save, key, "save").await;
    let bulk = client
        .post(format!("{state}/bulk"))
        .json(&json!({"keys": ["fine", "a||"]}))
        .send()
        .await
        .unwrap();
    assert_illegal_key_over_http(bulk, "a||", "bulk get").await;
    for operation in ["upsert", "delete"] {
        let transaction = client
            .post(format!("{state}/transaction"))
            .json(&json!({"operations": [
                {"operation": "upsert", "request": {"key": "fine", "value": 1}},
                {"operation": operation, "request": {"key": "||b", "value": 1}},
            ]}))
            .send()
            .await
            .unwrap();
        assert_illegal_key_over_http(transaction, "||b", operation).await;
    }
    for (path, code, failed) in [
        ("lock", "ERR_TRY_LOCK", "failed to try acquiring lock"),
        ("unlock", "ERR_UNLOCK", "failed to release lock"),
    ] {
        let answer = client
            .post(gw.url(&format!("/v1.0-alpha1/{path}/lockstore")))
            .json(&json!({"resourceId": "dapr-etag-lease||victim3", "lockOwner": "me", "expiryInSeconds": 30}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 500, "{path}");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(
            body,
            json!({"errorCode": code, "message": format!("{failed}: {}", illegal("dapr-etag-lease||victim3"))}),
            "{path}"
        );
    }

    // Nothing was written: the keys those names would have blocked take
    // every write at once.
    let started = Instant::now();
    let etag = save_and_read_etag(&client, &gw.url(""), "victim", "v1").await;
    assert_eq!(
        save_with_etag(&client, &gw.url(""), "victim", "v2", &etag).await,
        204
    );
    let etag = save_and_read_etag(&client, &gw.url(""), "victim3", "v1").await;
    assert_eq!(
        save_with_etag(&client, &gw.url(""), "victim3", "v2", &etag).await,
        204
    );
    let transaction = client
        .post(format!("{state}/transaction"))
        .json(&json!({"operations": [
            {"operation": "upsert", "request": {"key": "victim", "value": 3}},
            {"operation": "delete", "request": {"key": "victim3"}},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(transaction.status(), 204);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn keys_with_the_separator_are_refused_over_grpc_as_dapr_refuses_them() {
    let stack = transactional_stack().await;
    let script = r#"
from google.rpc import status_pb2, error_details_pb2

def answer(call):
    try:
        call()
        return {"code": "OK"}
    except grpc.RpcError as error:
        details = []
        for name, value in error.trailing_metadata() or ():
            if name == "grpc-status-details-bin":
                status = status_pb2.Status.FromString(value)
                for any in status.details:
                    if any.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                        info = error_details_pb2.ErrorInfo()
                        any.Unpack(info)
                        details.append({"ErrorInfo": [info.reason, info.domain, dict(info.metadata)]})
                    elif any.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                        bad = error_details_pb2.BadRequest()
                        any.Unpack(bad)
                        details.append({"BadRequest": [[v.field, v.description] for v in bad.field_violations]})
                    elif any.Is(error_details_pb2.ResourceInfo.DESCRIPTOR):
                        info = error_details_pb2.ResourceInfo()
                        any.Unpack(info)
                        details.append({"ResourceInfo": [info.resource_type, info.resource_name, info.owner, info.description]})
                    else:
                        details.append({"other": any.type_url})
        return {"code": error.code().name, "message": error.details(), "details": details}

key = "dapr-etag-lease||victim"
item = lambda k: common_v1.StateItem(key=k, value=b"1")
op = lambda kind, k: api_v1.TransactionalStateOperation(operationType=kind, request=item(k))
answers = {
    "get": answer(lambda: stub.GetState(api_v1.GetStateRequest(store_name="statestore", key=key), metadata=md)),
    "bulk": answer(lambda: stub.GetBulkState(api_v1.GetBulkStateRequest(store_name="statestore", keys=["fine", key]), metadata=md)),
    "save": answer(lambda: stub.SaveState(api_v1.SaveStateRequest(store_name="statestore", states=[item("fine"), item(key)]), metadata=md)),
    "delete": answer(lambda: stub.DeleteState(api_v1.DeleteStateRequest(store_name="statestore", key=key), metadata=md)),
    "upsert": answer(lambda: stub.ExecuteStateTransaction(api_v1.ExecuteStateTransactionRequest(storeName="statestore",
        operations=[op("upsert", "fine"), op("upsert", key)]), metadata=md)),
    "transaction delete": answer(lambda: stub.ExecuteStateTransaction(api_v1.ExecuteStateTransactionRequest(storeName="statestore",
        operations=[op("delete", key)]), metadata=md)),
    "tryLock": answer(lambda: stub.TryLockAlpha1(api_v1.TryLockRequest(store_name="lockstore", resource_id=key, lock_owner="me", expiry_in_seconds=30), metadata=md)),
    "unlock": answer(lambda: stub.UnlockAlpha1(api_v1.UnlockRequest(store_name="lockstore", resource_id=key, lock_owner="me"), metadata=md)),
}
print(json.dumps(answers))
"#;
    let printed = grpc_python(stack.gateway.api, script, &[]).await;
    let answers: Value = serde_json::from_str(printed.trim()).unwrap();
    let key = "dapr-etag-lease||victim";
    let state = json!({
        "code": "INVALID_ARGUMENT",
        "message": illegal(key),
        "details": [
            {"BadRequest": [[key, illegal(key)]]},
            {"ResourceInfo": ["state", "statestore", "", ""]},
            {"ErrorInfo": ["DAPR_STATE_ILLEGAL_KEY", "dapr.io", {}]},
        ],
    });
    for call in [
        "get",
        "bulk",
        "save",
        "delete",
        "upsert",
        "transaction delete",
    ] {
        assert_eq!(answers[call], state, "{call}");
    }
    for (call, failed) in [
        ("tryLock", "failed to try acquiring lock"),
        ("unlock", "failed to release lock"),
    ] {
        assert_eq!(
            answers[call],
            json!({"code": "INTERNAL", "message": format!("{failed}: {}", illegal(key)), "details": []}),
            "{call}"
        );
    }
    let store = broker_store(stack.broker.addr).await;
    assert_eq!(
        raw_get(&store, b"fine").await,
        None,
        "no item of a refused request"
    );
}

#[tokio::test]
async fn the_app_id_prefix_names_keys_as_dapr_does() {
    let stack = stack_with_dapr(DaprSettings {
        app_id: "myapp".into(),
        key_prefix: KeyPrefix::AppId,
        ..DaprSettings::default()
    })
    .await;
    let gw = &stack.gateway;
    let save = gw
        .http
        .post(gw.url("/v1.0/state/statestore"))
        .json(&json!([{"key": "order-1", "value": "x"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(save.status(), 204);
    let raw = gw.get(b"myapp||order-1").await;
    assert_eq!(raw.status(), 200);
    assert_eq!(raw.bytes().await.unwrap().as_ref(), b"\"x\"");
    assert_eq!(gw.get(b"order-1").await.status(), 404);
}

/// Saves `key` as `value` with one Dapr save to `state` (the state
/// store's URL), which must answer 204.
async fn save_one(client: &reqwest::Client, state: &str, key: &str, value: Value) {
    let saved = client
        .post(state)
        .json(&json!([{"key": key, "value": value}]))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), 204, "saving {key}");
}

/// Saves `key` (a JSON string `value`) through the Dapr API at `url` and
/// reads it back: its etag.
async fn save_and_read_etag(client: &reqwest::Client, url: &str, key: &str, value: &str) -> String {
    let state = format!("{url}/v1.0/state/statestore");
    save_one(client, &state, key, json!(value)).await;
    let read = client.get(format!("{state}/{key}")).send().await.unwrap();
    read.headers()["etag"].to_str().unwrap().to_owned()
}

/// One etag save through `gateway` (`url` is its API), as a status code.
async fn save_with_etag(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    value: &str,
    etag: &str,
) -> u16 {
    client
        .post(format!("{url}/v1.0/state/statestore"))
        .json(&json!([{"key": key, "value": value, "etag": etag, "options": {"concurrency": "first-write"}}]))
        .send()
        .await
        .expect("an answer")
        .status()
        .as_u16()
}

#[tokio::test]
async fn two_gateways_never_both_win_with_one_etag_even_when_one_is_paused_mid_write() {
    // Gateway A is a process reaching the broker through a proxy that
    // delays each packet, so its five round trips take long enough to be
    // frozen in the middle; gateway B shares the store directly.
    let lease = Duration::from_millis(800);
    let stack = stack_with_dapr(DaprSettings {
        etag_lease: lease,
        ..DaprSettings::default()
    })
    .await;
    let proxy = FaultProxy::start(stack.broker.addr).await;
    let a = GatewayProcess::start(proxy.port(), &["--dapr-etag-lease", "800ms"]).await;
    proxy.set_delay(Duration::from_millis(10));
    let b = &stack.gateway;
    let client = http_client();
    let a_url = format!("http://{}", a.api);
    let b_url = format!("http://{}", b.api);
    let mut b_waited = 0;
    for round in 0..12 {
        let key = format!("race/{round}");
        let etag = save_and_read_etag(&client, &b_url, &key, "initial").await;

        let a_save = tokio::spawn({
            let (client, a_url, key, etag) =
                (client.clone(), a_url.clone(), key.clone(), etag.clone());
            async move { save_with_etag(&client, &a_url, &key, "from-a", &etag).await }
        });
        // Freeze A somewhere in its write: before, during or after.
        tokio::time::sleep(Duration::from_millis(20 + 15 * (round % 8))).await;
        freeze(a.pid());
        let started = Instant::now();
        let b_status = save_with_etag(&client, &b_url, &key, "from-b", &etag).await;
        if started.elapsed() > lease / 2 {
            b_waited += 1;
        }
        // Past A's lease, then let it finish.
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        thaw(a.pid());
        let a_status = tokio::time::timeout(Duration::from_secs(30), a_save)
            .await
            .expect("A answers once thawed")
            .unwrap();
        assert!(
            [204, 409].contains(&a_status) && [204, 409].contains(&b_status),
            "round {round}: A {a_status}, B {b_status}"
        );
        assert!(
            !(a_status == 204 && b_status == 204),
            "round {round}: both writers won with one etag"
        );
        let value = client
            .get(format!("{b_url}/v1.0/state/statestore/{key}"))
            .send()
            .await
            .unwrap();
        let value = value.text().await.unwrap();
        let expected = match (a_status, b_status) {
            (204, _) => "\"from-a\"",
            (_, 204) => "\"from-b\"",
            _ => "\"initial\"",
        };
        assert_eq!(value, expected, "round {round}: A {a_status}, B {b_status}");
    }
    // Some rounds froze A while it held its lease (B had to wait for it).
    assert!(b_waited > 0, "no round froze A while it held its lease");
}

/// The fenced code blocks of `docs/dapr.md` in `language`.
fn doc_examples(language: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/dapr.md"))
        .expect("docs/dapr.md");
    let fence = format!("```{language}\n");
    text.split(&fence)
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn the_moving_from_dapr_examples_run_as_written() {
    require_sdks();
    let stack = stack_with_token().await;
    let dir = tempfile::tempdir().unwrap();
    // The JS example imports @dapr/dapr from beside itself.
    std::os::unix::fs::symlink(
        dapr_dir().join("node_modules"),
        dir.path().join("node_modules"),
    )
    .unwrap();
    let [js] = doc_examples("js").try_into().expect("one JS example");
    let [py] = doc_examples("python")
        .try_into()
        .expect("one Python example");
    std::fs::write(dir.path().join("example.mjs"), js).unwrap();
    std::fs::write(dir.path().join("example.py"), py).unwrap();
    for (program, script, expected) in [
        (PathBuf::from("node"), "example.mjs", "widget x2"),
        (
            python(),
            "example.py",
            "{\"item\": \"gadget\", \"qty\": 3} etag ",
        ),
    ] {
        let mut command = tokio::process::Command::new(&program);
        command
            .arg(dir.path().join(script))
            .current_dir(dir.path())
            .env("DAPR_RUNTIME_HOST", "127.0.0.1")
            .env("DAPR_HTTP_PORT", stack.gateway.api.port().to_string())
            .env("DAPR_GRPC_PORT", stack.gateway.api.port().to_string())
            .env("DAPR_API_TOKEN", TOKEN)
            .kill_on_drop(true);
        let output = tokio::time::timeout(SCRIPT_TIMEOUT, command.output())
            .await
            .expect("the example finishes")
            .expect("the example runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains(expected),
            "{script}: {}\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test]
async fn a_transaction_cut_by_a_gateway_crash_is_never_seen_half_applied() {
    // Gateway A runs transactions through a proxy that delays each packet,
    // and is killed (SIGKILL) at a different point of each; gateway B then
    // reads the keys through the Dapr API: all of a transaction or none.
    let lease = Duration::from_millis(500);
    let stack = stack_with_dapr(DaprSettings {
        transactions: true,
        etag_lease: lease,
        ..DaprSettings::default()
    })
    .await;
    let b = &stack.gateway;
    let client = http_client();
    let b_url = format!("http://{}", b.api);
    let proxy = FaultProxy::start(stack.broker.addr).await;
    proxy.set_delay(Duration::from_millis(8));
    let keys = ["t/1", "t/2", "t/3", "t/4"];
    // How long a whole transaction takes through the proxy.
    let full = {
        let a = GatewayProcess::start(proxy.port(), &["--dapr-transactions", "true"]).await;
        let operations: Vec<Value> = keys
            .iter()
            .map(|key| json!({"operation": "upsert", "request": {"key": key, "value": "first"}}))
            .collect();
        let started = Instant::now();
        let answer = client
            .post(format!(
                "http://{}/v1.0/state/statestore/transaction",
                a.api
            ))
            .json(&json!({"operations": operations}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 204);
        started.elapsed()
    };
    let (mut all, mut none, mut half_on_the_store) = (0, 0, 0);
    for round in 0..16u32 {
        let a = GatewayProcess::start(
            proxy.port(),
            &["--dapr-transactions", "true", "--dapr-etag-lease", "500ms"],
        )
        .await;
        let value = format!("round-{round}");
        let operations: Vec<Value> = keys
            .iter()
            .map(|key| json!({"operation": "upsert", "request": {"key": key, "value": value}}))
            .collect();
        let a_url = format!("http://{}/v1.0/state/statestore/transaction", a.api);
        let transaction = tokio::spawn({
            let client = client.clone();
            async move {
                let _ = client
                    .post(a_url)
                    .json(&json!({"operations": operations}))
                    .send()
                    .await;
            }
        });
        // Kill A at a different point of its transaction each round:
        // leases, checks, commit, or part way through applying.
        // From 30% to 120% of a whole one: the last third or so applies.
        tokio::time::sleep(full * (30 + 6 * round) / 100).await;
        drop(a);
        transaction.abort();

        // What the store holds right now, key by key (not through Dapr).
        let mut raw = Vec::new();
        for key in keys {
            let response = b.get(key.as_bytes()).await;
            raw.push(response.status() == 200 && response.text().await.unwrap().contains(&value));
        }
        if raw.iter().any(|&written| written) && !raw.iter().all(|&written| written) {
            half_on_the_store += 1;
        }
        // Past A's deadline, so an unfinished transaction is resolved.
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        let bulk: Value = client
            .post(format!("{b_url}/v1.0/state/statestore/bulk"))
            .json(&json!({"keys": keys}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let seen: Vec<bool> = bulk
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["data"] == json!(value))
            .collect();
        assert!(
            seen.iter().all(|&s| s) || seen.iter().all(|&s| !s),
            "round {round}: a reader saw half a transaction: {bulk}"
        );
        if seen[0] {
            all += 1;
        } else {
            none += 1;
        }
        // B can write every key again: no lease is left behind.
        let save = client
            .post(format!("{b_url}/v1.0/state/statestore"))
            .json(
                &keys
                    .iter()
                    .map(|key| json!({"key": key, "value": "reset"}))
                    .collect::<Vec<_>>(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(save.status(), 204, "round {round}");
    }
    // The rounds covered both outcomes, and some crashes left the store
    // itself half written, which the readers did not see.
    assert!(all > 0 && none > 0, "all {all}, none {none}");
    assert!(half_on_the_store > 0, "no crash landed while applying");
}

/// Leaves in the store what a gateway that crashed right after committing a
/// one-key transaction leaves: the key's lease held by the transaction and
/// its intent record (upsert `key` to the JSON string `value`), not applied.
/// Written with broker credentials: no gateway route reaches these keys.
async fn committed_unapplied_transaction(store: &StoreClient, key: &str, value: &str) {
    let id = format!("{:032x}", rand::random::<u128>());
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000;
    let lease_value = format!("txn:{id}:{deadline}");
    let lease = format!("{LEASE_PREFIX}{key}");
    let token = raw_set(store, lease.as_bytes(), lease_value.as_bytes())
        .await
        .encode();
    // The record's bytes: its format's name, then length-prefixed fields
    // (u32, big-endian): the lease, one op of the key, its token, kind 1
    // (a set without expiry) and the value.
    let field = |record: &mut Vec<u8>, bytes: &[u8]| {
        record.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_be_bytes());
        record.extend_from_slice(bytes);
    };
    let mut record = b"dapr-txn/2\n".to_vec();
    field(&mut record, lease_value.as_bytes());
    record.extend_from_slice(&1u32.to_be_bytes());
    field(&mut record, key.as_bytes());
    field(&mut record, token.as_bytes());
    record.push(1);
    field(&mut record, json!(value).to_string().as_bytes());
    let record_key = format!("{INTENT_PREFIX}{id}");
    raw_set(store, record_key.as_bytes(), &record).await;
}

#[tokio::test]
async fn writes_without_an_etag_come_after_a_committed_transaction_holding_the_key() {
    // A committed transaction's leftovers hold each key's lease; a Dapr
    // write without an etag must roll it forward first, as a read does, so
    // it is ordered after the transaction: a first-write then finds the key
    // present, a plain save or delete wins over the transaction's value.
    let stack = transactional_stack().await;
    let gw = &stack.gateway;
    let store = broker_store(stack.broker.addr).await;
    let client = dapr_client();
    let url = format!("http://{}/v1.0/state/statestore", gw.api);
    let read = |key: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let response = client.get(format!("{url}/{key}")).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };

    committed_unapplied_transaction(&store, "gap/first", "from-txn").await;
    let first_write = client
        .post(&url)
        .json(&json!([{"key": "gap/first", "value": "first", "options": {"concurrency": "first-write"}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(first_write, 409).await,
        "ERR_STATE_SAVE",
        "a first-write save of a key a committed transaction wrote"
    );
    assert_eq!(read("gap/first").await, (200, "\"from-txn\"".to_owned()));

    committed_unapplied_transaction(&store, "gap/plain", "from-txn").await;
    let plain = client
        .post(&url)
        .json(&json!([{"key": "gap/plain", "value": "plain"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 204);
    assert_eq!(read("gap/plain").await, (200, "\"plain\"".to_owned()));

    committed_unapplied_transaction(&store, "gap/deleted", "from-txn").await;
    let delete = client
        .delete(format!("{url}/gap/deleted"))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 204);
    assert_eq!(read("gap/deleted").await.0, 204);

    // No lease or intent record is left behind.
    for key in ["gap/first", "gap/plain", "gap/deleted"] {
        let lease = raw_get(&store, format!("{LEASE_PREFIX}{key}").as_bytes()).await;
        assert_eq!(lease, None, "{key}'s lease");
    }
}

/// An intent record as a broker client could forge it: transaction `id`
/// holding leases with `lease_value`, upserting each key of `ops` to the
/// JSON string of its value, fenced with `token`.
fn intent_record(lease_value: &str, ops: &[(&str, &str)], token: &str) -> String {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let ops: Vec<Value> = ops
        .iter()
        .map(|(key, value)| {
            json!({"k": b64(key.as_bytes()), "t": token, "v": b64(json!(value).to_string().as_bytes()), "px": null})
        })
        .collect();
    json!({"lease": lease_value, "ops": ops}).to_string()
}

#[tokio::test]
async fn a_transactions_record_moves_only_keys_whose_leases_name_it() {
    // Records written past the gateway (with broker credentials): a record
    // is acted on only if it names the lease value that led to it and that
    // lease's key, and each op only while its key's lease holds that value.
    let stack = stack_with_dapr(DaprSettings {
        transactions: true,
        lease_wait: Duration::from_millis(500),
        ..DaprSettings::default()
    })
    .await;
    let gw = &stack.gateway;
    let store = broker_store(stack.broker.addr).await;
    assert_eq!(gw.put(b"admin/config", "original").await.status(), 200);
    let client = http_client();
    let read = |key: &'static str| {
        let (client, url) = (client.clone(), gw.url("/v1.0/state/statestore"));
        async move {
            let response = client.get(format!("{url}/{key}")).send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    let far = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000;

    // The record names the lease and its key, and a second key whose lease
    // is not the transaction's: only the first key is written.
    let lease_value = format!("txn:{:032x}:{far}", rand::random::<u128>());
    let id = lease_value.split(':').nth(1).unwrap().to_owned();
    let token = raw_set(
        &store,
        format!("{LEASE_PREFIX}t/own").as_bytes(),
        lease_value.as_bytes(),
    )
    .await;
    let record = intent_record(
        &lease_value,
        &[("t/own", "from-record"), ("admin/config", "pwned")],
        &token.encode(),
    );
    raw_set(
        &store,
        format!("{INTENT_PREFIX}{id}").as_bytes(),
        record.as_bytes(),
    )
    .await;
    assert_eq!(read("t/own").await, (200, "\"from-record\"".to_owned()));
    assert_eq!(
        raw_get(&store, b"admin/config").await.as_deref(),
        Some(&b"original"[..]),
        "an op whose key's lease does not name the transaction"
    );
    assert_eq!(
        raw_get(&store, format!("{INTENT_PREFIX}{id}").as_bytes()).await,
        None
    );

    // A record that names another lease value, and one that does not name
    // the lease's key: neither is acted on (a read finds the key as it is).
    for (key, record_lease, record_key) in [
        ("t/two", "txn:someone-else:0", "t/two"),
        ("t/three", "", "admin/config"),
    ] {
        let lease_value = format!("txn:{:032x}:{far}", rand::random::<u128>());
        let id = lease_value.split(':').nth(1).unwrap().to_owned();
        let record_lease = if record_lease.is_empty() {
            lease_value.as_str()
        } else {
            record_lease
        };
        for leased in [key, record_key] {
            raw_set(
                &store,
                format!("{LEASE_PREFIX}{leased}").as_bytes(),
                lease_value.as_bytes(),
            )
            .await;
        }
        let record = intent_record(record_lease, &[(record_key, "pwned")], &token.encode());
        let record_at = format!("{INTENT_PREFIX}{id}");
        raw_set(&store, record_at.as_bytes(), record.as_bytes()).await;
        let (status, body) = read(key).await;
        assert_eq!(status, 204, "{key}: {body}");
        assert_eq!(raw_get(&store, key.as_bytes()).await, None, "{key}");
        assert_eq!(
            raw_get(&store, b"admin/config").await.as_deref(),
            Some(&b"original"[..]),
            "{key}"
        );
        assert_eq!(
            raw_get(&store, record_at.as_bytes()).await.as_deref(),
            Some(record.as_bytes()),
            "{key}: the record is left as it is"
        );
    }
}

#[tokio::test]
async fn a_read_concurrent_with_an_etag_save_sees_each_value_under_one_etag() {
    // An etag save claims its key (the value it read, written again) before
    // it writes; a Dapr read must never return that claim, an etag no save
    // can use, so each value is seen under the etag its write gave it.
    let stack = transactional_stack().await;
    let client = dapr_client();
    let api = format!("http://{}", stack.gateway.api);
    let url = format!("{api}/v1.0/state/statestore");
    let read = |client: reqwest::Client, url: String| async move {
        let response = client.get(format!("{url}/claimed")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let etag = response.headers()["etag"].to_str().unwrap().to_owned();
        (response.text().await.unwrap(), etag)
    };
    let saved = client
        .post(&url)
        .json(&json!([{"key": "claimed", "value": "v0"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), 204);

    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let reads = std::sync::Arc::new(AtomicUsize::new(0));
    let reader = tokio::spawn({
        let (client, url, done, reads) = (client.clone(), url.clone(), done.clone(), reads.clone());
        async move {
            let mut seen = Vec::new();
            while !done.load(Ordering::Relaxed) {
                seen.push(read(client.clone(), url.clone()).await);
                reads.fetch_add(1, Ordering::Relaxed);
            }
            seen
        }
    });
    let mut seen = Vec::new();
    // 150 saves, and more (up to 1,500) until 50 reads ran beside them: on
    // a loaded machine the reader may get fewer turns.
    let mut n = 0;
    while n < 150 || (reads.load(Ordering::Relaxed) < 50 && n < 1500) {
        n += 1;
        let (value, etag) = read(client.clone(), url.clone()).await;
        seen.push((value, etag.clone()));
        let saved = save_with_etag(&client, &api, "claimed", &format!("v{n}"), &etag).await;
        assert_eq!(saved, 204, "the only writer's etag save {n}");
    }
    done.store(true, Ordering::Relaxed);
    let concurrent = reader.await.unwrap();
    assert!(
        concurrent.len() >= 50,
        "only {} reads during the saves",
        concurrent.len()
    );
    seen.extend(concurrent);

    let mut etags: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for (value, etag) in &seen {
        etags.entry(value.clone()).or_default().insert(etag.clone());
    }
    let reread: Vec<_> = etags.iter().filter(|(_, etags)| etags.len() > 1).collect();
    assert!(
        reread.is_empty(),
        "{} of {} values read under more than one etag: {reread:?}",
        reread.len(),
        etags.len()
    );
}
