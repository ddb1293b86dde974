//! The watch hub: key changes fanned out to SSE watchers.
//!
//! One KEYNOTIFY registration per key for the whole gateway, on one pool
//! member (the *holder*), shared by every watcher of that key and stopped
//! when the last one leaves. A single reconciler task owns the registrations:
//! it compares the keys that have watchers with the keys registered on the
//! holder and sends KEYNOTIFY / KEYNOTIFY STOP in order, so a watcher that
//! arrives while a STOP is pending cannot be lost. When the holder reconnects
//! (the store drops registrations of a disconnected client) or goes away, the
//! reconciler registers every key again, GETs each and tells watchers whose
//! key moved with a `resync` sync event.
//!
//! Each key has a bounded broadcast channel: dispatch never waits on a
//! watcher; a watcher that falls behind skips to the latest state (kept in
//! the key's snapshot) instead of growing memory.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream;
use thiserror::Error;
use tokio::sync::{Notify, broadcast, watch};
use tokio_stream::StreamMap;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use crate::metrics::Metrics;
use crate::mqtt::{KeyNotification, MemberEvent, PoolError};
use crate::protocol::{Hlc, Notification};
use crate::settings;
use crate::store::{RequestError, StoreClient, Versioned};

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
    /// Bytes of those events kept per key (see [`KeyEvent::weight`]): the
    /// oldest go first, the newest always stays.
    pub buffer_bytes: usize,
    /// How long a new watcher waits for its keys' first registration.
    pub register_timeout: Duration,
    /// How often an idle stream gets a keep-alive comment.
    pub keep_alive: Duration,
    /// How often every watched key is registered and read again, even with
    /// no reconnect seen: catches a store that lost its registrations
    /// without dropping our connection (e.g. a restarted emulator). `None`
    /// disables it.
    pub resync_interval: Option<Duration>,
}

/// The command line's defaults; the registration timeout is the request
/// timeout.
impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            max_watchers: settings::DEFAULT_MAX_WATCHERS,
            max_keys_per_stream: settings::DEFAULT_MAX_KEYS_PER_WATCH,
            max_watched_keys: settings::DEFAULT_MAX_WATCHED_KEYS,
            buffer: settings::DEFAULT_WATCH_BUFFER,
            buffer_bytes: settings::DEFAULT_WATCH_BUFFER_BYTES,
            register_timeout: settings::DEFAULT_REQUEST_TIMEOUT,
            keep_alive: settings::DEFAULT_WATCH_KEEPALIVE,
            resync_interval: Some(settings::DEFAULT_WATCH_RESYNC_INTERVAL),
        }
    }
}

/// Why a watch could not start.
#[derive(Debug, Clone, Error)]
pub enum WatchError {
    /// The gateway already has its maximum number of watchers.
    #[error("the gateway already has {0} watchers")]
    TooManyWatchers(usize),
    /// The stream names more keys than allowed.
    #[error("a stream may watch at most {0} keys")]
    TooManyKeysPerStream(usize),
    /// The gateway already watches its maximum number of distinct keys.
    #[error("the gateway already watches its maximum of {0} keys")]
    TooManyWatchedKeys(usize),
    /// The stream names no key.
    #[error("no key to watch")]
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

/// Values longer than this are left out of watch events, and out of the
/// hub's memory: the event says `value_omitted` and the value's length, and
/// a `GET` of the key reads it (raw or as JSON, written piece by piece).
/// The event of a value this long is at most about 7.4 MiB (JSON escapes
/// and base64), within the default `--watch-buffer-bytes`.
pub const MAX_EVENT_VALUE_BYTES: usize = 1 << 20;

/// A key's value as the hub keeps it and its events carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchedValue {
    /// The value, at most [`MAX_EVENT_VALUE_BYTES`] long.
    Bytes(Bytes),
    /// A longer value: only its length is kept.
    Omitted(usize),
}

