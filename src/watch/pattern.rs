//! Patterns followed by `GET /watch?match=<glob>`.
//!
//! The store has no wildcard KEYNOTIFY, so a pattern is followed as the
//! set of keys matching it: listed (SCAN) when its first stream arrives,
//! listed again every `rescan_interval` to find keys other clients
//! created, and told at once of keys this gateway writes (PUT, locks) that
//! match ([`Patterns::wrote`]). A written key is matched off the request
//! path, by one task, and against each pattern for at most
//! [`MATCH_STEPS_PER_BYTE`] steps per byte of pattern and key: a pattern
//! costlier to match than that, or a key written while the task is
//! [`WRITTEN_QUEUE`] keys behind, waits for the pattern's next rescan. Each followed key is an ordinary hub key: the
//! pattern holds one watcher reference on it, so a key has one KEYNOTIFY
//! whatever mix of key watchers, pattern streams and lock waiters follow
//! it. A key deleted and absent from the next rescan stops being followed;
//! one a rescan no longer lists but the hub thinks exists is read again,
//! so a lost delete notification still ends in a `delete`.
//!
//! One [`PatternWatch`] per distinct glob, shared by every stream on it,
//! with one task (its rescan loop). Streams follow its membership channel
//! ([`Membership`]): a key is announced once it is registered and read, so
//! a stream's first event for it can be a `sync` with its value.
//!
//! A pattern never follows the gateway's own records
//! ([`crate::store::reserved`]): no stream sees them, and they count
//! against no limit.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::error::WatchError;
use super::event::KeyEvent;
use super::key::{KeyWatch, PatternChannel, PatternEvent, wait_registered};
use super::reconciler::CONCURRENT_REQUESTS;
use super::shared::Inner;
use crate::protocol::glob;
use crate::store::reserved::is_reserved;

/// Events kept per key a pattern creates the entry of (a key watcher that
/// comes first gets `--watch-buffer`), for streams behind on it: a pattern
/// follows thousands of keys; a stream further behind on one key skips to
/// its latest state.
const PATTERN_KEY_BUFFER: usize = 8;

/// Steps (see [`glob::matches_counting`]) a written key may take to match
/// one pattern, per byte of the two: matching stays linear in their
/// lengths. A glob of literals and `*`s at its ends (`sensor/*`, `*/temp`)
/// takes about one step per byte.
pub(super) const MATCH_STEPS_PER_BYTE: u64 = 4;

/// Written keys waiting to be matched; past this a write is left to the
/// rescans, so that writes never wait on matching.
pub(super) const WRITTEN_QUEUE: usize = 1024;

/// Steps the matching task takes between two yields to the runtime.
const MATCH_STEPS_PER_YIELD: u64 = 1 << 16;

/// Events of its keys a pattern's channel holds before a slow stream lags
/// (it then syncs each of its keys that moved).
const PATTERN_EVENTS_BUFFER: usize = 1024;

/// Membership changes a pattern's channel holds before a slow stream
/// lags (it then re-reads the whole membership, which is always right).
const MEMBERSHIP_BUFFER: usize = 1024;

/// What a pattern's streams are told.
#[derive(Debug, Clone)]
pub(super) enum Membership {
    /// The pattern follows this key, registered and read.
    Added(Arc<KeyWatch>),
    /// The pattern no longer follows this key (deleted, and absent from a
    /// rescan). `last`: the number of the key's last event in the
    /// pattern's channel (0 if its streams were never told of it), so that
    /// a stream that has not read that far still hears of the delete.
    Removed { key_watch: Arc<KeyWatch>, last: u64 },
    /// The pattern takes no new keys (an `error` event naming the limit).
    Refused(Arc<KeyEvent>),
    /// The hub shuts down: the stream ends.
    Closing,
}

/// A stream's start on a pattern: see [`PatternWatch::subscribe`].
pub(super) struct Subscription {
    pub(super) keys: Vec<Arc<KeyWatch>>,
    pub(super) changes: broadcast::Receiver<Membership>,
    pub(super) events: broadcast::Receiver<PatternEvent>,
    /// The number of the channel's last event `events` does not get.
    pub(super) read: u64,
}

