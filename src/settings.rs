//! Settings every layer shares: the environment variable names of every
//! flag, the defaults the command line documents (`DEFAULT_*`, next to the
//! variable they default), and the duration syntax.
//!
//! A leaf: the settings types (`PoolSettings`, `WatchSettings`, ...) live
//! beside the code they configure and take their `Default` from here, and
//! `config` builds its clap flags from the same constants, so the code and
//! `--help` cannot disagree (checked by a test in `config`).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use thiserror::Error;

const fn loopback(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
}

// `serve` (the `AIO_*` names are the AIO SDKs').

/// `--listen`
pub const ENV_LISTEN: &str = "STATESTORE_GATEWAY_LISTEN";
pub const DEFAULT_LISTEN: SocketAddr = loopback(8080);

/// `--admin-listen`
pub const ENV_ADMIN_LISTEN: &str = "STATESTORE_GATEWAY_ADMIN_LISTEN";
pub const DEFAULT_ADMIN_LISTEN: SocketAddr = loopback(8081);

/// `--pool-size`
pub const ENV_POOL_SIZE: &str = "STATESTORE_GATEWAY_POOL_SIZE";
pub const DEFAULT_POOL_SIZE: usize = 4;

/// `--request-timeout`
pub const ENV_REQUEST_TIMEOUT: &str = "STATESTORE_GATEWAY_REQUEST_TIMEOUT";
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `--max-in-flight`
pub const ENV_MAX_IN_FLIGHT: &str = "STATESTORE_GATEWAY_MAX_IN_FLIGHT";
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// `--max-key-bytes`
pub const ENV_MAX_KEY_BYTES: &str = "STATESTORE_GATEWAY_MAX_KEY_BYTES";
pub const DEFAULT_MAX_KEY_BYTES: usize = 1024;

/// `--max-value-bytes`
pub const ENV_MAX_VALUE_BYTES: &str = "STATESTORE_GATEWAY_MAX_VALUE_BYTES";
/// Without the flag: the broker's maximum packet size minus the envelope,
/// or this when the broker has not said it yet.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 4 * 1024 * 1024;

/// `--api-token-file`
pub const ENV_API_TOKEN_FILE: &str = "STATESTORE_GATEWAY_API_TOKEN_FILE";

/// `--shutdown-grace`
pub const ENV_SHUTDOWN_GRACE: &str = "STATESTORE_GATEWAY_SHUTDOWN_GRACE";
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// `--log-format`
pub const ENV_LOG_FORMAT: &str = "STATESTORE_GATEWAY_LOG_FORMAT";

/// `--max-watchers`
pub const ENV_MAX_WATCHERS: &str = "STATESTORE_GATEWAY_MAX_WATCHERS";
pub const DEFAULT_MAX_WATCHERS: usize = 10_000;

/// `--max-keys-per-watch`
pub const ENV_MAX_KEYS_PER_WATCH: &str = "STATESTORE_GATEWAY_MAX_KEYS_PER_WATCH";
pub const DEFAULT_MAX_KEYS_PER_WATCH: usize = 64;

/// `--max-watched-keys`
pub const ENV_MAX_WATCHED_KEYS: &str = "STATESTORE_GATEWAY_MAX_WATCHED_KEYS";
pub const DEFAULT_MAX_WATCHED_KEYS: usize = 10_000;

/// `--watch-keepalive`
pub const ENV_WATCH_KEEPALIVE: &str = "STATESTORE_GATEWAY_WATCH_KEEPALIVE";
pub const DEFAULT_WATCH_KEEPALIVE: Duration = Duration::from_secs(15);

/// `--watch-buffer`
pub const ENV_WATCH_BUFFER: &str = "STATESTORE_GATEWAY_WATCH_BUFFER";
pub const DEFAULT_WATCH_BUFFER: usize = 64;

/// `--watch-buffer-bytes`: the bytes of events a key keeps for watchers
/// that fall behind (the newest event is always kept, whatever its size).
pub const ENV_WATCH_BUFFER_BYTES: &str = "STATESTORE_GATEWAY_WATCH_BUFFER_BYTES";
pub const DEFAULT_WATCH_BUFFER_BYTES: usize = 8 * 1024 * 1024;

/// `--watch-resync-interval`
pub const ENV_WATCH_RESYNC_INTERVAL: &str = "STATESTORE_GATEWAY_WATCH_RESYNC_INTERVAL";
pub const DEFAULT_WATCH_RESYNC_INTERVAL: Duration = Duration::from_secs(60);

