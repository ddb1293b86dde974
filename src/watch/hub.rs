//! The hub's handle: it admits watchers (each a [`Watcher`], one stream's
//! events), ends them all at shutdown and counts them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use super::error::WatchError;
use super::key::{KeyWatch, wait_registered};
use super::pattern::{Listing, PatternWatch, Patterns};
use super::reconciler::{dispatch, reconcile};
use super::selection::Selection;
use super::settings::WatchSettings;
use super::shared::{Inner, NO_HOLDER};
use super::watcher::{ReadFilter, Watcher};
use crate::metrics::Metrics;
use crate::mqtt::PoolError;
use crate::protocol::Hlc;
use crate::store::{RequestError, StoreClient};

/// The hub; cheap to clone.
#[derive(Debug, Clone)]
pub struct WatchHub {
    inner: Arc<Inner>,
    patterns: Arc<Patterns>,
}

impl WatchHub {
    /// Starts the hub's dispatcher and reconciler on the store's pool.
    pub fn start(store: StoreClient, metrics: Metrics, settings: WatchSettings) -> Self {
        let inner = Arc::new(Inner {
            store,
            metrics,
            settings,
            keys: Mutex::new(HashSet::new()),
            watchers: AtomicUsize::new(0),
            holder: AtomicUsize::new(NO_HOLDER),
            resync_requested: AtomicBool::new(false),
            reconcile: Notify::new(),
            registered: Notify::new(),
            shutdown: watch::Sender::new(false),
        });
        let notifications = inner.store.pool().notifications();
        let member_events = inner.store.pool().member_events();
        tokio::spawn(dispatch(Arc::clone(&inner), notifications));
        tokio::spawn(reconcile(Arc::clone(&inner), member_events));
        let patterns = Arc::new(Patterns::new(Arc::clone(&inner)));
        Self { inner, patterns }
    }

    /// The hub's limits.
    pub fn settings(&self) -> &WatchSettings {
        &self.inner.settings
    }

    /// Starts watching `keys`: returns once every key is registered with the
    /// store, so that the caller can still answer with an HTTP error.
    ///
    /// `last_version` is the client's `Last-Event-ID`: on a single-key
    /// stream, a key whose version is not newer gets no initial sync (a
    /// multi-key stream always gets every key's sync).
    pub async fn watch(
        &self,
        keys: Vec<Bytes>,
        last_version: Option<Hlc>,
    ) -> Result<Watcher, WatchError> {
        let selection = Selection::of_keys(keys, self.inner.settings.max_keys_per_stream)?;
        self.follow(selection, last_version, None).await
    }

    /// Starts watching the selection's keys and every key matching its
    /// patterns: returns once every key is registered with the store and
    /// every pattern is listed, so that the caller can still answer with
    /// an HTTP error.
    ///
    /// `last_version` is the client's `Last-Event-ID`: on a stream of one
    /// key, a key whose version is not newer gets no initial sync (any
    /// other stream always gets every key's sync).
    ///
    /// With `readable`, the stream follows only the pattern keys it allows
    /// (others are neither told of nor counted in `listed`), and is told
    /// nothing of a key it no longer allows. The selection's keys are the
    /// caller's to check.
    pub async fn follow(
        &self,
        selection: Selection,
        last_version: Option<Hlc>,
        readable: Option<ReadFilter>,
    ) -> Result<Watcher, WatchError> {
        selection.check()?;
        let (keys, patterns) = (selection.keys(), selection.patterns());
        self.admit(keys)?;
        // From here on the watcher's drop undoes the admission, key and
        // pattern counts.
        let mut watcher = Watcher::new(
            Arc::clone(&self.inner),
            Arc::clone(&self.patterns),
            keys.len(),
            patterns.len(),
            readable,
        );
        // Keys before patterns, so that a named key's entry gets the
        // stream's buffer rather than a pattern's.
        for key in keys {
            watcher.name(self.inner.attach(key, self.inner.settings.buffer));
        }
        // Past `--max-watch-patterns`: refused, and the watcher's drop
        // releases the keys it took.
        watcher.follow_patterns(self.patterns.follow(patterns)?);
        self.inner.reconcile.notify_one();
        wait_ready(&self.inner, watcher.followed_keys(), watcher.patterns()).await?;
        // One id cannot say what a stream of several keys saw of each (events
        // of different keys are not in version order): resume single keys.
        let last_version = last_version.filter(|_| keys.len() == 1 && patterns.is_empty());
        watcher.queue_named_syncs(keys, last_version.as_ref());
        watcher.start_patterns();
        // Subscribed to every channel: a shutdown from now on reaches the
        // stream through them, and one before is seen here.
        if *self.inner.shutdown.borrow() {
            return Err(WatchError::ShuttingDown);
        }
        Ok(watcher)
    }

