//! Command-line and environment settings for each subcommand.
//!
//! Every flag has an environment fallback whose name is a constant here, so
//! the Helm chart, the manifests and the README can name them exactly.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use thiserror::Error;

use crate::http::{ApiToken, Limits, ServeSettings};
use crate::locks::LockSettings;
use crate::mqtt::{BrokerSettings, PoolSettings};
use crate::watch::WatchSettings;

/// How often the SAT file is re-read to notice a rotated token.
const DEFAULT_SAT_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "statestore-gateway", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
// Parsed once at start: boxing the largest variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP key and watch API over a pool of MQTT5 connections.
    Serve(ServeArgs),
    /// Serve the state store protocol as an MQTT5 client of a broker.
    Emulator(EmulatorArgs),
    /// Embedded broker + emulator + gateway in one process, for laptops.
    Dev(DevArgs),
}

/// Environment variable names of `serve`'s settings (the Helm chart and the
/// README name them exactly; the `AIO_*` names are the AIO SDKs').
pub mod serve_env {
    /// `--listen`
    pub const LISTEN: &str = "STATESTORE_GATEWAY_LISTEN";
    /// `--admin-listen`
    pub const ADMIN_LISTEN: &str = "STATESTORE_GATEWAY_ADMIN_LISTEN";
    /// `--pool-size`
    pub const POOL_SIZE: &str = "STATESTORE_GATEWAY_POOL_SIZE";
    /// `--request-timeout`
    pub const REQUEST_TIMEOUT: &str = "STATESTORE_GATEWAY_REQUEST_TIMEOUT";
    /// `--max-in-flight`
    pub const MAX_IN_FLIGHT: &str = "STATESTORE_GATEWAY_MAX_IN_FLIGHT";
    /// `--max-key-bytes`
    pub const MAX_KEY_BYTES: &str = "STATESTORE_GATEWAY_MAX_KEY_BYTES";
    /// `--max-value-bytes`
    pub const MAX_VALUE_BYTES: &str = "STATESTORE_GATEWAY_MAX_VALUE_BYTES";
    /// `--api-token-file`
    pub const API_TOKEN_FILE: &str = "STATESTORE_GATEWAY_API_TOKEN_FILE";
    /// `--shutdown-grace`
    pub const SHUTDOWN_GRACE: &str = "STATESTORE_GATEWAY_SHUTDOWN_GRACE";
    /// `--log-format`
    pub const LOG_FORMAT: &str = "STATESTORE_GATEWAY_LOG_FORMAT";
    /// `--max-watchers`
    pub const MAX_WATCHERS: &str = "STATESTORE_GATEWAY_MAX_WATCHERS";
    /// `--max-keys-per-watch`
    pub const MAX_KEYS_PER_WATCH: &str = "STATESTORE_GATEWAY_MAX_KEYS_PER_WATCH";
    /// `--max-watched-keys`
    pub const MAX_WATCHED_KEYS: &str = "STATESTORE_GATEWAY_MAX_WATCHED_KEYS";
    /// `--watch-keepalive`
    pub const WATCH_KEEPALIVE: &str = "STATESTORE_GATEWAY_WATCH_KEEPALIVE";
    /// `--watch-buffer`
    pub const WATCH_BUFFER: &str = "STATESTORE_GATEWAY_WATCH_BUFFER";
    /// `--watch-resync-interval`
    pub const WATCH_RESYNC_INTERVAL: &str = "STATESTORE_GATEWAY_WATCH_RESYNC_INTERVAL";
    /// `--cors-allow-origin`
    pub const CORS_ALLOW_ORIGIN: &str = "STATESTORE_GATEWAY_CORS_ALLOW_ORIGIN";
    /// `--header-read-timeout`
    pub const HEADER_READ_TIMEOUT: &str = "STATESTORE_GATEWAY_HEADER_READ_TIMEOUT";
    /// `--max-connections`
    pub const MAX_CONNECTIONS: &str = "STATESTORE_GATEWAY_MAX_CONNECTIONS";
    /// `--max-lock-wait`
    pub const MAX_LOCK_WAIT: &str = "STATESTORE_GATEWAY_MAX_LOCK_WAIT";
    /// `--max-lock-holder-bytes`
    pub const MAX_LOCK_HOLDER_BYTES: &str = "STATESTORE_GATEWAY_MAX_LOCK_HOLDER_BYTES";
    /// `--broker-host`
    pub const BROKER_HOSTNAME: &str = "AIO_BROKER_HOSTNAME";
    /// `--broker-port`
    pub const BROKER_TCP_PORT: &str = "AIO_BROKER_TCP_PORT";
    /// `--use-tls`
    pub const MQTT_USE_TLS: &str = "AIO_MQTT_USE_TLS";
    /// `--tls-ca-file`
    pub const TLS_CA_FILE: &str = "AIO_TLS_CA_FILE";
    /// `--tls-cert-file`
    pub const TLS_CERT_FILE: &str = "AIO_TLS_CERT_FILE";
    /// `--tls-key-file`
    pub const TLS_KEY_FILE: &str = "AIO_TLS_KEY_FILE";
    /// `--sat-file`
    pub const SAT_FILE: &str = "AIO_SAT_FILE";
    /// `--mqtt-username`
    pub const MQTT_USERNAME: &str = "AIO_MQTT_USERNAME";
    /// `--mqtt-password-file`
    pub const MQTT_PASSWORD_FILE: &str = "AIO_MQTT_PASSWORD_FILE";
    /// `--client-id`
    pub const MQTT_CLIENT_ID: &str = "AIO_MQTT_CLIENT_ID";
    /// `--keep-alive`
    pub const MQTT_KEEP_ALIVE: &str = "AIO_MQTT_KEEP_ALIVE";
    /// `--session-expiry`
    pub const MQTT_SESSION_EXPIRY: &str = "AIO_MQTT_SESSION_EXPIRY";
}

