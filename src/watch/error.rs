//! Why a watch could not start.

use std::time::Duration;

use thiserror::Error;

use crate::store::RequestError;

/// Why a watch could not start.
#[derive(Debug, Clone, Error)]
pub enum WatchError {
    /// The gateway already has its maximum number of watchers.
    #[error("the gateway already has {0} watchers")]
    TooManyWatchers(usize),
    /// The stream names more keys than allowed.
    #[error("a stream may watch at most {0} keys")]
    TooManyKeysPerStream(usize),
    /// A pattern matches more keys than one pattern may follow.
    #[error(
        "the pattern matches more than {0} keys, the most one followed pattern may match (--max-keys-per-pattern)"
    )]
    TooManyKeysPerPattern(usize),
    /// The stream would make the gateway follow more distinct patterns
    /// than allowed.
    #[error(
        "the gateway already follows its maximum of {0} distinct patterns (--max-watch-patterns)"
    )]
    TooManyPatterns(usize),
    /// The gateway already watches its maximum number of distinct keys.
    #[error("the gateway already watches its maximum of {0} keys")]
    TooManyWatchedKeys(usize),
    /// The stream names no key and no pattern.
    #[error("no key or pattern to watch")]
    NoKeys,
    /// An empty key.
    #[error("the key length is zero")]
    EmptyKey,
    /// Registering the key (KEYNOTIFY, then GET) failed.
    #[error("registering the key with the state store failed: {0}")]
    Register(#[from] RequestError),
    /// No registration within the timeout.
    #[error("no registration within {0:?}")]
    Timeout(Duration),
    /// The gateway is shutting down.
    #[error("the gateway is shutting down")]
    ShuttingDown,
}
