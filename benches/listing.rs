//! Listing every key of a store of 100,000: through the gateway
//! (`GET /keys?limit=N`, following `next`) against the official client's
//! `list_keys` (azure_iot_operations_services 1.5.0-beta1) on the same
//! store, in one run.
//!
//! Starts mosquitto, the emulator and `statestore-gateway serve` as their
//! own processes, writes the keys with a pool like the gateway's, then per
//! round (in an order that rotates) lists them all with the SDK and through
//! the gateway with `limit=1000` and `limit=10000`, in the default JSON and
//! with `key_base64=if_not_utf8`, on one keep-alive connection. Reports keys/s
//! (median of the rounds), each form's ratio to the SDK (median of the
//! rounds' ratios) and the gateway's RSS idle and at its peak while
//! listing (read from `/proc` every 2 ms in a first, untimed pass, as the
//! reader's CPU would slow the gateway's listings and not the SDK's), per
//! listing; each page size has a gateway of its own, so a peak is not what
//! an earlier listing left.
//!
//! `scripts/bench` runs it after the gateway benchmark (release build);
//! `scripts/bench --smoke` runs a small version on the debug build that
//! checks every key is listed once and asserts no timing.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use futures_util::StreamExt as _;
use statestore_gateway::mqtt::RequestOptions;
use statestore_gateway::protocol::{Reply, Request, SetOptions};

use support::direct;
use support::gateway::GatewayLaunch;
use support::http::HttpConn;
use support::memory::PeakRss;
use support::procs;
use support::sdk::Sdk;
use support::stats::median;

/// Gateway listings measured: page size, and whether the client asks for
/// `key_base64=if_not_utf8` (each text key once, as `key`).
const LISTINGS: [(usize, bool); 4] = [
    (1_000, false),
    (10_000, false),
    (1_000, true),
    (10_000, true),
];

struct Options {
    keys: usize,
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
            keys: if smoke { 3_000 } else { 100_000 },
            rounds: if smoke { 1 } else { 11 },
            smoke,
            report: None,
        };
        support::read_number_flags(
            args,
            &mut [
                ("--keys", &mut options.keys),
                ("--rounds", &mut options.rounds),
            ],
            &mut options.report,
        )?;
        if options.keys == 0 || options.rounds == 0 {
            bail!("--keys and --rounds must be positive");
        }
        Ok(Some(options))
    }
}

fn main() -> ExitCode {
    support::main_with("listing", Options::parse, run)
}

fn key(i: usize) -> String {
    format!("sensor/{i:06}/temperature")
}

