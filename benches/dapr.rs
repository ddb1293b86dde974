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
//!    store round trips;
//! 4. **publishes**, 64 in flight and one at a time: Dapr's
//!    `POST /v1.0/publish/pubsub/bench` over 64 keep-alive connections (or
//!    one) and gRPC `PublishEvent` as 64 streams of one h2c connection (or
//!    one), against the gateway's pool
//!    ([`statestore_gateway::mqtt::Pool::publish`]) used directly from this
//!    process, on a runtime of one thread of its own as `serve` runs by
//!    default (and, once for the record, on this program's workers),
//!    publishing a CloudEvent of the same size to the same broker, in 5
//!    rounds that rotate the three ways: throughput ratios (the median of
//!    the rounds'), latency percentiles and CPU per publish;
//! 5. **delivery** to an HTTP app: a minimal app in this process
//!    (`GET /dapr/subscribe`, its route answering SUCCESS) behind a second
//!    gateway (`--dapr-app-port`), the events published by this process's
//!    pool (64 in flight), against a plain MQTT subscriber (rumqttc, QoS 1)
//!    of the same broker getting as many, in alternating rounds: events per
//!    second from the first publish to the last event received, and the
//!    gateway's CPU per delivered event against its CPU per `GET /keys/k`
//!    (one at a time, as many).
//!
//! `scripts/bench --dapr` runs it (release build); `scripts/bench --smoke`
//! runs a small version on the debug build that checks every answer and
//! asserts no timing.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use prost::Message as _;

use statestore_gateway::mqtt::{Message, Pool};
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

/// Publishes in flight at once for the throughput runs.
const PUBLISHERS: usize = 64;

/// Throughput, latency and CPU of a publish run.
struct PublishRun {
    per_second: f64,
    latency: Percentiles,
    samples: Vec<Duration>,
    /// CPU per publish, in nanoseconds: the gateway's (its threads'), or
    /// for direct publishes the publishing thread's (pool included).
    cpu_per_publish: f64,
}

/// `total` Dapr publishes over `in_flight` keep-alive connections, each
/// one request at a time.
async fn http_publishes(
    gateway: &GatewayProc,
    in_flight: usize,
    total: usize,
) -> Result<PublishRun> {
    let mut conns = Vec::with_capacity(in_flight);
    for _ in 0..in_flight {
        conns.push(HttpConn::connect(gateway.api).await?);
    }
    let cpu_before = proc_fs::cpu_ns(gateway.proc.pid())?;
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(index, mut conn)| {
            let count = total / in_flight + usize::from(index < total % in_flight);
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(count);
                for _ in 0..count {
                    let sent = Instant::now();
                    let response = conn
                        .request("POST", "/v1.0/publish/pubsub/bench", br#"{"n":1}"#)
                        .await?;
                    samples.push(sent.elapsed());
                    if response.status != 204 {
                        bail!("publish: {}", response.status);
                    }
                }
                Ok::<_, anyhow::Error>(samples)
            })
        })
        .collect();
    let mut run = collect_run(tasks, started).await?;
    run.cpu_per_publish =
        proc_fs::cpu_ns(gateway.proc.pid())?.saturating_sub(cpu_before) as f64 / total as f64;
    Ok(run)
}

/// `total` publishes of `payload` through `pool` by `in_flight` tasks.
async fn direct_publishes(
    pool: &Pool,
    payload: Bytes,
    in_flight: usize,
    total: usize,
) -> Result<PublishRun> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|index| {
            let count = total / in_flight + usize::from(index < total % in_flight);
            let (pool, payload) = (pool.clone(), payload.clone());
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(count);
                for _ in 0..count {
                    let message = Message {
                        topic: "bench".into(),
                        payload: payload.clone(),
                        content_type: Some("application/cloudevents+json".into()),
                        ..Message::default()
                    };
                    let sent = Instant::now();
                    pool.publish(message).await.context("a direct publish")?;
                    samples.push(sent.elapsed());
                }
                Ok::<_, anyhow::Error>(samples)
            })
        })
        .collect();
    collect_run(tasks, started).await
}

