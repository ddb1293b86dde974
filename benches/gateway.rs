//! What the gateway costs on the request path, measured in one run.
//!
//! Starts mosquitto (`set_tcp_nodelay true`) and the emulator as its own
//! process, then measures, for values of 16 B, 1 KiB and 64 KiB:
//!
//! 1. **direct**: the gateway's pool (`statestore_gateway::mqtt::Pool`) in
//!    this process, no HTTP: one request at a time, then 64 in flight;
//! 2. **gateway**: `statestore-gateway serve` as its own process, loaded by
//!    `wrk` with 1 connection and with 64; the added latency (gateway minus
//!    direct, per percentile) and the throughput ratio;
//! 3. **peer**: webdis in front of redis-server with the same wrk runs;
//! 4. **watch fan-out**: 1,000 and 10,000 SSE watchers of one key, the time
//!    from a PUT's request to the event at every watcher, and the gateway's
//!    RSS before, during and after; then nginx + nchan, the reference SSE
//!    pub/sub, with the same client and counts when it is installed;
//! 5. **CPU against webdis**: each server's own CPU per GET at saturation,
//!    its mCPU at a steady 1,000 req/s, and idle, in rounds;
//! 6. **footprint**: idle and peak RSS, and the time from process start to
//!    `/readyz` 200;
//! 7. **lock hand-over**: 1 and 1,000 waiters blocked on one lock, the time
//!    from a release to the next holder's acquire returning, RSS and CPU;
//!    etcd's lock service beside it when `etcd` is installed.
//!
//! `scripts/bench` runs it (`cargo bench --bench gateway`: release build of
//! both this program and the gateway binary); `scripts/bench --smoke` runs
//! a seconds-long version on the debug build that checks every part works
//! and asserts no timing. Under plain `cargo test` it does nothing (it needs
//! wrk, webdis and redis, which `scripts/bench` installs).

mod support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;

use support::cpu::{CpuComparison, CpuRound, Idle};
use support::direct::{self, Op};
use support::gateway::GatewayLaunch;
use support::http::request_once;
use support::locks::HandoverReport;
use support::proc_fs;
use support::procs::{self, Proc};
use support::rate::fixed_rate;
use support::stats::{Measurement, Percentiles, median_low_high};
use support::watchers::{FanoutReport, Server, fan_out};
use support::wrk::{self, WrkRun};

/// Requests in flight for the saturated runs: wrk connections through the
/// gateway, concurrent requests on the direct pool.
const CONCURRENCY: usize = 64;

/// Pool members, as `serve`'s default.
const POOL_SIZE: usize = 4;

/// `--max-watchers`: room for the largest fan-out.
const MAX_WATCHERS: usize = 20_000;

/// Dapr's published sidecar overhead for its HTTP state GET at 1,000 QPS
/// (p50 and p99 added latency in ms, mCPU, MB), the comparison the issue names.
const DAPR: (f64, f64, f64, f64) = (0.28, 0.98, 57.0, 48.0);

#[derive(Debug, Clone)]
struct Options {
    smoke: bool,
    /// Length of each wrk run (whole seconds).
    seconds: u64,
    /// Length of each direct run.
    direct: Duration,
    sizes: Vec<usize>,
    watchers: Vec<usize>,
    rounds: usize,
    /// How long after the last watcher left the gateway's RSS is read
    /// again (allocators give memory back with a delay).
    settle: Duration,
    starts: usize,
    rate: u32,
    rate_time: Duration,
    peer: bool,
    /// Run the key API part (direct, gateway, peer).
    keys: bool,
    /// Run the CPU comparison with webdis (saturated, fixed rate, idle).
    cpu: bool,
    /// Rounds of the CPU comparison (the report gives each and the median).
    cpu_rounds: usize,
    /// How long the gateway and webdis sit idle while their CPU is read.
    idle: Duration,
    /// Run the watch fan-out part.
    watch: bool,
    /// Waiters of the lock hand-over runs (empty: skip them).
    lock_waiters: Vec<usize>,
    /// Releases per lock hand-over run.
    lock_rounds: usize,
    /// Extra environment of the gateway processes (experiments: allocator
    /// settings, `LD_PRELOAD`, ...).
    gateway_env: Vec<(String, String)>,
    report: Option<PathBuf>,
    binary: PathBuf,
}

