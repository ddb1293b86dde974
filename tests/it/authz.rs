//! Per-key rules (`--authz-file`) over the real stack: every route allows
//! what the rules allow the caller and nothing else, listings and pattern
//! watches leave out what the caller may not read, and the file is read
//! again when it changes. A second gateway without rules on the same
//! store writes what the tests need.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::header;
use serde_json::{Value, json};
use statestore_gateway::access::jwt::JwtSettings;
use statestore_gateway::access::rules::AuthzSettings;
use statestore_gateway::store::reserved::{INTENT_PREFIX, LEASE_PREFIX};
use statestore_gateway::watch::WatchSettings;

use crate::support::gateway::{Gateway, GatewayOptions, Stack, encode, etag, json as body_json};
use crate::support::sse::{self, SseStream};
use crate::support::tokens::{
    SigningKey, claims, jwt_settings, service_account_claims, write_jwks,
};
use crate::support::{TestPki, broker_store, raw_get, raw_set};

const TOKEN: &str = "shared-api-t0ken";

/// The rules file of the tests' gateway, rewritten by [`Rules::write`].
struct Rules {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Rules {
    fn new(text: &str) -> Rules {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, text).unwrap();
        Rules { _dir: dir, path }
    }

    /// Replaces the file at once (as the kubelet swaps a ConfigMap's files).
    fn write(&self, text: &str) {
        let next = self.path.with_extension("next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &self.path).unwrap();
    }
}

/// Rules that grant the API token's caller `resources` (YAML flow items).
fn api_token_rules(resources: &[&str]) -> String {
    let mut text =
        String::from("rules:\n  - principals:\n      apiToken: true\n    stateStoreResources:\n");
    for resource in resources {
        text.push_str(&format!("      - {resource}\n"));
    }
    text
}

/// A stack whose gateway takes the API token and `rules` (read again every
/// 100 ms, patterns rescanned every 200 ms), and a gateway without rules
/// on the same store to write through.
async fn stack(rules: &Rules) -> (Stack, Gateway) {
    stack_with_jwt(rules, None).await
}

/// [`stack`] whose gateway also takes signed tokens checked with `jwt`.
async fn stack_with_jwt(rules: &Rules, jwt: Option<JwtSettings>) -> (Stack, Gateway) {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some(TOKEN.into()),
            jwt,
            authz: Some(AuthzSettings {
                file: rules.path.clone(),
                check_interval: Duration::from_millis(100),
            }),
            watch: WatchSettings {
                rescan_interval: Duration::from_millis(200),
                ..WatchSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let owner = Gateway::start(stack.broker.port(), GatewayOptions::default()).await;
    owner.wait_ready().await;
    (stack, owner)
}

/// A client that presents the API token.
fn caller() -> reqwest::Client {
    bearer(TOKEN)
}

/// A client that presents `token` (a signed JWT or the API token).
fn bearer(token: &str) -> reqwest::Client {
    bearer_with(reqwest::Client::builder(), token)
}

/// A client of `builder` (TLS settings, say) that presents `token`.
fn bearer_with(builder: reqwest::ClientBuilder, token: &str) -> reqwest::Client {
    let mut headers = header::HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    builder
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .default_headers(headers)
        .build()
        .unwrap()
}

async fn seed(owner: &Gateway, keys: &[&[u8]]) {
    for key in keys {
        let response = owner.put(key, b"seeded".to_vec()).await;
        assert_eq!(response.status(), 200, "seeding {key:?}");
    }
}

async fn status(request: reqwest::RequestBuilder) -> u16 {
    request.send().await.unwrap().status().as_u16()
}

/// Asserts a 403 problem that names the API token's caller and `method`.
async fn forbidden(request: reqwest::RequestBuilder, method: &str) {
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body = body_json(response).await;
    assert_eq!(body["type"], "/problems/forbidden", "{body}");
    assert_eq!(body["status"], 403);
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("the API token's caller") && detail.contains(&format!("to {method} ")),
        "{detail}"
    );
}

/// Waits until a GET of `url` answers 200 (new rules read from the file).
async fn readable_within_10s(client: &reqwest::Client, url: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while status(client.get(url)).await != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url} readable within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

async fn metrics(gw: &Gateway) -> String {
    gw.http
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn keys_are_read_and_written_only_as_the_rules_allow() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"public/*\"], method: Read}",
        "{keyType: String, keys: [\"public/counter\"], method: ReadWrite}",
        "{keyType: Pattern, keys: [\"inbox/*\"], method: Write}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"public/a", b"public/counter", b"secret"]).await;
    let client = caller();

    assert_eq!(status(client.get(gw.key(b"public/a"))).await, 200);
    assert_eq!(status(client.head(gw.key(b"public/a"))).await, 200);
    forbidden(client.put(gw.key(b"public/a")).body("mine"), "Write").await;
    forbidden(client.delete(gw.key(b"public/a")), "Write").await;

    assert_eq!(
        status(client.put(gw.key(b"public/counter")).body("1")).await,
        200
    );
    assert_eq!(status(client.get(gw.key(b"public/counter"))).await, 200);
    assert_eq!(status(client.delete(gw.key(b"public/counter"))).await, 204);

    assert_eq!(
        status(client.put(gw.key(b"inbox/1")).body("job")).await,
        200
    );
    forbidden(client.get(gw.key(b"inbox/1")), "Read").await;
    // Denied whether the key exists or not: nothing is told of it.
    forbidden(client.get(gw.key(b"secret")), "Read").await;
    forbidden(client.get(gw.key(b"absent")), "Read").await;
    assert_eq!(status(client.head(gw.key(b"secret"))).await, 403);

    // Refused requests left the store as it was.
    let kept = owner.get(b"public/a").await.bytes().await.unwrap();
    assert_eq!(kept.as_ref(), b"seeded");
    let written = owner.get(b"inbox/1").await.bytes().await.unwrap();
    assert_eq!(written.as_ref(), b"job");

    let text = metrics(gw).await;
    assert_eq!(
        metric(
            &text,
            "statestore_gateway_authz_denials_total{method=\"Write\"}"
        ),
        2.0
    );
    assert_eq!(
        metric(
            &text,
            "statestore_gateway_authz_denials_total{method=\"Read\"}"
        ),
        4.0
    );
    assert_eq!(metric(&text, "statestore_gateway_authz_rules"), 1.0);
    // Without the token the guard answers first.
    assert_eq!(status(gw.http.get(gw.key(b"public/a"))).await, 401);
}

#[tokio::test]
async fn binary_keys_in_rules_are_exact_bytes_given_as_base64() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Binary, keys: [\"AP8=\", \"/w==\"], method: ReadWrite}",
    ]));
    let (stack, _owner) = stack(&rules).await;
    let gw = &stack.gateway;
    let client = caller();
    assert_eq!(
        status(client.put(gw.key(&[0x00, 0xff])).body("bin")).await,
        200
    );
    assert_eq!(status(client.get(gw.key(&[0x00, 0xff]))).await, 200);
    assert_eq!(status(client.put(gw.key(&[0xff])).body("bin")).await, 200);
    forbidden(client.put(gw.key(&[0x00])).body("bin"), "Write").await;
    forbidden(client.put(gw.key(&[0x00, 0xff, 0x00])).body("bin"), "Write").await;
    // The base64 text is not the key.
    forbidden(client.get(gw.key(b"AP8=")), "Read").await;
}

