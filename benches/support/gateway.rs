//! The gateway as its own process (`statestore-gateway serve`), timed from
//! spawn to the first `/readyz` 200.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::http::request_once;
use super::procs::{Proc, free_port};

/// How long the gateway may take to become ready before the run fails.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// A running gateway process.
#[derive(Debug)]
pub struct GatewayProc {
    /// The process.
    pub proc: Proc,
    /// The key API.
    pub api: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
    /// From spawn to the first `/readyz` 200.
    pub ready_after: Duration,
}

/// How to start gateways.
#[derive(Debug, Clone, Copy)]
pub struct GatewayLaunch<'a> {
    /// The `statestore-gateway` binary.
    pub binary: &'a Path,
    /// Where logs go.
    pub dir: &'a Path,
    /// mosquitto's port on 127.0.0.1.
    pub broker_port: u16,
    /// `--pool-size`
    pub pool_size: usize,
    /// `--max-watchers`
    pub max_watchers: usize,
    /// Extra environment.
    pub env: &'a [(String, String)],
}

impl GatewayLaunch<'_> {
    /// Starts `serve` against mosquitto (plain TCP) and waits until
    /// `/readyz` answers 200, polling every millisecond.
    pub async fn start(&self, name: &str) -> Result<GatewayProc> {
        let GatewayLaunch {
            binary,
            dir,
            broker_port,
            pool_size,
            max_watchers,
            env,
        } = *self;
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg("--listen")
            .arg(api.to_string())
            .arg("--admin-listen")
            .arg(admin.to_string())
            .arg("--pool-size")
            .arg(pool_size.to_string())
            .arg("--max-watchers")
            .arg(max_watchers.to_string())
            .arg("--client-id")
            .arg(format!("bench-{name}"))
            .env("AIO_BROKER_HOSTNAME", "127.0.0.1")
            .env("AIO_BROKER_TCP_PORT", broker_port.to_string())
            .env("AIO_MQTT_USE_TLS", "false")
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(name, value)| (name, value)));
        let started = Instant::now();
        let mut proc = Proc::spawn(name, dir, &mut command)?;
        loop {
            if let Ok(response) = request_once(admin, "GET", "/readyz", b"").await
                && response.status == 200
            {
                break;
            }
            let ready_after = started.elapsed();
            proc.check_alive()?;
            if ready_after > READY_WITHIN {
                bail!(
                    "the gateway is not ready after {READY_WITHIN:?}; {}",
                    proc.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let ready_after = started.elapsed();
        Ok(GatewayProc {
            proc,
            api,
            admin,
            ready_after,
        })
    }
}

impl GatewayProc {
    /// A metric's value from `/metrics` (first sample of the family).
    pub async fn metric(&self, name: &str) -> Result<f64> {
        let response = request_once(self.admin, "GET", "/metrics", b"").await?;
        let text = String::from_utf8_lossy(&response.body);
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| {
                let (metric, value) = line.rsplit_once(' ')?;
                (metric == name).then(|| value.parse().ok())?
            })
            .with_context(|| format!("no {name} in /metrics"))
    }
}