/// The CPU time of the calling thread so far, in nanoseconds.
fn thread_cpu_ns() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    text.split_whitespace()
        .next()
        .and_then(|ns| ns.parse().ok())
        .context("/proc/thread-self/schedstat")
}

/// A request to the one-thread publisher: in flight, total, the answer.
type PublishOrder = (
    usize,
    usize,
    tokio::sync::oneshot::Sender<Result<PublishRun>>,
);

/// The pool on a runtime of one thread of its own, as `serve` runs by
/// default, publishing a CloudEvent on request, with the thread's CPU per
/// publish.
struct OneThreadPublisher {
    orders: tokio::sync::mpsc::UnboundedSender<PublishOrder>,
    thread: std::thread::JoinHandle<()>,
}

impl OneThreadPublisher {
    fn start(broker_port: u16, payload: Bytes) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (orders, mut received) = tokio::sync::mpsc::unbounded_channel::<PublishOrder>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let pool = match support::direct::start_pool(broker_port, 4).await {
                    Ok(pool) => pool,
                    Err(error) => {
                        let error = format!("{error:#}");
                        while let Some((_, _, answer)) = received.recv().await {
                            let _ = answer.send(Err(anyhow::anyhow!("{error}")));
                        }
                        return;
                    }
                };
                while let Some((in_flight, total, answer)) = received.recv().await {
                    let run = async {
                        let before = thread_cpu_ns()?;
                        let mut run =
                            direct_publishes(&pool, payload.clone(), in_flight, total).await?;
                        run.cpu_per_publish =
                            thread_cpu_ns()?.saturating_sub(before) as f64 / total as f64;
                        Ok(run)
                    }
                    .await;
                    let _ = answer.send(run);
                }
                pool.shutdown().await;
            });
        });
        Ok(Self { orders, thread })
    }

    async fn publish(&self, in_flight: usize, total: usize) -> Result<PublishRun> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.orders
            .send((in_flight, total, answer))
            .map_err(|_| anyhow::anyhow!("the one-thread publisher stopped"))?;
        answered.await.context("the one-thread publisher stopped")?
    }

    /// Shuts its pool down and ends its thread.
    async fn stop(self) -> Result<()> {
        drop(self.orders);
        tokio::task::spawn_blocking(move || self.thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the one-thread publisher panicked"))
    }
}

/// The ways of publishing compared, in the order of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PublishWay {
    Http,
    Grpc,
    Direct,
}

const PUBLISH_WAYS: [PublishWay; 3] = [PublishWay::Http, PublishWay::Grpc, PublishWay::Direct];

impl PublishWay {
    fn name(self) -> &'static str {
        match self {
            PublishWay::Http => "Dapr `POST /v1.0/publish`, HTTP/1.1 (a connection each)",
            PublishWay::Grpc => "Dapr gRPC `PublishEvent`, streams of one h2c connection",
            PublishWay::Direct => "the pool's `publish`, directly, on one thread (as `serve`)",
        }
    }

    async fn run(
        self,
        gateway: &GatewayProc,
        direct: &OneThreadPublisher,
        in_flight: usize,
        total: usize,
    ) -> Result<PublishRun> {
        match self {
            PublishWay::Http => http_publishes(gateway, in_flight, total).await,
            PublishWay::Grpc => grpc_publishes(gateway, in_flight, total).await,
            PublishWay::Direct => direct.publish(in_flight, total).await,
        }
    }
}

/// Each way's runs of one in-flight count, over the rounds.
struct PublishRounds {
    /// By [`PUBLISH_WAYS`] index, one run per round.
    runs: Vec<Vec<PublishRun>>,
}

