//! What Dapr's HTTP API costs beside the key API, measured in one run.
//!
//! Starts mosquitto, the emulator and `statestore-gateway serve` as their
//! own processes, then on one keep-alive connection, one request at a time:
//!
//! 1. **reads**: `GET /keys/k` against Dapr's `GET /v1.0/state/statestore/k`
//!    of the same 16-byte value over HTTP/1.1, and `GET /keys/k` against
//!    Dapr's gRPC `GetState` over one HTTP/2 (h2c) connection, in rounds
//!    that rotate the four (`--rounds N`, default 10), so load from other
//!    programs falls on all alike: latency percentiles and the gateway's
//!    own CPU per request (its threads' `schedstat`), as ratios Dapr /
//!    `/keys` on the same protocol (the median of the rounds');
//! 2. **saves**: a Dapr save without an etag against one with the key's
//!    current etag (read by a bulk get before each, not timed): latency and
//!    the store round trips each costs (the gateway's store request count);
//! 3. **queries**: Dapr's state query (alpha) over `--query-keys` keys
//!    (default 10,000) of small JSON values, half of them matching: a full
//!    unsorted query (every page, following the tokens) and the first page
//!    of a sorted one, each a scan of the whole key space: latency and
//!    store round trips.
//!
//! `scripts/bench --dapr` runs it (release build); `scripts/bench --smoke`
//! runs a small version on the debug build that checks every answer and
//! asserts no timing.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use prost::Message as _;

use support::gateway::{GatewayLaunch, GatewayProc};
use support::http::HttpConn;
use support::stats::{Percentiles, median_low_high};
use support::{proc_fs, procs};

struct Options {
    requests: usize,
    rounds: usize,
    query_keys: usize,
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
            rounds: if smoke { 2 } else { 10 },
            query_keys: if smoke { 200 } else { 10_000 },
            smoke,
            report: None,
        };
        support::read_number_flags(
            args,
            &mut [
                ("--requests", &mut options.requests),
                ("--rounds", &mut options.rounds),
                ("--query-keys", &mut options.query_keys),
            ],
            &mut options.report,
        )?;
        if options.requests == 0 || options.rounds == 0 {
            bail!("--requests and --rounds must be positive");
        }
        Ok(Some(options))
    }
}

fn main() -> ExitCode {
    support::main_with("dapr", Options::parse, run)
}

/// The latencies of `requests` requests, each answered `expect`.
async fn timed(
    conn: &mut HttpConn,
    requests: usize,
    method: &str,
    path: &str,
    body: &[u8],
    expect: u16,
) -> Result<Percentiles> {
    let mut samples = Vec::with_capacity(requests);
    for _ in 0..requests {
        let started = Instant::now();
        let response = conn.request(method, path, body).await?;
        samples.push(started.elapsed());
        if response.status != expect {
            bail!("{method} {path}: {} (expected {expect})", response.status);
        }
    }
    Ok(Percentiles::of(&mut samples))
}

/// Every request over the HTTP/2 connection gives up after this long.
const H2_TIMEOUT: Duration = Duration::from_secs(10);

/// Dapr's `GetStateRequest` (the fields a GET sets).
#[derive(Clone, PartialEq, prost::Message)]
struct GetStateRequest {
    #[prost(string, tag = "1")]
    store_name: String,
    #[prost(string, tag = "2")]
    key: String,
}

/// Dapr's `GetStateResponse` (metadata left out: prost skips it).
#[derive(Clone, PartialEq, prost::Message)]
struct GetStateResponse {
    #[prost(bytes = "vec", tag = "1")]
    data: Vec<u8>,
    #[prost(string, tag = "2")]
    etag: String,
}

/// One HTTP/2 connection with prior knowledge: `/keys` GETs and gRPC calls
/// on the same transport, one at a time.
struct H2Conn {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
}