impl Options {
    /// `None` when neither `--bench` (cargo bench) nor `--smoke` is given:
    /// plain `cargo test` runs this program too and must not need wrk.
    fn parse() -> Result<Option<Options>> {
        let Some((smoke, args)) = support::requested_args() else {
            return Ok(None);
        };
        let mut options = if smoke {
            Options {
                smoke,
                seconds: 1,
                direct: Duration::from_millis(250),
                sizes: vec![16, 65536],
                watchers: vec![50],
                rounds: 2,
                settle: Duration::from_secs(1),
                starts: 2,
                rate: 200,
                rate_time: Duration::from_secs(1),
                peer: true,
                keys: true,
                cpu: true,
                cpu_rounds: 1,
                idle: Duration::from_secs(2),
                watch: true,
                lock_waiters: vec![1, 50],
                lock_rounds: 10,
                gateway_env: Vec::new(),
                report: None,
                binary: PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway")),
            }
        } else {
            Options {
                smoke,
                seconds: 5,
                direct: Duration::from_secs(5),
                sizes: vec![16, 1024, 65536],
                watchers: vec![1000, 10_000],
                rounds: 5,
                settle: Duration::from_secs(10),
                starts: 5,
                rate: 1000,
                rate_time: Duration::from_secs(10),
                peer: true,
                keys: true,
                cpu: true,
                cpu_rounds: 3,
                idle: Duration::from_secs(60),
                watch: true,
                lock_waiters: vec![1, 1000],
                lock_rounds: 200,
                gateway_env: Vec::new(),
                report: None,
                binary: PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway")),
            }
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let mut value =
                |name: &str| args.next().with_context(|| format!("{name} needs a value"));
            match arg.as_str() {
                "--bench" | "--smoke" => {}
                "--seconds" => {
                    options.seconds = value("--seconds")?.parse().context("--seconds")?;
                    options.direct = Duration::from_secs(options.seconds);
                }
                "--sizes" => options.sizes = list(&value("--sizes")?)?,
                "--watchers" => options.watchers = list(&value("--watchers")?)?,
                "--lock-waiters" => options.lock_waiters = list(&value("--lock-waiters")?)?,
                "--rounds" => options.rounds = value("--rounds")?.parse().context("--rounds")?,
                "--settle" => {
                    let seconds: u64 = value("--settle")?.parse().context("--settle")?;
                    options.settle = Duration::from_secs(seconds.max(1));
                }
                "--no-peer" => options.peer = false,
                "--cpu-rounds" => {
                    options.cpu_rounds = value("--cpu-rounds")?.parse().context("--cpu-rounds")?;
                }
                "--idle" => {
                    let seconds: u64 = value("--idle")?.parse().context("--idle")?;
                    options.idle = Duration::from_secs(seconds);
                }
                "--only" => {
                    let part = value("--only")?;
                    match part.as_str() {
                        "keys" => {
                            options.watch = false;
                            options.cpu = false;
                            options.lock_waiters.clear();
                        }
                        "watch" => {
                            options.keys = false;
                            options.cpu = false;
                            options.lock_waiters.clear();
                        }
                        "cpu" => {
                            options.keys = false;
                            options.watch = false;
                            options.lock_waiters.clear();
                        }
                        "locks" => {
                            options.keys = false;
                            options.peer = false;
                            options.watch = false;
                            options.cpu = false;
                        }
                        _ => bail!("--only takes keys, watch, cpu or locks, not {part:?}"),
                    }
                }
                "--gateway-env" => {
                    let pair = value("--gateway-env")?;
                    let (name, value) = pair
                        .split_once('=')
                        .with_context(|| format!("--gateway-env {pair:?}: use NAME=VALUE"))?;
                    options
                        .gateway_env
                        .push((name.to_owned(), value.to_owned()));
                }
                "--report" => options.report = Some(value("--report")?.into()),
                "--gateway-bin" => options.binary = value("--gateway-bin")?.into(),
                other => bail!(
                    "unknown argument {other:?}; use --seconds N, --sizes 16,1024, \
                     --watchers 1000,10000, --lock-waiters 1,1000, --rounds N, --no-peer, \
                     --only keys|watch|cpu|locks, --cpu-rounds N, --idle SECONDS, \
                     --gateway-env NAME=VALUE, --report FILE, --gateway-bin PATH"
                ),
            }
        }
        if options.seconds == 0
            || options.sizes.is_empty()
            || options.rounds == 0
            || options.cpu_rounds == 0
        {
            bail!("--seconds, --sizes, --rounds and --cpu-rounds must be positive");
        }
        if !options.keys {
            options.sizes.clear();
        }
        if !options.watch {
            options.watchers.clear();
        }
        Ok(Some(options))
    }
}

fn list(text: &str) -> Result<Vec<usize>> {
    text.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            item.trim()
                .parse()
                .with_context(|| format!("{item:?} in {text:?}"))
        })
        .collect()
}

fn main() -> ExitCode {
    support::main_with("gateway", Options::parse, run)
}

/// Programs the run needs.
struct Tools {
    mosquitto: PathBuf,
    wrk: PathBuf,
    redis: Option<PathBuf>,
    webdis: Option<PathBuf>,
    /// nginx, with the nchan module installed.
    nchan: Option<PathBuf>,
}

impl Tools {
    /// mosquitto and wrk are needed; without webdis or redis-server, or
    /// nginx with nchan (when they could not be installed), the run goes on
    /// without that peer and says so.
    fn find(options: &Options) -> Result<Tools> {
        let need = |names: &[&str]| {
            procs::find_program(names).with_context(|| {
                format!("{} is not installed (scripts/bench installs it)", names[0])
            })
        };
        let (mut redis, mut webdis) = (None, None);
        if options.peer && (options.keys || options.cpu) {
            redis = procs::find_program(&["redis-server"]);
            webdis = procs::find_program(&["webdis"]);
            if redis.is_none() || webdis.is_none() {
                println!(
                    "webdis comparison SKIPPED: {} not installed (scripts/bench installs both from Debian when it can)",
                    match (&redis, &webdis) {
                        (None, None) => "webdis and redis-server are",
                        (None, Some(_)) => "redis-server is",
                        _ => "webdis is",
                    }
                );
                (redis, webdis) = (None, None);
            }
        }
        let mut nchan = None;
        if options.peer && options.watch {
            nchan = procs::find_program(&["nginx"])
                .filter(|_| std::path::Path::new(procs::NCHAN_MODULE).is_file());
            if nchan.is_none() {
                println!(
                    "nchan comparison SKIPPED: nginx-light and libnginx-mod-nchan are not installed (scripts/bench installs them from Debian when it can)"
                );
            }
        }
        Ok(Tools {
            mosquitto: need(&["mosquitto"])?,
            wrk: need(&["wrk"])?,
            redis,
            webdis,
            nchan,
        })
    }
}

/// One key-API case: an operation and a value size, through each path.
#[derive(Debug, Default)]
struct Case {
    op: Option<Op>,
    size: usize,
    direct_seq: Measurement,
    direct_sat: Measurement,
    gateway_seq: Measurement,
    gateway_sat: Measurement,
    /// Cores used during the saturated direct run: this process (the pool),
    /// the emulator, the broker.
    direct_sat_cores: [f64; 3],
    /// Cores used during the saturated gateway run: the gateway, the
    /// emulator, the broker (wrk uses the rest).
    gateway_sat_cores: [f64; 3],
    /// Cores busy on the whole machine (every process, other users'
    /// included) during the saturated direct and gateway runs.
    machine_busy: (f64, f64),
    peer_seq: Option<Measurement>,
    peer_sat: Option<Measurement>,
}

impl Case {
    fn added(&self) -> Percentiles {
        self.gateway_seq.latency.minus(&self.direct_seq.latency)
    }

