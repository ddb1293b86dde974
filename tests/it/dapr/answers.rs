//! Every Dapr answer is true, and Dapr's semantics where they are subtle:
//! a write answered 204 landed, a transaction answered 204 applied every
//! operation, a failed save leaves the value and its expiry as they were,
//! what a failure leaves behind is gone by its deadline; query metadata
//! overrides item metadata, a transaction applies repeated keys in order,
//! and a `first-write` delete without an etag deletes. Over HTTP and, where
//! the request exists there, over gRPC (raw calls through the Python SDK's
//! generated stubs: `tests/dapr/grpc_calls.py`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use statestore_gateway::dapr::DaprSettings;
use statestore_gateway::store::reserved::LEASE_PREFIX;

use super::{
    SCRIPT_TIMEOUT, TOKEN, dapr_client, dapr_dir, python, require_sdks, stack_with_token,
    transactional_stack,
};
use crate::support::Mosquitto;
use crate::support::emulator::{RawClient, get_payload};
use crate::support::fault_proxy::FaultProxy;
use crate::support::gateway::{GatewayOptions, Stack};
use crate::support::gateway_process::GatewayProcess;
use crate::support::mosquitto::MosquittoConfig;

/// Dapr's HTTP API of one gateway, with the API token.
struct Dapr {
    client: reqwest::Client,
    api: String,
}

impl Dapr {
    fn of(api: SocketAddr) -> Self {
        Self {
            client: dapr_client(),
            api: format!("http://{api}"),
        }
    }

    /// `POST /v1.0/state/statestore?<query>` with `items`.
    async fn save_with_query(&self, query: &str, items: Value) -> reqwest::Response {
        self.client
            .post(format!("{}/v1.0/state/statestore?{query}", self.api))
            .json(&items)
            .send()
            .await
            .unwrap()
    }

    async fn save(&self, items: Value) -> reqwest::Response {
        self.save_with_query("", items).await
    }

    /// The status, the body as text and the etag of a Dapr read.
    async fn get(&self, key: &str) -> (u16, String, Option<String>) {
        let response = self
            .client
            .get(format!("{}/v1.0/state/statestore/{key}", self.api))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let etag = response
            .headers()
            .get("etag")
            .map(|etag| etag.to_str().unwrap().to_owned());
        (status, response.text().await.unwrap(), etag)
    }

    /// The value as text, or `None` when the key is absent.
    async fn value(&self, key: &str) -> Option<String> {
        let (status, body, _) = self.get(key).await;
        match status {
            200 => Some(body),
            204 => None,
            other => panic!("reading {key}: {other} {body}"),
        }
    }

    async fn etag(&self, key: &str) -> String {
        self.get(key).await.2.expect("a present key has an etag")
    }

    async fn delete(&self, key: &str) -> reqwest::Response {
        self.client
            .delete(format!("{}/v1.0/state/statestore/{key}", self.api))
            .send()
            .await
            .unwrap()
    }

    async fn transaction_with_query(&self, query: &str, operations: Value) -> reqwest::Response {
        self.client
            .post(format!(
                "{}/v1.0/state/statestore/transaction?{query}",
                self.api
            ))
            .json(&json!({ "operations": operations }))
            .send()
            .await
            .unwrap()
    }

    async fn transaction(&self, operations: Value) -> reqwest::Response {
        self.transaction_with_query("", operations).await
    }
}

