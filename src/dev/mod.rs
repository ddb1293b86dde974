//! Dev mode: an MQTT5 broker, the state store emulator and the gateway in
//! one process, so `cargo run --release -- dev` is all a laptop needs.
//!
//! The broker (rmqtt) sits behind the cargo feature `embedded-broker`, on by
//! default; the container image is built without it and `dev` then says so.

use std::net::SocketAddr;

#[cfg(feature = "embedded-broker")]
mod broker;

#[cfg(feature = "embedded-broker")]
pub use broker::{EmbeddedBroker, MAX_INFLIGHT, MAX_QUEUED_PER_CLIENT};

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
}
