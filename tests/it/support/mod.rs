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
pub mod linearizability;
pub mod load;
pub mod mosquitto;
pub mod responder;
pub mod scripted_store;
pub mod sdk;
pub mod sse;
pub mod tokens;

pub use auth_proxy::AuthProxy;
pub use certs::TestPki;
pub use mosquitto::{Mosquitto, MosquittoConfig};
pub use responder::{Answer, Responder};

use std::net::{SocketAddr, TcpListener};
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

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
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