impl H2Conn {
    async fn connect(addr: std::net::SocketAddr) -> Result<H2Conn> {
        let stream = tokio::time::timeout(H2_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .context("connecting: timed out")??;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .context("HTTP/2 handshake")?;
        tokio::spawn(connection);
        Ok(H2Conn { sender })
    }

    /// Sends one request; the status, body and trailers.
    async fn send(
        &mut self,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<(u16, Bytes, Option<hyper::HeaderMap>)> {
        let exchange = async {
            self.sender.ready().await?;
            let response = self.sender.send_request(request).await?;
            let status = response.status().as_u16();
            let collected = response.into_body().collect().await?;
            let trailers = collected.trailers().cloned();
            anyhow::Ok((status, collected.to_bytes(), trailers))
        };
        tokio::time::timeout(H2_TIMEOUT, exchange)
            .await
            .context("HTTP/2 request: timed out")?
    }

    async fn get_keys(&mut self, key: &str) -> Result<Bytes> {
        let request = hyper::Request::get(format!("/keys/{key}")).body(Full::new(Bytes::new()))?;
        let (status, body, _) = self.send(request).await?;
        if status != 200 {
            bail!("h2c GET /keys/{key}: {status}");
        }
        Ok(body)
    }

    /// Dapr's `GetState`: the value's bytes.
    async fn get_state(&mut self, key: &str) -> Result<Vec<u8>> {
        let message = GetStateRequest {
            store_name: "statestore".to_owned(),
            key: key.to_owned(),
        }
        .encode_to_vec();
        // gRPC's length-prefixed message: no compression, 4-byte length.
        let mut frame = Vec::with_capacity(5 + message.len());
        frame.push(0);
        frame.extend_from_slice(&u32::try_from(message.len())?.to_be_bytes());
        frame.extend_from_slice(&message);
        let request = hyper::Request::post("/dapr.proto.runtime.v1.Dapr/GetState")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from(frame)))?;
        let (status, body, trailers) = self.send(request).await?;
        let grpc_status = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("missing");
        if status != 200 || grpc_status != "0" {
            bail!("GetState {key}: HTTP {status}, grpc-status {grpc_status}");
        }
        if body.len() < 5 {
            bail!("GetState {key}: a {}-byte body", body.len());
        }
        Ok(GetStateResponse::decode(&body[5..])
            .context("GetStateResponse")?
            .data)
    }
}

/// The reads compared: the same key and value each way.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// `GET /keys/bench` over HTTP/1.1.
    KeysH1,
    /// Dapr's `GET /v1.0/state/statestore/bench` over HTTP/1.1.
    DaprH1,
    /// `GET /keys/bench` over HTTP/2 (h2c).
    KeysH2,
    /// Dapr's gRPC `GetState` of `bench` (HTTP/2, h2c).
    GetState,
}

const READS: [Read; 4] = [Read::KeysH1, Read::DaprH1, Read::KeysH2, Read::GetState];

impl Read {
    fn name(self) -> &'static str {
        match self {
            Read::KeysH1 => "`GET /keys/k`, HTTP/1.1",
            Read::DaprH1 => "Dapr `GET /v1.0/state/statestore/k`, HTTP/1.1",
            Read::KeysH2 => "`GET /keys/k`, HTTP/2 (h2c)",
            Read::GetState => "Dapr gRPC `GetState`, HTTP/2 (h2c)",
        }
    }

    /// One read; the value's bytes.
    async fn once(self, h1: &mut HttpConn, h2: &mut H2Conn) -> Result<Vec<u8>> {
        let path = match self {
            Read::KeysH1 => "/keys/bench",
            Read::DaprH1 => "/v1.0/state/statestore/bench",
            Read::KeysH2 => return Ok(h2.get_keys("bench").await?.to_vec()),
            Read::GetState => return h2.get_state("bench").await,
        };
        let response = h1.request("GET", path, b"").await?;
        if response.status != 200 {
            bail!("GET {path}: {}", response.status);
        }
        Ok(response.body)
    }
}

/// One way of reading, over every round.
#[derive(Default)]
struct Tally {
    samples: Vec<Duration>,
    cpu_ns: u64,
    /// Each round's CPU per request, in nanoseconds.
    per_round: Vec<f64>,
}

