//! What the sidecar is made of: the Helm chart's values, read the way the
//! chart reads them, so that `inject`, the webhook and the chart's named
//! templates agree.
//!
//! The defaults are the chart's own `values.yaml`, compiled in. A values
//! file (helm's `-f`), `--set PATH=VALUE` and pod annotations
//! `statestore-gateway/PATH: VALUE` override them, in that order.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::settings::{self as env, Helm, Setting, SettingError};

/// The chart's defaults: one source for the chart and for `inject`.
const CHART_VALUES: &str = include_str!("../../helm/statestore-gateway/values.yaml");

/// Prefix of the annotations `inject` and the webhook read.
pub const ANNOTATION_PREFIX: &str = "statestore-gateway/";

/// The annotation that turns injection on (`enabled`) or off (`disabled`).
pub const INJECT_ANNOTATION: &str = "statestore-gateway/inject";

/// Top-level sections of the chart's values that the sidecar templates
/// read; a values file may hold others (the chart's whole `values.yaml`),
/// which are ignored.
const SIDECAR_SECTIONS: [&str; 9] = [
    "image",
    "gateway",
    "broker",
    "tracing",
    "sidecar",
    "probes",
    "resources",
    "securityContext",
    "podSecurityContext",
];

/// Sections taken whole (Kubernetes objects): a values file replaces them
/// rather than merging key by key into the defaults' shape.
const OPAQUE_SECTIONS: [&str; 3] = ["resources", "securityContext", "podSecurityContext"];

/// A setting that cannot be used.
#[derive(Debug, Error)]
pub enum ValuesError {
    /// A values file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A values file is not YAML, or not a mapping.
    #[error("{origin} is not a YAML mapping of chart values: {message}")]
    NotValues {
        /// Where the values came from.
        origin: String,
        /// The parser's message.
        message: String,
    },
    /// `PATH=VALUE` (flag) or `statestore-gateway/PATH` (annotation) names
    /// no setting of the sidecar, or gives it a value of the wrong type.
    #[error("{origin} {path}: {message}")]
    Setting {
        /// `--set` or the annotation.
        origin: &'static str,
        /// The value path (`gateway.port`).
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The combination of settings would not start or not work.
    #[error("{0}")]
    Unusable(String),
}

/// At the command line, a values error is a bad setting like any other.
impl From<ValuesError> for SettingError {
    fn from(error: ValuesError) -> Self {
        SettingError::flag("chart values", error.to_string())
    }
}

/// The chart's sidecar values after every override, as a JSON tree.
#[derive(Debug, Clone)]
pub struct SidecarValues {
    tree: Map<String, Value>,
    serve_check: Option<ServeCheck>,
}

/// What `statestore-gateway serve` says about a container's environment
/// (`NAME`, `VALUE` pairs; a later one of the same name wins, as in
/// Kubernetes): `Err` with its message when it would refuse to start. The
/// command line provides it, so values are refused here rather than by a
/// crash-looping sidecar.
pub type ServeCheck = fn(&[(String, String)]) -> Result<(), String>;

impl SidecarValues {
    /// The chart's defaults.
    pub fn chart_defaults() -> Self {
        let mut values = Self {
            tree: Map::new(),
            serve_check: None,
        };
        // The chart's values.yaml is part of the source; the unit tests
        // read it, so a broken one fails the build's tests, not a user.
        if let Err(error) = values.merge_yaml(CHART_VALUES, "the chart's values.yaml") {
            unreachable!("the compiled-in chart values do not parse: {error}");
        }
        values
    }

    /// These values, checked by `serve_check` too when made into a sidecar.
    pub fn checked_by(mut self, serve_check: ServeCheck) -> Self {
        self.serve_check = Some(serve_check);
        self
    }

    /// The defaults, then each values file, then each `PATH=VALUE`.
    pub fn from_sources(files: &[impl AsRef<Path>], sets: &[String]) -> Result<Self, ValuesError> {
        let mut values = Self::chart_defaults();
        for file in files {
            let path = file.as_ref();
            let text = std::fs::read_to_string(path).map_err(|source| ValuesError::Read {
                path: path.display().to_string(),
                source,
            })?;
            values.merge_yaml(&text, &path.display().to_string())?;
        }
        for set in sets {
            let (path, value) = set.split_once('=').ok_or_else(|| ValuesError::Setting {
                origin: "--set",
                path: set.clone(),
                message: "expected PATH=VALUE (gateway.port=9080)".into(),
            })?;
            values.set("--set", path.trim(), value)?;
        }
        Ok(values)
    }

    /// Merges a values document over these values as helm does: mappings
    /// key by key, `null` deletes, anything else replaces. Keys unknown to
    /// the chart are refused (helm's schema refuses them too).
    pub fn merge_yaml(&mut self, text: &str, origin: &str) -> Result<(), ValuesError> {
        let not_values = |message: String| ValuesError::NotValues {
            origin: origin.to_owned(),
            message,
        };
        let parsed: Value = serde_saphyr::from_str(text).map_err(|e| not_values(e.to_string()))?;
        let parsed = match parsed {
            Value::Null => return Ok(()),
            Value::Object(map) => map,
            _ => return Err(not_values("the document is not a mapping".into())),
        };
        for (section, value) in parsed {
            if !SIDECAR_SECTIONS.contains(&section.as_str()) {
                continue;
            }
            match (self.tree.get_mut(&section), value) {
                (_, Value::Null) => {
                    self.tree.remove(&section);
                }
                (Some(current), value)
                    if !OPAQUE_SECTIONS.contains(&section.as_str()) && current.is_object() =>
                {
                    merge(current, value, &section).map_err(not_values)?;
                }
                (_, value) => {
                    self.tree.insert(section, value);
                }
            }
        }
        Ok(())
    }