/// `--watch-rescan-interval`: how often a followed pattern is listed
/// again to find keys other clients created.
pub const ENV_WATCH_RESCAN_INTERVAL: &str = "STATESTORE_GATEWAY_WATCH_RESCAN_INTERVAL";
pub const DEFAULT_WATCH_RESCAN_INTERVAL: Duration = Duration::from_secs(5);

/// `--max-keys-per-pattern`
pub const ENV_MAX_KEYS_PER_PATTERN: &str = "STATESTORE_GATEWAY_MAX_KEYS_PER_PATTERN";
pub const DEFAULT_MAX_KEYS_PER_PATTERN: usize = 10_000;

/// `--cors-allow-origin`
pub const ENV_CORS_ALLOW_ORIGIN: &str = "STATESTORE_GATEWAY_CORS_ALLOW_ORIGIN";

/// `--header-read-timeout`
pub const ENV_HEADER_READ_TIMEOUT: &str = "STATESTORE_GATEWAY_HEADER_READ_TIMEOUT";
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// `--max-connections`
pub const ENV_MAX_CONNECTIONS: &str = "STATESTORE_GATEWAY_MAX_CONNECTIONS";
pub const DEFAULT_MAX_CONNECTIONS: u32 = 20_000;

/// `--max-lock-wait`
pub const ENV_MAX_LOCK_WAIT: &str = "STATESTORE_GATEWAY_MAX_LOCK_WAIT";
pub const DEFAULT_MAX_LOCK_WAIT: Duration = Duration::from_secs(300);

/// `--max-lock-holder-bytes` (the SDKs use their MQTT client id)
pub const ENV_MAX_LOCK_HOLDER_BYTES: &str = "STATESTORE_GATEWAY_MAX_LOCK_HOLDER_BYTES";
pub const DEFAULT_MAX_LOCK_HOLDER_BYTES: usize = 1024;

/// `--broker-host`
pub const ENV_BROKER_HOSTNAME: &str = "AIO_BROKER_HOSTNAME";
pub const DEFAULT_BROKER_HOSTNAME: &str = "localhost";

/// `--broker-port`
pub const ENV_BROKER_TCP_PORT: &str = "AIO_BROKER_TCP_PORT";
pub const DEFAULT_BROKER_TCP_PORT: u16 = 8883;

/// `--use-tls`
pub const ENV_MQTT_USE_TLS: &str = "AIO_MQTT_USE_TLS";
pub const DEFAULT_MQTT_USE_TLS: bool = true;

/// `--tls-ca-file`
pub const ENV_TLS_CA_FILE: &str = "AIO_TLS_CA_FILE";

/// `--tls-cert-file`
pub const ENV_TLS_CERT_FILE: &str = "AIO_TLS_CERT_FILE";

/// `--tls-key-file`
pub const ENV_TLS_KEY_FILE: &str = "AIO_TLS_KEY_FILE";

/// `--sat-file`
pub const ENV_SAT_FILE: &str = "AIO_SAT_FILE";

/// `--mqtt-username`
pub const ENV_MQTT_USERNAME: &str = "AIO_MQTT_USERNAME";

/// `--mqtt-password-file`
pub const ENV_MQTT_PASSWORD_FILE: &str = "AIO_MQTT_PASSWORD_FILE";

/// `--client-id`
pub const ENV_MQTT_CLIENT_ID: &str = "AIO_MQTT_CLIENT_ID";

/// `--keep-alive`
pub const ENV_MQTT_KEEP_ALIVE: &str = "AIO_MQTT_KEEP_ALIVE";
/// In seconds.
pub const DEFAULT_MQTT_KEEP_ALIVE: u16 = 60;

/// `--session-expiry`
pub const ENV_MQTT_SESSION_EXPIRY: &str = "AIO_MQTT_SESSION_EXPIRY";
/// In seconds. Members connect with clean start and subscribe again after
/// every CONNACK, so a session outliving the connection would only keep
/// messages for nobody (the AIO SDKs default to 3600: they resume sessions).
pub const DEFAULT_MQTT_SESSION_EXPIRY: u32 = 0;

/// How often the SAT file is read again to notice a rotated token (not a flag).
pub const DEFAULT_SAT_CHECK_INTERVAL: Duration = Duration::from_secs(5);

// `emulator`.

/// `emulator --broker`
pub const ENV_EMULATOR_BROKER: &str = "STATESTORE_EMULATOR_BROKER";
pub const DEFAULT_EMULATOR_BROKER: &str = "localhost:1883";

/// `emulator --client-id`
pub const ENV_EMULATOR_CLIENT_ID: &str = "STATESTORE_EMULATOR_CLIENT_ID";
pub const DEFAULT_EMULATOR_CLIENT_ID: &str = "statestore-emulator";

