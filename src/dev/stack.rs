//! The three parts of dev mode, started in order and stopped in reverse.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::task::JoinHandle;

use super::broker::EmbeddedBroker;
use super::error::DevError;
use super::settings::DevSettings;
use crate::emulator::{Emulator, EmulatorConfig, EmulatorHandle};
use crate::http::{ServeSettings, Server};
use crate::metrics::Metrics;
use crate::mqtt::{BrokerSettings, PoolSettings};

/// How long start-up waits for the gateway's pool (and the Dapr outbox's
/// relay) to be subscribed.
pub const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// The gateway's MQTT client id prefix (one broker, one gateway: no clash).
const GATEWAY_CLIENT_ID: &str = "statestore-gateway-dev";

/// How long in-flight HTTP requests get at shutdown; a laptop wants Ctrl-C
/// to be quick.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A running embedded broker, emulator and gateway.
#[derive(Debug)]
pub struct DevStack {
    broker: EmbeddedBroker,
    emulator: Emulator,
    gateway: Server,
    disconnects: JoinHandle<()>,
    data_dir: Option<PathBuf>,
}

impl DevStack {
    /// Starts the broker, then the emulator on it, then the gateway on it,
    /// and returns once the gateway is subscribed (ready to serve keys).
    pub async fn start(settings: &DevSettings) -> Result<DevStack, DevError> {
        let broker = EmbeddedBroker::start(settings.broker_listen).await?;
        let broker_addr = connectable(broker.local_addr());

        // Subscribed before the emulator exists, so no disconnect is missed.
        let disconnected = broker.disconnects();
        let mut emulator_config =
            EmulatorConfig::new(broker_addr.ip().to_string(), broker_addr.port());
        emulator_config.data_dir = settings.data_dir.clone();
        let emulator = Emulator::start(emulator_config).await?;
        let disconnects = tokio::spawn(forward_disconnects(emulator.handle(), disconnected));

        // The code's defaults, never the environment's: dev mode must not
        // pick up a cluster's `AIO_*` broker, TLS or token settings.
        let broker_settings = BrokerSettings::new(broker_addr.ip().to_string(), broker_addr.port());
        let gateway_settings = ServeSettings {
            listen: settings.listen,
            admin_listen: settings.admin_listen,
            pool: PoolSettings::new(broker_settings, GATEWAY_CLIENT_ID),
            shutdown_grace: SHUTDOWN_GRACE,
            dapr: settings.dapr.clone(),
            ..ServeSettings::default()
        };
        let gateway = match Server::start(gateway_settings, Metrics::new()).await {
            Ok(gateway) => gateway,
            Err(error) => {
                disconnects.abort();
                let _ = emulator.shutdown().await;
                broker.shutdown().await;
                return Err(error.into());
            }
        };
        let stack = DevStack {
            broker,
            emulator,
            gateway,
            disconnects,
            data_dir: settings.data_dir.clone(),
        };
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        // The Dapr outbox's relay too, if any: the embedded broker drops a
        // message nobody subscribes to without saying so.
        let ready = |state: &crate::http::AppState| {
            state.store.pool().is_ready() && state.dapr.outbox_ready()
        };
        while !ready(stack.gateway.state()) {
            if tokio::time::Instant::now() >= deadline {
                let _ = stack.shutdown().await;
                return Err(DevError::NotReady {
                    within: READY_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(stack)
    }

    /// Where the embedded broker listens.
    pub fn broker_addr(&self) -> SocketAddr {
        self.broker.local_addr()
    }

    /// Where the key and watch API listens.
    pub fn api_addr(&self) -> SocketAddr {
        self.gateway.api_addr()
    }

    /// Where `/livez`, `/readyz` and `/metrics` listen.
    pub fn admin_addr(&self) -> SocketAddr {
        self.gateway.admin_addr()
    }

    /// The emulator's counters (keys, KEYNOTIFY registrations).
    pub fn emulator(&self) -> EmulatorHandle {
        self.emulator.handle()
    }

    /// What to print once everything runs: the addresses and a first request.
    pub fn banner(&self) -> String {
        super::banner::banner(
            self.api_addr(),
            self.admin_addr(),
            self.broker_addr(),
            self.data_dir.as_deref(),
        )
    }

    /// Serves until `signal` resolves (or the emulator fails), then stops.
    pub async fn run_until(
        mut self,
        signal: impl std::future::Future<Output = ()>,
    ) -> Result<(), DevError> {
        let failed = tokio::select! {
            () = signal => None,
            result = self.emulator.stopped() => Some(result),
        };
        match failed {
            None => {
                tracing::info!("shutdown requested");
                self.shutdown().await
            }
            Some(result) => {
                let stopped = self.shutdown().await;
                result?;
                stopped
            }
        }
    }

    /// Stops the gateway (draining requests), the emulator, then the broker.
    pub async fn shutdown(self) -> Result<(), DevError> {
        let gateway = self.gateway.shutdown().await;
        self.disconnects.abort();
        let emulator = self.emulator.shutdown().await;
        self.broker.shutdown().await;
        gateway?;
        emulator?;
        Ok(())
    }
}

/// Tells the emulator about every client the broker saw go, so that its
/// KEYNOTIFY registrations go too (as the real service does).
async fn forward_disconnects(
    emulator: EmulatorHandle,
    mut disconnected: broadcast::Receiver<String>,
) {
    loop {
        match disconnected.recv().await {
            Ok(client_id) => emulator.client_disconnected(&client_id),
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "missed client disconnects; their key watches stay registered"
                );
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// The address a client on this machine dials for a listener bound to
/// `addr` (a wildcard address is reached through loopback).
fn connectable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_addresses_are_dialled_through_loopback() {
        assert_eq!(
            connectable("0.0.0.0:1883".parse().unwrap()),
            "127.0.0.1:1883".parse().unwrap()
        );
        assert_eq!(
            connectable("[::]:1883".parse().unwrap()),
            "[::1]:1883".parse().unwrap()
        );
        assert_eq!(
            connectable("192.168.1.5:1883".parse().unwrap()),
            "192.168.1.5:1883".parse().unwrap()
        );
    }
}
