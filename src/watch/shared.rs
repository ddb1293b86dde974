//! What the hub's handles, its watchers and its tasks share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use super::key::KeyWatch;
use super::settings::WatchSettings;
use crate::metrics::Metrics;
use crate::store::StoreClient;

/// No member holds the registrations.
pub(super) const NO_HOLDER: usize = usize::MAX;

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) store: StoreClient,
    pub(super) metrics: Metrics,
    pub(super) settings: WatchSettings,
    pub(super) keys: Mutex<HashMap<Bytes, Arc<KeyWatch>>>,
    pub(super) watchers: AtomicUsize,
    pub(super) holder: AtomicUsize,
    /// Set by the dispatcher when it lost notifications: every key must be
    /// read again.
    pub(super) resync_requested: AtomicBool,
    pub(super) reconcile: Notify,
    pub(super) shutdown: watch::Sender<bool>,
}

impl Inner {
    pub(super) fn keys(&self) -> MutexGuard<'_, HashMap<Bytes, Arc<KeyWatch>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
