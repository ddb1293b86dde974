#![forbid(unsafe_code)]
//! statestore-gateway: the Azure IoT Operations state store over HTTP.
//!
//! The data path reads top to bottom, and no module imports one above it
//! (checked by the `modules` integration test):
//!
//! - [`cli`]: the command line (clap, with environment fallbacks), one
//!   module per subcommand, each turning its arguments into its settings.
//! - [`http`]: the APIs' routes and request parsing (the gateway's own,
//!   and Dapr's over HTTP and gRPC in a room of their own), their transport
//!   (listener, TLS, watch streams), problem+json errors, `serve`.
//! - [`access`]: who may call (the API token, JWTs) and what each caller
//!   may do to which keys (the per-key rules).
//! - [`dapr`]: Dapr's state and lock building blocks as store commands
//!   (`http::dapr`'s HTTP and gRPC front ends translate shapes only), with
//!   etag writes made safe across gateways by per-key leases and fencing.
//! - [`locks`]: locks as the SDKs keep them, with lines of waiters that
//!   share one hub watch per lock.
//! - [`watch`]: the watch hub: one KEYNOTIFY per key, fanned out to SSE watchers.
//! - [`store`]: the typed store client: one method per verb, each reply
//!   decoded once, with its request, into an outcome.
//! - [`mqtt`]: the gateway's pool of MQTT5 connections, TLS/SAT/password
//!   authentication, and the options every connection starts from.
//! - [`protocol`]: the wire protocol (payload codec, topics, HLC, errors).
//!
//! Beside it: [`settings`] (a leaf: environment names, defaults, the
//! duration syntax), [`files`] (a leaf: secret files, read by one rule, and files read again when they change), [`metrics`] (the Prometheus registry), [`trace`] (the
//! caller's W3C Trace Context, carried onto store requests), [`emulator`]
//! (the state store protocol served over any MQTT5 broker), [`dev`]
//! (embedded broker + emulator + gateway in one process), [`ui`] (the
//! browser dashboard at `/ui/`) and [`inject`] (the sidecar added to
//! Kubernetes YAML by `inject` and by the `injector` admission webhook).

pub mod access;
pub mod cli;
pub mod dapr;
pub mod dev;
pub mod emulator;
pub mod files;
pub mod http;
pub mod inject;
pub mod locks;
pub mod metrics;
pub mod mqtt;
pub mod protocol;
pub mod settings;
pub mod store;
pub mod trace;
pub mod ui;
pub mod watch;
