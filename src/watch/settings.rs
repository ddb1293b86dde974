//! The hub's limits.

use std::time::Duration;

use crate::settings;

/// Limits of the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSettings {
    /// Open watchers (streams) in the whole gateway.
    pub max_watchers: usize,
    /// Keys one stream may watch.
    pub max_keys_per_stream: usize,
    /// Distinct keys watched in the whole gateway (each costs a store
    /// registration and a buffer).
    pub max_watched_keys: usize,
    /// Events buffered per key before a slow watcher skips to a sync.
    pub buffer: usize,
    /// Bytes of those events kept per key (see
    /// [`KeyEvent::weight`](super::KeyEvent::weight)): the oldest go first,
    /// the newest always stays.
    pub buffer_bytes: usize,
    /// How often an idle stream gets a keep-alive comment.
    pub keep_alive: Duration,
    /// How often every watched key is registered and read again, even with
    /// no reconnect seen: catches a store that lost its registrations
    /// without dropping our connection (e.g. a restarted emulator). `None`
    /// disables it.
    pub resync_interval: Option<Duration>,
    /// How often a followed pattern is listed again (SCAN) to find keys
    /// that other clients created.
    pub rescan_interval: Duration,
    /// Keys one followed pattern may match.
    pub max_keys_per_pattern: usize,
    /// Distinct patterns followed in the whole gateway (each costs a
    /// rescan every `rescan_interval`, whatever its number of streams).
    pub max_patterns: usize,
}

/// The command line's defaults.
impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            max_watchers: settings::DEFAULT_MAX_WATCHERS,
            max_keys_per_stream: settings::DEFAULT_MAX_KEYS_PER_WATCH,
            max_watched_keys: settings::DEFAULT_MAX_WATCHED_KEYS,
            buffer: settings::DEFAULT_WATCH_BUFFER,
            buffer_bytes: settings::DEFAULT_WATCH_BUFFER_BYTES,
            keep_alive: settings::DEFAULT_WATCH_KEEPALIVE,
            resync_interval: Some(settings::DEFAULT_WATCH_RESYNC_INTERVAL),
            rescan_interval: settings::DEFAULT_WATCH_RESCAN_INTERVAL,
            max_keys_per_pattern: settings::DEFAULT_MAX_KEYS_PER_PATTERN,
            max_patterns: settings::DEFAULT_MAX_WATCH_PATTERNS,
        }
    }
}
