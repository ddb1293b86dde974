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
use crate::settings;
use crate::watch::WatchSettings;

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
    /// Add the gateway sidecar to the pods of Kubernetes YAML (stdout).
    Inject(InjectArgs),
    /// Mutating admission webhook adding the sidecar to annotated pods.
    Injector(InjectorArgs),
}

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
    #[arg(long, env = settings::ENV_LISTEN, default_value_t = settings::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Address of the admin listener (/livez, /readyz, /metrics).
    #[arg(long, env = settings::ENV_ADMIN_LISTEN, default_value_t = settings::DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: SocketAddr,
    /// Number of MQTT connections to the broker.
    #[arg(long, env = settings::ENV_POOL_SIZE, default_value_t = settings::DEFAULT_POOL_SIZE, value_parser = parse_pool_size)]
    pub pool_size: usize,
    /// How long a store request may wait for its reply (`500ms`, `10s`, `2m`).
    #[arg(long, env = settings::ENV_REQUEST_TIMEOUT, default_value = "10s", value_parser = parse_positive_duration)]
    pub request_timeout: Duration,
    /// Store requests in flight per MQTT connection.
    #[arg(long, env = settings::ENV_MAX_IN_FLIGHT, default_value_t = settings::DEFAULT_MAX_IN_FLIGHT, value_parser = parse_positive_usize)]
    pub max_in_flight: usize,
    /// Longest key accepted, in bytes after percent-decoding.
    #[arg(long, env = settings::ENV_MAX_KEY_BYTES, default_value_t = settings::DEFAULT_MAX_KEY_BYTES, value_parser = parse_positive_usize)]
    pub max_key_bytes: usize,
    /// Largest value accepted; default: the broker's maximum packet size
    /// minus the envelope, else 4 MiB.
    #[arg(long, env = settings::ENV_MAX_VALUE_BYTES, value_parser = parse_positive_usize)]
    pub max_value_bytes: Option<usize>,
    /// File holding a bearer token the key API requires (admin port excluded).
    #[arg(long, env = settings::ENV_API_TOKEN_FILE)]
    pub api_token_file: Option<PathBuf>,
    /// How long in-flight requests may take to finish after SIGTERM.
    #[arg(long, env = settings::ENV_SHUTDOWN_GRACE, default_value = "20s", value_parser = parse_any_duration)]
    pub shutdown_grace: Duration,
    /// Log line format.
    #[arg(long, env = settings::ENV_LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Open SSE watch streams the gateway serves before answering 429.
    #[arg(long, env = settings::ENV_MAX_WATCHERS, default_value_t = settings::DEFAULT_MAX_WATCHERS, value_parser = parse_positive_usize)]
    pub max_watchers: usize,
    /// Keys one watch stream may name.
    #[arg(long, env = settings::ENV_MAX_KEYS_PER_WATCH, default_value_t = settings::DEFAULT_MAX_KEYS_PER_WATCH, value_parser = parse_positive_usize)]
    pub max_keys_per_watch: usize,
    /// Distinct keys watched in the whole gateway (each holds a store
    /// registration and an event buffer).
    #[arg(long, env = settings::ENV_MAX_WATCHED_KEYS, default_value_t = settings::DEFAULT_MAX_WATCHED_KEYS, value_parser = parse_positive_usize)]
    pub max_watched_keys: usize,
    /// Interval of keep-alive comments on idle watch streams.
    #[arg(long, env = settings::ENV_WATCH_KEEPALIVE, default_value = "15s", value_parser = parse_positive_duration)]
    pub watch_keepalive: Duration,
    /// Events buffered per watched key; a watcher that falls further behind
    /// skips to a `sync` of the latest state.
    #[arg(long, env = settings::ENV_WATCH_BUFFER, default_value_t = settings::DEFAULT_WATCH_BUFFER, value_parser = parse_positive_usize)]
    pub watch_buffer: usize,
    /// Bytes of events kept per watched key (an event counts its value,
    /// its base64 and its SSE frame); past it the oldest are dropped and a
    /// watcher that needed them skips to a `sync`. The newest is always kept.
    #[arg(long, env = settings::ENV_WATCH_BUFFER_BYTES, default_value_t = settings::DEFAULT_WATCH_BUFFER_BYTES, value_parser = parse_positive_usize)]
    pub watch_buffer_bytes: usize,
    /// How often every watched key is registered and read again as a safety
    /// net (`0` disables); reconnects trigger it at once anyway.
    #[arg(long, env = settings::ENV_WATCH_RESYNC_INTERVAL, default_value = "60s", value_parser = parse_any_duration)]
    pub watch_resync_interval: Duration,
    /// How often a pattern followed by `/watch?match=` is listed again
    /// (SCAN) to find keys created by other clients; keys created through
    /// this gateway are followed at once.
    #[arg(long, env = settings::ENV_WATCH_RESCAN_INTERVAL, default_value = "5s", value_parser = parse_positive_duration)]
    pub watch_rescan_interval: Duration,
    /// Keys one followed pattern may match: a pattern matching more is
    /// refused, and one that grows past it stops taking new keys.
    #[arg(long, env = settings::ENV_MAX_KEYS_PER_PATTERN, default_value_t = settings::DEFAULT_MAX_KEYS_PER_PATTERN, value_parser = parse_positive_usize)]
    pub max_keys_per_pattern: usize,
    /// Browser origins allowed to call the API (CORS), comma-separated, or `*`.
    #[arg(long, env = settings::ENV_CORS_ALLOW_ORIGIN, value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,
    /// How long a client may take to send a request's headers (slow
    /// clients are disconnected); also how long an idle keep-alive
    /// connection stays open.
    #[arg(long, env = settings::ENV_HEADER_READ_TIMEOUT, default_value = "30s", value_parser = parse_positive_duration)]
    pub header_read_timeout: Duration,
    /// Open connections on the API listener; at the limit the gateway
    /// stops accepting (new clients wait in the kernel's backlog) until one
    /// closes. Each watch stream is a connection.
    #[arg(long, env = settings::ENV_MAX_CONNECTIONS, default_value_t = settings::DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// The longest `wait=` a lock request may ask for.
    #[arg(long, env = settings::ENV_MAX_LOCK_WAIT, default_value = "5m", value_parser = parse_any_duration)]
    pub max_lock_wait: Duration,
    /// The longest lock holder name, in bytes.
    #[arg(long, env = settings::ENV_MAX_LOCK_HOLDER_BYTES, default_value_t = settings::DEFAULT_MAX_LOCK_HOLDER_BYTES, value_parser = parse_positive_usize)]
    pub max_lock_holder_bytes: usize,
    /// The broker.
    #[command(flatten)]
    pub broker: BrokerArgs,
}

