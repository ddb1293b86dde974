//! Watch fan-out: many SSE watchers of one key, a write, and the time from
//! the write's request until each watcher has read the event; the server's
//! memory before, while and after they watch. The server is the gateway
//! (`GET /watch/<key>`, `PUT /keys/<key>`) or nginx with nchan, the
//! reference SSE pub/sub (`GET /sub/<key>`, `POST /pub/<key>`), with the
//! same client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;

use super::gateway::GatewayProc;
use super::http::HttpConn;
use super::procs::{Proc, clock_ticks_per_second, own_cpu_ticks};
use super::stats::Percentiles;

/// Watchers connecting at the same time (the gateway's listen backlog is
/// 4,096, nginx's here 1,024; staying well under both avoids SYN retries
/// that would only measure the kernel).
const CONNECT_CONCURRENCY: usize = 256;

/// How long one watcher may take to get its first `sync` event.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long every watcher together may take to receive one PUT's event.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(15);

/// The prefix of the values the PUTs write; the round number follows.
const TOKEN: &[u8] = b"tok-r";

/// What a fan-out runs against.
#[derive(Debug, Clone, Copy)]
pub enum Server<'a> {
    Gateway(&'a GatewayProc),
    /// nginx with nchan (`procs::start_nchan`) listening on `addr`.
    Nchan {
        proc: &'a Proc,
        addr: SocketAddr,
    },
}

impl Server<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Server::Gateway(_) => "gateway",
            Server::Nchan { .. } => "nginx + nchan",
        }
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Server::Gateway(gateway) => gateway.api,
            Server::Nchan { addr, .. } => *addr,
        }
    }

    fn proc(&self) -> &Proc {
        match self {
            Server::Gateway(gateway) => &gateway.proc,
            Server::Nchan { proc, .. } => proc,
        }
    }

    fn subscribe_path(&self, key: &str) -> String {
        match self {
            Server::Gateway(_) => format!("/watch/{key}"),
            Server::Nchan { .. } => format!("/sub/{key}"),
        }
    }

    /// What a subscriber reads once it is subscribed: the gateway's first
    /// `sync`, nchan's `: hi` comment.
    fn subscribed(&self) -> &'static [u8] {
        match self {
            Server::Gateway(_) => b"event: sync",
            Server::Nchan { .. } => b": hi",
        }
    }

    /// Subscribers the server counts now.
    async fn subscribers(&self, key: &str) -> Result<usize> {
        match self {
            Server::Gateway(gateway) => {
                Ok(gateway.metric("statestore_gateway_watchers").await? as usize)
            }
            Server::Nchan { addr, .. } => {
                let mut conn = HttpConn::connect(*addr).await?;
                let info = conn
                    .request_with_headers(
                        "GET",
                        &format!("/pub/{key}"),
                        &[("Accept", "text/json")],
                        b"",
                    )
                    .await?;
                match info.status {
                    // No channel: nobody subscribes.
                    404 => Ok(0),
                    200 => {
                        let info: serde_json::Value =
                            serde_json::from_slice(&info.body).context("nchan's channel info")?;
                        info["subscribers"]
                            .as_u64()
                            .map(|n| n as usize)
                            .context("no subscribers in nchan's channel info")
                    }
                    status => bail!("nchan's channel info answered {status}"),
                }
            }
        }
    }

    /// Writes `value` to `key`.
    async fn publish(&self, conn: &mut HttpConn, key: &str, value: &[u8]) -> Result<()> {
        let (method, path, ok): (_, _, &[u16]) = match self {
            Server::Gateway(_) => ("PUT", format!("/keys/{key}"), &[200]),
            Server::Nchan { .. } => ("POST", format!("/pub/{key}"), &[201, 202]),
        };
        let response = conn.request(method, &path, value).await?;
        if !ok.contains(&response.status) {
            bail!(
                "{method} {path} on {} answered {}",
                self.name(),
                response.status
            );
        }
        Ok(())
    }
}