/// Every key of a listing, following `next` from `first` (a path).
async fn list_all(client: &reqwest::Client, gw: &Gateway, first: &str) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut path = first.to_owned();
    for _ in 0..100 {
        let response = client.get(gw.url(&path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let page = body_json(response).await;
        entries.extend(page["keys"].as_array().unwrap().iter().cloned());
        match page["next"].as_str() {
            None => return entries,
            Some(cursor) => path = format!("{first}&cursor={cursor}"),
        }
    }
    panic!("the listing did not end within 100 pages");
}

#[tokio::test]
async fn a_listing_shows_only_keys_the_caller_may_read_page_after_page() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"list/*[02468]\"], method: Read}",
        "{keyType: String, keys: [\"list/13\"], method: Read}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    let keys: Vec<String> = (0..30).map(|n| format!("list/{n:02}")).collect();
    for key in &keys {
        seed(&owner, &[key.as_bytes()]).await;
    }
    let client = caller();
    let mut expected: Vec<String> = keys
        .iter()
        .filter(|key| key.ends_with(['0', '2', '4', '6', '8']) || *key == "list/13")
        .cloned()
        .collect();
    expected.sort();

    for limit in [1, 4, 7, 1000] {
        let entries = list_all(&client, gw, &format!("/keys?match=list/*&limit={limit}")).await;
        let listed: Vec<&str> = entries.iter().map(|e| e["key"].as_str().unwrap()).collect();
        assert_eq!(listed, expected, "limit={limit}");
    }

    // With values: only the readable keys are read.
    let entries = list_all(&client, gw, "/keys?match=list/1*&limit=3&values=true").await;
    let listed: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["key"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            "list/10", "list/12", "list/13", "list/14", "list/16", "list/18"
        ]
        .map(|key| (key, "seeded"))
    );

    // A pattern the caller may read nothing of lists nothing, as text too.
    let response = client
        .get(gw.url("/keys?match=*"))
        .header(header::ACCEPT, "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(
        !text.contains("list/01") && text.contains("list/00"),
        "{text}"
    );
    let everything = list_all(&owner.http, &owner, "/keys?match=list/*").await;
    assert_eq!(everything.len(), 30, "the owner sees every key");
}

