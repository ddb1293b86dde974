//! Command-line and environment settings for each subcommand.
//!
//! Every flag has an environment fallback whose name is a constant here, so
//! the Helm chart, the manifests and the README can name them exactly.

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

/// Settings of `emulator`.
#[derive(Debug, Clone, Args)]
pub struct EmulatorArgs {}

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
    /// Address of the admin endpoints (/live, /ready, /metrics).
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
