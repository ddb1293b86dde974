//! `serve`: the gateway's arguments and the [`ServeSettings`] they make.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, FromArgMatches as _};

use super::parse::{LogFormat, parse_any_duration, parse_positive_duration, parse_positive_usize};
use crate::access::ApiToken;
use crate::access::jwt::{JwksUrl, JwtSettings, KeySource};
use crate::access::rules::AuthzSettings;
use crate::dapr::{
    AppProtocol, AppSettings, DaprSettings, KeyPrefix, LockKeyPrefix, OutboxSettings,
};
use crate::http::transport::tls::CertificateFiles;
use crate::http::{Limits, ServeSettings};
use crate::locks::LockSettings;
use crate::mqtt::{BrokerSettings, PoolSettings};
use crate::settings::{self, Setting, SettingError};
use crate::watch::WatchSettings;

/// Settings of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address of the key API listener.
    #[arg(long, env = settings::LISTEN.env, default_value = settings::LISTEN.default)]
    pub listen: SocketAddr,
    /// Address of the admin listener (/livez, /readyz, /metrics).
    #[arg(long, env = settings::ADMIN_LISTEN.env, default_value = settings::ADMIN_LISTEN.default)]
    pub admin_listen: SocketAddr,
    /// Number of MQTT connections to the broker.
    #[arg(long, env = settings::POOL_SIZE.env, default_value = settings::POOL_SIZE.default, value_parser = parse_positive_usize)]
    pub pool_size: usize,
    /// How long a store request may wait for its reply (`500ms`, `10s`, `2m`).
    #[arg(long, env = settings::REQUEST_TIMEOUT.env, default_value = settings::REQUEST_TIMEOUT.default, value_parser = parse_positive_duration)]
    pub request_timeout: Duration,
    /// Store requests in flight per MQTT connection.
    #[arg(long, env = settings::MAX_IN_FLIGHT.env, default_value = settings::MAX_IN_FLIGHT.default, value_parser = parse_positive_usize)]
    pub max_in_flight: usize,
    /// Longest key accepted, in bytes after percent-decoding.
    #[arg(long, env = settings::MAX_KEY_BYTES.env, default_value = settings::MAX_KEY_BYTES.default, value_parser = parse_positive_usize)]
    pub max_key_bytes: usize,
    /// Largest value accepted; default: the broker's maximum packet size
    /// minus the envelope, else 4 MiB.
    #[arg(long, env = settings::MAX_VALUE_BYTES.env, value_parser = parse_positive_usize)]
    pub max_value_bytes: Option<usize>,
    /// File holding a bearer token the key API requires (admin port excluded).
    #[arg(long, env = settings::API_TOKEN_FILE.env)]
    pub api_token_file: Option<PathBuf>,
    /// JWKS file: the key API also accepts JWTs signed by its keys (read
    /// again when it changes). Needs --jwt-issuer and --jwt-audience.
    #[arg(long, env = settings::JWT_JWKS_FILE.env)]
    pub jwt_jwks_file: Option<PathBuf>,
    /// JWKS URL (`https://` or `http://`), fetched every 5 minutes and when
    /// a token names an unknown key (at most every 10 s), e.g.
    /// `https://kubernetes.default.svc/openid/v1/jwks`.
    #[arg(long, env = settings::JWT_JWKS_URL.env)]
    pub jwt_jwks_url: Option<String>,
    /// PEM CA bundle for an `https` JWKS URL (default: system roots).
    #[arg(long, env = settings::JWT_JWKS_CA_FILE.env)]
    pub jwt_jwks_ca_file: Option<PathBuf>,
    /// File holding a bearer token sent with the JWKS request (read at
    /// every fetch), e.g. the pod's service-account token.
    #[arg(long, env = settings::JWT_JWKS_TOKEN_FILE.env)]
    pub jwt_jwks_token_file: Option<PathBuf>,
    /// The `iss` claim a JWT must carry.
    #[arg(long, env = settings::JWT_ISSUER.env)]
    pub jwt_issuer: Option<String>,
    /// An audience a JWT's `aud` claim must hold.
    #[arg(long, env = settings::JWT_AUDIENCE.env)]
    pub jwt_audience: Option<String>,
    /// PEM certificate chain the key API serves TLS with (HTTP/2 by ALPN);
    /// read again when it changes. Needs --api-tls-key-file.
    #[arg(long, env = settings::API_TLS_CERT_FILE.env)]
    pub api_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --api-tls-cert-file; read again when it changes.
    #[arg(long, env = settings::API_TLS_KEY_FILE.env)]
    pub api_tls_key_file: Option<PathBuf>,
    /// YAML rules of which caller may read or write which keys (the
    /// broker's `stateStoreResources` shape); read again when it changes.
    /// Needs callers to be identified (`--api-token-file`).
    #[arg(long, env = settings::AUTHZ_FILE.env)]
    pub authz_file: Option<PathBuf>,
    /// How long in-flight requests may take to finish after SIGTERM.
    #[arg(long, env = settings::SHUTDOWN_GRACE.env, default_value = settings::SHUTDOWN_GRACE.default, value_parser = parse_any_duration)]
    pub shutdown_grace: Duration,
    /// Log line format.
    #[arg(long, env = settings::LOG_FORMAT.env, value_enum, default_value = settings::LOG_FORMAT.default)]
    pub log_format: LogFormat,
    /// Open SSE watch streams the gateway serves before answering 429.
    #[arg(long, env = settings::MAX_WATCHERS.env, default_value = settings::MAX_WATCHERS.default, value_parser = parse_positive_usize)]
    pub max_watchers: usize,
    /// Keys one watch stream may name.
    #[arg(long, env = settings::MAX_KEYS_PER_WATCH.env, default_value = settings::MAX_KEYS_PER_WATCH.default, value_parser = parse_positive_usize)]
    pub max_keys_per_watch: usize,
    /// Distinct keys watched in the whole gateway (each holds a store
    /// registration and an event buffer).
    #[arg(long, env = settings::MAX_WATCHED_KEYS.env, default_value = settings::MAX_WATCHED_KEYS.default, value_parser = parse_positive_usize)]
    pub max_watched_keys: usize,
    /// Interval of keep-alive comments on idle watch streams.
    #[arg(long, env = settings::WATCH_KEEPALIVE.env, default_value = settings::WATCH_KEEPALIVE.default, value_parser = parse_positive_duration)]
    pub watch_keepalive: Duration,
    /// Events buffered per watched key; a watcher that falls further behind
    /// skips to a `sync` of the latest state.
    #[arg(long, env = settings::WATCH_BUFFER.env, default_value = settings::WATCH_BUFFER.default, value_parser = parse_positive_usize)]
    pub watch_buffer: usize,
    /// Bytes of events kept per watched key (an event counts its value,
    /// its base64 and its SSE frame); past it the oldest are dropped and a
    /// watcher that needed them skips to a `sync`. The newest is always kept.
    #[arg(long, env = settings::WATCH_BUFFER_BYTES.env, default_value = settings::WATCH_BUFFER_BYTES.default, value_parser = parse_positive_usize)]
    pub watch_buffer_bytes: usize,
    /// How often every watched key is registered and read again as a safety
    /// net (`0` disables); reconnects trigger it at once anyway.
    #[arg(long, env = settings::WATCH_RESYNC_INTERVAL.env, default_value = settings::WATCH_RESYNC_INTERVAL.default, value_parser = parse_any_duration)]
    pub watch_resync_interval: Duration,
    /// How often a pattern followed by `/watch?match=` is listed again
    /// (SCAN) to find keys created by other clients; keys created through
    /// this gateway are followed at once.
    #[arg(long, env = settings::WATCH_RESCAN_INTERVAL.env, default_value = settings::WATCH_RESCAN_INTERVAL.default, value_parser = parse_positive_duration)]
    pub watch_rescan_interval: Duration,
    /// Keys one followed pattern may match: a pattern matching more is
    /// refused, and one that grows past it stops taking new keys.
    #[arg(long, env = settings::MAX_KEYS_PER_PATTERN.env, default_value = settings::MAX_KEYS_PER_PATTERN.default, value_parser = parse_positive_usize)]
    pub max_keys_per_pattern: usize,
    /// Distinct patterns followed by `/watch?match=` in the whole gateway
    /// (each is listed again every `--watch-rescan-interval`): a stream
    /// that would add one more is refused; joining a followed one is not.
    #[arg(long, env = settings::MAX_WATCH_PATTERNS.env, default_value = settings::MAX_WATCH_PATTERNS.default, value_parser = parse_positive_usize)]
    pub max_watch_patterns: usize,
    /// Browser origins allowed to call the API (CORS), comma-separated, or `*`.
    #[arg(long, env = settings::CORS_ALLOW_ORIGIN.env, value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,
    /// How long a client may take to send a request's headers (slow
    /// clients are disconnected); also how long an idle keep-alive
    /// connection stays open.
    #[arg(long, env = settings::HEADER_READ_TIMEOUT.env, default_value = settings::HEADER_READ_TIMEOUT.default, value_parser = parse_positive_duration)]
    pub header_read_timeout: Duration,
    /// Open connections on the API listener; at the limit the gateway
    /// stops accepting (new clients wait in the kernel's backlog) until one
    /// closes. Each HTTP/1.1 watch stream is a connection; HTTP/2 streams
    /// share theirs.
    #[arg(long, env = settings::MAX_CONNECTIONS.env, default_value = settings::MAX_CONNECTIONS.default, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// The longest `wait=` a lock request may ask for.
    #[arg(long, env = settings::MAX_LOCK_WAIT.env, default_value = settings::MAX_LOCK_WAIT.default, value_parser = parse_any_duration)]
    pub max_lock_wait: Duration,
    /// The longest lock holder name, in bytes.
    #[arg(long, env = settings::MAX_LOCK_HOLDER_BYTES.env, default_value = settings::MAX_LOCK_HOLDER_BYTES.default, value_parser = parse_positive_usize)]
    pub max_lock_holder_bytes: usize,
    /// Ops one `POST /batch` may carry (more: 413).
    #[arg(long, env = settings::MAX_BATCH_OPS.env, default_value = settings::MAX_BATCH_OPS.default, value_parser = parse_positive_usize)]
    pub max_batch_ops: usize,
    /// Largest `POST /batch` body, in bytes (larger: 413).
    #[arg(long, env = settings::MAX_BATCH_BYTES.env, default_value = settings::MAX_BATCH_BYTES.default, value_parser = parse_positive_usize)]
    pub max_batch_bytes: usize,
    /// The Dapr state store's name (`/v1.0/state/{name}`, gRPC `store_name`).
    #[arg(long, env = settings::DAPR_STATE_STORE.env, default_value = settings::DAPR_STATE_STORE.default, value_parser = parse_store_name)]
    pub dapr_state_store: String,
    /// The Dapr lock store's name (`/v1.0-alpha1/lock/{name}`).
    #[arg(long, env = settings::DAPR_LOCK_STORE.env, default_value = settings::DAPR_LOCK_STORE.default, value_parser = parse_store_name)]
    pub dapr_lock_store: String,
    /// The Dapr pub/sub component names apps publish through
    /// (`/v1.0/publish/{name}/{topic}`), comma-separated: every one is the
    /// broker.
    #[arg(long, env = settings::DAPR_PUBSUB.env, default_value = settings::DAPR_PUBSUB.default, value_parser = parse_pubsub_names)]
    pub dapr_pubsub: PubsubNames,
    /// The app id Dapr's metadata names (and `--dapr-key-prefix app-id` uses).
    #[arg(long, env = settings::DAPR_APP_ID.env, default_value = settings::DAPR_APP_ID.default, value_parser = parse_app_id)]
    pub dapr_app_id: String,
    /// How Dapr state keys are named in the store: `none` (as given, shared
    /// with `/keys`) or `app-id` (`<app-id>||<key>`, as Dapr and the AIO
    /// state component store them).
    #[arg(long, env = settings::DAPR_KEY_PREFIX.env, default_value = settings::DAPR_KEY_PREFIX.default, value_parser = parse_key_prefix)]
    pub dapr_key_prefix: KeyPrefix,
    /// How Dapr lock resources are named in the store, as Dapr's lock
    /// component's `keyPrefix`: `appid` (`lock||<app-id>||<resource>`),
    /// `name` (`lock||<lock store>||<resource>`), `none`
    /// (`lock||<resource>`) or a custom prefix (`lock||<prefix>||<resource>`).
    #[arg(long, env = settings::DAPR_LOCK_KEY_PREFIX.env, default_value = settings::DAPR_LOCK_KEY_PREFIX.default, value_parser = LockKeyPrefix::parse)]
    pub dapr_lock_key_prefix: LockKeyPrefix,
    /// The Dapr configuration store's name (`/v1.0/configuration/{name}`).
    #[arg(long, env = settings::DAPR_CONFIGURATION_STORE.env, default_value = settings::DAPR_CONFIGURATION_STORE.default, value_parser = parse_store_name)]
    pub dapr_configuration_store: String,
    /// What the store keys of Dapr configuration items start with: item
    /// `a` is the key `<prefix>a` (empty: keys as named).
    #[arg(long, env = settings::DAPR_CONFIGURATION_KEY_PREFIX.env, default_value = settings::DAPR_CONFIGURATION_KEY_PREFIX.default)]
    pub dapr_configuration_key_prefix: String,
    /// How long the per-key lease of a Dapr etag write lasts (a gateway that
    /// dies holding one delays other etag writes of that key this long).
    #[arg(long, env = settings::DAPR_ETAG_LEASE.env, default_value = settings::DAPR_ETAG_LEASE.default, value_parser = parse_positive_duration)]
    pub dapr_etag_lease: Duration,
    /// Dapr transactions (`true`/`false`): on, the state store is
    /// TRANSACTIONAL, and every Dapr read and write checks its key's lease
    /// (a read costs two store round trips instead of one). Every gateway
    /// writing the same keys through Dapr must agree.
    #[arg(long, env = settings::DAPR_TRANSACTIONS.env, default_value = settings::DAPR_TRANSACTIONS.default, action = ArgAction::Set,
          value_parser = BoolishValueParser::new())]
    pub dapr_transactions: bool,
    /// Largest Dapr request body over HTTP, and message either way over
    /// gRPC, in bytes (Dapr's `--max-body-size`; larger: 400, gRPC
    /// `RESOURCE_EXHAUSTED`).
    #[arg(long, env = settings::DAPR_MAX_BODY_SIZE.env, default_value = settings::DAPR_MAX_BODY_SIZE.default, value_parser = parse_positive_usize)]
    pub dapr_max_body_size: usize,
    /// The app's port on 127.0.0.1 (daprd's `--app-port`): the gateway
    /// waits for it, asks it for its subscriptions and delivers pub/sub
    /// events to it. None: no app.
    #[arg(long, env = settings::DAPR_APP_PORT.env, value_parser = clap::value_parser!(u16).range(1..))]
    pub dapr_app_port: Option<u16>,
    /// How the gateway calls the app (daprd's `--app-protocol`): `http` or
    /// `grpc` (Dapr's AppCallback service, h2c).
    #[arg(long, env = settings::DAPR_APP_PROTOCOL.env, default_value = settings::DAPR_APP_PROTOCOL.default, value_parser = AppProtocol::parse)]
    pub dapr_app_protocol: AppProtocol,
    /// Dapr `Subscription` resources (v2alpha1 or v1alpha1 YAML): a file,
    /// or a directory of `.yaml` files; delivered to the app.
    #[arg(long, env = settings::DAPR_SUBSCRIPTIONS.env)]
    pub dapr_subscriptions: Option<PathBuf>,
    /// The state store's outbox (daprd's `outboxPublishPubsub`): the
    /// pub/sub component, one of `--dapr-pubsub`, through which a committed
    /// transaction's upserts are published. Needs `--dapr-transactions`
    /// and `--dapr-outbox-topic`.
    #[arg(long, env = settings::DAPR_OUTBOX_PUBSUB.env, default_value = settings::DAPR_OUTBOX_PUBSUB.default)]
    pub dapr_outbox_pubsub: String,
    /// The outbox's topic (daprd's `outboxPublishTopic`).
    #[arg(long, env = settings::DAPR_OUTBOX_TOPIC.env, default_value = settings::DAPR_OUTBOX_TOPIC.default)]
    pub dapr_outbox_topic: String,
    /// The broker.
    #[command(flatten)]
    pub broker: BrokerArgs,
}