/// Where a pattern's initial listing stands.
#[derive(Debug, Clone)]
pub(super) enum Listing {
    Pending,
    Listed,
    Failed(WatchError),
}

/// A key a pattern follows: an entry of the pattern's set of keys, by
/// its bytes (which its [`KeyWatch`] holds).
#[derive(Debug)]
pub(super) struct Followed {
    pub(super) watch: Arc<KeyWatch>,
    /// The rescan during which it was added: a rescan that started before
    /// the key was added cannot tell that it is gone.
    generation: u64,
    /// Whether streams were told of it (it is registered and read).
    pub(super) announced: bool,
}

impl std::hash::Hash for Followed {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        <[u8] as std::hash::Hash>::hash(&self.watch.key, state);
    }
}

impl PartialEq for Followed {
    fn eq(&self, other: &Self) -> bool {
        self.watch.key == other.watch.key
    }
}

impl Eq for Followed {}

impl std::borrow::Borrow<[u8]> for Followed {
    fn borrow(&self) -> &[u8] {
        &self.watch.key
    }
}

#[derive(Debug, Default)]
pub(super) struct PatternState {
    /// The keys followed, each holding one watcher reference in the hub.
    pub(super) keys: HashSet<Followed>,
    /// Streams on this pattern.
    streams: usize,
    /// Counts rescans, for [`Followed::generation`].
    generation: u64,
    /// Why the pattern takes no new keys (it matched too many at its last
    /// count); its streams were told once, and a stream joining it is
    /// refused with this error, as a first stream would be.
    pub(super) over_limit: Option<WatchError>,
}

/// One followed pattern, shared by every stream on it.
#[derive(Debug)]
pub(super) struct PatternWatch {
    pub(super) glob: Bytes,
    state: Mutex<PatternState>,
    changes: broadcast::Sender<Membership>,
    /// The events of its keys, in each key's order, shared by its streams.
    pub(super) events: Arc<PatternChannel>,
    pub(super) listing: watch::Sender<Listing>,
    /// Keys this gateway wrote that match, for the pattern's task.
    written: mpsc::UnboundedSender<Bytes>,
    task: Mutex<Option<AbortHandle>>,
}

impl PatternWatch {
    pub(super) fn state(&self) -> MutexGuard<'_, PatternState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The announced keys and subscriptions to later changes and to the
    /// keys' events, taken together: every change after the list is in the
    /// channel, and every event after a key's snapshot is read.
    pub(super) fn subscribe(&self) -> Subscription {
        let state = self.state();
        let changes = self.changes.subscribe();
        let (events, read) = self.events.subscribe();
        Subscription {
            keys: announced(&state),
            changes,
            events,
            read,
        }
    }

    /// The keys the pattern follows and told its streams of.
    pub(super) fn keys(&self) -> Vec<Arc<KeyWatch>> {
        announced(&self.state())
    }

    /// Stops following `followed` (whose entries are already out of the
    /// pattern's state) and releases them in the hub.
    fn release<'a>(&self, inner: &Inner, followed: impl Iterator<Item = &'a Followed> + Clone) {
        for key in followed.clone() {
            key.watch.remove_follower(&self.events);
        }
        inner.release(followed.map(|key| &key.watch));
    }

    /// The key's entry, if the pattern follows `key` and told its
    /// streams so.
    pub(super) fn followed(&self, key: &Bytes) -> Option<Arc<KeyWatch>> {
        let state = self.state();
        let followed = state.keys.get(&key[..])?;
        followed.announced.then(|| Arc::clone(&followed.watch))
    }

    /// Whether the pattern follows `key` and told its streams so.
    pub(super) fn follows(&self, key: &Bytes) -> bool {
        self.state()
            .keys
            .get(&key[..])
            .is_some_and(|followed| followed.announced)
    }

    /// The `error` event of a pattern that takes no new keys.
    fn refusal(&self, why: &WatchError) -> Arc<KeyEvent> {
        Arc::new(KeyEvent::pattern_error(&self.glob, why.to_string()))
    }
}