async fn open(client: &reqwest::Client, gw: &Gateway, query: &str) -> SseStream {
    sse::open(client, &gw.url(&format!("/watch?{query}")), None)
        .await
        .unwrap_or_else(|(status, _, body)| panic!("watch {query}: {status} {body}"))
}

#[tokio::test]
async fn a_pattern_watch_sends_only_keys_the_caller_may_read() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"room/a*\"], method: Read}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"room/a1", b"room/b1"]).await;
    let client = caller();

    let mut stream = open(&client, gw, "match=room/*").await;
    let sync = stream.expect("sync").await;
    assert_eq!(sync.data["key"], "room/a1");
    let listed = stream.expect("listed").await;
    assert_eq!(listed.data, json!({"match": "room/*", "keys": 1}));

    // Keys other clients create are found by the rescan; only readable
    // ones are told of.
    seed(&owner, &[b"room/b2"]).await;
    seed(&owner, &[b"room/a2"]).await;
    let sync = stream.expect("sync").await;
    assert_eq!(sync.data["key"], "room/a2", "{sync:?}");
    // Changes to followed keys: the readable one only.
    assert_eq!(owner.put(b"room/b1", b"new".to_vec()).await.status(), 200);
    assert_eq!(owner.put(b"room/a1", b"new".to_vec()).await.status(), 200);
    let set = stream.expect("set").await;
    assert_eq!(set.data["key"], "room/a1", "{set:?}");
    assert_eq!(set.data["value"], "new");
    stream.expect_silence(Duration::from_millis(700)).await;
}

#[tokio::test]
async fn a_key_watch_needs_read_on_every_key_it_names() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"public/*\"], method: Read}",
        "{keyType: Pattern, keys: [\"inbox/*\"], method: Write}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"public/a", b"inbox/1"]).await;
    let client = caller();
    for path in [
        "/watch/inbox/1",
        "/watch/secret",
        "/watch?key=public/a&key=secret",
        "/watch?key=inbox%2F1&match=public/*",
    ] {
        match sse::open(&client, &gw.url(path), None).await {
            Err((403, _, body)) => {
                let body: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(body["type"], "/problems/forbidden", "{path}");
                assert!(
                    body["detail"].as_str().unwrap().contains("to Read "),
                    "{body}"
                );
            }
            Err((status, _, body)) => panic!("{path}: {status} {body}"),
            Ok(_) => panic!("{path}: a stream"),
        }
    }
    let mut stream = sse::open(&client, &gw.url("/watch/public/a"), None)
        .await
        .unwrap_or_else(|(status, _, body)| panic!("{status} {body}"));
    assert_eq!(stream.expect("sync").await.data["value"], "seeded");
}

#[tokio::test]
async fn locks_need_write_to_take_or_release_and_read_to_look() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: String, keys: [\"job-a\"], method: ReadWrite}",
        "{keyType: String, keys: [\"job-b\"], method: Read}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    let client = caller();
    let lock = |name: &str, query: &str| gw.url(&format!("/locks/{name}{query}"));

    assert_eq!(
        status(client.put(lock("job-a", "?holder=w&ttl=30s"))).await,
        200
    );
    assert_eq!(status(client.get(lock("job-a", ""))).await, 200);
    assert_eq!(status(client.delete(lock("job-a", "?holder=w"))).await, 204);

    forbidden(client.put(lock("job-b", "?holder=w&ttl=30s")), "Write").await;
    let taken = owner
        .http
        .put(owner.url("/locks/job-b?holder=other&ttl=30s"))
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status(), 200);
    let held = body_json(client.get(lock("job-b", "")).send().await.unwrap()).await;
    assert_eq!(held["holder"], "other");
    forbidden(client.delete(lock("job-b", "?holder=other")), "Write").await;
    forbidden(
        client.put(lock("job-b", "?holder=w&ttl=30s&wait=5s")),
        "Write",
    )
    .await;

    forbidden(client.get(lock("job-c", "")), "Read").await;
    forbidden(client.put(lock("job-c", "?holder=w&ttl=30s")), "Write").await;
}

