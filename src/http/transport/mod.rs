//! Bytes to requests and back: the accept loop (HTTP/1.1 and HTTP/2, over
//! TCP or TLS), serving certificates, and event streams written straight
//! to their sockets.
//!
//! - [`listener`]: the accept loop and its connection limits.
//! - [`event_stream`]: event streams (watch and topic) written to their
//!   sockets (it explains why not through hyper).
//! - [`stream_request`]: which requests are event streams, for the stream
//!   writer and for the API's guard (the only queries that may carry a
//!   token).
//! - [`tls`]: a listener's serving certificate, read again when its files
//!   change.

pub mod event_stream;
pub mod listener;
pub mod stream_request;
pub mod tls;
