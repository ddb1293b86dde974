//! `POST /batch` against the alternatives, in one run: 1,000 GETs in one
//! batch, the same 1,000 as one-key GETs one after the other on one
//! keep-alive connection, and the official client
//! (azure_iot_operations_services) doing the 1,000 gets concurrently; the
//! same for 1,000 SETs of 1 KiB values; and the gateway's peak RSS while it
//! runs a batch of 1,000 1 KiB SETs.
//!
//! Starts mosquitto, the emulator and `statestore-gateway serve` (pool of
//! 4) as their own processes and writes the keys (1 KiB values) first.
//! Reports the median of the rounds, and the ratios.
//!
//! `scripts/bench --batch` runs it (release build); `scripts/bench --smoke`
//! runs one small round on the debug build that checks every answer and
//! asserts no timing.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use azure_iot_operations_services::state_store;
use bytes::Bytes;
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use statestore_gateway::mqtt::RequestOptions;
use statestore_gateway::protocol::{Reply, Request, SetOptions};

use support::direct;
use support::gateway::GatewayLaunch;
use support::http::HttpConn;
use support::memory::PeakRss;
use support::procs;
use support::sdk::Sdk;
use support::stats::median;

/// Bytes of every value.
const VALUE_BYTES: usize = 1024;

/// How long the official client waits for each reply.
const SDK_TIMEOUT: Duration = Duration::from_secs(10);

struct Options {
    ops: usize,
    rounds: usize,
    smoke: bool,
    report: Option<PathBuf>,
}

impl Options {
    fn parse() -> Result<Option<Options>> {
        let Some((smoke, args)) = support::requested_args() else {
            return Ok(None);
        };
        let mut options = Options {
            ops: if smoke { 100 } else { 1_000 },
            rounds: if smoke { 1 } else { 7 },
            smoke,
            report: None,
        };
        support::read_number_flags(
            args,
            &mut [
                ("--ops", &mut options.ops),
                ("--rounds", &mut options.rounds),
            ],
            &mut options.report,
        )?;
        if options.ops == 0 || options.ops > 1_000 || options.rounds == 0 {
            bail!("--ops must be 1 to 1000 (the default --max-batch-ops), --rounds positive");
        }
        Ok(Some(options))
    }
}

fn main() -> ExitCode {
    support::main_with("batch", Options::parse, run)
}

fn key(i: usize) -> String {
    format!("bench/{i:04}")
}

fn value(i: usize) -> Vec<u8> {
    let mut value = format!("{i:04}").into_bytes();
    value.resize(VALUE_BYTES, b'x');
    value
}

/// Seconds of each way, per round.
#[derive(Default)]
struct Timings {
    batch_gets: Vec<f64>,
    single_gets: Vec<f64>,
    sdk_gets: Vec<f64>,
    batch_sets: Vec<f64>,
    single_sets: Vec<f64>,
    sdk_sets: Vec<f64>,
}

async fn run(options: Options) -> Result<()> {
    let mosquitto = procs::find_program(&["mosquitto"])
        .context("mosquitto is needed (scripts/bench installs it)")?;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway"));
    let dir = tempfile::Builder::new()
        .prefix("batch-bench-")
        .tempdir()
        .context("a temporary directory")?;
    let (_broker, port) = procs::start_mosquitto(&mosquitto, dir.path())?;
    let _emulator = procs::start_emulator(&binary, dir.path(), port).await?;
    write_keys(port, options.ops).await?;

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
    let sdk = Sdk::connect(port).await?;
    let mut conn = HttpConn::connect(gateway.api).await?;

    let gets = json!({"ops": (0..options.ops)
        .map(|i| json!({"op": "get", "key": key(i)}))
        .collect::<Vec<_>>()})
    .to_string();
    let sets = json!({"ops": (0..options.ops)
        .map(|i| json!({"op": "set", "key": key(i), "value": String::from_utf8_lossy(&value(i))}))
        .collect::<Vec<_>>()})
    .to_string();

    // One of each first, unmeasured: connections, allocator, caches.
    batch(&mut conn, &gets, options.ops, 200).await?;
    let idle_kib = gateway.proc.rss_kib()?;
    let mut peak_kib = idle_kib;
    let mut timings = Timings::default();
    for round in 0..options.rounds {
        let started = Instant::now();
        let results = batch(&mut conn, &gets, options.ops, 200).await?;
        timings.batch_gets.push(started.elapsed().as_secs_f64());
        for (i, result) in results.iter().enumerate() {
            if result["value"].as_str().map(str::as_bytes) != Some(value(i).as_slice()) {
                bail!("batch get {i} read {result}");
            }
        }

        let started = Instant::now();
        for i in 0..options.ops {
            let response = conn
                .request("GET", &format!("/keys/{}", key(i)), b"")
                .await?;
            if response.status != 200 || response.body != value(i) {
                bail!("GET {}: {}", key(i), response.status);
            }
        }
        timings.single_gets.push(started.elapsed().as_secs_f64());

        let started = Instant::now();
        let read = futures_util::future::join_all(
            (0..options.ops).map(|i| sdk.client.get(key(i).into_bytes(), SDK_TIMEOUT)),
        )
        .await;
        timings.sdk_gets.push(started.elapsed().as_secs_f64());
        for (i, response) in read.into_iter().enumerate() {
            let response = response.map_err(|error| anyhow::anyhow!("SDK get: {error:?}"))?;
            if response.response.as_deref() != Some(value(i).as_slice()) {
                bail!("SDK get {i} read something else");
            }
        }

        let peak = PeakRss::watch(gateway.proc.pid());
        let started = Instant::now();
        batch(&mut conn, &sets, options.ops, 200).await?;
        timings.batch_sets.push(started.elapsed().as_secs_f64());
        peak_kib = peak_kib.max(peak.stop());

        let started = Instant::now();
        for i in 0..options.ops {
            let response = conn
                .request("PUT", &format!("/keys/{}", key(i)), &value(i))
                .await?;
            if response.status != 200 {
                bail!("PUT {}: {}", key(i), response.status);
            }
        }
        timings.single_sets.push(started.elapsed().as_secs_f64());

        let started = Instant::now();
        let written = futures_util::future::join_all((0..options.ops).map(|i| {
            sdk.client.set(
                key(i).into_bytes(),
                value(i),
                SDK_TIMEOUT,
                None,
                state_store::SetOptions::default(),
            )
        }))
        .await;
        timings.sdk_sets.push(started.elapsed().as_secs_f64());
        for response in written {
            response.map_err(|error| anyhow::anyhow!("SDK set: {error:?}"))?;
        }
        println!(
            "batch benchmark: round {} of {} done",
            round + 1,
            options.rounds
        );
    }
    sdk.close().await;

    let report = report(&options, &mut timings, idle_kib, peak_kib)?;
    println!("\n{report}");
    if let Some(path) = &options.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if options.smoke {
        println!("batch benchmark: smoke run passed (no timing asserted)");
    }
    Ok(())
}