async fn run(options: Options) -> Result<()> {
    let mosquitto = procs::find_program(&["mosquitto"])
        .context("mosquitto is needed (scripts/bench installs it)")?;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway"));
    let dir = tempfile::Builder::new()
        .prefix("listing-bench-")
        .tempdir()
        .context("a temporary directory")?;
    let (_broker, port) = procs::start_mosquitto(&mosquitto, dir.path())?;
    let _emulator = procs::start_emulator(&binary, dir.path(), port).await?;
    let pool = direct::start_pool(port, 4).await?;

    println!("listing benchmark: writing {} keys", options.keys);
    let written = Instant::now();
    let mut writes = futures_util::stream::iter(0..options.keys)
        .map(|i| {
            let pool = pool.clone();
            async move {
                let request = Request::Set {
                    key: Bytes::from(key(i)),
                    value: Bytes::from_static(b"21.5"),
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
    println!("listing benchmark: written in {:?}", written.elapsed());
    pool.shutdown().await;

    // One gateway per page size: what a listing of large pages leaves in
    // the allocator would otherwise be the peak of every listing after it.
    let launch = GatewayLaunch {
        binary: &binary,
        dir: dir.path(),
        broker_port: port,
        pool_size: 4,
        max_watchers: 1_000,
        env: &[],
    };
    let mut gateways = Vec::new();
    for (limit, _) in LISTINGS {
        if !gateways.iter().any(|(of, _)| *of == limit) {
            let gateway = launch.start(&format!("gateway-{limit}")).await?;
            gateways.push((limit, gateway));
        }
    }
    let gateway_of = |limit: usize| {
        gateways
            .iter()
            .find(|(of, _)| *of == limit)
            .map(|(_, gateway)| gateway)
            .context("a page size without its gateway")
    };
    let sdk = Sdk::connect(port).await?;

    let mut idle_kib = 0;
    for (_, gateway) in &gateways {
        idle_kib = idle_kib.max(gateway.proc.rss_kib()?);
    }
    // The peak pass: one listing of each form with the gateway's RSS read
    // every 2 ms. The timed rounds run without that reader, which would
    // otherwise take CPU from the gateway's listings and not the SDK's.
    let mut peaks_kib = vec![0; LISTINGS.len()];
    check_listed(&sdk.list_all().await?, options.keys, "list_keys")?;
    for (index, (limit, once)) in LISTINGS.into_iter().enumerate() {
        let gateway = gateway_of(limit)?;
        let peak = PeakRss::watch(gateway.proc.pid());
        let listed = list_through_gateway(gateway.api, limit, once).await;
        peaks_kib[index] = peak.stop();
        check_listed(&listed?, options.keys, "GET /keys")?;
    }

    // Each round lists with the SDK and in every form through the gateway,
    // in an order that rotates from round to round; a form's ratio is the
    // median of its rounds' ratios to the SDK's listing in the same round.
    let mut sdk_rates = Vec::new();
    let mut gateway_rates: Vec<Vec<f64>> = vec![Vec::new(); LISTINGS.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); LISTINGS.len()];
    for round in 0..options.rounds {
        // Listing 0 is the SDK's, listing i the gateway's form i - 1.
        let mut rates = vec![0.0; LISTINGS.len() + 1];
        for turn in 0..rates.len() {
            let listing = (round + turn) % rates.len();
            let started = Instant::now();
            let (listed, by) = match listing.checked_sub(1) {
                None => (sdk.list_all().await?, "list_keys"),
                Some(form) => {
                    let (limit, once) = LISTINGS[form];
                    let api = gateway_of(limit)?.api;
                    (list_through_gateway(api, limit, once).await?, "GET /keys")
                }
            };
            let elapsed = started.elapsed();
            check_listed(&listed, options.keys, by)?;
            rates[listing] = options.keys as f64 / elapsed.as_secs_f64();
        }
        sdk_rates.push(rates[0]);
        for (form, rate) in rates[1..].iter().enumerate() {
            gateway_rates[form].push(*rate);
            ratios[form].push(rate / rates[0]);
        }
        println!(
            "listing benchmark: round {} of {} done",
            round + 1,
            options.rounds
        );
    }
    sdk.close().await;

    let sdk_rate = median(&mut sdk_rates);
    let mut report = String::new();
    writeln!(
        report,
        "### Listing {} keys (`*`), medians of {} rounds\n",
        options.keys, options.rounds
    )?;
    writeln!(
        report,
        "| client | keys/s | vs. SDK `list_keys` (median of the rounds' ratios) | gateway RSS peak |"
    )?;
    writeln!(report, "|---|---:|---:|---:|")?;
    writeln!(
        report,
        "| official SDK `list_keys` (MQTT, pages of the store's 1,000) | {sdk_rate:.0} | 1.00 | |"
    )?;
    for (index, (limit, once)) in LISTINGS.into_iter().enumerate() {
        let rate = median(&mut gateway_rates[index]);
        let ratio = median(&mut ratios[index]);
        let form = if once { "&key_base64=if_not_utf8" } else { "" };
        writeln!(
            report,
            "| gateway `GET /keys?limit={limit}{form}` (HTTP + JSON) | {rate:.0} | {ratio:.2} | {:.1} MiB |",
            peaks_kib[index] as f64 / 1024.0
        )?;
    }
    writeln!(
        report,
        "\nGateway RSS (one gateway per page size): {:.1} MiB idle (after start), {:.1} MiB at its peak while listing.",
        idle_kib as f64 / 1024.0,
        peaks_kib.iter().max().copied().unwrap_or(idle_kib) as f64 / 1024.0
    )?;
    println!("\n{report}");
    if let Some(path) = &options.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if options.smoke {
        println!("listing benchmark: smoke run passed (no timing asserted)");
    }
    Ok(())
}

fn check_listed(listed: &[Vec<u8>], expected: usize, by: &str) -> Result<()> {
    let distinct: HashSet<&Vec<u8>> = listed.iter().collect();
    if listed.len() != expected || distinct.len() != expected {
        bail!(
            "{by} listed {} keys ({} distinct), not {expected}",
            listed.len(),
            distinct.len()
        );
    }
    Ok(())
}

/// A response as a client that wants the keys' bytes reads it, in either
/// form: the text key where there is one (borrowed unless it has escapes:
/// the same bytes), else the base64 of a key that is not UTF-8. In the
/// default form the `key_base64` beside a text key is parsed and not
/// decoded; the SDK's pager likewise hands out the keys and nothing else.
#[derive(serde::Deserialize)]
struct Listed<'a> {
    #[serde(borrow)]
    keys: Vec<ListedKey<'a>>,
    next: Option<String>,
}

#[derive(serde::Deserialize)]
struct ListedKey<'a> {
    #[serde(borrow)]
    key: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    key_base64: Option<std::borrow::Cow<'a, str>>,
}

/// Every key, following `next`, on one keep-alive connection; `once`:
/// asking for `key_base64=if_not_utf8`.
async fn list_through_gateway(
    api: std::net::SocketAddr,
    limit: usize,
    once: bool,
) -> Result<Vec<Vec<u8>>> {
    use base64::Engine as _;
    let mut conn = HttpConn::connect(api).await?;
    let mut keys = Vec::new();
    let mut cursor: Option<String> = None;
    let form = if once { "&key_base64=if_not_utf8" } else { "" };
    loop {
        let path = match &cursor {
            None => format!("/keys?limit={limit}{form}"),
            Some(cursor) => format!("/keys?limit={limit}{form}&cursor={cursor}"),
        };
        let response = conn.request("GET", &path, b"").await?;
        if response.status != 200 {
            bail!(
                "GET {path}: {} {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            );
        }
        let page: Listed = serde_json::from_slice(&response.body).context("JSON")?;
        for entry in page.keys {
            keys.push(match (entry.key, entry.key_base64) {
                (Some(key), _) => key.into_owned().into_bytes(),
                (None, Some(base64)) => {
                    base64::engine::general_purpose::STANDARD.decode(&*base64)?
                }
                (None, None) => bail!("an entry without its key"),
            });
        }
        let next = page.next;
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(keys),
        }
    }
}
