//! The key API's GET over each protocol, in one run: HTTP/1.1 and HTTP/2
//! with prior knowledge (h2c) on a plain gateway, HTTP/1.1 and HTTP/2 (by
//! ALPN) over TLS 1.3 on a gateway with a certificate. Every variant is
//! driven by the same client (reqwest, in this process) the same way:
//! one request at a time on one connection (latency), then 64 requests in
//! flight (HTTP/1.1: 64 connections; HTTP/2: one connection, 64 streams),
//! with the gateway's own CPU per request. Ratios are to plain HTTP/1.1.
//!
//! Starts mosquitto, the emulator and two `statestore-gateway serve`
//! processes (pool of 4; one with `--api-tls-cert-file`, a certificate
//! made here). The client shares the machine with the gateway, and TLS
//! costs it too: read the gateway's CPU per request for the server's
//! share, the rates and latencies for what a caller on the same host gets.
//!
//! `scripts/bench --protocols` runs it (release build); `scripts/bench
//! --smoke` runs a second of each on the debug build, checking that each
//! variant really is the protocol it names, and asserts no timing.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use support::gateway::{GatewayLaunch, GatewayProc};
use support::stats::{Percentiles, median};
use support::{proc_fs, procs};

/// Requests in flight for the saturated runs, as the gateway benchmark's.
const CONCURRENCY: usize = 64;

/// Bytes of the value read.
const VALUE_BYTES: usize = 16;

struct Options {
    seconds: Duration,
    rounds: usize,
    smoke: bool,
    report: Option<PathBuf>,
}

impl Options {
    fn parse() -> Result<Option<Options>> {
        let Some((smoke, args)) = support::requested_args() else {
            return Ok(None);
        };
        let mut seconds = if smoke { 1 } else { 5 };
        let mut options = Options {
            seconds: Duration::ZERO,
            rounds: if smoke { 1 } else { 3 },
            smoke,
            report: None,
        };
        support::read_number_flags(
            args,
            &mut [
                ("--seconds", &mut seconds),
                ("--rounds", &mut options.rounds),
            ],
            &mut options.report,
        )?;
        options.seconds = Duration::from_secs(seconds as u64);
        if options.seconds.is_zero() || options.rounds == 0 {
            bail!("--seconds and --rounds must be positive");
        }
        Ok(Some(options))
    }
}

fn main() -> ExitCode {
    support::main_with("protocols", Options::parse, run)
}

/// One way to reach the key API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Http1,
    H2c,
    TlsHttp1,
    TlsH2,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Http1,
        Variant::H2c,
        Variant::TlsHttp1,
        Variant::TlsH2,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Http1 => "HTTP/1.1",
            Variant::H2c => "HTTP/2 prior knowledge (h2c)",
            Variant::TlsHttp1 => "HTTP/1.1 over TLS 1.3",
            Variant::TlsH2 => "HTTP/2 over TLS 1.3 (ALPN)",
        }
    }

    fn tls(self) -> bool {
        matches!(self, Variant::TlsHttp1 | Variant::TlsH2)
    }

    fn version(self) -> reqwest::Version {
        match self {
            Variant::Http1 | Variant::TlsHttp1 => reqwest::Version::HTTP_11,
            Variant::H2c | Variant::TlsH2 => reqwest::Version::HTTP_2,
        }
    }

    fn client(self, ca: &reqwest::Certificate) -> Result<reqwest::Client> {
        let builder = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(CONCURRENCY);
        let builder = match self {
            Variant::Http1 => builder.http1_only(),
            Variant::H2c => builder.http2_prior_knowledge(),
            Variant::TlsHttp1 => tls(builder, ca).http1_only(),
            Variant::TlsH2 => tls(builder, ca),
        };
        builder.build().context("a client")
    }
}

fn tls(builder: reqwest::ClientBuilder, ca: &reqwest::Certificate) -> reqwest::ClientBuilder {
    builder
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca.clone())
        .min_tls_version(reqwest::tls::Version::TLS_1_3)
}

/// What one variant measured in one round.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    /// One request at a time on one connection.
    latency: Percentiles,
    sequential_rate: f64,
    /// 64 in flight.
    saturated_rate: f64,
    /// The gateway's CPU per request while saturated, in microseconds.
    cpu_us: f64,
}