/// The value limit when neither `--max-value-bytes` nor the broker says one.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 4 * 1024 * 1024;

/// The longest `--client-id`: members add `-<n>`, and the id is part of
/// every request's response topic, which MQTT caps at 65,535 bytes with
/// the rest of the topic; 1 KiB is far beyond any broker's practice.
pub const MAX_CLIENT_ID_BYTES: usize = 1024;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Settings of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address of the key API listener.
    #[arg(long, env = serve_env::LISTEN, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of the admin listener (/livez, /readyz, /metrics).
    #[arg(long, env = serve_env::ADMIN_LISTEN, default_value = "127.0.0.1:8081")]
    pub admin_listen: SocketAddr,
    /// Number of MQTT connections to the broker.
    #[arg(long, env = serve_env::POOL_SIZE, default_value = "4", value_parser = parse_pool_size)]
    pub pool_size: usize,
    /// How long a store request may wait for its reply (`500ms`, `10s`, `2m`).
    #[arg(long, env = serve_env::REQUEST_TIMEOUT, default_value = "10s", value_parser = parse_positive_duration)]
    pub request_timeout: Duration,
    /// Store requests in flight per MQTT connection.
    #[arg(long, env = serve_env::MAX_IN_FLIGHT, default_value = "256", value_parser = parse_positive_usize)]
    pub max_in_flight: usize,
    /// Longest key accepted, in bytes after percent-decoding.
    #[arg(long, env = serve_env::MAX_KEY_BYTES, default_value = "1024", value_parser = parse_positive_usize)]
    pub max_key_bytes: usize,
    /// Largest value accepted; default: the broker's maximum packet size
    /// minus the envelope, else 4 MiB.
    #[arg(long, env = serve_env::MAX_VALUE_BYTES, value_parser = parse_positive_usize)]
    pub max_value_bytes: Option<usize>,
    /// File holding a bearer token the key API requires (admin port excluded).
    #[arg(long, env = serve_env::API_TOKEN_FILE)]
    pub api_token_file: Option<PathBuf>,
    /// How long in-flight requests may take to finish after SIGTERM.
    #[arg(long, env = serve_env::SHUTDOWN_GRACE, default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Log line format.
    #[arg(long, env = serve_env::LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Open SSE watch streams the gateway serves before answering 429.
    #[arg(long, env = serve_env::MAX_WATCHERS, default_value = "10000", value_parser = parse_positive_usize)]
    pub max_watchers: usize,
    /// Keys one watch stream may name.
    #[arg(long, env = serve_env::MAX_KEYS_PER_WATCH, default_value = "64", value_parser = parse_positive_usize)]
    pub max_keys_per_watch: usize,
    /// Distinct keys watched in the whole gateway (each holds a store
    /// registration and an event buffer).
    #[arg(long, env = serve_env::MAX_WATCHED_KEYS, default_value = "10000", value_parser = parse_positive_usize)]
    pub max_watched_keys: usize,
    /// Interval of keep-alive comments on idle watch streams.
    #[arg(long, env = serve_env::WATCH_KEEPALIVE, default_value = "15s", value_parser = parse_positive_duration)]
    pub watch_keepalive: Duration,
    /// Events buffered per watched key; a watcher that falls further behind
    /// skips to a `sync` of the latest state.
    #[arg(long, env = serve_env::WATCH_BUFFER, default_value = "64", value_parser = parse_positive_usize)]
    pub watch_buffer: usize,
    /// How often every watched key is registered and read again as a safety
    /// net (`0` disables); reconnects trigger it at once anyway.
    #[arg(long, env = serve_env::WATCH_RESYNC_INTERVAL, default_value = "60s", value_parser = parse_duration)]
    pub watch_resync_interval: Duration,
    /// Browser origins allowed to call the API (CORS), comma-separated, or `*`.
    #[arg(long, env = serve_env::CORS_ALLOW_ORIGIN, value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,
    /// How long a client may take to send a request's headers (slow
    /// clients are disconnected); also how long an idle keep-alive
    /// connection stays open.
    #[arg(long, env = serve_env::HEADER_READ_TIMEOUT, default_value = "30s", value_parser = parse_positive_duration)]
    pub header_read_timeout: Duration,
    /// Open connections on the API listener; at the limit the gateway
    /// stops accepting (new clients wait in the kernel's backlog) until one
    /// closes. Each watch stream is a connection.
    #[arg(long, env = serve_env::MAX_CONNECTIONS, default_value = "20000", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// The longest `wait=` a lock request may ask for.
    #[arg(long, env = serve_env::MAX_LOCK_WAIT, default_value = "5m", value_parser = parse_duration)]
    pub max_lock_wait: Duration,
    /// The longest lock holder name, in bytes.
    #[arg(long, env = serve_env::MAX_LOCK_HOLDER_BYTES, default_value_t = crate::locks::DEFAULT_MAX_HOLDER_BYTES, value_parser = parse_positive_usize)]
    pub max_lock_holder_bytes: usize,
    /// The broker.
    #[command(flatten)]
    pub broker: BrokerArgs,
}

