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
use super::proc_fs::own_cpu_ns;
use super::procs::Proc;
use super::stats::Percentiles;

/// Watchers connecting at the same time (the gateway's listen backlog is
/// 4,096, nginx's here 1,024; staying well under both avoids SYN retries
/// that would only measure the kernel).
const CONNECT_CONCURRENCY: usize = 256;

/// Files this program keeps for other things than watchers' sockets.
const SPARE_FILES: usize = 1_024;

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
    /// Each round's p99, in order, us.
    pub round_p99s: Vec<f64>,
    /// Whether its watchers were connected beside another server's, with
    /// their rounds alternating (round i of each, one after the other).
    pub beside: bool,
    /// The server's CPU time per delivered event over the write rounds, us.
    pub server_cpu_us_per_event: f64,
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

/// One server's watchers, connected: writes are made one round at a time,
/// so that the rounds of two servers' fan-outs can alternate under the
/// same conditions, then [`Fanout::close`] disconnects them and reports.
pub struct Fanout<'a> {
    server: Server<'a>,
    watchers: usize,
    key: String,
    events: mpsc::UnboundedReceiver<(u32, Instant)>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    writer: HttpConn,
    connect_time: Duration,
    rounds: u32,
    samples: Vec<Duration>,
    round_p99s: Vec<f64>,
    missing: usize,
    server_cpu_ns: u64,
    client_cpu_ns: u64,
    rss_before_kib: u64,
    rss_during_kib: u64,
    pss_during_kib: u64,
}

impl<'a> Fanout<'a> {
    /// Connects `watchers` SSE streams to a key of their own and waits
    /// until the server counts every one.
    pub async fn open(server: Server<'a>, watchers: usize) -> Result<Fanout<'a>> {
        let key = format!("fanout-{watchers}");
        let path = server.subscribe_path(&key);
        let rss_before_kib = server.proc().tree_rss_kib()?;

        let (events_tx, events) = mpsc::unbounded_channel::<(u32, Instant)>();
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
        // event is the server's and not a late subscription's (nchan's
        // workers tell each other of theirs a little later).
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
        Ok(Fanout {
            server,
            watchers,
            writer: HttpConn::connect(server.addr()).await?,
            key,
            events,
            stop: stop_tx,
            tasks,
            connect_time,
            rounds: 0,
            samples: Vec::new(),
            round_p99s: Vec::new(),
            missing: 0,
            server_cpu_ns: 0,
            client_cpu_ns: 0,
            rss_before_kib,
            rss_during_kib: server.proc().tree_rss_kib()?,
            pss_during_kib: server.proc().tree_pss_kib()?,
        })
    }

    /// One write, then the time until each watcher has read its event
    /// (every one, or the delivery timeout), then a pause of 100 ms before
    /// the next round on any server; returns this round's p99, us.
    pub async fn round(&mut self) -> Result<f64> {
        self.rounds += 1;
        let round = self.rounds;
        let proc = self.server.proc();
        let server_cpu_before = proc.tree_cpu_ns()?;
        let client_cpu_before = own_cpu_ns()?;
        let mut value = TOKEN.to_vec();
        value.extend_from_slice(format!("{round}-").as_bytes());
        let sent = Instant::now();
        self.server
            .publish(&mut self.writer, &self.key, &value)
            .await?;
        let mut latencies = Vec::with_capacity(self.watchers);
        let deadline = tokio::time::Instant::now() + DELIVERY_TIMEOUT;
        while latencies.len() < self.watchers {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some((seen_round, at))) if seen_round == round => {
                    latencies.push(at.saturating_duration_since(sent));
                }
                Ok(Some(_)) => {}
                Ok(None) => bail!("every watcher has gone"),
                Err(_) => break,
            }
        }
        self.server_cpu_ns += proc.tree_cpu_ns()?.saturating_sub(server_cpu_before);
        self.client_cpu_ns += own_cpu_ns()?.saturating_sub(client_cpu_before);
        self.missing += self.watchers - latencies.len();
        self.samples.extend_from_slice(&latencies);
        let p99 = Percentiles::of(&mut latencies).p99;
        self.round_p99s.push(p99);
        self.rss_during_kib = self.rss_during_kib.max(proc.tree_rss_kib()?);
        self.pss_during_kib = self.pss_during_kib.max(proc.tree_pss_kib()?);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(p99)
    }

    /// Disconnects every watcher, waits until the server counts none, and
    /// reads its RSS 1 s and `settle` after.
    /// `beside`: its rounds alternated with another server's.
    pub async fn close(mut self, settle: Duration, beside: bool) -> Result<FanoutReport> {
        let per_event = |ns: u64| ns as f64 / 1e3 / self.samples.len().max(1) as f64;
        let server_cpu_us_per_event = per_event(self.server_cpu_ns);
        let client_cpu_us_per_event = per_event(self.client_cpu_ns);
        let (server, proc) = (self.server, self.server.proc());

        self.stop.send_replace(true);
        while self.tasks.join_next().await.is_some() {}
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.subscribers(&self.key).await? > 0 {
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
        Ok(FanoutReport {
            server: server.name(),
            watchers: self.watchers,
            connect_time: self.connect_time,
            deliveries: self.samples.len(),
            missing: self.missing,
            latency: Percentiles::of(&mut self.samples),
            round_p99s: self.round_p99s,
            beside,
            server_cpu_us_per_event,
            client_cpu_us_per_event,
            pss_during_kib: self.pss_during_kib,
            rss_before_kib: self.rss_before_kib,
            rss_during_kib: self.rss_during_kib,
            rss_after_kib,
            rss_settled_kib,
        })
    }
}

/// `watchers` SSE streams on each of `servers` and `rounds` writes to each.
/// When this program may open enough files, every server's watchers are
/// connected together and the rounds alternate, the servers in an order
/// that rotates, so that one server's rounds do not all fall in a quieter
/// or busier stretch than another's; otherwise one server's fan-out
/// follows the other's.
pub async fn fan_out(
    servers: &[Server<'_>],
    watchers: usize,
    rounds: usize,
    settle: Duration,
) -> Result<Vec<FanoutReport>> {
    let files = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(0, |(soft, _)| soft);
    let beside = servers.len() > 1 && files >= (servers.len() * watchers + SPARE_FILES) as u64;
    let mut reports = Vec::with_capacity(servers.len());
    if !beside {
        for server in servers {
            let mut fanout = Fanout::open(*server, watchers).await?;
            for _ in 0..rounds {
                fanout.round().await?;
            }
            reports.push(fanout.close(settle, false).await?);
        }
        return Ok(reports);
    }
    let mut open = Vec::with_capacity(servers.len());
    for server in servers {
        open.push(Fanout::open(*server, watchers).await?);
    }
    for round in 0..rounds {
        for turn in 0..open.len() {
            let at = (round + turn) % open.len();
            open[at].round().await?;
        }
    }
    for fanout in open {
        reports.push(fanout.close(settle, true).await?);
    }
    Ok(reports)
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
