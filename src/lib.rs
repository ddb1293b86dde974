#![forbid(unsafe_code)]
//! statestore-gateway: the Azure IoT Operations state store over HTTP.
//!
//! - [`protocol`]: the wire protocol (payload codec, topics, HLC, errors).
//! - [`mqtt`]: MQTT5 connection options shared by the gateway and emulator.
//! - [`config`]: command-line and environment settings.
//! - [`dev`]: embedded broker + emulator + gateway in one process.
//! - [`metrics`]: the Prometheus registry and metric families.
//! - [`watch`]: the watch hub: one KEYNOTIFY per key, fanned out to SSE watchers.

pub mod config;
pub mod dev;
pub mod metrics;
pub mod mqtt;
pub mod protocol;
pub mod watch;
