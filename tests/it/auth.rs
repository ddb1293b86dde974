//! Connecting like to a real AIO broker: TLS, mutual TLS, user name and
//! password, `K8S-SAT` enhanced authentication and token rotation.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use statestore_gateway::metrics::Metrics;
use statestore_gateway::mqtt::{BrokerSettings, MemberEvent, Pool, PoolSettings, RequestOptions};
use statestore_gateway::protocol::{Reply, Request};

use crate::support::{
    AuthProxy, Mosquitto, MosquittoConfig, Responder, TestPki, free_port, init_logging,
    pool_settings, start_pool, wait_for_listener, wait_until,
};

fn get(key: &str) -> Request {
    Request::Get {
        key: Bytes::copy_from_slice(key.as_bytes()),
    }
}

/// mosquitto with a TLS listener besides the plain one; returns the TLS port.
async fn tls_broker(pki: &TestPki, require_certificate: bool) -> (Mosquitto, u16) {
    let port = free_port();
    let extra = format!(
        "listener {port} 127.0.0.1\n\
         cafile {}\n\
         certfile {}\n\
         keyfile {}\n\
         require_certificate {require_certificate}\n",
        pki.ca.display(),
        pki.server_cert.display(),
        pki.server_key.display(),
    );
    let broker = Mosquitto::start_with(MosquittoConfig {
        extra,
        ..Default::default()
    })
    .await;
    wait_for_listener(([127, 0, 0, 1], port).into(), Duration::from_secs(5)).await;
    (broker, port)
}

fn tls_settings(port: u16, ca: &Path) -> PoolSettings {
    let mut broker = BrokerSettings::new("localhost", port);
    broker.use_tls = true;
    broker.ca_file = Some(ca.to_owned());
    let mut settings = PoolSettings::new(broker, "tls");
    settings.size = 2;
    settings.request_timeout = Duration::from_secs(5);
    settings
}

/// Starts a pool that is expected never to connect and checks that it stays
/// unready with its members down or connecting.
async fn assert_never_ready(settings: PoolSettings) {
    init_logging();
    let metrics = Metrics::new();
    let pool = Pool::start(settings, metrics.clone()).expect("settings are valid");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!pool.is_ready());
    assert_eq!(
        metrics
            .pool_members
            .with_label_values(&["subscribed"])
            .get(),
        0
    );
    pool.shutdown().await;
}

#[tokio::test]
async fn tls_with_the_brokers_ca_serves_requests() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "broker");
    let (broker, tls_port) = tls_broker(&pki, false).await;
    let _responder = Responder::start(broker.addr).await;
    let (pool, _) = start_pool(tls_settings(tls_port, &pki.ca)).await;
    let response = pool
        .request(&get("k"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();
    assert_eq!(response.reply, Reply::NotFound);
    pool.shutdown().await;
}

#[tokio::test]
async fn tls_with_another_ca_never_connects() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "broker");
    let other = TestPki::generate(dir.path(), "other");
    let (_broker, tls_port) = tls_broker(&pki, false).await;
    assert_never_ready(tls_settings(tls_port, &other.ca)).await;
}

#[tokio::test]
async fn mutual_tls_presents_the_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path(), "mtls");
    let (broker, tls_port) = tls_broker(&pki, true).await;
    let _responder = Responder::start(broker.addr).await;

    let mut settings = tls_settings(tls_port, &pki.ca);
    settings.broker.cert_file = Some(pki.client_cert.clone());
    settings.broker.key_file = Some(pki.client_key.clone());
    let (pool, _) = start_pool(settings).await;
    pool.request(&get("k"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();
    pool.shutdown().await;

    // Without a client certificate the broker refuses the handshake.
    assert_never_ready(tls_settings(tls_port, &pki.ca)).await;
}

#[tokio::test]
async fn user_name_and_password_file_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let passwords = dir.path().join("passwd");
    std::fs::write(&passwords, "").unwrap();
    let status = std::process::Command::new("mosquitto_passwd")
        .args(["-b"])
        .arg(&passwords)
        .args(["gateway", "s3cret"])
        .status()
        .expect("mosquitto_passwd runs (package mosquitto)");
    assert!(status.success());
    let broker = Mosquitto::start_with(MosquittoConfig {
        extra: format!("password_file {}\n", passwords.display()),
        deny_anonymous: true,
    })
    .await;
    let password_file = dir.path().join("password");

    std::fs::write(&password_file, "s3cret").unwrap();
    let mut settings = pool_settings(broker.addr, "user");
    settings.broker.username = Some("gateway".into());
    settings.broker.password_file = Some(password_file.clone());
    let (pool, _) = start_pool(settings.clone()).await;
    assert!(pool.is_ready());
    pool.shutdown().await;

    std::fs::write(&password_file, "wrong").unwrap();
    assert_never_ready(settings.clone()).await;

    let mut anonymous = settings;
    anonymous.broker.username = None;
    anonymous.broker.password_file = None;
    assert_never_ready(anonymous).await;
}