impl WatchedValue {
    /// The bytes, unless they were left out.
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            Self::Bytes(bytes) => Some(bytes),
            Self::Omitted(_) => None,
        }
    }
}

/// The value, or its length alone when it is over [`MAX_EVENT_VALUE_BYTES`].
impl From<Bytes> for WatchedValue {
    fn from(value: Bytes) -> Self {
        if value.len() > MAX_EVENT_VALUE_BYTES {
            Self::Omitted(value.len())
        } else {
            Self::Bytes(value)
        }
    }
}

/// What a key holds, as far as the hub knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The value; `None` when the key is absent.
    pub value: Option<WatchedValue>,
    /// The store's version: of the value, or of the delete that removed
    /// it; `None` for a key that was absent when read.
    pub version: Option<Hlc>,
    /// The id of the event that led here (see [`KeyEvent::id`]).
    pub id: Option<Hlc>,
}

/// What a watcher is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The current state: first, after a resync, or after falling behind.
    Sync {
        /// The hub re-registered after a reconnect and the key had moved.
        resync: bool,
        /// The watcher fell behind and skipped events.
        lagged: bool,
    },
    /// The key was set.
    Set,
    /// The key was deleted (DEL, VDEL or expiry).
    Delete,
    /// The hub cannot currently follow the key; a `resync` follows when it can.
    Error,
}

/// One event for the watchers of a key.
#[derive(Debug, Clone)]
pub struct KeyEvent {
    /// What happened.
    pub kind: EventKind,
    /// The key.
    pub key: Bytes,
    /// The value after the event, if the key exists.
    pub value: Option<WatchedValue>,
    /// The key's version after the event (the store's).
    pub version: Option<Hlc>,
    /// The event's identity (the SSE `id:`), strictly increasing per key
    /// while the key is watched: the store's version, unless that is not
    /// newer than the last id (a delete found only by a resync has no
    /// version; a restarted store can go back), then just after the last.
    pub id: Option<Hlc>,
    /// Why following the key failed (for [`EventKind::Error`]).
    pub error: Option<String>,
    /// The event's SSE frame, rendered once by the first watcher that sends
    /// it and shared by the others (10,000 watchers, one serialisation).
    pub rendered: OnceLock<Bytes>,
}

impl KeyEvent {
    /// What the event may come to hold: the value, its base64 and the SSE
    /// frame that carries both (rendered once, shared by every watcher).
    pub fn weight(&self) -> usize {
        let value = self
            .value
            .as_ref()
            .and_then(WatchedValue::bytes)
            .map_or(0, Bytes::len);
        let error = self.error.as_ref().map_or(0, String::len);
        // Value + base64 in the frame, plus the value itself; the key twice.
        value + 2 * (value + value.div_ceil(3) * 4) + 2 * self.key.len() + error + 256
    }

    fn sync(key: &Bytes, snapshot: &Snapshot, resync: bool, lagged: bool) -> Self {
        Self {
            kind: EventKind::Sync { resync, lagged },
            key: key.clone(),
            value: snapshot.value.clone(),
            version: snapshot.version.clone(),
            id: snapshot.id.clone(),
            error: None,
            rendered: OnceLock::new(),
        }
    }
}

#[derive(Debug, Clone)]
enum Registration {
    Pending,
    Registered,
    Failed(WatchError),
}

/// The id for the next event of a key whose last event had `last`: the
/// store's `version` when it is newer, else just after `last`.
fn next_id(last: Option<&Hlc>, version: Option<&Hlc>) -> Option<Hlc> {
    match (last, version) {
        (Some(last), Some(version)) if version > last => Some(version.clone()),
        (Some(last), _) => Some(last.successor()),
        (None, version) => version.cloned(),
    }
}

