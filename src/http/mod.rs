//! The gateway's HTTP side: the key API, the admin listener and the `serve`
//! runner with graceful shutdown.
//!
//! - [`keys`]: `/keys/{key}` handlers.
//! - [`batch`]: `POST /batch`, many key requests in one, each answered as
//!   its one-key request would be.
//! - [`listing`]: `GET /keys?match=`, pages of keys with opaque cursors.
//! - [`extract`]: request parsing as extractors (key, query, conditions,
//!   fencing token, representation, `Last-Event-ID`, a listing's preferred
//!   form, the declared body length) whose rejection is the API error.
//! - [`problem`]: the one error enum and its RFC 9457 responses.
//! - [`authz`]: the per-key rules of `--authz-file`, read again when the
//!   file changes, and each request's [`authz::Access`] under them.
//! - [`admin`]: `/livez`, `/readyz`, `/metrics` on their own listener.
//! - [`watch`]: `/watch` Server-Sent Events from the watch hub.
//! - [`locks`]: `/locks/{name}`: acquire (and wait), release, read a lock.
//! - [`dapr`], [`grpc`]: Dapr's state and lock API over HTTP (`/v1.0/...`)
//!   and gRPC (`dapr.proto.runtime.v1.Dapr`), on the same listener.
//! - [`listener`], [`event_stream`]: the accept loop; watch streams are
//!   written straight to their sockets.
//! - [`tls`]: a listener's serving certificate, read again when its files
//!   change.
//! - [`openapi`]: `/openapi.json`, the API's OpenAPI document.
//! - `state`: [`AppState`] (what every handler shares), [`Limits`],
//!   [`ApiToken`]; `headers`: headers on every answer.
//! - `router`: [`router`] builds the key API with its middleware (metrics,
//!   failure logs, CORS) so tests can drive it; `auth`: the bearer token
//!   check (the API token or a JWT) that makes a request's [`Caller`] and
//!   gives it its access under the per-key rules, and the backstop timeout.
//! - `server`: [`Server`] binds both listeners and runs them until
//!   [`Server::shutdown`].

pub mod admin;
mod auth;
pub mod authz;
pub mod batch;
pub mod dapr;
pub mod event_stream;
pub mod extract;
pub mod grpc;
mod headers;
pub mod keys;
pub mod listener;
pub mod listing;
pub mod locks;
pub mod openapi;
pub mod problem;
mod router;
mod server;
mod state;
pub mod tls;
pub mod watch;

pub use auth::Caller;
pub use router::{BodyReadLimits, close_unless_body_read, read_body_first, router};
pub use server::{ServeError, ServeSettings, Server, termination_signal};
pub use state::{ApiToken, AppState, CallerChecks, Limits, Shared};
