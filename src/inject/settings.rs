//! What the sidecar is made of: the Helm chart's values, read the way the
//! chart reads them, so that `inject`, the webhook and the chart's named
//! templates agree.
//!
//! The defaults are the chart's own `values.yaml`, compiled in. A values
//! file (helm's `-f`), `--set PATH=VALUE` and pod annotations
//! `statestore-gateway/PATH: VALUE` override them, in that order.

use std::path::Path;

use clap::CommandFactory as _;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::config::{Cli, MAX_CLIENT_ID_BYTES};
use crate::settings as env;

/// The chart's defaults: one source for the chart and for `inject`.
const CHART_VALUES: &str = include_str!("../../helm/statestore-gateway/values.yaml");

/// Prefix of the annotations `inject` and the webhook read.
pub const ANNOTATION_PREFIX: &str = "statestore-gateway/";

/// The annotation that turns injection on (`enabled`) or off (`disabled`).
pub const INJECT_ANNOTATION: &str = "statestore-gateway/inject";

/// Top-level sections of the chart's values that the sidecar templates
/// read; a values file may hold others (the chart's whole `values.yaml`),
/// which are ignored.
const SIDECAR_SECTIONS: [&str; 8] = [
    "image",
    "gateway",
    "broker",
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
pub enum SettingsError {
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

/// The chart's sidecar values after every override, as a JSON tree.
#[derive(Debug, Clone, PartialEq)]
pub struct SidecarValues {
    tree: Map<String, Value>,
}

impl SidecarValues {
    /// The chart's defaults.
    pub fn chart_defaults() -> Self {
        let mut values = Self { tree: Map::new() };
        // The chart's values.yaml is part of the source; the unit tests
        // read it, so a broken one fails the build's tests, not a user.
        if let Err(error) = values.merge_yaml(CHART_VALUES, "the chart's values.yaml") {
            unreachable!("the compiled-in chart values do not parse: {error}");
        }
        values
    }

    /// The defaults, then each values file, then each `PATH=VALUE`.
    pub fn from_sources(
        files: &[impl AsRef<Path>],
        sets: &[String],
    ) -> Result<Self, SettingsError> {
        let mut values = Self::chart_defaults();
        for file in files {
            let path = file.as_ref();
            let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
                path: path.display().to_string(),
                source,
            })?;
            values.merge_yaml(&text, &path.display().to_string())?;
        }
        for set in sets {
            let (path, value) = set.split_once('=').ok_or_else(|| SettingsError::Setting {
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
    pub fn merge_yaml(&mut self, text: &str, origin: &str) -> Result<(), SettingsError> {
        let not_values = |message: String| SettingsError::NotValues {
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
    pub fn set(
        &mut self,
        origin: &'static str,
        path: &str,
        text: &str,
    ) -> Result<(), SettingsError> {
        let error = |message: String| SettingsError::Setting {
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
    pub fn with_annotations(
        &self,
        annotations: &Map<String, Value>,
    ) -> Result<Self, SettingsError> {
        let mut values = self.clone();
        for (key, value) in annotations {
            let Some(path) = key.strip_prefix(ANNOTATION_PREFIX) else {
                continue;
            };
            if key == INJECT_ANNOTATION {
                continue;
            }
            let text = value.as_str().ok_or_else(|| SettingsError::Setting {
                origin: "annotation",
                path: key.clone(),
                message: "annotation values are strings".into(),
            })?;
            values
                .set("annotation", path, text)
                .map_err(|error| match error {
                    SettingsError::Setting { message, .. } => SettingsError::Setting {
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
    pub fn sidecar(&self) -> Result<Sidecar, SettingsError> {
        let sidecar: Sidecar = serde_json::from_value(Value::Object(self.tree.clone()))
            .map_err(|error| SettingsError::Unusable(format!("the sidecar values: {error}")))?;
        sidecar.check()?;
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
    pub header_read_timeout: String,
    pub max_connections: u64,
    pub cors_allow_origin: String,
    pub shutdown_grace_seconds: u64,
    pub log_format: String,
    pub log_level: String,
    pub api_token: SecretKey,
    pub extra_env: Vec<Value>,
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

impl Sidecar {
    /// The chart's `fail` checks, then the gateway's own command-line
    /// parser on the environment the container will get, so that a value
    /// `serve` refuses at start is refused here instead.
    fn check(&self) -> Result<(), SettingsError> {
        if self.broker.sat.enabled && !self.broker.password_secret.name.is_empty() {
            return Err(SettingsError::Unusable(
                "broker.sat.enabled and broker.passwordSecret.name: the gateway authenticates \
                 with one of a service account token or a password; turn one off"
                    .into(),
            ));
        }
        if self.gateway.port == self.gateway.admin_port {
            return Err(SettingsError::Unusable(format!(
                "gateway.port and gateway.adminPort are both {}: the key API and the admin \
                 listener need a port each",
                self.gateway.port
            )));
        }
        if self.broker.client_id.len() > MAX_CLIENT_ID_BYTES {
            return Err(SettingsError::Unusable(format!(
                "broker.clientId: {} bytes; at most {MAX_CLIENT_ID_BYTES}",
                self.broker.client_id.len()
            )));
        }
        self.check_with_serve_parser()
    }

    fn check_with_serve_parser(&self) -> Result<(), SettingsError> {
        let serve = Cli::command()
            .find_subcommand("serve")
            .cloned()
            .ok_or_else(|| SettingsError::Unusable("no serve subcommand".into()))?;
        let env = container_env(self);
        let mut argv = vec!["serve".to_owned()];
        // Kubernetes lets a later variable of the same name win.
        let mut seen = std::collections::HashSet::new();
        for entry in env.iter().rev() {
            let (Some(name), Some(value)) = (
                entry.get("name").and_then(Value::as_str),
                entry.get("value").and_then(Value::as_str),
            ) else {
                continue;
            };
            if !seen.insert(name.to_owned()) {
                continue;
            }
            let flag = serve
                .get_arguments()
                .find(|arg| arg.get_env().is_some_and(|env| env.to_str() == Some(name)));
            // Files are not there yet: only values that parse are checked.
            if let Some(long) = flag.and_then(|arg| arg.get_long())
                && !long.ends_with("-file")
            {
                argv.push(format!("--{long}={value}"));
            }
        }
        // Only the values given here: not the environment of this process.
        let serve = serve.mut_args(|arg| arg.env(None::<&str>));
        serve.try_get_matches_from(argv).map(drop).map_err(|error| {
            let text = error.to_string();
            let first = text.lines().next().unwrap_or_default();
            SettingsError::Unusable(format!(
                "statestore-gateway serve would refuse these values: {}",
                first.trim_start_matches("error: ")
            ))
        })
    }
}

/// Where the gateway's secrets and tokens are mounted.
pub const SECRETS_DIR: &str = "/var/run/secrets/statestore-gateway";

fn var(name: &str, value: impl Into<String>) -> Value {
    json!({"name": name, "value": value.into()})
}

/// The container's environment, in the template's order.
pub fn container_env(sidecar: &Sidecar) -> Vec<Value> {
    let g = &sidecar.gateway;
    let b = &sidecar.broker;
    let mut vars = vec![
        var(env::ENV_LISTEN, format!("127.0.0.1:{}", g.port)),
        var(env::ENV_ADMIN_LISTEN, format!("0.0.0.0:{}", g.admin_port)),
        var(env::ENV_POOL_SIZE, g.pool_size.to_string()),
        var(env::ENV_REQUEST_TIMEOUT, &g.request_timeout),
        var(env::ENV_MAX_IN_FLIGHT, g.max_in_flight.to_string()),
        var(env::ENV_MAX_KEY_BYTES, g.max_key_bytes.to_string()),
    ];
    if g.max_value_bytes > 0 {
        vars.push(var(env::ENV_MAX_VALUE_BYTES, g.max_value_bytes.to_string()));
    }
    vars.extend([
        var(env::ENV_MAX_WATCHERS, g.max_watchers.to_string()),
        var(
            env::ENV_MAX_KEYS_PER_WATCH,
            g.max_keys_per_watch.to_string(),
        ),
        var(env::ENV_MAX_WATCHED_KEYS, g.max_watched_keys.to_string()),
        var(env::ENV_WATCH_KEEPALIVE, &g.watch_keepalive),
        var(env::ENV_WATCH_BUFFER, g.watch_buffer.to_string()),
        var(env::ENV_WATCH_RESYNC_INTERVAL, &g.watch_resync_interval),
        var(env::ENV_WATCH_RESCAN_INTERVAL, &g.watch_rescan_interval),
        var(
            env::ENV_MAX_KEYS_PER_PATTERN,
            g.max_keys_per_pattern.to_string(),
        ),
        var(env::ENV_HEADER_READ_TIMEOUT, &g.header_read_timeout),
        var(env::ENV_MAX_CONNECTIONS, g.max_connections.to_string()),
    ]);
    if !g.cors_allow_origin.is_empty() {
        vars.push(var(env::ENV_CORS_ALLOW_ORIGIN, &g.cors_allow_origin));
    }
    vars.extend([
        var(
            env::ENV_SHUTDOWN_GRACE,
            format!("{}s", g.shutdown_grace_seconds),
        ),
        var(env::ENV_LOG_FORMAT, &g.log_format),
        var("RUST_LOG", &g.log_level),
    ]);
    if !g.api_token.name.is_empty() {
        vars.push(var(
            env::ENV_API_TOKEN_FILE,
            format!("{SECRETS_DIR}/api-token/token"),
        ));
    }
    vars.extend([
        var(env::ENV_BROKER_HOSTNAME, &b.host),
        var(env::ENV_BROKER_TCP_PORT, b.port.to_string()),
        var(
            env::ENV_MQTT_USE_TLS,
            sidecar.broker.tls.enabled.to_string(),
        ),
    ]);
    if sidecar.broker.tls.enabled {
        vars.push(var(
            env::ENV_TLS_CA_FILE,
            format!("{SECRETS_DIR}/ca/ca.crt"),
        ));
        if !b.tls.client_cert_secret.is_empty() {
            vars.push(var(
                env::ENV_TLS_CERT_FILE,
                format!("{SECRETS_DIR}/client-cert/tls.crt"),
            ));
            vars.push(var(
                env::ENV_TLS_KEY_FILE,
                format!("{SECRETS_DIR}/client-cert/tls.key"),
            ));
        }
    }
    if sidecar.broker.sat.enabled {
        vars.push(var(env::ENV_SAT_FILE, format!("{SECRETS_DIR}/sat/token")));
    }
    if !b.username.is_empty() {
        vars.push(var(env::ENV_MQTT_USERNAME, &b.username));
    }
    if !b.password_secret.name.is_empty() {
        vars.push(var(
            env::ENV_MQTT_PASSWORD_FILE,
            format!("{SECRETS_DIR}/mqtt-password/password"),
        ));
    }
    if !b.client_id.is_empty() {
        vars.push(var(env::ENV_MQTT_CLIENT_ID, &b.client_id));
    }
    vars.extend([
        var(env::ENV_MQTT_KEEP_ALIVE, b.keep_alive.to_string()),
        var(env::ENV_MQTT_SESSION_EXPIRY, b.session_expiry.to_string()),
    ]);
    vars.extend(g.extra_env.iter().cloned());
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(sets: &[&str]) -> Result<SidecarValues, SettingsError> {
        let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
        SidecarValues::from_sources(&[] as &[&Path], &sets)
    }

    #[test]
    fn the_chart_defaults_make_a_usable_sidecar() {
        let sidecar = SidecarValues::chart_defaults().sidecar().unwrap();
        assert_eq!(sidecar.gateway.port, 8080);
        assert!(sidecar.broker.sat.enabled);
    }

    /// The chart's defaults for the gateway's limits are `serve`'s own:
    /// a default changed in one place fails here until the other follows.
    #[test]
    fn the_charts_limits_are_the_binarys_defaults() {
        use crate::settings as env;
        let same = [
            env::ENV_POOL_SIZE,
            env::ENV_REQUEST_TIMEOUT,
            env::ENV_MAX_IN_FLIGHT,
            env::ENV_MAX_KEY_BYTES,
            env::ENV_MAX_WATCHERS,
            env::ENV_MAX_KEYS_PER_WATCH,
            env::ENV_MAX_WATCHED_KEYS,
            env::ENV_WATCH_KEEPALIVE,
            env::ENV_WATCH_BUFFER,
            env::ENV_WATCH_RESYNC_INTERVAL,
            env::ENV_WATCH_RESCAN_INTERVAL,
            env::ENV_MAX_KEYS_PER_PATTERN,
            env::ENV_HEADER_READ_TIMEOUT,
            env::ENV_MAX_CONNECTIONS,
            env::ENV_SHUTDOWN_GRACE,
            env::ENV_MQTT_KEEP_ALIVE,
            env::ENV_MQTT_SESSION_EXPIRY,
        ];
        let sidecar = SidecarValues::chart_defaults().sidecar().unwrap();
        let rendered = container_env(&sidecar);
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").unwrap();
        for name in same {
            let chart = rendered
                .iter()
                .find(|var| var["name"] == name)
                .and_then(|var| var["value"].as_str())
                .unwrap_or_else(|| panic!("the chart sets no {name}"));
            let arg = serve
                .get_arguments()
                .find(|arg| arg.get_env().and_then(|e| e.to_str()) == Some(name))
                .unwrap();
            let default = arg.get_default_values();
            assert_eq!(
                default.first().and_then(|d| d.to_str()),
                Some(chart),
                "{name}: serve's default differs from the chart's values.yaml"
            );
        }
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
