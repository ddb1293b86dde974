//! Linearizability under faults, as etcd's robustness tests and Jepsen do:
//! concurrent HTTP clients run PUT, PUT NX, PUT NEX, GET, DELETE and VDEL
//! on a few keys while fault proxies cut, stall and refuse the gateway's
//! and the emulator's broker connections and the broker and the emulator
//! (a real process with a data directory, every write persisted) are
//! killed and restarted. Every call and return is recorded; each key's
//! history is checked against a register, and each watcher's stream for
//! versions that go back and its final state.
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
