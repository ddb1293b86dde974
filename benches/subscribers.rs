//! What one SSE subscriber of one key costs the gateway's heap: bytes and
//! allocations, counted.
//!
//! The gateway runs in a child process of this program (the same binary,
//! `--gateway-child`), in process on a runtime of one thread as `serve` runs
//! by default, under a counting global allocator; the subscribers (plain
//! TCP clients sending `GET /watch/<key>`), mosquitto and the emulator are
//! other processes, so every byte counted is the gateway's. Counts do not
//! move with the machine's load, as RSS and timings do:
//!
//! - heap bytes and allocations per subscriber once every subscriber got
//!   its first `sync`, and again once every one also got a PUT's `set`,
//!   against the counts with one subscriber open (which holds the key's
//!   shared state), after a warm-up;
//! - what the heap holds once they have all gone (nothing more, or a leak).
//!
//! `scripts/bench --subscribers` runs it on the release build (`--subscribers
//! N`, default 2,000); `scripts/bench --smoke` runs 100 on the debug build.
//! Bytes are the sizes asked of the allocator (jemalloc, the binary's,
//! rounds them up to its size classes). RSS per subscriber is the gateway
//! benchmark's (`--only watch`), on the binary as shipped.

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

/// The key every subscriber watches.
const KEY: &str = "fanout";

/// How long one subscriber may take to get an event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the gateway is left to finish what it was doing before a count.
const SETTLE: Duration = Duration::from_millis(500);

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
    let (api, admin) = (gateway.api, gateway.admin);
    wait_ready(admin).await?;
    emulator.check_alive()?;

    let mut writer = HttpConn::connect(api).await?;
    let put = async |writer: &mut HttpConn, round: u32| -> Result<()> {
        let response = writer
            .request(
                "PUT",
                &format!("/keys/{KEY}"),
                format!("r{round}").as_bytes(),
            )
            .await?;
        if response.status != 200 {
            bail!("PUT answered {}", response.status);
        }
        Ok(())
    };
    put(&mut writer, 0).await?;

    // Warm-up: subscribers come, get an event and go, so that the
    // gateway's own buffers (the pool's, the key's channel, the allocator's
    // arenas) reach their working size. The first stays: it holds the
    // key's shared state.
    let mut first = vec![Subscriber::open(api).await?];
    let mut warm = Vec::new();
    for _ in 0..options.subscribers {
        warm.push(Subscriber::open(api).await?);
    }
    put(&mut writer, 1).await?;
    for subscriber in first.iter_mut().chain(&mut warm) {
        subscriber.read_until(b"\"r1\"").await?;
    }
    drop(warm);
    wait_watchers(admin, 1).await?;
    tokio::time::sleep(SETTLE).await;
    let base = gateway.counts()?;

    let started = Instant::now();
    let mut subscribers = Vec::with_capacity(options.subscribers);
    for _ in 0..options.subscribers {
        subscribers.push(Subscriber::open(api).await?);
    }
    let opened = started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let synced = PerSubscriber::between(base, gateway.counts()?, options.subscribers);

    put(&mut writer, 2).await?;
    for subscriber in first.iter_mut().chain(&mut subscribers) {
        subscriber.read_until(b"\"r2\"").await?;
    }
    tokio::time::sleep(SETTLE).await;
    let after_event = PerSubscriber::between(base, gateway.counts()?, options.subscribers);

    drop(subscribers);
    wait_watchers(admin, 1).await?;
    tokio::time::sleep(SETTLE).await;
    let left = gateway.counts()?;
    emulator.check_alive()?;

    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut report = String::new();
    writeln!(
        report,
        "\n### One key, {} SSE subscribers ({profile} build): what each holds\n",
        options.subscribers
    )?;
    writeln!(report, "| once | heap bytes | heap allocations |")?;
    writeln!(report, "|---|--:|--:|")?;
    for (when, figures) in [
        ("every subscriber got its `sync`", synced),
        ("every subscriber got a `set` too", after_event),
    ] {
        writeln!(
            report,
            "| {when} | {:.0} | {:.2} |",
            figures.bytes, figures.allocations
        )?;
    }
    writeln!(
        report,
        "\nOpened one after the other in {opened:?}; once they left the heap held {} bytes and {} allocations more than before them.",
        left.bytes - base.bytes,
        left.allocations - base.allocations
    )?;
    print!("{report}");
    if let Some(path) = &options.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    drop(first);
    Ok(())
}

/// One subscriber: a plain TCP connection with its request sent.
struct Subscriber {
    stream: TcpStream,
    seen: Vec<u8>,
}

impl Subscriber {
    /// Connects, asks for the key's stream and reads up to its `sync`.
    async fn open(api: SocketAddr) -> Result<Self> {
        let mut stream = TcpStream::connect(api).await?;
        stream.set_nodelay(true)?;
        let request = format!(
            "GET /watch/{KEY} HTTP/1.1\r\nHost: {api}\r\nAccept: text/event-stream\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut subscriber = Self {
            stream,
            seen: Vec::new(),
        };
        subscriber.read_until(b"event: sync").await?;
        if !subscriber.seen.starts_with(b"HTTP/1.1 200") {
            bail!(
                "the watch was answered {}",
                String::from_utf8_lossy(&subscriber.seen)
            );
        }
        Ok(subscriber)
    }

    /// Reads until `needle` has arrived (then forgets what was read).
    async fn read_until(&mut self, needle: &[u8]) -> Result<()> {
        let mut buffer = [0u8; 1024];
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        while !self.seen.windows(needle.len()).any(|w| w == needle) {
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buffer))
                .await
                .context("no event in time")??;
            if n == 0 {
                bail!("the stream closed: {}", String::from_utf8_lossy(&self.seen));
            }
            self.seen.extend_from_slice(&buffer[..n]);
        }
        if needle != b"event: sync" {
            self.seen.clear();
        }
        Ok(())
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