/// A Dapr store name or app id: not empty, no `/` (it is a path segment).
fn parse_store_name(text: &str) -> Result<String, String> {
    if text.is_empty() || text.contains('/') {
        return Err("must be non-empty, without '/'".to_owned());
    }
    Ok(text.to_owned())
}

/// An app id names keys (`<app-id>||<key>`, `lock||<app-id>||...`) and the
/// MQTT shared subscription of its replicas (`$share/<app-id>/...`): it may
/// hold neither Dapr's separator nor what MQTT forbids in a share name.
fn parse_app_id(text: &str) -> Result<String, String> {
    if text.is_empty() || text.contains(['/', '+', '#']) || text.contains("||") {
        return Err("must be non-empty, without '/', '+', '#' or '||'".to_owned());
    }
    Ok(text.to_owned())
}

/// An outbox's topic is one MQTT takes (with room for the internal topic
/// made of it), and transactions are on: the outbox publishes what a
/// transaction commits. `serve`'s and `dev`'s check.
pub(super) fn check_outbox(
    topic: &str,
    topic_setting: &Setting,
    transactions: bool,
    transactions_setting: &Setting,
) -> Result<(), SettingError> {
    if topic.len() > usize::from(u16::MAX) / 2 || topic.contains(['+', '#', '\0']) {
        return Err(SettingError::new(
            topic_setting,
            "an MQTT topic name holds no '+', '#' or NUL and has at most 32767 bytes",
        ));
    }
    if !transactions {
        return Err(SettingError::new(
            transactions_setting,
            "the outbox publishes what a transaction commits: it needs --dapr-transactions true",
        ));
    }
    Ok(())
}