/// A lock request waiting in line whose Write a reload of the rules then
/// removes is answered 403 when the lock comes free, as a request sent
/// then would be, and does not take the lock.
#[tokio::test]
async fn a_lock_waiter_whose_write_is_revoked_while_it_waits_is_refused_when_the_lock_frees() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: String, keys: [\"job-a\"], method: ReadWrite}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"marker"]).await;
    let lock = |gw: &Gateway, query: &str| gw.url(&format!("/locks/job-a{query}"));
    let taken = owner
        .http
        .put(lock(&owner, "?holder=other&ttl=30s"))
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status(), 200);
    let waiter = tokio::spawn(caller().put(lock(gw, "?holder=w&ttl=30s&wait=20s")).send());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metric(&metrics(gw).await, "statestore_gateway_lock_waiters") < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request waits in line"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    rules.write(&api_token_rules(&[
        "{keyType: String, keys: [\"job-a\", \"marker\"], method: Read}",
    ]));
    readable_within_10s(&caller(), &gw.key(b"marker")).await;
    let released = owner
        .http
        .delete(lock(&owner, "?holder=other"))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 204);

    let answer = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is answered once the lock frees")
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), 403);
    let body = body_json(answer).await;
    assert_eq!(body["type"], "/problems/forbidden", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("to Write "),
        "{body}"
    );
    let holder = owner.http.get(lock(&owner, "")).send().await.unwrap();
    assert_eq!(holder.status(), 404, "nobody took the lock");
}

