//! Following a key space: one `/watch?match=` stream on a pattern of
//! 10,000 keys in a store of 100,000, in one run.
//!
//! Starts mosquitto, the emulator and `statestore-gateway serve` as their
//! own processes and writes the keys with a pool like the gateway's (an
//! MQTT client the gateway does not see). Then measures:
//!
//! - the shared state per followed key: a watch hub in this process, on
//!   this program's pool, counting the heap bytes it holds (a counting
//!   global allocator) with one stream on the pattern read to `listed`,
//!   against one stream on a pattern of no keys;
//! - the initial listing (time to `listed`) and the gateway's memory per
//!   followed key (RSS before the stream and after its `listed`);
//! - a rescan: the gateway's CPU and store requests per rescan, and its
//!   duration (from `/metrics`), over `--rescan-rounds` rescans;
//! - the time from a write to its event: keys created through the gateway
//!   (PUT reply to `sync`), keys created by the other client (SET reply to
//!   `sync`, bounded by the rescan interval), and changes of followed keys
//!   (SET reply to `set`);
//! - `--streams` streams on one pattern: the rescans the gateway makes
//!   meanwhile (one loop per pattern, whatever the streams);
//! - memory against streams: a fresh gateway's RSS with 1, 10, 50, 100 and
//!   500 streams (up to `--curve-streams`) on the followed pattern, each read
//!   up to its `listed`, and the time from a change of a followed key to its
//!   `set` on every stream; beside etcd (when installed) holding the same
//!   keys with as many clients, each reading the prefix then watching it.
//!
//! `scripts/bench --keyspace` runs it on the release build; `scripts/bench
//! --smoke` runs a small version on the debug build that checks every
//! event arrives and asserts no timing.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::alloc::System;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures_util::StreamExt as _;
use statestore_gateway::metrics::Metrics;
use statestore_gateway::mqtt::{Pool, RequestOptions};
use statestore_gateway::protocol::{Reply, Request, SetOptions};
use statestore_gateway::store::StoreClient;
use statestore_gateway::watch::{EventKind, Selection, WatchHub, WatchSettings, Watcher};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use support::direct;
use support::gateway::{GatewayLaunch, GatewayProc};
use support::http::{HttpConn, request_once};
use support::proc_fs::clock_ticks_per_second;
use support::stats::Percentiles;

/// Counts this process's heap, for the in-process hub's memory per key
/// ([`hub_memory`]); the gateway under test is another process.
#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The followed pattern and its keys; the rest of the store is `bulk/...`.
const PATTERN: &str = "space/*";
/// The pattern the many streams share.
const SHARED_PATTERN: &str = "shared/*";
/// Keys matching [`SHARED_PATTERN`].
const SHARED_KEYS: usize = 100;

struct Options {
    store_keys: usize,
    pattern_keys: usize,
    rescan: Duration,
    rescan_rounds: usize,
    writes: usize,
    outside_writes: usize,
    streams: usize,
    /// The most streams of the memory curve (0: no curve).
    curve_streams: usize,
    smoke: bool,
    report: Option<PathBuf>,
}

impl Options {
    fn parse() -> Result<Option<Options>> {
        let Some((smoke, args)) = support::requested_args() else {
            return Ok(None);
        };
        let mut rescan_ms = if smoke { 1_000 } else { 5_000 };
        let mut options = Options {
            store_keys: if smoke { 2_000 } else { 100_000 },
            pattern_keys: if smoke { 200 } else { 10_000 },
            rescan: Duration::ZERO,
            rescan_rounds: if smoke { 2 } else { 6 },
            writes: if smoke { 20 } else { 500 },
            outside_writes: if smoke { 3 } else { 20 },
            streams: if smoke { 50 } else { 1_000 },
            curve_streams: if smoke { 3 } else { 500 },
            smoke,
            report: None,
        };
        support::read_number_flags(
            args,
            &mut [
                ("--store-keys", &mut options.store_keys),
                ("--pattern-keys", &mut options.pattern_keys),
                ("--rescan-ms", &mut rescan_ms),
                ("--rescan-rounds", &mut options.rescan_rounds),
                ("--writes", &mut options.writes),
                ("--outside-writes", &mut options.outside_writes),
                ("--streams", &mut options.streams),
                ("--curve-streams", &mut options.curve_streams),
            ],
            &mut options.report,
        )?;
        options.rescan = Duration::from_millis(rescan_ms as u64);
        if options.pattern_keys == 0
            || options.pattern_keys + SHARED_KEYS > options.store_keys
            || options.rescan_rounds == 0
            || options.writes == 0
            || options.outside_writes == 0
            || options.streams == 0
        {
            bail!("sizes must be positive and the pattern smaller than the store");
        }
        Ok(Some(options))
    }
}

