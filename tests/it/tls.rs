//! TLS and HTTP/2 on the key API, over real TLS connections: HTTP/2 or
//! HTTP/1.1 by ALPN, HTTP/2 with prior knowledge on the plain listener, a
//! renewed certificate served without a restart, many watch streams on one
//! HTTP/2 connection, a stream that is not read, hostile handshakes, and
//! unusable certificate settings.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use reqwest::Version;
use statestore_gateway::watch::WatchSettings;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::emulator::start_emulator;
use crate::support::gateway::{GatewayOptions, Stack, StackBuilder};
use crate::support::gateway_process::{GatewayProcess, binary_command};
use crate::support::{Mosquitto, TestPki, sse};

/// A stack whose key API serves TLS with a certificate of `pki`.
fn tls_stack(pki: &TestPki, options: GatewayOptions) -> StackBuilder {
    Stack::builder().gateway(GatewayOptions {
        api_tls: Some((pki.server_cert.clone(), pki.server_key.clone())),
        ..options
    })
}

/// A client trusting only `ca`: HTTP/2 or HTTP/1.1 as ALPN decides.
fn client_trusting(ca: &Path) -> reqwest::ClientBuilder {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .no_proxy()
        // Each wait is bounded, not a whole request: a watch stream outlives
        // any one wait (a total timeout ends it mid-test on a busy machine).
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(30))
}

fn https(port: u16, path: &str) -> String {
    format!("https://localhost:{port}{path}")
}

async fn put_and_get(client: &reqwest::Client, port: u16, key: &str, expect: Version) {
    let url = https(port, &format!("/keys/{key}"));
    let put = client.put(&url).body(key.to_owned()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    assert_eq!(put.version(), expect);
    let get = client.get(&url).send().await.unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.version(), expect);
    assert_eq!(get.text().await.unwrap(), key);
}

#[tokio::test]
async fn tls_serves_http2_or_http1_as_alpn_chooses() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "api");
    let stack = tls_stack(&pki, GatewayOptions::default()).start().await;
    let port = stack.gateway.api.port();

    let tls13 = client_trusting(&pki.ca)
        .min_tls_version(reqwest::tls::Version::TLS_1_3)
        .build()
        .unwrap();
    put_and_get(&tls13, port, "over-h2", Version::HTTP_2).await;
    let http1 = client_trusting(&pki.ca).http1_only().build().unwrap();
    put_and_get(&http1, port, "over-http1", Version::HTTP_11).await;
    let tls12 = client_trusting(&pki.ca)
        .max_tls_version(reqwest::tls::Version::TLS_1_2)
        .build()
        .unwrap();
    put_and_get(&tls12, port, "over-tls12", Version::HTTP_2).await;

    // A watch whose connection starts with it (a new client: a new
    // connection) is written by the gateway itself, over TLS too: each
    // event arrives when it happens.
    let watcher = client_trusting(&pki.ca).http1_only().build().unwrap();
    let mut stream = sse::open(&watcher, &https(port, "/watch/over-http1"), None)
        .await
        .unwrap();
    assert_eq!(
        stream.headers["connection"], "close",
        "not the gateway's writer"
    );
    stream.expect("sync").await;
    http1
        .put(https(port, "/keys/over-http1"))
        .body("changed")
        .send()
        .await
        .unwrap();
    let set = stream.expect("set").await;
    assert_eq!(set.data["value"], "changed");
}

#[tokio::test]
async fn the_plain_listener_takes_http2_with_prior_knowledge() {
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            watch: WatchSettings {
                keep_alive: Duration::from_millis(200),
                ..WatchSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let h2c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .no_proxy()
        .read_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let url = stack.gateway.url("/keys/h2c");
    let put = h2c.put(&url).body("prior").send().await.unwrap();
    assert_eq!(
        (put.status().as_u16(), put.version()),
        (200, Version::HTTP_2)
    );
    let mut stream = sse::open(&h2c, &stack.gateway.url("/watch/h2c"), None)
        .await
        .unwrap();
    assert_eq!(stream.expect("sync").await.data["value"], "prior");
    // Keep-alive comments while nothing changes, then the change.
    stream.expect_silence(Duration::from_millis(700)).await;
    assert!(stream.comments >= 2, "{} keep-alives", stream.comments);
    h2c.put(&url).body("next").send().await.unwrap();
    assert_eq!(stream.expect("set").await.data["value"], "next");
    // HTTP/1.1 on the same listener is as it was.
    let get = stack.gateway.get(b"h2c").await;
    assert_eq!(get.version(), Version::HTTP_11);
    assert_eq!(get.text().await.unwrap(), "next");
}

#[tokio::test]
async fn a_renewed_certificate_is_served_to_new_connections_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "first");
    let stack = tls_stack(&pki, GatewayOptions::default()).start().await;
    let port = stack.gateway.api.port();
    let first = client_trusting(&pki.ca).build().unwrap();
    put_and_get(&first, port, "before", Version::HTTP_2).await;

    let renewed = TestPki::generate(dir.path(), "renewed");
    // Replaced as a Secret mount does: new content, new modification time.
    std::fs::copy(&renewed.server_key, &pki.server_key).unwrap();
    std::fs::copy(&renewed.server_cert, &pki.server_cert).unwrap();
    // Checked at most once a second; 20 s leaves room for a loaded machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        // A fresh client each time: a new connection, a new handshake.
        let client = client_trusting(&renewed.ca).build().unwrap();
        match client.get(https(port, "/keys/before")).send().await {
            Ok(response) if response.status() == 200 => break,
            _ => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the renewed certificate is served within 20 s"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // The connection opened before keeps working with its certificate ...
    put_and_get(&first, port, "before", Version::HTTP_2).await;
    // ... and new ones no longer get the old certificate.
    let stale = client_trusting(&pki.ca).build().unwrap();
    assert!(stale.get(https(port, "/keys/before")).send().await.is_err());
}

