//! What the pool needs to know: how to reach and authenticate to the
//! broker, and its own sizing and timing. Defaults are the command line's
//! (see [`crate::settings`]).

use std::path::PathBuf;
use std::time::Duration;

use super::error::PoolStartError;
use crate::settings;

/// How to reach and authenticate to the broker (the AIO SDKs' settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerSettings {
    /// `AIO_BROKER_HOSTNAME`
    pub host: String,
    /// `AIO_BROKER_TCP_PORT`
    pub port: u16,
    /// `AIO_MQTT_USE_TLS`
    pub use_tls: bool,
    /// `AIO_TLS_CA_FILE`: PEM bundle; system roots when absent.
    pub ca_file: Option<PathBuf>,
    /// `AIO_TLS_CERT_FILE`: client certificate for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// `AIO_TLS_KEY_FILE`: its private key.
    pub key_file: Option<PathBuf>,
    /// `AIO_SAT_FILE`: service-account token sent as `K8S-SAT` enhanced auth,
    /// read anew at every connect.
    pub sat_file: Option<PathBuf>,
    /// `AIO_MQTT_USERNAME`
    pub username: Option<String>,
    /// `AIO_MQTT_PASSWORD_FILE`
    pub password_file: Option<PathBuf>,
    /// `AIO_MQTT_KEEP_ALIVE`
    pub keep_alive: Duration,
    /// `AIO_MQTT_SESSION_EXPIRY`
    pub session_expiry: Duration,
}

impl BrokerSettings {
    /// Plain TCP to `host:port` without credentials, with the default
    /// keep-alive and session expiry (see [`crate::settings`]); set the TLS
    /// and credential fields as needed.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
            use_tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            sat_file: None,
            username: None,
            password_file: None,
            keep_alive: Duration::from_secs(u64::from(settings::DEFAULT_MQTT_KEEP_ALIVE)),
            session_expiry: Duration::from_secs(u64::from(settings::DEFAULT_MQTT_SESSION_EXPIRY)),
        }
    }
}

/// The command line's defaults: `localhost:8883` over TLS.
impl Default for BrokerSettings {
    fn default() -> Self {
        Self {
            use_tls: settings::DEFAULT_MQTT_USE_TLS,
            ..Self::new(
                settings::DEFAULT_BROKER_HOSTNAME,
                settings::DEFAULT_BROKER_TCP_PORT,
            )
        }
    }
}

/// Pool sizing and timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSettings {
    /// The broker.
    pub broker: BrokerSettings,
    /// Members are `<client_id>-<i>`.
    pub client_id: String,
    /// Number of connections.
    pub size: usize,
    /// How long a request may wait for its reply; also its message expiry.
    pub request_timeout: Duration,
    /// Requests in flight per connection before new ones wait for a slot.
    pub max_in_flight_per_member: usize,
    /// How long a request waits for a slot before failing as overloaded.
    pub slot_wait: Duration,
    /// How often the SAT file is read to notice a rotated token (members
    /// then reconnect one at a time). Unused without a SAT file.
    pub sat_check_interval: Duration,
}

/// The command line's defaults, with the client id
/// `statestore-gateway-<hostname>`.
impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            broker: BrokerSettings::default(),
            client_id: settings::default_client_id(),
            size: settings::DEFAULT_POOL_SIZE,
            request_timeout: settings::DEFAULT_REQUEST_TIMEOUT,
            max_in_flight_per_member: settings::DEFAULT_MAX_IN_FLIGHT,
            slot_wait: settings::slot_wait(settings::DEFAULT_REQUEST_TIMEOUT),
            sat_check_interval: settings::DEFAULT_SAT_CHECK_INTERVAL,
        }
    }
}

impl PoolSettings {
    /// The defaults, for this broker and client id.
    pub fn new(broker: BrokerSettings, client_id: impl Into<String>) -> Self {
        Self {
            broker,
            client_id: client_id.into(),
            ..Self::default()
        }
    }

    pub(super) fn check(&self) -> Result<(), PoolStartError> {
        let fail = |setting, problem| Err(PoolStartError::Pool { setting, problem });
        if self.size == 0 {
            return fail("pool size", "must be at least 1");
        }
        if self.client_id.is_empty() || self.client_id.contains(['+', '#']) {
            return fail(
                "AIO_MQTT_CLIENT_ID",
                "must be non-empty and free of MQTT wildcards (+, #)",
            );
        }
        if self.request_timeout.is_zero() {
            return fail("request timeout", "must be greater than zero");
        }
        if self.max_in_flight_per_member == 0 {
            return fail("in-flight requests per member", "must be at least 1");
        }
        if self.broker.sat_file.is_some() && self.sat_check_interval.is_zero() {
            return fail("SAT check interval", "must be greater than zero");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pool_settings_name_the_setting() {
        let broker = BrokerSettings::new("localhost", 1883);
        let mut settings = PoolSettings::new(broker, "gw");
        settings.size = 0;
        assert!(
            settings
                .check()
                .unwrap_err()
                .to_string()
                .starts_with("pool size")
        );
        settings.size = 1;
        settings.client_id = "gw/#".into();
        assert!(
            settings
                .check()
                .unwrap_err()
                .to_string()
                .starts_with("AIO_MQTT_CLIENT_ID")
        );
    }
}
