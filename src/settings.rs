//! Every setting of every subcommand, in one table: its flag, its
//! environment variable, its default as `--help` shows it and the Helm
//! chart value that sets it. A leaf, so every layer can name its settings.
//!
//! The command line takes each flag's environment variable and default
//! from its row; the typed settings (`PoolSettings`, `WatchSettings`, ...)
//! take their `Default` from the `DEFAULT_*` constants below; tests check
//! that the two agree, and that docs/configuration.md's tables, the
//! chart's `values.yaml`, `values.schema.json` and named templates, and
//! `inject`'s container say what the table says.
//!
//! # Adding a setting
//!
//! 1. A row here (a `Setting` constant, and its name in the subcommand's
//!    list: `SERVE`, `EMULATOR`, `DEV` or `INJECTOR`), and a `DEFAULT_*`
//!    constant if code outside the command line needs the default.
//! 2. The field in the subcommand's arguments (`cli::serve::ServeArgs`,
//!    ...): `#[arg(long, env = settings::ROW.env, default_value =
//!    settings::ROW.default)]`, and its check in the typed settings it
//!    feeds (`ServeArgs::settings` builds them; rules that hold for any
//!    caller live in the typed settings' own `check`).
//! 3. Its use, and its row in docs/configuration.md. Then run the tests:
//!    they name the documented row, the chart value, schema entry,
//!    template line or chart README entry that is missing (a setting the chart does not set has `helm: Helm::None`).
//!    The checks: `cli`'s `every_flag_is_a_row_of_the_settings_table`,
//!    `inject::values`' `the_container_gets_each_chart_value_the_table_names`
//!    and the `settings_table` integration tests.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use thiserror::Error;

/// One setting: how the command line, the environment and the chart name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The flag, `--pool-size`; empty for a variable without one (span
    /// export's standard `OTEL_*` variables, [`SERVE_ENV`]).
    pub flag: &'static str,
    /// Its environment variable.
    pub env: &'static str,
    /// Its default as the command line writes it; empty when there is
    /// none or it is computed at start (the client id from the host name).
    pub default: &'static str,
    /// The Helm chart value that sets it.
    pub helm: Helm,
}

