//! `POST /batch` over real TCP against mosquitto and the emulator: each op
//! answers what its one-key request answers, ops on one key run in order,
//! a refused batch applies nothing, the limits hold, and batches leave
//! one-key requests their share of the pool.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use statestore_gateway::protocol::Hlc;

use crate::support::Mosquitto;
use crate::support::emulator::EmulatorProcess;
use crate::support::gateway::{Gateway, GatewayOptions, Stack, encode, etag, json, problem};

/// The results of a batch that must be answered 200.
async fn results(gw: &Gateway, ops: Value) -> Vec<Value> {
    let response = gw.batch(&json!({ "ops": ops })).await;
    assert_eq!(response.status(), StatusCode::OK, "{response:?}");
    assert_eq!(
        response.headers()[reqwest::header::CONTENT_TYPE],
        "application/json"
    );
    let body = json(response).await;
    body["results"].as_array().unwrap().clone()
}

/// The one-key request an op stands for, sent: its status and body.
async fn one_key(gw: &Gateway, op: &Value) -> (u16, Value) {
    let text = |name: &str| op.get(name).map(|value| value.as_str().unwrap().to_owned());
    let mut query = Vec::new();
    if let Some(ttl) = text("ttl") {
        query.push(format!("ttl={ttl}"));
    }
    if op.get("nex").is_some() {
        query.push("nex=true".to_owned());
    }
    if op.get("persist").is_some() {
        query.push("persist=true".to_owned());
    }
    let mut at = gw.at(text("key").unwrap().as_bytes());
    if op.get("if_none_match").is_some() {
        at = at.header("If-None-Match", "*");
    }
    if let Some(token) = text("fencing_token") {
        at = at.header("Fencing-Token", token);
    }
    let response = match op["op"].as_str().unwrap() {
        "get" => at.get().await,
        "set" => {
            if !query.is_empty() {
                at = at.query(&query.join("&"));
            }
            at.put(text("value").unwrap()).await
        }
        _ => {
            if let Some(value) = text("value") {
                at = at.query(&format!("value={}", encode(value.as_bytes())));
            }
            at.delete().await
        }
    };
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Every condition's status, in one batch, against the same requests sent
/// one key at a time on other keys: same statuses, same problem types.
#[tokio::test]
async fn every_op_answers_what_its_one_key_request_answers() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    // `prefix` names the keys of one run: the batch's and the one-key run's.
    let scenario = |prefix: &str, token: &str, older: &str| {
        let k = |name: &str| format!("{prefix}/{name}");
        json!([
            {"op": "get", "key": k("x")},
            {"op": "set", "key": k("x"), "value": "one", "if_none_match": true},
            {"op": "set", "key": k("x"), "value": "two", "if_none_match": true},
            {"op": "set", "key": k("x"), "value": "three"},
            {"op": "get", "key": k("x")},
            {"op": "set", "key": k("lease"), "value": "me", "nex": true, "ttl": "10s"},
            {"op": "set", "key": k("lease"), "value": "you", "nex": true, "ttl": "10s"},
            {"op": "set", "key": k("lease"), "value": "me", "nex": true, "ttl": "10s"},
            {"op": "delete", "key": k("lease"), "value": "other"},
            {"op": "delete", "key": k("lease"), "value": "me"},
            {"op": "delete", "key": k("lease"), "value": "me"},
            {"op": "delete", "key": k("lease")},
            {"op": "set", "key": k("fenced"), "value": "a", "fencing_token": token},
            {"op": "set", "key": k("fenced"), "value": "b"},
            {"op": "set", "key": k("fenced"), "value": "c", "fencing_token": older},
            {"op": "delete", "key": k("fenced")},
            {"op": "delete", "key": k("fenced"), "fencing_token": token},
            {"op": "set", "key": k("kept"), "value": "p", "persist": true, "ttl": "30000"},
            {"op": "delete", "key": k("x")},
            {"op": "get", "key": k("x")},
        ])
    };
    let expected = [
        404, 201, 412, 200, 200, 200, 412, 200, 412, 204, 404, 404, 200, 428, 409, 428, 204, 200,
        204, 404,
    ];
    let lease = |name: &'static [u8]| async move {
        etag(
            gw.at(name)
                .query("nex=true&ttl=30s")
                .put("holder")
                .await
                .headers(),
        )
    };
    let older = |token: &str| {
        let mut older = Hlc::parse(token).unwrap();
        older.wall_ms -= 1_000;
        older.to_string()
    };

    let token = lease(b"batch-lock").await;
    let ops = scenario("batch", &token, &older(&token));
    let batched = results(gw, ops.clone()).await;
    assert_eq!(batched.len(), expected.len());

    let token = lease(b"single-lock").await;
    let singles = scenario("single", &token, &older(&token));
    for (index, ((result, op), status)) in batched
        .iter()
        .zip(singles.as_array().unwrap())
        .zip(expected)
        .enumerate()
    {
        let (single_status, single_body) = one_key(gw, op).await;
        assert_eq!(single_status, status, "one-key {index}: {op} {single_body}");
        assert_eq!(result["status"], status, "op {index}: {result}");
        if status >= 400 {
            assert_eq!(result["problem"]["status"], status, "op {index}: {result}");
            assert_eq!(
                result["problem"]["type"], single_body["type"],
                "op {index}: {result} vs {single_body}"
            );
            assert_eq!(result["problem"]["store_error"], single_body["store_error"]);
            assert!(result.get("version").is_none(), "{result}");
        } else {
            Hlc::parse(result["version"].as_str().unwrap()).expect("a version");
        }
    }
    assert_eq!(batched[4]["value"], "three");
    assert_eq!(batched[4]["value_base64"], "dGhyZWU=");
    // The batch's writes are there for one-key reads.
    assert_eq!(
        gw.get(b"batch/kept").await.bytes().await.unwrap().as_ref(),
        b"p"
    );
}