#[tokio::test]
async fn many_watch_streams_share_one_http2_connection_each_with_its_events_and_limits() {
    const STREAMS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "api");
    let stack = tls_stack(
        &pki,
        GatewayOptions {
            // Every stream on one connection, or the test fails to open them.
            max_connections: 2,
            watch: WatchSettings {
                max_watchers: STREAMS,
                keep_alive: Duration::from_millis(300),
                ..WatchSettings::default()
            },
            ..GatewayOptions::default()
        },
    )
    .start()
    .await;
    let port = stack.gateway.api.port();
    let client = client_trusting(&pki.ca).build().unwrap();
    let mut streams = Vec::new();
    for i in 0..STREAMS {
        let stream = sse::open(&client, &https(port, &format!("/watch/many/{i}")), None)
            .await
            .unwrap();
        streams.push(stream);
    }
    // One more stream than --max-watchers: 429, on the same connection.
    let (status, headers, _) = sse::open(&client, &https(port, "/watch/many/over"), None)
        .await
        .unwrap_err();
    assert_eq!(status, 429);
    assert!(headers.contains_key("retry-after"));
    for stream in &mut streams {
        stream.expect("sync").await;
    }
    for i in 0..STREAMS {
        let response = client
            .put(https(port, &format!("/keys/many/{i}")))
            .body(format!("value-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    for (i, stream) in streams.iter_mut().enumerate() {
        let set = stream.expect("set").await;
        assert_eq!(set.data["value"], format!("value-{i}"));
    }
    // Quiet streams get their keep-alive comments.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for stream in &mut streams {
        stream.expect_silence(Duration::from_millis(10)).await;
        assert!(stream.comments >= 1, "a stream without keep-alives");
    }
    // A closed stream gives its watcher back; the connection serves on.
    drop(streams.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut reopened = loop {
        match sse::open(&client, &https(port, "/watch/many/again"), None).await {
            Ok(stream) => break stream,
            Err((429, _, _)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("{other:?}"),
        }
    };
    reopened.expect("sync").await;
}

/// VmRSS of the gateway, after jemalloc had time to return freed pages.
async fn settled_rss_kib(gateway: &GatewayProcess) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    gateway.rss_kib()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_watch_stream_that_is_not_read_holds_bounded_memory_and_then_skips_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "api");
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let gateway = GatewayProcess::start(
        broker.port(),
        &[
            "--api-tls-cert-file",
            pki.server_cert.to_str().unwrap(),
            "--api-tls-key-file",
            pki.server_key.to_str().unwrap(),
            "--watch-buffer",
            "4",
            "--watch-buffer-bytes",
            "1048576",
        ],
    )
    .await;
    let port = gateway.api.port();
    // One connection: the stream that is read and the one that is not.
    let client = client_trusting(&pki.ca).build().unwrap();
    let writer = client_trusting(&pki.ca).http1_only().build().unwrap();
    let value = "x".repeat(64 * 1024);
    writer
        .put(https(port, "/keys/busy"))
        .body(value.clone())
        .send()
        .await
        .unwrap();
    let mut slow = sse::open(&client, &https(port, "/watch/busy"), None)
        .await
        .unwrap();
    slow.expect("sync").await;
    let mut reader = sse::open(&client, &https(port, "/watch/busy"), None)
        .await
        .unwrap();
    reader.expect("sync").await;
    let baseline = settled_rss_kib(&gateway).await;

    // 400 changes of 64 KiB: about 60 MiB of event frames (value and base64)
    // that `slow` does not take, while `reader` takes each.
    let mut last = String::new();
    for i in 0..400 {
        let response = writer
            .put(https(port, "/keys/busy"))
            .body(format!("{i:04}{value}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        last = response.headers()["etag"]
            .to_str()
            .unwrap()
            .trim_matches('"')
            .to_owned();
        let event = reader.expect("set").await;
        assert!(
            event.data["value"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{i:04}"))
        );
    }
    let grown = settled_rss_kib(&gateway).await.saturating_sub(baseline);
    eprintln!("VmRSS grew by {grown} KiB while a stream was not read");
    assert!(
        grown < 24 * 1024,
        "VmRSS grew by {grown} KiB while a stream was not read"
    );
    assert_eq!(gateway.metric("statestore_gateway_watchers").await, 2.0);

    // Reading again: what flow control held back, then a `lagged` sync of
    // the latest state, without ever going back.
    let mut saw_lagged = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let event = slow
            .next(Duration::from_secs(10))
            .await
            .expect("events keep coming");
        saw_lagged |= event.data["lagged"] == true;
        if event.id.as_deref() == Some(last.as_str()) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
    }
    assert!(
        saw_lagged,
        "the stream that was not read was told it skipped"
    );
}

/// Reads until the server closes; `None` if it does not within `within`.
async fn read_to_close(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut received = Vec::new();
    tokio::time::timeout(within, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(received)
}

#[tokio::test]
async fn bad_handshakes_and_plain_http_on_the_tls_port_close_only_their_connection() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "api");
    let stack = tls_stack(
        &pki,
        GatewayOptions {
            header_read_timeout: Duration::from_millis(500),
            ..GatewayOptions::default()
        },
    )
    .start()
    .await;
    let addr = stack.gateway.api;
    let client = client_trusting(&pki.ca).build().unwrap();
    // A client connected during all this is not disturbed: its connection
    // idles past the header read timeout (a GOAWAY, then a new one) ...
    put_and_get(&client, addr.port(), "calm", Version::HTTP_2).await;
    // ... and an open watch stream is no idle connection.
    let watcher = client_trusting(&pki.ca).build().unwrap();
    let mut watch = sse::open(&watcher, &https(addr.port(), "/watch/calm"), None)
        .await
        .unwrap();
    watch.expect("sync").await;

    for opening in [
        &b"GET /keys/calm HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
        // A handshake record claiming more than it sends, then silence.
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..],
        // Not TLS at all.
        &[0xff; 64][..],
        // Silence.
        &b""[..],
    ] {
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(opening).await.unwrap();
        let answer = read_to_close(&mut raw, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("{opening:?}: still open after 5 s"));
        // At most a TLS alert: never an HTTP answer in clear text.
        assert!(
            !answer.starts_with(b"HTTP/"),
            "{opening:?}: answered {answer:?}"
        );
    }
    // Three header read timeouts later, the stream is still there.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    put_and_get(&client, addr.port(), "calm", Version::HTTP_2).await;
    assert_eq!(watch.expect("set").await.data["value"], "calm");
    let response = client
        .get(https(addr.port(), "/keys/calm"))
        .header("x-big", "a".repeat(70 * 1024))
        .send()
        .await;
    // Over the header list size: refused (431 or a reset stream), and the
    // connection and the gateway serve on.
    match response {
        Ok(response) => assert_eq!(response.status(), 431),
        Err(error) => eprintln!("oversized headers over HTTP/2: {error}"),
    }
    put_and_get(&client, addr.port(), "calm", Version::HTTP_2).await;
}