    /// Sets one scalar (`gateway.port`, `broker.tls.enabled`,
    /// `resources.limits.memory`) from its text, typed like the default it
    /// replaces: `true`/`false` for booleans, whole numbers for numbers.
    pub fn set(&mut self, origin: &'static str, path: &str, text: &str) -> Result<(), ValuesError> {
        let error = |message: String| ValuesError::Setting {
            origin,
            path: path.to_owned(),
            message,
        };
        let mut parts = path.split('.');
        let first = parts.next().unwrap_or_default();
        if !SIDECAR_SECTIONS.contains(&first) {
            return Err(error(format!(
                "not a sidecar setting (settable: {}.*)",
                SIDECAR_SECTIONS.join(".*, ")
            )));
        }
        let mut slot = self
            .tree
            .get_mut(first)
            .ok_or_else(|| error("no such setting".into()))?;
        for part in parts {
            slot = match slot {
                Value::Object(map) => {
                    // Kubernetes objects (resources) may gain keys the
                    // defaults leave out (limits.cpu).
                    if !map.contains_key(part) && OPAQUE_SECTIONS.contains(&first) {
                        map.insert(part.to_owned(), Value::String(String::new()));
                    }
                    map.get_mut(part)
                        .ok_or_else(|| error("no such setting".into()))?
                }
                _ => return Err(error("no such setting".into())),
            };
        }
        *slot = match slot {
            Value::Bool(_) => Value::Bool(match text.trim() {
                "true" => true,
                "false" => false,
                other => return Err(error(format!("{other:?} is not true or false"))),
            }),
            Value::Number(_) => Value::Number(
                text.trim()
                    .parse::<i64>()
                    .map_err(|_| error(format!("{text:?} is not a whole number")))?
                    .into(),
            ),
            Value::String(_) => Value::String(text.to_owned()),
            _ => return Err(error("a list or mapping; set one of its keys".into())),
        };
        Ok(())
    }

    /// These values with a pod's `statestore-gateway/PATH` annotations
    /// applied (the `inject` annotation aside).
    pub fn with_annotations(&self, annotations: &Map<String, Value>) -> Result<Self, ValuesError> {
        let mut values = self.clone();
        for (key, value) in annotations {
            let Some(path) = key.strip_prefix(ANNOTATION_PREFIX) else {
                continue;
            };
            if key == INJECT_ANNOTATION {
                continue;
            }
            let text = value.as_str().ok_or_else(|| ValuesError::Setting {
                origin: "annotation",
                path: key.clone(),
                message: "annotation values are strings".into(),
            })?;
            values
                .set("annotation", path, text)
                .map_err(|error| match error {
                    ValuesError::Setting { message, .. } => ValuesError::Setting {
                        origin: "annotation",
                        path: key.clone(),
                        message,
                    },
                    other => other,
                })?;
        }
        Ok(values)
    }

    /// The typed sidecar, after the checks the chart makes with `fail` and
    /// the ones `statestore-gateway serve` makes at start.
    pub fn sidecar(&self) -> Result<Sidecar, ValuesError> {
        let mut sidecar: Sidecar = serde_json::from_value(Value::Object(self.tree.clone()))
            .map_err(|error| ValuesError::Unusable(format!("the sidecar values: {error}")))?;
        sidecar.tree = self.tree.clone();
        sidecar.check(self.serve_check)?;
        Ok(sidecar)
    }

    /// The values as a JSON tree (for the webhook's config and tests).
    pub fn tree(&self) -> &Map<String, Value> {
        &self.tree
    }
}

/// Helm's merge of `value` over `current` (see [`SidecarValues::merge_yaml`]).
fn merge(current: &mut Value, value: Value, path: &str) -> Result<(), String> {
    match (current, value) {
        (Value::Object(current), Value::Object(value)) => {
            for (key, value) in value {
                let here = format!("{path}.{key}");
                match current.get_mut(&key) {
                    None => return Err(format!("{here} is not a chart value")),
                    Some(_) if value.is_null() => {
                        current.remove(&key);
                    }
                    Some(slot) => merge(slot, value, &here)?,
                }
            }
            Ok(())
        }
        (current, value) => {
            *current = value;
            Ok(())
        }
    }
}

/// The sidecar's values, typed (the chart's names, camelCase).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sidecar {
    /// `image.*`
    pub image: Image,
    /// `gateway.*`
    pub gateway: Gateway,
    /// `broker.*`
    pub broker: Broker,
    /// `tracing.*`
    pub tracing: Tracing,
    /// `sidecar.*`
    pub sidecar: Placement,
    /// `probes.*`
    pub probes: Probes,
    /// `resources` (a Kubernetes ResourceRequirements).
    pub resources: Value,
    /// `securityContext` of the container.
    pub security_context: Value,
    /// `podSecurityContext`: its `fsGroup` is given to pods without one.
    pub pod_security_context: Value,
    /// The values these were read from, for the settings table's rows.
    #[serde(skip)]
    tree: Map<String, Value>,
}

/// `image.*`
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Image {
    /// Repository.
    pub repository: String,
    /// Tag.
    pub tag: String,
    /// Digest; wins over the tag.
    pub digest: String,
    /// imagePullPolicy.
    pub pull_policy: String,
}

