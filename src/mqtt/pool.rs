//! The gateway's pool of MQTT5 connections to the broker.
//!
//! INTERFACE STUB: the types and signatures are the contract between the
//! pool and its users (HTTP handlers, the watch hub); the bodies are being
//! written. Every method fails with `PoolError::Unavailable` until then.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;
use tokio::sync::broadcast;

use crate::metrics::Metrics;
use crate::protocol::{DecodeError, Hlc, HlcError, Notification, Reply, Request};

/// How to reach and authenticate to the broker (the AIO SDKs' settings).
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    /// `AIO_BROKER_HOSTNAME`
    pub host: String,
    /// `AIO_BROKER_TCP_PORT`
    pub port: u16,
    /// `AIO_MQTT_USE_TLS`
    pub use_tls: bool,
    /// `AIO_TLS_CA_FILE`: PEM bundle; system roots when absent.
    pub ca_file: Option<PathBuf>,
    /// `AIO_TLS_CERT_FILE`: client certificate for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// `AIO_TLS_KEY_FILE`: its private key.
    pub key_file: Option<PathBuf>,
    /// `AIO_SAT_FILE`: service-account token sent as `K8S-SAT` enhanced auth,
    /// read anew at every connect.
    pub sat_file: Option<PathBuf>,
    /// `AIO_MQTT_USERNAME`
    pub username: Option<String>,
    /// `AIO_MQTT_PASSWORD_FILE`
    pub password_file: Option<PathBuf>,
    /// `AIO_MQTT_KEEP_ALIVE`
    pub keep_alive: Duration,
    /// `AIO_MQTT_SESSION_EXPIRY`
    pub session_expiry: Duration,
}

/// Pool sizing and timing.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// The broker.
    pub broker: BrokerSettings,
    /// Members are `<client_id>-<i>`.
    pub client_id: String,
    /// Number of connections.
    pub size: usize,
    /// How long a request may wait for its reply; also its message expiry.
    pub request_timeout: Duration,
    /// Requests in flight per connection before new ones wait for a slot.
    pub max_in_flight_per_member: usize,
    /// How long a request waits for a slot before failing as overloaded.
    pub slot_wait: Duration,
}

/// Per-request envelope options.
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// `__ft`
    pub fencing_token: Option<Hlc>,
    /// `aio-persistence: true` (SET only)
    pub persist: bool,
}

/// A decoded reply and the key's version from its `__ts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreResponse {
    /// The payload.
    pub reply: Reply,
    /// `__ts` of the reply: the key's version (absent on a GET miss).
    pub version: Option<Hlc>,
}

/// Why a request got no reply.
#[derive(Debug, Error)]
pub enum PoolError {
    /// No member is connected and subscribed.
    #[error("no broker connection is available")]
    Unavailable,
    /// Every member's in-flight window stayed full for the slot wait.
    #[error("every broker connection is at its in-flight limit")]
    Overloaded,
    /// No reply within the request timeout.
    #[error("no reply from the state store within {0:?}")]
    Timeout(Duration),
    /// The member carrying the request lost its connection.
    #[error("the broker connection carrying the request was lost")]
    ConnectionLost,
    /// The reply payload could not be decoded.
    #[error("unparsable reply from the state store: {0}")]
    Decode(#[from] DecodeError),
    /// A `__ts` in the reply is malformed.
    #[error("malformed version in reply: {0}")]
    BadVersion(HlcError),
    /// Our own clock refused to produce a timestamp.
    #[error("local clock error: {0}")]
    Clock(HlcError),
    /// The request payload exceeds what the broker accepts.
    #[error("request of {size} bytes exceeds the broker's maximum packet size of {max} bytes")]
    TooLarge {
        /// Payload plus envelope.
        size: usize,
        /// The broker's CONNACK maximum.
        max: usize,
    },
    /// The pool is shutting down.
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

/// A KEYNOTIFY notification received by a member.
#[derive(Debug, Clone)]
pub struct KeyNotification {
    /// The member (index) that received it.
    pub member: usize,
    /// The key, from the notification topic.
    pub key: Bytes,
    /// What happened.
    pub notification: Notification,
    /// `__ts`: the key's version after the change (older services omit it).
    pub version: Option<Hlc>,
}

/// A member's connection state changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberEvent {
    /// Connected and subscribed (response and notification topics): usable.
    /// After this, KEYNOTIFY registrations held by this member are gone.
    Subscribed {
        /// Member index.
        member: usize,
    },
    /// Disconnected; its requests failed with `ConnectionLost`.
    Down {
        /// Member index.
        member: usize,
    },
}

/// The pool.
#[derive(Debug, Clone)]
pub struct Pool {}

impl Pool {
    /// Starts `size` members connecting in the background; returns at once.
    pub fn start(settings: PoolSettings, metrics: Metrics) -> Result<Pool, PoolError> {
        let _ = (settings, metrics);
        Ok(Pool {})
    }

    /// Sends a request on the least-loaded subscribed member and waits for
    /// its reply (bounded by the request timeout).
    pub async fn request(
        &self,
        request: &Request,
        options: &RequestOptions,
    ) -> Result<StoreResponse, PoolError> {
        let _ = (request, options);
        Err(PoolError::Unavailable)
    }

    /// Sends a request on one member: KEYNOTIFY registrations belong to the
    /// member (client id) that sent them.
    pub async fn request_on(
        &self,
        member: usize,
        request: &Request,
        options: &RequestOptions,
    ) -> Result<StoreResponse, PoolError> {
        let _ = (member, request, options);
        Err(PoolError::Unavailable)
    }

    /// A subscribed member, preferring the given one (for KEYNOTIFY).
    pub fn subscribed_member(&self, preferred: Option<usize>) -> Option<usize> {
        let _ = preferred;
        None
    }

    /// Notifications received by any member.
    pub fn notifications(&self) -> broadcast::Receiver<KeyNotification> {
        broadcast::channel(1).1
    }

    /// Member state changes.
    pub fn member_events(&self) -> broadcast::Receiver<MemberEvent> {
        broadcast::channel(1).1
    }

    /// Whether at least one member is subscribed (`/readyz`).
    pub fn is_ready(&self) -> bool {
        false
    }

    /// The largest value a SET can carry, from the broker's CONNACK maximum
    /// packet size minus the envelope; `None` until known or if unlimited.
    pub fn max_value_bytes(&self) -> Option<usize> {
        None
    }

    /// Disconnects every member cleanly; pending requests fail with
    /// `ShuttingDown`.
    pub async fn shutdown(&self) {}
}