impl PublishRounds {
    /// `rounds` rounds of `total` publishes each way, `in_flight` at once,
    /// the ways in an order that rotates from round to round.
    async fn measure(
        gateway: &GatewayProc,
        direct: &OneThreadPublisher,
        in_flight: usize,
        total: usize,
        rounds: usize,
    ) -> Result<Self> {
        let mut runs: Vec<Vec<PublishRun>> = PUBLISH_WAYS.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            for offset in 0..PUBLISH_WAYS.len() {
                let index = (round + offset) % PUBLISH_WAYS.len();
                let run = PUBLISH_WAYS[index]
                    .run(gateway, direct, in_flight, total)
                    .await?;
                runs[index].push(run);
            }
        }
        Ok(Self { runs })
    }

    fn way(&self, way: PublishWay) -> &[PublishRun] {
        let index = PUBLISH_WAYS.iter().position(|w| *w == way).unwrap_or(0);
        &self.runs[index]
    }

    /// A way's figures over every round: the median rate, the latency of
    /// every publish, the mean CPU per publish.
    fn summary(&self, way: PublishWay) -> PublishRun {
        let runs = self.way(way);
        let mut samples: Vec<Duration> = runs.iter().flat_map(|run| run.samples.clone()).collect();
        let per_second = median_low_high(runs.iter().map(|run| run.per_second))
            .map_or(f64::NAN, |(median, _, _)| median);
        let cpu_per_publish =
            runs.iter().map(|run| run.cpu_per_publish).sum::<f64>() / runs.len().max(1) as f64;
        PublishRun {
            per_second,
            latency: Percentiles::of(&mut samples),
            samples: Vec::new(),
            cpu_per_publish,
        }
    }

    /// The median, lowest and highest of the rounds' rate ratios `way` /
    /// direct.
    fn rate_ratio(&self, way: PublishWay) -> (f64, f64, f64) {
        let ratios = self
            .way(way)
            .iter()
            .zip(self.way(PublishWay::Direct))
            .map(|(run, direct)| run.per_second / direct.per_second);
        median_low_high(ratios).unwrap_or((f64::NAN, f64::NAN, f64::NAN))
    }
}

/// Dapr's `PublishEventRequest` (the fields a publish sets).
#[derive(Clone, PartialEq, prost::Message)]
struct PublishEventRequest {
    #[prost(string, tag = "1")]
    pubsub_name: String,
    #[prost(string, tag = "2")]
    topic: String,
    #[prost(bytes = "vec", tag = "3")]
    data: Vec<u8>,
    #[prost(string, tag = "4")]
    data_content_type: String,
}

/// `total` gRPC `PublishEvent` calls, `in_flight` at once as streams of
/// one HTTP/2 (h2c) connection, as a gRPC client's channel sends them.
async fn grpc_publishes(
    gateway: &GatewayProc,
    in_flight: usize,
    total: usize,
) -> Result<PublishRun> {
    let conn = H2Conn::connect(gateway.api).await?;
    let message = PublishEventRequest {
        pubsub_name: "pubsub".to_owned(),
        topic: "bench".to_owned(),
        data: br#"{"n":1}"#.to_vec(),
        data_content_type: "application/json".to_owned(),
    }
    .encode_to_vec();
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(message.len())?.to_be_bytes());
    frame.extend_from_slice(&message);
    let frame = Bytes::from(frame);
    let cpu_before = proc_fs::cpu_ns(gateway.proc.pid())?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|index| {
            let count = total / in_flight + usize::from(index < total % in_flight);
            let mut conn = H2Conn {
                sender: conn.sender.clone(),
            };
            let frame = frame.clone();
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(count);
                for _ in 0..count {
                    let request = hyper::Request::post("/dapr.proto.runtime.v1.Dapr/PublishEvent")
                        .header("content-type", "application/grpc")
                        .header("te", "trailers")
                        .body(Full::new(frame.clone()))?;
                    let sent = Instant::now();
                    let (status, _, trailers) = conn.send(request).await?;
                    samples.push(sent.elapsed());
                    let grpc_status = trailers
                        .as_ref()
                        .and_then(|t| t.get("grpc-status"))
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("missing");
                    if status != 200 || grpc_status != "0" {
                        bail!("PublishEvent: HTTP {status}, grpc-status {grpc_status}");
                    }
                }
                Ok::<_, anyhow::Error>(samples)
            })
        })
        .collect();
    let mut run = collect_run(tasks, started).await?;
    run.cpu_per_publish =
        proc_fs::cpu_ns(gateway.proc.pid())?.saturating_sub(cpu_before) as f64 / total as f64;
    Ok(run)
}

