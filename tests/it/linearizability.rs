//! Linearizability under faults, as etcd's robustness tests and Jepsen do:
//! concurrent HTTP clients run PUT, PUT NX, PUT NEX, GET, DELETE and VDEL
//! on a few keys while fault proxies cut, stall and refuse the gateway's
//! and the emulator's broker connections and the broker and the emulator
//! (a real process with a data directory, every write persisted) are
//! killed and restarted. Every call and return is recorded; each key's
//! history is checked against a register, and each watcher's stream for
//! versions that go back and its final state.
//!
//! Dapr's state API with transactions on is checked the same way against a
//! multi-key store: two gateway processes on one store, a transaction one
//! atomic operation, one gateway killed or cut off in some rounds.
//!
//! `LINEARIZABILITY_SECS` sets how long the load runs (default 20);
//! `scripts/linearizability` runs it for longer and prints the report.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng as _;
use statestore_gateway::watch::WatchSettings;
use tokio::sync::watch;

use crate::support::emulator::EmulatorProcess;
use crate::support::fault_proxy::FaultProxy;
use crate::support::gateway::{Gateway, GatewayOptions, encode};
use crate::support::gateway_process::GatewayProcess;
use crate::support::linearizability::dapr as dapr_model;
use crate::support::linearizability::{
    Input, Operation, Output, Verdict, WatchEvent, check, check_watch,
};
use crate::support::sse;
use crate::support::{Mosquitto, init_logging};

const KEYS: &[&str] = &["lin/a", "lin/b", "lin/c", "lin/d"];
const CLIENTS: usize = 8;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Longer than any answer the gateway can give.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Search steps per key before a history counts as inconclusive.
const BUDGET: u64 = 20_000_000;

/// One recorded operation and its key; `not_sent` for an answer that
/// claims the store never saw the request (kept out of the history).
struct Recorded {
    key: &'static str,
    op: Operation,
    not_sent: bool,
}

/// What an answer says about whether the operation took effect.
enum Meaning {
    /// It did or did not, as `Output` says.
    Known(Output),
    /// The gateway says it never reached the store: leave it out.
    NotSent,
}

fn meaning(input: &Input, result: &Result<(u16, String), String>) -> Meaning {
    let Ok((status, body)) = result else {
        return Meaning::Known(Output::Unknown);
    };
    let status = *status;
    match (input, status) {
        // "Not processed, retry": a promise that nothing happened.
        (_, 503) => Meaning::NotSent,
        (_, 500 | 502 | 504) => Meaning::Known(Output::Unknown),
        (Input::Get, 200) => Meaning::Known(Output::Read(Some(body.clone()))),
        (Input::Get, 404) => Meaning::Known(Output::Read(None)),
        (Input::Put(_), 200) | (Input::PutNex(_), 200) | (Input::PutNx(_), 200 | 201) => {
            Meaning::Known(Output::Applied)
        }
        (Input::PutNx(_) | Input::PutNex(_), 412) => Meaning::Known(Output::NotApplied),
        (Input::Delete | Input::Vdel(_), 204) => Meaning::Known(Output::Applied),
        (Input::Delete, 404) | (Input::Vdel(_), 404 | 412) => Meaning::Known(Output::NotApplied),
        _ => panic!("{input:?}: unexpected status {status}: {body}"),
    }
}

async fn send(
    http: &reqwest::Client,
    gateway: &Gateway,
    key: &str,
    input: &Input,
) -> Result<(u16, String), String> {
    let url = gateway.key(key.as_bytes());
    let request = match input {
        Input::Put(value) => http.put(format!("{url}?persist=true")).body(value.clone()),
        Input::PutNx(value) => http
            .put(format!("{url}?persist=true"))
            .header("if-none-match", "*")
            .body(value.clone()),
        Input::PutNex(value) => http
            .put(format!("{url}?persist=true&nex=true"))
            .body(value.clone()),
        Input::Get => http.get(url),
        Input::Delete => http.delete(url),
        Input::Vdel(value) => http.delete(format!("{url}?value={}", encode(value.as_bytes()))),
    };
    let response = request
        .timeout(CLIENT_TIMEOUT)
        .send()
        .await
        .map_err(|error| format!("{error}"))?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|error| format!("{error}"))?;
    Ok((status, body))
}