/// Every answer a Write-only caller can get about a key, each with the
/// headers and body as text, leaves out the key's value and version: lock
/// conflicts do not name the holder, failed conditions do not say what the
/// key holds, listings and watches leave the key out.
#[tokio::test]
async fn a_write_only_caller_learns_no_value_or_version_of_a_key() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"secret/*\"], method: Write}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"secret/k"]).await;
    let version = etag(owner.get(b"secret/k").await.headers());
    let taken = owner
        .http
        .put(owner.url("/locks/secret/lock?holder=the-holder&ttl=30s"))
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status(), 200);
    let token = taken.headers()["fencing-token"]
        .to_str()
        .unwrap()
        .to_owned();
    let client = caller();
    let leaks = |text: &str| {
        ["seeded", &version, "the-holder", &token]
            .into_iter()
            .find(|secret| text.contains(secret))
            .map(str::to_owned)
    };
    let answer_text = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let headers = format!("{:?}", response.headers());
        (
            status,
            format!("{headers}\n{}", response.text().await.unwrap()),
        )
    };

    forbidden(client.get(gw.key(b"secret/k")), "Read").await;
    for (what, request, expected) in [
        (
            "take a plain key as a lock",
            client.put(gw.url("/locks/secret/k?holder=w&ttl=5s")),
            409,
        ),
        (
            "release a plain key as a lock",
            client.delete(gw.url("/locks/secret/k?holder=w")),
            409,
        ),
        (
            "take a held lock",
            client.put(gw.url("/locks/secret/lock?holder=w&ttl=5s")),
            409,
        ),
        (
            "wait for a held lock",
            client.put(gw.url("/locks/secret/lock?holder=w&ttl=5s&wait=300ms")),
            409,
        ),
        (
            "release a held lock",
            client.delete(gw.url("/locks/secret/lock?holder=w")),
            409,
        ),
        (
            "write only if absent",
            client
                .put(gw.key(b"secret/k"))
                .header("if-none-match", "*")
                .body("x"),
            412,
        ),
        (
            "write only if absent or equal",
            client.put(gw.url("/keys/secret/k?nex=true")).body("x"),
            412,
        ),
        (
            "delete if equal",
            client.delete(gw.url("/keys/secret/k?value=x")),
            412,
        ),
        (
            "a batch of conditional writes",
            client
                .post(gw.url("/batch"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(
                    json!({"ops": [
                        {"op": "set", "key": "secret/k", "value": "x", "if_none_match": true},
                        {"op": "set", "key": "secret/lock", "value": "x", "nex": true},
                        {"op": "delete", "key": "secret/k", "value": "x"},
                        {"op": "get", "key": "secret/k"},
                    ]})
                    .to_string(),
                ),
            200,
        ),
        (
            "a listing with values",
            client.get(gw.url("/keys?match=secret/*&values=true")),
            200,
        ),
    ] {
        let (status, text) = answer_text(request.send().await.unwrap()).await;
        assert_eq!(status, expected, "{what}: {text}");
        assert_eq!(leaks(&text), None, "{what} tells: {text}");
    }
    // The lock conflict still says what happened, without naming anyone.
    let conflict = client
        .put(gw.url("/locks/secret/lock?holder=w&ttl=5s"))
        .send()
        .await
        .unwrap();
    let problem = body_json(conflict).await;
    assert_eq!(problem["type"], "/problems/lock-held", "{problem}");
    for field in ["holder", "holder_base64", "fencing_token"] {
        assert!(problem.get(field).is_none(), "{problem}");
    }
    forbidden(client.get(gw.url("/watch/secret/k")), "Read").await;
    // The store kept what its owners wrote.
    let kept = owner.get(b"secret/k").await.bytes().await.unwrap();
    assert_eq!(kept.as_ref(), b"seeded");
}

#[tokio::test]
async fn a_batch_answers_403_for_each_denied_op_and_runs_the_others() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"public/*\"], method: Read}",
        "{keyType: Pattern, keys: [\"inbox/*\"], method: Write}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"public/a", b"secret"]).await;
    let client = caller();
    let response = client
        .post(gw.url("/batch"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(
            json!({"ops": [
                {"op": "get", "key": "public/a"},
                {"op": "set", "key": "public/a", "value": "mine"},
                {"op": "set", "key": "inbox/1", "value": "job"},
                {"op": "delete", "key": "secret"},
                {"op": "get", "key": "inbox/1"},
                {"op": "get", "key_base64": "AP8="},
            ]})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = body_json(response).await;
    let results = body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 403, 200, 403, 403, 403], "{body}");
    assert_eq!(results[0]["value"], "seeded");
    for (index, method) in [(1, "Write"), (3, "Write"), (4, "Read"), (5, "Read")] {
        let problem = &results[index]["problem"];
        assert_eq!(problem["type"], "/problems/forbidden", "{problem}");
        assert_eq!(problem["status"], 403);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains(&format!("to {method} ")),
            "{problem}"
        );
    }
    let kept = owner.get(b"public/a").await.bytes().await.unwrap();
    assert_eq!(kept.as_ref(), b"seeded");
    assert_eq!(owner.get(b"secret").await.status(), 200);
    let written = owner.get(b"inbox/1").await.bytes().await.unwrap();
    assert_eq!(written.as_ref(), b"job");
}

#[tokio::test]
async fn the_api_token_caller_is_named_by_api_token_or_star_rules_only() {
    let rules = Rules::new(
        "rules:\n  - principals: {subjects: [\"system:serviceaccount:apps:dashboard\"]}\n    stateStoreResources:\n      - {keyType: Pattern, keys: [\"*\"], method: ReadWrite}\n",
    );
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"k"]).await;
    let client = caller();
    forbidden(client.get(gw.key(b"k")), "Read").await;

    rules.write(
        "rules:\n  - principals: {subjects: [\"*\"]}\n    stateStoreResources:\n      - {keyType: String, keys: [k], method: Read}\n",
    );
    readable_within_10s(&client, &gw.key(b"k")).await;
    forbidden(client.put(gw.key(b"k")).body("v"), "Write").await;
}