#[tokio::test]
async fn start_fails_naming_an_unusable_setting() {
    let mut broker = BrokerSettings::new("localhost", 8883);
    broker.use_tls = true;
    broker.ca_file = Some("/nonexistent/ca.crt".into());
    let error = Pool::start(PoolSettings::new(broker.clone(), "gw"), Metrics::new()).unwrap_err();
    assert!(
        error.to_string().starts_with(
            "invalid --tls-ca-file (AIO_TLS_CA_FILE): cannot read /nonexistent/ca.crt"
        ),
        "{error}"
    );

    broker.ca_file = None;
    broker.host = String::new();
    let error = Pool::start(PoolSettings::new(broker, "gw"), Metrics::new()).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("invalid --broker-host (AIO_BROKER_HOSTNAME)"),
        "{error}"
    );

    let mut broker = BrokerSettings::new("localhost", 1883);
    broker.password_file = Some("/nonexistent/password".into());
    let error = Pool::start(PoolSettings::new(broker, "gw"), Metrics::new()).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("invalid --mqtt-password-file (AIO_MQTT_PASSWORD_FILE)"),
        "{error}"
    );
}

#[tokio::test]
async fn sat_is_sent_as_k8s_sat_and_read_anew_at_every_connect() {
    init_logging();
    let proxy = AuthProxy::terminating().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, b"first.token.bytes").unwrap();
    let mut settings = pool_settings(proxy.addr, "sat");
    settings.size = 1;
    settings.broker.sat_file = Some(token_file.clone());
    let pool = Pool::start(settings, Metrics::new()).unwrap();

    let connects = proxy
        .wait_for(Duration::from_secs(5), "a CONNECT", |c| !c.is_empty())
        .await;
    assert_eq!(connects[0].client_id, "sat-0");
    assert_eq!(connects[0].auth_method.as_deref(), Some("K8S-SAT"));
    assert_eq!(
        connects[0].auth_data.as_deref(),
        Some(&b"first.token.bytes"[..])
    );
    assert_eq!(connects[0].username, None);

    // The proxy hangs up; the member retries with whatever the file holds then.
    std::fs::write(&token_file, b"second.token").unwrap();
    proxy
        .wait_for(
            Duration::from_secs(5),
            "a CONNECT with the new token",
            |c| {
                c.iter()
                    .any(|c| c.auth_data.as_deref() == Some(&b"second.token"[..]))
            },
        )
        .await;
    pool.shutdown().await;
}

