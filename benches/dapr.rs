//! What Dapr's HTTP API costs beside the key API, measured in one run.
//!
//! Starts mosquitto, the emulator and `statestore-gateway serve` as their
//! own processes, then on one keep-alive connection, one request at a time:
//!
//! 1. **reads**: `GET /keys/k` against Dapr's `GET /v1.0/state/statestore/k`
//!    of the same 16-byte value: latency percentiles and the gateway's own
//!    CPU per request (from `/proc`), as ratios Dapr / `/keys`;
//! 2. **saves**: a Dapr save without an etag against one with the key's
//!    current etag (read by a bulk get before each, not timed): latency and
//!    the store round trips each costs (the gateway's store request count).
//!
//! `scripts/bench --dapr` runs it (release build); `scripts/bench --smoke`
//! runs a small version on the debug build that checks every answer and
//! asserts no timing.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use support::gateway::{GatewayLaunch, GatewayProc};
use support::http::HttpConn;
use support::procs;
use support::stats::Percentiles;

struct Options {
    requests: usize,
    smoke: bool,
    report: Option<PathBuf>,
}

impl Options {
    fn parse() -> Result<Option<Options>> {
        let Some((smoke, args)) = support::requested_args() else {
            return Ok(None);
        };
        let mut options = Options {
            requests: if smoke { 200 } else { 20_000 },
            smoke,
            report: None,
        };
        support::read_number_flags(
            args,
            &mut [("--requests", &mut options.requests)],
            &mut options.report,
        )?;
        if options.requests == 0 {
            bail!("--requests must be positive");
        }
        Ok(Some(options))
    }
}

fn main() -> ExitCode {
    support::main_with("dapr", Options::parse, run)
}

/// Latencies of `requests` requests and the gateway's CPU per request.
struct Run {
    latency: Percentiles,
    cpu_us: f64,
}

async fn timed(
    gateway: &GatewayProc,
    conn: &mut HttpConn,
    requests: usize,
    method: &str,
    path: &str,
    body: &[u8],
    expect: u16,
) -> Result<Run> {
    let mut samples = Vec::with_capacity(requests);
    let ticks = gateway.proc.cpu_ticks()?;
    for _ in 0..requests {
        let started = Instant::now();
        let response = conn.request(method, path, body).await?;
        samples.push(started.elapsed());
        if response.status != expect {
            bail!("{method} {path}: {} (expected {expect})", response.status);
        }
    }
    let used = gateway.proc.cpu_ticks()? - ticks;
    let cpu_us = used as f64 * 1e6 / procs::clock_ticks_per_second() as f64 / requests as f64;
    Ok(Run {
        latency: Percentiles::of(&mut samples),
        cpu_us,
    })
}