fn main() -> ExitCode {
    support::main_with("keyspace", Options::parse, run)
}

async fn set(pool: &Pool, key: String, value: &'static [u8]) -> Result<()> {
    let request = Request::Set {
        key: Bytes::from(key),
        value: Bytes::from_static(value),
        options: SetOptions::default(),
    };
    let reply = pool
        .request(&request, &RequestOptions::default(), |response| response)
        .await?;
    if reply.reply != Reply::Ok {
        bail!("SET answered {:?}", reply.reply);
    }
    Ok(())
}

async fn run(options: Options) -> Result<()> {
    let mosquitto = support::procs::find_program(&["mosquitto"])
        .context("mosquitto is needed (scripts/bench installs it)")?;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway"));
    let dir = tempfile::Builder::new()
        .prefix("keyspace-bench-")
        .tempdir()
        .context("a temporary directory")?;
    let (_broker, port) = support::procs::start_mosquitto(&mosquitto, dir.path())?;
    let _emulator = support::procs::start_emulator(&binary, dir.path(), port).await?;
    let pool = direct::start_pool(port, 4).await?;

    let bulk = options.store_keys - options.pattern_keys - SHARED_KEYS;
    println!(
        "keyspace benchmark: writing {} keys, {} of them matching {PATTERN}",
        options.store_keys, options.pattern_keys
    );
    let keys = (0..options.pattern_keys)
        .map(|i| format!("space/{i:06}"))
        .chain((0..SHARED_KEYS).map(|i| format!("shared/{i:04}")))
        .chain((0..bulk).map(|i| format!("bulk/{i:06}")));
    let mut writes = futures_util::stream::iter(keys)
        .map(|key| set(&pool, key, b"21.5"))
        .buffer_unordered(256);
    while let Some(written) = writes.next().await {
        written?;
    }
    drop(writes);

    let hub = hub_memory(&pool, options.pattern_keys).await?;
    println!(
        "keyspace benchmark: the watch hub holds {:.0} B in {:.1} allocations per followed key",
        hub.bytes_per_key, hub.allocations_per_key
    );

    let limit = (options.pattern_keys * 2).to_string();
    let env = [
        (
            "STATESTORE_GATEWAY_WATCH_RESCAN_INTERVAL".to_owned(),
            format!("{}ms", options.rescan.as_millis()),
        ),
        (
            "STATESTORE_GATEWAY_MAX_KEYS_PER_PATTERN".to_owned(),
            limit.clone(),
        ),
        ("STATESTORE_GATEWAY_MAX_WATCHED_KEYS".to_owned(), limit),
    ];
    let gateway = GatewayLaunch {
        binary: &binary,
        dir: dir.path(),
        broker_port: port,
        pool_size: 4,
        max_watchers: options.streams + 100,
        env: &env,
    }
    .start("gateway")
    .await?;
    // Let the allocator settle after start.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = gateway.proc.rss_kib()?;

    // The initial listing.
    let opened = Instant::now();
    let mut stream = SseReader::open(gateway.api, PATTERN).await?;
    let listed = stream.until_listed(Duration::from_secs(120)).await?;
    let listing_time = opened.elapsed();
    if listed != options.pattern_keys {
        bail!("listed {listed} keys, not {}", options.pattern_keys);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = gateway.proc.rss_kib()?;
    let bytes_per_key =
        (rss_after.saturating_sub(rss_before) * 1024) as f64 / options.pattern_keys as f64;

    // Rescans, with nothing else going on.
    let ticks = clock_ticks_per_second() as f64;
    let before = Counters::read(&gateway).await?;
    let cpu_before = gateway.proc.cpu_ticks()?;
    let idle_since = Instant::now();
    while Counters::read(&gateway).await?.rescans < before.rescans + options.rescan_rounds as f64 {
        if idle_since.elapsed() > options.rescan * (options.rescan_rounds as u32 + 4) {
            bail!("fewer rescans than expected");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu_after = gateway.proc.cpu_ticks()?;
    let after = Counters::read(&gateway).await?;
    let rescans = after.rescans - before.rescans;
    let cpu_ms_per_rescan = (cpu_after - cpu_before) as f64 / ticks * 1e3 / rescans;
    let requests_per_rescan: Vec<(String, f64)> = after
        .requests
        .iter()
        .map(|(op, count)| {
            let delta = count - before.requests.get(op).copied().unwrap_or(0.0);
            (op.clone(), delta / rescans)
        })
        .filter(|(_, per)| *per > 0.0)
        .collect();
    let rescan_ms = (after.rescan_seconds - before.rescan_seconds) / rescans * 1e3;

    // Keys created through the gateway: PUT reply to sync.
    let mut http = HttpConn::connect(gateway.api).await?;
    let mut through_gateway = Vec::new();
    for n in 0..options.writes {
        let key = format!("space/gw-{n:05}");
        let response = http.request("PUT", &format!("/keys/{key}"), b"1").await?;
        if response.status != 200 {
            bail!("PUT {key}: {}", response.status);
        }
        let replied = Instant::now();
        let at = stream
            .until_event("sync", &key, Duration::from_secs(10))
            .await?;
        through_gateway.push(at.saturating_duration_since(replied));
    }
    // Changes of followed keys, written by the other client: SET reply to set.
    let mut changes = Vec::new();
    for n in 0..options.writes {
        let key = format!("space/{:06}", n % options.pattern_keys);
        set(&pool, key.clone(), b"22.5").await?;
        let replied = Instant::now();
        let at = stream
            .until_event("set", &key, Duration::from_secs(10))
            .await?;
        changes.push(at.saturating_duration_since(replied));
    }
    // Keys created by the other client: SET reply to sync, one per rescan
    // at a different point of the interval.
    let mut outside = Vec::new();
    for n in 0..options.outside_writes {
        let offset = options.rescan.mul_f64((n as f64 * 0.37) % 1.0);
        tokio::time::sleep(offset).await;
        let key = format!("space/ext-{n:05}");
        set(&pool, key.clone(), b"1").await?;
        let replied = Instant::now();
        let at = stream.until_event("sync", &key, options.rescan * 3).await?;
        outside.push(at.saturating_duration_since(replied));
    }
    drop(stream);

    // Many streams on one pattern.
    let mut streams = Vec::with_capacity(options.streams);
    for _ in 0..options.streams {
        streams.push(SseReader::open(gateway.api, SHARED_PATTERN).await?);
    }
    for stream in &mut streams {
        let listed = stream.until_listed(Duration::from_secs(60)).await?;
        if listed != SHARED_KEYS {
            bail!("a shared stream listed {listed} keys, not {SHARED_KEYS}");
        }
    }
    // The first pattern's last stream left: its loop is gone.
    let mut patterns = gateway.metric("statestore_gateway_watch_patterns").await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while patterns != 1.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        patterns = gateway.metric("statestore_gateway_watch_patterns").await?;
    }
    let shared_before = Counters::read(&gateway).await?;
    let window = options.rescan * options.rescan_rounds as u32;
    tokio::time::sleep(window).await;
    let shared_after = Counters::read(&gateway).await?;
    let shared_rescans = shared_after.rescans - shared_before.rescans;
    let watchers = gateway.metric("statestore_gateway_watchers").await?;
    drop(streams);
    drop(gateway);

    let steps: Vec<usize> = [1, 10, 50, 100, 500]
        .into_iter()
        .filter(|&n| n < options.curve_streams)
        .chain((options.curve_streams > 0).then_some(options.curve_streams))
        .collect();
    let mut curve = String::new();
    if !steps.is_empty() {
        let launch = GatewayLaunch {
            binary: &binary,
            dir: dir.path(),
            broker_port: port,
            pool_size: 4,
            max_watchers: options.curve_streams + 100,
            env: &env,
        };
        let gateway = launch.start("gateway-curve").await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let gateway_rows = gateway_curve(&gateway, &pool, &steps).await?;
        // The curve's streams are gone: let their keys' STOPs settle.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let put_count = if options.smoke { 200 } else { 2_000 };
        let puts = puts_beside_patterns(&gateway, put_count).await?;
        drop(gateway);
        let etcd_rows = match support::procs::find_program(&["etcd"]) {
            Some(program) => {
                let etcd = support::locks::start_etcd(&program, dir.path())?;
                Some(etcd_curve(&etcd, options.pattern_keys, &steps).await?)
            }
            None => {
                println!("keyspace benchmark: etcd is not installed; the etcd curve is SKIPPED");
                None
            }
        };
        curve = curve_report(&gateway_rows, etcd_rows.as_deref());
        let _ = writeln!(
            curve,
            "\nPUT of a key no pattern matches, one connection, {} PUTs each: p50 {:.2} ms, p99 {:.2} ms \
             with no pattern followed; p50 {:.2} ms, p99 {:.2} ms with {PUT_PATTERNS} patterns followed \
             ({:.2}x the p50).",
            put_count,
            puts.0.p50 / 1e3,
            puts.0.p99 / 1e3,
            puts.1.p50 / 1e3,
            puts.1.p99 / 1e3,
            puts.1.p50 / puts.0.p50
        );
    }

    let through_gateway = Percentiles::of(&mut through_gateway);
    let changes = Percentiles::of(&mut changes);
    let outside = Percentiles::of(&mut outside);
    let ms = |us: f64| us / 1e3;
    let mut report = String::new();
    writeln!(
        report,
        "### Following `{PATTERN}`: {} keys in a store of {}, rescan every {:?}\n",
        options.pattern_keys, options.store_keys, options.rescan
    )?;
    writeln!(report, "| | |")?;
    writeln!(report, "|---|---:|")?;
    writeln!(
        report,
        "| initial listing (SCAN, KEYNOTIFY + GET per key) to `listed` | {:.0} ms |",
        listing_time.as_secs_f64() * 1e3
    )?;
    writeln!(
        report,
        "| shared state per followed key (heap the hub holds with one stream on the pattern, \
         less with one on a pattern of no keys, / keys) | {:.0} B in {:.1} allocations |",
        hub.bytes_per_key, hub.allocations_per_key
    )?;
    writeln!(
        report,
        "| gateway memory per followed key (RSS growth / keys) | {bytes_per_key:.0} B |"
    )?;
    writeln!(
        report,
        "| gateway CPU per rescan (mean over {rescans:.0} rescans, idle otherwise) | {cpu_ms_per_rescan:.1} ms |"
    )?;
    writeln!(report, "| rescan duration (mean) | {rescan_ms:.1} ms |")?;
    let requests: Vec<String> = requests_per_rescan
        .iter()
        .map(|(op, per)| format!("{per:.1} {op}"))
        .collect();
    writeln!(
        report,
        "| store requests per rescan | {} |",
        requests.join(", ")
    )?;
    writeln!(
        report,
        "\n| from a write to its event | p50 | p99 | max | goal |\n|---|---:|---:|---:|---|"
    )?;
    writeln!(
        report,
        "| key created through the gateway (PUT reply to `sync`), {} keys | {:.1} ms | {:.1} ms | {:.1} ms | p99 < 50 ms |",
        options.writes,
        ms(through_gateway.p50),
        ms(through_gateway.p99),
        ms(through_gateway.max)
    )?;
    writeln!(
        report,
        "| key created by another MQTT client (SET reply to `sync`), {} keys | {:.0} ms | {:.0} ms | {:.0} ms | at most the interval + 100 ms = {} ms |",
        options.outside_writes,
        ms(outside.p50),
        ms(outside.p99),
        ms(outside.max),
        options.rescan.as_millis() + 100
    )?;
    writeln!(
        report,
        "| change of a followed key by another client (SET reply to `set`), {} changes | {:.1} ms | {:.1} ms | {:.1} ms | as a key watch |",
        options.writes,
        ms(changes.p50),
        ms(changes.p99),
        ms(changes.max)
    )?;
    writeln!(
        report,
        "\n{watchers:.0} streams on `{SHARED_PATTERN}` ({SHARED_KEYS} keys): {patterns:.0} pattern followed, \
         {shared_rescans:.0} rescans in {:.1} s ({:.2} per interval).",
        window.as_secs_f64(),
        shared_rescans / options.rescan_rounds as f64
    )?;
    report.push_str(&curve);
    println!("\n{report}");
    if let Some(path) = &options.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    pool.shutdown().await;
    if options.smoke {
        println!("keyspace benchmark: smoke run passed (no timing asserted)");
    }
    Ok(())
}

/// What the watch hub holds per followed key.
struct HubMemory {
    /// Heap bytes (as requested from the allocator).
    bytes_per_key: f64,
    /// Live allocations.
    allocations_per_key: f64,
}

/// The heap a watch hub holds per key of [`PATTERN`] (`keys` of them),
/// measured in this process on `pool`: live bytes with one stream on the
/// pattern, read up to `listed` and past it, less live bytes with one
/// stream on a pattern that matches nothing, over `keys`. A first hub,
/// dropped, warms the pool's buffers; rescans and resyncs are off so that
/// none runs while counting.
async fn hub_memory(pool: &Pool, keys: usize) -> Result<HubMemory> {
    let settings = WatchSettings {
        max_keys_per_pattern: keys * 2,
        max_watched_keys: keys * 2,
        rescan_interval: Duration::from_secs(3_600),
        resync_interval: None,
        ..WatchSettings::default()
    };
    let start = || {
        WatchHub::start(
            StoreClient::new(pool.clone()),
            Metrics::new(),
            settings.clone(),
        )
    };
    let warm_up = start();
    drop(read_listed(&warm_up, PATTERN, keys).await?);
    wait_forgotten(&warm_up).await?;
    warm_up.shutdown();
    drop(warm_up);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let hub = start();
    let region = Region::new(ALLOCATOR);
    let live = |region: &Region<'_, System>| {
        let change = region.change();
        // A reallocation's growth is in both counts already.
        let bytes = change.bytes_allocated as f64 - change.bytes_deallocated as f64;
        let allocations = change.allocations as f64 - change.deallocations as f64;
        (bytes, allocations)
    };
    let empty = read_listed(&hub, "no-such-key/*", 0).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let without_keys = live(&region);
    drop(empty);
    wait_forgotten(&hub).await?;
    let stream = read_listed(&hub, PATTERN, keys).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let with_keys = live(&region);
    drop(stream);
    wait_forgotten(&hub).await?;
    hub.shutdown();
    Ok(HubMemory {
        bytes_per_key: (with_keys.0 - without_keys.0) / keys as f64,
        allocations_per_key: (with_keys.1 - without_keys.1) / keys as f64,
    })
}

/// A stream on `pattern`, read up to its `listed` (which must say `keys`)
/// and until it has nothing more to give (it then drops what it kept per
/// key).
async fn read_listed(hub: &WatchHub, pattern: &str, keys: usize) -> Result<Watcher> {
    let mut selection = Selection::new(1);
    selection.add_pattern(Bytes::copy_from_slice(pattern.as_bytes()))?;
    let mut watcher =
        tokio::time::timeout(Duration::from_secs(120), hub.follow(selection, None, None))
            .await
            .context("no listing in time")??;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let event = tokio::time::timeout_at(deadline.into(), watcher.next())
            .await
            .context("no listed in time")?
            .context("the hub shut down")?;
        if let EventKind::Listed { keys: listed } = event.kind {
            if listed != keys {
                bail!("{pattern} listed {listed} keys, not {keys}");
            }
            break;
        }
    }
    if let Ok(event) = tokio::time::timeout(Duration::from_millis(200), watcher.next()).await {
        bail!("an event after listed: {event:?}");
    }
    Ok(watcher)
}