fn announced(state: &PatternState) -> Vec<Arc<KeyWatch>> {
    state
        .keys
        .iter()
        .filter(|followed| followed.announced)
        .map(|followed| Arc::clone(&followed.watch))
        .collect()
}

/// The hub's followed patterns, by glob.
type PatternMap = Mutex<HashMap<Bytes, Arc<PatternWatch>>>;

fn lock(patterns: &PatternMap) -> MutexGuard<'_, HashMap<Bytes, Arc<PatternWatch>>> {
    patterns.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The followed patterns of the hub, by glob.
#[derive(Debug)]
pub(super) struct Patterns {
    inner: Arc<Inner>,
    patterns: Arc<PatternMap>,
    /// How many patterns `patterns` holds, read without its lock on every
    /// key write.
    followed: AtomicUsize,
    /// Keys this gateway wrote, for the task that matches them.
    written: mpsc::Sender<Bytes>,
}

impl Patterns {
    /// The hub's patterns, and the task that matches written keys against
    /// them (it ends with them).
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        let patterns = Arc::new(Mutex::new(HashMap::new()));
        let (written, written_keys) = mpsc::channel(WRITTEN_QUEUE);
        tokio::spawn(match_written(Arc::clone(&patterns), written_keys));
        Self {
            inner,
            patterns,
            followed: AtomicUsize::new(0),
            written,
        }
    }

    fn patterns(&self) -> MutexGuard<'_, HashMap<Bytes, Arc<PatternWatch>>> {
        lock(&self.patterns)
    }

    /// Ends the streams of every pattern: the hub shuts down.
    pub(super) fn close(&self) {
        for pattern in self.patterns().values() {
            let _ = pattern.changes.send(Membership::Closing);
        }
    }

    /// Adds a stream to each of `globs` (distinct), creating each pattern
    /// not yet followed (and starting its task, which lists it). All or
    /// none: refused, taking nothing, when the new ones would make more
    /// than `max_patterns`; counted and taken under the map's lock, so
    /// that streams arriving together cannot overshoot.
    pub(super) fn follow(&self, globs: &[Bytes]) -> Result<Vec<Arc<PatternWatch>>, WatchError> {
        let max = self.inner.settings.max_patterns;
        let mut patterns = self.patterns();
        let new = globs
            .iter()
            .filter(|glob| !patterns.contains_key(*glob))
            .count();
        if new > 0 && patterns.len() + new > max {
            return Err(WatchError::TooManyPatterns(max));
        }
        Ok(globs
            .iter()
            .map(|glob| self.join(&mut patterns, glob))
            .collect())
    }

    /// Adds a stream to `glob` in `patterns`, creating the pattern (and
    /// starting its task) when it is the first.
    fn join(
        &self,
        patterns: &mut HashMap<Bytes, Arc<PatternWatch>>,
        glob: &Bytes,
    ) -> Arc<PatternWatch> {
        let pattern = patterns.entry(glob.clone()).or_insert_with(|| {
            self.followed.fetch_add(1, Ordering::Relaxed);
            self.inner.metrics.watch_patterns.inc();
            let (written, written_keys) = mpsc::unbounded_channel();
            let pattern = Arc::new(PatternWatch {
                glob: glob.clone(),
                state: Mutex::new(PatternState::default()),
                changes: broadcast::channel(MEMBERSHIP_BUFFER).0,
                events: Arc::new(PatternChannel::new(PATTERN_EVENTS_BUFFER)),
                listing: watch::Sender::new(Listing::Pending),
                written,
                task: Mutex::new(None),
            });
            let task = tokio::spawn(follow(
                Arc::clone(&self.inner),
                Arc::clone(&pattern),
                written_keys,
            ));
            *pattern.task.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(task.abort_handle());
            pattern
        });
        pattern.state().streams += 1;
        Arc::clone(pattern)
    }

    /// Removes a stream from `pattern`; the last one stops its task and
    /// releases its keys.
    // A `Followed` is hashed by its key's bytes, which never change.
    #[allow(clippy::mutable_key_type)]
    pub(super) fn unfollow(&self, pattern: &PatternWatch) {
        let mut patterns = self.patterns();
        let keys = {
            let mut state = pattern.state();
            state.streams -= 1;
            if state.streams > 0 {
                return;
            }
            std::mem::take(&mut state.keys)
        };
        patterns.remove(&pattern.glob);
        self.followed.fetch_sub(1, Ordering::Relaxed);
        drop(patterns);
        self.inner.metrics.watch_patterns.dec();
        if let Some(task) = pattern
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
        self.inner.metrics.watch_pattern_keys.sub(keys.len() as i64);
        pattern.release(&self.inner, keys.iter());
    }

    /// Hands `key`, which this gateway just wrote, to the task that tells
    /// the patterns matching it, so that they follow it without waiting
    /// for a rescan. Costs an atomic load when no pattern is followed, and
    /// never waits: a key the task has no room for is left to the rescans.
    pub(super) fn wrote(&self, key: &Bytes) {
        if self.followed.load(Ordering::Relaxed) == 0 {
            return;
        }
        if self.written.try_send(key.clone()).is_err() {
            tracing::debug!("written keys wait to be matched; the next rescans find this one");
        }
    }
}