/// What a fan-out run measured.
#[derive(Debug, Clone)]
pub struct FanoutReport {
    /// `Server::name`.
    pub server: &'static str,
    /// Watchers connected.
    pub watchers: usize,
    /// Time to connect all of them and get their first `sync`.
    pub connect_time: Duration,
    /// Events received (watchers x rounds when none is missing).
    pub deliveries: usize,
    /// Events that never arrived within the delivery timeout.
    pub missing: usize,
    /// From the write's request to the event at each watcher.
    pub latency: Percentiles,
    /// The server's CPU time per delivered event over the write rounds, us.
    pub gateway_cpu_us_per_event: f64,
    /// This program's CPU time (reading every stream) per event, us.
    pub client_cpu_us_per_event: f64,
    /// The server's processes' proportional set size, summed, at its
    /// highest while they watch, KiB: the figure servers of one process
    /// (the gateway) and of several (nginx) compare by.
    pub pss_during_kib: u64,
    /// The server's RSS before the watchers connect, KiB (summed over its
    /// processes, so nginx's shared pages count once per process).
    pub rss_before_kib: u64,
    /// Highest gateway RSS while they watch, KiB.
    pub rss_during_kib: u64,
    /// Gateway RSS after all have left (watcher gauge back at 0, then 1 s), KiB.
    pub rss_after_kib: u64,
    /// Gateway RSS `settle` after all have left, KiB: what the allocator
    /// has given back to the system by then.
    pub rss_settled_kib: u64,
}

/// Connects `watchers` SSE streams to `key`, makes `rounds` writes (one
/// at a time, each once every watcher got the previous one) and
/// disconnects them all.
pub async fn fanout(
    server: Server<'_>,
    watchers: usize,
    rounds: usize,
    settle: Duration,
) -> Result<FanoutReport> {
    let key = format!("fanout-{watchers}");
    let path = server.subscribe_path(&key);
    let proc = server.proc();
    let rss_before_kib = proc.tree_rss_kib()?;

    let (events_tx, mut events) = mpsc::unbounded_channel::<(u32, Instant)>();
    let (ready_tx, mut ready) = mpsc::unbounded_channel::<Result<()>>();
    let (stop_tx, stop) = watch::channel(false);
    let permits = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..watchers {
        tasks.spawn(watcher(
            server.addr(),
            path.clone(),
            server.subscribed(),
            events_tx.clone(),
            ready_tx.clone(),
            stop.clone(),
            permits.clone(),
        ));
    }
    drop((events_tx, ready_tx));
    for opened in 0..watchers {
        match tokio::time::timeout(OPEN_TIMEOUT * 2, ready.recv()).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(error))) => {
                return Err(error.context(format!("watcher {opened} of {watchers}")));
            }
            Ok(None) | Err(_) => bail!("only {opened} of {watchers} watchers opened"),
        }
    }
    let connect_time = started.elapsed();
    // Every subscriber is counted before the first write, so a missing
    // event is the server's and not a late subscription's (nchan's workers
    // tell each other of theirs a little later).
    let deadline = Instant::now() + OPEN_TIMEOUT;
    loop {
        let counted = server.subscribers(&key).await?;
        if counted == watchers {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{} counts {counted} subscribers of {watchers} connected",
                server.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut rss_during_kib = proc.tree_rss_kib()?;
    let mut pss_during_kib = proc.tree_pss_kib()?;

    let mut writer = HttpConn::connect(server.addr()).await?;
    let gateway_cpu_before = proc.cpu_ticks()?;
    let client_cpu_before = own_cpu_ticks()?;
    let mut samples = Vec::with_capacity(watchers * rounds);
    let mut missing = 0;
    for round in 1..=rounds as u32 {
        let mut value = TOKEN.to_vec();
        value.extend_from_slice(format!("{round}-").as_bytes());
        let sent = Instant::now();
        server.publish(&mut writer, &key, &value).await?;
        let mut received = 0;
        let deadline = tokio::time::Instant::now() + DELIVERY_TIMEOUT;
        while received < watchers {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some((seen_round, at))) if seen_round == round => {
                    received += 1;
                    samples.push(at.saturating_duration_since(sent));
                }
                Ok(Some(_)) => {}
                Ok(None) => bail!("every watcher has gone"),
                Err(_) => break,
            }
        }
        missing += watchers - received;
        rss_during_kib = rss_during_kib.max(proc.tree_rss_kib()?);
        pss_during_kib = pss_during_kib.max(proc.tree_pss_kib()?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let ticks = clock_ticks_per_second() as f64;
    let per_event = |cpu_ticks: u64| cpu_ticks as f64 / ticks * 1e6 / samples.len().max(1) as f64;
    // nginx's master only starts its workers: their CPU is all of it.
    let gateway_cpu_us_per_event = per_event(proc.tree_cpu_ticks()? - gateway_cpu_before);
    let client_cpu_us_per_event = per_event(own_cpu_ticks()? - client_cpu_before);

    stop_tx.send_replace(true);
    while tasks.join_next().await.is_some() {}
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.subscribers(&key).await? > 0 {
        if Instant::now() > deadline {
            bail!(
                "{} still counts subscribers 30 s after all left",
                server.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after_kib = proc.tree_rss_kib()?;
    tokio::time::sleep_until((left + settle).into()).await;
    let rss_settled_kib = proc.tree_rss_kib()?;
    let deliveries = samples.len();
    Ok(FanoutReport {
        server: server.name(),
        watchers,
        connect_time,
        deliveries,
        missing,
        latency: Percentiles::of(&mut samples),
        gateway_cpu_us_per_event,
        client_cpu_us_per_event,
        pss_during_kib,
        rss_before_kib,
        rss_during_kib,
        rss_after_kib,
        rss_settled_kib,
    })
}

/// One SSE watcher: opens the stream, reports once it is subscribed, then
/// reports every new round's value with the time it was read.
async fn watcher(
    addr: SocketAddr,
    path: String,
    subscribed: &'static [u8],
    events: mpsc::UnboundedSender<(u32, Instant)>,
    ready: mpsc::UnboundedSender<Result<()>>,
    mut stop: watch::Receiver<bool>,
    permits: Arc<Semaphore>,
) {
    let opened = {
        let Ok(_permit) = permits.acquire().await else {
            return;
        };
        tokio::time::timeout(OPEN_TIMEOUT, open(addr, &path, subscribed))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("not subscribed within {OPEN_TIMEOUT:?}")))
    };
    let (mut stream, mut window) = match opened {
        Ok(opened) => opened,
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    let mut last_round = 0;
    let mut buffer = vec![0u8; 2048];
    // One future for the watcher's life: a new one per read would register
    // with the channel all 10,000 watchers share, on every event.
    let stopped = stop.changed();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            read = stream.read(&mut buffer) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let now = Instant::now();
                window.extend_from_slice(&buffer[..n]);
                for round in rounds_in(&window) {
                    if round > last_round {
                        last_round = round;
                        let _ = events.send((round, now));
                    }
                }
                // Keep enough to find a token split across two reads.
                let keep = TOKEN.len() + 12;
                if window.len() > keep {
                    window.drain(..window.len() - keep);
                }
            }
        }
    }
}

