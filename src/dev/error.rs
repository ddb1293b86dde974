//! Why dev mode could not start or stopped.

use std::net::SocketAddr;
use std::time::Duration;

use crate::emulator::EmulatorError;
use crate::http::ServeError;

/// Why dev mode could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The binary was built with `--no-default-features`.
    #[error(
        "this statestore-gateway was built without the embedded MQTT broker \
         (cargo feature `embedded-broker`); rebuild with default features, or run \
         `emulator` and `serve` against a broker of your own"
    )]
    NoEmbeddedBroker,
    /// The broker could not bind its TCP listener.
    #[error("embedded mqtt broker cannot listen on {addr}")]
    BrokerListen {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system or rmqtt said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The emulator did not start or failed.
    #[error("the state store emulator failed")]
    Emulator(#[from] EmulatorError),
    /// The gateway did not start or failed.
    #[error("the gateway failed")]
    Gateway(#[from] ServeError),
    /// The gateway did not connect and subscribe to the embedded broker.
    #[error("the gateway was not connected to the embedded broker within {within:?}")]
    NotReady {
        /// How long start-up waited.
        within: Duration,
    },
}
