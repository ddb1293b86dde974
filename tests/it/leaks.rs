//! Leaks and limits, against the real `serve` binary: many SSE connects and
//! disconnects and many requests with random keys leave no watcher,
//! registration, pending reply or memory behind (the process's VmRSS:
//! in-process RSS would measure the test's allocator, not the gateway), and
//! clients that send their request too slowly or too much are cut off.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use statestore_gateway::emulator::EmulatorHandle;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::Mosquitto;
use crate::support::emulator::start_emulator;
use crate::support::gateway_process::{GatewayProcess, cpu_time};
use crate::support::sse;

/// How far RSS may stay above where it was after the warm-up.
const RSS_TOLERANCE: f64 = 1.10;

/// Concurrent clients.
const CONCURRENCY: usize = 32;

/// Waits until the gateway and the store hold nothing for anyone: no
/// watcher, no watched key, no store request in flight or awaiting a
/// reply, no KEYNOTIFY registration.
async fn wait_until_idle(gateway: &GatewayProcess, store: &EmulatorHandle) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counts = [
            gateway.metric("statestore_gateway_watchers").await,
            gateway.metric("statestore_gateway_watched_keys").await,
            gateway
                .metric("statestore_gateway_store_requests_in_flight")
                .await,
            gateway
                .metric("statestore_gateway_store_pending_replies")
                .await,
            store.registrations() as f64,
        ];
        if counts.iter().all(|count| *count == 0.0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not back to zero within 30 s: watchers, watched keys, in flight, \
             pending replies, store registrations = {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `count` streams opened on random keys among 200, each read up to its
/// first `sync` and dropped, `CONCURRENCY` at a time.
async fn watch_cycles(gateway: &GatewayProcess, count: usize) {
    futures_util::stream::iter(0..count)
        .map(|_| async {
            let key = format!("w{}", rand::random::<u32>() % 200);
            let mut stream = sse::open(&gateway.http, &gateway.url(&format!("/watch/{key}")), None)
                .await
                .unwrap_or_else(|(status, _, body)| panic!("watch {key}: {status} {body}"));
            stream.expect("sync").await;
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

/// `count` requests on random keys (PUT with a short TTL, and GET and
/// DELETE of keys nobody wrote), pipelined: `CONNECTIONS` raw HTTP/1.1
/// connections, each sending `DEPTH` requests before reading their
/// answers, so the client costs little CPU next to the gateway. Panics on
/// any answer other than the expected one.
async fn random_key_requests(addr: SocketAddr, count: usize) {
    const CONNECTIONS: usize = 48;
    const DEPTH: usize = 8;
    let per_connection = count.div_ceil(CONNECTIONS);
    let connections = (0..CONNECTIONS).map(|_| async move {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let mut reader = ResponseReader::default();
        let mut sent = 0;
        while sent < per_connection {
            let batch = DEPTH.min(per_connection - sent);
            let mut requests = Vec::new();
            let mut expected = Vec::new();
            for n in sent..sent + batch {
                let key = format!("r{:016x}", rand::random::<u64>());
                let (request, status) = match n % 3 {
                    0 => (
                        format!("PUT /keys/{key}?ttl=2s HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv"),
                        200,
                    ),
                    1 => (format!("GET /keys/{key} HTTP/1.1\r\nHost: x\r\n\r\n"), 404),
                    _ => (format!("DELETE /keys/{key} HTTP/1.1\r\nHost: x\r\n\r\n"), 404),
                };
                requests.extend_from_slice(request.as_bytes());
                expected.push((status, key));
            }
            stream.write_all(&requests).await.unwrap();
            for (status, key) in expected {
                let got = tokio::time::timeout(Duration::from_secs(30), reader.next(&mut stream))
                    .await
                    .unwrap_or_else(|_| panic!("no answer about {key} within 30 s"));
                assert_eq!(got, status, "{key}");
            }
            sent += batch;
        }
    });
    futures_util::future::join_all(connections).await;
}

/// Reads pipelined responses off one connection: status line, headers,
/// and a `Content-Length` body (all the gateway's answers here have one).
#[derive(Debug, Default)]
struct ResponseReader {
    buffer: Vec<u8>,
}

impl ResponseReader {
    /// The next response's status.
    async fn next(&mut self, stream: &mut TcpStream) -> u16 {
        loop {
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buffer[..end]).into_owned();
                let status: u16 = head
                    .get(9..12)
                    .and_then(|code| code.parse().ok())
                    .unwrap_or_else(|| panic!("not a status line: {head}"));
                let length: usize = head
                    .lines()
                    .filter_map(|line| line.split_once(':'))
                    .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |(_, value)| value.trim().parse().unwrap());
                let total = end + 4 + length;
                if self.buffer.len() >= total {
                    self.buffer.drain(..total);
                    return status;
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the gateway closed a pipelined connection");
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }
}

fn assert_rss_back(what: &str, baseline_kib: u64, after_kib: u64) {
    eprintln!("{what}: VmRSS {baseline_kib} KiB after the warm-up, {after_kib} KiB after the run");
    assert!(
        after_kib as f64 <= baseline_kib as f64 * RSS_TOLERANCE,
        "{what}: VmRSS grew from {baseline_kib} KiB to {after_kib} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sse_connects_and_disconnects_leave_no_registration_or_memory_behind() {
    let broker = Mosquitto::start().await;
    let emulator = start_emulator(&broker).await;
    let store = emulator.handle();
    let gateway = GatewayProcess::start(broker.port(), &[]).await;

    // Warm-up at the same concurrency: buffers, allocator arenas and
    // connection pools reach their working size.
    watch_cycles(&gateway, 1_000).await;
    wait_until_idle(&gateway, &store).await;
    let baseline = gateway.rss_kib();

    let started = Instant::now();
    let (gateway_cpu, own_cpu) = (gateway.cpu_time(), cpu_time("/proc/self/stat"));
    watch_cycles(&gateway, 10_000).await;
    eprintln!(
        "10,000 watch cycles in {:?}; CPU: gateway {:?}, test process (client, emulator) {:?}",
        started.elapsed(),
        gateway.cpu_time() - gateway_cpu,
        cpu_time("/proc/self/stat") - own_cpu
    );
    wait_until_idle(&gateway, &store).await;
    assert_rss_back("watch cycles", baseline, gateway.rss_kib());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_random_key_requests_leave_no_pending_reply_or_memory_behind() {
    let broker = Mosquitto::start().await;
    let emulator = start_emulator(&broker).await;
    let store = emulator.handle();
    let gateway = GatewayProcess::start(broker.port(), &[]).await;

    random_key_requests(gateway.api, 10_000).await;
    wait_until_idle(&gateway, &store).await;
    let baseline = gateway.rss_kib();

    let started = Instant::now();
    let (gateway_cpu, own_cpu) = (gateway.cpu_time(), cpu_time("/proc/self/stat"));
    random_key_requests(gateway.api, 100_000).await;
    eprintln!(
        "100,000 requests in {:?}; CPU: gateway {:?}, test process (client, emulator) {:?}",
        started.elapsed(),
        gateway.cpu_time() - gateway_cpu,
        cpu_time("/proc/self/stat") - own_cpu
    );
    wait_until_idle(&gateway, &store).await;
    assert_rss_back("random-key requests", baseline, gateway.rss_kib());
    let requests = gateway
        .metric("statestore_gateway_http_requests_total")
        .await;
    assert!(requests >= 110_000.0, "{requests} requests counted");
}

/// The large value of the memory test: 16 MB of zeros, the worst case of
/// the JSON form (each zero byte is `\u0000`, six bytes, plus its base64).
const LARGE_VALUE: usize = 16_000_000;

/// How far the gateway's peak memory may grow over its baseline, in values
/// in flight (the bound docs/api.md states): a read holds its value once,
/// whatever the form; a write also has it in the MQTT connection's write
/// buffer, and a watched key once more as the notification arrives.
const READ_MULTIPLE: f64 = 1.5;
const WATCHED_WRITE_MULTIPLE: f64 = 4.0;

/// Asserts that the peak since the last reset grew by at most `multiple`
/// times `values` large values over `baseline_kib`.
fn assert_peak_within(
    gateway: &GatewayProcess,
    what: &str,
    baseline_kib: u64,
    values: usize,
    multiple: f64,
) {
    assert_peak_within_sized(gateway, what, baseline_kib, values, LARGE_VALUE, multiple);
}

/// Asserts that the peak since the last reset grew by at most `multiple`
/// times `values` values of `value_bytes` over `baseline_kib`.
fn assert_peak_within_sized(
    gateway: &GatewayProcess,
    what: &str,
    baseline_kib: u64,
    values: usize,
    value_bytes: usize,
    multiple: f64,
) {
    let peak = gateway.peak_rss_kib();
    let grown = peak.saturating_sub(baseline_kib) as f64 * 1024.0;
    let in_flight = (values * value_bytes) as f64;
    eprintln!(
        "{what}: peak VmHWM {peak} KiB, {:.1} MB over the baseline ({:.2} x {values} value(s) of {value_bytes} bytes)",
        grown / 1e6,
        grown / in_flight
    );
    assert!(
        grown <= multiple * in_flight,
        "{what}: peak memory grew by {:.1} MB, over {multiple} x {values} value(s) of {value_bytes} bytes",
        grown / 1e6
    );
}

/// `GET` of `url` as JSON: its status and body.
async fn get_json_bytes(http: &reqwest::Client, url: &str) -> (u16, bytes::Bytes) {
    let response = http
        .get(url)
        .header("accept", "application/json")
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_keep_the_gateways_memory_within_a_small_multiple_of_the_values_in_flight() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    // Four 16 MB reads at once through debug builds can take longer than
    // the default 10 s request timeout on a busy machine (504); this test
    // is about memory.
    let gateway = GatewayProcess::start(broker.port(), &["--request-timeout", "60s"]).await;
    eprintln!("VmRSS at start {} KiB", gateway.rss_kib());
    let big = gateway.key(b"big");
    let zeros = vec![0u8; LARGE_VALUE];
    let put = |body: Vec<u8>| {
        gateway
            .http
            .put(&big)
            .body(body)
            .timeout(Duration::from_secs(60))
            .send()
    };
    let written = put(zeros.clone()).await.unwrap();
    assert_eq!(
        written.status(),
        200,
        "a 16 MB value is under the default limit"
    );
    // Small requests of each kind first, so that buffers and pools have
    // their working size; then let the allocator give back the large write.
    let (status, _) = get_json_bytes(&gateway.http, &gateway.key(b"small")).await;
    assert_eq!(status, 404);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let baseline = gateway.rss_kib();
    eprintln!("baseline VmRSS {baseline} KiB");

    // One JSON read: the whole document, and it means the value.
    gateway.reset_peak_rss();
    let (status, body) = get_json_bytes(&gateway.http, &big).await;
    assert_eq!(status, 200);
    let document: serde_json::Value = serde_json::from_slice(&body).unwrap();
    drop(body);
    assert_eq!(document["key"], "big");
    assert_eq!(document["value"].as_str().map(str::len), Some(LARGE_VALUE));
    assert!(document["value"].as_str().unwrap().bytes().all(|b| b == 0));
    let base64 = document["value_base64"].as_str().unwrap();
    use base64::Engine as _;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(base64)
            .unwrap(),
        zeros
    );
    assert!(document["version"].is_string());
    drop(document);
    assert_peak_within(&gateway, "one JSON read", baseline, 1, READ_MULTIPLE);

    // Four at once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    gateway.reset_peak_rss();
    let reads = (0..4).map(|_| get_json_bytes(&gateway.http, &big));
    for (status, body) in futures_util::future::join_all(reads).await {
        assert_eq!(status, 200);
        assert!(
            body.len() > 6 * LARGE_VALUE,
            "the whole document: {}",
            body.len()
        );
    }
    assert_peak_within(
        &gateway,
        "four JSON reads at once",
        baseline,
        4,
        READ_MULTIPLE,
    );

    // A watcher, then a write of another large value it hears of.
    tokio::time::sleep(Duration::from_secs(2)).await;
    gateway.reset_peak_rss();
    let mut stream = sse::open(&gateway.http, &gateway.url("/watch/big"), None)
        .await
        .unwrap_or_else(|(status, _, body)| panic!("watch: {status} {body}"));
    let sync = stream.expect("sync").await;
    assert_eq!(sync.data["exists"], true);
    assert_eq!(sync.data["value_omitted"], true, "{:?}", sync.data);
    assert_eq!(sync.data["value_bytes"], LARGE_VALUE);
    assert!(sync.data["value_base64"].is_null());
    let written = put(vec![1u8; LARGE_VALUE]).await.unwrap();
    assert_eq!(written.status(), 200);
    let version = written.headers()["etag"]
        .to_str()
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let set = stream.expect("set").await;
    assert_eq!(set.data["version"], version.as_str());
    assert_eq!(set.data["value_omitted"], true);
    assert_eq!(set.data["value_bytes"], LARGE_VALUE);
    assert_peak_within(
        &gateway,
        "a watcher and a write",
        baseline,
        1,
        WATCHED_WRITE_MULTIPLE,
    );
    // Nothing keeps the value once every watcher has its event.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = gateway.rss_kib();
    eprintln!("4 s after the write, with the watcher still open: VmRSS {after} KiB");
    assert!(
        after * 1024 <= baseline * 1024 + LARGE_VALUE as u64 + (LARGE_VALUE as u64) / 2,
        "VmRSS {after} KiB, 4 s after the write, against {baseline} KiB before"
    );
    drop(stream);
}

/// A batch of millions of ops, refused (413) for its count, costs the
/// gateway about its own size in memory: the ops past the limit are never
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_its_op_count_costs_about_its_own_size() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let gateway = GatewayProcess::start(broker.port(), &[]).await;
    let post = |body: Vec<u8>| {
        gateway
            .http
            .post(gateway.url("/batch"))
            .header("content-type", "application/json")
            .body(body)
            .timeout(Duration::from_secs(60))
            .send()
    };
    let small = post(br#"{"ops":[{"op":"get","key":"k"}]}"#.to_vec())
        .await
        .unwrap();
    assert_eq!(small.status(), 200);
    // `{"ops":[0,0,...,0]}` of the largest body a batch may have: 16 MiB,
    // about 8.4 million ops.
    let limit = 16 * 1024 * 1024;
    let mut body = br#"{"ops":["#.to_vec();
    while body.len() + b"0,0]}".len() <= limit {
        body.extend_from_slice(b"0,");
    }
    body.extend_from_slice(b"0]}");
    assert!(body.len() <= limit);
    let size = body.len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = gateway.rss_kib();
    gateway.reset_peak_rss();
    let refused = post(body).await.unwrap();
    assert_eq!(refused.status(), 413);
    let problem: serde_json::Value =
        serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
    assert_eq!(problem["type"], "/problems/too-many-ops", "{problem}");
    let grown = gateway.peak_rss_kib().saturating_sub(baseline) * 1024;
    eprintln!(
        "a refused batch of {size} bytes: peak VmHWM {:.1} MB over the baseline ({:.2} x the body)",
        grown as f64 / 1e6,
        grown as f64 / size as f64
    );
    assert!(
        grown <= 2 * size as u64,
        "a refused batch of {size} bytes grew peak memory by {grown} bytes"
    );
}

/// An HTTP/2 client that never reads (its stream window 0, pings answered
/// by its connection) asks for 50 values of 2 MB: the gateway holds them
/// while it waits, and gives each stream up once it has made no progress
/// for the stall timeout (60 s), its memory returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_a_client_never_reads_are_given_up_and_their_memory_freed() {
    use http_body_util::BodyExt as _;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    const VALUES: usize = 50;
    const VALUE_BYTES: usize = 2_000_000;
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let gateway = GatewayProcess::start(broker.port(), &[]).await;
    let written = gateway
        .http
        .put(gateway.key(b"two-mb"))
        .body(vec![b'v'; VALUE_BYTES])
        .send()
        .await
        .unwrap();
    assert_eq!(written.status(), 200);
    let connect = |window: Option<u32>| async move {
        let tcp = TcpStream::connect(gateway.api).await.unwrap();
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        if let Some(window) = window {
            builder
                .initial_stream_window_size(window)
                .adaptive_window(false);
        }
        let (sender, connection) = builder.handshake(TokioIo::new(tcp)).await.unwrap();
        // Drives the connection: frames in and out, pings answered.
        let driven = tokio::spawn(connection);
        (sender, driven)
    };
    let get = || {
        hyper::Request::get(format!("http://{}/keys/two-mb", gateway.api))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    // Warm-up: one value read whole over HTTP/2.
    let (mut reader, reading) = connect(None).await;
    let response = reader.send_request(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), VALUE_BYTES);
    drop((reader, reading));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let baseline = gateway.rss_kib();

    let (stuck, connection) = connect(Some(0)).await;
    let mut held = Vec::new();
    for _ in 0..VALUES {
        let mut sender = stuck.clone();
        let response = tokio::time::timeout(Duration::from_secs(30), async move {
            sender.ready().await.unwrap();
            sender.send_request(get()).await.unwrap()
        })
        .await
        .expect("the response head, which flow control does not hold");
        assert_eq!(response.status(), 200);
        held.push(response);
    }
    let holding = gateway.rss_kib();
    eprintln!("VmRSS {baseline} KiB before, {holding} KiB holding {VALUES} unread values");
    assert!(
        (holding.saturating_sub(baseline) * 1024) as usize >= VALUES * VALUE_BYTES / 2,
        "the unread values are held while the client may still read them"
    );
    let started = Instant::now();
    loop {
        let now = gateway.rss_kib();
        if (now.saturating_sub(baseline) * 1024) as usize <= VALUES * VALUE_BYTES / 10 {
            eprintln!("VmRSS {now} KiB {:?} later", started.elapsed());
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(80),
            "VmRSS still {now} KiB after {:?} (before: {baseline} KiB): the stalled streams are kept",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        !connection.is_finished(),
        "the client's connection stays open"
    );
    drop(held);
}

/// Reads a response head (status line and headers) or until the server
/// closes; `None` if neither happens within `within`.
async fn read_head(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut received = Vec::new();
    tokio::time::timeout(within, async {
        let mut buffer = [0u8; 4096];
        while !received.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(String::from_utf8_lossy(&received).into_owned())
}

/// Whether the server closes the connection within `within` (reading and
/// discarding whatever it sends first).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

async fn send(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_oversized_requests_are_cut_off_by_timeouts_and_limits() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let header_timeout = Duration::from_secs(1);
    let request_timeout = Duration::from_secs(2);
    let gateway = GatewayProcess::start(
        broker.port(),
        &[
            "--header-read-timeout",
            "1s",
            "--request-timeout",
            "2s",
            "--max-value-bytes",
            "1024",
        ],
    )
    .await;
    let api = gateway.api;
    // Generous: the limit plus scheduling on a loaded machine.
    let cut_within = header_timeout + Duration::from_secs(2);

    // A crowd of connections that never send a byte: all closed.
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(TcpStream::connect(api).await.unwrap());
    }
    let started = Instant::now();
    for stream in &mut silent {
        let left = cut_within.saturating_sub(started.elapsed());
        assert!(
            closed_within(stream, left).await,
            "a silent connection stays open"
        );
    }

    // Slow loris: the headers come a byte every 100 ms and never end.
    let mut loris = TcpStream::connect(api).await.unwrap();
    let started = Instant::now();
    let (mut reader, mut writer) = loris.split();
    let drip = async {
        for byte in b"GET /keys/a HTTP/1.1\r\nHost: x\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let closed = async {
        let mut buffer = [0u8; 1024];
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        () = closed => {}
        () = drip => panic!("the drip stopped on its own"),
        () = tokio::time::sleep(Duration::from_secs(10)) => panic!("a slow loris keeps its connection"),
    }
    assert!(
        started.elapsed() <= cut_within,
        "cut after {:?}",
        started.elapsed()
    );

    // A keep-alive connection left idle after a request is closed too.
    let mut idle = send(api, b"GET /keys/a HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let head = read_head(&mut idle, Duration::from_secs(5)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert!(
        closed_within(&mut idle, cut_within).await,
        "idle keep-alive stays open"
    );

    // Headers over the size limit: 431, then closed.
    let request = format!(
        "GET /keys/a HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(80 * 1024)
    );
    let mut big = TcpStream::connect(api).await.unwrap();
    // The server may answer and close before reading it all.
    let _ = big.write_all(request.as_bytes()).await;
    let head = read_head(&mut big, Duration::from_secs(5)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");

    // A declared body over the value limit: 413 before a byte of it is sent.
    let mut declared = send(
        api,
        b"PUT /keys/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n",
    )
    .await;
    let head = read_head(&mut declared, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");

    // A chunked body that grows past the limit: 413 once it does.
    let mut chunked = send(
        api,
        b"PUT /keys/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await;
    for _ in 0..3 {
        let chunk = format!("200\r\n{}\r\n", "b".repeat(0x200));
        if chunked.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let head = read_head(&mut chunked, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");

    // A body that stalls halfway: 408 at the request timeout.
    let mut stalled = send(
        api,
        b"PUT /keys/a HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nten bytes.",
    )
    .await;
    let started = Instant::now();
    let head = read_head(&mut stalled, request_timeout + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    let waited = started.elapsed();
    assert!(
        waited >= request_timeout.mul_f64(0.9)
            && waited <= request_timeout + Duration::from_secs(2),
        "408 after {waited:?}"
    );

    // And the gateway still serves everyone else.
    let response = gateway
        .http
        .put(gateway.key(b"after"))
        .body("ok")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// Container runtimes may start the gateway at a soft limit of 1,024 open
/// files (here: 256) with a much higher hard limit: it raises its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_soft_open_file_limit_is_raised_and_more_watchers_than_it_fit() {
    const SOFT: u64 = 256;
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let gateway = GatewayProcess::start_with_open_file_limit(broker.port(), &[], Some(SOFT)).await;
    let (soft, hard) = gateway.open_file_limits();
    assert_eq!(soft, hard, "the soft limit is raised to the hard one");
    assert!(
        hard > SOFT * 2,
        "this machine's hard limit ({hard}) is too low to show it"
    );

    let mut streams = Vec::new();
    for _ in 0..SOFT + 100 {
        let mut raw =
            sse::open_raw(gateway.api, &["GET /watch/fd HTTP/1.1\r\nHost: x\r\n\r\n"]).await;
        assert_eq!(raw.status, 200, "{}", raw.head);
        raw.stream.expect("sync").await;
        streams.push(raw);
    }
    assert_eq!(
        gateway.metric("statestore_gateway_watchers").await,
        (SOFT + 100) as f64
    );
}

/// Watch streams are answered without hyper's per-connection buffers and
/// keep only what their life needs: a stream of one key holds a small part
/// of what an idle keep-alive connection holds once hyper has served it a
/// request (its read buffer alone is 8 KiB). Both are measured here, as
/// RSS growth over as many connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stream_of_one_key_holds_a_small_part_of_an_idle_keep_alive_connection() {
    const CONNECTIONS: usize = 2_000;
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let gateway = GatewayProcess::start(broker.port(), &[]).await;
    let response = gateway
        .http
        .put(gateway.key(b"held"))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Warm-up: streams come and go, so that allocator arenas and the
    // key's own state are there before the baseline.
    watch_cycles(&gateway, 1_000).await;
    let open_stream = || async {
        let mut raw = sse::open_raw(
            gateway.api,
            &["GET /watch/held HTTP/1.1\r\nHost: x\r\n\r\n"],
        )
        .await;
        assert_eq!(raw.status, 200, "{}", raw.head);
        raw.stream.expect("sync").await;
        raw
    };
    let first = open_stream().await;
    let before = settled_rss_kib(&gateway).await;
    let mut streams = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        streams.push(open_stream().await);
    }
    let with_streams = settled_rss_kib(&gateway).await;
    let mut idle = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let raw = sse::open_raw(gateway.api, &["GET /keys/held HTTP/1.1\r\nHost: x\r\n\r\n"]).await;
        assert_eq!(raw.status, 200, "{}", raw.head);
        idle.push(raw);
    }
    let with_idle = settled_rss_kib(&gateway).await;
    let per_stream = with_streams.saturating_sub(before) as f64 * 1024.0 / CONNECTIONS as f64;
    let per_idle = with_idle.saturating_sub(with_streams) as f64 * 1024.0 / CONNECTIONS as f64;
    eprintln!(
        "{CONNECTIONS} connections: VmRSS {before} KiB, {with_streams} KiB with watch streams, \
         {with_idle} KiB with idle keep-alive ones too: {per_stream:.0} B per stream, {per_idle:.0} B per idle connection"
    );
    assert!(
        per_stream <= per_idle * STREAM_SHARE_OF_IDLE_CONNECTION,
        "a watch stream of one key holds {per_stream:.0} B, an idle keep-alive connection {per_idle:.0} B"
    );
    assert_eq!(
        gateway.metric("statestore_gateway_watchers").await,
        (CONNECTIONS + 1) as f64
    );
    drop((first, streams, idle));
}

/// VmRSS of the gateway, after jemalloc had time to return freed pages.
async fn settled_rss_kib(gateway: &GatewayProcess) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    gateway.rss_kib()
}

/// What a watch stream of one key may hold, as a share of an idle
/// keep-alive connection (about a third here; a stream that kept its
/// request, response head and a task sized for HTTP/2 held two thirds).
const STREAM_SHARE_OF_IDLE_CONNECTION: f64 = 0.45;

/// Reads a pattern stream's initial picture: its `sync`s up to `listed`.
async fn read_initial(stream: &mut sse::SseStream) -> usize {
    let mut synced = 0;
    loop {
        let event = stream
            .next(Duration::from_secs(60))
            .await
            .expect("the initial listing ends within 60 s");
        match event.event.as_str() {
            "sync" => synced += 1,
            "listed" => return synced,
            other => panic!("only syncs before listed, got {other}: {event:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_on_one_pattern_share_its_keys_and_each_adds_a_small_part_of_their_memory() {
    const KEYS: usize = PER_STREAM_KEYS;
    const STREAMS: usize = 20;
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let gateway = GatewayProcess::start(broker.port(), &[]).await;
    let value = "v".repeat(32);
    // Batches of 100: fewer than the pool's requests in flight, so that
    // no set is turned away.
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<serde_json::Value> = chunk
            .iter()
            .map(|n| serde_json::json!({"op": "set", "key": format!("ks/{n:05}"), "value": value}))
            .collect();
        let response = gateway
            .http
            .post(gateway.url("/batch"))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "ops": ops }).to_string())
            .send()
            .await
            .expect("the batch is answered");
        assert_eq!(response.status(), 200);
    }
    // Warm-up: a stream on another pattern brings buffers and allocator
    // arenas to their working size.
    let mut warm = sse::open(&gateway.http, &gateway.url("/watch?match=none/*"), None)
        .await
        .expect("the warm-up stream opens");
    read_initial(&mut warm).await;
    let before = gateway.rss_kib();

    let open = || async {
        let mut stream = sse::open(&gateway.http, &gateway.url("/watch?match=ks/*"), None)
            .await
            .expect("the pattern stream opens");
        assert_eq!(read_initial(&mut stream).await, KEYS);
        stream
    };
    let mut streams = vec![open().await];
    let first = gateway.rss_kib();
    for _ in 1..STREAMS {
        streams.push(open().await);
    }
    let all = gateway.rss_kib();
    let shared = first.saturating_sub(before) as f64;
    let per_stream = all.saturating_sub(first) as f64 / (STREAMS - 1) as f64;
    eprintln!(
        "{KEYS} keys followed: VmRSS {before} KiB before, {first} KiB with one stream, \
         {all} KiB with {STREAMS}: {shared:.0} KiB for the first, {per_stream:.0} KiB for each other"
    );
    assert!(
        per_stream <= shared * PER_STREAM_SHARE,
        "each stream after the first took {per_stream:.0} KiB, the first {shared:.0} KiB"
    );
    assert_eq!(
        gateway.metric("statestore_gateway_watched_keys").await,
        KEYS as f64
    );
}

/// The keys of the pattern the streams follow.
const PER_STREAM_KEYS: usize = 5_000;

/// What a stream on a followed pattern may add, after the first, as a
/// share of the memory the first one took (the pattern's keys): the goals'
/// ratio, 64 KiB per stream against 512 bytes for each key.
const PER_STREAM_SHARE: f64 = 64.0 * 1024.0 / (PER_STREAM_KEYS as f64 * 512.0);

/// The values of the batch and listing memory tests: 100 of 1 MB of text.
const MANY_VALUES: usize = 100;
const MEGABYTE_VALUE: usize = 1_000_000;

/// Asserts that the peak since the last reset grew by at most
/// [`READ_MULTIPLE`] times the `MANY_VALUES` values over `baseline_kib`.
fn assert_peak_within_values(gateway: &GatewayProcess, what: &str, baseline_kib: u64) {
    assert_peak_within_sized(
        gateway,
        what,
        baseline_kib,
        MANY_VALUES,
        MEGABYTE_VALUE,
        READ_MULTIPLE,
    );
}

/// The value of key `n` of the batch and listing memory tests: 1 MB of
/// one letter, different for each key.
fn megabyte_value(n: usize) -> Vec<u8> {
    vec![b'a' + (n % 26) as u8; MEGABYTE_VALUE]
}

/// Writes `MANY_VALUES` keys `{prefix}{n:03}` of 1 MB each, then lets the
/// allocator give back the writes; the gateway's VmRSS after.
async fn write_megabyte_values(gateway: &GatewayProcess, prefix: &str) -> u64 {
    for n in 0..MANY_VALUES {
        let written = gateway
            .http
            .put(gateway.key(format!("{prefix}{n:03}").as_bytes()))
            .body(megabyte_value(n))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .unwrap();
        assert_eq!(written.status(), 200);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    gateway.rss_kib()
}

/// A batch of 100 gets of 1 MB values (ten keys, each read ten times) is
/// answered as the reads are done, each result written as the client takes
/// it: the gateway's peak memory grows by at most the bound of single
/// reads, whatever the size of the answer's JSON (about 2.3 times the
/// values here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_large_reads_keeps_the_gateways_memory_within_a_small_multiple_of_its_values() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    // The batch's deadline is one request timeout: 100 MiB through debug
    // builds of the gateway and the emulator can take longer than the
    // default 10 s on a busy machine, and this test is about memory.
    let gateway = GatewayProcess::start(broker.port(), &["--request-timeout", "60s"]).await;
    write_megabyte_values(&gateway, "batch/").await;
    let post = |ops: Vec<serde_json::Value>| {
        gateway
            .http
            .post(gateway.url("/batch"))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "ops": ops }).to_string())
            .timeout(Duration::from_secs(120))
            .send()
    };
    // Warm-up: a small batch of each kind of op.
    let warm = post(vec![
        serde_json::json!({"op": "get", "key": "batch/000"}),
        serde_json::json!({"op": "get", "key": "absent"}),
    ])
    .await
    .unwrap();
    assert_eq!(warm.status(), 200);
    drop(warm.bytes().await.unwrap());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let baseline = gateway.rss_kib();
    gateway.reset_peak_rss();

    let key_of = |op: usize| op % 10;
    let ops = (0..MANY_VALUES)
        .map(|op| serde_json::json!({"op": "get", "key": format!("batch/{:03}", key_of(op))}))
        .collect();
    let response = post(ops).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.bytes().await.unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    drop(body);
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), MANY_VALUES);
    for (op, result) in results.iter().enumerate() {
        let value = megabyte_value(key_of(op));
        assert_eq!(result["status"], 200, "op {op}");
        assert!(result["version"].is_string(), "op {op}");
        assert_eq!(
            result["value"].as_str().map(str::as_bytes),
            Some(&value[..])
        );
        use base64::Engine as _;
        assert_eq!(
            result["value_base64"].as_str(),
            Some(
                base64::engine::general_purpose::STANDARD
                    .encode(&value)
                    .as_str()
            )
        );
    }
    drop(answer);
    assert_peak_within_values(&gateway, "a batch of 100 large reads", baseline);
}
/// A listing with values of 100 keys of 1 MB, followed page by page to its
/// end, lists every key once with its value, and the gateway's peak memory
/// grows by at most the bound of single reads: a page stops early, with
/// its cursor, once its values are large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_large_values_keeps_the_gateways_memory_within_a_small_multiple_of_its_values()
{
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let gateway = GatewayProcess::start(broker.port(), &[]).await;
    write_megabyte_values(&gateway, "listed/").await;
    let (status, _) = get_json_bytes(
        &gateway.http,
        &gateway.url("/keys?match=listed/000&values=true"),
    )
    .await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let baseline = gateway.rss_kib();
    gateway.reset_peak_rss();

    let mut listed = Vec::new();
    let mut pages = 0;
    let mut next = Some(gateway.url("/keys?match=listed/*&values=true&limit=1000"));
    while let Some(url) = next.take() {
        let (status, body) = get_json_bytes(&gateway.http, &url).await;
        assert_eq!(
            status,
            200,
            "{}",
            String::from_utf8_lossy(&body[..body.len().min(500)])
        );
        let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
        drop(body);
        pages += 1;
        for entry in page["keys"].as_array().unwrap() {
            let key = entry["key"].as_str().unwrap().to_owned();
            let n: usize = key.strip_prefix("listed/").unwrap().parse().unwrap();
            assert_eq!(
                entry["value"].as_str().map(str::as_bytes),
                Some(&megabyte_value(n)[..]),
                "{key}"
            );
            assert!(entry["version"].is_string(), "{key}");
            listed.push(n);
        }
        if let Some(cursor) = page["next"].as_str() {
            next = Some(gateway.url(&format!(
                "/keys?match=listed/*&values=true&limit=1000&cursor={cursor}"
            )));
        }
    }
    listed.sort_unstable();
    assert_eq!(
        listed,
        (0..MANY_VALUES).collect::<Vec<_>>(),
        "each key once"
    );
    eprintln!("100 values of 1 MB listed in {pages} page(s)");
    assert_peak_within_values(&gateway, "a listing of 100 large values", baseline);
}
