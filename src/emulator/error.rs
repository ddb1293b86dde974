//! Why the emulator did not start or stopped.

use std::time::Duration;

use thiserror::Error;

use super::persist::PersistError;

/// Why the emulator did not start or stopped.
#[derive(Debug, Error)]
pub enum EmulatorError {
    /// The persistence log could not be read, written or synced.
    #[error(transparent)]
    Persist(#[from] PersistError),
    /// No broker connection and subscription in time.
    #[error(
        "not connected and subscribed to the broker within {timeout:?} (last error: {last_error})"
    )]
    NotServing {
        /// How long it tried.
        timeout: Duration,
        /// The last connection error, if any.
        last_error: String,
    },
    /// The broker refused the subscription to the request topic.
    #[error("the broker refused the subscription to the request topic: {0}")]
    SubscriptionRefused(String),
    /// A task of the emulator ended unexpectedly.
    #[error("the emulator stopped unexpectedly: {0}")]
    Stopped(String),
}