async fn run(options: Options) -> Result<()> {
    let mosquitto = procs::find_program(&["mosquitto"])
        .context("mosquitto is needed (scripts/bench installs it)")?;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway"));
    let dir = tempfile::Builder::new()
        .prefix("protocols-bench-")
        .tempdir()
        .context("a temporary directory")?;
    let (_broker, port) = procs::start_mosquitto(&mosquitto, dir.path())?;
    let _emulator = procs::start_emulator(&binary, dir.path(), port).await?;

    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])?.self_signed(&key)?;
    let (cert_file, key_file) = (dir.path().join("api.crt"), dir.path().join("api.key"));
    std::fs::write(&cert_file, cert.pem())?;
    std::fs::write(&key_file, key.serialize_pem())?;
    let ca = reqwest::Certificate::from_pem(cert.pem().as_bytes())?;

    let launch = GatewayLaunch {
        binary: &binary,
        dir: dir.path(),
        broker_port: port,
        pool_size: 4,
        max_watchers: 1_000,
        env: &[],
    };
    let plain = launch.start("plain").await?;
    let tls_env = [
        (
            "STATESTORE_GATEWAY_API_TLS_CERT_FILE".to_owned(),
            cert_file.display().to_string(),
        ),
        (
            "STATESTORE_GATEWAY_API_TLS_KEY_FILE".to_owned(),
            key_file.display().to_string(),
        ),
    ];
    let tls = GatewayLaunch {
        env: &tls_env,
        ..launch
    }
    .start("tls")
    .await?;

    let mut rounds: Vec<[Figures; 4]> = Vec::new();
    for round in 0..options.rounds {
        let mut figures = [Figures::default(); 4];
        for (at, variant) in Variant::ALL.into_iter().enumerate() {
            let gateway = if variant.tls() { &tls } else { &plain };
            figures[at] = measure(variant, gateway, &ca, options.seconds).await?;
            println!(
                "protocols benchmark: round {}, {}: p50 {:.0} us, p99 {:.0} us, {:.0} req/s on 1 connection, {:.0} req/s with {CONCURRENCY} in flight, {:.1} us of gateway CPU per request",
                round + 1,
                variant.name(),
                figures[at].latency.p50,
                figures[at].latency.p99,
                figures[at].sequential_rate,
                figures[at].saturated_rate,
                figures[at].cpu_us,
            );
        }
        rounds.push(figures);
    }

    let report = report(&options, &rounds);
    println!("\n{report}");
    if let Some(path) = &options.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if options.smoke {
        println!("protocols benchmark: smoke run passed (no timing asserted)");
    }
    Ok(())
}

/// One variant: the value written, checked once, then timed.
async fn measure(
    variant: Variant,
    gateway: &GatewayProc,
    ca: &reqwest::Certificate,
    seconds: Duration,
) -> Result<Figures> {
    let scheme = if variant.tls() { "https" } else { "http" };
    let url = format!(
        "{scheme}://localhost:{}/keys/bench-{VALUE_BYTES}",
        gateway.api.port()
    );
    let value = vec![b'v'; VALUE_BYTES];
    let client = variant.client(ca)?;
    let put = client.put(&url).body(value.clone()).send().await?;
    if put.status() != 200 || put.version() != variant.version() {
        bail!(
            "{}: PUT answered {} over {:?}",
            variant.name(),
            put.status(),
            put.version()
        );
    }
    let get = |client: reqwest::Client, url: String| async move {
        let response = client.get(&url).send().await?;
        let ok = response.status() == 200;
        let body = response.bytes().await?;
        anyhow::ensure!(
            ok && body.len() == VALUE_BYTES,
            "GET answered {ok} {body:?}"
        );
        anyhow::Ok(())
    };

    // Warm-up on the client that is timed next: its connection is open.
    let started = Instant::now();
    while started.elapsed() < seconds / 5 {
        get(client.clone(), url.clone()).await?;
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < seconds {
        let sent = Instant::now();
        get(client.clone(), url.clone()).await?;
        samples.push(sent.elapsed());
    }
    let sequential_rate = samples.len() as f64 / started.elapsed().as_secs_f64();
    let latency = Percentiles::of(&mut samples);

    // Saturated: a fresh client, its connections opened by a warm-up.
    let client = variant.client(ca)?;
    saturate(&client, &url, seconds / 5, get).await?;
    let before = gateway.proc.cpu_ticks()?;
    let started = Instant::now();
    let requests = saturate(&client, &url, seconds, get).await? as f64;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu =
        (gateway.proc.cpu_ticks()? - before) as f64 / proc_fs::clock_ticks_per_second() as f64;
    Ok(Figures {
        latency,
        sequential_rate,
        saturated_rate: requests / elapsed,
        cpu_us: cpu * 1e6 / requests,
    })
}

/// [`CONCURRENCY`] tasks sending `get` for `length`; the requests done.
async fn saturate<F, Fut>(
    client: &reqwest::Client,
    url: &str,
    length: Duration,
    get: F,
) -> Result<u64>
where
    F: Fn(reqwest::Client, String) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, url) = (client.clone(), url.to_owned());
            let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    get(client.clone(), url.clone()).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.context("a load task")??;
    }
    Ok(done.load(Ordering::Relaxed))
}

fn report(options: &Options, rounds: &[[Figures; 4]]) -> String {
    let of = |at: usize, pick: fn(&Figures) -> f64| {
        median(
            &mut rounds
                .iter()
                .map(|round| pick(&round[at]))
                .collect::<Vec<_>>(),
        )
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## GET {VALUE_BYTES} B by protocol (median of {} rounds of {} s)\n",
        rounds.len(),
        options.seconds.as_secs()
    );
    let _ = writeln!(
        out,
        "| protocol | p50 us (1 conn) | p99 us (1 conn) | req/s, 1 conn | req/s, {CONCURRENCY} in flight | / HTTP/1.1 | gateway CPU us/req | / HTTP/1.1 |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|");
    let base_rate = of(0, |f| f.saturated_rate);
    let base_cpu = of(0, |f| f.cpu_us);
    for (at, variant) in Variant::ALL.into_iter().enumerate() {
        let rate = of(at, |f| f.saturated_rate);
        let cpu = of(at, |f| f.cpu_us);
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} | {:.2} |",
            variant.name(),
            of(at, |f| f.latency.p50),
            of(at, |f| f.latency.p99),
            of(at, |f| f.sequential_rate),
            rate,
            rate / base_rate,
            cpu,
            cpu / base_cpu,
        );
    }
    out
}
