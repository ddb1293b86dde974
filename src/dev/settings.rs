//! What dev mode listens on and where its emulator keeps its data.

use std::net::SocketAddr;
use std::path::PathBuf;

/// What dev mode listens on and where its emulator keeps its data; the
/// rest (the gateway's pool, its limits) is the code's defaults.
#[derive(Debug, Clone)]
pub struct DevSettings {
    /// Address of the HTTP key and watch API.
    pub listen: SocketAddr,
    /// Address of the admin endpoints (`/livez`, `/readyz`, `/metrics`).
    pub admin_listen: SocketAddr,
    /// Address of the embedded MQTT broker.
    pub broker_listen: SocketAddr,
    /// Where the emulator keeps its data across restarts; `None` keeps the
    /// store in memory only.
    pub data_dir: Option<PathBuf>,
    /// The gateway's Dapr settings (`serve`'s defaults but transactions
    /// and the outbox).
    pub dapr: crate::dapr::DaprSettings,
}