/// Writes the keys with a pool like the gateway's.
async fn write_keys(port: u16, count: usize) -> Result<()> {
    let pool = direct::start_pool(port, 4).await?;
    let mut writes = futures_util::stream::iter(0..count)
        .map(|i| {
            let pool = pool.clone();
            async move {
                let request = Request::Set {
                    key: Bytes::from(key(i)),
                    value: Bytes::from(value(i)),
                    options: SetOptions::default(),
                };
                pool.request(&request, &RequestOptions::default(), |response| response)
                    .await
            }
        })
        .buffer_unordered(256);
    while let Some(reply) = writes.next().await {
        let reply = reply.context("SET")?;
        if reply.reply != Reply::Ok {
            bail!("SET answered {:?}", reply.reply);
        }
    }
    pool.shutdown().await;
    Ok(())
}

/// Sends one batch; its results, each checked to have `status`.
async fn batch(conn: &mut HttpConn, body: &str, ops: usize, status: u64) -> Result<Vec<Value>> {
    let response = conn.request("POST", "/batch", body.as_bytes()).await?;
    if response.status != 200 {
        bail!(
            "POST /batch: {} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
        );
    }
    let answer: Value = serde_json::from_slice(&response.body).context("JSON")?;
    let results = answer["results"].as_array().context("results")?.clone();
    if results.len() != ops {
        bail!("{} results for {ops} ops", results.len());
    }
    if let Some(result) = results.iter().find(|result| result["status"] != status) {
        bail!("a batch op answered {result}");
    }
    Ok(results)
}

fn report(
    options: &Options,
    timings: &mut Timings,
    idle_kib: u64,
    peak_kib: u64,
) -> Result<String> {
    let n = options.ops;
    let ms = |seconds: f64| seconds * 1e3;
    let mut report = String::new();
    writeln!(
        report,
        "### {n} keys of {VALUE_BYTES} B in one batch, median of {} rounds\n",
        options.rounds
    )?;
    writeln!(
        report,
        "| way | {n} GETs (ms) | batch is faster by | {n} SETs (ms) | batch is faster by |"
    )?;
    writeln!(report, "|---|---:|---:|---:|---:|")?;
    let batch_gets = median(&mut timings.batch_gets);
    let batch_sets = median(&mut timings.batch_sets);
    writeln!(
        report,
        "| gateway `POST /batch`, one request | {:.1} | 1.00 | {:.1} | 1.00 |",
        ms(batch_gets),
        ms(batch_sets)
    )?;
    let single_gets = median(&mut timings.single_gets);
    let single_sets = median(&mut timings.single_sets);
    writeln!(
        report,
        "| gateway one-key requests, one after the other on one keep-alive connection | {:.1} | {:.2} | {:.1} | {:.2} |",
        ms(single_gets),
        single_gets / batch_gets,
        ms(single_sets),
        single_sets / batch_sets
    )?;
    let sdk_gets = median(&mut timings.sdk_gets);
    let sdk_sets = median(&mut timings.sdk_sets);
    writeln!(
        report,
        "| official client, {n} concurrent calls (MQTT) | {:.1} | {:.2} | {:.1} | {:.2} |",
        ms(sdk_gets),
        sdk_gets / batch_gets,
        ms(sdk_sets),
        sdk_sets / batch_sets
    )?;
    writeln!(
        report,
        "\nBatch time / official client time: GETs {:.2}, SETs {:.2} (goal: at most 1.25).",
        batch_gets / sdk_gets,
        batch_sets / sdk_sets
    )?;
    writeln!(
        report,
        "Gateway RSS: {:.1} MiB after a warm-up batch, {:.1} MiB at its peak during the batches of {n} {VALUE_BYTES} B SETs (+{:.1} MiB).",
        idle_kib as f64 / 1024.0,
        peak_kib as f64 / 1024.0,
        peak_kib.saturating_sub(idle_kib) as f64 / 1024.0
    )?;
    Ok(report)
}