/// How to reach the MQTT broker, with the AIO SDKs' environment variables.
#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    /// Broker host name.
    #[arg(long, env = settings::ENV_BROKER_HOSTNAME, default_value_t = settings::DEFAULT_BROKER_HOSTNAME.to_owned())]
    pub broker_host: String,
    /// Broker TCP port.
    #[arg(long, env = settings::ENV_BROKER_TCP_PORT, default_value_t = settings::DEFAULT_BROKER_TCP_PORT)]
    pub broker_port: u16,
    /// Whether to connect with TLS (`true`/`false`).
    #[arg(long, env = settings::ENV_MQTT_USE_TLS, default_value_t = settings::DEFAULT_MQTT_USE_TLS, action = ArgAction::Set,
          value_parser = BoolishValueParser::new())]
    pub use_tls: bool,
    /// PEM CA bundle for the broker's certificate (default: system roots).
    #[arg(long, env = settings::ENV_TLS_CA_FILE)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS.
    #[arg(long, env = settings::ENV_TLS_CERT_FILE)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, env = settings::ENV_TLS_KEY_FILE)]
    pub tls_key_file: Option<PathBuf>,
    /// Service-account token file, sent as `K8S-SAT` enhanced authentication.
    #[arg(long, env = settings::ENV_SAT_FILE)]
    pub sat_file: Option<PathBuf>,
    /// MQTT user name.
    #[arg(long, env = settings::ENV_MQTT_USERNAME)]
    pub mqtt_username: Option<String>,
    /// File holding the MQTT password.
    #[arg(long, env = settings::ENV_MQTT_PASSWORD_FILE)]
    pub mqtt_password_file: Option<PathBuf>,
    /// MQTT client id prefix (members are `<id>-<n>`); default
    /// `statestore-gateway-<hostname>`.
    #[arg(long, env = settings::ENV_MQTT_CLIENT_ID)]
    pub client_id: Option<String>,
    /// MQTT keep-alive in seconds (5 to 65535).
    #[arg(long, env = settings::ENV_MQTT_KEEP_ALIVE, default_value_t = settings::DEFAULT_MQTT_KEEP_ALIVE, value_parser = parse_keep_alive)]
    pub keep_alive: u16,
    /// MQTT session expiry in seconds. Members connect with clean start and
    /// subscribe again after every CONNACK, so a session outliving the
    /// connection only keeps queued messages for nobody: 0 by default
    /// (the AIO SDKs default to 3600 because they resume sessions).
    #[arg(long, env = settings::ENV_MQTT_SESSION_EXPIRY, default_value_t = settings::DEFAULT_MQTT_SESSION_EXPIRY)]
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
                ConfigError::new("--api-token-file", settings::ENV_API_TOKEN_FILE, message)
            })?),
        };
        let broker = self.broker.settings()?;
        let client_id = match &self.broker.client_id {
            Some(id) if id.trim().is_empty() => {
                return Err(ConfigError::new(
                    "--client-id",
                    settings::ENV_MQTT_CLIENT_ID,
                    "must not be empty",
                ));
            }
            // It travels in every request's response topic and `__srcId`.
            Some(id) if id.len() > MAX_CLIENT_ID_BYTES => {
                return Err(ConfigError::new(
                    "--client-id",
                    settings::ENV_MQTT_CLIENT_ID,
                    format!("{} bytes; at most {MAX_CLIENT_ID_BYTES}", id.len()),
                ));
            }
            Some(id) => id.clone(),
            None => settings::default_client_id(),
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
                slot_wait: settings::slot_wait(self.request_timeout),
                sat_check_interval: settings::DEFAULT_SAT_CHECK_INTERVAL,
            },
            limits,
            api_token,
            shutdown_grace: self.shutdown_grace,
            watch: WatchSettings {
                max_watchers: self.max_watchers,
                max_keys_per_stream: self.max_keys_per_watch,
                max_watched_keys: self.max_watched_keys,
                buffer: self.watch_buffer,
                buffer_bytes: self.watch_buffer_bytes,
                register_timeout: self.request_timeout,
                keep_alive: self.watch_keepalive,
                resync_interval: (!self.watch_resync_interval.is_zero())
                    .then_some(self.watch_resync_interval),
                rescan_interval: self.watch_rescan_interval,
                max_keys_per_pattern: self.max_keys_per_pattern,
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

impl BrokerArgs {
    /// The pool's broker settings, after checking every named file.
    pub fn settings(&self) -> Result<BrokerSettings, ConfigError> {
        let files: [(&Option<PathBuf>, &'static str, &'static str); 5] = [
            (
                &self.tls_ca_file,
                "--tls-ca-file",
                settings::ENV_TLS_CA_FILE,
            ),
            (
                &self.tls_cert_file,
                "--tls-cert-file",
                settings::ENV_TLS_CERT_FILE,
            ),
            (
                &self.tls_key_file,
                "--tls-key-file",
                settings::ENV_TLS_KEY_FILE,
            ),
            (&self.sat_file, "--sat-file", settings::ENV_SAT_FILE),
            (
                &self.mqtt_password_file,
                "--mqtt-password-file",
                settings::ENV_MQTT_PASSWORD_FILE,
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
                    settings::ENV_TLS_KEY_FILE,
                    "a client certificate needs its private key",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "--tls-cert-file",
                    settings::ENV_TLS_CERT_FILE,
                    "a private key needs its client certificate",
                ));
            }
            _ => {}
        }
        if self.broker_host.trim().is_empty() {
            return Err(ConfigError::new(
                "--broker-host",
                settings::ENV_BROKER_HOSTNAME,
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

fn parse_any_duration(text: &str) -> Result<Duration, String> {
    settings::parse_duration(text).map_err(|error| error.to_string())
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match settings::parse_duration(text) {
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

/// Settings of `emulator`.
#[derive(Debug, Clone, Args)]
pub struct EmulatorArgs {
    /// The MQTT5 broker to serve the state store through, `HOST:PORT`.
    #[arg(long, env = settings::ENV_EMULATOR_BROKER, default_value = settings::DEFAULT_EMULATOR_BROKER)]
    pub broker: HostPort,
    /// The emulator's MQTT client id (one emulator per broker).
    #[arg(long, env = settings::ENV_EMULATOR_CLIENT_ID, default_value = settings::DEFAULT_EMULATOR_CLIENT_ID)]
    pub client_id: String,
    /// Broker user name.
    #[arg(long, env = settings::ENV_EMULATOR_USERNAME)]
    pub username: Option<String>,
    /// File holding the broker password (read once at start).
    #[arg(long, env = settings::ENV_EMULATOR_PASSWORD_FILE, requires = "username")]
    pub password_file: Option<PathBuf>,
    /// Keep keys SET with `aio-persistence: true` in an append-only log in
    /// this directory, replayed at start. Without it everything is in memory.
    #[arg(long, env = settings::ENV_EMULATOR_DATA_DIR)]
    pub data_dir: Option<PathBuf>,
    /// Most keys before SET fails with `the quota has been exceeded`.
    #[arg(long, env = settings::ENV_EMULATOR_MAX_KEYS)]
    pub max_keys: Option<usize>,
    /// Most bytes (keys plus values) before SET fails with `the quota has been exceeded`.
    #[arg(long, env = settings::ENV_EMULATOR_MAX_BYTES)]
    pub max_bytes: Option<usize>,
    /// JSON access list (client id or `prefix*` -> `read`/`write` key
    /// prefixes); requests outside it fail with `not authorized`.
    #[arg(long, env = settings::ENV_EMULATOR_ACL)]
    pub acl: Option<PathBuf>,
    /// Log line format.
    #[arg(long, env = settings::ENV_EMULATOR_LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
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

/// Settings of `dev`. Everything listens on loopback by default: the
/// embedded broker accepts anonymous clients and nothing uses TLS.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Address of the HTTP key and watch API.
    #[arg(long, env = settings::ENV_DEV_LISTEN, default_value_t = settings::DEFAULT_DEV_LISTEN)]
    pub listen: std::net::SocketAddr,
    /// Address of the admin endpoints (/livez, /readyz, /metrics).
    #[arg(long, env = settings::ENV_DEV_ADMIN_LISTEN, default_value_t = settings::DEFAULT_DEV_ADMIN_LISTEN)]
    pub admin_listen: std::net::SocketAddr,
    /// Address of the embedded MQTT broker; other MQTT clients (mosquitto_pub,
    /// the AIO SDKs) can use the emulator through it.
    #[arg(long, env = settings::ENV_DEV_BROKER_LISTEN, default_value_t = settings::DEFAULT_DEV_BROKER_LISTEN)]
    pub broker_listen: std::net::SocketAddr,
    /// Directory where the emulator keeps its data across restarts; without
    /// it the store lives in memory only.
    #[arg(long, env = settings::ENV_DEV_DATA_DIR)]
    pub data_dir: Option<std::path::PathBuf>,
}

/// The sidecar's settings, in the Helm chart's terms, for `inject` and
/// `injector`: the chart's defaults, then values files, then `--set`.
#[derive(Debug, Clone, Args)]
pub struct SidecarArgs {
    /// A values file of the Helm chart (only image, gateway, broker,
    /// sidecar, probes, resources, securityContext and podSecurityContext
    /// are read); repeatable, later files win.
    #[arg(short = 'f', long = "values", value_name = "FILE")]
    pub values: Vec<PathBuf>,
    /// One chart value, `PATH=VALUE` (`gateway.port=9080`,
    /// `sidecar.native=true`); repeatable, wins over the files.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
}

/// Settings of `inject`.
#[derive(Debug, Clone, Args)]
pub struct InjectArgs {
    /// Kubernetes YAML (several documents, `List`s); standard input when
    /// absent or `-`.
    pub file: Option<PathBuf>,
    /// The sidecar.
    #[command(flatten)]
    pub sidecar: SidecarArgs,
}

/// Settings of `injector`.
#[derive(Debug, Clone, Args)]
pub struct InjectorArgs {
    /// Address of the HTTPS listener (`POST /mutate`, `GET /livez`).
    #[arg(long, env = settings::ENV_INJECTOR_LISTEN, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM certificate chain served; read again when it changes.
    #[arg(long, env = settings::ENV_INJECTOR_TLS_CERT_FILE)]
    pub tls_cert_file: PathBuf,
    /// PEM private key of that certificate.
    #[arg(long, env = settings::ENV_INJECTOR_TLS_KEY_FILE)]
    pub tls_key_file: PathBuf,
    /// Log line format.
    #[arg(long, env = settings::ENV_LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// The sidecar (pods' annotations may override single values).
    #[command(flatten)]
    pub sidecar: SidecarArgs,
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
    fn code_defaults_equal_the_command_lines() {
        let from_cli = serve_args(&[]).unwrap().settings().unwrap();
        let code = ServeSettings {
            // Both come from the host name (random when there is none).
            pool: PoolSettings {
                client_id: from_cli.pool.client_id.clone(),
                ..PoolSettings::default()
            },
            ..ServeSettings::default()
        };
        assert_eq!(from_cli.listen, code.listen);
        assert_eq!(from_cli.admin_listen, code.admin_listen);
        assert_eq!(from_cli.pool, code.pool);
        assert_eq!(from_cli.limits, code.limits);
        assert!(from_cli.api_token.is_none() && code.api_token.is_none());
        assert_eq!(from_cli.shutdown_grace, code.shutdown_grace);
        assert_eq!(from_cli.watch, code.watch);
        assert_eq!(from_cli.cors_allow_origins, code.cors_allow_origins);
        assert_eq!(from_cli.header_read_timeout, code.header_read_timeout);
        assert_eq!(from_cli.max_connections, code.max_connections);
        assert_eq!(from_cli.locks, code.locks);

        let cli = Cli::try_parse_from(["statestore-gateway", "dev"]).unwrap();
        let Command::Dev(dev) = cli.command else {
            panic!("not dev");
        };
        assert_eq!(dev.listen, settings::DEFAULT_DEV_LISTEN);
        assert_eq!(dev.admin_listen, settings::DEFAULT_DEV_ADMIN_LISTEN);
        assert_eq!(dev.broker_listen, settings::DEFAULT_DEV_BROKER_LISTEN);
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
        assert!(error.to_string().contains(settings::ENV_API_TOKEN_FILE));
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