#[tokio::test]
async fn ops_on_one_key_run_in_the_order_given() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    // Ops on many keys run concurrently; each key's own ops in order.
    let mut ops = Vec::new();
    for round in 0..100 {
        for key in ["a", "b", "c"] {
            ops.push(json!({"op": "set", "key": key, "value": format!("{key}{round}")}));
            ops.push(json!({"op": "get", "key": key}));
        }
    }
    ops.push(json!({"op": "delete", "key": "a"}));
    ops.push(json!({"op": "get", "key": "a"}));
    ops.push(json!({"op": "set", "key": "a", "value": "new", "if_none_match": true}));
    let results = results(gw, Value::Array(ops.clone())).await;
    assert_eq!(results.len(), ops.len());
    let mut last_version: std::collections::HashMap<&str, Hlc> = Default::default();
    for (index, (op, result)) in ops.iter().zip(&results).enumerate().take(600) {
        let key = op["key"].as_str().unwrap();
        let version = Hlc::parse(result["version"].as_str().unwrap()).unwrap();
        if op["op"] == "set" {
            assert_eq!(result["status"], 200, "{result}");
            if let Some(before) = last_version.get(key) {
                assert!(version > *before, "{key}: versions go up in op order");
            }
            last_version.insert(key, version);
        } else {
            // The get after each set reads that set's value and version.
            let previous = &ops[index - 1];
            assert_eq!(result["value"], previous["value"], "{op} {result}");
            assert_eq!(&version, last_version.get(key).unwrap());
        }
    }
    assert_eq!(results[600]["status"], 204);
    assert_eq!(results[601]["status"], 404);
    assert_eq!(results[602]["status"], 201);
}

#[tokio::test]
async fn binary_keys_and_values_travel_as_base64() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let results = results(
        gw,
        json!([
            {"op": "set", "key_base64": "AP8=", "value_base64": "AP8=", "if_none_match": true},
            {"op": "get", "key_base64": "AP8="},
            {"op": "set", "key": "text", "value": "héllo"},
            {"op": "get", "key": "text"},
        ]),
    )
    .await;
    assert_eq!(results[0]["status"], 201);
    assert_eq!(results[1]["status"], 200);
    assert!(results[1]["value"].is_null(), "{}", results[1]);
    assert_eq!(results[1]["value_base64"], "AP8=");
    assert_eq!(results[3]["value"], "héllo");
    // The same key through the one-key API.
    let response = gw.get(b"\x00\xff").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        etag(response.headers()),
        results[1]["version"].as_str().unwrap()
    );
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"\x00\xff");
}