/// `rounds` rounds of `per_round` reads each way, the ways in a rotating
/// order (so a change of load on the machine falls on all of them alike);
/// every answer checked against `expect`.
async fn interleaved_reads(
    gateway: &GatewayProc,
    h1: &mut HttpConn,
    h2: &mut H2Conn,
    rounds: usize,
    per_round: usize,
    expect: &[u8],
) -> Result<Vec<Tally>> {
    let mut tallies: Vec<Tally> = READS.iter().map(|_| Tally::default()).collect();
    for round in 0..rounds {
        for offset in 0..READS.len() {
            let index = (round + offset) % READS.len();
            let read = READS[index];
            let tally = &mut tallies[index];
            let before = proc_fs::cpu_ns(gateway.proc.pid())?;
            for _ in 0..per_round {
                let started = Instant::now();
                let body = read.once(h1, h2).await?;
                tally.samples.push(started.elapsed());
                if body != expect {
                    bail!(
                        "{}: unexpected body {:?}",
                        read.name(),
                        String::from_utf8_lossy(&body)
                    );
                }
            }
            let used = proc_fs::cpu_ns(gateway.proc.pid())?.saturating_sub(before);
            tally.cpu_ns += used;
            tally.per_round.push(used as f64 / per_round as f64);
        }
    }
    Ok(tallies)
}

