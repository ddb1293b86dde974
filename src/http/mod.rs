//! The gateway's HTTP side: the APIs, their transport, and the `serve`
//! runner with graceful shutdown.
//!
//! - [`api`]: the gateway's own routes (keys, batches, listing, locks,
//!   watches, admin, OpenAPI) and request parsing.
//! - [`dapr`]: Dapr's state and lock API over HTTP and gRPC, on the same
//!   listener.
//! - [`transport`]: the accept loop, TLS and watch stream writing.
//! - [`problem`]: the one error enum and its RFC 9457 responses.
//! - `guard`: the middleware that establishes who calls (through
//!   [`crate::access`]) and puts the backstop timeout on each request.
//! - `state`: [`AppState`] (what every handler shares) and [`Limits`];
//!   `headers`: headers on every answer.
//! - `router`: [`router`] builds the APIs with their middleware (metrics,
//!   failure logs, CORS) so tests can drive it.
//! - `server`: [`Server`] binds both listeners and runs them until
//!   [`Server::shutdown`].

pub mod api;
pub mod dapr;
mod guard;
mod headers;
pub mod problem;
mod router;
mod server;
mod state;
pub mod transport;

pub use router::{BodyReadLimits, close_unless_body_read, read_body_first, router};
pub use server::{ServeError, ServeSettings, Server, termination_signal};
pub use state::{AppState, Limits, Shared};