/// Runs `serve` with `args` and returns its exit code and standard error,
/// or panics if it is still running after 10 s.
fn serve_exit(args: &[&str]) -> (Option<i32>, String) {
    let mut child = binary_command()
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--use-tls", "false"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve {args:?} still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn unusable_certificate_settings_stop_serve_at_start_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "api");
    let other = TestPki::generate(dir.path(), "other");
    let cert = pki.server_cert.to_str().unwrap();
    let key = pki.server_key.to_str().unwrap();
    let cases: [(&[&str], &str, &str); 4] = [
        (
            &["--api-tls-cert-file", cert],
            "--api-tls-key-file",
            "give both files or neither",
        ),
        (
            &[
                "--api-tls-cert-file",
                "/nonexistent/tls.crt",
                "--api-tls-key-file",
                key,
            ],
            "--api-tls-cert-file",
            "cannot read",
        ),
        (
            &["--api-tls-cert-file", key, "--api-tls-key-file", key],
            "--api-tls-cert-file",
            "holds no certificate",
        ),
        (
            &[
                "--api-tls-cert-file",
                cert,
                "--api-tls-key-file",
                other.server_key.to_str().unwrap(),
            ],
            "--api-tls-key-file",
            "does not match the certificate",
        ),
    ];
    for (args, setting, says) in cases {
        let (code, stderr) = serve_exit(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(setting) && stderr.contains(says),
            "{args:?}: {stderr}"
        );
    }
}