/// `gateway.*`
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Gateway {
    pub port: u16,
    pub admin_port: u16,
    pub pool_size: u64,
    pub request_timeout: String,
    pub max_in_flight: u64,
    pub max_key_bytes: u64,
    pub max_value_bytes: u64,
    pub max_watchers: u64,
    pub max_keys_per_watch: u64,
    pub max_watched_keys: u64,
    pub watch_keepalive: String,
    pub watch_buffer: u64,
    pub watch_resync_interval: String,
    pub watch_rescan_interval: String,
    pub max_keys_per_pattern: u64,
    pub max_watch_patterns: u64,
    pub header_read_timeout: String,
    pub max_connections: u64,
    pub max_batch_ops: u64,
    pub max_batch_bytes: u64,
    pub dapr_state_store: String,
    pub dapr_lock_store: String,
    pub dapr_pubsub: String,
    pub dapr_app_id: String,
    pub dapr_key_prefix: String,
    pub dapr_lock_key_prefix: String,
    pub dapr_configuration_store: String,
    pub dapr_configuration_key_prefix: String,
    pub dapr_max_body_size: u64,
    pub dapr_app_port: u64,
    pub dapr_app_protocol: String,
    pub cors_allow_origin: String,
    pub shutdown_grace_seconds: u64,
    pub log_format: String,
    pub log_level: String,
    pub api_token: SecretKey,
    pub jwt: Jwt,
    pub extra_env: Vec<Value>,
}

/// `gateway.jwt.*`
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Jwt {
    pub issuer: String,
    pub audience: String,
    pub jwks_config_map: String,
    pub jwks_key: String,
    pub jwks_url: String,
    pub jwks_ca_config_map: String,
    pub jwks_service_account_token: bool,
}

/// A key of a Secret (`name` may be spelled `secretName`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKey {
    /// The Secret; empty means none.
    #[serde(alias = "secretName")]
    pub name: String,
    /// The key in it.
    pub key: String,
}

/// `broker.*`
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Broker {
    pub host: String,
    pub port: u16,
    pub tls: Tls,
    pub sat: Sat,
    pub username: String,
    pub password_secret: SecretKey,
    pub client_id: String,
    pub keep_alive: u64,
    pub session_expiry: u64,
}

/// `tracing.*`: span export (the `OTEL_*` variables).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tracing {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; empty: no export.
    pub otlp_endpoint: String,
    /// `OTEL_TRACES_SAMPLER`.
    pub sampler: String,
    /// `OTEL_TRACES_SAMPLER_ARG`; empty: left out.
    pub sampler_arg: String,
}

/// `broker.tls.*`
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Tls {
    pub enabled: bool,
    pub ca_config_map: String,
    pub ca_key: String,
    pub client_cert_secret: String,
}

/// `broker.sat.*`
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Sat {
    pub enabled: bool,
    pub audience: String,
    pub expiration_seconds: u64,
}

/// `sidecar.*`
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Placement {
    /// Native sidecar (an init container with restartPolicy Always).
    pub native: bool,
    /// `DAPR_HTTP_PORT` and `DAPR_GRPC_PORT` on the app's containers.
    pub dapr_ports: bool,
}

/// `probes.*`: the probe fields besides the fixed path and port.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Probes {
    pub startup: Map<String, Value>,
    pub liveness: Map<String, Value>,
    pub readiness: Map<String, Value>,
}

#[cfg(test)]
impl Sidecar {
    /// The chart's defaults with `--set` `sets` (`gateway.port=9080`).
    pub(crate) fn with_sets(sets: &[&str]) -> Self {
        let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
        let values = SidecarValues::from_sources(&[] as &[&str], &sets);
        values.and_then(|values| values.sidecar()).unwrap()
    }
}

impl Sidecar {
    /// The chart's `fail` checks, then the gateway's own command-line
    /// parser on the environment the container will get, so that a value
    /// `serve` refuses at start is refused here instead.
    fn check(&self, serve_check: Option<ServeCheck>) -> Result<(), ValuesError> {
        if self.broker.sat.enabled && !self.broker.password_secret.name.is_empty() {
            return Err(ValuesError::Unusable(
                "broker.sat.enabled and broker.passwordSecret.name: the gateway authenticates \
                 with one of a service account token or a password; turn one off"
                    .into(),
            ));
        }
        if self.gateway.port == self.gateway.admin_port {
            return Err(ValuesError::Unusable(format!(
                "gateway.port and gateway.adminPort are both {}: the key API and the admin \
                 listener need a port each",
                self.gateway.port
            )));
        }
        self.check_with_serve(serve_check)
    }

    /// What `serve` would say about the container's environment.
    fn check_with_serve(&self, serve_check: Option<ServeCheck>) -> Result<(), ValuesError> {
        let Some(serve_check) = serve_check else {
            return Ok(());
        };
        let vars: Vec<(String, String)> = container_env(self)
            .iter()
            .filter_map(|entry| {
                let name = entry.get("name").and_then(Value::as_str)?;
                let value = entry.get("value").and_then(Value::as_str)?;
                Some((name.to_owned(), value.to_owned()))
            })
            .collect();
        serve_check(&vars).map_err(|why| {
            ValuesError::Unusable(format!(
                "statestore-gateway serve would refuse these values: {why}"
            ))
        })
    }
}