/// The pub/sub names, as clap keeps one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubsubNames(pub Vec<String>);

/// Comma-separated pub/sub names: each a store name (not empty, no `/`),
/// blanks around commas ignored, none twice.
fn parse_pubsub_names(text: &str) -> Result<PubsubNames, String> {
    let mut names: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim) {
        let name = parse_store_name(name)?;
        if names.contains(&name) {
            return Err(format!("{name} is named twice"));
        }
        names.push(name);
    }
    Ok(PubsubNames(names))
}

fn parse_key_prefix(text: &str) -> Result<KeyPrefix, String> {
    match text {
        "none" => Ok(KeyPrefix::None),
        "app-id" => Ok(KeyPrefix::AppId),
        _ => Err("expected `none` or `app-id`".to_owned()),
    }
}

/// How to reach the MQTT broker, with the AIO SDKs' environment variables.
#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    /// Broker host name.
    #[arg(long, env = settings::BROKER_HOSTNAME.env, default_value = settings::BROKER_HOSTNAME.default)]
    pub broker_host: String,
    /// Broker TCP port.
    #[arg(long, env = settings::BROKER_TCP_PORT.env, default_value = settings::BROKER_TCP_PORT.default)]
    pub broker_port: u16,
    /// Whether to connect with TLS (`true`/`false`).
    #[arg(long, env = settings::MQTT_USE_TLS.env, default_value = settings::MQTT_USE_TLS.default, action = ArgAction::Set,
          value_parser = BoolishValueParser::new())]
    pub use_tls: bool,
    /// PEM CA bundle for the broker's certificate (default: system roots).
    #[arg(long, env = settings::TLS_CA_FILE.env)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS.
    #[arg(long, env = settings::TLS_CERT_FILE.env)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, env = settings::TLS_KEY_FILE.env)]
    pub tls_key_file: Option<PathBuf>,
    /// Service-account token file, sent as `K8S-SAT` enhanced authentication.
    #[arg(long, env = settings::SAT_FILE.env)]
    pub sat_file: Option<PathBuf>,
    /// MQTT user name.
    #[arg(long, env = settings::MQTT_USERNAME.env)]
    pub mqtt_username: Option<String>,
    /// File holding the MQTT password.
    #[arg(long, env = settings::MQTT_PASSWORD_FILE.env)]
    pub mqtt_password_file: Option<PathBuf>,
    /// MQTT client id prefix (members are `<id>-<n>`); default
    /// `statestore-gateway-<hostname>-<listen port>`: one per gateway on a
    /// host. Two gateways with one id take each other's broker sessions.
    #[arg(long, env = settings::MQTT_CLIENT_ID.env)]
    pub client_id: Option<String>,
    /// MQTT keep-alive in seconds (5 to 65535: rumqttc refuses less).
    #[arg(long, env = settings::MQTT_KEEP_ALIVE.env, default_value = settings::MQTT_KEEP_ALIVE.default)]
    pub keep_alive: u16,
    /// MQTT session expiry in seconds. Members connect with clean start and
    /// subscribe again after every CONNACK, so a session outliving the
    /// connection only keeps queued messages for nobody: 0 by default
    /// (the AIO SDKs default to 3600 because they resume sessions).
    #[arg(long, env = settings::MQTT_SESSION_EXPIRY.env, default_value = settings::MQTT_SESSION_EXPIRY.default)]
    pub session_expiry: u32,
}

