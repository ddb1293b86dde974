//! What the pool needs to know: how to reach and authenticate to the
//! broker, and its own sizing and timing. Defaults are the command line's
//! (see [`crate::settings`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::settings::{self, Setting, SettingError};

/// The shortest keep-alive: rumqttc panics on anything under 5 seconds
/// (`MqttOptions::set_keep_alive`). MQTT itself would take 0 (off) to
/// 65,535, its two-byte field, which is the upper bound.
pub const MIN_KEEP_ALIVE: Duration = Duration::from_secs(5);

/// The longest keep-alive MQTT's two-byte field carries.
pub const MAX_KEEP_ALIVE: Duration = Duration::from_secs(u16::MAX as u64);

/// The most pool members.
pub const MAX_POOL_SIZE: usize = 64;

/// The longest client id: members add `-<n>`, and the id is part of every
/// request's response topic, which MQTT caps at 65,535 bytes with the rest
/// of the topic; 1 KiB is far beyond any broker's practice.
pub const MAX_CLIENT_ID_BYTES: usize = 1024;

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

impl BrokerSettings {
    /// Every rule a broker setting must meet, checked once before the
    /// first connection (the files are opened, not parsed: each connection
    /// reads them anew, as they rotate).
    pub fn check(&self) -> Result<(), SettingError> {
        if self.host.trim().is_empty() {
            return Err(SettingError::new(
                &settings::BROKER_HOSTNAME,
                "must not be empty",
            ));
        }
        if self.port == 0 {
            return Err(SettingError::new(
                &settings::BROKER_TCP_PORT,
                "0 is not a broker port",
            ));
        }
        if !(MIN_KEEP_ALIVE..=MAX_KEEP_ALIVE).contains(&self.keep_alive) {
            return Err(SettingError::new(
                &settings::MQTT_KEEP_ALIVE,
                format!(
                    "{} seconds; must be between {} and {} seconds",
                    self.keep_alive.as_secs(),
                    MIN_KEEP_ALIVE.as_secs(),
                    MAX_KEEP_ALIVE.as_secs()
                ),
            ));
        }
        let files = [
            (&self.ca_file, &settings::TLS_CA_FILE),
            (&self.cert_file, &settings::TLS_CERT_FILE),
            (&self.key_file, &settings::TLS_KEY_FILE),
            (&self.sat_file, &settings::SAT_FILE),
            (&self.password_file, &settings::MQTT_PASSWORD_FILE),
        ];
        if !self.use_tls {
            for (path, setting) in &files[..3] {
                if path.is_some() {
                    return Err(SettingError::new(
                        setting,
                        format!("is set but {} is false", settings::MQTT_USE_TLS.env),
                    ));
                }
            }
        }
        for (path, setting) in files {
            if let Some(path) = path {
                std::fs::File::open(path).map_err(|error| {
                    SettingError::new(setting, format!("cannot read {}: {error}", path.display()))
                })?;
            }
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(SettingError::new(
                    &settings::TLS_KEY_FILE,
                    "a client certificate needs its private key",
                ));
            }
            (None, Some(_)) => {
                return Err(SettingError::new(
                    &settings::TLS_CERT_FILE,
                    "a private key needs its client certificate",
                ));
            }
            _ => {}
        }
        if self.sat_file.is_some() && self.password_file.is_some() {
            // The SDKs refuse two ways of authenticating at once too.
            return Err(SettingError::new(
                &settings::SAT_FILE,
                format!("cannot be set with {}", settings::MQTT_PASSWORD_FILE.env),
            ));
        }
        fits_mqtt(
            &settings::MQTT_USERNAME,
            self.username.as_ref().map_or(0, String::len),
        )
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
/// `statestore-gateway-<hostname>-<port>` (the default listen port).
impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            broker: BrokerSettings::default(),
            client_id: settings::default_client_id(settings::DEFAULT_LISTEN.port()),
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

    /// Every rule a pool setting must meet (the broker's included),
    /// checked once: by the command line, and by `Pool::start` for callers
    /// that build the settings in code.
    pub fn check(&self) -> Result<(), SettingError> {
        self.broker.check()?;
        if !(1..=MAX_POOL_SIZE).contains(&self.size) {
            return Err(SettingError::new(
                &settings::POOL_SIZE,
                format!("{}; must be between 1 and {MAX_POOL_SIZE}", self.size),
            ));
        }
        // It travels in every request's response topic and `__srcId`.
        let id = &self.client_id;
        let problem = if id.trim().is_empty() {
            Some("must not be empty".to_owned())
        } else if id.contains(['+', '#']) {
            Some("must be free of MQTT wildcards (+, #)".to_owned())
        } else if id.len() > MAX_CLIENT_ID_BYTES {
            Some(format!("{} bytes; at most {MAX_CLIENT_ID_BYTES}", id.len()))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(SettingError::new(&settings::MQTT_CLIENT_ID, problem));
        }
        if self.request_timeout.is_zero() {
            return Err(SettingError::new(
                &settings::REQUEST_TIMEOUT,
                "must be more than zero",
            ));
        }
        if self.max_in_flight_per_member == 0 {
            return Err(SettingError::new(
                &settings::MAX_IN_FLIGHT,
                "must be at least 1",
            ));
        }
        if self.broker.sat_file.is_some() && self.sat_check_interval.is_zero() {
            return Err(SettingError::flag(
                "SAT check interval",
                "must be more than zero",
            ));
        }
        Ok(())
    }
}

/// MQTT strings and binary data have a 16-bit length (rumqttc would
/// silently cut a longer one and write a corrupt packet).
pub(super) fn fits_mqtt(setting: &Setting, bytes: usize) -> Result<(), SettingError> {
    if bytes > usize::from(u16::MAX) {
        return Err(SettingError::new(
            setting,
            format!("{bytes} bytes; MQTT carries at most 65,535"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pool_settings_name_the_setting() {
        let broker = BrokerSettings::new("localhost", 1883);
        let mut settings = PoolSettings::new(broker, "gw");
        settings.size = 0;
        assert_eq!(settings.check().unwrap_err().setting, "--pool-size");
        settings.size = 1;
        settings.client_id = "gw/#".into();
        assert_eq!(settings.check().unwrap_err().setting, "--client-id");
        settings.client_id = "a".repeat(MAX_CLIENT_ID_BYTES + 1);
        let error = settings.check().unwrap_err();
        assert!(error.to_string().contains("1025 bytes"), "{error}");
        settings.client_id = "a".repeat(MAX_CLIENT_ID_BYTES);
        assert!(settings.check().is_ok());
    }

    /// rumqttc panics on a keep-alive under 5 s; MQTT carries at most
    /// 65,535 s. Both are refused here, before any connection is built.
    #[test]
    fn keep_alive_outside_5_to_65535_seconds_is_refused() {
        let mut broker = BrokerSettings::new("localhost", 1883);
        for secs in [0, 1, 4, 65_536] {
            broker.keep_alive = Duration::from_secs(secs);
            assert_eq!(
                broker.check().unwrap_err().setting,
                "--keep-alive",
                "{secs}"
            );
        }
        for secs in [5, 60, 65_535] {
            broker.keep_alive = Duration::from_secs(secs);
            assert!(broker.check().is_ok(), "{secs}");
        }
    }
}