/// Waits until `hub` follows no key (its streams are gone).
async fn wait_forgotten(hub: &WatchHub) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while hub.watched_keys() > 0 {
        if Instant::now() > deadline {
            bail!("the hub still follows {} keys", hub.watched_keys());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its reconciler's STOPs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

/// Counters read from `/metrics`.
struct Counters {
    rescans: f64,
    rescan_seconds: f64,
    /// Store requests by op.
    requests: HashMap<String, f64>,
}

impl Counters {
    async fn read(gateway: &GatewayProc) -> Result<Counters> {
        let response = request_once(gateway.admin, "GET", "/metrics", b"").await?;
        let text = String::from_utf8_lossy(&response.body);
        let mut counters = Counters {
            rescans: 0.0,
            rescan_seconds: 0.0,
            requests: HashMap::new(),
        };
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((metric, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if metric == "statestore_gateway_watch_rescans_total" {
                counters.rescans = value;
            } else if metric == "statestore_gateway_watch_rescan_duration_seconds_sum" {
                counters.rescan_seconds = value;
            } else if let Some(labels) =
                metric.strip_prefix("statestore_gateway_store_request_duration_seconds_count{")
                && let Some(op) = labels
                    .split(',')
                    .find_map(|label| label.strip_prefix("op=\""))
                    .and_then(|op| op.strip_suffix('"'))
            {
                *counters.requests.entry(op.to_owned()).or_default() += value;
            }
        }
        Ok(counters)
    }
}

/// One watch stream, read on its own task; events arrive with the instant
/// they were read.
struct SseReader {
    events: mpsc::UnboundedReceiver<(String, serde_json::Value, Instant)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SseReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SseReader {
    /// `GET /watch?match=<pattern>` as HTTP/1.0 (no framing: the body is
    /// the event stream itself).
    async fn open(api: SocketAddr, pattern: &str) -> Result<SseReader> {
        let mut tcp = TcpStream::connect(api)
            .await
            .context("connecting a stream")?;
        tcp.write_all(format!("GET /watch?match={pattern} HTTP/1.0\r\n\r\n").as_bytes())
            .await?;
        let (tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut lines = BufReader::new(tcp).lines();
            let (mut event, mut data) = (String::new(), String::new());
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(name) = line.strip_prefix("event: ") {
                    event = name.to_owned();
                } else if let Some(json) = line.strip_prefix("data: ") {
                    data = json.to_owned();
                } else if line.is_empty() && !event.is_empty() {
                    let parsed = serde_json::from_str(&data).unwrap_or_default();
                    if tx
                        .send((std::mem::take(&mut event), parsed, Instant::now()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
        Ok(SseReader { events, task })
    }

    async fn next(&mut self, deadline: Instant) -> Result<(String, serde_json::Value, Instant)> {
        tokio::time::timeout_at(deadline.into(), self.events.recv())
            .await
            .context("no event in time")?
            .context("the stream ended")
    }

    /// Reads the initial syncs up to `listed`; the number it says.
    async fn until_listed(&mut self, within: Duration) -> Result<usize> {
        let deadline = Instant::now() + within;
        loop {
            let (event, data, _) = self.next(deadline).await?;
            match event.as_str() {
                "sync" => {}
                "listed" => {
                    return data["keys"]
                        .as_u64()
                        .map(|keys| keys as usize)
                        .context("listed without keys");
                }
                other => bail!("{other} event before listed: {data}"),
            }
        }
    }

    /// The instant the `event` of `key` was read.
    async fn until_event(&mut self, event: &str, key: &str, within: Duration) -> Result<Instant> {
        let deadline = Instant::now() + within;
        loop {
            let (name, data, at) = self
                .next(deadline)
                .await
                .with_context(|| format!("waiting for the {event} of {key}"))?;
            if name == event && data["key"] == key {
                return Ok(at);
            }
        }
    }
}

/// One point of a memory curve: streams (clients) open, RSS with them,
/// and the time from sending a change of a followed key to its event on
/// each.
struct CurvePoint {
    streams: usize,
    rss_kib: u64,
    delivery: Percentiles,
}

/// The gateway's RSS before any stream, then with each number of `steps`
/// streams on [`PATTERN`], each read up to its `listed`; at each, one
/// followed key changed by the other client and timed to its `set` on
/// every stream.
async fn gateway_curve(
    gateway: &GatewayProc,
    pool: &Pool,
    steps: &[usize],
) -> Result<Vec<CurvePoint>> {
    let mut points = vec![CurvePoint {
        streams: 0,
        rss_kib: gateway.proc.rss_kib()?,
        delivery: Percentiles::default(),
    }];
    let mut streams: Vec<SseReader> = Vec::new();
    for (round, &count) in steps.iter().enumerate() {
        while streams.len() < count {
            let mut stream = SseReader::open(gateway.api, PATTERN).await?;
            stream.until_listed(Duration::from_secs(120)).await?;
            streams.push(stream);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_kib = gateway.proc.rss_kib()?;
        let key = format!("space/{round:06}");
        let sent = Instant::now();
        set(pool, key.clone(), b"23.5").await?;
        let arrivals = futures_util::future::join_all(
            streams
                .iter_mut()
                .map(|stream| stream.until_event("set", &key, Duration::from_secs(30))),
        )
        .await;
        let mut delivery = arrivals
            .into_iter()
            .map(|at| Ok(at?.saturating_duration_since(sent)))
            .collect::<Result<Vec<_>>>()?;
        println!("keyspace benchmark: {count} streams on {PATTERN}: gateway RSS {rss_kib} KiB");
        points.push(CurvePoint {
            streams: count,
            rss_kib,
            delivery: Percentiles::of(&mut delivery),
        });
    }
    Ok(points)
}

/// The same curve for etcd: `keys` keys under `space/`, then clients that
/// each read the prefix (a range read) and watch it.
async fn etcd_curve(
    etcd: &support::locks::Etcd,
    keys: usize,
    steps: &[usize],
) -> Result<Vec<CurvePoint>> {
    let mut writes = futures_util::stream::iter(
        (0..keys)
            .collect::<Vec<_>>()
            .chunks(keys.div_ceil(16))
            .map(<[usize]>::to_vec)
            .collect::<Vec<_>>(),
    )
    .map(|chunk| async move {
        let mut conn = HttpConn::connect(etcd.client).await?;
        for i in chunk {
            etcd_put(&mut conn, &format!("space/{i:06}"), "21.5").await?;
        }
        anyhow::Ok(())
    })
    .buffer_unordered(16);
    while let Some(written) = writes.next().await {
        written?;
    }
    drop(writes);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut points = vec![CurvePoint {
        streams: 0,
        rss_kib: etcd.proc.rss_kib()?,
        delivery: Percentiles::default(),
    }];
    let mut writer = HttpConn::connect(etcd.client).await?;
    let mut watchers: Vec<EtcdWatcher> = Vec::new();
    for (round, &count) in steps.iter().enumerate() {
        while watchers.len() < count {
            watchers.push(EtcdWatcher::open(etcd.client, keys).await?);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_kib = etcd.proc.rss_kib()?;
        let key = format!("space/{round:06}");
        let sent = Instant::now();
        etcd_put(&mut writer, &key, "23.5").await?;
        let needle = BASE64.encode(&key);
        let arrivals = futures_util::future::join_all(
            watchers
                .iter_mut()
                .map(|watcher| watcher.until_line_with(&needle, Duration::from_secs(30))),
        )
        .await;
        let mut delivery = arrivals
            .into_iter()
            .map(|at| Ok(at?.saturating_duration_since(sent)))
            .collect::<Result<Vec<_>>>()?;
        println!(
            "keyspace benchmark: {count} etcd clients watching space/: etcd RSS {rss_kib} KiB"
        );
        points.push(CurvePoint {
            streams: count,
            rss_kib,
            delivery: Percentiles::of(&mut delivery),
        });
    }
    Ok(points)
}

async fn etcd_put(conn: &mut HttpConn, key: &str, value: &str) -> Result<()> {
    let body = serde_json::json!({"key": BASE64.encode(key), "value": BASE64.encode(value)});
    let response = conn
        .request("POST", "/v3/kv/put", body.to_string().as_bytes())
        .await?;
    if response.status != 200 {
        bail!("etcd put {key}: {}", response.status);
    }
    Ok(())
}

/// One etcd client: a range read of `space/`, then a watch of it over
/// etcd's HTTP/JSON gateway, read on its own task; lines arrive with the
/// instant they were read.
struct EtcdWatcher {
    lines: mpsc::UnboundedReceiver<(String, Instant)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EtcdWatcher {
    async fn open(addr: SocketAddr, keys: usize) -> Result<EtcdWatcher> {
        let range = serde_json::json!({"key": BASE64.encode("space/"), "range_end": BASE64.encode("space0")});
        let mut conn = HttpConn::connect(addr).await?;
        let response = conn
            .request("POST", "/v3/kv/range", range.to_string().as_bytes())
            .await?;
        let listed: serde_json::Value = serde_json::from_slice(&response.body)?;
        let count: usize = listed["count"]
            .as_str()
            .and_then(|count| count.parse().ok())
            .context("a range answer without count")?;
        if response.status != 200 || count < keys {
            bail!("etcd range: {} with {count} keys", response.status);
        }
        drop(conn);
        let body = serde_json::json!({"create_request": range}).to_string();
        let mut tcp = TcpStream::connect(addr).await?;
        tcp.write_all(
            format!(
                "POST /v3/watch HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await?;
        let (tx, mut lines) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut reader = BufReader::new(tcp).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send((line, Instant::now())).is_err() {
                    return;
                }
            }
        });
        // The watch is set once etcd says it was created.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (line, _) = tokio::time::timeout_at(deadline.into(), lines.recv())
                .await
                .context("no watch creation in time")?
                .context("the watch ended")?;
            if line.contains("\"created\":true") {
                break;
            }
        }
        Ok(EtcdWatcher { lines, task })
    }

    /// The instant a line containing `needle` was read.
    async fn until_line_with(&mut self, needle: &str, within: Duration) -> Result<Instant> {
        let deadline = Instant::now() + within;
        loop {
            let (line, at) = tokio::time::timeout_at(deadline.into(), self.lines.recv())
                .await
                .with_context(|| format!("no etcd event with {needle} in time"))?
                .context("the etcd watch ended")?;
            if line.contains(needle) {
                return Ok(at);
            }
        }
    }
}

/// The report's table of memory against streams.
fn curve_report(gateway: &[CurvePoint], etcd: Option<&[CurvePoint]>) -> String {
    let mut out = format!(
        "\n### Memory against streams on `{PATTERN}`\n\n\
         | streams (etcd: clients) | gateway RSS | each stream after the first | write to event on all, p99 | etcd RSS | write to event on all, p99 | gateway / etcd |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    let first = gateway.iter().find(|point| point.streams == 1);
    for (index, point) in gateway.iter().enumerate() {
        let per_stream = match first {
            Some(first) if point.streams > 1 => format!(
                "{:.0} KiB",
                point.rss_kib.saturating_sub(first.rss_kib) as f64 / (point.streams - 1) as f64
            ),
            _ => "—".to_owned(),
        };
        let ms = |p: &Percentiles, streams: usize| {
            if streams == 0 {
                "—".to_owned()
            } else {
                format!("{:.1} ms", p.p99 / 1e3)
            }
        };
        let (etcd_rss, etcd_delivery, ratio) = match etcd.and_then(|rows| rows.get(index)) {
            Some(row) => (
                format!("{:.1} MiB", mib(row.rss_kib)),
                ms(&row.delivery, row.streams),
                format!("{:.2}x", point.rss_kib as f64 / row.rss_kib as f64),
            ),
            None => ("—".to_owned(), "—".to_owned(), "—".to_owned()),
        };
        let _ = writeln!(
            out,
            "| {} | {:.1} MiB | {per_stream} | {} | {etcd_rss} | {etcd_delivery} | {ratio} |",
            point.streams,
            mib(point.rss_kib),
            ms(&point.delivery, point.streams),
        );
    }
    out
}

/// Patterns followed while [`puts_beside_patterns`] times PUTs.
const PUT_PATTERNS: usize = 100;

/// `count` PUTs of keys no pattern matches, on one connection, timed
/// with no pattern followed and then with [`PUT_PATTERNS`] followed (one
/// stream each, on patterns without keys).
async fn puts_beside_patterns(
    gateway: &GatewayProc,
    count: usize,
) -> Result<(Percentiles, Percentiles)> {
    async fn timed(gateway: &GatewayProc, count: usize, round: usize) -> Result<Percentiles> {
        let mut http = HttpConn::connect(gateway.api).await?;
        let mut took = Vec::with_capacity(count);
        for n in 0..count {
            let path = format!("/keys/plain/{round}-{n:05}");
            let started = Instant::now();
            let response = http.request("PUT", &path, b"1").await?;
            took.push(started.elapsed());
            if response.status != 200 {
                bail!("PUT {path}: {}", response.status);
            }
        }
        Ok(Percentiles::of(&mut took))
    }
    // Warm-up: connections, buffers.
    timed(gateway, count / 4, 0).await?;
    let without = timed(gateway, count, 1).await?;
    let mut streams = Vec::with_capacity(PUT_PATTERNS);
    for n in 0..PUT_PATTERNS {
        let mut stream = SseReader::open(gateway.api, &format!("idle{n}/*")).await?;
        stream.until_listed(Duration::from_secs(30)).await?;
        streams.push(stream);
    }
    let with = timed(gateway, count, 2).await?;
    drop(streams);
    Ok((without, with))
}