async fn collect_run(
    tasks: Vec<tokio::task::JoinHandle<Result<Vec<Duration>>>>,
    started: Instant,
) -> Result<PublishRun> {
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await.context("a publisher task")??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(PublishRun {
        per_second: samples.len() as f64 / elapsed,
        latency: Percentiles::of(&mut samples),
        samples,
        cpu_per_publish: f64::NAN,
    })
}

/// The topic events are delivered to the app on.
const DELIVER_TOPIC: &str = "bench-deliver";
/// The topic the plain MQTT subscriber follows.
const PLAIN_TOPIC: &str = "bench-plain";
/// The app's route for [`DELIVER_TOPIC`].
const APP_ROUTE: &str = "/events";
/// How long a delivery run may take before the run fails.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// A minimal Dapr app over HTTP/1.1 in this process: it subscribes to
/// [`DELIVER_TOPIC`] (`GET /dapr/subscribe`) and answers every event posted
/// to its route with SUCCESS, counting them.
struct App {
    port: u16,
    events: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl App {
    async fn start() -> Result<App> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let events = Arc::new(AtomicUsize::new(0));
        let counted = events.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let counted = counted.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let counted = counted.clone();
                        async move { app_answer(request, &counted).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(App { port, events, task })
    }

    fn events(&self) -> usize {
        self.events.load(Ordering::Relaxed)
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn app_answer(
    request: hyper::Request<hyper::body::Incoming>,
    counted: &AtomicUsize,
) -> Result<hyper::Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let (status, answer) = match (parts.method.as_str(), parts.uri.path()) {
        ("GET", "/dapr/subscribe") => (
            200,
            format!(
                r#"[{{"pubsubname":"pubsub","topic":"{DELIVER_TOPIC}","route":"{APP_ROUTE}"}}]"#
            ),
        ),
        ("POST", APP_ROUTE) => {
            // The data published (the CloudEvent's other attributes are
            // the publisher's).
            let data = br#""data":{"n":1}"#;
            if body.windows(data.len()).any(|w| w == data) {
                counted.fetch_add(1, Ordering::Relaxed);
                (200, r#"{"status":"SUCCESS"}"#.to_owned())
            } else {
                // Not the event sent: DROP, so the count falls short.
                (200, r#"{"status":"DROP"}"#.to_owned())
            }
        }
        _ => (404, String::new()),
    };
    let response = hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer)));
    Ok(response.unwrap_or_default())
}

/// A plain MQTT5 client subscribed to [`PLAIN_TOPIC`] at QoS 1 (rumqttc,
/// acknowledging each message as it arrives): counts what it receives.
async fn plain_subscriber(
    broker_port: u16,
) -> Result<(Arc<AtomicUsize>, tokio::task::JoinHandle<()>)> {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let mut options = MqttOptions::new("bench-plain-subscriber", "127.0.0.1", broker_port);
    options.set_keep_alive(Duration::from_secs(30));
    options.set_max_packet_size(Some(1 << 20));
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    let received = Arc::new(AtomicUsize::new(0));
    let counted = received.clone();
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut subscribed_tx = Some(subscribed_tx);
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = client.try_subscribe(PLAIN_TOPIC, QoS::AtLeastOnce);
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(tx) = subscribed_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(_))) => {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(15), subscribed)
        .await
        .context("the plain subscriber's SUBACK: timed out")?
        .context("the plain subscriber stopped")?;
    Ok((received, task))
}