    fn ratio(&self) -> f64 {
        self.gateway_sat.rate() / self.direct_sat.rate()
    }
}

/// What the footprint section measured.
#[derive(Debug, Default)]
struct Footprint {
    ready: Vec<Duration>,
    idle_rss_kib: u64,
    peak_rss_kib: u64,
    after_load_rss_kib: u64,
    /// wrk, 1 connection, `GET /livez` on the admin port: the same hyper
    /// and axum stack with no store call, i.e. what one HTTP hop costs here.
    http_floor: Option<Measurement>,
}

async fn run(options: Options) -> Result<()> {
    let tools = Tools::find(&options)?;
    let machine = machine(&tools, &options);
    let dir = tempfile::Builder::new()
        .prefix("statestore-bench-")
        .tempdir()
        .context("creating a temporary directory")?;
    let dir_path = dir.path().to_owned();
    let ticks = proc_fs::clock_ticks_per_second() as f64;
    let started = Instant::now();
    println!(
        "gateway benchmark ({}), gateway binary {}",
        if options.smoke { "smoke" } else { "full" },
        options.binary.display()
    );

    let (mut broker, broker_port) = procs::start_mosquitto(&tools.mosquitto, &dir_path)?;
    let mut emulator = procs::start_emulator(&options.binary, &dir_path, broker_port).await?;
    let pool = direct::start_pool(broker_port, POOL_SIZE).await?;
    emulator.check_alive()?;
    println!("broker on {broker_port}, emulator and direct pool ready");

    let launch = GatewayLaunch {
        binary: &options.binary,
        dir: &dir_path,
        broker_port,
        pool_size: POOL_SIZE,
        max_watchers: MAX_WATCHERS,
        env: &options.gateway_env,
    };
    // Start-up time: fresh processes, the last one stays for the key API.
    let mut footprint = Footprint::default();
    let mut gateway = None;
    for start in 0..options.starts {
        drop(gateway.take());
        let started = launch.start(&format!("gateway-{start}")).await?;
        footprint.ready.push(started.ready_after);
        gateway = Some(started);
    }
    let mut gateway = gateway.context("no gateway started")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    footprint.idle_rss_kib = gateway.proc.rss_kib()?;
    println!(
        "gateway ready after {:?} (of {} starts); idle RSS {} KiB",
        footprint.ready, options.starts, footprint.idle_rss_kib
    );

    let mut cases = Vec::new();
    for &size in &options.sizes {
        let value = Bytes::from(vec![b'v'; size]);
        let key = format!("bench-{size}");
        for op in [Op::Set, Op::Get] {
            let mut case = Case {
                op: Some(op),
                size,
                ..Case::default()
            };
            let request = direct::request(op, &key, &value);
            case.direct_seq =
                direct::measure(&pool, request.clone(), size, 1, options.direct).await?;
            let before = [emulator.cpu_ticks()?, broker.cpu_ticks()?];
            let machine_before = proc_fs::machine_ticks()?;
            case.direct_sat =
                direct::measure(&pool, request, size, CONCURRENCY, options.direct).await?;
            case.machine_busy.0 = proc_fs::busy_cores(machine_before, proc_fs::machine_ticks()?);
            let seconds = case.direct_sat.elapsed.as_secs_f64();
            case.direct_sat_cores = [
                case.direct_sat.cpu_seconds.unwrap_or_default() / seconds,
                (emulator.cpu_ticks()? - before[0]) as f64 / ticks / seconds,
                (broker.cpu_ticks()? - before[1]) as f64 / ticks / seconds,
            ];
            let url = format!("http://{}/keys/{key}", gateway.api);
            case.gateway_seq = observed(
                &tools,
                &dir_path,
                &options,
                op,
                size,
                &url,
                1,
                &gateway.proc,
                &[],
            )
            .await?
            .0;
            let machine_before = proc_fs::machine_ticks()?;
            let (sat, others) = observed(
                &tools,
                &dir_path,
                &options,
                op,
                size,
                &url,
                CONCURRENCY,
                &gateway.proc,
                &[&emulator, &broker],
            )
            .await?;
            case.machine_busy.1 = proc_fs::busy_cores(machine_before, proc_fs::machine_ticks()?);
            let seconds = sat.elapsed.as_secs_f64();
            case.gateway_sat_cores = [
                sat.cpu_seconds.unwrap_or_default() / seconds,
                others[0] / ticks / seconds,
                others[1] / ticks / seconds,
            ];
            case.gateway_sat = sat;
            gateway.proc.check_alive()?;
            println!("{}", case_line(&case));
            cases.push(case);
        }
    }
    footprint.peak_rss_kib = cases
        .iter()
        .filter_map(|case| case.gateway_sat.peak_rss_kib)
        .max()
        .unwrap_or_default();

    if options.keys {
        footprint.after_load_rss_kib = gateway.proc.rss_kib()?;
        let livez = format!("http://{}/livez", gateway.admin);
        let (floor, _) = observed(
            &tools,
            &dir_path,
            &options,
            Op::Get,
            0,
            &livez,
            1,
            &gateway.proc,
            &[],
        )
        .await?;
        footprint.http_floor = Some(floor);
    }
    drop(gateway);

    // The peer, on the same machine with the same wrk runs.
    if let (Some(redis), Some(webdis)) = (&tools.redis, &tools.webdis) {
        emulator.check_alive()?;
        let (_redis, redis_port) = procs::start_redis(redis, &dir_path)?;
        let (mut webdis, webdis_port) = procs::start_webdis(webdis, &dir_path, redis_port)?;
        for case in &mut cases {
            let op = case.op.context("case without op")?;
            let key = format!("bench-{}", case.size);
            let url = match op {
                Op::Set => format!("http://127.0.0.1:{webdis_port}/SET/{key}"),
                Op::Get => format!("http://127.0.0.1:{webdis_port}/GET/{key}.txt"),
            };
            for connections in [1, CONCURRENCY] {
                let (run, _) = observed(
                    &tools,
                    &dir_path,
                    &options,
                    op,
                    case.size,
                    &url,
                    connections,
                    &webdis,
                    &[],
                )
                .await?;
                match connections {
                    1 => case.peer_seq = Some(run),
                    _ => case.peer_sat = Some(run),
                }
            }
            webdis.check_alive()?;
        }
    }

    let cpu = if options.cpu {
        let cpu =
            cpu_against_webdis(&tools, &dir_path, &options, &launch, &emulator, &broker).await?;
        println!("{}", cpu.summary());
        Some(cpu)
    } else {
        None
    };

    // Watch fan-out on a fresh gateway, so the load above does not blur its memory figures.
    let watch_gateway = launch.start("gateway-watch").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut fanouts = Vec::new();
    let mut runs = vec![Server::Gateway(&watch_gateway)];
    let nchan = match (&tools.nchan, options.watchers.iter().max()) {
        (Some(nginx), Some(&most)) => Some(procs::start_nchan(nginx, &dir_path, most + 1024)?),
        _ => None,
    };
    if let Some((proc, port)) = &nchan {
        runs.push(Server::Nchan {
            proc,
            addr: SocketAddr::from(([127, 0, 0, 1], *port)),
        });
    }
    // Both servers' watchers are connected together and their rounds
    // alternate, when this program may open that many sockets.
    for &watchers in &options.watchers {
        for report in fan_out(&runs, watchers, options.rounds, options.settle).await? {
            println!(
                "{}, {watchers} watchers: connected in {:?}, p50 {:.0} us p99 {:.0} us max {:.0} us, rounds' p99 {:.0?} us, missing {}, RSS {} -> {} -> {} -> {} KiB, PSS {} KiB",
                report.server,
                report.connect_time,
                report.latency.p50,
                report.latency.p99,
                report.latency.max,
                report.round_p99s,
                report.missing,
                report.rss_before_kib,
                report.rss_during_kib,
                report.rss_after_kib,
                report.rss_settled_kib,
                report.pss_during_kib,
            );
            fanouts.push(report);
        }
    }
    drop(nchan);
    drop(watch_gateway);

    // Lock hand-over on a fresh gateway, then etcd's when installed.
    let mut handovers: Vec<HandoverReport> = Vec::new();
    if !options.lock_waiters.is_empty() {
        let lock_gateway = launch.start("gateway-locks").await?;
        for &waiters in &options.lock_waiters {
            let report =
                support::locks::gateway_handover(&lock_gateway, waiters, options.lock_rounds)
                    .await?;
            println!("{}", support::locks::line(&report));
            handovers.push(report);
        }
        drop(lock_gateway);
        if let Some(etcd) = procs::find_program(&["etcd"]) {
            let etcd = support::locks::start_etcd(&etcd, &dir_path)?;
            for &waiters in &options.lock_waiters {
                let report =
                    support::locks::etcd_handover(&etcd, waiters, options.lock_rounds).await?;
                println!("{}", support::locks::line(&report));
                handovers.push(report);
            }
        }
    }
    pool.shutdown().await;
    emulator.check_alive()?;
    broker.check_alive()?;

    check(&cases, &footprint, cpu.as_ref(), &fanouts, &options)?;
    let report = report(
        &options,
        &machine,
        &cases,
        &footprint,
        cpu.as_ref(),
        &fanouts,
        started.elapsed(),
    ) + &support::locks::report(&handovers);
    println!("\n{report}");
    if let Some(path) = &options.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
        println!("report written to {}", path.display());
    }
    Ok(())
}

