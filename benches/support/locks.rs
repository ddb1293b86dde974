//! Lock hand-over: a lock held, `waiters` blocking acquires queued behind
//! it, and the time from sending the holder's release to the next holder's
//! acquire returning, over `rounds` releases. After each hand-over a new
//! waiter joins, so the crowd stays at `waiters`. The same against etcd's
//! lock service (`/v3/lock/lock`, each waiter with its own lease), the
//! anchor in ANCHORS.md.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::gateway::GatewayProc;
use super::http::HttpConn;
use super::proc_fs::clock_ticks_per_second;
use super::procs::{Proc, free_port, wait_for_port};
use super::stats::Percentiles;

/// How long one blocking acquire may wait for its turn.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a hand-over may take before the run fails.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// Waiters connecting at the same time.
const CONNECT_CONCURRENCY: usize = 128;

/// A new waiter's time to join the line before the next release.
const JOIN_PAUSE: Duration = Duration::from_millis(20);

/// What a hand-over run measured.
#[derive(Debug, Clone)]
pub struct HandoverReport {
    /// `gateway` or `etcd`.
    pub service: &'static str,
    /// Waiters queued behind the holder.
    pub waiters: usize,
    /// Releases, each handed to one waiter.
    pub handovers: usize,
    /// From sending the release to the next holder's acquire returning.
    pub latency: Percentiles,
    /// KEYNOTIFY registrations the gateway made for the lock (gateway only).
    pub registrations: Option<f64>,
    /// Failed SETs per hand-over (gateway only).
    pub failed_sets_per_handover: Option<f64>,
    /// Server CPU per hand-over (the replacement waiter's join included), us.
    pub cpu_us_per_handover: f64,
    /// Server RSS before the waiters, KiB.
    pub rss_before_kib: u64,
    /// Server RSS with the waiters queued, KiB.
    pub rss_during_kib: u64,
}

/// Where the lock lives.
#[derive(Debug, Clone, Copy)]
enum Service {
    Gateway(SocketAddr),
    Etcd(SocketAddr),
}

impl Service {
    fn addr(self) -> SocketAddr {
        match self {
            Service::Gateway(addr) | Service::Etcd(addr) => addr,
        }
    }

