//! What one SSE subscriber costs the gateway's heap: bytes and
//! allocations, counted, for a key's stream (`GET /watch/<key>`) and for a
//! topic's (`GET /subscribe?topic=<topic>`), one kind after the other in
//! one gateway.
//!
//! The gateway runs in a child process of this program (the same binary,
//! `--gateway-child`), in process on a runtime of one thread as `serve` runs
//! by default, under a counting global allocator; the subscribers (plain
//! TCP clients), mosquitto and the emulator are other processes, so every
//! byte counted is the gateway's. Counts do not move with the machine's
//! load, as RSS and timings do:
//!
//! - heap bytes and allocations per subscriber once every subscriber got
//!   its first event (`sync`, `subscribed`), and again once every one also
//!   got one more (a PUT's `set`, a Dapr publish's `message`), against the
//!   counts with one subscriber open (which holds the key's or the topic's
//!   shared state), after a warm-up;
//! - what the heap holds once they have all gone (nothing more, or a leak).
//!
//! `scripts/bench --subscribers` runs it on the release build (`--subscribers
//! N` of each kind, default 2,000); `scripts/bench --smoke` runs 100 on the
//! debug build. Bytes are the sizes asked of the allocator (jemalloc, the
//! binary's, rounds them up to its size classes). RSS per subscriber is the
//! gateway benchmark's (`--only watch`), on the binary as shipped.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::fmt::Write as _;
use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use statestore_gateway::http::{ServeSettings, Server};
use statestore_gateway::metrics::Metrics;
use statestore_gateway::mqtt::{BrokerSettings, PoolSettings};
use stats_alloc::StatsAlloc;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use support::http::HttpConn;
use support::procs;

/// The system's allocator, counted (a const wrapper of jemalloc needs a
/// nightly feature of stats_alloc).
#[global_allocator]
static ALLOCATOR: StatsAlloc<std::alloc::System> = StatsAlloc::system();

/// The flag that makes this program the gateway's process.
const CHILD_FLAG: &str = "--gateway-child";

struct Options {
    subscribers: usize,
    report: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|arg| arg == CHILD_FLAG) {
        return match args.get(at + 1).and_then(|port| port.parse().ok()) {
            Some(port) => gateway_child(port),
            None => ExitCode::from(2),
        };
    }
    support::main_with(
        "subscribers",
        || {
            let Some((smoke, args)) = support::requested_args() else {
                return Ok(None);
            };
            let mut subscribers = if smoke { 100 } else { 2_000 };
            let mut report = None;
            support::read_number_flags(
                args,
                &mut [("--subscribers", &mut subscribers)],
                &mut report,
            )?;
            if subscribers == 0 {
                bail!("--subscribers must be at least 1");
            }
            Ok(Some(Options {
                subscribers,
                report,
            }))
        },
        run,
    )
}