#[tokio::test]
async fn a_refused_batch_names_the_op_and_applies_nothing() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    let valid = |key: &str| json!({"op": "set", "key": key, "value": "v"});
    for (bad, status, kind) in [
        (
            json!({"op": "set", "key": "z", "value": "v", "ttl": "soon"}),
            400,
            "/problems/invalid-ttl",
        ),
        (
            json!({"op": "set", "key": "z", "value": "v", "tll": "1s"}),
            400,
            "/problems/invalid-batch",
        ),
        (
            json!({"op": "put", "key": "z"}),
            400,
            "/problems/invalid-batch",
        ),
        (
            json!({"op": "get", "key": "z", "nex": true}),
            400,
            "/problems/invalid-batch",
        ),
        (json!({"op": "get", "key": ""}), 400, "/problems/empty-key"),
        (
            json!({"op": "get", "key_base64": "not base64!"}),
            400,
            "/problems/invalid-batch",
        ),
        (
            json!({"op": "set", "key": "z"}),
            400,
            "/problems/invalid-batch",
        ),
        (
            json!({"op": "set", "key": "z", "value": "v", "fencing_token": "x"}),
            400,
            "/problems/invalid-fencing-token",
        ),
        (
            json!({"op": "set", "key": "z", "value": "v", "nex": true, "if_none_match": true}),
            400,
            "/problems/conflicting-conditions",
        ),
        (
            json!({"op": "delete", "key": "z", "ttl": "1s"}),
            400,
            "/problems/invalid-batch",
        ),
        (
            json!({"op": "get", "key": "k".repeat(1025)}),
            414,
            "/problems/key-too-long",
        ),
    ] {
        let body = json!({"ops": [valid("a"), valid("b"), bad.clone(), valid("c")]});
        let refused = problem(gw.batch(&body).await, status, kind).await;
        assert_eq!(refused["op"], 2, "{bad}: {refused}");
        assert!(
            refused["detail"].as_str().unwrap().starts_with("op 2: "),
            "{refused}"
        );
    }
    for (body, kind) in [
        ("{\"ops\": [", "/problems/invalid-batch"),
        ("{\"ops\": 1}", "/problems/invalid-batch"),
        ("{\"ops\": [], \"atomic\": true}", "/problems/invalid-batch"),
        ("[]", "/problems/invalid-batch"),
    ] {
        let response = gw
            .http
            .post(gw.url("/batch"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        problem(response, 400, kind).await;
    }
    for key in [&b"a"[..], b"b", b"c", b"z"] {
        assert_eq!(gw.get(key).await.status(), StatusCode::NOT_FOUND);
    }
    assert_eq!(results(gw, json!([])).await.len(), 0);
}

#[tokio::test]
async fn batch_limits_are_413_and_other_requests_are_refused() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            max_batch_ops: 3,
            max_batch_bytes: 2_000,
            max_value_bytes: Some(100),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    let set = |key: &str, len: usize| json!({"op": "set", "key": key, "value": "v".repeat(len)});
    let body = problem(
        gw.batch(&json!({"ops": [set("a", 1), set("b", 1), set("c", 1), set("d", 1)]}))
            .await,
        413,
        "/problems/too-many-ops",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("limit of 3"));
    problem(
        gw.batch(&json!({"ops": [set("a", 100), set("b", 101)]}))
            .await,
        413,
        "/problems/value-too-large",
    )
    .await;
    problem(
        gw.batch(
            &json!({"ops": [set("a", 1), {"op": "delete", "key": "b", "value": "v".repeat(101)}]}),
        )
        .await,
        413,
        "/problems/value-too-large",
    )
    .await;
    let padding = " ".repeat(2_000);
    let response = gw
        .http
        .post(gw.url("/batch"))
        .header("content-type", "application/json")
        .body(format!("{{\"ops\": []{padding}}}"))
        .send()
        .await
        .unwrap();
    problem(response, 413, "/problems/batch-too-large").await;
    for key in [&b"a"[..], b"b", b"c", b"d"] {
        assert_eq!(gw.get(key).await.status(), StatusCode::NOT_FOUND);
    }
    // Within the limits: the value limit is per op, like a PUT's.
    let fine = results(gw, json!([set("a", 100), set("b", 100), set("c", 100)])).await;
    assert!(fine.iter().all(|result| result["status"] == 200));

    let form = gw
        .http
        .post(gw.url("/batch"))
        .header("content-type", "text/plain")
        .body("{\"ops\": []}")
        .send()
        .await
        .unwrap();
    problem(form, 415, "/problems/unsupported-media-type").await;
    let get = gw.http.get(gw.url("/batch")).send().await.unwrap();
    assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(get.headers()["allow"].to_str().unwrap().contains("POST"));

    let metrics = gw
        .http
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"statestore_gateway_batch_ops_total{op="set",status="200"} 3"#,
        "statestore_gateway_batch_size_count 1",
        r#"statestore_gateway_http_requests_total{method="POST",route="/batch",status="413"} 4"#,
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
}

