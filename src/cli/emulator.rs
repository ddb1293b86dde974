//! `emulator`: its arguments and the [`EmulatorConfig`] they make.

use std::path::PathBuf;

use clap::Args;
use thiserror::Error;

use super::parse::LogFormat;
use crate::emulator::{AccessList, AclError, EmulatorConfig};
use crate::settings;

/// Settings of `emulator`.
#[derive(Debug, Clone, Args)]
pub struct EmulatorArgs {
    /// The MQTT5 broker to serve the state store through, `HOST:PORT`.
    #[arg(long, env = settings::EMULATOR_BROKER.env, default_value = settings::EMULATOR_BROKER.default)]
    pub broker: HostPort,
    /// The emulator's MQTT client id (one emulator per broker).
    #[arg(long, env = settings::EMULATOR_CLIENT_ID.env, default_value = settings::EMULATOR_CLIENT_ID.default)]
    pub client_id: String,
    /// Broker user name.
    #[arg(long, env = settings::EMULATOR_USERNAME.env)]
    pub username: Option<String>,
    /// File holding the broker password (read once at start).
    #[arg(long, env = settings::EMULATOR_PASSWORD_FILE.env, requires = "username")]
    pub password_file: Option<PathBuf>,
    /// Keep keys SET with `aio-persistence: true` in an append-only log in
    /// this directory, replayed at start. Without it everything is in memory.
    #[arg(long, env = settings::EMULATOR_DATA_DIR.env)]
    pub data_dir: Option<PathBuf>,
    /// Most keys before SET fails with `the quota has been exceeded`.
    #[arg(long, env = settings::EMULATOR_MAX_KEYS.env)]
    pub max_keys: Option<usize>,
    /// Most bytes (keys plus values) before SET fails with `the quota has been exceeded`.
    #[arg(long, env = settings::EMULATOR_MAX_BYTES.env)]
    pub max_bytes: Option<usize>,
    /// JSON access list (client id or `prefix*` -> `read`/`write` key
    /// prefixes); requests outside it fail with `not authorized`.
    #[arg(long, env = settings::EMULATOR_ACL.env)]
    pub acl: Option<PathBuf>,
    /// Log line format.
    #[arg(long, env = settings::EMULATOR_LOG_FORMAT.env, value_enum, default_value = settings::EMULATOR_LOG_FORMAT.default)]
    pub log_format: LogFormat,
}

/// A file the emulator's settings name that cannot be read. Not a usage
/// error: the setting is well-formed, the file is the problem (as with an
/// address already in use, the process exits with code 1).
#[derive(Debug, Error)]
pub enum EmulatorFileError {
    /// `--password-file` cannot be read or is not UTF-8 text.
    #[error("the password file: {problem}")]
    Password {
        /// The file.
        path: PathBuf,
        /// Why.
        problem: String,
    },
    /// `--acl` cannot be read or is not an access list.
    #[error(transparent)]
    Acl(#[from] AclError),
}

impl EmulatorArgs {
    /// The emulator's configuration, with the password and access list read.
    pub fn settings(&self) -> Result<EmulatorConfig, EmulatorFileError> {
        let mut config = EmulatorConfig::new(self.broker.host.clone(), self.broker.port);
        config.client_id = self.client_id.clone();
        config.username = self.username.clone();
        if let Some(path) = &self.password_file {
            // Byte for byte, as the gateway and the AIO SDK read it.
            let unusable = |problem: String| EmulatorFileError::Password {
                path: path.clone(),
                problem,
            };
            let password = crate::files::secret::read_mqtt_credential(path)
                .map_err(|error| unusable(error.to_string()))?;
            let password = String::from_utf8(password)
                .map_err(|_| unusable(format!("{} is not UTF-8 text", path.display())))?;
            config.password = Some(password);
        }
        config.data_dir = self.data_dir.clone();
        config.max_keys = self.max_keys;
        config.max_bytes = self.max_bytes;
        if let Some(path) = &self.acl {
            config.acl = Some(AccessList::load(path)?);
        }
        Ok(config)
    }
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
        use clap::Parser as _;
        let cli = super::super::Cli::try_parse_from([
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
        let super::super::Command::Emulator(args) = cli.command else {
            panic!("not the emulator");
        };
        assert_eq!(args.broker.port, 1999);
        assert_eq!(args.max_keys, Some(5));
        assert_eq!(args.client_id, "statestore-emulator");
    }
}
