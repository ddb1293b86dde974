//! MQTT5 for the gateway and the emulator: the gateway's pool of
//! connections, how they authenticate, and the options every connection of
//! this crate starts from.
//!
//! - `options`: packet limits, timeouts and [`base_options`] (both sides).
//! - `settings`: [`BrokerSettings`], [`PoolSettings`] and their checks.
//! - `error`: [`PoolStartError`] (why the pool cannot start), [`PoolError`]
//!   (why a request got no reply) and [`PublishError`] (why a message was
//!   not published).
//! - `events`: [`KeyNotification`] and [`MemberEvent`].
//! - `auth`: TLS, `K8S-SAT` and passwords, read anew at every connect.
//! - `backoff`: [`Backoff`], the reconnect delays of every connection.
//! - `connection`: one member: poll loop, pending requests, reconnects.
//! - `takeover`: telling a session taken over by a client with the same
//!   client id from other connection losses.
//! - `pool`: [`Pool`]: routing, in-flight windows, the request envelope,
//!   and pub/sub messages ([`Pool::publish`]: QoS 1, awaiting the PUBACK).
//! - `subscriber`: [`Subscriber`], pub/sub delivery's own connection: a
//!   persistent session, manual acknowledgements, receive maximum.

mod auth;
mod backoff;
mod connection;
mod error;
mod events;
mod options;
mod pool;
mod settings;
mod subscriber;
mod takeover;

pub use auth::tls_client_config;
pub use backoff::Backoff;
pub use error::{PoolError, PoolStartError, PublishError};
pub use events::{KeyNotification, MemberEvent};
pub use options::{
    CONNECT_TIMEOUT, MAX_PACKET_SIZE, OUTGOING_INFLIGHT_LIMIT, REQUEST_CHANNEL_CAPACITY,
    base_options,
};
pub use pool::{
    ENVELOPE_ALLOWANCE, Labelled, Message, Pool, Published, RequestOptions, StoreResponse,
};
pub use settings::{BrokerSettings, MAX_CLIENT_ID_BYTES, PoolSettings};
pub use subscriber::{Received, Subscriber, SubscriberError, SubscriberSettings};
