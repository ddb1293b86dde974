//! Dev mode: an MQTT5 broker, the state store emulator and the gateway in
//! one process, so `cargo run --release -- dev` is all a laptop needs.
//!
//! The broker (rmqtt) sits behind the cargo feature `embedded-broker`, on by
//! default; the container image is built without it and `dev` then says so.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::config::DevArgs;
use crate::emulator::EmulatorError;
use crate::http::ServeError;

#[cfg(feature = "embedded-broker")]
mod broker;
#[cfg(feature = "embedded-broker")]
mod stack;

#[cfg(feature = "embedded-broker")]
pub use broker::{EmbeddedBroker, MAX_INFLIGHT, MAX_QUEUED_PER_CLIENT};
#[cfg(feature = "embedded-broker")]
pub use stack::{DevStack, READY_TIMEOUT};

/// Runs dev mode until SIGTERM or Ctrl-C: starts everything, prints where
/// it listens, then stops it all in reverse order.
pub async fn run(args: DevArgs) -> Result<(), DevError> {
    #[cfg(feature = "embedded-broker")]
    {
        let stack = DevStack::start(&args).await?;
        println!("{}", stack.banner());
        stack.run_until(crate::http::termination_signal()).await
    }
    #[cfg(not(feature = "embedded-broker"))]
    {
        let _ = args;
        Err(DevError::NoEmbeddedBroker)
    }
}

/// The text `dev` prints once it serves: every address, how to reach the
/// broker from an AIO SDK, and a first request to try.
pub fn banner(
    api: SocketAddr,
    admin: SocketAddr,
    broker: SocketAddr,
    data_dir: Option<&Path>,
) -> String {
    let api_host = curl_host(api);
    let data = match data_dir {
        Some(dir) => format!(
            "{} (keys PUT with ?persist=true survive a restart)",
            dir.display()
        ),
        None => "in memory (--data-dir DIR keeps keys PUT with ?persist=true)".to_owned(),
    };
    let mut text = String::new();
    let _ = writeln!(
        text,
        "statestore-gateway dev: MQTT broker, state store emulator and gateway in one process\n"
    );
    let _ = writeln!(
        text,
        "  HTTP API     http://{api}  PUT/GET/DELETE /keys/<name>, GET /watch/<name> (SSE)"
    );
    let _ = writeln!(text, "  dashboard    http://{api}/ui/");
    let _ = writeln!(
        text,
        "  admin        http://{admin}  /livez /readyz /metrics"
    );
    let _ = writeln!(
        text,
        "  MQTT broker  mqtt://{broker}  MQTT 3.1.1/5, anonymous, no TLS; the emulator serves the state store here"
    );
    let _ = writeln!(
        text,
        "               AIO SDKs: AIO_BROKER_HOSTNAME={} AIO_BROKER_TCP_PORT={} AIO_MQTT_USE_TLS=false",
        host_name(broker),
        broker.port()
    );
    let _ = writeln!(text, "  data         {data}\n");
    let _ = writeln!(text, "Try:");
    let _ = writeln!(
        text,
        "  curl -X PUT --data-binary hello {api_host}/keys/greeting"
    );
    let _ = writeln!(text, "  curl {api_host}/keys/greeting\n");
    let _ = write!(text, "Ctrl-C stops everything.");
    text
}

/// The host as a person types it: `localhost` for loopback and wildcard
/// addresses, otherwise the IP address.
fn host_name(addr: SocketAddr) -> String {
    if addr.ip().is_loopback() || addr.ip().is_unspecified() {
        "localhost".to_owned()
    } else {
        addr.ip().to_string()
    }
}

/// `host:port` for a URL, with brackets around an IPv6 address.
fn curl_host(addr: SocketAddr) -> String {
    match host_name(addr) {
        host if addr.is_ipv6() && host != "localhost" => format!("[{host}]:{}", addr.port()),
        host => format!("{host}:{}", addr.port()),
    }
}

/// Why dev mode could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The binary was built with `--no-default-features`.
    #[error(
        "this statestore-gateway was built without the embedded MQTT broker \
         (cargo feature `embedded-broker`); rebuild with default features, or run \
         `emulator` and `serve` against a broker of your own"
    )]
    NoEmbeddedBroker,
    /// The broker could not bind its TCP listener.
    #[error("embedded mqtt broker cannot listen on {addr}")]
    BrokerListen {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system or rmqtt said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The emulator did not start or failed.
    #[error("the state store emulator failed")]
    Emulator(#[from] EmulatorError),
    /// The gateway did not start or failed.
    #[error("the gateway failed")]
    Gateway(#[from] ServeError),
    /// The gateway did not connect and subscribe to the embedded broker.
    #[error("the gateway was not connected to the embedded broker within {within:?}")]
    NotReady {
        /// How long start-up waited.
        within: Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banner_names_every_address_and_the_readme_curl_example() {
        let banner = banner(
            "127.0.0.1:8080".parse().unwrap(),
            "127.0.0.1:8081".parse().unwrap(),
            "127.0.0.1:1883".parse().unwrap(),
            None,
        );
        assert!(banner.contains("http://127.0.0.1:8080"), "{banner}");
        assert!(banner.contains("http://127.0.0.1:8081"), "{banner}");
        assert!(banner.contains("mqtt://127.0.0.1:1883"), "{banner}");
        assert!(banner.contains("AIO_BROKER_HOSTNAME=localhost AIO_BROKER_TCP_PORT=1883"));
        assert!(banner.contains("curl -X PUT --data-binary hello localhost:8080/keys/greeting"));
        assert!(banner.contains("curl localhost:8080/keys/greeting"));
    }

    #[test]
    fn curl_host_brackets_ipv6_and_says_localhost_for_wildcards() {
        assert_eq!(curl_host("0.0.0.0:8080".parse().unwrap()), "localhost:8080");
        assert_eq!(curl_host("[::1]:8080".parse().unwrap()), "localhost:8080");
        assert_eq!(curl_host("10.0.0.7:8080".parse().unwrap()), "10.0.0.7:8080");
        assert_eq!(
            curl_host("[fd00::7]:8080".parse().unwrap()),
            "[fd00::7]:8080"
        );
    }

    #[cfg(not(feature = "embedded-broker"))]
    #[tokio::test]
    async fn without_the_feature_dev_says_it_was_built_without_the_broker() {
        let args = DevArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            broker_listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: None,
        };
        let error = run(args).await.unwrap_err();
        assert!(matches!(error, DevError::NoEmbeddedBroker));
        assert!(error.to_string().contains("embedded-broker"));
    }
}
