//! The hub's handle, which admits watchers, and the watcher, one stream of
//! events for a set of keys.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use tokio::sync::{Notify, broadcast, watch};
use tokio_stream::StreamMap;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use super::error::WatchError;
use super::event::{EventKind, KeyEvent, is_news};
use super::key::{KeyState, KeyWatch, Registration, Slot};
use super::reconciler::{dispatch, reconcile};
use super::settings::WatchSettings;
use super::shared::{Inner, NO_HOLDER};
use crate::metrics::Metrics;
use crate::mqtt::PoolError;
use crate::protocol::Hlc;
use crate::store::{RequestError, StoreClient};

/// The hub; cheap to clone.
#[derive(Debug, Clone)]
pub struct WatchHub {
    inner: Arc<Inner>,
}

impl WatchHub {
    /// Starts the hub's dispatcher and reconciler on the store's pool.
    pub fn start(store: StoreClient, metrics: Metrics, settings: WatchSettings) -> Self {
        let inner = Arc::new(Inner {
            store,
            metrics,
            settings,
            keys: Mutex::new(HashMap::new()),
            watchers: AtomicUsize::new(0),
            holder: AtomicUsize::new(NO_HOLDER),
            resync_requested: AtomicBool::new(false),
            reconcile: Notify::new(),
            shutdown: watch::Sender::new(false),
        });
        let notifications = inner.store.pool().notifications();
        let member_events = inner.store.pool().member_events();
        tokio::spawn(dispatch(Arc::clone(&inner), notifications));
        tokio::spawn(reconcile(Arc::clone(&inner), member_events));
        Self { inner }
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
        let settings = &self.inner.settings;
        if keys.is_empty() {
            return Err(WatchError::NoKeys);
        }
        if keys.len() > settings.max_keys_per_stream {
            return Err(WatchError::TooManyKeysPerStream(
                settings.max_keys_per_stream,
            ));
        }
        if keys.iter().any(Bytes::is_empty) {
            return Err(WatchError::EmptyKey);
        }
        // A key named twice is watched once.
        let mut unique = HashSet::new();
        let keys: Vec<Bytes> = keys
            .into_iter()
            .filter(|key| unique.insert(key.clone()))
            .collect();
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
                .filter(|key| !keys_now.contains_key(*key))
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
        // From here on the guard undoes the admission and key counts.
        let mut watcher = Watcher {
            hub: Arc::clone(&self.inner),
            cursors: Vec::with_capacity(keys.len()),
            events: StreamMap::with_capacity(keys.len()),
            pending: Vec::new(),
            shutdown: {
                let mut shutdown = self.inner.shutdown.subscribe();
                Box::pin(async move {
                    // An error means the hub is gone: shut down too.
                    let _ = shutdown.wait_for(|down| *down).await;
                })
            },
            shut_down: false,
        };
        for key in keys {
            let key_watch = self.attach(&key);
            let receiver = key_watch.events.subscribe();
            let index = watcher.cursors.len();
            watcher.events.insert(index, BroadcastStream::new(receiver));
            watcher.cursors.push(Cursor {
                watch: key_watch,
                delivered: None,
            });
        }
        self.inner.reconcile.notify_one();
        let deadline = tokio::time::Instant::now() + settings.register_timeout;
        for cursor in &watcher.cursors {
            wait_registered(&cursor.watch, deadline, settings.register_timeout).await?;
        }
        // One id cannot say what a multi-key stream saw of each key (events
        // of different keys are not in version order): resume single keys.
        let last_version = last_version.filter(|_| watcher.cursors.len() == 1);
        for cursor in &mut watcher.cursors {
            let snapshot = cursor.watch.state().snapshot.clone();
            let Some(snapshot) = snapshot else { continue };
            // Only the very state the client saw is skipped: an id the hub
            // never gave this state (an older one, or a newer one from before
            // a store restart) gets the sync.
            let seen = last_version.is_some() && last_version == snapshot.id;
            cursor.delivered = snapshot.id.clone();
            if !seen {
                watcher.pending.push(Arc::new(KeyEvent::sync(
                    &cursor.watch.key,
                    &snapshot,
                    false,
                    false,
                )));
            }
        }
        watcher.pending.reverse();
        Ok(watcher)
    }