/// One client: random operations on random keys until stopped.
async fn client(
    id: usize,
    gateway: Arc<Gateway>,
    base: Instant,
    stop: watch::Receiver<bool>,
) -> Vec<Recorded> {
    let http = crate::support::gateway::http_client();
    let mut recorded = Vec::new();
    let mut last_written: HashMap<&str, String> = HashMap::new();
    for n in 0u64.. {
        if *stop.borrow() {
            break;
        }
        let (key, input) = {
            let mut rng = rand::rng();
            let key = KEYS[rng.random_range(0..KEYS.len())];
            let fresh = format!("c{id}-{n}");
            let known = last_written
                .get(key)
                .cloned()
                .unwrap_or_else(|| fresh.clone());
            let input = match rng.random_range(0..100) {
                0..30 => Input::Put(fresh),
                30..40 => Input::PutNx(fresh),
                40..45 => Input::PutNex(fresh),
                45..50 => Input::PutNex(known),
                50..80 => Input::Get,
                80..90 => Input::Delete,
                _ => Input::Vdel(known),
            };
            (key, input)
        };
        let call = base.elapsed().as_nanos() as u64;
        let result = send(&http, &gateway, key, &input).await;
        let ret = base.elapsed().as_nanos() as u64;
        match meaning(&input, &result) {
            Meaning::NotSent => recorded.push(Recorded {
                key,
                op: Operation {
                    client: id,
                    input,
                    call,
                    ret,
                    output: Output::Unknown,
                },
                not_sent: true,
            }),
            Meaning::Known(output) => {
                if let Input::Put(value) | Input::PutNx(value) | Input::PutNex(value) = &input {
                    last_written.insert(key, value.clone());
                }
                recorded.push(Recorded {
                    key,
                    op: Operation {
                        client: id,
                        input,
                        call,
                        ret,
                        output,
                    },
                    not_sent: false,
                });
            }
        }
        if matches!(result, Ok((503, _)) | Err(_)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    recorded
}

/// A watcher of `key`: every state event, reopening the stream (with
/// `Last-Event-ID`) when it ends, until stopped.
async fn watcher(
    gateway: Arc<Gateway>,
    key: &'static str,
    stop: watch::Receiver<bool>,
    events: Arc<Mutex<Vec<WatchEvent>>>,
) -> usize {
    let mut reopened = 0;
    let mut last_id: Option<String> = None;
    while !*stop.borrow() {
        let url = gateway.url(&format!("/watch/{key}"));
        let Ok(mut stream) = sse::open(&gateway.http, &url, last_id.as_deref()).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        loop {
            let waited = Instant::now();
            let Some(event) = stream.next(Duration::from_millis(500)).await else {
                if *stop.borrow() {
                    return reopened;
                }
                if waited.elapsed() < Duration::from_millis(400) {
                    break; // the stream ended
                }
                continue;
            };
            if !matches!(event.event.as_str(), "sync" | "set" | "delete") {
                continue;
            }
            if event.id.is_some() {
                last_id.clone_from(&event.id);
            }
            events.lock().unwrap().push(WatchEvent {
                kind: event.event.clone(),
                value: event.data["value"].as_str().map(str::to_owned),
                version: event.id.clone(),
            });
        }
        reopened += 1;
    }
    reopened
}

/// The faults: one every 0.5-1.5 s, healed before the next.
async fn nemesis(
    gateway_proxy: Arc<FaultProxy>,
    emulator_proxy: Arc<FaultProxy>,
    broker: Arc<tokio::sync::Mutex<Mosquitto>>,
    store: Arc<tokio::sync::Mutex<EmulatorProcess>>,
    restart_store: impl Fn() -> Vec<String>,
    mut stop: watch::Receiver<bool>,
) -> BTreeMap<&'static str, usize> {
    let mut injected = BTreeMap::new();
    loop {
        let (pause, fault) = {
            let mut rng = rand::rng();
            (
                Duration::from_millis(rng.random_range(500..1_500)),
                rng.random_range(0..9),
            )
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|stop| *stop) => return injected,
        }
        let n = rand::rng().random_range(1..20);
        let name = match fault {
            0 => {
                gateway_proxy.cut_all();
                "cut the gateway's connections"
            }
            1 => {
                gateway_proxy.cut_after_publishes(n);
                tokio::time::sleep(Duration::from_millis(500)).await;
                gateway_proxy.cut_after_publishes(0);
                "cut the gateway's connections after its Nth PUBLISH"
            }
            2 => {
                emulator_proxy.cut_after_publishes(n);
                tokio::time::sleep(Duration::from_millis(500)).await;
                emulator_proxy.cut_after_publishes(0);
                "cut the emulator's connection after its Nth PUBLISH (reply)"
            }
            3 => {
                gateway_proxy.set_black_hole(true);
                tokio::time::sleep(Duration::from_millis(300)).await;
                gateway_proxy.set_black_hole(false);
                gateway_proxy.cut_all();
                "black-hole the gateway for 300 ms, then cut"
            }
            4 => {
                gateway_proxy.set_delay(Duration::from_millis(30));
                emulator_proxy.set_delay(Duration::from_millis(30));
                tokio::time::sleep(Duration::from_secs(1)).await;
                gateway_proxy.set_delay(Duration::ZERO);
                emulator_proxy.set_delay(Duration::ZERO);
                "delay every packet 30 ms for 1 s"
            }
            5 => {
                gateway_proxy.set_refuse(true);
                gateway_proxy.cut_all();
                tokio::time::sleep(Duration::from_millis(500)).await;
                gateway_proxy.set_refuse(false);
                "cut the gateway and refuse it for 500 ms"
            }
            6 => {
                emulator_proxy.cut_all();
                "cut the emulator's connection"
            }
            7 => {
                broker.lock().await.restart().await;
                "kill and restart the broker"
            }
            _ => {
                let mut store = store.lock().await;
                store.kill();
                *store = EmulatorProcess::start_through(
                    emulator_proxy.port(),
                    &*broker.lock().await,
                    &restart_store()
                        .iter()
                        .map(String::as_str)
                        .collect::<Vec<_>>(),
                )
                .await;
                "kill -9 and restart the emulator"
            }
        };
        *injected.entry(name).or_default() += 1;
    }
}