#[tokio::test]
async fn sat_rotation_reconnects_members_one_at_a_time_while_serving() {
    init_logging();
    let broker = Mosquitto::start().await;
    let _responder = Responder::start(broker.addr).await;
    let proxy = AuthProxy::forwarding(broker.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, b"token-1").unwrap();

    let mut settings = pool_settings(proxy.addr, "roll");
    settings.size = 2;
    settings.broker.sat_file = Some(token_file.clone());
    settings.sat_check_interval = Duration::from_millis(100);
    let (pool, metrics) = start_pool(settings).await;
    let mut events = pool.member_events();
    let first = proxy.connects();
    assert_eq!(first.len(), 2);
    assert!(
        first
            .iter()
            .all(|c| c.auth_data.as_deref() == Some(&b"token-1"[..]))
    );

    // Requests keep flowing during the rotation.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn({
        let pool = pool.clone();
        let stop = stop.clone();
        async move {
            let (mut ok, mut failed, mut unready) = (0, Vec::new(), 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if !pool.is_ready() {
                    unready += 1;
                }
                match pool
                    .request(&get("k"), &RequestOptions::default(), |response| response)
                    .await
                {
                    Ok(_) => ok += 1,
                    Err(error) => failed.push(error.to_string()),
                }
            }
            (ok, failed, unready)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Like the kubelet: write a new file and rename it over the old one.
    let staged = dir.path().join("token.new");
    std::fs::write(&staged, b"token-2").unwrap();
    std::fs::rename(&staged, &token_file).unwrap();

    proxy
        .wait_for(
            Duration::from_secs(10),
            "both members reconnected with token-2",
            |c| {
                ["roll-0", "roll-1"].iter().all(|id| {
                    c.iter().any(|c| {
                        c.client_id == *id && c.auth_data.as_deref() == Some(&b"token-2"[..])
                    })
                })
            },
        )
        .await;
    wait_until(
        Duration::from_secs(5),
        "both members subscribed again",
        || {
            metrics
                .pool_members
                .with_label_values(&["subscribed"])
                .get()
                == 2
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed, unready) = load.await.unwrap();
    assert!(
        failed.is_empty(),
        "requests failed during the rotation: {failed:?}"
    );
    assert_eq!(unready, 0, "the pool stayed ready");
    assert!(ok > 50, "only {ok} requests went through");

    // One member at a time: each is subscribed again before the next drops.
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
    let MemberEvent::Down { member: first_down } = seen[0] else {
        panic!("{seen:?}")
    };
    let second = 1 - first_down;
    assert_eq!(
        seen,
        [
            MemberEvent::Down { member: first_down },
            MemberEvent::Subscribed { member: first_down },
            MemberEvent::Down { member: second },
            MemberEvent::Subscribed { member: second },
        ]
    );
    // Exactly one reconnect each, nothing more after the rollout.
    assert_eq!(proxy.connects().len(), 4);
    assert_eq!(metrics.reconnects.get(), 2);
    pool.shutdown().await;
}

/// rumqttc panics on a keep-alive under 5 seconds: the pool refuses one
/// at start, naming the setting, instead of building a connection with it.
#[tokio::test]
async fn start_refuses_a_keep_alive_under_five_seconds() {
    let mut broker = BrokerSettings::new("localhost", 1883);
    broker.keep_alive = Duration::from_secs(2);
    let error = Pool::start(PoolSettings::new(broker, "gw"), Metrics::new()).unwrap_err();
    assert!(error.to_string().contains("AIO_MQTT_KEEP_ALIVE"), "{error}");
}

/// The gateway and the emulator read a password file alike: byte for byte,
/// as the AIO SDK does, so a trailing newline is part of the password for
/// both (a broker given the file's text accepts them both).
#[tokio::test]
async fn a_password_file_ending_in_a_newline_is_read_alike_by_the_gateway_and_the_emulator() {
    use clap::Parser as _;
    use statestore_gateway::cli::{Cli, Command};
    use statestore_gateway::emulator::Emulator;

    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let passwords = dir.path().join("passwd");
    std::fs::write(&passwords, "").unwrap();
    let status = std::process::Command::new("mosquitto_passwd")
        .args(["-b"])
        .arg(&passwords)
        .args(["store", "s3cret\n"])
        .status()
        .expect("mosquitto_passwd runs (package mosquitto)");
    assert!(status.success());
    let broker = Mosquitto::start_with(MosquittoConfig {
        extra: format!("password_file {}\n", passwords.display()),
        deny_anonymous: true,
    })
    .await;
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "s3cret\n").unwrap();

    let argv = [
        "statestore-gateway".to_owned(),
        "emulator".to_owned(),
        "--broker".to_owned(),
        broker.addr.to_string(),
        "--username".to_owned(),
        "store".to_owned(),
        "--password-file".to_owned(),
        password_file.display().to_string(),
    ];
    let Command::Emulator(args) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not the emulator's arguments");
    };
    let mut config = args.settings().unwrap();
    config.startup_timeout = Duration::from_secs(5);
    let emulator = Emulator::start(config).await;
    assert!(emulator.is_ok(), "the emulator: {:?}", emulator.err());

    let mut settings = pool_settings(broker.addr, "user");
    settings.broker.username = Some("store".into());
    settings.broker.password_file = Some(password_file);
    let (pool, _) = start_pool(settings).await;
    let response = pool
        .request(&get("k"), &RequestOptions::default(), |response| response)
        .await
        .unwrap();
    assert_eq!(response.reply, Reply::NotFound);
    pool.shutdown().await;
}