impl ServeArgs {
    /// The gateway's settings: every rule that needs more than parsing is
    /// checked here, by the typed settings' own checks (files exist, pairs
    /// are complete, the client id and keep-alive fit), and the API token
    /// is read, so a bad setting stops the process before anything starts.
    pub fn settings(&self) -> Result<ServeSettings, SettingError> {
        let api_token = match &self.api_token_file {
            None => None,
            Some(path) => Some(
                read_api_token(path)
                    .map_err(|message| SettingError::new(&settings::API_TOKEN_FILE, message))?,
            ),
        };
        let jwt = self.jwt_settings()?;
        let api_tls = CertificateFiles::pair(
            self.api_tls_cert_file.as_deref(),
            self.api_tls_key_file.as_deref(),
            &settings::API_TLS_CERT_FILE,
            &settings::API_TLS_KEY_FILE,
        )?;
        let authz = self
            .authz_file
            .as_ref()
            .map(|file| self.authz_settings(file, api_token.is_some() || jwt.is_some()))
            .transpose()?;
        let client_id = match &self.broker.client_id {
            Some(id) => id.clone(),
            None => settings::default_client_id(self.listen.port()),
        };
        let outbox = self.outbox_settings()?;
        let settings = ServeSettings {
            listen: self.listen,
            admin_listen: self.admin_listen,
            pool: PoolSettings {
                broker: self.broker.settings(),
                client_id,
                size: self.pool_size,
                max_in_flight_per_member: self.max_in_flight,
                ..PoolSettings::default()
            },
            limits: Limits {
                max_key_bytes: self.max_key_bytes,
                max_value_bytes: self.max_value_bytes,
                max_batch_ops: self.max_batch_ops,
                max_batch_bytes: self.max_batch_bytes,
                dapr_max_body_size: self.dapr_max_body_size,
            },
            api_token,
            jwt,
            api_tls,
            authz,
            shutdown_grace: self.shutdown_grace,
            watch: WatchSettings {
                max_watchers: self.max_watchers,
                max_keys_per_stream: self.max_keys_per_watch,
                max_watched_keys: self.max_watched_keys,
                buffer: self.watch_buffer,
                buffer_bytes: self.watch_buffer_bytes,
                keep_alive: self.watch_keepalive,
                resync_interval: (!self.watch_resync_interval.is_zero())
                    .then_some(self.watch_resync_interval),
                rescan_interval: self.watch_rescan_interval,
                max_keys_per_pattern: self.max_keys_per_pattern,
                max_patterns: self.max_watch_patterns,
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
            dapr: DaprSettings {
                state_store: self.dapr_state_store.clone(),
                lock_store: self.dapr_lock_store.clone(),
                pubsubs: self.dapr_pubsub.0.clone(),
                app_id: self.dapr_app_id.clone(),
                key_prefix: self.dapr_key_prefix.clone(),
                lock_key_prefix: self.dapr_lock_key_prefix.clone(),
                configuration_store: self.dapr_configuration_store.clone(),
                configuration_key_prefix: self.dapr_configuration_key_prefix.clone(),
                etag_lease: self.dapr_etag_lease,
                transactions: self.dapr_transactions,
                app: self
                    .dapr_app_port
                    .map(|port| AppSettings::new(port, self.dapr_app_protocol)),
                subscriptions: self.dapr_subscriptions.clone(),
                outbox,
                ..DaprSettings::default()
            },
        }
        .with_request_timeout(self.request_timeout);
        settings.pool.check()?;
        Ok(settings)
    }
}

impl ServeArgs {
    /// The outbox: both its pub/sub and its topic, or neither; the pub/sub
    /// one of `--dapr-pubsub`, the topic one MQTT takes, and transactions
    /// on (the outbox publishes what a transaction commits).
    fn outbox_settings(&self) -> Result<Option<OutboxSettings>, SettingError> {
        let (pubsub, topic) = (&self.dapr_outbox_pubsub, &self.dapr_outbox_topic);
        match (pubsub.is_empty(), topic.is_empty()) {
            (true, true) => return Ok(None),
            (true, false) => {
                return Err(SettingError::new(
                    &settings::DAPR_OUTBOX_PUBSUB,
                    "the outbox needs its pub/sub component as well as --dapr-outbox-topic",
                ));
            }
            (false, true) => {
                return Err(SettingError::new(
                    &settings::DAPR_OUTBOX_TOPIC,
                    "the outbox needs its topic as well as --dapr-outbox-pubsub",
                ));
            }
            (false, false) => {}
        }
        if !self.dapr_pubsub.0.contains(pubsub) {
            return Err(SettingError::new(
                &settings::DAPR_OUTBOX_PUBSUB,
                format!(
                    "{pubsub} is not one of the pub/sub components of --dapr-pubsub ({})",
                    self.dapr_pubsub.0.join(",")
                ),
            ));
        }
        check_outbox(
            topic,
            &settings::DAPR_OUTBOX_TOPIC,
            self.dapr_transactions,
            &settings::DAPR_TRANSACTIONS,
        )?;
        Ok(Some(OutboxSettings {
            pubsub: pubsub.clone(),
            topic: topic.clone(),
        }))
    }

