//! Shared test set-up: real processes and real sockets on free loopback ports.
//!
//! Set `TEST_LOG=1` to see the logs of everything a test starts.

#![allow(dead_code)]

pub mod emulator;
pub mod gateway;
pub mod mosquitto;
pub mod scripted_store;

pub use mosquitto::Mosquitto;

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

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