/// The task that matches keys this gateway wrote against the followed
/// patterns, each for at most [`MATCH_STEPS_PER_BYTE`] steps per byte, and
/// hands each pattern the keys that match and it does not follow yet.
/// Yields between patterns after [`MATCH_STEPS_PER_YIELD`] steps. Ends
/// when the hub's patterns are dropped.
async fn match_written(patterns: Arc<PatternMap>, mut written: mpsc::Receiver<Bytes>) {
    let mut steps = 0;
    while let Some(key) = written.recv().await {
        let followed: Vec<Arc<PatternWatch>> = lock(&patterns).values().cloned().collect();
        for pattern in followed {
            let budget = MATCH_STEPS_PER_BYTE * (pattern.glob.len() + key.len()) as u64;
            // Past the budget: left to the pattern's rescans.
            let matched = glob::matches_within(&pattern.glob, &key, budget);
            steps += matched.map_or(budget, |_| pattern.glob.len() as u64);
            if matched == Some(true) && !pattern.state().keys.contains(&key[..]) {
                let _ = pattern.written.send(key.clone());
            }
            if steps >= MATCH_STEPS_PER_YIELD {
                steps = 0;
                tokio::task::yield_now().await;
            }
        }
    }
}

/// A pattern's task: the initial listing, then a rescan every
/// `rescan_interval` and the keys this gateway wrote as they come. Ends
/// when the last stream leaves (aborted) or the hub shuts down.
async fn follow(
    inner: Arc<Inner>,
    pattern: Arc<PatternWatch>,
    mut written: mpsc::UnboundedReceiver<Bytes>,
) {
    match rescan(&inner, &pattern, true).await {
        Ok(()) => {
            pattern.listing.send_replace(Listing::Listed);
        }
        Err(error) => {
            pattern.listing.send_replace(Listing::Failed(error));
            return;
        }
    }
    let mut shutdown = inner.shutdown.subscribe();
    let every = inner.settings.rescan_interval;
    let mut next = Instant::now() + every;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {
                if let Err(error) = rescan(&inner, &pattern, false).await {
                    // The keys followed still get their events; the next
                    // rescan tries again.
                    tracing::warn!(%error, "rescanning a followed pattern failed");
                }
                next = Instant::now() + every;
            }
            key = written.recv() => {
                let Some(key) = key else { return };
                let mut keys = HashSet::from([key]);
                while let Ok(key) = written.try_recv() {
                    keys.insert(key);
                }
                let generation = pattern.state().generation;
                if let Err(error) = add(&inner, &pattern, keys, generation, false).await {
                    tracing::debug!(%error, "following a key written through the gateway failed; the next rescan tries again");
                }
            }
            () = async {
                // An error means the hub is gone: end too.
                let _ = shutdown.wait_for(|down| *down).await;
            } => return,
        }
    }
}

