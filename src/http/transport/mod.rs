//! Bytes to requests and back: the accept loop (HTTP/1.1 and HTTP/2, over
//! TCP or TLS), serving certificates, and watch streams written straight
//! to their sockets.
//!
//! - [`listener`]: the accept loop and its connection limits.
//! - [`event_stream`]: watch streams written to their sockets (it explains
//!   why not through hyper).
//! - [`tls`]: a listener's serving certificate, read again when its files
//!   change.

pub mod event_stream;
pub mod listener;
pub mod tls;