/// The gateway's store requests so far (every op and outcome).
async fn store_requests(gateway: &GatewayProc) -> Result<f64> {
    let response = support::http::request_once(gateway.admin, "GET", "/metrics", b"").await?;
    let text = String::from_utf8_lossy(&response.body);
    Ok(text
        .lines()
        .filter(|line| line.starts_with("statestore_gateway_store_request_duration_seconds_count"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

async fn run(options: Options) -> Result<()> {
    let mosquitto = procs::find_program(&["mosquitto"])
        .context("mosquitto is needed (scripts/bench installs it)")?;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway"));
    let dir = tempfile::Builder::new()
        .prefix("dapr-bench-")
        .tempdir()
        .context("a temporary directory")?;
    let (_broker, port) = procs::start_mosquitto(&mosquitto, dir.path())?;
    let _emulator = procs::start_emulator(&binary, dir.path(), port)?;
    let gateway = GatewayLaunch {
        binary: &binary,
        dir: dir.path(),
        broker_port: port,
        pool_size: 4,
        max_watchers: 1_000,
        env: &[],
    }
    .start("gateway")
    .await?;
    let mut conn = HttpConn::connect(gateway.api).await?;
    let n = options.requests;

    // The same 16 bytes under both names: "0123456789abcd" as JSON.
    let value = br#""0123456789abcd""#;
    let put = conn.request("PUT", "/keys/bench", value).await?;
    if put.status != 200 && put.status != 201 && put.status != 204 {
        bail!("PUT /keys/bench: {}", put.status);
    }
    // Warm both paths.
    timed(
        &gateway,
        &mut conn,
        n / 10 + 1,
        "GET",
        "/keys/bench",
        b"",
        200,
    )
    .await?;
    timed(
        &gateway,
        &mut conn,
        n / 10 + 1,
        "GET",
        "/v1.0/state/statestore/bench",
        b"",
        200,
    )
    .await?;
    let keys = timed(&gateway, &mut conn, n, "GET", "/keys/bench", b"", 200).await?;
    let dapr = timed(
        &gateway,
        &mut conn,
        n,
        "GET",
        "/v1.0/state/statestore/bench",
        b"",
        200,
    )
    .await?;

    let saves = (n / 4).max(10);
    let plain_body = br#"[{"key":"bench-save","value":"0123456789abcd"}]"#;
    let before = store_requests(&gateway).await?;
    let plain = timed(
        &gateway,
        &mut conn,
        saves,
        "POST",
        "/v1.0/state/statestore",
        plain_body,
        204,
    )
    .await?;
    let plain_trips = (store_requests(&gateway).await? - before) / saves as f64;

    let mut etag_samples = Vec::with_capacity(saves);
    let mut etag_trips = 0.0;
    for _ in 0..saves {
        let bulk = conn
            .request(
                "POST",
                "/v1.0/state/statestore/bulk",
                br#"{"keys":["bench-save"]}"#,
            )
            .await?;
        let items: serde_json::Value = serde_json::from_slice(&bulk.body).context("bulk JSON")?;
        let etag = items[0]["etag"].as_str().context("an etag")?.to_owned();
        let body = format!(
            r#"[{{"key":"bench-save","value":"0123456789abcd","etag":"{etag}","options":{{"concurrency":"first-write"}}}}]"#
        );
        let before = store_requests(&gateway).await?;
        let started = Instant::now();
        let response = conn
            .request("POST", "/v1.0/state/statestore", body.as_bytes())
            .await?;
        etag_samples.push(started.elapsed());
        etag_trips += store_requests(&gateway).await? - before;
        if response.status != 204 {
            bail!("etag save: {}", response.status);
        }
    }
    let etag = Percentiles::of(&mut etag_samples);
    let etag_trips = etag_trips / saves as f64;

    let us = |value: f64| format!("{value:.0} µs");
    let mut report = String::new();
    writeln!(
        report,
        "### Dapr's HTTP API beside the key API, one request at a time\n"
    )?;
    writeln!(report, "| request | p50 | p99 | gateway CPU per request |")?;
    writeln!(report, "|---|---:|---:|---:|")?;
    for (name, run) in [
        ("`GET /keys/k`", &keys),
        ("Dapr `GET /v1.0/state/statestore/k`", &dapr),
    ] {
        writeln!(
            report,
            "| {name} ({n} requests) | {} | {} | {} |",
            us(run.latency.p50),
            us(run.latency.p99),
            us(run.cpu_us)
        )?;
    }
    writeln!(
        report,
        "\nDapr GET / `/keys` GET: CPU per request {:.2}x, p50 {:.2}x, p99 {:.2}x.\n",
        dapr.cpu_us / keys.cpu_us,
        dapr.latency.p50 / keys.latency.p50,
        dapr.latency.p99 / keys.latency.p99
    )?;
    writeln!(
        report,
        "| Dapr save ({saves} each) | p50 | p99 | store round trips |"
    )?;
    writeln!(report, "|---|---:|---:|---:|")?;
    writeln!(
        report,
        "| without an etag | {} | {} | {plain_trips:.1} |",
        us(plain.latency.p50),
        us(plain.latency.p99)
    )?;
    writeln!(
        report,
        "| with the current etag (lease, read, claim, write, release) | {} | {} | {etag_trips:.1} |",
        us(etag.p50),
        us(etag.p99)
    )?;
    println!("\n{report}");
    if let Some(path) = &options.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if options.smoke {
        println!("dapr benchmark: smoke run passed (no timing asserted)");
    }
    Ok(())
}