/// How to reach the MQTT broker, with the AIO SDKs' environment variables.
#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    /// Broker host name.
    #[arg(long, env = serve_env::BROKER_HOSTNAME, default_value = "localhost")]
    pub broker_host: String,
    /// Broker TCP port.
    #[arg(long, env = serve_env::BROKER_TCP_PORT, default_value = "8883")]
    pub broker_port: u16,
    /// Whether to connect with TLS (`true`/`false`).
    #[arg(long, env = serve_env::MQTT_USE_TLS, default_value = "true", action = ArgAction::Set,
          value_parser = BoolishValueParser::new())]
    pub use_tls: bool,
    /// PEM CA bundle for the broker's certificate (default: system roots).
    #[arg(long, env = serve_env::TLS_CA_FILE)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS.
    #[arg(long, env = serve_env::TLS_CERT_FILE)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, env = serve_env::TLS_KEY_FILE)]
    pub tls_key_file: Option<PathBuf>,
    /// Service-account token file, sent as `K8S-SAT` enhanced authentication.
    #[arg(long, env = serve_env::SAT_FILE)]
    pub sat_file: Option<PathBuf>,
    /// MQTT user name.
    #[arg(long, env = serve_env::MQTT_USERNAME)]
    pub mqtt_username: Option<String>,
    /// File holding the MQTT password.
    #[arg(long, env = serve_env::MQTT_PASSWORD_FILE)]
    pub mqtt_password_file: Option<PathBuf>,
    /// MQTT client id prefix (members are `<id>-<n>`); default
    /// `statestore-gateway-<hostname>`.
    #[arg(long, env = serve_env::MQTT_CLIENT_ID)]
    pub client_id: Option<String>,
    /// MQTT keep-alive in seconds (5 to 65535).
    #[arg(long, env = serve_env::MQTT_KEEP_ALIVE, default_value = "60", value_parser = parse_keep_alive)]
    pub keep_alive: u16,
    /// MQTT session expiry in seconds. Members connect with clean start and
    /// subscribe again after every CONNACK, so a session outliving the
    /// connection only keeps queued messages for nobody: 0 by default
    /// (the AIO SDKs default to 3600 because they resume sessions).
    #[arg(long, env = serve_env::MQTT_SESSION_EXPIRY, default_value = "0")]
    pub session_expiry: u32,
}