/// `emulator --username`
pub const ENV_EMULATOR_USERNAME: &str = "STATESTORE_EMULATOR_USERNAME";

/// `emulator --password-file`
pub const ENV_EMULATOR_PASSWORD_FILE: &str = "STATESTORE_EMULATOR_PASSWORD_FILE";

/// `emulator --data-dir`
pub const ENV_EMULATOR_DATA_DIR: &str = "STATESTORE_EMULATOR_DATA_DIR";

/// `emulator --max-keys`
pub const ENV_EMULATOR_MAX_KEYS: &str = "STATESTORE_EMULATOR_MAX_KEYS";

/// `emulator --max-bytes`
pub const ENV_EMULATOR_MAX_BYTES: &str = "STATESTORE_EMULATOR_MAX_BYTES";

/// `emulator --log-format`
pub const ENV_EMULATOR_LOG_FORMAT: &str = "STATESTORE_EMULATOR_LOG_FORMAT";

/// `emulator --acl`
pub const ENV_EMULATOR_ACL: &str = "STATESTORE_EMULATOR_ACL";

// `dev`.

/// `dev --listen`
pub const ENV_DEV_LISTEN: &str = "STATESTORE_GATEWAY_DEV_LISTEN";
pub const DEFAULT_DEV_LISTEN: SocketAddr = loopback(8080);

/// `dev --admin-listen`
pub const ENV_DEV_ADMIN_LISTEN: &str = "STATESTORE_GATEWAY_DEV_ADMIN_LISTEN";
pub const DEFAULT_DEV_ADMIN_LISTEN: SocketAddr = loopback(8081);

/// `dev --broker-listen`
pub const ENV_DEV_BROKER_LISTEN: &str = "STATESTORE_GATEWAY_DEV_BROKER_LISTEN";
pub const DEFAULT_DEV_BROKER_LISTEN: SocketAddr = loopback(1883);

/// `dev --data-dir`
pub const ENV_DEV_DATA_DIR: &str = "STATESTORE_GATEWAY_DEV_DATA_DIR";

/// Environment fallback of `injector --listen`.
pub const ENV_INJECTOR_LISTEN: &str = "STATESTORE_GATEWAY_INJECTOR_LISTEN";
/// Environment fallback of `injector --tls-cert-file`.
pub const ENV_INJECTOR_TLS_CERT_FILE: &str = "STATESTORE_GATEWAY_INJECTOR_TLS_CERT_FILE";
/// Environment fallback of `injector --tls-key-file`.
pub const ENV_INJECTOR_TLS_KEY_FILE: &str = "STATESTORE_GATEWAY_INJECTOR_TLS_KEY_FILE";

/// How long a request waits for an in-flight slot before it fails as
/// overloaded: long enough to ride out a burst, short enough that the
/// client hears `503 Retry-After` well before its own timeout.
pub fn slot_wait(request_timeout: Duration) -> Duration {
    request_timeout.min(Duration::from_secs(1))
}

/// `statestore-gateway-<hostname>` (the pod name in Kubernetes), or a random
/// suffix when the host name is unknown, so two gateways never share ids.
pub fn default_client_id() -> String {
    let hostname = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty());
    let suffix = hostname.unwrap_or_else(|| format!("{:08x}", rand::random::<u32>()));
    format!("statestore-gateway-{suffix}")
}

/// Why a duration did not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    /// Nothing given.
    #[error("empty duration")]
    Empty,
    /// Not digits followed by an optional unit.
    #[error(
        "{0:?} is not a duration: use a whole number with ms, s, m or h (plain numbers are milliseconds)"
    )]
    Malformed(String),
    /// Larger than a u64 of milliseconds.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// Parses `500ms`, `10s`, `2m`, `1h`, or a plain number of milliseconds.
///
/// One parser for settings and for the `ttl` query parameter, so both
/// accept the same spellings.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(DurationError::Malformed(text.chars().take(32).collect()));
    }
    let scale: u64 = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(DurationError::Malformed(text.chars().take(32).collect())),
    };
    let too_large = || DurationError::TooLarge(text.chars().take(32).collect());
    let number: u64 = digits.parse().map_err(|_| too_large())?;
    let ms = number.checked_mul(scale).ok_or_else(too_large)?;
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_units_and_plain_milliseconds() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration(" 3s "), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn malformed_durations_are_refused() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for bad in ["s", "1.5s", "-1s", "10 s", "10sec", "1d", "ms10", "１s"] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_duration("18446744073709551615h"),
            Err(DurationError::TooLarge(_))
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999"),
            Err(DurationError::TooLarge(_))
        ));
    }
}
