//! What the emulator connects to and how it behaves, with its defaults.

use std::path::PathBuf;
use std::time::Duration;

use super::acl::AccessList;
use super::keyspace::ScanLimits;
use crate::settings;

/// How long [`Emulator::start`](super::Emulator::start) waits by default to be connected and subscribed.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Requests the broker may send before we ack (MQTT5 receive maximum). Acks
/// go out once a request is handled, so this bounds the requests held in
/// memory; a flood waits in the broker's queue instead.
pub(super) const RECEIVE_MAXIMUM: u16 = 1024;

/// Requests queued between the poll loop and the worker by default: room
/// for every QoS 1 request the broker may have in flight to us, and then some.
const REQUEST_QUEUE: usize = 4 * RECEIVE_MAXIMUM as usize;

/// What the emulator connects to and how it behaves.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// Broker host name or address.
    pub broker_host: String,
    /// Broker MQTT port (plain TCP).
    pub broker_port: u16,
    /// The emulator's own MQTT client id.
    pub client_id: String,
    /// Broker user name, if it wants one.
    pub username: Option<String>,
    /// Broker password (with `username`).
    pub password: Option<String>,
    /// Where keys SET with `aio-persistence: true` are kept; `None` keeps
    /// everything in memory, like the real service's default.
    pub data_dir: Option<PathBuf>,
    /// Most keys before `the quota has been exceeded`.
    pub max_keys: Option<usize>,
    /// Most bytes (keys plus values) before `the quota has been exceeded`.
    pub max_bytes: Option<usize>,
    /// Who may read and write which keys; `None` allows everything.
    pub acl: Option<AccessList>,
    /// How many keys a SCAN page holds and looks at.
    pub scan_limits: ScanLimits,
    /// How long [`Emulator::start`](super::Emulator::start) tries to connect and subscribe.
    pub startup_timeout: Duration,
    /// Requests held between the connection and the worker; a request
    /// arriving when it is full is refused (`__stat` 503) and acknowledged.
    pub request_queue: usize,
}

impl EmulatorConfig {
    /// In-memory, unlimited, open to all, client id `statestore-emulator`.
    pub fn new(broker_host: impl Into<String>, broker_port: u16) -> Self {
        Self {
            broker_host: broker_host.into(),
            broker_port,
            client_id: settings::EMULATOR_CLIENT_ID.default.into(),
            username: None,
            password: None,
            data_dir: None,
            max_keys: None,
            max_bytes: None,
            acl: None,
            scan_limits: ScanLimits::default(),
            startup_timeout: STARTUP_TIMEOUT,
            request_queue: REQUEST_QUEUE,
        }
    }
}