/// Value size of the CPU comparison's GETs.
const CPU_VALUE_BYTES: usize = 16;

/// Keep-alive connections of the fixed-rate load.
const RATE_CONNECTIONS: u32 = 4;

/// The CPU comparison: a fresh gateway and, when installed, a fresh webdis
/// in front of redis-server, both serving a GET of a 16 B value. Both sit
/// idle for `--idle` seconds, then each round loads one and then the other:
/// wrk at saturation, then the fixed rate.
async fn cpu_against_webdis(
    tools: &Tools,
    dir: &std::path::Path,
    options: &Options,
    launch: &GatewayLaunch<'_>,
    emulator: &Proc,
    broker: &Proc,
) -> Result<CpuComparison> {
    let ticks = proc_fs::clock_ticks_per_second() as f64;
    let value = vec![b'v'; CPU_VALUE_BYTES];
    let gateway = launch.start("gateway-cpu").await?;
    let gateway_path = format!("/keys/cpu-{CPU_VALUE_BYTES}");
    let put = request_once(gateway.api, "PUT", &gateway_path, &value).await?;
    if !(200..300).contains(&put.status) {
        bail!("PUT {gateway_path} on the gateway: status {}", put.status);
    }
    let webdis_path = format!("/GET/cpu-{CPU_VALUE_BYTES}.txt");
    let peer = match (&tools.redis, &tools.webdis) {
        (Some(redis), Some(webdis)) => {
            let (redis, redis_port) = procs::start_redis(redis, dir)?;
            let (webdis, port) = procs::start_webdis(webdis, dir, redis_port)?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let set =
                request_once(addr, "PUT", &format!("/SET/cpu-{CPU_VALUE_BYTES}"), &value).await?;
            if set.status != 200 {
                bail!("PUT /SET on webdis: status {}", set.status);
            }
            Some((redis, webdis, addr))
        }
        _ => None,
    };

    let gateway_before = gateway.proc.cpu_ticks()?;
    let webdis_before = match &peer {
        Some((_, webdis, _)) => Some(webdis.cpu_ticks()?),
        None => None,
    };
    let idle_started = Instant::now();
    tokio::time::sleep(options.idle).await;
    let mut idle = Idle {
        window: idle_started.elapsed(),
        gateway: (gateway.proc.cpu_ticks()? - gateway_before) as f64 / ticks,
        webdis: None,
        tick: 1.0 / ticks,
    };
    if let (Some((_, webdis, _)), Some(before)) = (&peer, webdis_before) {
        idle.webdis = Some((webdis.cpu_ticks()? - before) as f64 / ticks);
    }

    let mut comparison = CpuComparison {
        value_bytes: CPU_VALUE_BYTES,
        rate: options.rate,
        rate_connections: RATE_CONNECTIONS,
        connections: CONCURRENCY,
        idle,
        rounds: Vec::new(),
    };
    let gateway_url = format!("http://{}{gateway_path}", gateway.api);
    for _ in 0..options.cpu_rounds {
        let mut round = CpuRound::default();
        let (sat, store) = observed(
            tools,
            dir,
            options,
            Op::Get,
            CPU_VALUE_BYTES,
            &gateway_url,
            CONCURRENCY,
            &gateway.proc,
            &[emulator, broker],
        )
        .await?;
        round.gateway_sat = sat;
        round.gateway_store_sat = store.iter().sum::<f64>() / ticks;
        round.gateway_fixed =
            fixed_with_cpu(&gateway.proc, gateway.api, &gateway_path, options).await?;
        if let Some((redis, webdis, addr)) = &peer {
            let url = format!("http://{addr}{webdis_path}");
            let (sat, store) = observed(
                tools,
                dir,
                options,
                Op::Get,
                CPU_VALUE_BYTES,
                &url,
                CONCURRENCY,
                webdis,
                &[redis],
            )
            .await?;
            round.webdis_sat = Some(sat);
            round.webdis_store_sat = store.iter().sum::<f64>() / ticks;
            round.webdis_fixed = Some(fixed_with_cpu(webdis, *addr, &webdis_path, options).await?);
        }
        comparison.rounds.push(round);
    }
    Ok(comparison)
}

