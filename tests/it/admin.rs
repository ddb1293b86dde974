//! The admin listener, graceful shutdown, and the `serve` binary's
//! start-up and signal handling.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use statestore_gateway::protocol::Request;

use crate::support::Mosquitto;
use crate::support::gateway::{Gateway, GatewayOptions, Stack, http_client};
use crate::support::gateway_process::binary_command;
use crate::support::scripted_store::{Script, Scripted};
use crate::support::{free_port, wait_for_listener};

#[tokio::test]
async fn livez_is_200_even_without_a_broker() {
    let mut broker = Mosquitto::start().await;
    broker.kill();
    let gw = Gateway::start(broker.port(), GatewayOptions::default()).await;
    let response = gw.http.get(gw.admin_url("/livez")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(gw.readyz().await, 503);
    gw.shutdown().await;
}

#[tokio::test]
async fn readyz_follows_the_broker_connection() {
    let mut broker = Mosquitto::start().await;
    broker.kill();
    let gw = Gateway::start(broker.port(), GatewayOptions::default()).await;
    // Not ready before any member has subscribed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gw.readyz().await, 503);
    broker.restart().await;
    gw.wait_readyz(200, Duration::from_secs(15)).await;
    broker.kill();
    gw.wait_readyz(503, Duration::from_secs(15)).await;
    broker.restart().await;
    gw.wait_readyz(200, Duration::from_secs(15)).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn metrics_report_requests_by_route_and_store_round_trips() {
    let stack = Stack::start().await;
    let gw = &stack.gateway;
    for n in 0..3 {
        let response = gw
            .http
            .put(gw.key(format!("m{n}").as_bytes()))
            .body("v")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let missing = gw.http.get(gw.key(b"absent")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    gw.http.get(gw.url("/elsewhere")).send().await.unwrap();

    let response = gw.http.get(gw.admin_url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[reqwest::header::CONTENT_TYPE],
        "text/plain; version=0.0.4"
    );
    let text = response.text().await.unwrap();
    for line in [
        r#"statestore_gateway_http_requests_total{method="PUT",route="/keys/{*key}",status="200"} 3"#,
        r#"statestore_gateway_http_requests_total{method="GET",route="/keys/{*key}",status="404"} 1"#,
        r#"statestore_gateway_http_requests_total{method="GET",route="unmatched",status="404"} 1"#,
        r#"statestore_gateway_http_request_duration_seconds_count{method="PUT",route="/keys/{*key}"} 3"#,
        r#"statestore_gateway_store_request_duration_seconds_count{op="SET",outcome="ok"} 3"#,
        r#"statestore_gateway_store_request_duration_seconds_count{op="GET",outcome="not_found"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(text.contains("statestore_gateway_pool_members"), "{text}");
    // Raw key paths never become labels.
    assert!(!text.contains("/keys/m0"));
}

/// A store that answers GET `slow` after a second, everything else at once.
fn slow_store() -> Script {
    Arc::new(|request: &Request, _: Option<&str>| {
        match request.key().map(AsRef::as_ref).unwrap_or_default() {
            b"slow" => Scripted::ReplyAfter(Duration::from_secs(1), b"$4\r\nlate\r\n".to_vec()),
            b"never" => Scripted::Silent,
            _ => Scripted::Reply(b"$-1\r\n".to_vec()),
        }
    })
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests_and_turns_readyz_off() {
    let stack = Stack::builder().scripted(slow_store()).start().await;
    let Stack {
        gateway: gw,
        broker: _broker,
        scripted: _scripted,
        ..
    } = stack;
    let http = gw.http.clone();
    let slow_url = gw.key(b"slow");
    let in_flight = tokio::spawn(async move { http.get(slow_url).send().await });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let admin = gw.admin_url("/readyz");
    let api = gw.api;
    let started = Instant::now();
    let shutdown = tokio::spawn(gw.shutdown());
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Draining: not ready, and no new connections on the key API.
    let readyz = http_client().get(admin).send().await.unwrap();
    assert_eq!(readyz.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(tokio::net::TcpStream::connect(api).await.is_err());

    let response = in_flight
        .await
        .unwrap()
        .expect("the in-flight request finishes");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"late");
    shutdown.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test]
async fn shutdown_grace_bounds_a_request_that_never_finishes() {
    let stack = Stack::builder()
        .scripted(slow_store())
        .gateway(GatewayOptions {
            request_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_millis(500),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let Stack {
        gateway: gw,
        broker: _broker,
        scripted: _scripted,
        ..
    } = stack;
    let http = gw.http.clone();
    let url = gw.key(b"never");
    let hung = tokio::spawn(async move { http.get(url).send().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    gw.shutdown().await;
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(3),
        "shutdown took {elapsed:?}"
    );
    // The client learns at once: its connection is closed (or, if the pool
    // failed the request first, it gets a 504: the store had received it,
    // so its outcome is unknown and a retry is not known to be safe).
    let outcome = tokio::time::timeout(Duration::from_secs(2), hung)
        .await
        .expect("the hung request ends with the shutdown")
        .unwrap();
    if let Ok(response) = outcome {
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    }
}

/// Waits for the child to exit (killing it after `within`) and returns its
/// status and stderr.
fn wait_for_exit(mut child: Child, within: Duration) -> (ExitStatus, String) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                pipe.read_to_string(&mut stderr).unwrap();
            }
            return (status, stderr);
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the gateway binary did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn serve_binary_starts_and_exits_zero_on_sigterm() {
    let broker = Mosquitto::start().await;
    let (api, admin) = (free_port(), free_port());
    let child = binary_command()
        .args(["serve", "--log-format", "json"])
        .env("STATESTORE_GATEWAY_LISTEN", format!("127.0.0.1:{api}"))
        .env(
            "STATESTORE_GATEWAY_ADMIN_LISTEN",
            format!("127.0.0.1:{admin}"),
        )
        .env("AIO_BROKER_HOSTNAME", "127.0.0.1")
        .env("AIO_BROKER_TCP_PORT", broker.port().to_string())
        .env("AIO_MQTT_USE_TLS", "false")
        .env("AIO_MQTT_CLIENT_ID", "gw-binary")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_listener(([127, 0, 0, 1], admin).into(), Duration::from_secs(10)).await;
    let http = http_client();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = http
            .get(format!("http://127.0.0.1:{admin}/readyz"))
            .send()
            .await
            .map(|response| response.status().as_u16())
            .unwrap_or(0);
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the binary never got ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (status, stderr) =
        tokio::task::spawn_blocking(move || wait_for_exit(child, Duration::from_secs(15)))
            .await
            .unwrap();
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    // JSON logs: every line is an object.
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(!lines.is_empty());
    for line in lines {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        assert!(value.get("level").is_some(), "{line}");
    }
}

#[test]
fn serve_binary_refuses_a_bad_setting_naming_it() {
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), "not a certificate\n").unwrap();
    let junk_path = junk.path().to_str().unwrap();
    for (name, value, named) in [
        // Refused by the pool's TLS checks, after parsing.
        ("AIO_TLS_CA_FILE", junk_path, "AIO_TLS_CA_FILE"),
        (
            "STATESTORE_GATEWAY_REQUEST_TIMEOUT",
            "ten seconds",
            "--request-timeout",
        ),
        (
            "STATESTORE_GATEWAY_API_TOKEN_FILE",
            "/nonexistent/token",
            "STATESTORE_GATEWAY_API_TOKEN_FILE",
        ),
        ("AIO_MQTT_USE_TLS", "maybe", "--use-tls"),
    ] {
        let child = binary_command()
            .arg("serve")
            .env(name, value)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, stderr) = wait_for_exit(child, Duration::from_secs(10));
        assert_eq!(status.code(), Some(2), "{name}={value}: {stderr}");
        assert!(stderr.contains(named), "{name}={value}: {stderr}");
    }
}