/// The status and Dapr's `errorCode` and `message` of a failed answer.
async fn failure(response: reqwest::Response) -> (u16, String, String) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let body: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("answered {status} without Dapr's error body: {text:?}"));
    (
        status,
        body["errorCode"].as_str().unwrap_or_default().to_owned(),
        body["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Runs `calls` (`[{"method", "request"}]`, protobuf's JSON mapping)
/// against the gateway's gRPC API; each call's `{"code", "message",
/// "response"}`.
async fn grpc(api: SocketAddr, calls: Value) -> Vec<Value> {
    use tokio::io::AsyncWriteExt as _;
    require_sdks();
    let mut child = tokio::process::Command::new(python())
        .arg(dapr_dir().join("grpc_calls.py"))
        .current_dir(dapr_dir())
        .env("DAPR_RUNTIME_HOST", "127.0.0.1")
        .env("DAPR_GRPC_PORT", api.port().to_string())
        .env("DAPR_API_TOKEN", TOKEN)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(calls.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .expect("grpc_calls.py finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines = stdout.lines();
    assert!(
        output.status.success() && stdout.lines().last() == Some("ok"),
        "grpc_calls.py failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(lines.next().unwrap()).unwrap()
}

/// One gRPC state item: `value` as bytes, with its etag and metadata.
fn grpc_item(key: &str, value: &[u8], etag: Option<&str>, metadata: Value) -> Value {
    let mut item = json!({"key": key, "value": BASE64.encode(value), "metadata": metadata});
    if let Some(etag) = etag {
        item["etag"] = json!({ "value": etag });
    }
    item
}

fn save_call(items: Vec<Value>) -> Value {
    json!({"method": "SaveState", "request": {"storeName": "statestore", "states": items}})
}

fn get_call(key: &str) -> Value {
    json!({"method": "GetState", "request": {"storeName": "statestore", "key": key}})
}

fn delete_call(key: &str) -> Value {
    json!({"method": "DeleteState", "request": {"storeName": "statestore", "key": key}})
}

/// `ExecuteStateTransaction` of `(operation, item)` pairs.
fn transaction_call(operations: Vec<(&str, Value)>) -> Value {
    let operations: Vec<Value> = operations
        .into_iter()
        .map(|(operation, request)| json!({"operationType": operation, "request": request}))
        .collect();
    json!({"method": "ExecuteStateTransaction", "request": {"storeName": "statestore", "operations": operations}})
}

/// The data of a `GetState` answer, `None` when the key is absent.
fn grpc_data(answer: &Value) -> Option<Vec<u8>> {
    assert_eq!(answer["code"], "OK", "{answer}");
    answer["response"]["data"]
        .as_str()
        .map(|data| BASE64.decode(data).unwrap())
}

/// A fencing token `ahead` of now, as the store takes them (up to 60 s).
fn future_token(ahead: Duration) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    format!("{}:0:outside", (now + ahead).as_millis())
}

/// Writes `key` through `/keys` with a fencing token 45 s ahead, as a
/// writer outside the Dapr API may: no lease's token is newer for 45 s.
async fn write_fenced_ahead(stack: &Stack, key: &str, value: &str) {
    let written = stack
        .gateway
        .at(key.as_bytes())
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("fencing-token", future_token(Duration::from_secs(45)))
        .put(value.to_owned())
        .await;
    assert_eq!(written.status(), 200, "{:?}", written.text().await);
}

#[tokio::test]
async fn a_write_refused_for_a_newer_fencing_token_is_never_answered_as_done() {
    for transactions in [false, true] {
        let stack = if transactions {
            transactional_stack().await
        } else {
            stack_with_token().await
        };
        let dapr = Dapr::of(stack.gateway.api);
        let mode = if transactions {
            "transactions"
        } else {
            "plain"
        };
        write_fenced_ahead(&stack, "fenced/k", "\"outside\"").await;

        let saved = dapr
            .save(json!([{"key": "fenced/k", "value": "dapr"}]))
            .await;
        let (status, code, message) = failure(saved).await;
        assert_eq!((status, code.as_str()), (500, "ERR_STATE_SAVE"), "{mode}");
        assert!(message.contains("fencing token"), "{mode}: {message}");
        let etag = dapr.etag("fenced/k").await;
        let with_etag = dapr
            .save(json!([{"key": "fenced/k", "value": "dapr", "etag": etag}]))
            .await;
        assert_eq!(failure(with_etag).await.0, 500, "{mode}: an etag save");
        let deleted = dapr.delete("fenced/k").await;
        let (status, code, _) = failure(deleted).await;
        assert_eq!((status, code.as_str()), (500, "ERR_STATE_DELETE"), "{mode}");
        assert_eq!(
            dapr.value("fenced/k").await.as_deref(),
            Some("\"outside\""),
            "{mode}: nothing landed"
        );

        let grpc_answers = grpc(
            stack.gateway.api,
            json!([
                save_call(vec![grpc_item("fenced/k", b"grpc", None, json!({}))]),
                delete_call("fenced/k"),
                get_call("fenced/k"),
            ]),
        )
        .await;
        assert_eq!(
            grpc_answers[0]["code"], "INTERNAL",
            "{mode}: {grpc_answers:?}"
        );
        assert_eq!(
            grpc_answers[1]["code"], "INTERNAL",
            "{mode}: {grpc_answers:?}"
        );
        assert_eq!(
            grpc_data(&grpc_answers[2]).as_deref(),
            Some(&b"\"outside\""[..])
        );

        if transactions {
            // The other key is not written: all or nothing.
            let ops = json!([
                {"operation": "upsert", "request": {"key": "fenced/other", "value": 1}},
                {"operation": "upsert", "request": {"key": "fenced/k", "value": 2}},
            ]);
            let (status, code, message) = failure(dapr.transaction(ops).await).await;
            assert_eq!((status, code.as_str()), (500, "ERR_STATE_TRANSACTION"));
            assert!(message.contains("fencing token"), "{message}");
            let answers = grpc(
                stack.gateway.api,
                json!([transaction_call(vec![
                    ("upsert", grpc_item("fenced/other", b"1", None, json!({}))),
                    ("delete", grpc_item("fenced/k", b"", None, json!({}))),
                ])]),
            )
            .await;
            assert_eq!(answers[0]["code"], "INTERNAL", "{answers:?}");
            assert_eq!(dapr.value("fenced/other").await, None);
            assert_eq!(dapr.value("fenced/k").await.as_deref(), Some("\"outside\""));
            // Nothing is left holding the keys.
            let saved = dapr
                .save(json!([{"key": "fenced/other", "value": 3}]))
                .await;
            assert_eq!(saved.status(), 204);
        }
    }
}

/// A gateway taking the API token, with Dapr transactions on or off.
fn gateway_options(transactions: bool) -> GatewayOptions {
    GatewayOptions {
        api_token: Some(TOKEN.into()),
        dapr: DaprSettings {
            transactions,
            ..DaprSettings::default()
        },
        ..GatewayOptions::default()
    }
}

/// A stack whose store refuses writes past `max_bytes` in all (its quota).
async fn stack_with_quota(max_bytes: usize, transactions: bool) -> Stack {
    Stack::builder()
        .emulator(move |config| config.max_bytes = Some(max_bytes))
        .gateway(gateway_options(transactions))
        .start()
        .await
}

#[tokio::test]
async fn an_etag_save_the_store_refuses_keeps_the_value_and_its_expiry() {
    // The store's quota takes the keys as they are but not a value of
    // 100 kB: the etag save's last step is refused, after its claim. The
    // expiry leaves the failures most of its time even on a loaded machine.
    const TTL: Duration = Duration::from_secs(10);
    let ttl = TTL.as_secs().to_string();
    for transactions in [false, true] {
        let stack = stack_with_quota(64 * 1024, transactions).await;
        let dapr = Dapr::of(stack.gateway.api);
        let big = "x".repeat(100_000);
        let started = Instant::now();
        let saved = dapr
            .save(json!([
                {"key": "quota/ttl", "value": "v0", "metadata": {"ttlInSeconds": ttl}},
                {"key": "quota/plain", "value": "p0"},
            ]))
            .await;
        assert_eq!(saved.status(), 204);
        let answers = grpc(
            stack.gateway.api,
            json!([save_call(vec![
                grpc_item("quota/grpc-ttl", b"g0", None, json!({"ttlInSeconds": ttl})),
                grpc_item("quota/grpc-plain", b"h0", None, json!({})),
            ])]),
        )
        .await;
        assert_eq!(answers[0]["code"], "OK", "{answers:?}");

        // Twice each: the second with the etag the first failure left.
        for _ in 0..2 {
            for key in ["quota/ttl", "quota/plain"] {
                let etag = dapr.etag(key).await;
                let refused = dapr
                    .save(json!([{"key": key, "value": big, "etag": etag}]))
                    .await;
                let (status, code, _) = failure(refused).await;
                assert_eq!((status, code.as_str()), (500, "ERR_STATE_SAVE"), "{key}");
            }
            let mut calls = Vec::new();
            for key in ["quota/grpc-ttl", "quota/grpc-plain"] {
                let etag = dapr.etag(key).await;
                calls.push(save_call(vec![grpc_item(
                    key,
                    big.as_bytes(),
                    Some(&etag),
                    json!({}),
                )]));
            }
            let answers = grpc(stack.gateway.api, Value::Array(calls)).await;
            for answer in &answers {
                assert_eq!(answer["code"], "INTERNAL", "{answers:?}");
            }
        }
        assert!(
            started.elapsed() < TTL * 4 / 5,
            "the failures took {:?}: too slow to see the expiry",
            started.elapsed()
        );
        assert_eq!(dapr.value("quota/ttl").await.as_deref(), Some("\"v0\""));
        assert_eq!(dapr.value("quota/grpc-ttl").await.as_deref(), Some("g0"));

        // Past the expiry: the keys saved with one are gone, the others
        // kept their value.
        tokio::time::sleep((TTL + Duration::from_millis(1500)).saturating_sub(started.elapsed()))
            .await;
        let mode = if transactions {
            "transactions"
        } else {
            "plain"
        };
        assert_eq!(dapr.value("quota/ttl").await, None, "{mode}");
        assert_eq!(dapr.value("quota/grpc-ttl").await, None, "{mode}");
        assert_eq!(
            dapr.value("quota/plain").await.as_deref(),
            Some("\"p0\""),
            "{mode}"
        );
        assert_eq!(
            dapr.value("quota/grpc-plain").await.as_deref(),
            Some("h0"),
            "{mode}"
        );
    }
}

#[tokio::test]
async fn an_etag_save_cut_off_from_the_broker_keeps_the_value_and_its_expiry() {
    // Gateway A reaches the broker through a proxy that cuts its
    // connections right after its n-th request and refuses new ones for a
    // moment, for every n that an etag save sends; B sets the keys up and
    // reads them. Whatever A answered, a key saved without an expiry keeps
    // a value, and one saved with an expiry is gone once it expires unless
    // A's value landed.
    let stack = stack_with_token().await;
    let b = Dapr::of(stack.gateway.api);
    let proxy = FaultProxy::start(stack.broker.addr).await;
    let a_process = GatewayProcess::start(proxy.port(), &[]).await;
    let a = Dapr {
        client: crate::support::gateway::http_client(),
        api: format!("http://{}", a_process.api),
    };
    let mut rounds = Vec::new();
    for n in 1..=7u64 {
        let ttl_key = format!("cut/ttl-{n}");
        let plain_key = format!("cut/plain-{n}");
        let saved = b
            .save(json!([
                {"key": ttl_key, "value": "old", "metadata": {"ttlInSeconds": "4"}},
                {"key": plain_key, "value": "old"},
            ]))
            .await;
        assert_eq!(saved.status(), 204);
        let deadline = Instant::now() + Duration::from_secs(4);
        let mut statuses = Vec::new();
        for key in [&ttl_key, &plain_key] {
            let etag = b.etag(key).await;
            proxy.set_refuse(true);
            proxy.cut_after_publishes(n);
            let status = a
                .client
                .post(format!("{}/v1.0/state/statestore", a.api))
                .json(&json!([{"key": key, "value": "new", "etag": etag}]))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            proxy.cut_after_publishes(0);
            proxy.set_refuse(false);
            a_process.wait_readyz(200, Duration::from_secs(30)).await;
            statuses.push(status);
        }
        rounds.push((n, ttl_key, plain_key, deadline, statuses));
    }
    let last_deadline = rounds.iter().map(|round| round.3).max().unwrap();
    tokio::time::sleep_until((last_deadline + Duration::from_millis(1500)).into()).await;
    let mut cut_mid_save = 0;
    for (n, ttl_key, plain_key, _, statuses) in rounds {
        let (ttl, plain) = (b.value(&ttl_key).await, b.value(&plain_key).await);
        assert!(
            [None, Some("\"new\"")].contains(&ttl.as_deref()),
            "cut after request {n}: A answered {}, the key that expires holds {ttl:?}",
            statuses[0]
        );
        assert!(
            plain.is_some(),
            "cut after request {n}: A answered {}, the key without expiry is gone",
            statuses[1]
        );
        for (status, value) in [(statuses[0], &ttl), (statuses[1], &plain)] {
            if status == 204 {
                assert_eq!(value.as_deref(), Some("\"new\""), "cut after request {n}");
            } else {
                cut_mid_save += 1;
            }
        }
    }
    assert!(cut_mid_save > 0, "no cut failed a save");
}

/// Whether the store holds `key`, asked over MQTT (not through a gateway).
async fn store_holds(broker: &Mosquitto, key: &[u8]) -> bool {
    let mut raw = RawClient::connect(broker, &format!("probe-{:08x}", rand::random::<u32>())).await;
    let reply = raw.request(&get_payload(key), &[]).await;
    reply.payload.as_ref() != b"$-1\r\n"
}

fn lease_of(key: &str) -> Vec<u8> {
    format!("{LEASE_PREFIX}{key}").into_bytes()
}

#[tokio::test]
async fn a_transaction_of_what_a_save_takes_fits_its_intent_record() {
    // The broker takes packets of 1 MiB: a value of 1,000,000 bytes saves,
    // and as a one-operation transaction it fits its intent record too,
    // over HTTP (JSON) and gRPC (bytes that are not JSON). One that cannot
    // fit is refused at once and leaves no lease behind.
    let stack = Stack::builder()
        .broker(MosquittoConfig {
            extra: "max_packet_size 1048576\n".into(),
            ..MosquittoConfig::default()
        })
        .gateway(gateway_options(true))
        .start()
        .await;
    let dapr = Dapr::of(stack.gateway.api);
    let text = "t".repeat(999_998);
    let saved = dapr.save(json!([{"key": "big/http", "value": text}])).await;
    assert_eq!(saved.status(), 204);
    let applied = dapr
        .transaction(json!([{"operation": "upsert", "request": {"key": "big/http", "value": text.clone() + "!"}}]))
        .await;
    assert_eq!(applied.status(), 204, "{:?}", applied.text().await);
    assert_eq!(
        dapr.value("big/http").await.map(|value| value.len()),
        Some(1_000_001)
    );

    let bytes: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8 | 0x80).collect();
    let answers = grpc(
        stack.gateway.api,
        json!([
            save_call(vec![grpc_item("big/grpc", &bytes, None, json!({}))]),
            transaction_call(vec![(
                "upsert",
                grpc_item("big/grpc", &bytes[1..], None, json!({}))
            )]),
            get_call("big/grpc"),
        ]),
    )
    .await;
    assert_eq!(answers[0]["code"], "OK", "{answers:?}");
    assert_eq!(answers[1]["code"], "OK", "{}", answers[1]);
    assert_eq!(grpc_data(&answers[2]).as_deref(), Some(&bytes[1..]));

    // Two such values cannot share one record: refused at once (413), no
    // lease left behind, the keys as they were.
    let started = Instant::now();
    let refused = dapr
        .transaction(json!([
            {"operation": "upsert", "request": {"key": "big/http", "value": text}},
            {"operation": "upsert", "request": {"key": "big/other", "value": text}},
        ]))
        .await;
    let (status, code, message) = failure(refused).await;
    assert_eq!(
        (status, code.as_str()),
        (413, "ERR_STATE_TRANSACTION"),
        "{message}"
    );
    assert!(message.contains("bytes"), "{message}");
    for key in ["big/http", "big/other"] {
        assert!(
            !store_holds(&stack.broker, &lease_of(key)).await,
            "{key}'s lease"
        );
    }
    let saved = dapr.save(json!([{"key": "big/http", "value": 1}])).await;
    assert_eq!(saved.status(), 204);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the save after the refused transaction waited: {:?}",
        started.elapsed()
    );
    assert_eq!(dapr.value("big/other").await, None);
}

#[tokio::test]
async fn a_transaction_whose_commit_the_store_refuses_leaves_no_lease() {
    // The quota takes a value of 10 kB on its own but not the intent record
    // that carries it beside the key's lease: the commit is refused.
    let stack = stack_with_quota(10_100, true).await;
    let dapr = Dapr::of(stack.gateway.api);
    let value = "q".repeat(10_000);
    let saved = dapr
        .save(json!([{"key": "commit/k", "value": value}]))
        .await;
    assert_eq!(saved.status(), 204);
    assert_eq!(dapr.delete("commit/k").await.status(), 204);
    let started = Instant::now();
    let refused = dapr
        .transaction(
            json!([{"operation": "upsert", "request": {"key": "commit/k", "value": value}}]),
        )
        .await;
    let (status, code, message) = failure(refused).await;
    assert_eq!(
        (status, code.as_str()),
        (500, "ERR_STATE_TRANSACTION"),
        "{message}"
    );
    assert!(!store_holds(&stack.broker, &lease_of("commit/k")).await);
    let saved = dapr.save(json!([{"key": "commit/k", "value": 1}])).await;
    assert_eq!(saved.status(), 204);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the save after the refused commit waited: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn query_metadata_overrides_each_items_metadata() {
    // Dapr merges `metadata.*` query parameters over each item's metadata,
    // for saves and for a transaction's operations.
    let stack = transactional_stack().await;
    let dapr = Dapr::of(stack.gateway.api);
    let started = Instant::now();
    let saved = dapr
        .save_with_query(
            "metadata.ttlInSeconds=3",
            json!([
                {"key": "meta/item", "value": 1, "metadata": {"ttlInSeconds": "1"}},
                {"key": "meta/bare", "value": 1},
                {"key": "meta/forever", "value": 1, "metadata": {"ttlInSeconds": "3600"}},
            ]),
        )
        .await;
    assert_eq!(saved.status(), 204);
    let applied = dapr
        .transaction_with_query(
            "metadata.ttlInSeconds=3",
            json!([{"operation": "upsert", "request": {"key": "meta/tx", "value": 1, "metadata": {"ttlInSeconds": "1"}}}]),
        )
        .await;
    assert_eq!(applied.status(), 204);
    tokio::time::sleep(Duration::from_millis(1800).saturating_sub(started.elapsed())).await;
    for key in ["meta/item", "meta/bare", "meta/forever", "meta/tx"] {
        assert!(dapr.value(key).await.is_some(), "{key} expired before 3 s");
    }
    tokio::time::sleep(Duration::from_millis(4500).saturating_sub(started.elapsed())).await;
    for key in ["meta/item", "meta/bare", "meta/forever", "meta/tx"] {
        assert_eq!(
            dapr.value(key).await,
            None,
            "{key} outlived the query's 3 s"
        );
    }
}

#[tokio::test]
async fn a_transaction_applies_the_operations_on_one_key_in_order() {
    let stack = transactional_stack().await;
    let dapr = Dapr::of(stack.gateway.api);
    let saved = dapr
        .save(json!([
            {"key": "order/deleted-then-saved", "value": "old"},
            {"key": "order/etag", "value": "old"},
            {"key": "order/untouched", "value": "old"},
        ]))
        .await;
    assert_eq!(saved.status(), 204);
    let upsert = |key: &str, value: &str| json!({"operation": "upsert", "request": {"key": key, "value": value}});
    let delete = |key: &str| json!({"operation": "delete", "request": {"key": key}});

    let applied = dapr
        .transaction(json!([
            upsert("order/saved-then-deleted", "a"),
            delete("order/saved-then-deleted"),
            upsert("order/saved-twice", "a"),
            upsert("order/saved-twice", "b"),
            delete("order/deleted-then-saved"),
            upsert("order/deleted-then-saved", "c"),
        ]))
        .await;
    assert_eq!(applied.status(), 204, "{:?}", applied.text().await);
    assert_eq!(dapr.value("order/saved-then-deleted").await, None);
    assert_eq!(
        dapr.value("order/saved-twice").await.as_deref(),
        Some("\"b\"")
    );
    assert_eq!(
        dapr.value("order/deleted-then-saved").await.as_deref(),
        Some("\"c\"")
    );

    // The first operation on a key checks its etag against the key as it
    // was; a later one meets the version the earlier one gave, which no
    // etag can name, and a first-write one meets the earlier one's effect.
    let etag = dapr.etag("order/etag").await;
    let applied = dapr
        .transaction(json!([
            {"operation": "upsert", "request": {"key": "order/etag", "value": "x", "etag": etag}},
            upsert("order/etag", "y"),
        ]))
        .await;
    assert_eq!(applied.status(), 204);
    assert_eq!(dapr.value("order/etag").await.as_deref(), Some("\"y\""));
    let current = dapr.etag("order/etag").await;
    for (what, operations) in [
        (
            "an etag on a later operation",
            json!([
                upsert("order/untouched", "z"),
                upsert("order/etag", "z"),
                {"operation": "upsert", "request": {"key": "order/etag", "value": "z", "etag": current}},
            ]),
        ),
        (
            "a first-write after an upsert",
            json!([
                upsert("order/untouched", "z"),
                upsert("order/etag", "z"),
                {"operation": "upsert", "request": {"key": "order/etag", "value": "z", "options": {"concurrency": "first-write"}}},
            ]),
        ),
        (
            "a stale etag on the first operation",
            json!([
                upsert("order/untouched", "z"),
                {"operation": "upsert", "request": {"key": "order/etag", "value": "z", "etag": etag}},
                upsert("order/etag", "z"),
            ]),
        ),
    ] {
        let (status, code, _) = failure(dapr.transaction(operations).await).await;
        assert_eq!(
            (status, code.as_str()),
            (500, "ERR_STATE_TRANSACTION"),
            "{what}"
        );
        assert_eq!(
            dapr.value("order/etag").await.as_deref(),
            Some("\"y\""),
            "{what}"
        );
        assert_eq!(
            dapr.value("order/untouched").await.as_deref(),
            Some("\"old\""),
            "{what}: nothing applied"
        );
    }
    let applied = dapr
        .transaction(json!([
            delete("order/etag"),
            {"operation": "upsert", "request": {"key": "order/etag", "value": "fw", "options": {"concurrency": "first-write"}}},
        ]))
        .await;
    assert_eq!(applied.status(), 204, "a first-write after a delete");
    assert_eq!(dapr.value("order/etag").await.as_deref(), Some("\"fw\""));

    // Over gRPC, the same.
    let item = |key: &str, value: &[u8]| grpc_item(key, value, None, json!({}));
    let answers = grpc(
        stack.gateway.api,
        json!([
            transaction_call(vec![
                ("upsert", item("order/g1", b"a")),
                ("delete", item("order/g1", b"")),
                ("upsert", item("order/g2", b"a")),
                ("upsert", item("order/g2", b"b")),
            ]),
            get_call("order/g1"),
            get_call("order/g2"),
            transaction_call(vec![
                ("upsert", item("order/g3", b"a")),
                (
                    "upsert",
                    grpc_item("order/g2", b"c", Some(&current), json!({}))
                ),
                ("upsert", item("order/g2", b"d")),
            ]),
            get_call("order/g2"),
            get_call("order/g3"),
        ]),
    )
    .await;
    assert_eq!(answers[0]["code"], "OK", "{answers:?}");
    assert_eq!(grpc_data(&answers[1]), None);
    assert_eq!(grpc_data(&answers[2]).as_deref(), Some(&b"b"[..]));
    assert_eq!(answers[3]["code"], "INTERNAL", "a stale etag: {answers:?}");
    assert_eq!(grpc_data(&answers[4]).as_deref(), Some(&b"b"[..]));
    assert_eq!(grpc_data(&answers[5]), None);
}

#[tokio::test]
async fn a_first_write_delete_without_an_etag_deletes_in_a_transaction_too() {
    let stack = transactional_stack().await;
    let dapr = Dapr::of(stack.gateway.api);
    let saved = dapr
        .save(json!([
            {"key": "fw/single", "value": 1},
            {"key": "fw/http", "value": 1},
            {"key": "fw/grpc", "value": 1},
        ]))
        .await;
    assert_eq!(saved.status(), 204);
    let single = dapr
        .client
        .delete(format!(
            "{}/v1.0/state/statestore/fw/single?concurrency=first-write",
            dapr.api
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(single.status(), 204);
    assert_eq!(dapr.value("fw/single").await, None);
    let applied = dapr
        .transaction(json!([{"operation": "delete", "request": {"key": "fw/http", "options": {"concurrency": "first-write"}}}]))
        .await;
    assert_eq!(applied.status(), 204, "{:?}", applied.text().await);
    assert_eq!(dapr.value("fw/http").await, None);
    let mut item = grpc_item("fw/grpc", b"", None, json!({}));
    item["options"] = json!({"concurrency": "CONCURRENCY_FIRST_WRITE"});
    let answers = grpc(
        stack.gateway.api,
        json!([
            transaction_call(vec![("delete", item)]),
            get_call("fw/grpc")
        ]),
    )
    .await;
    assert_eq!(answers[0]["code"], "OK", "{answers:?}");
    assert_eq!(grpc_data(&answers[1]), None);
}