/// Lists the pattern (SCAN, every page), follows the keys it does not yet
/// follow and stops following keys that were deleted and are no longer
/// listed. `initial`: a failure is the first stream's error; afterwards a
/// limit reached is an `error` event.
async fn rescan(inner: &Inner, pattern: &PatternWatch, initial: bool) -> Result<(), WatchError> {
    let started = Instant::now();
    let limit = inner.settings.max_keys_per_pattern;
    let generation = {
        let mut state = pattern.state();
        state.generation += 1;
        state.generation
    };
    let mut found = HashSet::new();
    let mut token = None;
    let mut over_limit = false;
    loop {
        let page = inner.store.scan(pattern.glob.clone(), token).await?;
        found.extend(page.keys.into_iter().filter(|key| !is_reserved(key)));
        if found.len() > limit {
            over_limit = true;
            break;
        }
        token = page.token;
        if token.is_none() {
            break;
        }
    }
    inner.metrics.watch_rescans.inc();
    if over_limit {
        let why = WatchError::TooManyKeysPerPattern(limit);
        if initial {
            return Err(why);
        }
        // Keeps what it follows; tells its streams once per crossing.
        let mut state = pattern.state();
        if state.over_limit.is_none() {
            state.over_limit = Some(why.clone());
            tracing::warn!(
                limit,
                "a followed pattern matches more keys than allowed; it takes no new keys"
            );
            let _ = pattern
                .changes
                .send(Membership::Refused(pattern.refusal(&why)));
        }
        observe(inner, started);
        return Ok(());
    }
    // Followed since before this rescan and not listed: released if the
    // hub knows it deleted; read again if it thinks it exists. Listed
    // while the hub thinks it deleted: read again too.
    let (gone, misread): (Vec<Followed>, Vec<Arc<KeyWatch>>) = {
        let mut state = pattern.state();
        state.over_limit = None;
        let mut gone = Vec::new();
        let mut misread = Vec::new();
        for followed in &state.keys {
            let key = &followed.watch.key;
            if followed.generation >= generation {
                continue;
            }
            let exists = followed
                .watch
                .state()
                .snapshot
                .as_ref()
                .map(|snapshot| snapshot.value.is_some());
            match (found.contains(&key[..]), exists) {
                (false, Some(false)) => gone.push(key.clone()),
                // Announced: registered and read, so not racing its first GET.
                (false, Some(true)) | (true, Some(false)) if followed.announced => {
                    misread.push(Arc::clone(&followed.watch));
                }
                _ => {}
            }
        }
        found.retain(|key| !state.keys.contains(&key[..]));
        let gone = gone
            .iter()
            .filter_map(|key| state.keys.take(&key[..]))
            .collect();
        (gone, misread)
    };
    if !gone.is_empty() {
        inner.metrics.watch_pattern_keys.sub(gone.len() as i64);
        for followed in &gone {
            let last = if followed.announced {
                followed.watch.last_event_in(&pattern.events)
            } else {
                0
            };
            let _ = pattern.changes.send(Membership::Removed {
                key_watch: Arc::clone(&followed.watch),
                last,
            });
        }
        pattern.release(inner, gone.iter());
    }
    if reread(inner, misread).await {
        // The store lost notifications: it may have lost the registrations
        // too (a store restarted empty keeps no KEYNOTIFY), so that the
        // key's next write would go unheard. Register every key again.
        inner.resync_requested.store(true, Ordering::Release);
        inner.reconcile.notify_one();
    }
    let added = add(inner, pattern, found, generation, initial).await;
    observe(inner, started);
    added
}

