//! What `dev` prints once it serves.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

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
}