    /// Blocks until `holder` holds `name`; returns the request that
    /// releases it (method, path, body).
    async fn acquire(
        self,
        conn: &mut HttpConn,
        name: &str,
        holder: &str,
    ) -> Result<(String, String, Vec<u8>)> {
        match self {
            Service::Gateway(_) => {
                let path = format!("/locks/{name}?holder={holder}&ttl=300s&wait=300s");
                let response = conn
                    .request_within("PUT", &path, b"", ACQUIRE_TIMEOUT)
                    .await?;
                if response.status != 200 {
                    bail!("PUT {path}: {}", response.status);
                }
                Ok((
                    "DELETE".into(),
                    format!("/locks/{name}?holder={holder}"),
                    Vec::new(),
                ))
            }
            Service::Etcd(_) => {
                let lease = post_json(conn, "/v3/lease/grant", r#"{"TTL": 300}"#).await?;
                let id = lease["ID"].as_str().context("no lease ID")?.to_owned();
                let body = format!(r#"{{"name": "{}", "lease": "{id}"}}"#, BASE64.encode(name));
                let response = conn
                    .request_within("POST", "/v3/lock/lock", body.as_bytes(), ACQUIRE_TIMEOUT)
                    .await?;
                if response.status != 200 {
                    bail!("etcd lock: {}", response.status);
                }
                let locked: serde_json::Value = serde_json::from_slice(&response.body)?;
                let key = locked["key"].as_str().context("no lock key")?;
                Ok((
                    "POST".into(),
                    "/v3/lock/unlock".into(),
                    format!(r#"{{"key": "{key}"}}"#).into_bytes(),
                ))
            }
        }
    }
}

async fn post_json(conn: &mut HttpConn, path: &str, body: &str) -> Result<serde_json::Value> {
    let response = conn.request("POST", path, body.as_bytes()).await?;
    if response.status != 200 {
        bail!("POST {path}: {}", response.status);
    }
    Ok(serde_json::from_slice(&response.body)?)
}

/// Hand-over through the gateway's `/locks`.
pub async fn gateway_handover(
    gateway: &GatewayProc,
    waiters: usize,
    rounds: usize,
) -> Result<HandoverReport> {
    let keynotify =
        "statestore_gateway_store_request_duration_seconds_count{op=\"KEYNOTIFY\",outcome=\"ok\"}";
    let before = gateway.metric(keynotify).await.unwrap_or(0.0);
    let mut report = handover(
        Service::Gateway(gateway.api),
        &gateway.proc,
        waiters,
        rounds,
        Some(gateway),
    )
    .await?;
    report.registrations = Some(gateway.metric(keynotify).await.unwrap_or(0.0) - before);
    Ok(report)
}

/// Hand-over through etcd's lock service.
pub async fn etcd_handover(etcd: &Etcd, waiters: usize, rounds: usize) -> Result<HandoverReport> {
    handover(
        Service::Etcd(etcd.client),
        &etcd.proc,
        waiters,
        rounds,
        None,
    )
    .await
}

async fn handover(
    service: Service,
    server: &Proc,
    waiters: usize,
    rounds: usize,
    gateway: Option<&GatewayProc>,
) -> Result<HandoverReport> {
    let name = format!("bench-lock-{waiters}");
    let mut control = HttpConn::connect(service.addr()).await?;
    let mut release = service.acquire(&mut control, &name, "holder-0").await?;
    let rss_before_kib = server.rss_kib()?;
    let (acquired_tx, mut acquired) = mpsc::unbounded_channel();
    let permits = std::sync::Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let mut tasks = JoinSet::new();
    let mut spawn = |index: usize| {
        let acquired = acquired_tx.clone();
        let name = name.clone();
        let permits = std::sync::Arc::clone(&permits);
        tasks.spawn(async move {
            let result = async {
                let permit = permits.acquire_owned().await?;
                let mut conn = HttpConn::connect(service.addr()).await?;
                drop(permit);
                service
                    .acquire(&mut conn, &name, &format!("w{index}"))
                    .await
            }
            .await;
            let _ = acquired.send((result, Instant::now()));
        });
    };
    for index in 0..waiters {
        spawn(index);
    }
    if let Some(gateway) = gateway {
        let deadline = Instant::now() + Duration::from_secs(60);
        while gateway.metric("statestore_gateway_lock_waiters").await? < waiters as f64 {
            if Instant::now() > deadline {
                bail!("{waiters} waiters did not all queue within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        // etcd says nothing of its waiters: give them time to queue.
        tokio::time::sleep(Duration::from_millis(200 + waiters as u64 * 2)).await;
    }
    let rss_during_kib = server.rss_kib()?;
    let contention = "statestore_gateway_lock_contention_total";
    let failed_before = match gateway {
        Some(gateway) => Some(gateway.metric(contention).await?),
        None => None,
    };
    let cpu_before = server.cpu_ticks()?;
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let (method, path, body) = &release;
        let sent = Instant::now();
        let response = control.request(method, path, body).await?;
        if !(200..300).contains(&response.status) {
            bail!("release {method} {path}: {}", response.status);
        }
        let (result, at) = tokio::time::timeout(HANDOVER_TIMEOUT, acquired.recv())
            .await
            .with_context(|| format!("round {round}: no waiter got the lock"))?
            .context("waiters gone")?;
        samples.push(at.duration_since(sent));
        release = result.with_context(|| format!("round {round}: a waiter failed"))?;
        spawn(waiters + round);
        tokio::time::sleep(JOIN_PAUSE).await;
        if let Ok((_, _)) = acquired.try_recv() {
            bail!("round {round}: a release woke a second waiter");
        }
    }
    let cpu = (server.cpu_ticks()? - cpu_before) as f64 / clock_ticks_per_second() as f64;
    let failed_sets_per_handover = match (gateway, failed_before) {
        (Some(gateway), Some(before)) => {
            Some((gateway.metric(contention).await? - before) / rounds as f64)
        }
        _ => None,
    };
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let (method, path, body) = &release;
    control.request(method, path, body).await?;
    Ok(HandoverReport {
        service: if gateway.is_some() { "gateway" } else { "etcd" },
        waiters,
        handovers: rounds,
        latency: Percentiles::of(&mut samples),
        registrations: None,
        failed_sets_per_handover,
        cpu_us_per_handover: cpu * 1e6 / rounds as f64,
        rss_before_kib,
        rss_during_kib,
    })
}

/// An etcd server on free ports.
#[derive(Debug)]
pub struct Etcd {
    /// The process.
    pub proc: Proc,
    /// Its client (HTTP/JSON gateway) address.
    pub client: SocketAddr,
}

/// Starts `etcd` with its data in `dir`.
pub fn start_etcd(program: &Path, dir: &Path) -> Result<Etcd> {
    let client_port = free_port()?;
    let peer_port = free_port()?;
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut proc = Proc::spawn(
        "etcd",
        dir,
        Command::new(program)
            .arg("--data-dir")
            .arg(dir.join("etcd-data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .args(["--log-level", "error"]),
    )?;
    wait_for_port(&mut proc, client_port, Duration::from_secs(15))?;
    Ok(Etcd {
        proc,
        client: SocketAddr::from(([127, 0, 0, 1], client_port)),
    })
}

/// One line of progress output.
pub fn line(report: &HandoverReport) -> String {
    format!(
        "{} lock, {} waiters: hand-over p50 {:.0} us p99 {:.0} us max {:.0} us over {}; \
         {} registrations, {} failed SETs per hand-over, CPU {:.0} us per hand-over, RSS {} -> {} KiB",
        report.service,
        report.waiters,
        report.latency.p50,
        report.latency.p99,
        report.latency.max,
        report.handovers,
        report
            .registrations
            .map_or_else(|| "-".to_owned(), |n| format!("{n:.0}")),
        report
            .failed_sets_per_handover
            .map_or_else(|| "-".to_owned(), |n| format!("{n:.2}")),
        report.cpu_us_per_handover,
        report.rss_before_kib,
        report.rss_during_kib,
    )
}

/// The report's section (empty without runs).
pub fn report(reports: &[HandoverReport]) -> String {
    if reports.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n### Lock hand-over\n\n\
         From sending the holder's release to the next waiter's blocking acquire returning \
         (gateway: `DELETE /locks` then `PUT /locks?wait=`; etcd: `/v3/lock/unlock` then \
         `/v3/lock/lock`). After each hand-over a new waiter joins, so the crowd stays the same; \
         CPU per hand-over includes that join.\n\n\
         | Service | Waiters | Hand-overs | p50 ms | p99 ms | max ms | KEYNOTIFY registrations | failed SETs per hand-over | CPU us per hand-over | RSS before / with waiters (KiB) |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for report in reports {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {:.0} | {} / {} |\n",
            report.service,
            report.waiters,
            report.handovers,
            report.latency.p50 / 1e3,
            report.latency.p99 / 1e3,
            report.latency.max / 1e3,
            report
                .registrations
                .map_or_else(|| "-".to_owned(), |n| format!("{n:.0}")),
            report
                .failed_sets_per_handover
                .map_or_else(|| "-".to_owned(), |n| format!("{n:.2}")),
            report.cpu_us_per_handover,
            report.rss_before_kib,
            report.rss_during_kib,
        ));
    }
    out
}