/// The child: the gateway on a one-thread runtime against the broker on
/// `broker_port`; prints `<api> <admin>` once it serves, then, for each line
/// read from stdin, the live heap bytes and allocations.
fn gateway_child(broker_port: u16) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("gateway child: no runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let settings = ServeSettings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        pool: PoolSettings::new(
            BrokerSettings::new("127.0.0.1", broker_port),
            "bench-subscribers".to_owned(),
        ),
        ..ServeSettings::default()
    };
    let server = match runtime.block_on(Server::start(settings, Metrics::new())) {
        Ok(server) => server,
        Err(error) => {
            eprintln!("gateway child: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("{} {}", server.api_addr(), server.admin_addr());
    // The runtime serves while this thread waits for questions.
    let _serving = runtime.enter();
    let serve = std::thread::spawn(move || runtime.block_on(std::future::pending::<()>()));
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
        let stats = ALLOCATOR.stats();
        // A realloc's growth or shrinking is in these two already.
        let bytes = stats.bytes_allocated as i64 - stats.bytes_deallocated as i64;
        let allocations = stats.allocations as i64 - stats.deallocations as i64;
        println!("{bytes} {allocations}");
        let _ = std::io::stdout().flush();
    }
    drop(server);
    drop(serve);
    ExitCode::SUCCESS
}

/// The gateway child as the parent sees it.
struct GatewayChild {
    child: Child,
    stdin: ChildStdin,
    stdout: std::io::BufReader<ChildStdout>,
    api: SocketAddr,
    admin: SocketAddr,
}

/// The child's counts at one moment.
#[derive(Debug, Clone, Copy)]
struct Counts {
    bytes: i64,
    allocations: i64,
}

impl GatewayChild {
    fn start(broker_port: u16, dir: &std::path::Path) -> Result<Self> {
        let log = std::fs::File::create(dir.join("gateway.log"))?;
        let mut child = Command::new(std::env::current_exe()?)
            .arg(CHILD_FLAG)
            .arg(broker_port.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting the gateway child")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().context("no stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let mut addrs = line.split_whitespace().map(str::parse::<SocketAddr>);
        let (Some(Ok(api)), Some(Ok(admin))) = (addrs.next(), addrs.next()) else {
            bail!("the gateway child did not start: {line:?}");
        };
        Ok(Self {
            child,
            stdin,
            stdout,
            api,
            admin,
        })
    }

    fn counts(&mut self) -> Result<Counts> {
        writeln!(self.stdin)?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        let numbers: Vec<i64> = line
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let [bytes, allocations] = numbers[..] else {
            bail!("the gateway child answered {line:?}");
        };
        Ok(Counts { bytes, allocations })
    }
}

impl Drop for GatewayChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What each of `subscribers` more subscribers holds, over `base`.
#[derive(Debug, Clone, Copy)]
struct PerSubscriber {
    bytes: f64,
    allocations: f64,
}

impl PerSubscriber {
    fn between(base: Counts, now: Counts, subscribers: usize) -> Self {
        let n = subscribers as f64;
        Self {
            bytes: (now.bytes - base.bytes) as f64 / n,
            allocations: (now.allocations - base.allocations) as f64 / n,
        }
    }
}

/// The key every `/watch` subscriber watches.
const KEY: &str = "fanout";

/// The topic every `/subscribe` subscriber follows.
const TOPIC: &str = "fanout";

/// How long one subscriber may take to get an event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the gateway is left to finish what it was doing before a count.
const SETTLE: Duration = Duration::from_millis(500);

/// The streams measured, one kind after the other in one gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// `GET /watch/<key>`: a key's values; a PUT makes an event.
    Watch,
    /// `GET /subscribe?topic=<topic>`: a topic's messages; a Dapr publish
    /// makes an event.
    Topic,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Watch => "`GET /watch/fanout` (one key)",
            Stream::Topic => "`GET /subscribe?topic=fanout` (one topic)",
        }
    }

    fn path(self) -> String {
        match self {
            Stream::Watch => format!("/watch/{KEY}"),
            Stream::Topic => format!("/subscribe?topic={TOPIC}"),
        }
    }

    /// The event a stream starts with.
    fn first_event(self) -> &'static [u8] {
        match self {
            Stream::Watch => b"event: sync",
            Stream::Topic => b"event: subscribed",
        }
    }

    /// Makes the event `"r<round>"` on every stream of this kind: a PUT of
    /// the key, or a raw Dapr publish on the topic (its `payload` is the
    /// text as sent).
    async fn trigger(self, writer: &mut HttpConn, round: u32) -> Result<()> {
        let (method, path) = match self {
            Stream::Watch => ("PUT", format!("/keys/{KEY}")),
            Stream::Topic => (
                "POST",
                format!("/v1.0/publish/pubsub/{TOPIC}?metadata.rawPayload=true"),
            ),
        };
        let response = writer
            .request(method, &path, format!("r{round}").as_bytes())
            .await?;
        if !matches!(response.status, 200 | 204) {
            bail!("{method} {path} answered {}", response.status);
        }
        Ok(())
    }

    /// Waits until the gateway holds only the first stream (and nothing of
    /// the others): the watchers gauge for watches; for topic streams,
    /// which have none, until the heap stops shrinking.
    async fn wait_only_first(self, gateway: &mut GatewayChild) -> Result<()> {
        match self {
            Stream::Watch => wait_watchers(gateway.admin, 1).await,
            Stream::Topic => {
                let deadline = Instant::now() + EVENT_TIMEOUT;
                let mut last = gateway.counts()?;
                loop {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    let now = gateway.counts()?;
                    if now.allocations == last.allocations && now.bytes == last.bytes {
                        return Ok(());
                    }
                    if Instant::now() > deadline {
                        bail!(
                            "the gateway's heap still moves {EVENT_TIMEOUT:?} after the streams left"
                        );
                    }
                    last = now;
                }
            }
        }
    }
}