/// A setting that parsed but cannot be used.
#[derive(Debug, Error)]
#[error("invalid {setting} ({env}): {message}")]
pub struct ConfigError {
    /// The flag.
    pub setting: &'static str,
    /// Its environment variable.
    pub env: &'static str,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    fn new(setting: &'static str, env: &'static str, message: impl Into<String>) -> Self {
        Self {
            setting,
            env,
            message: message.into(),
        }
    }
}

impl ServeArgs {
    /// Checks the settings that need more than parsing (files exist and are
    /// readable, pairs are complete) and reads the API token, so a bad
    /// setting stops the process at start, not at the first connect.
    pub fn settings(&self) -> Result<ServeSettings, ConfigError> {
        let api_token = match &self.api_token_file {
            None => None,
            Some(path) => Some(read_api_token(path).map_err(|message| {
                ConfigError::new("--api-token-file", serve_env::API_TOKEN_FILE, message)
            })?),
        };
        let broker = self.broker.settings()?;
        let client_id = match &self.broker.client_id {
            Some(id) if id.trim().is_empty() => {
                return Err(ConfigError::new(
                    "--client-id",
                    serve_env::MQTT_CLIENT_ID,
                    "must not be empty",
                ));
            }
            // It travels in every request's response topic and `__srcId`.
            Some(id) if id.len() > MAX_CLIENT_ID_BYTES => {
                return Err(ConfigError::new(
                    "--client-id",
                    serve_env::MQTT_CLIENT_ID,
                    format!("{} bytes; at most {MAX_CLIENT_ID_BYTES}", id.len()),
                ));
            }
            Some(id) => id.clone(),
            None => default_client_id(),
        };
        let limits = Limits {
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
            request_timeout: self.request_timeout,
        };
        Ok(ServeSettings {
            listen: self.listen,
            admin_listen: self.admin_listen,
            pool: PoolSettings {
                broker,
                client_id,
                size: self.pool_size,
                request_timeout: self.request_timeout,
                max_in_flight_per_member: self.max_in_flight,
                slot_wait: slot_wait(self.request_timeout),
                sat_check_interval: DEFAULT_SAT_CHECK_INTERVAL,
            },
            limits,
            api_token,
            shutdown_grace: self.shutdown_grace,
            watch: WatchSettings {
                max_watchers: self.max_watchers,
                max_keys_per_stream: self.max_keys_per_watch,
                max_watched_keys: self.max_watched_keys,
                buffer: self.watch_buffer,
                register_timeout: self.request_timeout,
                keep_alive: self.watch_keepalive,
                resync_interval: (!self.watch_resync_interval.is_zero())
                    .then_some(self.watch_resync_interval),
            },
            cors_allow_origins: self
                .cors_allow_origin
                .iter()
                .map(|origin| origin.trim().to_owned())
                .filter(|origin| !origin.is_empty())
                .collect(),
            header_read_timeout: self.header_read_timeout,
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            locks: LockSettings {
                max_wait: self.max_lock_wait,
                max_holder_bytes: self.max_lock_holder_bytes,
            },
        })
    }
}

/// How long a request waits for an in-flight slot before it fails as
/// overloaded: long enough to ride out a burst, short enough that the
/// client hears `503 Retry-After` well before its own timeout.
pub fn slot_wait(request_timeout: Duration) -> Duration {
    request_timeout.min(Duration::from_secs(1))
}

