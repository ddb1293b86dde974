//! Why the pool could not start, and why a request got no reply.

use std::time::Duration;

use thiserror::Error;

use crate::protocol::{DecodeError, HlcError};
use crate::settings::SettingError;

/// Why a pool could not start: a setting that cannot work (named by its
/// flag and environment variable, so an operator can fix it), or no Tokio
/// runtime to run in.
#[derive(Debug, Error)]
pub enum PoolStartError {
    /// A setting, or a file it names, cannot be used.
    #[error("{0}")]
    Setting(#[from] SettingError),
    /// `Pool::start` was called outside a Tokio runtime.
    #[error("the pool must be started inside a Tokio runtime")]
    NoRuntime,
}

/// Why a request got no reply.
#[derive(Debug, Clone, Error)]
pub enum PoolError {
    /// No member is connected and subscribed, or the broker has nothing
    /// serving the state store's request topic (PUBACK "no matching
    /// subscribers").
    #[error(
        "the state store is unreachable: no usable broker connection, or nothing serves its requests"
    )]
    Unavailable,
    /// Every member's in-flight window stayed full for the slot wait.
    #[error("every broker connection is at its in-flight limit")]
    Overloaded,
    /// No reply within the request timeout.
    #[error("no reply from the state store within {0:?}")]
    Timeout(Duration),
    /// The member's connection was lost before the request could leave
    /// the gateway: the store never saw it, so it is safe to retry.
    #[error("the broker connection for the request was lost before the request was sent")]
    ConnectionLost,
    /// The connection was lost after the request may have gone out (it was
    /// handed to the network): the store may or may not have applied it.
    #[error("the broker connection was lost after the request was sent")]
    OutcomeUnknown,
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
        /// The largest packet allowed: the broker's CONNACK maximum or
        /// ours, whichever is smaller.
        max: usize,
    },
    /// The pool is shutting down.
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

/// Why a pub/sub message was not published (or may not have been).
#[derive(Debug, Clone, Error)]
pub enum PublishError {
    /// No member is connected and subscribed.
    #[error("no usable broker connection")]
    Unavailable,
    /// Every member's in-flight window stayed full for the slot wait.
    #[error("every broker connection is at its in-flight limit")]
    Overloaded,
    /// No PUBACK within the request timeout.
    #[error("the broker did not acknowledge the message within {0:?}")]
    Timeout(Duration),
    /// The connection was lost before the message left the gateway.
    #[error("the broker connection was lost before the message was sent")]
    ConnectionLost,
    /// The connection was lost after the message may have gone out.
    #[error(
        "the broker connection was lost after the message was sent: it may have been published"
    )]
    OutcomeUnknown,
    /// The message is larger than the broker accepts.
    #[error("a message of {size} bytes exceeds the broker's maximum packet size of {max} bytes")]
    TooLarge {
        /// Payload plus topic and properties.
        size: usize,
        /// The largest packet allowed.
        max: usize,
    },
    /// The broker's authorization refused the topic (PUBACK 0x87).
    #[error("the broker refused the message: not authorized to publish on this topic")]
    NotAuthorized,
    /// Another refusing PUBACK (quota exceeded, topic name invalid, ...).
    #[error("the broker refused the message: {0}")]
    Refused(String),
    /// The pool is shutting down.
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

impl From<PoolError> for PublishError {
    /// The failures taking a slot and handing the message over can have.
    fn from(error: PoolError) -> Self {
        match error {
            PoolError::Overloaded => Self::Overloaded,
            PoolError::Timeout(timeout) => Self::Timeout(timeout),
            PoolError::ConnectionLost => Self::ConnectionLost,
            PoolError::OutcomeUnknown => Self::OutcomeUnknown,
            PoolError::TooLarge { size, max } => Self::TooLarge { size, max },
            PoolError::ShuttingDown => Self::ShuttingDown,
            PoolError::Unavailable
            | PoolError::Decode(_)
            | PoolError::BadVersion(_)
            | PoolError::Clock(_) => Self::Unavailable,
        }
    }
}

impl PoolError {
    /// One error of each kind, for tests that go through them all.
    #[cfg(test)]
    pub(crate) fn one_of_each() -> [PoolError; 10] {
        [
            PoolError::Unavailable,
            PoolError::Overloaded,
            PoolError::Timeout(Duration::from_secs(1)),
            PoolError::ConnectionLost,
            PoolError::OutcomeUnknown,
            PoolError::Decode(DecodeError::Incomplete),
            PoolError::BadVersion(HlcError::TooFarInFuture),
            PoolError::Clock(HlcError::CounterOverflow),
            PoolError::TooLarge { size: 2, max: 1 },
            PoolError::ShuttingDown,
        ]
    }

    /// A short stable name, used as a metric label (`store_errors{kind}`,
    /// `store_latency{outcome}`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Overloaded => "overloaded",
            Self::Timeout(_) => "timeout",
            Self::ConnectionLost => "connection_lost",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Decode(_) => "decode",
            Self::BadVersion(_) => "bad_version",
            Self::Clock(_) => "clock",
            Self::TooLarge { .. } => "too_large",
            Self::ShuttingDown => "shutting_down",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_are_distinct_labels() {
        let errors = PoolError::one_of_each();
        let kinds: std::collections::HashSet<&str> = errors.iter().map(PoolError::kind).collect();
        assert_eq!(kinds.len(), errors.len());
    }
}
