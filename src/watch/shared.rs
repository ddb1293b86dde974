//! What the hub's handles, its watchers and its tasks share.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use super::key::{KeyWatch, WatchedKey};
use super::settings::WatchSettings;
use crate::metrics::Metrics;
use crate::store::StoreClient;
use crate::trace;

/// No member holds the registrations.
pub(super) const NO_HOLDER: usize = usize::MAX;

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) store: StoreClient,
    pub(super) metrics: Metrics,
    pub(super) settings: WatchSettings,
    /// The watched keys, each by its entry.
    pub(super) keys: Mutex<HashSet<WatchedKey>>,
    pub(super) watchers: AtomicUsize,
    pub(super) holder: AtomicUsize,
    /// Set by the dispatcher when it lost notifications: every key must be
    /// read again.
    pub(super) resync_requested: AtomicBool,
    pub(super) reconcile: Notify,
    /// Woken whenever keys' registrations move (see
    /// [`wait_registered`](super::key::wait_registered)).
    pub(super) registered: Notify,
    pub(super) shutdown: watch::Sender<bool>,
}

impl Inner {
    /// How long a new watcher waits for its keys' first registration: the
    /// request timeout, which the pool owns.
    pub(super) fn register_timeout(&self) -> std::time::Duration {
        self.store.pool().request_timeout()
    }

    pub(super) fn keys(&self) -> MutexGuard<'_, HashSet<WatchedKey>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a watcher reference to `key`, creating its entry (and asking
    /// the reconciler to register it) when it is the first, with a channel
    /// of `buffer` events (at most `--watch-buffer`).
    pub(super) fn attach(&self, key: &Bytes, buffer: usize) -> Arc<KeyWatch> {
        let buffer = buffer.min(self.settings.buffer).max(1);
        let mut keys = self.keys();
        let key_watch = match keys.get(&key[..]) {
            Some(watched) => Arc::clone(&watched.0),
            None => {
                self.metrics.watched_keys.inc();
                let key_watch = Arc::new(KeyWatch::new(
                    key,
                    buffer,
                    self.settings.buffer_bytes,
                    trace::current(),
                ));
                keys.insert(WatchedKey(Arc::clone(&key_watch)));
                key_watch
            }
        };
        key_watch.state().watchers += 1;
        key_watch
    }

    /// Takes one watcher reference off each of `watches`; a key left
    /// without any is forgotten and its registration stopped.
    pub(super) fn release<'a>(&self, watches: impl IntoIterator<Item = &'a Arc<KeyWatch>>) {
        let mut keys = self.keys();
        let mut released = false;
        for key_watch in watches {
            let mut state = key_watch.state();
            state.watchers -= 1;
            if state.watchers == 0 {
                drop(state);
                keys.remove(&key_watch.key[..]);
                self.metrics.watched_keys.dec();
                released = true;
            }
        }
        drop(keys);
        if released {
            self.reconcile.notify_one();
        }
    }
}
