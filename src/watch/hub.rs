//! The hub's handle, which admits watchers, and the watcher, one stream of
//! events for a set of keys.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use tokio::sync::{Notify, watch};
use tokio_stream::StreamMap;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use super::error::WatchError;
use super::event::{EventKind, KeyEvent, is_news};
use super::key::{KeyWatch, Slot, wait_registered};
use super::pattern::{Listing, Membership, PatternWatch, Patterns};
use super::reconciler::{dispatch, reconcile};
use super::settings::WatchSettings;
use super::shared::{Inner, NO_HOLDER};
use crate::metrics::Metrics;
use crate::mqtt::PoolError;
use crate::protocol::Hlc;
use crate::store::{RequestError, StoreClient};

/// Whether a stream may see a key: asked of every key a stream's patterns
/// bring and of every event before it is delivered (so a key that stops
/// being readable goes silent at once).
pub type ReadFilter = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

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
        self.follow(keys, Vec::new(), last_version, None).await
    }

    /// Starts watching `keys` and every key matching `patterns`: returns
    /// once every key is registered with the store and every pattern is
    /// listed, so that the caller can still answer with an HTTP error.
    ///
    /// `last_version` is the client's `Last-Event-ID`: on a stream of one
    /// key, a key whose version is not newer gets no initial sync (any
    /// other stream always gets every key's sync).
    ///
    /// With `readable`, the stream follows only the pattern keys it allows
    /// (others are neither told of nor counted in `listed`), and is told
    /// nothing of a key it no longer allows. `keys` are the caller's to
    /// check.
    pub async fn follow(
        &self,
        keys: Vec<Bytes>,
        patterns: Vec<Bytes>,
        last_version: Option<Hlc>,
        readable: Option<ReadFilter>,
    ) -> Result<Watcher, WatchError> {
        let settings = &self.inner.settings;
        if keys.is_empty() && patterns.is_empty() {
            return Err(WatchError::NoKeys);
        }
        if keys.len() + patterns.len() > settings.max_keys_per_stream {
            return Err(WatchError::TooManyKeysPerStream(
                settings.max_keys_per_stream,
            ));
        }
        if patterns.len() > MAX_PATTERNS_PER_STREAM {
            return Err(WatchError::TooManyKeysPerStream(MAX_PATTERNS_PER_STREAM));
        }
        if keys.iter().chain(&patterns).any(Bytes::is_empty) {
            return Err(WatchError::EmptyKey);
        }
        // A key or pattern named twice is followed once.
        let mut unique = HashSet::new();
        let keys: Vec<Bytes> = keys
            .into_iter()
            .filter(|key| unique.insert(key.clone()))
            .collect();
        let mut unique = HashSet::new();
        let patterns: Vec<Bytes> = patterns
            .into_iter()
            .filter(|pattern| unique.insert(pattern.clone()))
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
        // From here on the guard undoes the admission, key and pattern counts.
        let mut watcher = Watcher {
            hub: Arc::clone(&self.inner),
            registry: Arc::clone(&self.patterns),
            cursors: HashMap::with_capacity(keys.len()),
            events: StreamMap::with_capacity(keys.len()),
            patterns: Vec::with_capacity(patterns.len()),
            membership: StreamMap::with_capacity(patterns.len()),
            pending: VecDeque::new(),
            shutdown: {
                let mut shutdown = self.inner.shutdown.subscribe();
                Box::pin(async move {
                    // An error means the hub is gone: shut down too.
                    let _ = shutdown.wait_for(|down| *down).await;
                })
            },
            shut_down: false,
            readable,
        };
        for key in &keys {
            let key_watch = self.inner.attach(key, settings.buffer);
            let receiver = key_watch.events.subscribe();
            watcher
                .events
                .insert(key.clone(), BroadcastStream::new(receiver));
            watcher.cursors.insert(
                key.clone(),
                Cursor {
                    watch: key_watch,
                    delivered: None,
                    named: true,
                    patterns: 0,
                    announced: true,
                },
            );
        }
        for pattern in &patterns {
            watcher.patterns.push(self.patterns.follow(pattern));
        }
        self.inner.reconcile.notify_one();
        let deadline = tokio::time::Instant::now() + settings.register_timeout;
        for key in &keys {
            wait_registered(
                &watcher.cursors[key].watch,
                deadline,
                settings.register_timeout,
            )
            .await?;
        }
        for pattern in &watcher.patterns {
            wait_listed(pattern, deadline, settings.register_timeout).await?;
            // Past its limit the pattern follows only some of its keys: a
            // stream joining it is refused, as a first stream would be.
            if let Some(why) = pattern.state().over_limit.clone() {
                return Err(why);
            }
        }
        // One id cannot say what a stream of several keys saw of each (events
        // of different keys are not in version order): resume single keys.
        let last_version = last_version.filter(|_| keys.len() == 1 && patterns.is_empty());
        for key in &keys {
            let Some(cursor) = watcher.cursors.get_mut(key) else {
                continue;
            };
            let snapshot = cursor.watch.state().snapshot.clone();
            let Some(snapshot) = snapshot else { continue };
            // Only the very state the client saw is skipped: an id the hub
            // never gave this state (an older one, or a newer one from before
            // a store restart) gets the sync.
            let seen = last_version.is_some() && last_version == snapshot.id;
            cursor.delivered = snapshot.id.clone();
            if !seen {
                watcher.pending.push_back(Arc::new(KeyEvent::sync(
                    &cursor.watch.key,
                    &snapshot,
                    false,
                    false,
                )));
            }
        }
        for index in 0..watcher.patterns.len() {
            let pattern = Arc::clone(&watcher.patterns[index]);
            let (members, changes) = pattern.subscribe();
            watcher
                .membership
                .insert(index, BroadcastStream::new(changes));
            let mut existing = 0;
            for key_watch in members {
                if watcher.add_to_pattern(index, key_watch) {
                    existing += 1;
                }
            }
            watcher.pending.push_back(Arc::new(KeyEvent {
                kind: EventKind::Listed { keys: existing },
                key: pattern.glob.clone(),
                value: None,
                version: None,
                id: None,
                error: None,
                rendered: OnceLock::new(),
            }));
        }
        Ok(watcher)
    }

    /// Tells the followed patterns that match `key` that this gateway just
    /// wrote it (PUT, a lock), so that they follow it now rather than at
    /// their next rescan. An atomic load when no pattern is followed.
    pub fn wrote(&self, key: &Bytes) {
        self.patterns.wrote(key);
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

/// Patterns one stream may follow (a key records which of its stream's
/// patterns follow it in one `u64`).
const MAX_PATTERNS_PER_STREAM: usize = 64;

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

#[derive(Debug)]
struct Cursor {
    watch: Arc<KeyWatch>,
    /// The newest version this watcher was told about.
    delivered: Option<Hlc>,
    /// The stream named the key: it holds one of the key's watcher
    /// references (a pattern's keys are held by the pattern).
    named: bool,
    /// The stream's patterns that follow the key, one bit per pattern.
    patterns: u64,
    /// Whether the stream was told of the key: its first event is a
    /// `sync`, and a pattern's key that does not exist is not told of
    /// until it does.
    announced: bool,
}

/// One open stream of events for a set of keys and patterns.
pub struct Watcher {
    hub: Arc<Inner>,
    /// The hub's patterns, which the stream's patterns are released to.
    registry: Arc<Patterns>,
    cursors: HashMap<Bytes, Cursor>,
    /// Each key's events, by key.
    events: StreamMap<Bytes, BroadcastStream<Arc<Slot>>>,
    /// The patterns followed, and their membership changes by index.
    patterns: Vec<Arc<PatternWatch>>,
    membership: StreamMap<usize, BroadcastStream<Membership>>,
    pending: VecDeque<Arc<KeyEvent>>,
    /// Resolves when the gateway shuts down. One future for the watcher's
    /// life: making a new one per event registered and unregistered
    /// 10,000 waiters on one lock for every event of a fan-out.
    shutdown: BoxFuture<'static, ()>,
    shut_down: bool,
    /// Which keys the stream may see; `None`: all.
    readable: Option<ReadFilter>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("keys", &self.cursors.len())
            .field("patterns", &self.patterns.len())
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
            if let Some(event) = self.pending.pop_front() {
                // A pattern's own events name the pattern, not a key.
                let of_key = !matches!(
                    event.kind,
                    EventKind::Listed { .. } | EventKind::PatternError
                );
                if of_key && !self.may_read(&event.key) {
                    continue;
                }
                self.hub.metrics.events_delivered.inc();
                return Some(event);
            }
            if self.shut_down {
                return None;
            }
            let (key, item) = tokio::select! {
                biased;
                () = &mut self.shutdown => {
                    self.shut_down = true;
                    return None;
                }
                Some((index, change)) = self.membership.next() => {
                    self.follow_change(index, change);
                    continue;
                }
                item = self.events.next() => match item {
                    Some(item) => item,
                    // Only patterns, none of whose keys exist yet.
                    None if !self.membership.is_empty() => {
                        let (index, change) = self.membership.next().await?;
                        self.follow_change(index, change);
                        continue;
                    }
                    None => return None,
                },
            };
            if !self.may_read(&key) {
                continue;
            }
            let Some(cursor) = self.cursors.get_mut(&key) else {
                continue;
            };
            // An emptied slot was dropped for the key's byte budget: this
            // watcher is behind, exactly as when the channel overran it.
            let skipped = match item {
                Ok(slot) => match slot.event() {
                    Some(event) => Ok(event),
                    None => Err(1),
                },
                Err(BroadcastStreamRecvError::Lagged(skipped)) => Err(skipped),
            };
            let mut event = match skipped {
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
            if !cursor.announced {
                // A pattern's key the stream has not heard of: not until it
                // exists, and then first as a sync.
                if event.kind == EventKind::Error || event.value.is_none() {
                    continue;
                }
                if !matches!(event.kind, EventKind::Sync { .. }) {
                    event = Arc::new(KeyEvent {
                        kind: EventKind::Sync {
                            resync: false,
                            lagged: false,
                        },
                        key: event.key.clone(),
                        value: event.value.clone(),
                        version: event.version.clone(),
                        id: event.id.clone(),
                        error: None,
                        rendered: OnceLock::new(),
                    });
                }
                cursor.announced = true;
            }
            if event.kind != EventKind::Error && event.id.is_some() {
                cursor.delivered.clone_from(&event.id);
            }
            self.hub.metrics.events_delivered.inc();
            return Some(event);
        }
    }

    /// Applies a change of the membership of the pattern at `index`.
    fn follow_change(
        &mut self,
        index: usize,
        change: Result<Membership, BroadcastStreamRecvError>,
    ) {
        match change {
            Ok(Membership::Added(key_watch)) => {
                self.add_to_pattern(index, key_watch);
            }
            Ok(Membership::Removed(key)) => self.remove_from_pattern(index, &key),
            Ok(Membership::Refused(event)) => self.pending.push_back(event),
            Err(BroadcastStreamRecvError::Lagged(_)) => {
                // Changes were lost: the pattern's membership now is the
                // word. Adding is idempotent; keys it left are dropped.
                let pattern = Arc::clone(&self.patterns[index]);
                let bit = 1 << index;
                let gone: Vec<Bytes> = self
                    .cursors
                    .iter()
                    .filter(|(key, cursor)| cursor.patterns & bit != 0 && !pattern.follows(key))
                    .map(|(key, _)| key.clone())
                    .collect();
                for key in gone {
                    self.remove_from_pattern(index, &key);
                }
                let (members, _) = pattern.subscribe();
                for key_watch in members {
                    self.add_to_pattern(index, key_watch);
                }
            }
        }
    }

    /// Whether the stream may see `key`.
    fn may_read(&self, key: &[u8]) -> bool {
        self.readable.as_ref().is_none_or(|readable| readable(key))
    }

    /// Follows `key_watch` for the pattern at `index` if the stream may see
    /// it; a key new to the stream that exists gets its `sync` now. Returns
    /// whether it was followed and exists.
    fn add_to_pattern(&mut self, index: usize, key_watch: Arc<KeyWatch>) -> bool {
        if !self.may_read(&key_watch.key) {
            return false;
        }
        let bit = 1 << index;
        if let Some(cursor) = self.cursors.get_mut(&key_watch.key) {
            cursor.patterns |= bit;
            let snapshot = cursor.watch.state().snapshot.clone();
            let exists = snapshot.as_ref().is_some_and(|s| s.value.is_some());
            if !cursor.announced
                && let Some(snapshot) = snapshot.filter(|_| exists)
            {
                cursor.announced = true;
                cursor.delivered.clone_from(&snapshot.id);
                self.pending.push_back(Arc::new(KeyEvent::sync(
                    &cursor.watch.key,
                    &snapshot,
                    false,
                    false,
                )));
            }
            return exists;
        }
        // Subscribed under the key's lock, which changes are sent under:
        // each change is in the snapshot or in the channel.
        let (receiver, snapshot) = {
            let state = key_watch.state();
            (key_watch.events.subscribe(), state.snapshot.clone())
        };
        let key = key_watch.key.clone();
        let mut cursor = Cursor {
            watch: key_watch,
            delivered: None,
            named: false,
            patterns: bit,
            announced: false,
        };
        let exists = match snapshot {
            Some(snapshot) if snapshot.value.is_some() => {
                cursor.announced = true;
                cursor.delivered.clone_from(&snapshot.id);
                self.pending
                    .push_back(Arc::new(KeyEvent::sync(&key, &snapshot, false, false)));
                true
            }
            _ => false,
        };
        self.events
            .insert(key.clone(), BroadcastStream::new(receiver));
        self.cursors.insert(key, cursor);
        exists
    }

    /// The pattern at `index` no longer follows `key`; neither does the
    /// stream unless it named it or another of its patterns follows it.
    fn remove_from_pattern(&mut self, index: usize, key: &Bytes) {
        let Some(cursor) = self.cursors.get_mut(key) else {
            return;
        };
        cursor.patterns &= !(1 << index);
        if cursor.patterns == 0 && !cursor.named {
            // A key leaves a pattern once it is gone; its `delete` may still
            // sit unread in the key's channel, which goes with it: a stream
            // told of the key hears of the delete before it leaves.
            if let Some(cursor) = self.cursors.remove(key)
                && cursor.announced
                && let Some(snapshot) = cursor.watch.state().snapshot.clone()
                && snapshot.value.is_none()
            {
                let event = KeyEvent::delete(key, snapshot.version, snapshot.id);
                if is_news(cursor.delivered.as_ref(), &event) {
                    self.pending.push_back(Arc::new(event));
                }
            }
            self.events.remove(key);
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let hub = &self.hub;
        hub.watchers.fetch_sub(1, Ordering::AcqRel);
        hub.metrics.watchers.dec();
        hub.release(
            self.cursors
                .values()
                .filter(|cursor| cursor.named)
                .map(|cursor| &cursor.watch),
        );
        for pattern in &self.patterns {
            self.registry.unfollow(pattern);
        }
    }
}