/// Reads again keys a rescan no longer lists that the hub thinks exist,
/// and keys it lists that the hub thinks deleted: a notification was lost
/// (a broker dropping a burst of them, a store that restarted empty), or
/// the listing raced a write. One found gone gets its `delete` now and is
/// released by the next rescan, so that streams take the event before the
/// key leaves them; one that moved gets a resync `sync`. A failed read is
/// left for the next rescan. Returns whether any key had moved.
async fn reread(inner: &Inner, keys: Vec<Arc<KeyWatch>>) -> bool {
    let moved = AtomicBool::new(false);
    let moved_ref = &moved;
    stream::iter(keys)
        .map(|key_watch| async move {
            let changes_before = key_watch.state().changes;
            let read = inner.store.get(key_watch.key.clone()).await;
            (key_watch, changes_before, read)
        })
        .buffer_unordered(CONCURRENT_REQUESTS)
        .for_each(|(key_watch, changes_before, read)| async move {
            match read {
                Ok(read) => {
                    if key_watch.reread(read, changes_before, true) {
                        inner.metrics.resyncs.inc();
                        moved_ref.store(true, Ordering::Relaxed);
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "reading a key a rescan no longer lists failed; the next rescan tries again");
                }
            }
        })
        .await;
    moved.into_inner()
}

fn observe(inner: &Inner, started: Instant) {
    inner
        .metrics
        .watch_rescan_duration
        .observe(started.elapsed().as_secs_f64());
}

/// Follows `keys` (which match the pattern): each gets a watcher
/// reference in the hub, is registered (KEYNOTIFY, GET) and is announced.
/// `initial`: a limit reached or a failed registration is the first
/// stream's error; afterwards a limit reached is an `error` event and a
/// failed key is left for the next rescan.
async fn add(
    inner: &Inner,
    pattern: &PatternWatch,
    keys: HashSet<Bytes>,
    generation: u64,
    initial: bool,
) -> Result<(), WatchError> {
    let settings = &inner.settings;
    let attached: Vec<Arc<KeyWatch>> = {
        let mut state = pattern.state();
        let keys: Vec<Bytes> = keys
            .into_iter()
            .filter(|key| !state.keys.contains(&key[..]))
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let refused = if state.keys.len() + keys.len() > settings.max_keys_per_pattern {
            Some(WatchError::TooManyKeysPerPattern(
                settings.max_keys_per_pattern,
            ))
        } else {
            let hub_keys = inner.keys();
            let new = keys
                .iter()
                .filter(|key| !hub_keys.contains(&key[..]))
                .count();
            (hub_keys.len() + new > settings.max_watched_keys)
                .then_some(WatchError::TooManyWatchedKeys(settings.max_watched_keys))
        };
        if let Some(why) = refused {
            if initial {
                return Err(why);
            }
            if state.over_limit.is_none() {
                state.over_limit = Some(why.clone());
                tracing::warn!(%why, "a followed pattern takes no new keys");
                let _ = pattern
                    .changes
                    .send(Membership::Refused(pattern.refusal(&why)));
            }
            return Ok(());
        }
        // Attached and recorded under the pattern's lock: if the last
        // stream leaves meanwhile, it releases exactly what is recorded.
        keys.into_iter()
            .map(|key| {
                let watch = inner.attach(&key, PATTERN_KEY_BUFFER);
                watch.add_follower(&pattern.events);
                state.keys.insert(Followed {
                    watch: Arc::clone(&watch),
                    generation,
                    announced: false,
                });
                watch
            })
            .collect()
    };
    inner.metrics.watch_pattern_keys.add(attached.len() as i64);
    inner.reconcile.notify_one();
    let deadline = Instant::now() + inner.register_timeout();
    let mut first_error = None;
    for watch in attached {
        match wait_registered(
            &watch,
            &inner.registered,
            deadline,
            inner.register_timeout(),
        )
        .await
        {
            Ok(()) => {
                let mut state = pattern.state();
                if let Some(mut followed) = state.keys.take(&watch.key[..]) {
                    followed.announced = true;
                    state.keys.insert(followed);
                    let _ = pattern.changes.send(Membership::Added(watch));
                }
            }
            Err(error) => {
                let removed = pattern.state().keys.take(&watch.key[..]);
                if let Some(followed) = removed {
                    inner.metrics.watch_pattern_keys.dec();
                    pattern.release(inner, std::iter::once(&followed));
                }
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        Some(error) if initial => Err(error),
        Some(error) => {
            tracing::debug!(%error, "following a key of a pattern failed; the next rescan tries again");
            Ok(())
        }
        None => Ok(()),
    }
}