/// How the Helm chart sets a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Helm {
    /// Not at all (the chart's `extraEnv` can).
    None,
    /// This value, as it is, with the row's default (`gateway.poolSize`).
    Default(&'static str),
    /// This value, as it is, with a default of the chart's own (the AIO
    /// broker's address, JSON logs).
    Own(&'static str),
    /// This value when it is set: empty (or 0) by default, and then the
    /// chart leaves the variable out.
    IfSet(&'static str),
    /// A value the chart derives it from (`gateway.port` makes `--listen`,
    /// a Secret's name makes a file).
    Derived(&'static str),
}

impl Helm {
    /// The chart value's path (`gateway.poolSize`), if the chart sets it.
    pub fn path(self) -> Option<&'static str> {
        match self {
            Helm::None => None,
            Helm::Default(path) | Helm::Own(path) | Helm::IfSet(path) | Helm::Derived(path) => {
                Some(path)
            }
        }
    }
}

const fn loopback(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
}

// `serve` (the `AIO_*` names are the AIO SDKs').

pub const LISTEN: Setting = Setting {
    flag: "--listen",
    env: "STATESTORE_GATEWAY_LISTEN",
    default: "127.0.0.1:8080",
    helm: Helm::Derived("gateway.port"),
};

pub const ADMIN_LISTEN: Setting = Setting {
    flag: "--admin-listen",
    env: "STATESTORE_GATEWAY_ADMIN_LISTEN",
    default: "127.0.0.1:8081",
    helm: Helm::Derived("gateway.adminPort"),
};

pub const POOL_SIZE: Setting = Setting {
    flag: "--pool-size",
    env: "STATESTORE_GATEWAY_POOL_SIZE",
    default: "4",
    helm: Helm::Default("gateway.poolSize"),
};

pub const REQUEST_TIMEOUT: Setting = Setting {
    flag: "--request-timeout",
    env: "STATESTORE_GATEWAY_REQUEST_TIMEOUT",
    default: "10s",
    helm: Helm::Default("gateway.requestTimeout"),
};

pub const MAX_IN_FLIGHT: Setting = Setting {
    flag: "--max-in-flight",
    env: "STATESTORE_GATEWAY_MAX_IN_FLIGHT",
    default: "256",
    helm: Helm::Default("gateway.maxInFlight"),
};

pub const MAX_KEY_BYTES: Setting = Setting {
    flag: "--max-key-bytes",
    env: "STATESTORE_GATEWAY_MAX_KEY_BYTES",
    default: "1024",
    helm: Helm::Default("gateway.maxKeyBytes"),
};

pub const MAX_VALUE_BYTES: Setting = Setting {
    flag: "--max-value-bytes",
    env: "STATESTORE_GATEWAY_MAX_VALUE_BYTES",
    default: "",
    helm: Helm::IfSet("gateway.maxValueBytes"),
};

pub const API_TOKEN_FILE: Setting = Setting {
    flag: "--api-token-file",
    env: "STATESTORE_GATEWAY_API_TOKEN_FILE",
    default: "",
    helm: Helm::Derived("gateway.apiToken.secretName"),
};

/// A JWKS file: callers may present JWTs signed by its keys.
pub const JWT_JWKS_FILE: Setting = Setting {
    flag: "--jwt-jwks-file",
    env: "STATESTORE_GATEWAY_JWT_JWKS_FILE",
    default: "",
    helm: Helm::Derived("gateway.jwt.jwksConfigMap"),
};

/// A JWKS URL (an OIDC provider's `jwks_uri`, the cluster's
/// `/openid/v1/jwks`), fetched instead of a file.
pub const JWT_JWKS_URL: Setting = Setting {
    flag: "--jwt-jwks-url",
    env: "STATESTORE_GATEWAY_JWT_JWKS_URL",
    default: "",
    helm: Helm::IfSet("gateway.jwt.jwksUrl"),
};

/// PEM CA bundle for an `https` JWKS URL.
pub const JWT_JWKS_CA_FILE: Setting = Setting {
    flag: "--jwt-jwks-ca-file",
    env: "STATESTORE_GATEWAY_JWT_JWKS_CA_FILE",
    default: "",
    helm: Helm::Derived("gateway.jwt.jwksCaConfigMap"),
};

/// A bearer token file sent with the JWKS request (read at every fetch).
pub const JWT_JWKS_TOKEN_FILE: Setting = Setting {
    flag: "--jwt-jwks-token-file",
    env: "STATESTORE_GATEWAY_JWT_JWKS_TOKEN_FILE",
    default: "",
    helm: Helm::Derived("gateway.jwt.jwksServiceAccountToken"),
};

/// The `iss` a JWT must carry.
pub const JWT_ISSUER: Setting = Setting {
    flag: "--jwt-issuer",
    env: "STATESTORE_GATEWAY_JWT_ISSUER",
    default: "",
    helm: Helm::IfSet("gateway.jwt.issuer"),
};

/// An `aud` a JWT must carry.
pub const JWT_AUDIENCE: Setting = Setting {
    flag: "--jwt-audience",
    env: "STATESTORE_GATEWAY_JWT_AUDIENCE",
    default: "",
    helm: Helm::IfSet("gateway.jwt.audience"),
};

/// The key API's serving certificate (TLS, with HTTP/2 by ALPN); the
/// broker's client certificate is `--tls-cert-file`.
pub const API_TLS_CERT_FILE: Setting = Setting {
    flag: "--api-tls-cert-file",
    env: "STATESTORE_GATEWAY_API_TLS_CERT_FILE",
    default: "",
    helm: Helm::Derived("standalone.tls.secretName"),
};

/// The key of [`API_TLS_CERT_FILE`].
pub const API_TLS_KEY_FILE: Setting = Setting {
    flag: "--api-tls-key-file",
    env: "STATESTORE_GATEWAY_API_TLS_KEY_FILE",
    default: "",
    helm: Helm::Derived("standalone.tls.secretName"),
};

/// YAML rules of which caller may read or write which keys.
pub const AUTHZ_FILE: Setting = Setting {
    flag: "--authz-file",
    env: "STATESTORE_GATEWAY_AUTHZ_FILE",
    default: "",
    helm: Helm::Derived("standalone.authz.rules"),
};

pub const SHUTDOWN_GRACE: Setting = Setting {
    flag: "--shutdown-grace",
    env: "STATESTORE_GATEWAY_SHUTDOWN_GRACE",
    default: "20s",
    helm: Helm::Derived("gateway.shutdownGraceSeconds"),
};

pub const LOG_FORMAT: Setting = Setting {
    flag: "--log-format",
    env: "STATESTORE_GATEWAY_LOG_FORMAT",
    default: "text",
    helm: Helm::Own("gateway.logFormat"),
};

pub const MAX_WATCHERS: Setting = Setting {
    flag: "--max-watchers",
    env: "STATESTORE_GATEWAY_MAX_WATCHERS",
    default: "10000",
    helm: Helm::Default("gateway.maxWatchers"),
};

pub const MAX_KEYS_PER_WATCH: Setting = Setting {
    flag: "--max-keys-per-watch",
    env: "STATESTORE_GATEWAY_MAX_KEYS_PER_WATCH",
    default: "64",
    helm: Helm::Default("gateway.maxKeysPerWatch"),
};

pub const MAX_WATCHED_KEYS: Setting = Setting {
    flag: "--max-watched-keys",
    env: "STATESTORE_GATEWAY_MAX_WATCHED_KEYS",
    default: "10000",
    helm: Helm::Default("gateway.maxWatchedKeys"),
};

pub const WATCH_KEEPALIVE: Setting = Setting {
    flag: "--watch-keepalive",
    env: "STATESTORE_GATEWAY_WATCH_KEEPALIVE",
    default: "15s",
    helm: Helm::Default("gateway.watchKeepalive"),
};

pub const WATCH_BUFFER: Setting = Setting {
    flag: "--watch-buffer",
    env: "STATESTORE_GATEWAY_WATCH_BUFFER",
    default: "64",
    helm: Helm::Default("gateway.watchBuffer"),
};

pub const WATCH_BUFFER_BYTES: Setting = Setting {
    flag: "--watch-buffer-bytes",
    env: "STATESTORE_GATEWAY_WATCH_BUFFER_BYTES",
    default: "8388608",
    helm: Helm::None,
};

pub const WATCH_RESYNC_INTERVAL: Setting = Setting {
    flag: "--watch-resync-interval",
    env: "STATESTORE_GATEWAY_WATCH_RESYNC_INTERVAL",
    default: "60s",
    helm: Helm::Default("gateway.watchResyncInterval"),
};

/// How often a pattern followed by `/watch?match=` is listed again to
/// find keys other clients created.
pub const WATCH_RESCAN_INTERVAL: Setting = Setting {
    flag: "--watch-rescan-interval",
    env: "STATESTORE_GATEWAY_WATCH_RESCAN_INTERVAL",
    default: "5s",
    helm: Helm::Default("gateway.watchRescanInterval"),
};

/// Keys one followed pattern may match.
pub const MAX_KEYS_PER_PATTERN: Setting = Setting {
    flag: "--max-keys-per-pattern",
    env: "STATESTORE_GATEWAY_MAX_KEYS_PER_PATTERN",
    default: "10000",
    helm: Helm::Default("gateway.maxKeysPerPattern"),
};

/// Distinct patterns followed by `/watch?match=` in the whole gateway
/// (each is listed again every `--watch-rescan-interval`).
pub const MAX_WATCH_PATTERNS: Setting = Setting {
    flag: "--max-watch-patterns",
    env: "STATESTORE_GATEWAY_MAX_WATCH_PATTERNS",
    default: "256",
    helm: Helm::Default("gateway.maxWatchPatterns"),
};

pub const CORS_ALLOW_ORIGIN: Setting = Setting {
    flag: "--cors-allow-origin",
    env: "STATESTORE_GATEWAY_CORS_ALLOW_ORIGIN",
    default: "",
    helm: Helm::IfSet("gateway.corsAllowOrigin"),
};

pub const HEADER_READ_TIMEOUT: Setting = Setting {
    flag: "--header-read-timeout",
    env: "STATESTORE_GATEWAY_HEADER_READ_TIMEOUT",
    default: "30s",
    helm: Helm::Default("gateway.headerReadTimeout"),
};

pub const MAX_CONNECTIONS: Setting = Setting {
    flag: "--max-connections",
    env: "STATESTORE_GATEWAY_MAX_CONNECTIONS",
    default: "20000",
    helm: Helm::Default("gateway.maxConnections"),
};

pub const MAX_LOCK_WAIT: Setting = Setting {
    flag: "--max-lock-wait",
    env: "STATESTORE_GATEWAY_MAX_LOCK_WAIT",
    default: "5m",
    helm: Helm::None,
};

pub const MAX_LOCK_HOLDER_BYTES: Setting = Setting {
    flag: "--max-lock-holder-bytes",
    env: "STATESTORE_GATEWAY_MAX_LOCK_HOLDER_BYTES",
    default: "1024",
    helm: Helm::None,
};

pub const DAPR_STATE_STORE: Setting = Setting {
    flag: "--dapr-state-store",
    env: "STATESTORE_GATEWAY_DAPR_STATE_STORE",
    default: "statestore",
    helm: Helm::Default("gateway.daprStateStore"),
};

pub const DAPR_LOCK_STORE: Setting = Setting {
    flag: "--dapr-lock-store",
    env: "STATESTORE_GATEWAY_DAPR_LOCK_STORE",
    default: "lockstore",
    helm: Helm::Default("gateway.daprLockStore"),
};

/// The pub/sub component names apps publish through, comma-separated:
/// every one is the broker.
pub const DAPR_PUBSUB: Setting = Setting {
    flag: "--dapr-pubsub",
    env: "STATESTORE_GATEWAY_DAPR_PUBSUB",
    default: "pubsub",
    helm: Helm::Default("gateway.daprPubsub"),
};

/// The app id Dapr's metadata names, and the key prefix `app-id` uses.
pub const DAPR_APP_ID: Setting = Setting {
    flag: "--dapr-app-id",
    env: "STATESTORE_GATEWAY_DAPR_APP_ID",
    default: "statestore-gateway",
    helm: Helm::Default("gateway.daprAppId"),
};

/// `none` (keys as given) or `app-id` (`<app-id>||<key>`, Dapr's default).
pub const DAPR_KEY_PREFIX: Setting = Setting {
    flag: "--dapr-key-prefix",
    env: "STATESTORE_GATEWAY_DAPR_KEY_PREFIX",
    default: "none",
    helm: Helm::Default("gateway.daprKeyPrefix"),
};

/// Dapr's lock `keyPrefix`: `appid` (Dapr's default:
/// `lock||<app-id>||<resource>`), `name`, `none` or a custom prefix.
pub const DAPR_LOCK_KEY_PREFIX: Setting = Setting {
    flag: "--dapr-lock-key-prefix",
    env: "STATESTORE_GATEWAY_DAPR_LOCK_KEY_PREFIX",
    default: "appid",
    helm: Helm::Default("gateway.daprLockKeyPrefix"),
};

/// The configuration store's name in Dapr's configuration API.
pub const DAPR_CONFIGURATION_STORE: Setting = Setting {
    flag: "--dapr-configuration-store",
    env: "STATESTORE_GATEWAY_DAPR_CONFIGURATION_STORE",
    default: "configstore",
    helm: Helm::Default("gateway.daprConfigurationStore"),
};

/// What the store keys of configuration items start with (empty: items
/// are keys as named).
pub const DAPR_CONFIGURATION_KEY_PREFIX: Setting = Setting {
    flag: "--dapr-configuration-key-prefix",
    env: "STATESTORE_GATEWAY_DAPR_CONFIGURATION_KEY_PREFIX",
    default: "",
    helm: Helm::Default("gateway.daprConfigurationKeyPrefix"),
};

/// Dapr transactions: on, every Dapr read and write checks its key's lease.
pub const DAPR_TRANSACTIONS: Setting = Setting {
    flag: "--dapr-transactions",
    env: "STATESTORE_GATEWAY_DAPR_TRANSACTIONS",
    default: "false",
    helm: Helm::None,
};

pub const DAPR_ETAG_LEASE: Setting = Setting {
    flag: "--dapr-etag-lease",
    env: "STATESTORE_GATEWAY_DAPR_ETAG_LEASE",
    default: "5s",
    helm: Helm::None,
};

/// Dapr's `--max-body-size`: the largest request body over HTTP, and
/// message either way over gRPC.
pub const DAPR_MAX_BODY_SIZE: Setting = Setting {
    flag: "--dapr-max-body-size",
    env: "STATESTORE_GATEWAY_DAPR_MAX_BODY_SIZE",
    default: "4194304",
    helm: Helm::Default("gateway.daprMaxBodySize"),
};

/// The app's port (daprd's `--app-port`): the gateway delivers pub/sub
/// events to the app there. None by default: no app.
pub const DAPR_APP_PORT: Setting = Setting {
    flag: "--dapr-app-port",
    env: "STATESTORE_GATEWAY_DAPR_APP_PORT",
    default: "",
    helm: Helm::IfSet("gateway.daprAppPort"),
};

/// How the gateway calls the app (daprd's `--app-protocol`): `http` or `grpc`.
pub const DAPR_APP_PROTOCOL: Setting = Setting {
    flag: "--dapr-app-protocol",
    env: "STATESTORE_GATEWAY_DAPR_APP_PROTOCOL",
    default: "http",
    helm: Helm::Default("gateway.daprAppProtocol"),
};

/// Dapr `Subscription` resources (a YAML file, or a directory of them).
pub const DAPR_SUBSCRIPTIONS: Setting = Setting {
    flag: "--dapr-subscriptions",
    env: "STATESTORE_GATEWAY_DAPR_SUBSCRIPTIONS",
    default: "",
    helm: Helm::None,
};

/// daprd's `outboxPublishPubsub` state store metadata: the pub/sub
/// component (one of `--dapr-pubsub`) a committed transaction's upserts are
/// published through. Empty: no outbox.
pub const DAPR_OUTBOX_PUBSUB: Setting = Setting {
    flag: "--dapr-outbox-pubsub",
    env: "STATESTORE_GATEWAY_DAPR_OUTBOX_PUBSUB",
    default: "",
    helm: Helm::None,
};

/// daprd's `outboxPublishTopic`: the topic of the outbox's events.
pub const DAPR_OUTBOX_TOPIC: Setting = Setting {
    flag: "--dapr-outbox-topic",
    env: "STATESTORE_GATEWAY_DAPR_OUTBOX_TOPIC",
    default: "",
    helm: Helm::None,
};

pub const MAX_BATCH_OPS: Setting = Setting {
    flag: "--max-batch-ops",
    env: "STATESTORE_GATEWAY_MAX_BATCH_OPS",
    default: "1000",
    helm: Helm::Default("gateway.maxBatchOps"),
};

pub const MAX_BATCH_BYTES: Setting = Setting {
    flag: "--max-batch-bytes",
    env: "STATESTORE_GATEWAY_MAX_BATCH_BYTES",
    default: "16777216",
    helm: Helm::Default("gateway.maxBatchBytes"),
};

pub const BROKER_HOSTNAME: Setting = Setting {
    flag: "--broker-host",
    env: "AIO_BROKER_HOSTNAME",
    default: "localhost",
    helm: Helm::Own("broker.host"),
};

pub const BROKER_TCP_PORT: Setting = Setting {
    flag: "--broker-port",
    env: "AIO_BROKER_TCP_PORT",
    default: "8883",
    helm: Helm::Own("broker.port"),
};

pub const MQTT_USE_TLS: Setting = Setting {
    flag: "--use-tls",
    env: "AIO_MQTT_USE_TLS",
    default: "true",
    helm: Helm::Default("broker.tls.enabled"),
};

pub const TLS_CA_FILE: Setting = Setting {
    flag: "--tls-ca-file",
    env: "AIO_TLS_CA_FILE",
    default: "",
    helm: Helm::Derived("broker.tls.caConfigMap"),
};

pub const TLS_CERT_FILE: Setting = Setting {
    flag: "--tls-cert-file",
    env: "AIO_TLS_CERT_FILE",
    default: "",
    helm: Helm::Derived("broker.tls.clientCertSecret"),
};

pub const TLS_KEY_FILE: Setting = Setting {
    flag: "--tls-key-file",
    env: "AIO_TLS_KEY_FILE",
    default: "",
    helm: Helm::Derived("broker.tls.clientCertSecret"),
};

pub const SAT_FILE: Setting = Setting {
    flag: "--sat-file",
    env: "AIO_SAT_FILE",
    default: "",
    helm: Helm::Derived("broker.sat.enabled"),
};

pub const MQTT_USERNAME: Setting = Setting {
    flag: "--mqtt-username",
    env: "AIO_MQTT_USERNAME",
    default: "",
    helm: Helm::IfSet("broker.username"),
};

pub const MQTT_PASSWORD_FILE: Setting = Setting {
    flag: "--mqtt-password-file",
    env: "AIO_MQTT_PASSWORD_FILE",
    default: "",
    helm: Helm::Derived("broker.passwordSecret.name"),
};

/// The chart makes it one per pod: `<broker.clientId>-<pod name>`.
pub const MQTT_CLIENT_ID: Setting = Setting {
    flag: "--client-id",
    env: "AIO_MQTT_CLIENT_ID",
    default: "",
    helm: Helm::Derived("broker.clientId"),
};

pub const MQTT_KEEP_ALIVE: Setting = Setting {
    flag: "--keep-alive",
    env: "AIO_MQTT_KEEP_ALIVE",
    default: "60",
    helm: Helm::Default("broker.keepAlive"),
};

pub const MQTT_SESSION_EXPIRY: Setting = Setting {
    flag: "--session-expiry",
    env: "AIO_MQTT_SESSION_EXPIRY",
    default: "0",
    helm: Helm::Default("broker.sessionExpiry"),
};

/// Every setting of `serve`, in `--help` order.
pub const SERVE: &[&Setting] = &[
    &LISTEN,
    &ADMIN_LISTEN,
    &POOL_SIZE,
    &REQUEST_TIMEOUT,
    &MAX_IN_FLIGHT,
    &MAX_KEY_BYTES,
    &MAX_VALUE_BYTES,
    &API_TOKEN_FILE,
    &JWT_JWKS_FILE,
    &JWT_JWKS_URL,
    &JWT_JWKS_CA_FILE,
    &JWT_JWKS_TOKEN_FILE,
    &JWT_ISSUER,
    &JWT_AUDIENCE,
    &API_TLS_CERT_FILE,
    &API_TLS_KEY_FILE,
    &AUTHZ_FILE,
    &SHUTDOWN_GRACE,
    &LOG_FORMAT,
    &MAX_WATCHERS,
    &MAX_KEYS_PER_WATCH,
    &MAX_WATCHED_KEYS,
    &WATCH_KEEPALIVE,
    &WATCH_BUFFER,
    &WATCH_BUFFER_BYTES,
    &WATCH_RESYNC_INTERVAL,
    &WATCH_RESCAN_INTERVAL,
    &MAX_KEYS_PER_PATTERN,
    &MAX_WATCH_PATTERNS,
    &CORS_ALLOW_ORIGIN,
    &HEADER_READ_TIMEOUT,
    &MAX_CONNECTIONS,
    &MAX_LOCK_WAIT,
    &MAX_LOCK_HOLDER_BYTES,
    &MAX_BATCH_OPS,
    &MAX_BATCH_BYTES,
    &DAPR_STATE_STORE,
    &DAPR_LOCK_STORE,
    &DAPR_PUBSUB,
    &DAPR_APP_ID,
    &DAPR_KEY_PREFIX,
    &DAPR_LOCK_KEY_PREFIX,
    &DAPR_CONFIGURATION_STORE,
    &DAPR_CONFIGURATION_KEY_PREFIX,
    &DAPR_ETAG_LEASE,
    &DAPR_TRANSACTIONS,
    &DAPR_MAX_BODY_SIZE,
    &DAPR_APP_PORT,
    &DAPR_APP_PROTOCOL,
    &DAPR_SUBSCRIPTIONS,
    &DAPR_OUTBOX_PUBSUB,
    &DAPR_OUTBOX_TOPIC,
    &BROKER_HOSTNAME,
    &BROKER_TCP_PORT,
    &MQTT_USE_TLS,
    &TLS_CA_FILE,
    &TLS_CERT_FILE,
    &TLS_KEY_FILE,
    &SAT_FILE,
    &MQTT_USERNAME,
    &MQTT_PASSWORD_FILE,
    &MQTT_CLIENT_ID,
    &MQTT_KEEP_ALIVE,
    &MQTT_SESSION_EXPIRY,
];

// `serve`'s span export: the OpenTelemetry SDKs' standard variables, read
// from the environment only (no flags). The other `OTEL_*` variables that
// docs/configuration.md names (`OTEL_BSP_*`, `OTEL_RESOURCE_ATTRIBUTES`,
// ...) are left to the chart's `gateway.extraEnv`.

/// Where spans go (export is off without it); the signal-specific
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` wins over it.
pub const OTEL_EXPORTER_OTLP_ENDPOINT: Setting = Setting {
    flag: "",
    env: "OTEL_EXPORTER_OTLP_ENDPOINT",
    default: "",
    helm: Helm::IfSet("tracing.otlpEndpoint"),
};

/// Which traces are sampled.
pub const OTEL_TRACES_SAMPLER: Setting = Setting {
    flag: "",
    env: "OTEL_TRACES_SAMPLER",
    default: "parentbased_always_on",
    helm: Helm::Default("tracing.sampler"),
};

/// The ratio of the `traceidratio` samplers.
pub const OTEL_TRACES_SAMPLER_ARG: Setting = Setting {
    flag: "",
    env: "OTEL_TRACES_SAMPLER_ARG",
    default: "",
    helm: Helm::IfSet("tracing.samplerArg"),
};

/// The service name of the spans' resource.
pub const OTEL_SERVICE_NAME: Setting = Setting {
    flag: "",
    env: "OTEL_SERVICE_NAME",
    default: "statestore-gateway",
    helm: Helm::None,
};

/// The variables of `serve` that have no flag.
pub const SERVE_ENV: &[&Setting] = &[
    &OTEL_EXPORTER_OTLP_ENDPOINT,
    &OTEL_TRACES_SAMPLER,
    &OTEL_TRACES_SAMPLER_ARG,
    &OTEL_SERVICE_NAME,
];

// `emulator`.

pub const EMULATOR_BROKER: Setting = Setting {
    flag: "--broker",
    env: "STATESTORE_EMULATOR_BROKER",
    default: "localhost:1883",
    helm: Helm::None,
};

pub const EMULATOR_CLIENT_ID: Setting = Setting {
    flag: "--client-id",
    env: "STATESTORE_EMULATOR_CLIENT_ID",
    default: "statestore-emulator",
    helm: Helm::None,
};

pub const EMULATOR_USERNAME: Setting = Setting {
    flag: "--username",
    env: "STATESTORE_EMULATOR_USERNAME",
    default: "",
    helm: Helm::None,
};

pub const EMULATOR_PASSWORD_FILE: Setting = Setting {
    flag: "--password-file",
    env: "STATESTORE_EMULATOR_PASSWORD_FILE",
    default: "",
    helm: Helm::None,
};

pub const EMULATOR_DATA_DIR: Setting = Setting {
    flag: "--data-dir",
    env: "STATESTORE_EMULATOR_DATA_DIR",
    default: "",
    helm: Helm::None,
};

pub const EMULATOR_MAX_KEYS: Setting = Setting {
    flag: "--max-keys",
    env: "STATESTORE_EMULATOR_MAX_KEYS",
    default: "",
    helm: Helm::None,
};

pub const EMULATOR_MAX_BYTES: Setting = Setting {
    flag: "--max-bytes",
    env: "STATESTORE_EMULATOR_MAX_BYTES",
    default: "",
    helm: Helm::None,
};

pub const EMULATOR_ACL: Setting = Setting {
    flag: "--acl",
    env: "STATESTORE_EMULATOR_ACL",
    default: "",
    helm: Helm::None,
};

pub const EMULATOR_LOG_FORMAT: Setting = Setting {
    flag: "--log-format",
    env: "STATESTORE_EMULATOR_LOG_FORMAT",
    default: "text",
    helm: Helm::None,
};

/// Every setting of `emulator`, in `--help` order.
pub const EMULATOR: &[&Setting] = &[
    &EMULATOR_BROKER,
    &EMULATOR_CLIENT_ID,
    &EMULATOR_USERNAME,
    &EMULATOR_PASSWORD_FILE,
    &EMULATOR_DATA_DIR,
    &EMULATOR_MAX_KEYS,
    &EMULATOR_MAX_BYTES,
    &EMULATOR_ACL,
    &EMULATOR_LOG_FORMAT,
];

// `dev`.

pub const DEV_LISTEN: Setting = Setting {
    flag: "--listen",
    env: "STATESTORE_GATEWAY_DEV_LISTEN",
    default: "127.0.0.1:8080",
    helm: Helm::None,
};

pub const DEV_ADMIN_LISTEN: Setting = Setting {
    flag: "--admin-listen",
    env: "STATESTORE_GATEWAY_DEV_ADMIN_LISTEN",
    default: "127.0.0.1:8081",
    helm: Helm::None,
};

pub const DEV_BROKER_LISTEN: Setting = Setting {
    flag: "--broker-listen",
    env: "STATESTORE_GATEWAY_DEV_BROKER_LISTEN",
    default: "127.0.0.1:1883",
    helm: Helm::None,
};

pub const DEV_DATA_DIR: Setting = Setting {
    flag: "--data-dir",
    env: "STATESTORE_GATEWAY_DEV_DATA_DIR",
    default: "",
    helm: Helm::None,
};

/// `serve`'s `--dapr-transactions`, for `dev`'s gateway.
pub const DEV_DAPR_TRANSACTIONS: Setting = Setting {
    flag: "--dapr-transactions",
    env: "STATESTORE_GATEWAY_DEV_DAPR_TRANSACTIONS",
    default: "false",
    helm: Helm::None,
};

/// The topic of `dev`'s Dapr outbox (through the pub/sub `pubsub`); empty:
/// no outbox.
pub const DEV_DAPR_OUTBOX_TOPIC: Setting = Setting {
    flag: "--dapr-outbox-topic",
    env: "STATESTORE_GATEWAY_DEV_DAPR_OUTBOX_TOPIC",
    default: "",
    helm: Helm::None,
};

/// Every setting of `dev`, in `--help` order.
pub const DEV: &[&Setting] = &[
    &DEV_LISTEN,
    &DEV_ADMIN_LISTEN,
    &DEV_BROKER_LISTEN,
    &DEV_DATA_DIR,
    &DEV_DAPR_TRANSACTIONS,
    &DEV_DAPR_OUTBOX_TOPIC,
];

// `injector`.

pub const INJECTOR_LISTEN: Setting = Setting {
    flag: "--listen",
    env: "STATESTORE_GATEWAY_INJECTOR_LISTEN",
    default: "0.0.0.0:8443",
    helm: Helm::None,
};

pub const INJECTOR_TLS_CERT_FILE: Setting = Setting {
    flag: "--tls-cert-file",
    env: "STATESTORE_GATEWAY_INJECTOR_TLS_CERT_FILE",
    default: "",
    helm: Helm::None,
};

pub const INJECTOR_TLS_KEY_FILE: Setting = Setting {
    flag: "--tls-key-file",
    env: "STATESTORE_GATEWAY_INJECTOR_TLS_KEY_FILE",
    default: "",
    helm: Helm::None,
};

pub const INJECTOR_LOG_FORMAT: Setting = Setting {
    flag: "--log-format",
    env: "STATESTORE_GATEWAY_LOG_FORMAT",
    default: "text",
    helm: Helm::None,
};

/// Every setting of `injector`, in `--help` order.
pub const INJECTOR: &[&Setting] = &[
    &INJECTOR_LISTEN,
    &INJECTOR_TLS_CERT_FILE,
    &INJECTOR_TLS_KEY_FILE,
    &INJECTOR_LOG_FORMAT,
];

// Typed defaults, for the settings types' `Default` (equal to the rows'
// text: checked by the command line's tests).

pub const DEFAULT_LISTEN: SocketAddr = loopback(8080);
pub const DEFAULT_ADMIN_LISTEN: SocketAddr = loopback(8081);
pub const DEFAULT_POOL_SIZE: usize = 4;
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
pub const DEFAULT_MAX_KEY_BYTES: usize = 1024;
/// Without the flag: the broker's maximum packet size minus the envelope,
/// or this when the broker has not said it yet.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 4 * 1024 * 1024;
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
pub const DEFAULT_MAX_WATCHERS: usize = 10_000;
pub const DEFAULT_MAX_KEYS_PER_WATCH: usize = 64;
pub const DEFAULT_MAX_WATCHED_KEYS: usize = 10_000;
pub const DEFAULT_WATCH_KEEPALIVE: Duration = Duration::from_secs(15);
pub const DEFAULT_WATCH_BUFFER: usize = 64;
pub const DEFAULT_WATCH_BUFFER_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_WATCH_RESYNC_INTERVAL: Duration = Duration::from_secs(60);
pub const DEFAULT_WATCH_RESCAN_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_KEYS_PER_PATTERN: usize = 10_000;
pub const DEFAULT_MAX_WATCH_PATTERNS: usize = 256;
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONNECTIONS: u32 = 20_000;
pub const DEFAULT_MAX_LOCK_WAIT: Duration = Duration::from_secs(300);
pub const DEFAULT_MAX_LOCK_HOLDER_BYTES: usize = 1024;
pub const DEFAULT_MAX_BATCH_OPS: usize = 1_000;
pub const DEFAULT_MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Dapr's default (4 MiB).
pub const DEFAULT_DAPR_MAX_BODY_SIZE: usize = 4 * 1024 * 1024;
pub const DEFAULT_DAPR_ETAG_LEASE: Duration = Duration::from_secs(5);
pub const DEFAULT_BROKER_HOSTNAME: &str = "localhost";
pub const DEFAULT_BROKER_TCP_PORT: u16 = 8883;
pub const DEFAULT_MQTT_USE_TLS: bool = true;
/// In seconds.
pub const DEFAULT_MQTT_KEEP_ALIVE: u16 = 60;
/// In seconds. Members connect with clean start and subscribe again after
/// every CONNACK, so a session outliving the connection would only keep
/// messages for nobody (the AIO SDKs default to 3600: they resume sessions).
pub const DEFAULT_MQTT_SESSION_EXPIRY: u32 = 0;
/// How often the SAT file is read again to notice a rotated token (not a flag).
pub const DEFAULT_SAT_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How often the `--authz-file` is read again to notice changed rules (not a flag).
pub const DEFAULT_AUTHZ_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Clock skew allowed on a JWT's `exp` and `nbf` (not a flag).
pub const JWT_LEEWAY: Duration = Duration::from_secs(30);
/// How often a JWKS file is read again to notice a change (not a flag).
pub const DEFAULT_JWKS_FILE_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How often a JWKS URL is fetched again (not a flag).
pub const DEFAULT_JWKS_REFRESH_INTERVAL: Duration = Duration::from_secs(300);
/// The least time between two fetches of a JWKS URL caused by tokens with
/// an unknown `kid` (not a flag): a flood of made-up key ids costs one
/// fetch per interval.
pub const DEFAULT_JWKS_MIN_REFETCH_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_DEV_LISTEN: SocketAddr = loopback(8080);
pub const DEFAULT_DEV_ADMIN_LISTEN: SocketAddr = loopback(8081);
pub const DEFAULT_DEV_BROKER_LISTEN: SocketAddr = loopback(1883);

/// How long a request waits for an in-flight slot before it fails as
/// overloaded: long enough to ride out a burst, short enough that the
/// client hears `503 Retry-After` well before its own timeout.
pub fn slot_wait(request_timeout: Duration) -> Duration {
    request_timeout.min(Duration::from_secs(1))
}

/// `statestore-gateway-<hostname>-<port>`: the host name (the pod name in
/// Kubernetes) and the key API's listen port, which no other process on the
/// host listens on while this one does (with port 0, any free one, the
/// process id stands in). So two gateways on one host never share an id
/// (the broker would give each one's session to the other, over and over),
/// and a pod's gateway gets the same one back when its container restarts.
/// A random suffix stands in for an unknown host name.
pub fn default_client_id(listen_port: u16) -> String {
    let hostname = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok());
    client_id_for(hostname.as_deref(), listen_port, std::process::id())
}

/// [`default_client_id`] for this host name, port and process id.
fn client_id_for(hostname: Option<&str>, listen_port: u16, pid: u32) -> String {
    let host = hostname
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map_or_else(|| format!("{:08x}", rand::random::<u32>()), str::to_owned);
    let process = match listen_port {
        0 => format!("pid{pid}"),
        port => port.to_string(),
    };
    format!("statestore-gateway-{host}-{process}")
}

/// A setting that parsed but cannot be used: the one error every layer
/// reports a bad setting with, named by its flag and environment variable,
/// so an operator can fix it (the binary exits with the usage code).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid {setting}{}: {message}", env.map(|env| format!(" ({env})")).unwrap_or_default())]
pub struct SettingError {
    /// The flag (`--client-id`).
    pub setting: &'static str,
    /// Its environment variable, when it has one.
    pub env: Option<&'static str>,
    /// What is wrong.
    pub message: String,
}

impl SettingError {
    /// `setting` cannot be used.
    pub fn new(setting: &Setting, message: impl Into<String>) -> Self {
        Self {
            setting: setting.flag,
            env: Some(setting.env),
            message: message.into(),
        }
    }

    /// `setting`, a flag without an environment variable, cannot be used.
    pub fn flag(setting: &'static str, message: impl Into<String>) -> Self {
        Self {
            setting,
            env: None,
            message: message.into(),
        }
    }
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
    fn the_default_client_id_names_the_host_and_the_listen_port() {
        assert_eq!(
            client_id_for(Some("web-7d9f8-abcde\n"), 8080, 7),
            "statestore-gateway-web-7d9f8-abcde-8080"
        );
        // Two gateways on one host listen on two ports.
        assert_ne!(
            client_id_for(Some("laptop"), 8080, 7),
            client_id_for(Some("laptop"), 9080, 8)
        );
        // Any free port: the process id tells them apart.
        assert_eq!(
            client_id_for(Some("laptop"), 0, 4242),
            "statestore-gateway-laptop-pid4242"
        );
        let unknown = client_id_for(Some(" "), 8080, 7);
        assert!(unknown.starts_with("statestore-gateway-"), "{unknown}");
        assert!(unknown.ends_with("-8080"), "{unknown}");
        assert_ne!(unknown, client_id_for(None, 8080, 7));
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