/// A pool of 8 slots: batches may hold 4 of them, so while batches of
/// thousands of ops run back to back, single requests still find a slot
/// at once instead of queueing behind them (503 after the slot wait).
#[tokio::test]
async fn batches_leave_single_requests_their_share_of_the_pool() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            pool_size: 1,
            max_in_flight: 8,
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let gw = &stack.gateway;
    assert_eq!(gw.put(b"single", "s").await.status(), StatusCode::OK);
    let ops: Vec<Value> = (0..1_000)
        .map(|i| json!({"op": "get", "key": format!("k{i}")}))
        .collect();
    let body = json!({ "ops": ops });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut batches = Vec::new();
    for _ in 0..3 {
        let (gw, body, stop) = (gw.http.clone(), body.clone(), stop.clone());
        let url = stack.gateway.url("/batch");
        batches.push(tokio::spawn(async move {
            let mut sent = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let response = gw
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                let results = json(response).await;
                let results = results["results"].as_array().unwrap();
                assert!(results.iter().all(|result| result["status"] == 404));
                sent += 1;
            }
            sent
        }));
    }
    // Let the batches fill their share first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..40 {
        let started = Instant::now();
        let response = gw.get(b"single").await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(response.status(), StatusCode::OK, "{response:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut sent = 0;
    for batch in batches {
        sent += batch.await.unwrap();
    }
    assert!(sent >= 3, "the batches ran meanwhile ({sent})");
    assert!(
        slowest < Duration::from_millis(500),
        "a single request took {slowest:?} while batches ran"
    );
}

/// With the store frozen (SIGSTOP) and `--request-timeout 1s`, four ops on
/// one key cannot all run within the batch's time: the batch is still 200
/// with a result per op, the first 504 (it was sent, its outcome unknown),
/// the others 503 (never sent), and only the first is applied once the
/// store resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_out_of_time_answers_each_op_and_sends_none_after_its_deadline() {
    let broker = Mosquitto::start().await;
    let store = EmulatorProcess::start(&broker, &[]).await;
    let gw = Gateway::start(
        broker.port(),
        GatewayOptions {
            request_timeout: Duration::from_secs(1),
            ..GatewayOptions::default()
        },
    )
    .await;
    gw.wait_ready().await;
    let set = |value: &str| json!({"op": "set", "key": "frozen", "value": value});

    store.pause();
    let started = Instant::now();
    let response = gw
        .http
        .post(gw.url("/batch"))
        .header("content-type", "application/json")
        .body(json!({"ops": [set("1"), set("2"), set("3"), set("4")]}).to_string())
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::OK, "{response:?}");
    let body = json(response).await;
    let statuses: Vec<u64> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|result| result["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [504, 503, 503, 503], "after {took:?}: {body}");
    for result in &body["results"].as_array().unwrap()[1..] {
        assert!(
            result["problem"]["detail"]
                .as_str()
                .unwrap()
                .contains("not sent"),
            "{result}"
        );
    }
    store.resume();
    // The first SET reaches the store now; nothing after it was sent.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let read = gw.get(b"frozen").await;
        if read.status() == StatusCode::OK {
            assert_eq!(read.bytes().await.unwrap().as_ref(), b"1");
            break;
        }
        assert!(Instant::now() < deadline, "the first SET never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let read = gw.get(b"frozen").await;
    assert_eq!(read.bytes().await.unwrap().as_ref(), b"1");
}