/// One kind of stream's figures.
struct Measured {
    stream: Stream,
    synced: PerSubscriber,
    after_event: PerSubscriber,
    opened: Duration,
    /// Held once they left, over the base: bytes and allocations.
    left: (i64, i64),
}

async fn run(options: Options) -> Result<()> {
    let mosquitto = procs::find_program(&["mosquitto"]).context("mosquitto is not installed")?;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway"));
    let dir = tempfile::Builder::new()
        .prefix("statestore-subscribers-")
        .tempdir()
        .context("creating a temporary directory")?;
    let (_broker, broker_port) = procs::start_mosquitto(&mosquitto, dir.path())?;
    let mut emulator = procs::start_emulator(&binary, dir.path(), broker_port).await?;
    let mut gateway = GatewayChild::start(broker_port, dir.path())?;
    wait_ready(gateway.admin).await?;
    emulator.check_alive()?;

    let mut measured = Vec::new();
    for stream in [Stream::Watch, Stream::Topic] {
        measured.push(measure(stream, &mut gateway, options.subscribers).await?);
        emulator.check_alive()?;
    }

    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut report = String::new();
    writeln!(
        report,
        "\n### {} SSE subscribers of each kind ({profile} build): what each holds\n",
        options.subscribers
    )?;
    writeln!(report, "| stream | once | heap bytes | heap allocations |")?;
    writeln!(report, "|---|---|--:|--:|")?;
    for figures in &measured {
        for (when, per) in [
            ("every subscriber got its first event", figures.synced),
            ("every subscriber got one more event", figures.after_event),
        ] {
            writeln!(
                report,
                "| {} | {when} | {:.0} | {:.2} |",
                figures.stream.name(),
                per.bytes,
                per.allocations
            )?;
        }
    }
    writeln!(report)?;
    for figures in &measured {
        writeln!(
            report,
            "{}: opened one after the other in {:?}; once they left the heap held {} bytes and {} allocations more than before them.",
            figures.stream.name(),
            figures.opened,
            figures.left.0,
            figures.left.1
        )?;
    }
    if let [watch, topic] = &measured[..] {
        writeln!(
            report,
            "\nTopic / watch heap per subscriber after an event: {:.2}x.",
            topic.after_event.bytes / watch.after_event.bytes
        )?;
    }
    print!("{report}");
    if let Some(path) = &options.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `subscribers` streams of one kind: what each holds after its first
/// event and after one more, and what stays once they leave.
async fn measure(
    stream: Stream,
    gateway: &mut GatewayChild,
    subscribers: usize,
) -> Result<Measured> {
    let api = gateway.api;
    let mut writer = HttpConn::connect(api).await?;
    stream.trigger(&mut writer, 0).await?;
    // The first stays: it holds the key's or the topic's shared state (a
    // topic's broker subscription is made as its first stream opens:
    // events are published until one arrives).
    let mut first = vec![Subscriber::open(api, stream).await?];
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while stream == Stream::Topic
        && !first[0]
            .read_until_within(b"\"r0\"", Duration::from_millis(200))
            .await?
    {
        if Instant::now() > deadline {
            bail!("the first topic stream got no message in {EVENT_TIMEOUT:?}");
        }
        stream.trigger(&mut writer, 0).await?;
    }

    // Warm-up: subscribers come, get an event and go, so that the
    // gateway's own buffers (the pool's, the key's channel, the allocator's
    // arenas) reach their working size.
    let mut warm = Vec::new();
    for _ in 0..subscribers {
        warm.push(Subscriber::open(api, stream).await?);
    }
    stream.trigger(&mut writer, 1).await?;
    for subscriber in first.iter_mut().chain(&mut warm) {
        subscriber.read_until(b"\"r1\"").await?;
    }
    drop(warm);
    stream.wait_only_first(gateway).await?;
    tokio::time::sleep(SETTLE).await;
    let base = gateway.counts()?;

    let started = Instant::now();
    let mut opened = Vec::with_capacity(subscribers);
    for _ in 0..subscribers {
        opened.push(Subscriber::open(api, stream).await?);
    }
    let opened_in = started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let synced = PerSubscriber::between(base, gateway.counts()?, subscribers);

    stream.trigger(&mut writer, 2).await?;
    for subscriber in first.iter_mut().chain(&mut opened) {
        subscriber.read_until(b"\"r2\"").await?;
    }
    tokio::time::sleep(SETTLE).await;
    let after_event = PerSubscriber::between(base, gateway.counts()?, subscribers);

    drop(opened);
    stream.wait_only_first(gateway).await?;
    tokio::time::sleep(SETTLE).await;
    let left = gateway.counts()?;
    drop(first);
    Ok(Measured {
        stream,
        synced,
        after_event,
        opened: opened_in,
        left: (left.bytes - base.bytes, left.allocations - base.allocations),
    })
}

/// One subscriber: a plain TCP connection with its request sent.
struct Subscriber {
    stream: TcpStream,
    seen: Vec<u8>,
}

impl Subscriber {
    /// Connects, asks for a stream of `kind` and reads up to its first
    /// event.
    async fn open(api: SocketAddr, kind: Stream) -> Result<Self> {
        let mut stream = TcpStream::connect(api).await?;
        stream.set_nodelay(true)?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {api}\r\nAccept: text/event-stream\r\n\r\n",
            kind.path()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut subscriber = Self {
            stream,
            seen: Vec::new(),
        };
        subscriber.read_until(kind.first_event()).await?;
        if !subscriber.seen.starts_with(b"HTTP/1.1 200") {
            bail!(
                "{} was answered {}",
                kind.path(),
                String::from_utf8_lossy(&subscriber.seen)
            );
        }
        subscriber.seen.clear();
        Ok(subscriber)
    }

    /// Reads until `needle` has arrived (then forgets what was read).
    async fn read_until(&mut self, needle: &[u8]) -> Result<()> {
        if !self.read_until_within(needle, EVENT_TIMEOUT).await? {
            bail!("no event in {EVENT_TIMEOUT:?}");
        }
        Ok(())
    }

    /// Reads until `needle` has arrived (then forgets what was read):
    /// false if it did not within `timeout`.
    async fn read_until_within(&mut self, needle: &[u8], timeout: Duration) -> Result<bool> {
        let mut buffer = [0u8; 1024];
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.seen.windows(needle.len()).any(|w| w == needle) {
            let Ok(read) = tokio::time::timeout_at(deadline, self.stream.read(&mut buffer)).await
            else {
                return Ok(false);
            };
            let n = read?;
            if n == 0 {
                bail!("the stream closed: {}", String::from_utf8_lossy(&self.seen));
            }
            self.seen.extend_from_slice(&buffer[..n]);
        }
        if !self.seen.starts_with(b"HTTP/") {
            self.seen.clear();
        }
        Ok(true)
    }
}

async fn wait_ready(admin: SocketAddr) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut conn) = HttpConn::connect(admin).await
            && let Ok(response) = conn.request("GET", "/readyz", b"").await
            && response.status == 200
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the gateway was not ready within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the gateway counts `watchers` watchers.
async fn wait_watchers(admin: SocketAddr, watchers: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut conn = HttpConn::connect(admin).await?;
    loop {
        let metrics = conn.request("GET", "/metrics", b"").await?;
        let text = String::from_utf8_lossy(&metrics.body);
        let now = text
            .lines()
            .find_map(|line| line.strip_prefix("statestore_gateway_watchers "))
            .and_then(|value| value.trim().parse::<f64>().ok());
        if now == Some(watchers as f64) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the gateway counts {now:?} watchers, not {watchers}, 30 s on");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