/// Connects, sends the request and reads until the `subscribed` frame;
/// returns the stream and what was read after it.
async fn open(addr: SocketAddr, path: &str, subscribed: &[u8]) -> Result<(TcpStream, Vec<u8>)> {
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting a watcher to {addr}"))?;
    stream.set_nodelay(true)?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut seen = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    loop {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            bail!(
                "the watch stream closed before its first event: {}",
                String::from_utf8_lossy(&seen)
            );
        }
        seen.extend_from_slice(&buffer[..n]);
        if !seen.starts_with(b"HTTP/1.1 200") && seen.len() >= 12 {
            bail!(
                "the watch request failed: {}",
                String::from_utf8_lossy(&seen)
            );
        }
        if let Some(at) = find(&seen, subscribed) {
            // The frame's own data is before the next blank line.
            if let Some(end) = find(&seen[at..], b"\n\n") {
                return Ok((stream, seen[at + end..].to_vec()));
            }
        }
    }
}

/// Round numbers of the tokens in `bytes` (`tok-r<round>-`).
fn rounds_in(bytes: &[u8]) -> Vec<u32> {
    let mut rounds = Vec::new();
    let mut rest = bytes;
    while let Some(at) = find(rest, TOKEN) {
        let after = &rest[at + TOKEN.len()..];
        let digits = after.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0
            && after.get(digits) == Some(&b'-')
            && let Some(round) = std::str::from_utf8(&after[..digits])
                .ok()
                .and_then(|text| text.parse().ok())
        {
            rounds.push(round);
        }
        rest = after;
    }
    rounds
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