/// The fixed-rate load against `addr`, with `server`'s CPU time meanwhile.
async fn fixed_with_cpu(
    server: &Proc,
    addr: SocketAddr,
    path: &str,
    options: &Options,
) -> Result<Measurement> {
    let before = server.cpu_ticks()?;
    let mut run = fixed_rate(
        addr,
        path,
        options.rate,
        options.rate_time,
        RATE_CONNECTIONS,
    )
    .await?;
    run.cpu_seconds =
        Some((server.cpu_ticks()? - before) as f64 / proc_fs::clock_ticks_per_second() as f64);
    Ok(run)
}

/// A wrk run against `url` while sampling `server`'s memory; returns the
/// measurement (with the server's CPU time and peak RSS) and the CPU ticks
/// `others` (emulator, broker) used meanwhile.
#[allow(clippy::too_many_arguments)]
async fn observed(
    tools: &Tools,
    dir: &std::path::Path,
    options: &Options,
    op: Op,
    size: usize,
    url: &str,
    connections: usize,
    server: &Proc,
    others: &[&Proc],
) -> Result<(Measurement, Vec<f64>)> {
    let spec = WrkRun {
        // One wrk thread per core when saturating, one for one connection.
        threads: connections.min(std::thread::available_parallelism().map_or(2, usize::from)),
        connections,
        seconds: options.seconds,
        method: match op {
            Op::Get => "GET",
            Op::Set => "PUT",
        },
        body_bytes: size,
        url: url.to_owned(),
    };
    let cpu_before = server.cpu_ticks()?;
    let others_before = others
        .iter()
        .map(|proc| proc.cpu_ticks())
        .collect::<Result<Vec<_>>>()?;
    let wrk_path = tools.wrk.clone();
    let dir = dir.to_owned();
    let mut running = tokio::task::spawn_blocking(move || wrk::run(&wrk_path, &dir, &spec));
    let mut peak = server.rss_kib()?;
    let mut sampling = tokio::time::interval(Duration::from_millis(50));
    let mut measurement = loop {
        tokio::select! {
            done = &mut running => break done.context("wrk thread panicked")??,
            _ = sampling.tick() => peak = peak.max(server.rss_kib()?),
        }
    };
    let ticks = proc_fs::clock_ticks_per_second() as f64;
    measurement.cpu_seconds = Some((server.cpu_ticks()? - cpu_before) as f64 / ticks);
    measurement.peak_rss_kib = Some(peak.max(server.rss_kib()?));
    let others_ticks = others
        .iter()
        .zip(others_before)
        .map(|(proc, before)| Ok((proc.cpu_ticks()? - before) as f64))
        .collect::<Result<Vec<_>>>()?;
    Ok((measurement, others_ticks))
}

fn case_line(case: &Case) -> String {
    let added = case.added();
    format!(
        "{} {:>6} B: direct {:.0}/{:.0} us {:.0} req/s sat | gateway {:.0}/{:.0} us {:.0} req/s sat | added p50 {:+.0} us p99 {:+.0} us | ratio {:.2} | errors {}",
        case.op.map_or("?", Op::name),
        case.size,
        case.direct_seq.latency.p50,
        case.direct_seq.latency.p99,
        case.direct_sat.rate(),
        case.gateway_seq.latency.p50,
        case.gateway_seq.latency.p99,
        case.gateway_sat.rate(),
        added.p50,
        added.p99,
        case.ratio(),
        case.direct_seq.errors
            + case.direct_sat.errors
            + case.gateway_seq.errors
            + case.gateway_sat.errors,
    )
}

