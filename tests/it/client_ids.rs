//! MQTT client ids: two gateways that share one take each other's broker
//! sessions over and over, and say so (an error naming the id and the
//! setting, a metric, `/readyz` 503) instead of reconnecting silently; by
//! default two gateways on one host never share one.

use std::time::{Duration, Instant};

use crate::support::fault_proxy::FaultProxy;
use crate::support::gateway::{Gateway, GatewayOptions, Stack, http_client};
use crate::support::gateway_process::GatewayProcess;

/// Longer than `/readyz` stays 503 after the last takeover (10 s), with
/// room for a loaded machine.
const RECOVERY: Duration = Duration::from_secs(30);

/// How long a fight may take to be noticed: a few reconnects, each after
/// at most a second of backoff.
const NOTICED_WITHIN: Duration = Duration::from_secs(20);

fn options(client_id: &str) -> GatewayOptions {
    GatewayOptions {
        client_id: client_id.to_owned(),
        ..GatewayOptions::default()
    }
}

/// `/readyz` of the admin listener at `admin`: status and body.
async fn readyz(admin: std::net::SocketAddr) -> (u16, String) {
    let response = http_client()
        .get(format!("http://{admin}/readyz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("/readyz answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// Waits until `/readyz` at `admin` answers 503 naming `client_id`, and
/// returns its body.
async fn wait_unready_naming(admin: std::net::SocketAddr, client_id: &str) -> String {
    let deadline = Instant::now() + NOTICED_WITHIN;
    loop {
        let (status, body) = readyz(admin).await;
        if status == 503 && body.contains(client_id) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz is {status} {body:?} after {NOTICED_WITHIN:?} of a shared client id"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the in-process gateway's takeover counter of `detected_by`
/// is above zero.
async fn wait_takeovers(gateway: &Gateway, detected_by: &str) {
    let sample =
        format!("statestore_gateway_pool_session_takeovers_total{{detected_by=\"{detected_by}\"}}");
    let deadline = Instant::now() + NOTICED_WITHIN;
    while gateway.metric(&sample).unwrap_or(0.0) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "{sample} is still 0 after {NOTICED_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// mosquitto 2.0.11 closes the older connection without telling why: a
/// run of connections closed within seconds of connecting is the sign.
#[tokio::test]
async fn two_gateways_with_one_client_id_say_that_they_take_each_others_session() {
    let client_id = format!("shared-{:08x}", rand::random::<u32>());
    // The stack's own gateway has an id of its own; the process and a
    // second gateway in this test share one.
    let stack = Stack::start().await;
    let mut other = GatewayProcess::start_keeping_stderr(
        stack.broker.port(),
        &["--client-id", &client_id, "--log-format", "json"],
        &[],
    )
    .await;
    let gateway = Gateway::start(stack.broker.port(), options(&client_id)).await;

    // Both notice and say so: unready, counted, and (the process) an error
    // naming the client id and the setting to change.
    let body = wait_unready_naming(gateway.admin, &client_id).await;
    assert!(body.contains("--client-id"), "{body}");
    wait_unready_naming(other.admin, &client_id).await;
    wait_takeovers(&gateway, "repeated_close").await;
    let errors = |lines: &[String]| -> Vec<serde_json::Value> {
        lines
            .iter()
            .filter_map(|line| serde_json::from_str(line).ok())
            .filter(|line: &serde_json::Value| line["level"] == "ERROR")
            .collect()
    };
    let lines = other
        .stderr()
        .until(|lines| !errors(lines).is_empty(), NOTICED_WITHIN)
        .await;
    let error = errors(&lines)
        .pop()
        .expect("an error about the shared client id");
    let member_id = error["client_id"].as_str().unwrap_or_default();
    assert!(member_id.starts_with(&format!("{client_id}-")), "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    for needed in [
        "takes the MQTT session over",
        member_id,
        "--client-id",
        "AIO_MQTT_CLIENT_ID",
        "broker.clientId",
    ] {
        assert!(message.contains(needed), "{needed:?} not in {message:?}");
    }
    // Counted each time, but one error while it goes on, not one per
    // lost connection.
    let takeovers = "statestore_gateway_pool_session_takeovers_total";
    let counted = other.metric(takeovers).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(other.metric(takeovers).await > counted);
    let lines = other.stderr().until(|_| true, Duration::ZERO).await;
    assert_eq!(errors(&lines).len(), 1, "{lines:#?}");

    // Once the other one is gone, the session stays and so does readiness.
    other.terminate();
    assert!(other.wait_exit(Duration::from_secs(30)).await.is_some());
    gateway.wait_readyz(200, RECOVERY).await;
    assert_eq!(stack.gateway.readyz().await, 200);
}

/// A broker that reports the takeover (DISCONNECT 0x8E) is believed at
/// the first one.
#[tokio::test]
async fn a_takeover_the_broker_reports_is_told_at_once() {
    let client_id = format!("shared-{:08x}", rand::random::<u32>());
    let stack = Stack::start().await;
    let proxy = FaultProxy::start_reporting_takeovers(stack.broker.addr).await;
    let first = Gateway::start(proxy.port(), options(&client_id)).await;
    first.wait_ready().await;
    let second = Gateway::start(proxy.port(), options(&client_id)).await;
    for gateway in [&first, &second] {
        wait_takeovers(gateway, "reason_code").await;
        wait_unready_naming(gateway.admin, &client_id).await;
    }
    second.shutdown().await;
    first.wait_readyz(200, RECOVERY).await;
    first.shutdown().await;
    // The stack's own gateway, with an id of its own, saw none of it.
    assert_eq!(stack.gateway.readyz().await, 200);
}

#[tokio::test]
async fn two_gateways_on_one_host_get_a_client_id_each_by_default() {
    let stack = Stack::start().await;
    let first = GatewayProcess::start_with_default_client_id(stack.broker.port(), &[]).await;
    let second = GatewayProcess::start_with_default_client_id(stack.broker.port(), &[]).await;
    // Long enough for several reconnects, were they fighting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for gateway in [&first, &second] {
        assert_eq!(gateway.readyz().await, 200);
        assert_eq!(
            gateway
                .metric("statestore_gateway_pool_session_takeovers_total")
                .await,
            0.0
        );
        assert_eq!(
            gateway
                .metric("statestore_gateway_pool_reconnects_total")
                .await,
            0.0
        );
        let response = gateway
            .http
            .put(gateway.key(b"default-id"))
            .body("v")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
    }
}