/// Whether a watcher that was last told `delivered` gets `event`: errors
/// always, anything else only if its id is newer, so no watcher ever goes
/// back (a resync older than a lagged sync is skipped like any event).
fn is_news(delivered: Option<&Hlc>, event: &KeyEvent) -> bool {
    match (event.kind, delivered, &event.id) {
        (EventKind::Error, _, _) => true,
        (_, Some(delivered), Some(id)) => id > delivered,
        _ => true,
    }
}

#[derive(Debug)]
struct KeyState {
    watchers: usize,
    snapshot: Option<Snapshot>,
    /// Bumped by every applied change, so that a GET racing with a
    /// notification can tell its answer may be stale.
    changes: u64,
    /// The slots still in the key's channel, oldest first, with their
    /// events' weights, and the sum of those weights.
    retained: VecDeque<(Arc<Slot>, usize)>,
    retained_bytes: usize,
}

/// One event in a key's channel. The channel holds at most `buffer`
/// slots, and the events in them weigh at most `buffer_bytes`: past that
/// the oldest slots are emptied. A watcher that reaches an empty slot has
/// fallen behind, as when the channel overran it, and skips to a sync.
#[derive(Debug)]
struct Slot(Mutex<Option<Arc<KeyEvent>>>);

impl Slot {
    fn event(&self) -> Option<Arc<KeyEvent>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn empty(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// The shared state of one watched key.
#[derive(Debug)]
struct KeyWatch {
    key: Bytes,
    state: Mutex<KeyState>,
    events: broadcast::Sender<Arc<Slot>>,
    registration: watch::Sender<Registration>,
    /// The channel's capacity in events, and the bytes it may hold.
    buffer: usize,
    buffer_bytes: usize,
}

impl KeyWatch {
    fn state(&self) -> MutexGuard<'_, KeyState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a change if it is newer than what the hub knows and tells
    /// the watchers. Returns whether it was applied.
    fn apply(&self, kind: EventKind, value: Option<Bytes>, version: Option<Hlc>) -> bool {
        let value = value.map(WatchedValue::from);
        let mut state = self.state();
        if let (Some(known), Some(new)) = (
            state.snapshot.as_ref().and_then(|s| s.version.as_ref()),
            version.as_ref(),
        ) && new <= known
        {
            return false;
        }
        let id = next_id(
            state.snapshot.as_ref().and_then(|s| s.id.as_ref()),
            version.as_ref(),
        );
        state.snapshot = Some(Snapshot {
            value: value.clone(),
            version: version.clone(),
            id: id.clone(),
        });
        state.changes += 1;
        // Sent under the lock, so a watcher subscribing under the same lock
        // sees each change either in its snapshot or in its channel.
        self.send(
            &mut state,
            KeyEvent {
                kind,
                key: self.key.clone(),
                value,
                version,
                id,
                error: None,
                rendered: OnceLock::new(),
            },
        );
        true
    }

    /// Tells the watchers, keeping the channel within its bytes: the
    /// oldest events are dropped (their slots emptied) first.
    fn send(&self, state: &mut KeyState, event: KeyEvent) {
        let weight = event.weight();
        let slot = Arc::new(Slot(Mutex::new(Some(Arc::new(event)))));
        state.retained.push_back((Arc::clone(&slot), weight));
        state.retained_bytes += weight;
        while state.retained.len() > self.buffer
            || (state.retained_bytes > self.buffer_bytes && state.retained.len() > 1)
        {
            let Some((old, weight)) = state.retained.pop_front() else {
                break;
            };
            state.retained_bytes -= weight;
            old.empty();
        }
        let _ = self.events.send(slot);
    }
}

/// No member holds the registrations.
const NO_HOLDER: usize = usize::MAX;

#[derive(Debug)]
struct Inner {
    store: StoreClient,
    metrics: Metrics,
    settings: WatchSettings,
    keys: Mutex<HashMap<Bytes, Arc<KeyWatch>>>,
    watchers: AtomicUsize,
    holder: AtomicUsize,
    /// Set by the dispatcher when it lost notifications: every key must be
    /// read again.
    resync_requested: AtomicBool,
    reconcile: Notify,
    shutdown: watch::Sender<bool>,
}

impl Inner {
    fn keys(&self) -> MutexGuard<'_, HashMap<Bytes, Arc<KeyWatch>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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

/// Routes the pool's notifications to the keys' watchers.
async fn dispatch(inner: Arc<Inner>, mut notifications: broadcast::Receiver<KeyNotification>) {
    loop {
        let notification = match notifications.recv().await {
            Ok(notification) => notification,
            Err(broadcast::error::RecvError::Lagged(skipped)) => {
                // We lost notifications: re-read every key.
                tracing::warn!(
                    skipped,
                    "notification dispatch fell behind; resyncing all keys"
                );
                inner.resync_requested.store(true, Ordering::Release);
                inner.reconcile.notify_one();
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        inner.metrics.notifications_received.inc();
        if notification.member != inner.holder.load(Ordering::Acquire) {
            continue;
        }
        // A version far ahead of our clock would freeze the key (every
        // real change after it looks older): not from a sane store.
        if let Some(version) = &notification.version
            && version.is_too_far_ahead_of(crate::protocol::hlc::now_ms())
        {
            tracing::warn!(%version, "dropping a notification whose version is far in the future");
            continue;
        }
        let key_watch = inner.keys().get(&notification.key).cloned();
        let Some(key_watch) = key_watch else { continue };
        let (kind, value) = match notification.notification {
            Notification::Set { value } => (EventKind::Set, Some(value)),
            Notification::Delete => (EventKind::Delete, None),
        };
        key_watch.apply(kind, value, notification.version);
    }
}

/// Keeps the store's registrations equal to the keys that have watchers.
async fn reconcile(inner: Arc<Inner>, mut member_events: broadcast::Receiver<MemberEvent>) {
    let mut shutdown = inner.shutdown.subscribe();
    let mut registered: HashSet<Bytes> = HashSet::new();
    let mut holder = NO_HOLDER;
    // The member to prefer when choosing a holder again.
    let mut last_holder = None;
    // Register and read every wanted key, not only the missing ones.
    let mut reread_all = false;
    let mut retry_after: Option<Duration> = None;
    // Consecutive failed passes; watchers hear of it from the third on
    // (about a second), so a broker restart does not flash errors.
    let mut failed_passes = 0u32;
    let resync_every = inner.settings.resync_interval;
    let mut next_resync = resync_every.map(|every| tokio::time::Instant::now() + every);
    loop {
        let retry = async {
            match retry_after {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        let resync = async {
            match next_resync {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = inner.reconcile.notified() => {}
            _ = retry => {}
            _ = resync => {
                // Registering again is idempotent; the GETs tell what moved.
                reread_all = true;
                next_resync = resync_every.map(|every| tokio::time::Instant::now() + every);
            }
            _ = shutdown.wait_for(|down| *down) => return,
            event = member_events.recv() => match event {
                Ok(MemberEvent::Subscribed { member } | MemberEvent::Down { member })
                    if member == holder => {
                    // The store dropped this client's registrations.
                    registered.clear();
                    holder = NO_HOLDER;
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // A missed event may have been the holder's reconnect.
                    registered.clear();
                    holder = NO_HOLDER;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
        if inner.resync_requested.swap(false, Ordering::AcqRel) {
            reread_all = true;
        }
        if holder == NO_HOLDER {
            inner.holder.store(NO_HOLDER, Ordering::Release);
            let Some(member) = inner.store.pool().subscribed_member(last_holder) else {
                retry_after = None; // a Subscribed event will wake us
                continue;
            };
            holder = member;
            last_holder = Some(member);
            inner.holder.store(member, Ordering::Release);
        }
        let tell_watchers = failed_passes >= 2;
        let pass = sync_registrations(&inner, holder, &mut registered, reread_all, tell_watchers);
        retry_after = match pass.await {
            Ok(()) => {
                failed_passes = 0;
                reread_all = false;
                None
            }
            Err(()) => {
                failed_passes = failed_passes.saturating_add(1);
                Some(Duration::from_millis(500))
            }
        };
    }
}

/// Store requests one reconciliation pass keeps in flight, for each of
/// its registrations and its STOPs: well inside a connection's window.
const CONCURRENT_REQUESTS: usize = 64;

/// One reconciliation pass. `Err` when some key could not be registered
/// and the pass should be retried.
async fn sync_registrations(
    inner: &Inner,
    holder: usize,
    registered: &mut HashSet<Bytes>,
    reread_all: bool,
    tell_watchers: bool,
) -> Result<(), ()> {
    let wanted: Vec<Arc<KeyWatch>> = inner.keys().values().cloned().collect();
    let wanted_keys: HashSet<&Bytes> = wanted.iter().map(|w| &w.key).collect();
    let stale: Vec<Bytes> = registered
        .iter()
        .filter(|key| !wanted_keys.contains(key))
        .cloned()
        .collect();
    for key in &stale {
        registered.remove(key);
    }
    // Sent together, and beside this pass's registrations (no key is in
    // both: a stale key is not wanted), so that 1,000 watchers leaving do
    // not hold new watches back for 1,000 round trips.
    let store = inner.store.on_member(holder);
    let stops = stream::iter(stale)
        .map(|key| store.stop(key))
        .buffer_unordered(CONCURRENT_REQUESTS)
        .for_each(|stopped| async move {
            if let Err(error) = stopped {
                tracing::debug!(%error, "KEYNOTIFY STOP failed; the registration ends with the connection");
            }
        });
    // A key whose entry was re-created (its last watcher left and a new one
    // came before the STOP) is pending again and needs its snapshot.
    let missing: Vec<Arc<KeyWatch>> = wanted
        .into_iter()
        .filter(|w| {
            reread_all
                || !registered.contains(&w.key)
                || matches!(*w.registration.borrow(), Registration::Pending)
        })
        .collect();
    let results = stream::iter(missing)
        .map(|key_watch| {
            let fresh = !registered.contains(&key_watch.key);
            async move {
                let result = register(inner, holder, &key_watch).await;
                if fresh && result.is_err() {
                    // The KEYNOTIFY may have been applied (it succeeded and
                    // the GET failed, or it timed out): nothing else would
                    // ever stop it. Harmless if it was not.
                    if let Err(error) = inner.store.on_member(holder).stop(key_watch.key.clone()).await {
                        tracing::debug!(%error, "KEYNOTIFY STOP after a failed registration failed; the registration ends with the connection");
                    }
                }
                (key_watch, result)
            }
        })
        .buffer_unordered(CONCURRENT_REQUESTS)
        .collect::<Vec<_>>();
    let ((), results) = futures_util::future::join(stops, results).await;
    let mut failed = false;
    for (key_watch, result) in results {
        match result {
            Ok(()) => {
                registered.insert(key_watch.key.clone());
                key_watch
                    .registration
                    .send_replace(Registration::Registered);
            }
            Err(error) => {
                failed = true;
                let first = matches!(*key_watch.registration.borrow(), Registration::Pending);
                if first {
                    // The watcher that is waiting answers with an HTTP error.
                    key_watch
                        .registration
                        .send_replace(Registration::Failed(error));
                } else if tell_watchers {
                    tracing::warn!(%error, "re-registering a watched key failed; retrying");
                    key_watch.send(
                        &mut key_watch.state(),
                        KeyEvent {
                            kind: EventKind::Error,
                            key: key_watch.key.clone(),
                            value: None,
                            version: None,
                            id: None,
                            error: Some(error.to_string()),
                            rendered: OnceLock::new(),
                        },
                    );
                } else {
                    tracing::debug!(%error, "re-registering a watched key failed; retrying");
                }
            }
        }
    }
    if failed { Err(()) } else { Ok(()) }
}

/// KEYNOTIFY, then GET: no change can fall between the two.
async fn register(inner: &Inner, holder: usize, key_watch: &KeyWatch) -> Result<(), WatchError> {
    let store = inner.store.on_member(holder);
    store.keynotify(key_watch.key.clone()).await?;
    let changes_before = key_watch.state().changes;
    let current = match store.get(key_watch.key.clone()).await? {
        Some(Versioned { value, version }) => Snapshot {
            id: version.clone(),
            value: Some(value.into()),
            version,
        },
        None => Snapshot {
            value: None,
            version: None,
            id: None,
        },
    };
    let mut state = key_watch.state();
    if state.changes != changes_before {
        // A notification landed while the GET was out. The registration
        // came first, so every change after it is notified: the
        // notifications are the newer word (a GET answered just before a
        // SET must not look like a store that went back).
        return Ok(());
    }
    let Some(known) = state.snapshot.clone() else {
        state.snapshot = Some(current);
        return Ok(());
    };
    let moved = match (&known.version, &current.version) {
        // Lower than what we saw: the store restarted without its data and
        // counts from an older clock. Its versions are the baseline now, or
        // every later change would look stale.
        (Some(old), Some(new)) => new != old,
        // Absent now: moved if we thought it existed. The delete's version
        // is unknown, so any later change is newer.
        (_, None) => known.value.is_some(),
        (None, Some(_)) => true,
    };
    if moved {
        // Its own id, after every id watchers saw: a watcher resuming
        // from the last SET's id still hears of a delete.
        let current = Snapshot {
            id: next_id(known.id.as_ref(), current.version.as_ref()),
            ..current
        };
        state.snapshot = Some(current.clone());
        inner.metrics.resyncs.inc();
        key_watch.send(
            &mut state,
            KeyEvent::sync(&key_watch.key, &current, true, false),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hlc(wall_ms: u64, counter: u64) -> Hlc {
        Hlc {
            wall_ms,
            counter,
            node: "StateStore".into(),
        }
    }

    fn event(kind: EventKind, id: Option<Hlc>) -> KeyEvent {
        KeyEvent {
            kind,
            key: Bytes::from_static(b"k"),
            value: None,
            version: id.clone(),
            id,
            error: None,
            rendered: OnceLock::new(),
        }
    }

    #[test]
    fn ids_follow_the_store_and_never_go_back() {
        assert_eq!(next_id(None, None), None);
        assert_eq!(next_id(None, Some(&hlc(5, 0))), Some(hlc(5, 0)));
        assert_eq!(next_id(Some(&hlc(5, 0)), Some(&hlc(7, 0))), Some(hlc(7, 0)));
        // A delete found by a resync (no version): just after the last id.
        assert_eq!(next_id(Some(&hlc(5, 0)), None), Some(hlc(5, 1)));
        // A store that went back: still after the last id.
        assert_eq!(next_id(Some(&hlc(5, 3)), Some(&hlc(2, 0))), Some(hlc(5, 4)));
    }

    #[test]
    fn a_resync_older_than_what_a_watcher_saw_is_skipped() {
        // A lagged watcher skipped to the sync of id 9, then reads an older
        // resync still in its buffer (issue 13 item 3).
        let resync = event(
            EventKind::Sync {
                resync: true,
                lagged: false,
            },
            Some(hlc(7, 0)),
        );
        assert!(!is_news(Some(&hlc(9, 0)), &resync));
        assert!(is_news(Some(&hlc(6, 0)), &resync));
        assert!(!is_news(
            Some(&hlc(7, 0)),
            &event(EventKind::Set, Some(hlc(7, 0)))
        ));
        assert!(is_news(Some(&hlc(9, 0)), &event(EventKind::Error, None)));
        assert!(is_news(None, &event(EventKind::Delete, Some(hlc(1, 0)))));
    }
}