#[tokio::test]
async fn changed_rules_apply_without_a_restart_and_a_bad_file_keeps_them() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"old/*\"], method: Read}",
    ]));
    let (stack, owner) = stack(&rules).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"old/a", b"new/a"]).await;
    let client = caller();
    assert_eq!(status(client.get(gw.key(b"old/a"))).await, 200);
    forbidden(client.get(gw.key(b"new/a")), "Read").await;
    // An open stream on a key whose read is then revoked goes silent.
    let mut stream = sse::open(&client, &gw.url("/watch/old/a"), None)
        .await
        .unwrap_or_else(|(status, _, body)| panic!("{status} {body}"));
    stream.expect("sync").await;

    rules.write(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"new/*\"], method: Read}",
    ]));
    readable_within_10s(&client, &gw.key(b"new/a")).await;
    forbidden(client.get(gw.key(b"old/a")), "Read").await;
    assert_eq!(owner.put(b"old/a", b"changed".to_vec()).await.status(), 200);
    stream.expect_silence(Duration::from_millis(700)).await;

    // A file that does not parse: logged, counted, the rules stay.
    rules.write(
        "rules:\n  - principals: {subjects: [a]}\n    stateStoreResources: [{keyType: Glob}]\n",
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(gw).await;
        if metric(&text, "statestore_gateway_authz_reload_failures_total") >= 1.0 {
            assert_eq!(
                metric(&text, "statestore_gateway_authz_last_reload_success"),
                0.0
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failure counted within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status(client.get(gw.key(b"new/a"))).await, 200);
    forbidden(client.get(gw.key(b"old/a")), "Read").await;

    // Fixed again: applied, and the gauge says so.
    rules.write(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"old/*\", \"new/*\"], method: Read}",
    ]));
    readable_within_10s(&client, &gw.key(b"old/a")).await;
    let text = metrics(gw).await;
    assert_eq!(
        metric(&text, "statestore_gateway_authz_last_reload_success"),
        1.0
    );
    assert_eq!(
        metric(&text, "statestore_gateway_authz_reload_failures_total"),
        1.0
    );
}

const DASHBOARD: &str = "system:serviceaccount:apps:dashboard";

/// Rules for two service accounts, every caller, and the API token.
const SUBJECT_RULES: &str = r#"
rules:
  - principals: {subjects: ["system:serviceaccount:apps:dashboard"]}
    stateStoreResources:
      - {keyType: Pattern, keys: ["sensors/*"], method: Read}
  - principals: {subjects: ["system:serviceaccount:apps:writer"]}
    stateStoreResources:
      - {keyType: Pattern, keys: ["sensors/*"], method: ReadWrite}
  - principals: {subjects: ["*"]}
    stateStoreResources:
      - {keyType: String, keys: ["public"], method: Read}
  - principals: {apiToken: true}
    stateStoreResources:
      - {keyType: Pattern, keys: ["*"], method: ReadWrite}
"#;

#[tokio::test]
async fn each_signed_tokens_subject_gets_its_own_rules_and_the_star_ones() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let key = SigningKey::rsa("k1");
    write_jwks(&jwks, &[&key]);
    let rules = Rules::new(SUBJECT_RULES);
    let (stack, owner) = stack_with_jwt(&rules, Some(jwt_settings(&jwks))).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"sensors/1", b"public", b"other"]).await;
    let dashboard = bearer(&key.sign(&service_account_claims("apps", "dashboard")));
    let writer = bearer(&key.sign(&service_account_claims("apps", "writer")));
    let stranger = bearer(&key.sign(&claims("someone-else")));
    let api = bearer(TOKEN);

    assert_eq!(status(dashboard.get(gw.key(b"sensors/1"))).await, 200);
    assert_eq!(status(dashboard.get(gw.key(b"public"))).await, 200);
    let denied = dashboard
        .put(gw.key(b"sensors/1"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 403);
    let body = body_json(denied).await;
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("{DASHBOARD:?}")) && detail.contains("to Write "),
        "{detail}"
    );
    assert_eq!(status(dashboard.get(gw.key(b"other"))).await, 403);

    assert_eq!(
        status(writer.put(gw.key(b"sensors/1")).body("w")).await,
        200
    );
    assert_eq!(status(writer.get(gw.key(b"public"))).await, 200);
    assert_eq!(status(writer.put(gw.key(b"public")).body("w")).await, 403);

    // A valid token no rule names: the "*" rules only.
    assert_eq!(status(stranger.get(gw.key(b"public"))).await, 200);
    assert_eq!(status(stranger.get(gw.key(b"sensors/1"))).await, 403);

    // The API token's caller, beside signed tokens.
    assert_eq!(status(api.put(gw.key(b"other")).body("o")).await, 200);

    // Listings and batches per subject.
    let listed = list_all(&dashboard, gw, "/keys?match=*").await;
    let keys: Vec<&str> = listed.iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["public", "sensors/1"]);
    let listed = list_all(&stranger, gw, "/keys?match=*").await;
    let keys: Vec<&str> = listed.iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["public"]);
    let response = dashboard
        .post(gw.url("/batch"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(
            json!({"ops": [
                {"op": "get", "key": "sensors/1"},
                {"op": "set", "key": "sensors/1", "value": "d"},
            ]})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let body = body_json(response).await;
    let statuses: Vec<u64> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 403], "{body}");
}

