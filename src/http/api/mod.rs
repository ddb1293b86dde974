//! The gateway's own routes (Dapr's are [`super::dapr`]'s): each API's handlers, which parse a request into a typed
//! command, run it, and map its outcome to a status.
//!
//! - [`keys`]: the one-key routes, `/keys/{key}`.
//! - [`batch`]: `POST /batch`, many key requests in one, each answered as
//!   its one-key request would be.
//! - [`listing`]: `GET /keys?match=`, pages of keys with opaque cursors.
//! - [`locks`]: `/locks/{name}`: acquire (and wait), release, read a lock.
//! - [`watch`]: `/watch` Server-Sent Events from the watch hub.
//! - [`subscribe`]: `/subscribe` Server-Sent Events of MQTT topics.
//! - [`admin`]: `/livez`, `/readyz`, `/metrics` on their own listener.
//! - [`openapi`]: `/openapi.json`, the API's OpenAPI document.
//! - [`extract`]: request parsing as extractors (key, query, conditions,
//!   fencing token, representation, `Last-Event-ID`, a listing's preferred
//!   form, the declared body length) whose rejection is the API error.

pub mod admin;
pub mod batch;
pub mod extract;
pub mod keys;
pub mod listing;
pub mod locks;
pub mod openapi;
pub mod subscribe;
pub mod watch;
