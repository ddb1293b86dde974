//! Shared test set-up: real processes and real sockets on free loopback ports.
//!
//! Set `TEST_LOG=1` to see the logs of everything a test starts.

#![allow(dead_code)]

pub mod auth_proxy;
pub mod certs;
pub mod dev;
pub mod emulator;
pub mod fault_proxy;
pub mod gateway;
pub mod gateway_process;
pub mod grpc;
pub mod linearizability;
pub mod load;
pub mod mosquitto;
pub mod otlp;
pub mod responder;
pub mod scripted_store;
pub mod sdk;
pub mod sse;
pub mod tokens;
pub mod topic_subscriber;

pub use auth_proxy::AuthProxy;
pub use certs::TestPki;
pub use mosquitto::{Mosquitto, MosquittoConfig};
pub use responder::{Answer, Responder};

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;
use std::time::Duration;

/// Sends SIGTERM to `child` and waits (blocking, up to `within`) for its
/// exit status; panics if it is still running then.
pub fn terminate_and_wait(
    child: &mut std::process::Child,
    within: Duration,
) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit {within:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Freezes process `pid` (SIGSTOP) and returns once every one of its
/// threads has stopped. `kill` returns as soon as the signal is queued; the
/// stop itself begins only when one thread of the process next runs, and
/// its other threads go on working until then (on a busy machine, long
/// enough to answer a request sent right after `kill` returned).
pub fn freeze(pid: u32) {
    send_signal(pid, "STOP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !all_threads_stopped(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} did not stop within 10 s of SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Thaws a process [`freeze`] stopped (SIGCONT).
pub fn thaw(pid: u32) {
    send_signal(pid, "CONT");
}

/// Sends signal `name` (as `kill -<name>` spells it) to `pid`.
pub fn send_signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Whether each thread of `pid` is stopped (`T` in its `stat`; the state
/// follows the parenthesised command name, which may contain spaces).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads.flatten().all(|thread| {
        std::fs::read_to_string(thread.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                == Some("T")
        })
    })
}

/// A loopback port nothing listens on right now, never handed out before
/// in this test process (see [`fresh_listener`]).
pub fn free_port() -> u16 {
    fresh_listener()
        .local_addr()
        .expect("a bound listener has an address")
        .port()
}

/// A loopback listener on a port no other test in this process was given.
///
/// Tests run in parallel, and some stop a broker (or a proxy in front of
/// one) and start it again on the same port, while their gateway or store
/// keeps reconnecting to that port. Were the port handed to another test's
/// broker in between, that gateway or store would join the other test's
/// broker and answer its requests. So no port is handed out twice.
pub fn fresh_listener() -> TcpListener {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let port = listener
            .local_addr()
            .expect("a bound listener has an address")
            .port();
        if HANDED_OUT.lock().expect("port registry").insert(port) {
            return listener;
        }
    }
}

/// [`fresh_listener`] for tokio.
pub fn fresh_tokio_listener() -> tokio::net::TcpListener {
    let listener = fresh_listener();
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    tokio::net::TcpListener::from_std(listener).expect("a tokio listener")
}

/// Waits until something accepts TCP connections on `addr`.
pub async fn wait_for_listener(addr: SocketAddr, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing listens on {addr} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Installs a log subscriber once when `TEST_LOG` is set.
pub fn init_logging() {
    use std::sync::Once;
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "debug,rumqttc=info".into()),
                )
                .with_test_writer()
                .try_init();
        }
    });
}

/// Polls `condition` every few milliseconds until it holds; panics with
/// `what` after `within`.
pub async fn wait_until(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Pool settings for a plain broker at `addr`: small, quick timeouts.
pub fn pool_settings(addr: SocketAddr, client_id: &str) -> statestore_gateway::mqtt::PoolSettings {
    let broker = statestore_gateway::mqtt::BrokerSettings::new(addr.ip().to_string(), addr.port());
    let mut settings = statestore_gateway::mqtt::PoolSettings::new(broker, client_id);
    settings.size = 2;
    settings.request_timeout = Duration::from_secs(5);
    settings
}

/// Starts a pool and waits until all its members are subscribed.
pub async fn start_pool(
    settings: statestore_gateway::mqtt::PoolSettings,
) -> (
    statestore_gateway::mqtt::Pool,
    statestore_gateway::metrics::Metrics,
) {
    let metrics = statestore_gateway::metrics::Metrics::new();
    let size = settings.size as i64;
    let pool =
        statestore_gateway::mqtt::Pool::start(settings, metrics.clone()).expect("pool starts");
    wait_until(Duration::from_secs(5), "every member subscribed", || {
        metrics
            .pool_members
            .with_label_values(&["subscribed"])
            .get()
            == size
    })
    .await;
    (pool, metrics)
}

/// A store client of its own on the broker at `addr`, as an app holding
/// broker credentials has: it reaches every key, the gateway's reserved
/// records included, without any gateway's routes or rules.
pub async fn broker_store(addr: SocketAddr) -> statestore_gateway::store::StoreClient {
    let client_id = format!("broker-app-{:08x}", rand::random::<u32>());
    let (pool, _) = start_pool(pool_settings(addr, &client_id)).await;
    statestore_gateway::store::StoreClient::new(pool)
}

/// `SET key value` through `store` (a [`broker_store`]): the version given.
pub async fn raw_set(
    store: &statestore_gateway::store::StoreClient,
    key: &[u8],
    value: &[u8],
) -> statestore_gateway::protocol::Hlc {
    use statestore_gateway::protocol::{SetCondition, SetOptions};
    let options = SetOptions {
        condition: SetCondition::Always,
        expires_in_ms: None,
    };
    let set = store
        .set(
            bytes::Bytes::copy_from_slice(key),
            bytes::Bytes::copy_from_slice(value),
            options,
            &statestore_gateway::mqtt::RequestOptions::default(),
        )
        .await
        .expect("the store answers");
    match set {
        statestore_gateway::store::SetOutcome::Applied(Some(version)) => version,
        other => panic!("SET {key:?}: {other:?}"),
    }
}

/// `GET key` through `store` (a [`broker_store`]): the value, if any.
pub async fn raw_get(
    store: &statestore_gateway::store::StoreClient,
    key: &[u8],
) -> Option<Vec<u8>> {
    let read = store.get(bytes::Bytes::copy_from_slice(key)).await;
    read.expect("the store answers")
        .map(|read| read.value.to_vec())
}