#[tokio::test]
async fn a_browsers_pattern_watch_with_access_token_follows_only_its_subjects_keys() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let key = SigningKey::ec("k1");
    write_jwks(&jwks, &[&key]);
    let rules = Rules::new(SUBJECT_RULES);
    let (stack, owner) = stack_with_jwt(&rules, Some(jwt_settings(&jwks))).await;
    let gw = &stack.gateway;
    seed(&owner, &[b"sensors/1", b"secret/1"]).await;
    let token = key.sign(&service_account_claims("apps", "dashboard"));
    let url = gw.url(&format!("/watch?match=*&access_token={token}"));
    let mut stream = sse::open(&gw.http, &url, None)
        .await
        .unwrap_or_else(|(status, _, body)| panic!("{status} {body}"));
    let sync = stream.expect("sync").await;
    assert_eq!(sync.data["key"], "sensors/1");
    let listed = stream.expect("listed").await;
    assert_eq!(listed.data["keys"], 1);
    seed(&owner, &[b"secret/2", b"sensors/2"]).await;
    assert_eq!(stream.expect("sync").await.data["key"], "sensors/2");
    stream.expect_silence(Duration::from_millis(700)).await;
}

/// The standalone set-up end to end: TLS with HTTP/2 by ALPN, callers
/// identified by signed tokens, each given its rules; a rotated key set
/// refuses the old key's tokens and takes the new key's, without a restart.
#[tokio::test]
async fn over_tls_and_http2_signed_tokens_get_their_rules_and_keys_rotate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "api");
    let jwks = dir.path().join("jwks.json");
    let first = SigningKey::rsa("k1");
    write_jwks(&jwks, &[&first]);
    let rules = Rules::new(SUBJECT_RULES);
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            api_tls: Some((pki.server_cert.clone(), pki.server_key.clone())),
            jwt: Some(jwt_settings(&jwks)),
            authz: Some(AuthzSettings {
                file: rules.path.clone(),
                check_interval: Duration::from_millis(100),
            }),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let owner = Gateway::start(stack.broker.port(), GatewayOptions::default()).await;
    owner.wait_ready().await;
    seed(&owner, &[b"sensors/1", b"other"]).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).unwrap()).unwrap();
    let over_tls = |token: &str| {
        let builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca.clone());
        bearer_with(builder, token)
    };
    let port = stack.gateway.api.port();
    let url = |key: &[u8]| format!("https://localhost:{port}/keys/{}", encode(key));

    let dashboard = over_tls(&first.sign(&service_account_claims("apps", "dashboard")));
    let read = dashboard.get(url(b"sensors/1")).send().await.unwrap();
    assert_eq!(
        (read.status().as_u16(), read.version()),
        (200, reqwest::Version::HTTP_2)
    );
    assert_eq!(read.text().await.unwrap(), "seeded");
    assert_eq!(status(dashboard.get(url(b"other"))).await, 403);
    assert_eq!(
        status(dashboard.put(url(b"sensors/1")).body("d")).await,
        403
    );
    let refused = over_tls("not-a-jwt")
        .get(url(b"sensors/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let challenge = refused.headers()[header::WWW_AUTHENTICATE]
        .to_str()
        .unwrap();
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");

    let second = SigningKey::ec("k2");
    write_jwks(&jwks, &[&second]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while status(dashboard.get(url(b"sensors/1"))).await != 401 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a token of the removed key still passes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rotated = over_tls(&second.sign(&service_account_claims("apps", "dashboard")));
    assert_eq!(status(rotated.get(url(b"sensors/1"))).await, 200);
    assert_eq!(status(rotated.get(url(b"other"))).await, 403);
}

/// Asserts that `client` reaches none of the gateway's own records through
/// `gw` (a gateway of `stack` whose patterns are rescanned every 200 ms):
/// a key, a batch op, a lock and a key watch on one are 403
/// `/problems/reserved-key`; listings and pattern watches leave them out;
/// the records, written with broker credentials, stay as they were.
async fn assert_reserved_keys_out_of_reach(stack: &Stack, gw: &Gateway, client: &reqwest::Client) {
    let store = broker_store(stack.broker.addr).await;
    let reserved = [
        format!("{INTENT_PREFIX}room/1"),
        format!("{LEASE_PREFIX}room/1"),
    ];
    for key in &reserved {
        raw_set(&store, key.as_bytes(), b"the gateway's").await;
    }
    raw_set(&store, b"room/0", b"ordinary").await;
    let refused = |body: &Value, what: &str| {
        assert_eq!(body["type"], "/problems/reserved-key", "{what}: {body}");
        assert_eq!(body["status"], 403, "{what}: {body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("reserved for the gateway's own records"),
            "{what}: {body}"
        );
    };
    for key in &reserved {
        let url = gw.key(key.as_bytes());
        let lock = gw.url(&format!("/locks/{}", encode(key.as_bytes())));
        for (what, request) in [
            ("GET", client.get(&url)),
            ("PUT", client.put(&url).body("mine")),
            ("DELETE", client.delete(&url)),
            ("lock PUT", client.put(format!("{lock}?holder=me&ttl=5s"))),
            ("lock GET", client.get(&lock)),
            ("lock DELETE", client.delete(format!("{lock}?holder=me"))),
        ] {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 403, "{what} {key}");
            refused(&body_json(response).await, &format!("{what} {key}"));
        }
        let head = client.head(&url).send().await.unwrap();
        assert_eq!(head.status(), 403, "HEAD {key}");
        let ops = json!({"ops": [
            {"op": "get", "key": key},
            {"op": "set", "key": key, "value": "mine"},
            {"op": "delete", "key": key},
            {"op": "get", "key": "room/0"},
        ]});
        let batch = client
            .post(gw.url("/batch"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(ops.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(batch.status(), 200);
        let results = body_json(batch).await["results"].clone();
        for result in &results.as_array().unwrap()[..3] {
            refused(&result["problem"], &format!("batch {key}"));
        }
        assert_eq!(results[3]["status"], 200, "{results}");
        let encoded = encode(key.as_bytes());
        for path in [format!("/watch/{encoded}"), format!("/watch?key={encoded}")] {
            match sse::open(client, &gw.url(&path), None).await {
                Err((403, _, body)) => refused(&serde_json::from_str(&body).unwrap(), &path),
                Err((status, _, body)) => panic!("{path}: {status} {body}"),
                Ok(_) => panic!("{path}: a stream"),
            }
        }
    }

    for query in ["match=*", "match=dapr-*", "match=*room*&values=true"] {
        let entries = list_all(client, gw, &format!("/keys?{query}")).await;
        let listed: Vec<&str> = entries.iter().map(|e| e["key"].as_str().unwrap()).collect();
        let expected: &[&str] = if query.contains("dapr") {
            &[]
        } else {
            &["room/0"]
        };
        assert_eq!(listed, expected, "{query}");
    }

    // A pattern watch: the ordinary key, never a record, at the start or
    // when one is written later.
    let mut stream = sse::open(client, &gw.url("/watch?match=*"), None)
        .await
        .unwrap_or_else(|(status, _, body)| panic!("watch: {status} {body}"));
    assert_eq!(stream.expect("sync").await.data["key"], "room/0");
    assert_eq!(
        stream.expect("listed").await.data,
        json!({"match": "*", "keys": 1})
    );
    raw_set(
        &store,
        format!("{INTENT_PREFIX}room/2").as_bytes(),
        b"later",
    )
    .await;
    raw_set(&store, b"room/3", b"later").await;
    let sync = stream.expect("sync").await;
    assert_eq!(sync.data["key"], "room/3", "{sync:?}");
    stream.expect_silence(Duration::from_millis(700)).await;

    for key in &reserved {
        assert_eq!(
            raw_get(&store, key.as_bytes()).await.as_deref(),
            Some(&b"the gateway's"[..]),
            "{key}"
        );
    }
}

#[tokio::test]
async fn no_grant_reaches_the_gateways_own_records() {
    let rules = Rules::new(&api_token_rules(&[
        "{keyType: Pattern, keys: [\"*\"], method: ReadWrite}",
    ]));
    let (stack, _owner) = stack(&rules).await;
    assert_reserved_keys_out_of_reach(&stack, &stack.gateway, &caller()).await;
}

#[tokio::test]
async fn without_rules_no_caller_reaches_the_gateways_own_records() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            watch: WatchSettings {
                rescan_interval: Duration::from_millis(200),
                ..WatchSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await;
    assert_reserved_keys_out_of_reach(&stack, &stack.gateway, &stack.gateway.http).await;
}
