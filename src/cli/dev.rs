//! `dev`: its arguments and the [`DevSettings`] they make.

use clap::Args;

use crate::dev::DevSettings;
use crate::settings;

/// The arguments of `dev`. Everything listens on loopback by default: the
/// embedded broker accepts anonymous clients and nothing uses TLS.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Address of the HTTP key and watch API.
    #[arg(long, env = settings::DEV_LISTEN.env, default_value = settings::DEV_LISTEN.default)]
    pub listen: std::net::SocketAddr,
    /// Address of the admin endpoints (/livez, /readyz, /metrics).
    #[arg(long, env = settings::DEV_ADMIN_LISTEN.env, default_value = settings::DEV_ADMIN_LISTEN.default)]
    pub admin_listen: std::net::SocketAddr,
    /// Address of the embedded MQTT broker; other MQTT clients (mosquitto_pub,
    /// the AIO SDKs) can use the emulator through it.
    #[arg(long, env = settings::DEV_BROKER_LISTEN.env, default_value = settings::DEV_BROKER_LISTEN.default)]
    pub broker_listen: std::net::SocketAddr,
    /// Directory where the emulator keeps its data across restarts; without
    /// it the store lives in memory only.
    #[arg(long, env = settings::DEV_DATA_DIR.env)]
    pub data_dir: Option<std::path::PathBuf>,
}

impl DevArgs {
    /// The dev stack's settings.
    pub fn settings(&self) -> DevSettings {
        DevSettings {
            listen: self.listen,
            admin_listen: self.admin_listen,
            broker_listen: self.broker_listen,
            data_dir: self.data_dir.clone(),
        }
    }
}