    /// `--authz-file`: rules need callers to tell apart. The file is read
    /// when the server starts (a bad one stops it there), then every few
    /// seconds.
    fn authz_settings(
        &self,
        file: &Path,
        authenticated: bool,
    ) -> Result<AuthzSettings, SettingError> {
        if !authenticated {
            return Err(SettingError::new(
                &settings::AUTHZ_FILE,
                format!(
                    "rules need callers to be identified: set {}, {} or {} too",
                    settings::API_TOKEN_FILE.flag,
                    settings::JWT_JWKS_FILE.flag,
                    settings::JWT_JWKS_URL.flag
                ),
            ));
        }
        Ok(AuthzSettings::new(file.to_owned()))
    }

    /// The JWT settings, when a JWKS file or URL is given: then the issuer
    /// and audience are required (the files are read when the gateway
    /// starts).
    fn jwt_settings(&self) -> Result<Option<JwtSettings>, SettingError> {
        let keys = match (&self.jwt_jwks_file, &self.jwt_jwks_url) {
            (None, None) => {
                for (given, setting) in [
                    (self.jwt_issuer.is_some(), &settings::JWT_ISSUER),
                    (self.jwt_audience.is_some(), &settings::JWT_AUDIENCE),
                    (self.jwt_jwks_ca_file.is_some(), &settings::JWT_JWKS_CA_FILE),
                    (
                        self.jwt_jwks_token_file.is_some(),
                        &settings::JWT_JWKS_TOKEN_FILE,
                    ),
                ] {
                    if given {
                        return Err(SettingError::new(
                            setting,
                            "needs --jwt-jwks-file or --jwt-jwks-url",
                        ));
                    }
                }
                return Ok(None);
            }
            (Some(_), Some(_)) => {
                return Err(SettingError::new(
                    &settings::JWT_JWKS_URL,
                    "give --jwt-jwks-file or --jwt-jwks-url, not both",
                ));
            }
            (Some(path), None) => KeySource::File(path.clone()),
            (None, Some(url)) => KeySource::Url(self.jwks_url(url)?),
        };
        let required = |value: &Option<String>, setting: &'static settings::Setting| {
            value
                .as_deref()
                .map(str::trim)
                .filter(|value| !value.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| {
                    SettingError::new(
                        setting,
                        "required with --jwt-jwks-file or --jwt-jwks-url (tokens of any other issuer or audience would pass)",
                    )
                })
        };
        let issuer = required(&self.jwt_issuer, &settings::JWT_ISSUER)?;
        let audience = required(&self.jwt_audience, &settings::JWT_AUDIENCE)?;
        Ok(Some(JwtSettings::new(keys, issuer, audience)))
    }