impl BrokerArgs {
    /// The pool's broker settings, after checking every named file.
    pub fn settings(&self) -> Result<BrokerSettings, ConfigError> {
        let files: [(&Option<PathBuf>, &'static str, &'static str); 5] = [
            (&self.tls_ca_file, "--tls-ca-file", serve_env::TLS_CA_FILE),
            (
                &self.tls_cert_file,
                "--tls-cert-file",
                serve_env::TLS_CERT_FILE,
            ),
            (
                &self.tls_key_file,
                "--tls-key-file",
                serve_env::TLS_KEY_FILE,
            ),
            (&self.sat_file, "--sat-file", serve_env::SAT_FILE),
            (
                &self.mqtt_password_file,
                "--mqtt-password-file",
                serve_env::MQTT_PASSWORD_FILE,
            ),
        ];
        for (path, setting, env) in files {
            if let Some(path) = path {
                std::fs::File::open(path).map_err(|error| {
                    ConfigError::new(
                        setting,
                        env,
                        format!("cannot read {}: {error}", path.display()),
                    )
                })?;
            }
        }
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "--tls-key-file",
                    serve_env::TLS_KEY_FILE,
                    "a client certificate needs its private key",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "--tls-cert-file",
                    serve_env::TLS_CERT_FILE,
                    "a private key needs its client certificate",
                ));
            }
            _ => {}
        }
        if self.broker_host.trim().is_empty() {
            return Err(ConfigError::new(
                "--broker-host",
                serve_env::BROKER_HOSTNAME,
                "must not be empty",
            ));
        }
        Ok(BrokerSettings {
            host: self.broker_host.clone(),
            port: self.broker_port,
            use_tls: self.use_tls,
            ca_file: self.tls_ca_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
            sat_file: self.sat_file.clone(),
            username: self.mqtt_username.clone(),
            password_file: self.mqtt_password_file.clone(),
            keep_alive: Duration::from_secs(u64::from(self.keep_alive)),
            session_expiry: Duration::from_secs(u64::from(self.session_expiry)),
        })
    }
}

/// Reads a token file: trailing line breaks are dropped (editors and
/// `kubectl create secret --from-file` leave one), an empty token is refused.
fn read_api_token(path: &Path) -> Result<ApiToken, String> {
    let bytes =
        std::fs::read(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let mut token = bytes.as_slice();
    while let Some(rest) = token
        .strip_suffix(b"\n")
        .or_else(|| token.strip_suffix(b"\r"))
    {
        token = rest;
    }
    if token.is_empty() {
        return Err(format!("{} holds an empty token", path.display()));
    }
    Ok(ApiToken::new(token.to_vec()))
}

/// `statestore-gateway-<hostname>` (the pod name in Kubernetes), or a random
/// suffix when the host name is unknown, so two gateways never share ids.
fn default_client_id() -> String {
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

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be more than zero".into()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

fn parse_positive_usize(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(error) => Err(format!("{text:?} is not a whole number: {error}")),
    }
}

fn parse_pool_size(text: &str) -> Result<usize, String> {
    match parse_positive_usize(text)? {
        n if n > 64 => Err("must be at most 64".into()),
        n => Ok(n),
    }
}

fn parse_keep_alive(text: &str) -> Result<u16, String> {
    // rumqttc refuses keep-alives under 5 s.
    match text.trim().parse::<u16>() {
        Ok(n) if n >= 5 => Ok(n),
        Ok(_) => Err("must be at least 5 seconds".into()),
        Err(error) => Err(format!("{text:?} is not a number of seconds: {error}")),
    }
}

/// `emulator --broker`
pub const EMULATOR_BROKER_ENV: &str = "STATESTORE_EMULATOR_BROKER";
/// `emulator --client-id`
pub const EMULATOR_CLIENT_ID_ENV: &str = "STATESTORE_EMULATOR_CLIENT_ID";
/// `emulator --username`
pub const EMULATOR_USERNAME_ENV: &str = "STATESTORE_EMULATOR_USERNAME";
/// `emulator --password-file`
pub const EMULATOR_PASSWORD_FILE_ENV: &str = "STATESTORE_EMULATOR_PASSWORD_FILE";
/// `emulator --data-dir`
pub const EMULATOR_DATA_DIR_ENV: &str = "STATESTORE_EMULATOR_DATA_DIR";
/// `emulator --max-keys`
pub const EMULATOR_MAX_KEYS_ENV: &str = "STATESTORE_EMULATOR_MAX_KEYS";
/// `emulator --max-bytes`
pub const EMULATOR_MAX_BYTES_ENV: &str = "STATESTORE_EMULATOR_MAX_BYTES";
/// `emulator --log-format`
pub const EMULATOR_LOG_FORMAT_ENV: &str = "STATESTORE_EMULATOR_LOG_FORMAT";
/// `emulator --acl`
pub const EMULATOR_ACL_ENV: &str = "STATESTORE_EMULATOR_ACL";

/// Settings of `emulator`.
#[derive(Debug, Clone, Args)]
pub struct EmulatorArgs {
    /// The MQTT5 broker to serve the state store through, `HOST:PORT`.
    #[arg(long, env = EMULATOR_BROKER_ENV, default_value = "localhost:1883")]
    pub broker: HostPort,
    /// The emulator's MQTT client id (one emulator per broker).
    #[arg(long, env = EMULATOR_CLIENT_ID_ENV, default_value = "statestore-emulator")]
    pub client_id: String,
    /// Broker user name.
    #[arg(long, env = EMULATOR_USERNAME_ENV)]
    pub username: Option<String>,
    /// File holding the broker password (read once at start).
    #[arg(long, env = EMULATOR_PASSWORD_FILE_ENV, requires = "username")]
    pub password_file: Option<PathBuf>,
    /// Keep keys SET with `aio-persistence: true` in an append-only log in
    /// this directory, replayed at start. Without it everything is in memory.
    #[arg(long, env = EMULATOR_DATA_DIR_ENV)]
    pub data_dir: Option<PathBuf>,
    /// Most keys before SET fails with `the quota has been exceeded`.
    #[arg(long, env = EMULATOR_MAX_KEYS_ENV)]
    pub max_keys: Option<usize>,
    /// Most bytes (keys plus values) before SET fails with `the quota has been exceeded`.
    #[arg(long, env = EMULATOR_MAX_BYTES_ENV)]
    pub max_bytes: Option<usize>,
    /// JSON access list (client id or `prefix*` -> `read`/`write` key
    /// prefixes); requests outside it fail with `not authorized`.
    #[arg(long, env = EMULATOR_ACL_ENV)]
    pub acl: Option<PathBuf>,
    /// Log line format.
    #[arg(long, env = EMULATOR_LOG_FORMAT_ENV, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// A `HOST:PORT` network address (`[v6]:port` for IPv6 literals).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Name or address, without brackets.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl std::str::FromStr for HostPort {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| format!("{text:?} is not HOST:PORT"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return Err(format!("{text:?} has no host"));
        }
        let port = port
            .parse()
            .map_err(|_| format!("{port:?} is not a port number"))?;
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }
}