/// The median, lowest and highest of each round's ratio `a / b`.
fn round_ratios(a: &Tally, b: &Tally) -> (f64, f64, f64) {
    let ratios = a.per_round.iter().zip(&b.per_round).map(|(a, b)| a / b);
    median_low_high(ratios).unwrap_or((f64::NAN, f64::NAN, f64::NAN))
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

/// One query through every page, following the tokens (`first_page`:
/// the first page only): the results and pages it answered.
async fn query_through(
    conn: &mut HttpConn,
    query: &serde_json::Value,
    first_page: bool,
) -> Result<(usize, usize)> {
    let (mut results, mut pages) = (0, 0);
    let mut query = query.clone();
    loop {
        let response = conn
            .request(
                "POST",
                "/v1.0-alpha1/state/statestore/query",
                &serde_json::to_vec(&query)?,
            )
            .await?;
        pages += 1;
        if response.status == 204 {
            return Ok((results, pages));
        }
        if response.status != 200 {
            bail!("query: {}", response.status);
        }
        let page: serde_json::Value =
            serde_json::from_slice(&response.body).context("query JSON")?;
        let items = page["results"].as_array().context("results")?;
        for item in items {
            if item["data"]["even"] != true {
                bail!("a result the filter refuses: {item}");
            }
        }
        results += items.len();
        match page["token"].as_str() {
            Some(token) if !first_page => query["page"]["token"] = token.into(),
            _ => return Ok((results, pages)),
        }
    }
}

/// `queries` runs of `query`: their latencies, the store round trips of
/// one, and the results and pages of the last.
async fn timed_queries(
    gateway: &GatewayProc,
    conn: &mut HttpConn,
    queries: usize,
    query: &serde_json::Value,
    first_page: bool,
) -> Result<(Percentiles, f64, usize, usize)> {
    let mut samples = Vec::with_capacity(queries);
    let before = store_requests(gateway).await?;
    let mut answered = (0, 0);
    for _ in 0..queries {
        let started = Instant::now();
        answered = query_through(conn, query, first_page).await?;
        samples.push(started.elapsed());
    }
    let trips = (store_requests(gateway).await? - before) / queries as f64;
    Ok((Percentiles::of(&mut samples), trips, answered.0, answered.1))
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
    let _emulator = procs::start_emulator(&binary, dir.path(), port).await?;
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
    let mut h2 = H2Conn::connect(gateway.api).await?;
    let per_round = (n / options.rounds).max(1);
    // A warm-up round, then the measured ones.
    interleaved_reads(&gateway, &mut conn, &mut h2, 1, per_round, value).await?;
    let reads = interleaved_reads(
        &gateway,
        &mut conn,
        &mut h2,
        options.rounds,
        per_round,
        value,
    )
    .await?;

    let saves = (n / 4).max(10);
    let plain_body = br#"[{"key":"bench-save","value":"0123456789abcd"}]"#;
    let before = store_requests(&gateway).await?;
    let plain = timed(
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

    // Queries: small JSON values, every other one matching.
    let numbers: Vec<usize> = (0..options.query_keys).collect();
    for chunk in numbers.chunks(1_000) {
        let items: Vec<serde_json::Value> = chunk
            .iter()
            .map(|n| serde_json::json!({"key": format!("bench-q/{n:06}"), "value": {"n": n, "even": n % 2 == 0}}))
            .collect();
        let saved = conn
            .request(
                "POST",
                "/v1.0/state/statestore",
                &serde_json::to_vec(&items)?,
            )
            .await?;
        if saved.status != 204 {
            bail!("saving the query's keys: {}", saved.status);
        }
    }
    let queries = if options.smoke { 3 } else { 20 };
    let unsorted = serde_json::json!({"filter": {"EQ": {"even": true}}});
    let (unsorted_latency, unsorted_trips, unsorted_results, unsorted_pages) =
        timed_queries(&gateway, &mut conn, queries, &unsorted, false).await?;
    let sorted = serde_json::json!({"filter": {"EQ": {"even": true}}, "sort": [{"key": "n", "order": "DESC"}], "page": {"limit": 100}});
    let (sorted_latency, sorted_trips, sorted_results, _) =
        timed_queries(&gateway, &mut conn, queries, &sorted, true).await?;
    let matching = options.query_keys.div_ceil(2);
    if unsorted_results != matching || sorted_results != matching.min(100) {
        bail!("the queries answered {unsorted_results} and {sorted_results} of {matching} matches");
    }

    let us = |value: f64| format!("{value:.0} µs");
    let ms = |value: f64| format!("{:.1} ms", value / 1e3);
    let mut report = String::new();
    writeln!(
        report,
        "### Dapr's HTTP and gRPC API beside the key API, one request at a time\n"
    )?;
    let reads_each = per_round * options.rounds;
    writeln!(
        report,
        "{} rounds of {per_round} reads each way, the ways in a rotating order; CPU per request \
         from the gateway's threads' `schedstat` (user and kernel).\n",
        options.rounds
    )?;
    writeln!(
        report,
        "| read ({reads_each} each) | p50 | p99 | gateway CPU per request |"
    )?;
    writeln!(report, "|---|---:|---:|---:|")?;
    let mut latency = Vec::new();
    for (read, tally) in READS.iter().zip(&reads) {
        let mut samples = tally.samples.clone();
        let percentiles = Percentiles::of(&mut samples);
        writeln!(
            report,
            "| {} | {} | {} | {:.1} µs |",
            read.name(),
            us(percentiles.p50),
            us(percentiles.p99),
            tally.cpu_ns as f64 / 1e3 / reads_each as f64
        )?;
        latency.push(percentiles);
    }
    writeln!(report)?;
    for (dapr, keys, what) in [
        (1, 0, "Dapr GET over HTTP/1.1"),
        (3, 2, "gRPC GetState over h2c"),
    ] {
        let (median, low, high) = round_ratios(&reads[dapr], &reads[keys]);
        writeln!(
            report,
            "{what} / `/keys` GET on the same protocol: CPU per request {median:.2}x \
             (median of the rounds; {low:.2} to {high:.2}), added latency p50 {:+.0} µs, p99 {:+.0} µs.\n",
            latency[dapr].p50 - latency[keys].p50,
            latency[dapr].p99 - latency[keys].p99,
        )?;
    }
    writeln!(
        report,
        "| Dapr save ({saves} each) | p50 | p99 | store round trips |"
    )?;
    writeln!(report, "|---|---:|---:|---:|")?;
    writeln!(
        report,
        "| without an etag | {} | {} | {plain_trips:.1} |",
        us(plain.p50),
        us(plain.p99)
    )?;
    writeln!(
        report,
        "| with the current etag (lease, read beside the expiry record, claim, write, release) | {} | {} | {etag_trips:.1} |",
        us(etag.p50),
        us(etag.p99)
    )?;
    writeln!(
        report,
        "\n| Dapr state query over {} keys, {matching} matching ({queries} each) | p50 | p99 | store round trips |",
        options.query_keys
    )?;
    writeln!(report, "|---|---:|---:|---:|")?;
    writeln!(
        report,
        "| unsorted, every page ({unsorted_pages} pages of at most 1,000) | {} | {} | {unsorted_trips:.0} |",
        ms(unsorted_latency.p50),
        ms(unsorted_latency.p99)
    )?;
    writeln!(
        report,
        "| sorted, the first page of 100 | {} | {} | {sorted_trips:.0} |",
        ms(sorted_latency.p50),
        ms(sorted_latency.p99)
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