    /// Adds a watcher to `key`, creating its entry (and asking the
    /// reconciler to register it) when it is the first.
    fn attach(&self, key: &Bytes) -> Arc<KeyWatch> {
        let mut keys = self.inner.keys();
        let key_watch = keys.entry(key.clone()).or_insert_with(|| {
            self.inner.metrics.watched_keys.inc();
            Arc::new(KeyWatch {
                key: key.clone(),
                state: Mutex::new(KeyState {
                    watchers: 0,
                    snapshot: None,
                    changes: 0,
                    retained: VecDeque::new(),
                    retained_bytes: 0,
                }),
                events: broadcast::channel(self.inner.settings.buffer.max(1)).0,
                registration: watch::Sender::new(Registration::Pending),
                buffer: self.inner.settings.buffer.max(1),
                buffer_bytes: self.inner.settings.buffer_bytes,
            })
        });
        key_watch.state().watchers += 1;
        Arc::clone(key_watch)
    }

    /// Ends every stream (graceful shutdown).
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
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

async fn wait_registered(
    key_watch: &KeyWatch,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<(), WatchError> {
    let mut registration = key_watch.registration.subscribe();
    let outcome = tokio::time::timeout_at(
        deadline,
        registration.wait_for(|r| !matches!(r, Registration::Pending)),
    )
    .await;
    match outcome {
        Err(_) => Err(WatchError::Timeout(timeout)),
        Ok(Err(_)) => Err(WatchError::ShuttingDown),
        Ok(Ok(state)) => match &*state {
            Registration::Failed(error) => Err(error.clone()),
            _ => Ok(()),
        },
    }
}

#[derive(Debug)]
struct Cursor {
    watch: Arc<KeyWatch>,
    /// The newest version this watcher was told about.
    delivered: Option<Hlc>,
}

/// One open stream of events for a set of keys.
pub struct Watcher {
    hub: Arc<Inner>,
    cursors: Vec<Cursor>,
    /// Each key's events, by index into `cursors`.
    events: StreamMap<usize, BroadcastStream<Arc<Slot>>>,
    pending: Vec<Arc<KeyEvent>>,
    /// Resolves when the gateway shuts down. One future for the watcher's
    /// life: making a new one per event registered and unregistered
    /// 10,000 waiters on one lock for every event of a fan-out.
    shutdown: BoxFuture<'static, ()>,
    shut_down: bool,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("keys", &self.cursors.len())
            .finish_non_exhaustive()
    }
}

impl Watcher {
    /// The next event for this watcher; `None` when the gateway shuts down.
    ///
    /// Events whose version is not newer than what this watcher was already
    /// told are skipped: no duplicates, no going back.
    pub async fn next(&mut self) -> Option<Arc<KeyEvent>> {
        loop {
            if let Some(event) = self.pending.pop() {
                self.hub.metrics.events_delivered.inc();
                return Some(event);
            }
            if self.shut_down {
                return None;
            }
            let (index, item) = tokio::select! {
                biased;
                () = &mut self.shutdown => {
                    self.shut_down = true;
                    return None;
                }
                item = self.events.next() => item?,
            };
            let cursor = &mut self.cursors[index];
            // An emptied slot was dropped for the key's byte budget: this
            // watcher is behind, exactly as when the channel overran it.
            let skipped = match item {
                Ok(slot) => match slot.event() {
                    Some(event) => Ok(event),
                    None => Err(1),
                },
                Err(BroadcastStreamRecvError::Lagged(skipped)) => Err(skipped),
            };
            let event = match skipped {
                Ok(event) => event,
                Err(skipped) => {
                    self.hub.metrics.events_dropped.inc_by(skipped);
                    let snapshot = cursor.watch.state().snapshot.clone();
                    let Some(snapshot) = snapshot else { continue };
                    Arc::new(KeyEvent::sync(&cursor.watch.key, &snapshot, false, true))
                }
            };
            if !is_news(cursor.delivered.as_ref(), &event) {
                continue;
            }
            if event.kind != EventKind::Error && event.id.is_some() {
                cursor.delivered.clone_from(&event.id);
            }
            self.hub.metrics.events_delivered.inc();
            return Some(event);
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let hub = &self.hub;
        hub.watchers.fetch_sub(1, Ordering::AcqRel);
        hub.metrics.watchers.dec();
        let mut keys = hub.keys();
        let mut released = false;
        for cursor in &self.cursors {
            let mut state = cursor.watch.state();
            state.watchers -= 1;
            if state.watchers == 0 {
                drop(state);
                keys.remove(&cursor.watch.key);
                hub.metrics.watched_keys.dec();
                released = true;
            }
        }
        drop(keys);
        if released {
            hub.reconcile.notify_one();
        }
    }
}