/// What a run must get right whatever the timings: every request
/// succeeded and every watcher got every event. (No timing is asserted.)
fn check(
    cases: &[Case],
    footprint: &Footprint,
    cpu: Option<&CpuComparison>,
    fanouts: &[FanoutReport],
    options: &Options,
) -> Result<()> {
    let mut problems = Vec::new();
    for case in cases {
        let name = format!("{} {} B", case.op.map_or("?", Op::name), case.size);
        let runs = [
            ("direct sequential", Some(&case.direct_seq)),
            ("direct pipelined", Some(&case.direct_sat)),
            ("gateway 1 connection", Some(&case.gateway_seq)),
            ("gateway saturated", Some(&case.gateway_sat)),
            ("webdis 1 connection", case.peer_seq.as_ref()),
            ("webdis saturated", case.peer_sat.as_ref()),
        ];
        for (path, run) in runs {
            let Some(run) = run else { continue };
            if run.requests == 0 {
                problems.push(format!("{name}, {path}: no request completed"));
            }
            if run.errors > 0 {
                problems.push(format!("{name}, {path}: {} failed requests", run.errors));
            }
        }
    }
    if let Some(floor) = &footprint.http_floor
        && (floor.requests == 0 || floor.errors > 0)
    {
        problems.push(format!(
            "GET /livez: {} done, {} failed",
            floor.requests, floor.errors
        ));
    }
    for (index, round) in cpu.iter().flat_map(|cpu| cpu.rounds.iter()).enumerate() {
        let runs = [
            ("gateway saturated", Some(&round.gateway_sat)),
            ("gateway fixed rate", Some(&round.gateway_fixed)),
            ("webdis saturated", round.webdis_sat.as_ref()),
            ("webdis fixed rate", round.webdis_fixed.as_ref()),
        ];
        for (path, run) in runs {
            let Some(run) = run else { continue };
            if run.requests == 0 || run.errors > 0 {
                problems.push(format!(
                    "CPU round {}, {path}: {} done, {} failed",
                    index + 1,
                    run.requests,
                    run.errors
                ));
            }
        }
    }
    for fanout in fanouts {
        if fanout.missing > 0 {
            problems.push(format!(
                "{}, {} watchers: {} events never arrived",
                fanout.server, fanout.watchers, fanout.missing
            ));
        }
    }
    let gateway_fanouts = fanouts.iter().filter(|f| f.server == "gateway").count();
    if options.watchers.len() != gateway_fanouts {
        problems.push("a fan-out size did not run".into());
    }
    if problems.is_empty() {
        return Ok(());
    }
    bail!("the run is not valid:\n  {}", problems.join("\n  "))
}

/// The machine, tools and command, for the report.
fn machine(tools: &Tools, options: &Options) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or("unknown".to_owned(), |(_, model)| model.trim().to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = proc_fs::kib_field("/proc/meminfo", "MemTotal:")
        .ok()
        .map_or("unknown".to_owned(), |kib| {
            format!("{:.0} GiB", kib as f64 / 1048576.0)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "- CPU: {model}, {cores} cores; memory {memory}; Linux {}",
        kernel.trim()
    );
    let _ = writeln!(
        text,
        "- load average (1, 5, 15 min) at the start: {}",
        load.join(", ")
    );
    let _ = writeln!(
        text,
        "- build: {} (gateway binary and this program); commit {commit}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let _ = writeln!(
        text,
        "- {}; {}",
        procs::version_line(&tools.mosquitto, "-h"),
        procs::version_line(&tools.wrk, "-v")
    );
    if let (Some(redis), Some(_)) = (&tools.redis, &tools.webdis) {
        let webdis = std::process::Command::new("dpkg-query")
            .args(["-W", "-f", "${Version}", "webdis"])
            .output()
            .ok()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "- {}; webdis {webdis}",
            procs::version_line(redis, "--version")
        );
    }
    let _ = writeln!(
        text,
        "- each wrk run {} s, each direct run {:.2} s; wrk: 1 thread x 1 connection, and {} threads x {CONCURRENCY} connections; direct: 1 and {CONCURRENCY} requests in flight; pool of {POOL_SIZE} MQTT connections on both paths",
        options.seconds,
        options.direct.as_secs_f64(),
        CONCURRENCY.min(cores.max(1)),
    );
    text
}

fn cores(split: &[f64; 3]) -> String {
    format!("{:.2} + {:.2} + {:.2}", split[0], split[1], split[2])
}

fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn size_name(size: usize) -> String {
    match size {
        s if s >= 1024 && s % 1024 == 0 => format!("{} KiB", s / 1024),
        s => format!("{s} B"),
    }
}

fn yes(met: bool) -> &'static str {
    if met { "yes" } else { "**no**" }
}

