#![forbid(unsafe_code)]
//! statestore-gateway: the Azure IoT Operations state store over HTTP.
//!
//! - [`protocol`]: the wire protocol (payload codec, topics, HLC, errors).
//! - [`mqtt`]: the gateway's pool of MQTT5 connections, TLS/SAT/password
//!   authentication, and the options every connection starts from.
//! - [`config`]: command-line and environment settings.
//! - [`emulator`]: the state store protocol served over any MQTT5 broker.
//! - [`dev`]: embedded broker + emulator + gateway in one process.
//! - [`metrics`]: the Prometheus registry and metric families.
//! - [`http`]: the key API, problem+json errors, admin endpoints, `serve`.
//! - [`store`]: the typed store client: one method per verb, replies
//!   decoded once into outcomes.
//! - [`watch`]: the watch hub: one KEYNOTIFY per key, fanned out to SSE watchers.
//! - [`locks`]: locks as the SDKs keep them, with lines of waiters that
//!   share one watch per lock.
//! - [`ui`]: the browser dashboard served at `/ui/`.

pub mod config;
pub mod dev;
pub mod emulator;
pub mod http;
pub mod locks;
pub mod metrics;
pub mod mqtt;
pub mod protocol;
pub mod store;
pub mod ui;
pub mod watch;