    fn jwks_url(&self, url: &str) -> Result<JwksUrl, SettingError> {
        // Only its form: the CA and token files are read at start.
        let setting = &settings::JWT_JWKS_URL;
        let uri: hyper::Uri = url.trim().parse().map_err(|error| {
            SettingError::new(setting, format!("{url:?} is not a URL: {error}"))
        })?;
        if uri.host().is_none_or(str::is_empty) {
            return Err(SettingError::new(setting, format!("{url:?} names no host")));
        }
        match uri.scheme_str() {
            Some("https") => {}
            Some("http") if self.jwt_jwks_ca_file.is_none() => {}
            Some("http") => {
                return Err(SettingError::new(
                    &settings::JWT_JWKS_CA_FILE,
                    "given for an http:// JWKS URL",
                ));
            }
            _ => {
                return Err(SettingError::new(
                    setting,
                    format!("{url:?} is neither https:// nor http://"),
                ));
            }
        }
        Ok(JwksUrl {
            uri,
            ca_file: self.jwt_jwks_ca_file.clone(),
            token_file: self.jwt_jwks_token_file.clone(),
        })
    }
}

impl BrokerArgs {
    /// The pool's broker settings, as given (checked with the pool's).
    pub fn settings(&self) -> BrokerSettings {
        BrokerSettings {
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
        }
    }
}

/// What `serve` says about a container's environment (`NAME`, `VALUE`
/// pairs; a later one of the same name wins, as in Kubernetes): its parser,
/// then its settings' checks, on those values alone. Files are not there
/// yet, so the settings naming one the checks read are left out (the JWT
/// files are read only when the gateway starts, and the checks need to
/// see a JWKS beside an issuer). For `inject`'s and the webhook's
/// [`ServeCheck`](crate::inject::values::ServeCheck).
pub fn check_environment(vars: &[(String, String)]) -> Result<(), String> {
    let mut argv = vec!["serve".to_owned()];
    let mut seen = std::collections::HashSet::new();
    for (name, value) in vars.iter().rev() {
        if !seen.insert(name.as_str()) {
            continue;
        }
        let row = settings::SERVE.iter().find(|row| row.env == name);
        if let Some(row) = row
            && (!row.flag.ends_with("-file") || row.flag.starts_with("--jwt-"))
        {
            argv.push(format!("{}={value}", row.flag));
        }
    }
    // Only the values given: not the environment of this process.
    let serve =
        ServeArgs::augment_args(clap::Command::new("serve")).mut_args(|arg| arg.env(None::<&str>));
    let args = serve
        .try_get_matches_from(argv)
        .and_then(|matches| ServeArgs::from_arg_matches(&matches))
        .map_err(|error| {
            let text = error.to_string();
            let first = text.lines().next().unwrap_or_default();
            first.trim_start_matches("error: ").to_owned()
        })?;
    args.settings().map_err(|error| error.to_string())?;
    // Span export's variables, which have no flags.
    let value_of = |name: &str| {
        vars.iter()
            .rev()
            .find(|(var, _)| var == name)
            .map(|(_, value)| value.clone())
    };
    crate::trace::ExportSettings::from_env(value_of)
        .map(drop)
        .map_err(|error| error.to_string())
}