    /// Takes a watcher's place, if the gateway runs, reaches its store and
    /// has room for the stream and for `keys`.
    fn admit(&self, keys: &[Bytes]) -> Result<(), WatchError> {
        let settings = &self.inner.settings;
        if *self.inner.shutdown.borrow() {
            return Err(WatchError::ShuttingDown);
        }
        // Without a broker connection the registration cannot succeed:
        // answer 503 now rather than 504 after the timeout.
        if !self.inner.store.pool().is_ready() {
            return Err(RequestError::Transport(PoolError::Unavailable).into());
        }
        {
            let keys_now = self.inner.keys();
            let new_keys = keys
                .iter()
                .filter(|key| !keys_now.contains(&key[..]))
                .count();
            if keys_now.len() + new_keys > settings.max_watched_keys {
                return Err(WatchError::TooManyWatchedKeys(settings.max_watched_keys));
            }
        }
        let admitted = self
            .inner
            .watchers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < settings.max_watchers).then_some(n + 1)
            });
        if admitted.is_err() {
            return Err(WatchError::TooManyWatchers(settings.max_watchers));
        }
        self.inner.metrics.watchers.inc();
        Ok(())
    }

    /// Tells the followed patterns that match `key` that this gateway just
    /// wrote it (PUT, a lock), so that they follow it now rather than at
    /// their next rescan. An atomic load when no pattern is followed.
    pub fn wrote(&self, key: &Bytes) {
        self.patterns.wrote(key);
    }

    /// Ends every stream (graceful shutdown), through the channels the
    /// streams read: a stream holds no shutdown signal of its own (10,000
    /// of them in a fan-out). A stream that subscribes meanwhile sees the
    /// flag, which is set first (see [`WatchHub::follow`]).
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        let keys: Vec<Arc<KeyWatch>> = self
            .inner
            .keys()
            .iter()
            .map(|watched| Arc::clone(&watched.0))
            .collect();
        for key_watch in keys {
            key_watch.close();
        }
        self.patterns.close();
    }

    /// Keys with at least one watcher.
    pub fn watched_keys(&self) -> usize {
        self.inner.keys().len()
    }

    /// Open watchers.
    pub fn watchers(&self) -> usize {
        self.inner.watchers.load(Ordering::Acquire)
    }
}

/// Waits until every key of `named` is registered and every pattern of
/// `patterns` listed, within the registration timeout; a pattern past its
/// limit refuses the stream, as it would a first stream.
async fn wait_ready(
    hub: &Inner,
    named: Vec<Arc<KeyWatch>>,
    patterns: &[Arc<PatternWatch>],
) -> Result<(), WatchError> {
    let deadline = tokio::time::Instant::now() + hub.register_timeout();
    for key_watch in named {
        wait_registered(
            &key_watch,
            &hub.registered,
            deadline,
            hub.register_timeout(),
        )
        .await?;
    }
    for pattern in patterns {
        wait_listed(pattern, deadline, hub.register_timeout()).await?;
        if let Some(why) = pattern.state().over_limit.clone() {
            return Err(why);
        }
    }
    Ok(())
}

async fn wait_listed(
    pattern: &PatternWatch,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<(), WatchError> {
    let mut listing = pattern.listing.subscribe();
    let outcome = tokio::time::timeout_at(
        deadline,
        listing.wait_for(|l| !matches!(l, Listing::Pending)),
    )
    .await;
    match outcome {
        Err(_) => Err(WatchError::Timeout(timeout)),
        Ok(Err(_)) => Err(WatchError::ShuttingDown),
        Ok(Ok(state)) => match &*state {
            Listing::Failed(error) => Err(error.clone()),
            _ => Ok(()),
        },
    }
}