/// Publishes `total` messages of `payload` on `topic` through `pool`,
/// [`PUBLISHERS`] in flight, and waits until `received` counts `total`
/// more than it did: the messages per second from the first publish to
/// the last one received.
async fn publish_and_count(
    pool: &Pool,
    topic: &'static str,
    payload: &Bytes,
    total: usize,
    received: impl Fn() -> usize,
) -> Result<f64> {
    let before = received();
    let started = Instant::now();
    let tasks: Vec<_> = (0..PUBLISHERS)
        .map(|index| {
            let count = total / PUBLISHERS + usize::from(index < total % PUBLISHERS);
            let (pool, payload) = (pool.clone(), payload.clone());
            tokio::spawn(async move {
                for _ in 0..count {
                    let message = Message {
                        topic: topic.into(),
                        payload: payload.clone(),
                        content_type: Some("application/cloudevents+json".into()),
                        ..Message::default()
                    };
                    pool.publish(message).await.context("a publish")?;
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.context("a publisher task")??;
    }
    let deadline = Instant::now() + DELIVERY_TIMEOUT;
    while received() < before + total {
        if Instant::now() > deadline {
            bail!(
                "{} of {total} messages on {topic} arrived within {DELIVERY_TIMEOUT:?}",
                received() - before
            );
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    if received() != before + total {
        bail!(
            "{} messages on {topic} arrived, {total} published",
            received() - before
        );
    }
    Ok(total as f64 / elapsed)
}

/// Delivery to an HTTP app against a plain MQTT subscriber.
struct DeliveryRuns {
    /// Each round's events per second: delivered to the app, received by
    /// the plain subscriber.
    delivered: Vec<f64>,
    plain: Vec<f64>,
    /// The delivering gateway's CPU per event and per `GET /keys/k`, in
    /// nanoseconds, each round.
    cpu_per_event: Vec<f64>,
    cpu_per_get: Vec<f64>,
}

/// `rounds` rounds of `total` events each way, alternating, and as many
/// GETs one at a time on the delivering gateway for its CPU per GET.
async fn deliveries(
    launch: &GatewayLaunch<'_>,
    pool: &Pool,
    payload: &Bytes,
    total: usize,
    rounds: usize,
) -> Result<DeliveryRuns> {
    let app = App::start().await?;
    let env = [(
        "STATESTORE_GATEWAY_DAPR_APP_PORT".to_owned(),
        app.port.to_string(),
    )];
    let gateway = GatewayLaunch {
        env: &env,
        ..*launch
    }
    .start("gateway-app")
    .await?;
    let (plain, plain_task) = plain_subscriber(launch.broker_port).await?;
    // The gateway subscribes once it has read the app's subscriptions:
    // publish until the app has an event.
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.events() == 0 {
        if Instant::now() > deadline {
            bail!(
                "the app got no event within 15 s; {}",
                gateway.proc.log_tail()
            );
        }
        publish_one(pool, DELIVER_TOPIC, payload).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let settled = Instant::now() + Duration::from_secs(2);
    let mut seen = app.events();
    while Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if app.events() == seen {
            break;
        }
        seen = app.events();
    }
    let mut conn = HttpConn::connect(gateway.api).await?;
    // Warm-up of each way.
    publish_and_count(pool, DELIVER_TOPIC, payload, PUBLISHERS * 4, || {
        app.events()
    })
    .await?;
    publish_and_count(pool, PLAIN_TOPIC, payload, PUBLISHERS * 4, || {
        plain.load(Ordering::Relaxed)
    })
    .await?;
    timed(&mut conn, 100, "GET", "/keys/bench", b"", 200).await?;
    let mut runs = DeliveryRuns {
        delivered: Vec::new(),
        plain: Vec::new(),
        cpu_per_event: Vec::new(),
        cpu_per_get: Vec::new(),
    };
    for _ in 0..rounds {
        let before = proc_fs::cpu_ns(gateway.proc.pid())?;
        runs.delivered
            .push(publish_and_count(pool, DELIVER_TOPIC, payload, total, || app.events()).await?);
        let used = proc_fs::cpu_ns(gateway.proc.pid())?.saturating_sub(before);
        runs.cpu_per_event.push(used as f64 / total as f64);
        runs.plain.push(
            publish_and_count(pool, PLAIN_TOPIC, payload, total, || {
                plain.load(Ordering::Relaxed)
            })
            .await?,
        );
        let before = proc_fs::cpu_ns(gateway.proc.pid())?;
        timed(&mut conn, total, "GET", "/keys/bench", b"", 200).await?;
        let used = proc_fs::cpu_ns(gateway.proc.pid())?.saturating_sub(before);
        runs.cpu_per_get.push(used as f64 / total as f64);
    }
    plain_task.abort();
    Ok(runs)
}

async fn publish_one(pool: &Pool, topic: &'static str, payload: &Bytes) -> Result<()> {
    let message = Message {
        topic: topic.into(),
        payload: payload.clone(),
        content_type: Some("application/cloudevents+json".into()),
        ..Message::default()
    };
    pool.publish(message).await.context("a publish")?;
    Ok(())
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
    let launch = GatewayLaunch {
        binary: &binary,
        dir: dir.path(),
        broker_port: port,
        pool_size: 4,
        max_watchers: 1_000,
        env: &[],
    };
    let gateway = launch.start("gateway").await?;
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
    // Publishes: an event as the gateway makes it (same attributes, same
    // size) for the direct ones; a warm-up of each, then each way measured
    // once.
    let publishes = n.max(PUBLISHERS);
    let one_at_a_time = (n / 4).max(10);
    let sample = {
        Bytes::from(format!(
            r#"{{"data":{{"n":1}},"datacontenttype":"application/json","id":"{}","pubsubname":"pubsub","source":"statestore-gateway","specversion":"1.0","time":"2026-01-01T00:00:00Z","topic":"bench","traceid":"{tp}","traceparent":"{tp}","tracestate":"","type":"com.dapr.event.sent"}}"#,
            "00000000-0000-4000-8000-000000000000",
            tp = "00-00000000000000000000000000000000-0000000000000000-00",
        ))
    };
    // The pool on one thread of its own, as `serve` runs by default,
    // against the gateway over HTTP and gRPC: a warm-up round, then the
    // rounds at 64 in flight and one at a time, the ways rotating.
    let publish_rounds = if options.smoke { 1 } else { 5 };
    let direct = OneThreadPublisher::start(port, sample.clone())?;
    PublishRounds::measure(&gateway, &direct, PUBLISHERS, PUBLISHERS * 4, 1).await?;
    let in_flight = PublishRounds::measure(
        &gateway,
        &direct,
        PUBLISHERS,
        (publishes / publish_rounds).max(PUBLISHERS),
        publish_rounds,
    )
    .await?;
    let one_by_one = PublishRounds::measure(
        &gateway,
        &direct,
        1,
        (one_at_a_time / publish_rounds).max(1),
        publish_rounds,
    )
    .await?;
    direct.stop().await?;
    // The pool on this program's runtime (a worker per core).
    let pool = support::direct::start_pool(port, 4).await?;
    direct_publishes(&pool, sample.clone(), PUBLISHERS, PUBLISHERS * 4).await?;
    let workers_run = direct_publishes(&pool, sample.clone(), PUBLISHERS, publishes).await?;

    // Delivery: events published by this process's pool (a plain MQTT
    // publisher) to the app through a second gateway, against a plain
    // MQTT subscriber of the same broker.
    let delivery_rounds = if options.smoke { 1 } else { 5 };
    let events_per_round = (n / 2).max(PUBLISHERS);
    let delivery = deliveries(&launch, &pool, &sample, events_per_round, delivery_rounds).await?;
    pool.shutdown().await;

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
    writeln!(
        report,
        "\n| publish ({publish_rounds} rounds of {} at {PUBLISHERS} in flight and of {} one at a time, the ways rotating) | in flight | per second (median of the rounds) | p50 | p99 | CPU per publish |",
        (publishes / publish_rounds).max(PUBLISHERS),
        (one_at_a_time / publish_rounds).max(1),
    )?;
    writeln!(report, "|---|--:|---:|---:|---:|---:|")?;
    let row = |report: &mut String, name: &str, in_flight: usize, run: &PublishRun| {
        let cpu = if run.cpu_per_publish.is_nan() {
            String::new()
        } else {
            format!("{:.1} µs", run.cpu_per_publish / 1e3)
        };
        writeln!(
            report,
            "| {name} | {in_flight} | {:.0} | {} | {} | {cpu} |",
            run.per_second,
            us(run.latency.p50),
            us(run.latency.p99)
        )
    };
    for (rounds, count) in [(&in_flight, PUBLISHERS), (&one_by_one, 1)] {
        for way in PUBLISH_WAYS {
            row(&mut report, way.name(), count, &rounds.summary(way))?;
        }
    }
    row(
        &mut report,
        "the pool's `publish`, directly, on this program's workers (one per core), once",
        PUBLISHERS,
        &workers_run,
    )?;
    writeln!(
        report,
        "\nCPU per publish: the gateway's threads' for Dapr's, the publishing thread's (its pool included) for direct ones."
    )?;
    let direct_run = in_flight.summary(PublishWay::Direct);
    let direct_one = one_by_one.summary(PublishWay::Direct);
    for way in [PublishWay::Http, PublishWay::Grpc] {
        let (run, one) = (in_flight.summary(way), one_by_one.summary(way));
        let (ratio, low, high) = in_flight.rate_ratio(way);
        writeln!(
            report,
            "\n{} / direct on one thread: throughput at {PUBLISHERS} in flight {ratio:.2}x \
             (median of the rounds; {low:.2} to {high:.2}; / direct on one worker per core, once: {:.2}x), \
             added latency p50 one at a time {:+.0} µs ({PUBLISHERS} in flight: {:+.0} µs), CPU per publish {:.2}x.",
            way.name(),
            run.per_second / workers_run.per_second,
            one.latency.p50 - direct_one.latency.p50,
            run.latency.p50 - direct_run.latency.p50,
            run.cpu_per_publish / direct_run.cpu_per_publish,
        )?;
    }
    let median = |values: &[f64]| median_low_high(values.iter().copied()).map_or(f64::NAN, |m| m.0);
    let rates: Vec<f64> = delivery
        .delivered
        .iter()
        .zip(&delivery.plain)
        .map(|(delivered, plain)| delivered / plain)
        .collect();
    let cpus: Vec<f64> = delivery
        .cpu_per_event
        .iter()
        .zip(&delivery.cpu_per_get)
        .map(|(event, get)| event / get)
        .collect();
    let (rate_ratio, rate_low, rate_high) =
        median_low_high(rates.iter().copied()).unwrap_or((f64::NAN, f64::NAN, f64::NAN));
    let (cpu_ratio, cpu_low, cpu_high) =
        median_low_high(cpus.iter().copied()).unwrap_or((f64::NAN, f64::NAN, f64::NAN));
    writeln!(
        report,
        "\n| delivery, {} rounds of {events_per_round} events ({PUBLISHERS} publishes in flight) | events per second | gateway CPU per event |",
        delivery.delivered.len()
    )?;
    writeln!(report, "|---|---:|---:|")?;
    writeln!(
        report,
        "| to an HTTP app (`POST {APP_ROUTE}`, SUCCESS), through the gateway | {:.0} | {:.1} µs |",
        median(&delivery.delivered),
        median(&delivery.cpu_per_event) / 1e3
    )?;
    writeln!(
        report,
        "| to a plain MQTT subscriber (rumqttc, QoS 1) | {:.0} | |",
        median(&delivery.plain)
    )?;
    writeln!(
        report,
        "| (the same gateway's `GET /keys/k`, one at a time) | | {:.1} µs |",
        median(&delivery.cpu_per_get) / 1e3
    )?;
    writeln!(
        report,
        "\nDelivery / plain subscriber: events per second {rate_ratio:.2}x (median of the rounds; \
         {rate_low:.2} to {rate_high:.2}); gateway CPU per delivered event / per GET {cpu_ratio:.2}x \
         ({cpu_low:.2} to {cpu_high:.2})."
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
