//! Command-line and environment settings for each subcommand.
//!
//! Every flag has an environment fallback whose name is a constant here, so
//! the Helm chart, the manifests and the README can name them exactly.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "statestore-gateway", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP key and watch API over a pool of MQTT5 connections.
    Serve(ServeArgs),
    /// Serve the state store protocol as an MQTT5 client of a broker.
    Emulator(EmulatorArgs),
    /// Embedded broker + emulator + gateway in one process, for laptops.
    Dev(DevArgs),
}

/// Settings of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {}

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

/// Settings of `dev`.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {}

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
}