/// Reads the API token file by the secret files' rule.
fn read_api_token(path: &Path) -> Result<ApiToken, String> {
    crate::files::secret::read_token(path)
        .map(ApiToken::new)
        .map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn serve_args(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let mut argv = vec!["statestore-gateway", "serve"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Serve(args) => Ok(args),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn app_ids_that_would_break_keys_or_topics_are_refused() {
        for bad in ["", "a||b", "a/b", "a+b", "a#b"] {
            let arg = format!("--dapr-app-id={bad}");
            assert!(serve_args(&[&arg]).is_err(), "{bad:?} was accepted");
        }
        let args = serve_args(&["--dapr-app-id=orders-v2.app_1"]).expect("a plain app id");
        assert_eq!(args.dapr_app_id, "orders-v2.app_1");
    }

    #[test]
    fn a_client_id_longer_than_1_kib_is_refused() {
        let long = "a".repeat(crate::mqtt::MAX_CLIENT_ID_BYTES + 1);
        let args = serve_args(&["--client-id", &long, "--use-tls", "false"]).unwrap();
        let error = args.settings().unwrap_err();
        assert_eq!(error.setting, "--client-id");
        assert!(error.to_string().contains("1025 bytes"), "{error}");
        let fits = "a".repeat(crate::mqtt::MAX_CLIENT_ID_BYTES);
        let args = serve_args(&["--client-id", &fits, "--use-tls", "false"]).unwrap();
        assert_eq!(args.settings().unwrap().pool.client_id, fits);
    }

    #[test]
    fn without_a_client_id_each_listen_port_gets_its_own() {
        let client_id = |listen: &str| {
            let args = serve_args(&["--listen", listen, "--use-tls", "false"]).unwrap();
            args.settings().unwrap().pool.client_id
        };
        let first = client_id("127.0.0.1:8080");
        assert!(first.starts_with("statestore-gateway-"), "{first}");
        assert!(first.ends_with("-8080"), "{first}");
        assert_ne!(first, client_id("127.0.0.1:9080"));
        assert_eq!(first, client_id("0.0.0.0:8080"));
    }

    #[test]
    fn an_app_port_names_the_app_and_its_protocol() {
        let settings = serve_args(&["--use-tls", "false"])
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(settings.dapr.app, None);
        let args = serve_args(&["--dapr-app-port", "3000", "--dapr-app-protocol", "grpc"]).unwrap();
        assert_eq!(
            args.settings().unwrap().dapr.app,
            Some(AppSettings::new(3000, AppProtocol::Grpc))
        );
        let args = serve_args(&["--dapr-app-port", "3000"]).unwrap();
        assert_eq!(args.dapr_app_protocol, AppProtocol::Http);
        assert!(serve_args(&["--dapr-app-port", "0"]).is_err());
        assert!(serve_args(&["--dapr-app-protocol", "https"]).is_err());
    }

    #[test]
    fn the_outbox_needs_its_topic_a_served_pubsub_and_transactions() {
        let refused = |args: &[&str]| {
            serve_args(args)
                .unwrap()
                .settings()
                .unwrap_err()
                .to_string()
        };
        assert!(refused(&["--dapr-outbox-pubsub", "pubsub"]).contains("--dapr-outbox-topic"));
        assert!(refused(&["--dapr-outbox-topic", "orders"]).contains("--dapr-outbox-pubsub"));
        let not_served = refused(&[
            "--dapr-outbox-pubsub=other",
            "--dapr-outbox-topic=orders",
            "--dapr-transactions=true",
        ]);
        assert!(
            not_served.contains("not one of the pub/sub components"),
            "{not_served}"
        );
        let no_transactions =
            refused(&["--dapr-outbox-pubsub=pubsub", "--dapr-outbox-topic=orders"]);
        assert!(
            no_transactions.contains("--dapr-transactions"),
            "{no_transactions}"
        );
        assert!(
            refused(&[
                "--dapr-outbox-pubsub=pubsub",
                "--dapr-outbox-topic=orders/#",
                "--dapr-transactions=true",
            ])
            .contains("MQTT topic")
        );
        let args = serve_args(&[
            "--dapr-pubsub=a,b",
            "--dapr-outbox-pubsub=b",
            "--dapr-outbox-topic=orders",
            "--dapr-transactions=true",
        ])
        .unwrap();
        assert_eq!(
            args.settings().unwrap().dapr.outbox,
            Some(OutboxSettings {
                pubsub: "b".into(),
                topic: "orders".into()
            })
        );
        assert_eq!(
            serve_args(&[]).unwrap().settings().unwrap().dapr.outbox,
            None
        );
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
        assert_eq!(from_cli.authz, code.authz);
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
            (&["--max-key-bytes=-1"][..], "--max-key-bytes"),
            (&["--max-value-bytes", "lots"][..], "--max-value-bytes"),
            (&["--use-tls", "perhaps"][..], "--use-tls"),
            (&["--log-format", "xml"][..], "--log-format"),
            (&["--listen", "nowhere"][..], "--listen"),
        ] {
            let error = serve_args(args).unwrap_err().to_string();
            assert!(error.contains(named), "{args:?}: {error}");
        }
        // These parse; the pool's own rules refuse them.
        for (args, named) in [
            (&["--pool-size", "65"][..], "--pool-size"),
            (&["--keep-alive", "4"][..], "--keep-alive"),
            (&["--keep-alive", "0"][..], "--keep-alive"),
            (&["--client-id", " "][..], "--client-id"),
            (&["--client-id", "gw/#"][..], "--client-id"),
            (&["--broker-host", ""][..], "--broker-host"),
        ] {
            let error = serve_args(args).unwrap().settings().unwrap_err();
            assert_eq!(error.setting, named, "{args:?}: {error}");
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
        assert!(error.to_string().contains(settings::API_TOKEN_FILE.env));
    }

    #[test]
    fn authz_file_needs_callers_to_be_identified() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret").unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(
            &rules,
            "rules:\n  - principals: {apiToken: true}\n    stateStoreResources:\n      - {keyType: Pattern, keys: [\"*\"], method: Read}\n",
        )
        .unwrap();
        let (token, rules) = (token.to_str().unwrap(), rules.to_str().unwrap());
        let args = serve_args(&["--api-token-file", token, "--authz-file", rules]).unwrap();
        let authz = args.settings().unwrap().authz.unwrap();
        assert_eq!(authz.file.to_str(), Some(rules));
        assert_eq!(authz.check_interval, settings::DEFAULT_AUTHZ_CHECK_INTERVAL);

        let alone = serve_args(&["--authz-file", rules]).unwrap();
        let error = alone.settings().unwrap_err();
        assert_eq!(error.setting, "--authz-file");
        assert!(error.message.contains("--api-token-file"), "{error}");
        assert!(error.message.contains("--jwt-jwks-file"), "{error}");
        // Signed tokens identify callers as well as the shared token does.
        let jwks = dir.path().join("jwks.json").to_str().unwrap().to_owned();
        let with_jwt = serve_args(&[
            "--jwt-jwks-file",
            &jwks,
            "--jwt-issuer",
            "https://issuer",
            "--jwt-audience",
            "gateway",
            "--authz-file",
            rules,
        ])
        .unwrap();
        assert!(with_jwt.settings().unwrap().authz.is_some());
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
        // The key API's certificate: both or neither (the server reads them).
        let error = serve_args(&["--api-tls-cert-file", cert.to_str().unwrap()])
            .unwrap()
            .settings()
            .unwrap_err();
        assert_eq!(error.setting, "--api-tls-key-file");
        assert!(
            error.to_string().contains("give both files or neither"),
            "{error}"
        );
    }

    #[test]
    fn a_jwks_needs_an_issuer_and_an_audience_and_they_need_a_jwks() {
        let named = |args: &[&str]| serve_args(args).unwrap().settings().unwrap_err();
        let file = ["--jwt-jwks-file", "/keys/jwks.json"];
        let error = named(&[&file[..], &["--jwt-audience", "gw"]].concat());
        assert_eq!(error.setting, "--jwt-issuer");
        assert!(error.message.starts_with("required with"), "{error}");
        let error = named(
            &[
                &file[..],
                &["--jwt-issuer", "https://i", "--jwt-audience", " "],
            ]
            .concat(),
        );
        assert_eq!(error.setting, "--jwt-audience");
        let error = named(&["--jwt-issuer", "https://i", "--jwt-audience", "gw"]);
        assert_eq!(error.setting, "--jwt-issuer");
        assert!(
            error
                .message
                .contains("needs --jwt-jwks-file or --jwt-jwks-url")
        );
        let both = [
            "--jwt-jwks-file",
            "/keys/jwks.json",
            "--jwt-jwks-url",
            "https://issuer/jwks",
            "--jwt-issuer",
            "https://i",
            "--jwt-audience",
            "gw",
        ];
        assert_eq!(named(&both).setting, "--jwt-jwks-url");

        let settings = serve_args(
            &[
                &file[..],
                &["--jwt-issuer", "https://i", "--jwt-audience", "gw"],
            ]
            .concat(),
        )
        .unwrap()
        .settings()
        .unwrap();
        let jwt = settings.jwt.unwrap();
        assert_eq!(
            (jwt.issuer.as_str(), jwt.audience.as_str()),
            ("https://i", "gw")
        );
        assert_eq!(jwt.leeway, settings::JWT_LEEWAY);
    }

    #[test]
    fn a_jwks_url_is_https_or_http_with_a_host() {
        let with = |url: &str, extra: &[&str]| {
            let mut args = vec![
                "--jwt-jwks-url",
                url,
                "--jwt-issuer",
                "i",
                "--jwt-audience",
                "a",
            ];
            args.extend_from_slice(extra);
            serve_args(&args).unwrap().settings()
        };
        assert!(with("https://kubernetes.default.svc/openid/v1/jwks", &[]).is_ok());
        assert!(with("http://127.0.0.1:8080/jwks", &[]).is_ok());
        for bad in ["ftp://host/jwks", "/just/a/path", "not a url"] {
            assert_eq!(
                with(bad, &[]).unwrap_err().setting,
                "--jwt-jwks-url",
                "{bad}"
            );
        }
        let error = with("http://host/jwks", &["--jwt-jwks-ca-file", "/ca.crt"]).unwrap_err();
        assert_eq!(error.setting, "--jwt-jwks-ca-file");
    }
}