fn report(
    options: &Options,
    machine: &str,
    cases: &[Case],
    footprint: &Footprint,
    cpu: Option<&CpuComparison>,
    fanouts: &[FanoutReport],
    took: Duration,
) -> String {
    let mut out = String::new();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let _ = writeln!(
        out,
        "### Machine and run\n\n{machine}- load average at the end: {}; the run took {:.0} s\n",
        load.join(", "),
        took.as_secs_f64()
    );

    let _ = writeln!(out, "### Latency, one request at a time (ms)\n");
    let _ = writeln!(
        out,
        "Direct: the pool in the benchmark process. Gateway: wrk, 1 connection. Added: gateway minus direct.\n"
    );
    let _ = writeln!(
        out,
        "| Op | Value | Path | p50 | p90 | p99 | p99.9 | req/s |"
    );
    let _ = writeln!(out, "|---|---|---|--:|--:|--:|--:|--:|");
    for case in cases {
        let op = case.op.map_or("?", Op::name);
        let size = size_name(case.size);
        for (path, run) in [("direct", &case.direct_seq), ("gateway", &case.gateway_seq)] {
            let l = &run.latency;
            let _ = writeln!(
                out,
                "| {op} | {size} | {path} | {} | {} | {} | {} | {:.0} |",
                ms(l.p50),
                ms(l.p90),
                ms(l.p99),
                ms(l.p999),
                run.rate()
            );
        }
        let a = case.added();
        let _ = writeln!(
            out,
            "| {op} | {size} | **added** | **{}** | **{}** | **{}** | **{}** | |",
            ms(a.p50),
            ms(a.p90),
            ms(a.p99),
            ms(a.p999)
        );
    }

    if let Some(floor) = &footprint.http_floor {
        let l = &floor.latency;
        let _ = writeln!(
            out,
            "\nOne HTTP hop with no store call (wrk, 1 connection, `GET /livez` on the gateway's admin port): p50 {} ms, p90 {} ms, p99 {} ms, p99.9 {} ms, {:.0} req/s.",
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.p999),
            floor.rate()
        );
    }
    let _ = writeln!(
        out,
        "\n### Throughput, saturated ({CONCURRENCY} in flight)\n"
    );
    let _ = writeln!(
        out,
        "| Op | Value | direct req/s | gateway req/s | gateway / direct | gateway p50 ms | gateway p99 ms | gateway CPU us/req | cores, direct: pool + emulator + broker | cores, gateway: gateway + emulator + broker | machine busy cores, direct / gateway | webdis req/s | gateway / webdis |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for case in cases {
        let sat = &case.gateway_sat;
        let peer = case
            .peer_sat
            .as_ref()
            .map_or("-".into(), |p| format!("{:.0}", p.rate()));
        let versus = case
            .peer_sat
            .as_ref()
            .map_or("-".into(), |p| format!("{:.2}", sat.rate() / p.rate()));
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {} | {} | {:.2} / {:.2} | {peer} | {versus} |",
            case.op.map_or("?", Op::name),
            size_name(case.size),
            case.direct_sat.rate(),
            sat.rate(),
            case.ratio(),
            ms(sat.latency.p50),
            ms(sat.latency.p99),
            sat.cpu_us_per_request()
                .map_or("-".into(), |us| format!("{us:.0}")),
            cores(&case.direct_sat_cores),
            cores(&case.gateway_sat_cores),
            case.machine_busy.0,
            case.machine_busy.1,
        );
    }

    if cases.iter().any(|case| case.peer_seq.is_some()) {
        let _ = writeln!(
            out,
            "\n### Peer: webdis + redis-server, same wrk runs (ms)\n"
        );
        let _ = writeln!(
            out,
            "| Op | Value | webdis p50 (1 conn) | webdis p99 (1 conn) | gateway p50 (1 conn) | gateway p99 (1 conn) | webdis req/s ({CONCURRENCY} conns) | gateway req/s ({CONCURRENCY} conns) |"
        );
        let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|");
        for case in cases {
            let (Some(seq), Some(sat)) = (&case.peer_seq, &case.peer_sat) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.0} | {:.0} |",
                case.op.map_or("?", Op::name),
                size_name(case.size),
                ms(seq.latency.p50),
                ms(seq.latency.p99),
                ms(case.gateway_seq.latency.p50),
                ms(case.gateway_seq.latency.p99),
                sat.rate(),
                case.gateway_sat.rate(),
            );
        }
    }

    if let Some(cpu) = cpu {
        let _ = writeln!(out, "\n{}", cpu.markdown());
    }

    let _ = writeln!(
        out,
        "\n### Watch fan-out (one key, {} writes per size; ms from the write's request to the event at each watcher; RSS summed over the server's processes, PSS counts shared pages once)\n",
        options.rounds
    );
    let _ = writeln!(
        out,
        "| Server | Watchers | connect all | events | missing | p50 | p99 | max | server CPU us/event | client CPU us/event | RSS before MiB | RSS during MiB | PSS during MiB | RSS 1 s after MiB | RSS {} s after MiB |",
        options.settle.as_secs()
    );
    let _ = writeln!(
        out,
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for f in fanouts {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} s | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} |",
            f.server,
            f.watchers,
            f.connect_time.as_secs_f64(),
            f.deliveries,
            f.missing,
            ms(f.latency.p50),
            ms(f.latency.p99),
            ms(f.latency.max),
            f.server_cpu_us_per_event,
            f.client_cpu_us_per_event,
            mib(f.rss_before_kib),
            mib(f.rss_during_kib),
            mib(f.pss_during_kib),
            mib(f.rss_after_kib),
            mib(f.rss_settled_kib),
        );
    }

    let mut ready = footprint.ready.clone();
    ready.sort_unstable();
    let ready_median = ready.get(ready.len() / 2).copied().unwrap_or_default();
    let ready_max = ready.last().copied().unwrap_or_default();
    let _ = writeln!(out, "\n### Footprint\n");
    let _ = writeln!(out, "| Measure | Value |");
    let _ = writeln!(out, "|---|--:|");
    let _ = writeln!(
        out,
        "| start to `/readyz` 200, median of {} starts | {:.1} ms (max {:.1} ms) |",
        ready.len(),
        ready_median.as_secs_f64() * 1e3,
        ready_max.as_secs_f64() * 1e3
    );
    let _ = writeln!(
        out,
        "| RSS idle (ready, 1 s later) | {} MiB |",
        mib(footprint.idle_rss_kib)
    );
    if options.keys {
        let _ = writeln!(
            out,
            "| RSS peak under the saturated runs | {} MiB |",
            mib(footprint.peak_rss_kib)
        );
        let _ = writeln!(
            out,
            "| RSS after the load | {} MiB |",
            mib(footprint.after_load_rss_kib)
        );
        if let Some(get) = cases.iter().find(|c| c.op == Some(Op::Get))
            && let Some(us) = get.gateway_sat.cpu_us_per_request()
        {
            let _ = writeln!(
                out,
                "| CPU per 1,000 req/s at saturation (GET {}, CPU s per request x 1000) | {us:.0} mCPU |",
                size_name(get.size)
            );
        }
    }

    // The targets of the issue, against the worst case measured.
    let worst = |f: &dyn Fn(&Case) -> f64| cases.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
    let added_p50 = worst(&|c| c.added().p50);
    let added_p99 = worst(&|c| c.added().p99);
    let small_added_p50 = cases
        .iter()
        .filter(|c| c.size <= 1024)
        .map(|c| c.added().p50)
        .fold(f64::NEG_INFINITY, f64::max);
    let small_added_p99 = cases
        .iter()
        .filter(|c| c.size <= 1024)
        .map(|c| c.added().p99)
        .fold(f64::NEG_INFINITY, f64::max);
    let min_ratio = cases.iter().map(Case::ratio).fold(f64::INFINITY, f64::min);
    let _ = writeln!(out, "\n### Targets\n");
    let _ = writeln!(out, "| Target | Measured (worst case) | Met |");
    let _ = writeln!(out, "|---|--:|---|");
    if !cases.is_empty() && small_added_p50.is_finite() {
        let _ = writeln!(
            out,
            "| added p50 <= 0.05 ms (16 B, 1 KiB) | {} ms | {} |",
            ms(small_added_p50),
            yes(small_added_p50 <= 50.0)
        );
        let _ = writeln!(
            out,
            "| added p99 <= 0.2 ms (16 B, 1 KiB) | {} ms | {} |",
            ms(small_added_p99),
            yes(small_added_p99 <= 200.0)
        );
    }
    if !cases.is_empty() {
        let _ = writeln!(
            out,
            "| added p50 <= 0.05 ms (all sizes) | {} ms | {} |",
            ms(added_p50),
            yes(added_p50 <= 50.0)
        );
        let _ = writeln!(
            out,
            "| added p99 <= 0.2 ms (all sizes) | {} ms | {} |",
            ms(added_p99),
            yes(added_p99 <= 200.0)
        );
        let _ = writeln!(
            out,
            "| saturated gateway / direct >= 0.9 | {min_ratio:.2} | {} |",
            yes(min_ratio >= 0.9)
        );
    }
    let ours = fanouts.iter().filter(|f| f.server == "gateway");
    if let Some(big) = ours.clone().max_by_key(|f| f.watchers) {
        let _ = writeln!(
            out,
            "| {} watchers: p99 delivery < 50 ms | {} ms | {} |",
            big.watchers,
            ms(big.latency.p99),
            yes(big.latency.p99 < 50_000.0)
        );
        let _ = writeln!(
            out,
            "| {} watchers: RSS <= 64 MiB | {} MiB | {} |",
            big.watchers,
            mib(big.rss_during_kib),
            yes(big.rss_during_kib <= 64 * 1024)
        );
        // The same run's nchan with as many subscribers.
        if let Some(nchan) = fanouts
            .iter()
            .find(|f| f.server != "gateway" && f.watchers == big.watchers)
        {
            // The gateway's RSS against nginx's RSS summed over its
            // processes (as nchan's memory is usually quoted), then against
            // nginx's PSS, which counts its shared pages once. The
            // gateway's own PSS would flatter it: it shares its code with
            // the emulator, which runs the same binary.
            let memory = big.rss_during_kib as f64 / nchan.rss_during_kib.max(1) as f64;
            let _ = writeln!(
                out,
                "| {} watchers: RSS <= 0.2x nginx + nchan's (summed) | {} MiB against {} MiB: {memory:.2}x | {} |",
                big.watchers,
                mib(big.rss_during_kib),
                mib(nchan.rss_during_kib),
                yes(memory <= 0.2)
            );
            let strict = big.rss_during_kib as f64 / nchan.pss_during_kib.max(1) as f64;
            let _ = writeln!(
                out,
                "| {} watchers: RSS against nginx + nchan's PSS | {} MiB against {} MiB: {strict:.2}x | |",
                big.watchers,
                mib(big.rss_during_kib),
                mib(nchan.pss_during_kib),
            );
            let p99 = big.latency.p99 / nchan.latency.p99.max(1.0);
            let _ = writeln!(
                out,
                "| {} watchers: p99 delivery <= nginx + nchan's | {} ms against {} ms: {p99:.2}x | {} |",
                big.watchers,
                ms(big.latency.p99),
                ms(nchan.latency.p99),
                yes(p99 <= 1.0)
            );
            // Round i of one against round i of the other: the pooled p99
            // above is mostly the slowest round's.
            let ratios = big
                .round_p99s
                .iter()
                .zip(&nchan.round_p99s)
                .map(|(ours, theirs)| ours / theirs.max(1.0));
            if let Some((paired, low, high)) = median_low_high(ratios) {
                let rounds = if big.beside && nchan.beside {
                    "alternating"
                } else {
                    "one server's after the other's"
                };
                let _ = writeln!(
                    out,
                    "| {} watchers: p99 delivery <= nginx + nchan's, round by round ({rounds}) | median of the rounds' ratios {paired:.2}x (from {low:.2}x to {high:.2}x) | {} |",
                    big.watchers,
                    yes(paired <= 1.0)
                );
            }
        }
        // Idle: the fresh watch gateway before its first watcher.
        let idle = ours
            .clone()
            .next()
            .map_or(big.rss_before_kib, |f| f.rss_before_kib);
        let limit = idle as f64 * 1.1;
        let _ = writeln!(
            out,
            "| back to idle RSS (+10%) after they leave | idle {} MiB; {} MiB 1 s after, {} MiB {} s after | {} |",
            mib(idle),
            mib(big.rss_after_kib),
            mib(big.rss_settled_kib),
            options.settle.as_secs(),
            yes(big.rss_settled_kib as f64 <= limit)
        );
    }
    if let Some(cpu) = cpu {
        let m = cpu.medians();
        if let (Some(ours), Some(theirs)) = (m[0], m[1]) {
            let _ = writeln!(
                out,
                "| CPU per request at saturation <= webdis' (median) | {ours:.1} us against {theirs:.1} us | {} |",
                yes(ours <= theirs)
            );
        }
        if let Some(ours) = m[4].filter(|_| cpu.rate == 1000) {
            let theirs = m[5].map_or(String::new(), |theirs| format!(" (webdis {theirs:.0})"));
            let met = ours <= DAPR.2 && m[5].is_none_or(|theirs| ours <= theirs);
            let _ = writeln!(
                out,
                "| mCPU at {} req/s <= webdis' and <= {} (median) | {ours:.0}{theirs} | {} |",
                cpu.rate,
                DAPR.2,
                yes(met)
            );
        }
    }
    let _ = writeln!(
        out,
        "| idle RSS <= 15 MiB | {} MiB | {} |",
        mib(footprint.idle_rss_kib),
        yes(footprint.idle_rss_kib <= 15 * 1024)
    );
    let _ = writeln!(
        out,
        "| ready within 100 ms | {:.1} ms (max {:.1}) | {} |",
        ready_median.as_secs_f64() * 1e3,
        ready_max.as_secs_f64() * 1e3,
        yes(ready_max <= Duration::from_millis(100))
    );
    let _ = writeln!(
        out,
        "\nDapr's sidecar for comparison (its own report, HTTP state GET at 1,000 QPS): +{} ms p50, +{} ms p99, {} mCPU, {} MB.",
        DAPR.0, DAPR.1, DAPR.2, DAPR.3
    );
    out
}