/// One variable of the sidecar's container.
enum Var {
    /// The row's chart value, as it is; for `Helm::IfSet`, only when set.
    Chart(&'static Setting),
    /// A value the chart works out from the row's chart value.
    Derived(&'static Setting, fn(&Sidecar) -> String),
    /// The path of the row's file, when the sidecar has its volume
    /// ([`secrets`]).
    File(&'static Setting),
    /// A variable that is no setting of the gateway's (`RUST_LOG`), and
    /// the chart value it gets as it is.
    Other(&'static str, &'static str),
    /// The row's chart value, when set, made one per pod: the pod's name
    /// appended (from the downward API, in [`POD_NAME_VAR`], which
    /// Kubernetes expands in the value). Every pod that gets the sidecar
    /// would otherwise share the value: the pods of a Deployment, and an
    /// old and a new pod during a rollout, whose gateways would take each
    /// other's broker sessions over and over.
    PerPod(&'static Setting),
}

/// The variable holding the pod's name, for [`Var::PerPod`] values.
pub const POD_NAME_VAR: &str = "STATESTORE_GATEWAY_POD_NAME";

/// The container's variables, in the order of the chart's template (its
/// `extraEnv` follows). Serve's settings that are missing here are the
/// standalone gateway's (`--api-tls-*`, `--authz-file`) or not the chart's
/// (`Helm::None`).
const CONTAINER_ENV: &[Var] = &[
    Var::Derived(&env::LISTEN, |s| format!("127.0.0.1:{}", s.gateway.port)),
    Var::Derived(&env::ADMIN_LISTEN, |s| {
        format!("0.0.0.0:{}", s.gateway.admin_port)
    }),
    Var::Chart(&env::POOL_SIZE),
    Var::Chart(&env::REQUEST_TIMEOUT),
    Var::Chart(&env::MAX_IN_FLIGHT),
    Var::Chart(&env::MAX_KEY_BYTES),
    Var::Chart(&env::MAX_VALUE_BYTES),
    Var::Chart(&env::MAX_WATCHERS),
    Var::Chart(&env::MAX_KEYS_PER_WATCH),
    Var::Chart(&env::MAX_WATCHED_KEYS),
    Var::Chart(&env::WATCH_KEEPALIVE),
    Var::Chart(&env::WATCH_BUFFER),
    Var::Chart(&env::WATCH_RESYNC_INTERVAL),
    Var::Chart(&env::WATCH_RESCAN_INTERVAL),
    Var::Chart(&env::MAX_KEYS_PER_PATTERN),
    Var::Chart(&env::MAX_WATCH_PATTERNS),
    Var::Chart(&env::HEADER_READ_TIMEOUT),
    Var::Chart(&env::MAX_CONNECTIONS),
    Var::Chart(&env::MAX_BATCH_OPS),
    Var::Chart(&env::MAX_BATCH_BYTES),
    Var::Chart(&env::DAPR_STATE_STORE),
    Var::Chart(&env::DAPR_LOCK_STORE),
    Var::Chart(&env::DAPR_PUBSUB),
    Var::Chart(&env::DAPR_APP_ID),
    Var::Chart(&env::DAPR_KEY_PREFIX),
    Var::Chart(&env::DAPR_LOCK_KEY_PREFIX),
    Var::Chart(&env::DAPR_CONFIGURATION_STORE),
    Var::Chart(&env::DAPR_CONFIGURATION_KEY_PREFIX),
    Var::Chart(&env::DAPR_MAX_BODY_SIZE),
    Var::Chart(&env::DAPR_APP_PORT),
    Var::Chart(&env::DAPR_APP_PROTOCOL),
    Var::Chart(&env::CORS_ALLOW_ORIGIN),
    Var::Derived(&env::SHUTDOWN_GRACE, |s| {
        format!("{}s", s.gateway.shutdown_grace_seconds)
    }),
    Var::Chart(&env::LOG_FORMAT),
    Var::Other("RUST_LOG", "gateway.logLevel"),
    Var::File(&env::API_TOKEN_FILE),
    Var::File(&env::JWT_JWKS_FILE),
    Var::Chart(&env::JWT_JWKS_URL),
    Var::File(&env::JWT_JWKS_CA_FILE),
    Var::File(&env::JWT_JWKS_TOKEN_FILE),
    Var::Chart(&env::JWT_ISSUER),
    Var::Chart(&env::JWT_AUDIENCE),
    Var::Chart(&env::BROKER_HOSTNAME),
    Var::Chart(&env::BROKER_TCP_PORT),
    Var::Chart(&env::MQTT_USE_TLS),
    Var::File(&env::TLS_CA_FILE),
    Var::File(&env::TLS_CERT_FILE),
    Var::File(&env::TLS_KEY_FILE),
    Var::File(&env::SAT_FILE),
    Var::Chart(&env::MQTT_USERNAME),
    Var::File(&env::MQTT_PASSWORD_FILE),
    Var::PerPod(&env::MQTT_CLIENT_ID),
    Var::Chart(&env::MQTT_KEEP_ALIVE),
    Var::Chart(&env::MQTT_SESSION_EXPIRY),
    Var::Chart(&env::OTEL_EXPORTER_OTLP_ENDPOINT),
    Var::Chart(&env::OTEL_TRACES_SAMPLER),
    Var::Chart(&env::OTEL_TRACES_SAMPLER_ARG),
];

/// The chart value at `path`, when it is a scalar.
fn chart_value<'a>(tree: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let first = tree.get(parts.next()?)?;
    parts
        .try_fold(first, |node, key| node.get(key))
        .filter(|value| matches!(value, Value::String(_) | Value::Number(_) | Value::Bool(_)))
}

/// A scalar as a variable's text.
fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Whether a `Helm::IfSet` value is unset: empty, or 0.
fn is_unset(value: &Value) -> bool {
    value.as_str().is_some_and(str::is_empty) || value.as_u64() == Some(0)
}

impl Var {
    /// The container's entries for this variable: none, its own, or (for
    /// [`Var::PerPod`]) the pod's name and then its own.
    fn entries(&self, sidecar: &Sidecar) -> Vec<Value> {
        let Var::PerPod(row) = self else {
            return self
                .resolve(sidecar)
                .map(|(name, value)| json!({"name": name, "value": value}))
                .into_iter()
                .collect();
        };
        let value = row
            .helm
            .path()
            .and_then(|path| chart_value(&sidecar.tree, path))
            .filter(|value| !is_unset(value));
        let Some(value) = value else {
            return Vec::new();
        };
        // `$$` is a literal `$` where Kubernetes expands `$(NAME)`.
        let prefix = text(value).replace('$', "$$");
        vec![
            json!({
                "name": POD_NAME_VAR,
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
            }),
            json!({"name": row.env, "value": format!("{prefix}-$({POD_NAME_VAR})")}),
        ]
    }

    /// The variable's name and value, or `None` when the container has
    /// no such variable.
    fn resolve(&self, sidecar: &Sidecar) -> Option<(&'static str, String)> {
        match self {
            Var::Chart(row) => {
                let value = chart_value(&sidecar.tree, row.helm.path()?)?;
                match row.helm {
                    Helm::IfSet(_) if is_unset(value) => None,
                    Helm::Default(_) | Helm::Own(_) | Helm::IfSet(_) => {
                        Some((row.env, text(value)))
                    }
                    Helm::Derived(_) | Helm::None => None,
                }
            }
            Var::Derived(row, value) => Some((row.env, value(sidecar))),
            Var::File(row) => secrets::path(row, sidecar).map(|path| (row.env, path)),
            Var::Other(name, path) => Some((name, text(chart_value(&sidecar.tree, path)?))),
            Var::PerPod(_) => None,
        }
    }
}

/// The container's environment, in the template's order.
pub fn container_env(sidecar: &Sidecar) -> Vec<Value> {
    CONTAINER_ENV
        .iter()
        .flat_map(|var| var.entries(sidecar))
        .chain(sidecar.gateway.extra_env.iter().cloned())
        .collect()
}

// Inside this file: the table and the sidecar values read each other.
pub mod secrets {
    //! The files the sidecar reads from volumes (tokens, CA bundles, keys), in
    //! one table: each row's condition decides at once whether the pod gets
    //! the volume, the container its mount, and the settings their paths.

    use serde_json::{Map, Value, json};

    use crate::inject::values::Sidecar;
    use crate::settings::{self as env, Setting};

    /// Where the gateway's secrets and tokens are mounted.
    pub const SECRETS_DIR: &str = "/var/run/secrets/statestore-gateway";

    /// One volume of the sidecar and the files the gateway reads from it.
    #[derive(Debug)]
    pub struct SecretVolume {
        /// The volume's name, which its mount uses too.
        pub volume: &'static str,
        /// The directory under [`SECRETS_DIR`] it is mounted at.
        pub dir: &'static str,
        /// Each file in it, and the setting given its path.
        pub files: &'static [(&'static str, &'static Setting)],
        /// Whether the sidecar has it.
        pub mounted: fn(&Sidecar) -> bool,
        /// The volume's source (`configMap`, `secret`, `projected`); the
        /// second argument is the first of `files`.
        pub source: fn(&Sidecar, &str) -> Value,
    }

    /// Every volume the sidecar may have, in the order of the chart's
    /// `statestore-gateway.sidecar.volumes` and of the container's mounts.
    pub const SECRET_VOLUMES: &[SecretVolume] = &[
        SecretVolume {
            volume: "statestore-gateway-sat",
            dir: "sat",
            files: &[("token", &env::SAT_FILE)],
            mounted: |s| s.broker.sat.enabled,
            source: |s, file| {
                let sat = &s.broker.sat;
                service_account_token(Some(&sat.audience), sat.expiration_seconds, file)
            },
        },
        SecretVolume {
            volume: "statestore-gateway-ca",
            dir: "ca",
            files: &[("ca.crt", &env::TLS_CA_FILE)],
            mounted: |s| s.broker.tls.enabled,
            source: |s, file| config_map(&s.broker.tls.ca_config_map, &s.broker.tls.ca_key, file),
        },
        SecretVolume {
            volume: "statestore-gateway-client-cert",
            dir: "client-cert",
            files: &[
                ("tls.crt", &env::TLS_CERT_FILE),
                ("tls.key", &env::TLS_KEY_FILE),
            ],
            mounted: |s| s.broker.tls.enabled && !s.broker.tls.client_cert_secret.is_empty(),
            source: |s, _| json!({"secret": {"secretName": s.broker.tls.client_cert_secret}}),
        },
        SecretVolume {
            volume: "statestore-gateway-mqtt-password",
            dir: "mqtt-password",
            files: &[("password", &env::MQTT_PASSWORD_FILE)],
            mounted: |s| !s.broker.password_secret.name.is_empty(),
            source: |s, file| {
                secret(
                    &s.broker.password_secret.name,
                    &s.broker.password_secret.key,
                    file,
                )
            },
        },
        SecretVolume {
            volume: "statestore-gateway-api-token",
            dir: "api-token",
            files: &[("token", &env::API_TOKEN_FILE)],
            mounted: |s| !s.gateway.api_token.name.is_empty(),
            source: |s, file| secret(&s.gateway.api_token.name, &s.gateway.api_token.key, file),
        },
        SecretVolume {
            volume: "statestore-gateway-jwks",
            dir: "jwks",
            files: &[("jwks.json", &env::JWT_JWKS_FILE)],
            mounted: |s| !s.gateway.jwt.jwks_config_map.is_empty(),
            source: |s, file| {
                config_map(
                    &s.gateway.jwt.jwks_config_map,
                    &s.gateway.jwt.jwks_key,
                    file,
                )
            },
        },
        // The CA bundle and the token are for fetching a JWKS URL: without
        // one the gateway has no use for them.
        SecretVolume {
            volume: "statestore-gateway-jwks-ca",
            dir: "jwks-ca",
            files: &[("ca.crt", &env::JWT_JWKS_CA_FILE)],
            mounted: |s| {
                let jwt = &s.gateway.jwt;
                !jwt.jwks_url.is_empty() && !jwt.jwks_ca_config_map.is_empty()
            },
            source: |s, file| config_map(&s.gateway.jwt.jwks_ca_config_map, "ca.crt", file),
        },
        SecretVolume {
            volume: "statestore-gateway-jwks-token",
            dir: "jwks-token",
            files: &[("token", &env::JWT_JWKS_TOKEN_FILE)],
            mounted: |s| {
                let jwt = &s.gateway.jwt;
                !jwt.jwks_url.is_empty() && jwt.jwks_service_account_token
            },
            source: |_, file| service_account_token(None, 3600, file),
        },
    ];

    fn config_map(name: &str, key: &str, file: &str) -> Value {
        json!({"configMap": {"name": name, "items": [{"key": key, "path": file}]}})
    }

    fn secret(name: &str, key: &str, file: &str) -> Value {
        json!({"secret": {"secretName": name, "items": [{"key": key, "path": file}]}})
    }

    fn service_account_token(audience: Option<&str>, expiration_seconds: u64, file: &str) -> Value {
        let mut token = Map::new();
        if let Some(audience) = audience {
            token.insert("audience".into(), audience.into());
        }
        token.insert("expirationSeconds".into(), expiration_seconds.into());
        token.insert("path".into(), file.into());
        json!({"projected": {"sources": [{"serviceAccountToken": token}]}})
    }

    /// Whether `name` is one of the sidecar's volumes.
    pub fn is_sidecar_volume(name: &str) -> bool {
        SECRET_VOLUMES.iter().any(|volume| volume.volume == name)
    }

    fn mounted(sidecar: &Sidecar) -> impl Iterator<Item = &'static SecretVolume> + '_ {
        SECRET_VOLUMES
            .iter()
            .filter(move |volume| (volume.mounted)(sidecar))
    }

    /// The container's `volumeMounts`.
    pub fn mounts(sidecar: &Sidecar) -> Vec<Value> {
        mounted(sidecar)
            .map(|volume| {
                json!({
                    "name": volume.volume,
                    "mountPath": format!("{SECRETS_DIR}/{}", volume.dir),
                    "readOnly": true,
                })
            })
            .collect()
    }

    /// The pod's `volumes` the sidecar adds.
    pub fn volumes(sidecar: &Sidecar) -> Vec<Value> {
        mounted(sidecar)
            .map(|volume| {
                let first = volume.files.first().map_or("", |(file, _)| *file);
                let mut item = Map::new();
                item.insert("name".into(), volume.volume.into());
                if let Value::Object(source) = (volume.source)(sidecar, first) {
                    item.extend(source);
                }
                Value::Object(item)
            })
            .collect()
    }

    /// The path `setting` is given: its file, when the sidecar has its volume.
    pub fn path(setting: &Setting, sidecar: &Sidecar) -> Option<String> {
        mounted(sidecar).find_map(|volume| {
            volume
                .files
                .iter()
                .find(|(_, row)| *row == setting)
                .map(|(file, _)| format!("{SECRETS_DIR}/{}/{file}", volume.dir))
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::inject::values::container_env;

        fn sidecar(sets: &[&str]) -> Sidecar {
            Sidecar::with_sets(sets)
        }

        /// For any values, a volume, its mount and its files' variables come
        /// and go together.
        #[test]
        fn each_volume_its_mount_and_its_variables_come_together() {
            for sets in [
                &[][..],
                &["broker.sat.enabled=false", "broker.tls.enabled=false"][..],
                &[
                    "broker.tls.clientCertSecret=cc",
                    "broker.sat.enabled=false",
                    "broker.passwordSecret.name=pw",
                    "gateway.apiToken.secretName=t",
                ][..],
                &[
                    "gateway.jwt.jwksConfigMap=keys",
                    "gateway.jwt.jwksCaConfigMap=ca",
                    "gateway.jwt.jwksServiceAccountToken=true",
                    "gateway.jwt.issuer=i",
                    "gateway.jwt.audience=a",
                ][..],
                &[
                    "gateway.jwt.jwksUrl=https://issuer/jwks",
                    "gateway.jwt.jwksCaConfigMap=ca",
                    "gateway.jwt.jwksServiceAccountToken=true",
                    "gateway.jwt.issuer=i",
                    "gateway.jwt.audience=a",
                ][..],
            ] {
                let sidecar = sidecar(sets);
                let names = |list: Vec<Value>| -> Vec<String> {
                    list.iter().map(|item| item["name"].to_string()).collect()
                };
                let volumes = names(volumes(&sidecar));
                assert_eq!(volumes, names(mounts(&sidecar)), "{sets:?}");
                let env = container_env(&sidecar);
                for volume in SECRET_VOLUMES {
                    let has = volumes.contains(&format!("{:?}", volume.volume));
                    for (file, row) in volume.files {
                        let var = env.iter().find(|var| var["name"] == row.env);
                        let want = format!("{SECRETS_DIR}/{}/{file}", volume.dir);
                        match var {
                            Some(var) => assert!(has && var["value"] == want, "{sets:?} {var}"),
                            None => assert!(!has, "{sets:?}: {} has no {}", volume.volume, row.env),
                        }
                    }
                }
            }
        }

        #[test]
        fn a_jwks_urls_ca_and_token_are_mounted_only_with_the_url() {
            let without = sidecar(&[
                "gateway.jwt.jwksConfigMap=keys",
                "gateway.jwt.jwksCaConfigMap=ca",
                "gateway.jwt.jwksServiceAccountToken=true",
                "gateway.jwt.issuer=i",
                "gateway.jwt.audience=a",
            ]);
            let names: Vec<Value> = volumes(&without)
                .iter()
                .map(|v| v["name"].clone())
                .collect();
            assert_eq!(
                names,
                [
                    "statestore-gateway-sat",
                    "statestore-gateway-ca",
                    "statestore-gateway-jwks"
                ]
            );
        }

        #[test]
        fn every_file_setting_is_a_row_of_the_settings_table_once() {
            let mut seen = Vec::new();
            for volume in SECRET_VOLUMES {
                assert!(volume.volume.ends_with(volume.dir), "{}", volume.volume);
                for (_, row) in volume.files {
                    assert!(crate::settings::SERVE.contains(row), "{}", row.env);
                    assert!(!seen.contains(&row.env), "{} twice", row.env);
                    seen.push(row.env);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(sets: &[&str]) -> Result<SidecarValues, ValuesError> {
        let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
        SidecarValues::from_sources(&[] as &[&Path], &sets)
            .map(|values| values.checked_by(crate::cli::serve::check_environment))
    }

    #[test]
    fn the_chart_defaults_make_a_usable_sidecar() {
        let sidecar = SidecarValues::chart_defaults().sidecar().unwrap();
        assert_eq!(sidecar.gateway.port, 8080);
        assert!(sidecar.broker.sat.enabled);
    }

    /// The container's environment, from the chart's defaults, gives
    /// every setting the chart takes as it is (`Helm::Default` in the
    /// settings table) the table's default; the others, their chart value.
    #[test]
    fn the_container_gets_each_chart_value_the_table_names() {
        use crate::settings::{self as table, Helm};
        let values = SidecarValues::chart_defaults();
        let sidecar = values.sidecar().unwrap();
        let rendered = container_env(&sidecar);
        let tree = Value::Object(values.tree().clone());
        for row in table::SERVE.iter().chain(table::SERVE_ENV) {
            let (Helm::Default(path) | Helm::Own(path) | Helm::IfSet(path)) = row.helm else {
                continue;
            };
            let chart = path
                .split('.')
                .try_fold(&tree, |node, key| node.get(key))
                .unwrap_or_else(|| panic!("no chart value {path}"));
            let chart = match chart {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let env = rendered
                .iter()
                .find(|var| var["name"] == row.env)
                .and_then(|var| var["value"].as_str());
            match env {
                Some(value) => assert_eq!(value, chart, "{}: not {path}", row.env),
                // The chart leaves empty (or 0: from the broker) values out.
                None => assert!(
                    matches!(row.helm, Helm::IfSet(_)) && (chart.is_empty() || chart == "0"),
                    "the container has no {} ({path} = {chart:?})",
                    row.env
                ),
            }
            if let Helm::Default(_) = row.helm {
                assert_eq!(
                    chart, row.default,
                    "{path}: the chart's default is not serve's"
                );
            }
        }
    }

    /// Every setting the chart gives the sidecar has its place in the
    /// container, taken from the row the way its `Helm` kind says.
    #[test]
    fn the_container_names_each_sidecar_row_of_the_table_once() {
        use crate::settings::{self as table, Helm};
        let standalone = [
            &table::API_TLS_CERT_FILE,
            &table::API_TLS_KEY_FILE,
            &table::AUTHZ_FILE,
        ];
        let named: Vec<&Setting> = CONTAINER_ENV
            .iter()
            .filter_map(|var| match var {
                Var::Chart(row) => {
                    assert!(
                        matches!(row.helm, Helm::Default(_) | Helm::Own(_) | Helm::IfSet(_)),
                        "{}: not a chart value as it is",
                        row.env
                    );
                    Some(*row)
                }
                Var::Derived(row, _) => {
                    assert!(matches!(row.helm, Helm::Derived(_)), "{}", row.env);
                    Some(*row)
                }
                Var::File(row) => {
                    assert!(
                        secrets::SECRET_VOLUMES
                            .iter()
                            .any(|volume| volume.files.iter().any(|(_, r)| r == row)),
                        "{}: no secret volume holds it",
                        row.env
                    );
                    Some(*row)
                }
                Var::PerPod(row) => {
                    assert!(matches!(row.helm, Helm::Derived(_)), "{}", row.env);
                    Some(*row)
                }
                Var::Other(..) => None,
            })
            .collect();
        for row in table::SERVE.iter().chain(table::SERVE_ENV) {
            let times = named.iter().filter(|named| **named == *row).count();
            let expected = usize::from(row.helm.path().is_some() && !standalone.contains(row));
            assert_eq!(times, expected, "{} in the container", row.env);
        }
    }

    /// Every pod that gets the sidecar would share a fixed client id, and
    /// their gateways would take each other's broker sessions: the pod's
    /// name makes it one per pod, stable across container restarts.
    #[test]
    fn a_fixed_client_id_is_made_one_per_pod() {
        let env = |sets: &[&str]| container_env(&values(sets).unwrap().sidecar().unwrap());
        let named = |env: &[Value], name: &str| {
            env.iter()
                .position(|var| var["name"] == name)
                .map(|at| (at, env[at].clone()))
        };
        let fixed = env(&["broker.clientId=orders"]);
        let (pod_at, pod) = named(&fixed, POD_NAME_VAR).unwrap();
        assert_eq!(
            pod["valueFrom"],
            json!({"fieldRef": {"fieldPath": "metadata.name"}})
        );
        let (id_at, id) = named(&fixed, "AIO_MQTT_CLIENT_ID").unwrap();
        assert_eq!(id["value"], "orders-$(STATESTORE_GATEWAY_POD_NAME)");
        // Kubernetes expands only names defined before.
        assert!(pod_at < id_at);
        // A `$` of the value's own stays one.
        let dollar = env(&["broker.clientId=a$b"]);
        let (_, id) = named(&dollar, "AIO_MQTT_CLIENT_ID").unwrap();
        assert_eq!(id["value"], "a$$b-$(STATESTORE_GATEWAY_POD_NAME)");
        // Unset: the gateway's own default, from the pod name and port.
        let default = env(&[]);
        assert!(named(&default, POD_NAME_VAR).is_none());
        assert!(named(&default, "AIO_MQTT_CLIENT_ID").is_none());
    }

    #[test]
    fn jwt_values_give_the_jwks_files_and_need_issuer_and_audience() {
        let sidecar = values(&[
            "gateway.jwt.jwksUrl=https://kubernetes.default.svc/openid/v1/jwks",
            "gateway.jwt.jwksCaConfigMap=kube-root-ca.crt",
            "gateway.jwt.jwksServiceAccountToken=true",
            "gateway.jwt.issuer=https://kubernetes.default.svc.cluster.local",
            "gateway.jwt.audience=statestore-gateway",
        ])
        .unwrap()
        .sidecar()
        .unwrap();
        let env = container_env(&sidecar);
        let value = |name: &str| {
            env.iter()
                .find(|var| var["name"] == name)
                .and_then(|var| var["value"].as_str())
                .map(str::to_owned)
        };
        assert_eq!(
            value("STATESTORE_GATEWAY_JWT_JWKS_CA_FILE").as_deref(),
            Some("/var/run/secrets/statestore-gateway/jwks-ca/ca.crt")
        );
        assert_eq!(
            value("STATESTORE_GATEWAY_JWT_JWKS_TOKEN_FILE").as_deref(),
            Some("/var/run/secrets/statestore-gateway/jwks-token/token")
        );
        assert_eq!(value("STATESTORE_GATEWAY_JWT_JWKS_FILE"), None);
        let volumes = crate::inject::values::secrets::volumes(&sidecar);
        let names: Vec<&str> = volumes.iter().filter_map(|v| v["name"].as_str()).collect();
        assert!(names.contains(&"statestore-gateway-jwks-ca"), "{names:?}");
        assert!(
            names.contains(&"statestore-gateway-jwks-token"),
            "{names:?}"
        );

        let error = values(&["gateway.jwt.jwksConfigMap=keys", "gateway.jwt.issuer=i"])
            .unwrap()
            .sidecar()
            .unwrap_err()
            .to_string();
        assert!(error.contains("--jwt-audience"), "{error}");
    }

    #[test]
    fn set_types_the_value_like_its_default() {
        let sidecar = values(&["gateway.port=9080", "sidecar.native=true", "image.tag=1.0"])
            .unwrap()
            .sidecar()
            .unwrap();
        assert_eq!(sidecar.gateway.port, 9080);
        assert!(sidecar.sidecar.native);
        assert_eq!(sidecar.image.tag, "1.0");
        for (bad, says) in [
            ("gateway.port=x", "not a whole number"),
            ("sidecar.native=yes", "not true or false"),
            ("gateway.nope=1", "no such setting"),
            ("standalone.enabled=true", "not a sidecar setting"),
            ("gateway=1", "set one of its keys"),
            ("gateway.port", "PATH=VALUE"),
        ] {
            let error = values(&[bad]).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn the_charts_refusals_are_refused_here_too() {
        for (sets, says) in [
            (&["broker.passwordSecret.name=pw"][..], "broker.sat.enabled"),
            (&["gateway.adminPort=8080"][..], "both 8080"),
            (&["broker.keepAlive=4"][..], "--keep-alive"),
            (&["gateway.poolSize=65"][..], "--pool-size"),
            (&["gateway.requestTimeout=0s"][..], "--request-timeout"),
            (&["gateway.maxConnections=0"][..], "--max-connections"),
            (
                &[
                    "tracing.otlpEndpoint=http://collector:4318",
                    "tracing.sampler=sometimes",
                ][..],
                "OTEL_TRACES_SAMPLER",
            ),
        ] {
            let error = values(sets).unwrap().sidecar().unwrap_err().to_string();
            assert!(error.contains(says), "{sets:?}: {error}");
        }
        let ok = values(&["broker.passwordSecret.name=pw", "broker.sat.enabled=false"]).unwrap();
        assert!(ok.sidecar().is_ok());
    }

    #[test]
    fn a_values_file_merges_like_helm_and_ignores_other_sections() {
        let mut values = SidecarValues::chart_defaults();
        values
            .merge_yaml(
                "standalone: {enabled: true}\ngateway: {port: 9080}\nresources: {limits: {memory: 1Gi}}\n",
                "test",
            )
            .unwrap();
        let sidecar = values.sidecar().unwrap();
        assert_eq!(sidecar.gateway.port, 9080);
        assert_eq!(sidecar.gateway.admin_port, 8081);
        assert_eq!(
            sidecar.resources,
            serde_json::json!({"limits": {"memory": "1Gi"}})
        );
        let error = values.merge_yaml("gateway: {prot: 1}", "test").unwrap_err();
        assert!(error.to_string().contains("gateway.prot"), "{error}");
        let error = values.merge_yaml("- a", "test").unwrap_err();
        assert!(error.to_string().contains("not a mapping"), "{error}");
    }

    #[test]
    fn annotations_override_settings() {
        let annotations = serde_json::json!({
            "statestore-gateway/inject": "enabled",
            "statestore-gateway/gateway.port": "9080",
            "other/thing": "x",
        });
        let values = SidecarValues::chart_defaults()
            .with_annotations(annotations.as_object().unwrap())
            .unwrap();
        assert_eq!(values.sidecar().unwrap().gateway.port, 9080);
        let bad = serde_json::json!({"statestore-gateway/gateway.port": "many"});
        let error = SidecarValues::chart_defaults()
            .with_annotations(bad.as_object().unwrap())
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("statestore-gateway/gateway.port"),
            "{error}"
        );
    }
}