/// Environment fallback of `dev --listen`.
pub const ENV_DEV_LISTEN: &str = "STATESTORE_GATEWAY_DEV_LISTEN";
/// Environment fallback of `dev --admin-listen`.
pub const ENV_DEV_ADMIN_LISTEN: &str = "STATESTORE_GATEWAY_DEV_ADMIN_LISTEN";
/// Environment fallback of `dev --broker-listen`.
pub const ENV_DEV_BROKER_LISTEN: &str = "STATESTORE_GATEWAY_DEV_BROKER_LISTEN";
/// Environment fallback of `dev --data-dir`.
pub const ENV_DEV_DATA_DIR: &str = "STATESTORE_GATEWAY_DEV_DATA_DIR";

/// Settings of `dev`. Everything listens on loopback by default: the
/// embedded broker accepts anonymous clients and nothing uses TLS.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Address of the HTTP key and watch API.
    #[arg(long, env = ENV_DEV_LISTEN, default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Address of the admin endpoints (/livez, /readyz, /metrics).
    #[arg(long, env = ENV_DEV_ADMIN_LISTEN, default_value = "127.0.0.1:8081")]
    pub admin_listen: std::net::SocketAddr,
    /// Address of the embedded MQTT broker; other MQTT clients (mosquitto_pub,
    /// the AIO SDKs) can use the emulator through it.
    #[arg(long, env = ENV_DEV_BROKER_LISTEN, default_value = "127.0.0.1:1883")]
    pub broker_listen: std::net::SocketAddr,
    /// Directory where the emulator keeps its data across restarts; without
    /// it the store lives in memory only.
    #[arg(long, env = ENV_DEV_DATA_DIR)]
    pub data_dir: Option<std::path::PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_parses_names_and_bracketed_ipv6() {
        assert_eq!(
            "broker:1883".parse(),
            Ok(HostPort {
                host: "broker".into(),
                port: 1883
            })
        );
        assert_eq!(
            "[::1]:8883".parse(),
            Ok(HostPort {
                host: "::1".into(),
                port: 8883
            })
        );
        for bad in ["broker", ":1883", "broker:99999", "broker:x"] {
            assert!(bad.parse::<HostPort>().is_err(), "{bad}");
        }
    }

    #[test]
    fn emulator_flags_parse() {
        let cli = Cli::try_parse_from([
            "statestore-gateway",
            "emulator",
            "--broker",
            "127.0.0.1:1999",
            "--max-keys",
            "5",
            "--data-dir",
            "/tmp/x",
        ])
        .unwrap();
        let Command::Emulator(args) = cli.command else {
            panic!("not the emulator");
        };
        assert_eq!(args.broker.port, 1999);
        assert_eq!(args.max_keys, Some(5));
        assert_eq!(args.client_id, "statestore-emulator");
    }

    fn serve_args(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let mut argv = vec!["statestore-gateway", "serve"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Serve(args) => Ok(args),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn a_client_id_longer_than_1_kib_is_refused() {
        let long = "a".repeat(MAX_CLIENT_ID_BYTES + 1);
        let args = serve_args(&["--client-id", &long, "--use-tls", "false"]).unwrap();
        let error = args.settings().unwrap_err();
        assert_eq!(error.setting, "--client-id");
        assert!(error.to_string().contains("1025 bytes"), "{error}");
        let fits = "a".repeat(MAX_CLIENT_ID_BYTES);
        let args = serve_args(&["--client-id", &fits, "--use-tls", "false"]).unwrap();
        assert_eq!(args.settings().unwrap().pool.client_id, fits);
    }

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

    #[test]
    fn serve_defaults_match_the_documentation() {
        let args = serve_args(&[]).unwrap();
        assert_eq!(args.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(args.admin_listen, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(args.pool_size, 4);
        assert_eq!(args.request_timeout, Duration::from_secs(10));
        assert_eq!(args.max_in_flight, 256);
        assert_eq!(args.max_key_bytes, 1024);
        assert_eq!(args.max_value_bytes, None);
        assert_eq!(args.shutdown_grace, Duration::from_secs(20));
        assert_eq!(args.log_format, LogFormat::Text);
        assert_eq!(args.broker.broker_port, 8883);
        assert!(args.broker.use_tls);
        assert_eq!(args.broker.keep_alive, 60);
        assert_eq!(args.broker.session_expiry, 0);
        let settings = args.settings().unwrap();
        assert!(settings.pool.client_id.starts_with("statestore-gateway-"));
        assert_eq!(settings.pool.size, 4);
        assert_eq!(settings.pool.broker.keep_alive, Duration::from_secs(60));
    }

    #[test]
    fn bad_values_name_the_setting() {
        for (args, named) in [
            (&["--request-timeout", "10x"][..], "--request-timeout"),
            (&["--request-timeout", "0s"][..], "--request-timeout"),
            (&["--pool-size", "0"][..], "--pool-size"),
            (&["--pool-size", "65"][..], "--pool-size"),
            (&["--max-key-bytes=-1"][..], "--max-key-bytes"),
            (&["--max-value-bytes", "lots"][..], "--max-value-bytes"),
            (&["--keep-alive", "1"][..], "--keep-alive"),
            (&["--use-tls", "perhaps"][..], "--use-tls"),
            (&["--log-format", "xml"][..], "--log-format"),
            (&["--listen", "nowhere"][..], "--listen"),
        ] {
            let error = serve_args(args).unwrap_err().to_string();
            assert!(error.contains(named), "{args:?}: {error}");
        }
    }

    #[test]
    fn use_tls_takes_a_value() {
        assert!(!serve_args(&["--use-tls", "false"]).unwrap().broker.use_tls);
        assert!(serve_args(&["--use-tls", "true"]).unwrap().broker.use_tls);
    }

    #[test]
    fn api_token_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\r\n").unwrap();
        let args = serve_args(&["--api-token-file", path.to_str().unwrap()]).unwrap();
        let token = args.settings().unwrap().api_token.unwrap();
        assert!(token.matches(b"s3cret"));

        std::fs::write(&path, "\n").unwrap();
        let error = args.settings().unwrap_err();
        assert_eq!(error.setting, "--api-token-file");
        assert!(error.to_string().contains(serve_env::API_TOKEN_FILE));
    }

    #[test]
    fn missing_files_and_half_pairs_are_refused_at_start() {
        let error = serve_args(&["--sat-file", "/nonexistent/token"])
            .unwrap()
            .settings()
            .unwrap_err();
        assert_eq!(error.setting, "--sat-file");
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "x").unwrap();
        let error = serve_args(&["--tls-cert-file", cert.to_str().unwrap()])
            .unwrap()
            .settings()
            .unwrap_err();
        assert_eq!(error.setting, "--tls-key-file");
    }
}