/// Reads `key` until the gateway answers 200 or 404 (it may be healing).
async fn final_state(gateway: &Gateway, key: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = gateway.http.get(gateway.key(key.as_bytes())).send().await;
        if let Ok(response) = response {
            match response.status().as_u16() {
                200 => return Some(response.text().await.unwrap()),
                404 => return None,
                _ => {}
            }
        }
        assert!(
            Instant::now() < deadline,
            "{key} unreadable 30 s after the faults"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_under_faults_see_a_linearizable_store() {
    init_logging();
    let seconds: u64 = std::env::var("LINEARIZABILITY_SECS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20);
    let broker = Mosquitto::start().await;
    let gateway_proxy = Arc::new(FaultProxy::start(broker.addr).await);
    let emulator_proxy = Arc::new(FaultProxy::start(broker.addr).await);
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap().to_owned();
    let store_args = move || vec!["--data-dir".to_owned(), data_dir.clone()];
    let store = EmulatorProcess::start_through(
        emulator_proxy.port(),
        &broker,
        &store_args().iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    let gateway = Gateway::start(
        gateway_proxy.port(),
        GatewayOptions {
            request_timeout: REQUEST_TIMEOUT,
            watch: WatchSettings {
                resync_interval: Some(Duration::from_secs(1)),
                ..WatchSettings::default()
            },
            ..GatewayOptions::default()
        },
    )
    .await;
    gateway.wait_ready().await;
    let gateway = Arc::new(gateway);
    let broker = Arc::new(tokio::sync::Mutex::new(broker));
    let store = Arc::new(tokio::sync::Mutex::new(store));

    let base = Instant::now();
    let (stop, stopped) = watch::channel(false);
    let watched: Vec<(&str, Arc<Mutex<Vec<WatchEvent>>>)> = KEYS
        .iter()
        .map(|&key| (key, Arc::new(Mutex::new(Vec::new()))))
        .collect();
    let (stop_watchers, watchers_stopped) = watch::channel(false);
    let watchers: Vec<_> = watched
        .iter()
        .map(|(key, events)| {
            tokio::spawn(watcher(
                gateway.clone(),
                key,
                watchers_stopped.clone(),
                events.clone(),
            ))
        })
        .collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(id, gateway.clone(), base, stopped.clone())))
        .collect();
    let faults = tokio::spawn(nemesis(
        gateway_proxy.clone(),
        emulator_proxy.clone(),
        broker.clone(),
        store.clone(),
        store_args,
        stopped.clone(),
    ));

    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.send_replace(true);
    let injected = faults.await.unwrap();
    let mut histories: BTreeMap<&str, Vec<Operation>> = BTreeMap::new();
    // Writes answered 503 ("not processed"), by value: a value of one of
    // them seen later breaks that promise.
    let mut refused_writes: HashMap<String, Operation> = HashMap::new();
    for client in clients {
        for recorded in client.await.unwrap() {
            if !recorded.not_sent {
                histories.entry(recorded.key).or_default().push(recorded.op);
            } else if let Input::Put(value) | Input::PutNx(value) | Input::PutNex(value) =
                &recorded.op.input
            {
                refused_writes.insert(value.clone(), recorded.op);
            }
        }
    }
    gateway.wait_ready().await;

    let mut violations = Vec::new();
    let mut inconclusive = Vec::new();
    let mut operations = 0;
    let mut unknown = 0;
    let written: HashSet<String> = histories
        .values()
        .flatten()
        .filter_map(|op| match &op.input {
            Input::Put(value) | Input::PutNx(value) | Input::PutNex(value) => Some(value.clone()),
            _ => None,
        })
        .collect();
    for key in KEYS {
        let mut history = histories.remove(key).unwrap_or_default();
        // The final read, after every fault healed, closes each history.
        let last = final_state(&gateway, key).await;
        let now = base.elapsed().as_nanos() as u64;
        history.push(Operation {
            client: usize::MAX,
            input: Input::Get,
            call: now,
            ret: now,
            output: Output::Read(last.clone()),
        });
        operations += history.len();
        unknown += history
            .iter()
            .filter(|op| op.output == Output::Unknown)
            .count();
        match check(&history, BUDGET) {
            Verdict::Linearizable => {}
            Verdict::Inconclusive => inconclusive.push(*key),
            Verdict::Violation(report) => {
                let answered_503: Vec<String> = report
                    .minimal
                    .iter()
                    .filter_map(|op| match &op.output {
                        Output::Read(Some(value)) => refused_writes.get(value),
                        _ => None,
                    })
                    .map(|op| format!("  written by a write answered 503: {op}\n"))
                    .collect();
                violations.push(format!("key {key}: {report}{}", answered_503.concat()));
            }
        }
        // Watchers catch up (a resync may be due) before their check.
        let events = &watched.iter().find(|(k, _)| k == key).unwrap().1;
        let deadline = Instant::now() + Duration::from_secs(15);
        while events.lock().unwrap().last().map(|e| &e.value) != Some(&last)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let events = events.lock().unwrap().clone();
        if let Err(problem) = check_watch(&events, &written, &last) {
            let answered_503 = events
                .iter()
                .filter_map(|event| event.value.as_ref())
                .filter(|value| !written.contains(*value))
                .filter_map(|value| refused_writes.get(value))
                .map(|op| format!("; written by a write answered 503: {op}"))
                .next()
                .unwrap_or_default();
            violations.push(format!(
                "watcher of {key} ({} events): {problem}{answered_503}",
                events.len()
            ));
        }
    }
    stop_watchers.send_replace(true);
    let mut reopened = 0;
    for watcher in watchers {
        reopened += watcher.await.unwrap();
    }
    eprintln!(
        "linearizability: {seconds} s, {} histories, {operations} operations \
         ({unknown} of unknown outcome), watch streams reopened {reopened} times, \
         {} writes answered 503, faults {injected:?}, proxy stats gateway {:?} emulator {:?}, \
         {} violations, inconclusive {inconclusive:?}",
        KEYS.len(),
        refused_writes.len(),
        gateway_proxy.stats(),
        emulator_proxy.stats(),
        violations.len()
    );
    for violation in &violations {
        eprintln!("VIOLATION {violation}");
    }
    assert!(
        operations > 100 * seconds as usize / 10,
        "too little load ran"
    );
    assert!(inconclusive.is_empty(), "undecided keys: {inconclusive:?}");
    assert!(violations.is_empty(), "{} violations", violations.len());
}

/// Dapr's state API with transactions: keys per round.
const DAPR_KEYS: usize = 3;
/// Concurrent Dapr clients.
const DAPR_CLIENTS: usize = 4;
/// Operations per client per round: a few dozen per history.
const DAPR_OPS: usize = 9;
/// Rounds: a third without a fault, a third killing a gateway (SIGKILL), a
/// third cutting the other's broker connection.
const DAPR_ROUNDS: usize = 9;
/// The gateways' Dapr lease (and a killed transaction's deadline).
const DAPR_LEASE: Duration = Duration::from_millis(800);

/// A Dapr gateway's flags: transactions on, a short lease.
const DAPR_ARGS: &[&str] = &[
    "--dapr-transactions",
    "true",
    "--dapr-etag-lease",
    "800ms",
    "--request-timeout",
    "3s",
];

/// One random Dapr operation on `keys`, with the etags this client read.
fn dapr_input(
    rng: &mut impl rand::Rng,
    keys: &[String],
    etags: &HashMap<String, String>,
    fresh: &mut impl FnMut() -> String,
) -> dapr_model::Input {
    use dapr_model::{Input as D, TxItem};
    let key = keys[rng.random_range(0..keys.len())].clone();
    let etag = etags.get(&key).cloned();
    match rng.random_range(0..100) {
        0..25 => D::Get(key),
        25..37 => D::Save {
            key,
            value: fresh(),
            etag: None,
            first_write: false,
        },
        37..47 => D::Save {
            key,
            value: fresh(),
            etag: None,
            first_write: true,
        },
        47..60 if etag.is_some() => D::Save {
            key,
            value: fresh(),
            etag,
            first_write: false,
        },
        60..65 => D::Delete { key, etag: None },
        65..72 if etag.is_some() => D::Delete { key, etag },
        47..72 => D::Get(key),
        _ => {
            let mut chosen: Vec<&String> = keys.iter().collect();
            rand::seq::SliceRandom::shuffle(chosen.as_mut_slice(), rng);
            chosen.truncate(rng.random_range(2..=keys.len()));
            // Now and then a key twice: the items apply in order.
            if rng.random_bool(0.3) {
                let again = chosen[rng.random_range(0..chosen.len())];
                chosen.insert(rng.random_range(0..=chosen.len()), again);
            }
            let items = chosen
                .into_iter()
                .map(|key| {
                    let etag = etags.get(key).cloned().filter(|_| rng.random_bool(0.5));
                    match rng.random_range(0..10) {
                        0 => TxItem {
                            key: key.clone(),
                            value: None,
                            etag,
                            first_write: false,
                        },
                        1 => TxItem {
                            key: key.clone(),
                            value: Some(fresh()),
                            etag: None,
                            first_write: true,
                        },
                        _ => TxItem {
                            key: key.clone(),
                            value: Some(fresh()),
                            etag,
                            first_write: false,
                        },
                    }
                })
                .collect();
            D::Transaction(items)
        }
    }
}

/// A request whose answer says nothing was sent (the gateway was gone).
const NOT_SENT: &str = "not sent";

/// Sends `input` to the Dapr API at `api`: the status, body and `ETag`.
async fn send_dapr(
    http: &reqwest::Client,
    api: std::net::SocketAddr,
    input: &dapr_model::Input,
) -> Result<(u16, String, Option<String>), String> {
    use dapr_model::Input as D;
    use serde_json::json;
    let url = format!("http://{api}/v1.0/state/statestore");
    let concurrency = |first_write: bool| {
        if first_write {
            "first-write"
        } else {
            "last-write"
        }
    };
    let request = match input {
        D::Get(key) => http.get(format!("{url}/{key}")),
        D::Save {
            key,
            value,
            etag,
            first_write,
        } => {
            let mut item = json!({"key": key, "value": value, "options": {"concurrency": concurrency(*first_write)}});
            if let Some(etag) = etag {
                item["etag"] = json!(etag);
            }
            http.post(&url).json(&json!([item]))
        }
        D::Delete { key, etag } => {
            let request = http.delete(format!("{url}/{key}"));
            match etag {
                Some(etag) => request.header("if-match", etag),
                None => request,
            }
        }
        D::Transaction(items) => {
            let operations: Vec<serde_json::Value> = items
                .iter()
                .map(|item| {
                    let mut request = json!({"key": item.key, "options": {"concurrency": concurrency(item.first_write)}});
                    if let Some(value) = &item.value {
                        request["value"] = json!(value);
                    }
                    if let Some(etag) = &item.etag {
                        request["etag"] = json!(etag);
                    }
                    let operation = if item.value.is_some() { "upsert" } else { "delete" };
                    json!({"operation": operation, "request": request})
                })
                .collect();
            http.post(format!("{url}/transaction"))
                .json(&json!({"operations": operations}))
        }
    };
    let response = request
        .timeout(CLIENT_TIMEOUT)
        .send()
        .await
        .map_err(|error| {
            if error.is_connect() {
                NOT_SENT.to_owned()
            } else {
                error.to_string()
            }
        })?;
    let status = response.status().as_u16();
    let etag = response
        .headers()
        .get("etag")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let body = response.text().await.map_err(|error| error.to_string())?;
    Ok((status, body, etag))
}

/// What a Dapr answer says; `None`: nothing was sent.
fn dapr_output(
    input: &dapr_model::Input,
    answer: &Result<(u16, String, Option<String>), String>,
) -> Option<dapr_model::Output> {
    use dapr_model::{Input as D, Output as O};
    let (status, body, etag) = match answer {
        Err(error) if error == NOT_SENT => return None,
        Err(_) => return Some(O::Unknown),
        Ok(answer) => answer,
    };
    Some(match (input, *status) {
        (D::Get(_), 200) => {
            let value: String = serde_json::from_str(body).expect("a JSON string value");
            O::Read(Some((value, etag.clone().expect("an ETag with a value"))))
        }
        (D::Get(_), 204) => O::Read(None),
        (_, 204) => O::Applied,
        (D::Save { .. } | D::Delete { .. }, 409) => O::NotApplied,
        // Dapr answers every failed transaction 500: the etag mismatch
        // (checked before anything is written) says nothing applied.
        (D::Transaction(_), 500) if body.contains("etag mismatch") => O::NotApplied,
        // "Not processed, retry", as for `/keys`.
        (_, 503) => return None,
        (_, 500 | 502 | 504) => O::Unknown,
        (input, status) => panic!("{input:?}: unexpected {status}: {body}"),
    })
}

/// One Dapr client for one round: alternates between the gateways.
async fn dapr_client(
    id: usize,
    apis: Arc<Mutex<[std::net::SocketAddr; 2]>>,
    keys: Vec<String>,
    round: usize,
    base: Instant,
) -> Vec<dapr_model::Operation> {
    let http = crate::support::gateway::http_client();
    let mut history = Vec::new();
    let mut etags: HashMap<String, String> = HashMap::new();
    let mut written = 0;
    for n in 0..DAPR_OPS {
        let input = {
            let mut fresh = || {
                written += 1;
                format!("r{round}c{id}v{written}")
            };
            dapr_input(&mut rand::rng(), &keys, &etags, &mut fresh)
        };
        let api = apis.lock().unwrap()[(id + n) % 2];
        let call = base.elapsed().as_nanos() as u64;
        let answer = send_dapr(&http, api, &input).await;
        let ret = base.elapsed().as_nanos() as u64;
        let Some(output) = dapr_output(&input, &answer) else {
            continue;
        };
        if let (dapr_model::Input::Get(key), dapr_model::Output::Read(read)) = (&input, &output) {
            match read {
                Some((_, etag)) => etags.insert(key.clone(), etag.clone()),
                None => etags.remove(key),
            };
        }
        history.push(dapr_model::Operation {
            client: id,
            input,
            call,
            ret,
            output,
        });
    }
    history
}

/// Reads `key` through `api` until it answers (a gateway may be healing).
async fn dapr_final_read(
    http: &reqwest::Client,
    api: std::net::SocketAddr,
    key: &str,
) -> dapr_model::Output {
    let input = dapr_model::Input::Get(key.to_owned());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = send_dapr(http, api, &input).await;
        if let Some(output @ dapr_model::Output::Read(_)) = dapr_output(&input, &answer) {
            return output;
        }
        assert!(
            Instant::now() < deadline,
            "{key} unreadable 30 s after the round"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dapr_transactions_through_two_gateways_are_linearizable_under_faults() {
    // Two gateway processes with transactions on share one store; clients
    // alternate between them. Each round's history (its own keys) is
    // checked against a multi-key store where a transaction is one atomic
    // operation; some rounds kill a gateway (SIGKILL), some cut the other's
    // broker connections, so some operations end with an unknown outcome.
    init_logging();
    let broker = Mosquitto::start().await;
    let _store = EmulatorProcess::start(&broker, &[]).await;
    let proxy = FaultProxy::start(broker.addr).await;
    let a = GatewayProcess::start(proxy.port(), DAPR_ARGS).await;
    let mut b = GatewayProcess::start(broker.port(), DAPR_ARGS).await;
    let apis = Arc::new(Mutex::new([a.api, b.api]));
    let http = crate::support::gateway::http_client();
    let base = Instant::now();
    let (mut operations, mut unknown, mut transactions) = (0, 0, 0);
    let mut violations = Vec::new();
    for round in 0..DAPR_ROUNDS {
        let keys: Vec<String> = (0..DAPR_KEYS)
            .map(|k| format!("dlin/{round}/{k}"))
            .collect();
        let clients: Vec<_> = (0..DAPR_CLIENTS)
            .map(|id| tokio::spawn(dapr_client(id, apis.clone(), keys.clone(), round, base)))
            .collect();
        let fault_at = Duration::from_millis(rand::rng().random_range(20..200));
        match round % 3 {
            1 => {
                tokio::time::sleep(fault_at).await;
                drop(b);
                b = GatewayProcess::start(broker.port(), DAPR_ARGS).await;
                apis.lock().unwrap()[1] = b.api;
            }
            2 => {
                tokio::time::sleep(fault_at).await;
                proxy.cut_all();
                tokio::time::sleep(fault_at).await;
                proxy.cut_all();
            }
            _ => {}
        }
        let mut history = Vec::new();
        for client in clients {
            history.extend(client.await.unwrap());
        }
        // Past every lease, then a read of each key (which resolves a
        // transaction a killed gateway left) closes the history.
        tokio::time::sleep(DAPR_LEASE + Duration::from_millis(200)).await;
        for key in &keys {
            let output = dapr_final_read(&http, a.api, key).await;
            let now = base.elapsed().as_nanos() as u64;
            history.push(dapr_model::Operation {
                client: usize::MAX,
                input: dapr_model::Input::Get(key.clone()),
                call: now,
                ret: now,
                output,
            });
        }
        operations += history.len();
        unknown += history
            .iter()
            .filter(|op| op.output == dapr_model::Output::Unknown)
            .count();
        transactions += history
            .iter()
            .filter(|op| {
                matches!(op.input, dapr_model::Input::Transaction(_))
                    && op.output == dapr_model::Output::Applied
            })
            .count();
        match dapr_model::check(&history, BUDGET) {
            dapr_model::Verdict::Linearizable => {}
            dapr_model::Verdict::Inconclusive => {
                violations.push(format!("round {round}: undecided"))
            }
            dapr_model::Verdict::Violation(report) => {
                violations.push(format!("round {round}: {report}"));
            }
        }
    }
    eprintln!(
        "dapr linearizability: {DAPR_ROUNDS} rounds, {operations} operations \
         ({unknown} of unknown outcome, {transactions} transactions applied), \
         proxy stats {:?}, {} violations",
        proxy.stats(),
        violations.len()
    );
    for violation in &violations {
        eprintln!("VIOLATION {violation}");
    }
    assert!(violations.is_empty(), "{} violations", violations.len());
    // The load did what it is for: transactions applied, faults left
    // some outcomes unknown.
    assert!(
        transactions >= DAPR_ROUNDS,
        "only {transactions} transactions applied"
    );
    assert!(unknown > 0, "no fault left an outcome unknown");
}
