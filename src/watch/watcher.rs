//! The reading side of a watch: one stream's events for the keys it names
//! and the keys its patterns bring, read from their channels through a
//! cursor per key (what the stream was told, so it never goes back) and a
//! queue of what to send before reading the channels again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::StreamExt as _;
use tokio_stream::StreamMap;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use super::event::{EventKind, KeyEvent};
use super::key::{KeyWatch, PatternEvent, Slot, WatchedKey};
use super::pattern::{Membership, PatternWatch, Patterns};
use super::shared::Inner;
use crate::protocol::Hlc;

/// Whether a stream may see a key: asked of every key a stream's patterns
/// bring and of every event before it is delivered (so a key that stops
/// being readable goes silent at once).
pub type ReadFilter = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// What a stream knows of one key it follows.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    /// The sequence number ([`Slot::seq`]) of the key's newest event this
    /// watcher was told about, or of the snapshot it was synced from.
    delivered: u64,
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

/// A stream's cursors by key: the first one inline, the others in a
/// boxed table. Most streams follow one key, and a table of one costs 152
/// bytes (a fan-out to 10,000 streams pays that 10,000 times); boxed, the
/// table costs such a stream 8 bytes rather than 48.
#[derive(Debug, Default)]
struct Cursors {
    first: Option<(WatchedKey, Cursor)>,
    #[allow(clippy::box_collection)] // see above
    others: Option<Box<HashMap<WatchedKey, Cursor>>>,
}

impl Cursors {
    /// Room for `keys` without growing.
    fn with_capacity(keys: usize) -> Self {
        Self {
            first: None,
            others: (keys > 1).then(|| Box::new(HashMap::with_capacity(keys - 1))),
        }
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.others.as_ref().map_or(0, |others| others.len())
    }

    fn iter(&self) -> impl Iterator<Item = (&WatchedKey, &Cursor)> {
        self.first
            .iter()
            .map(|(watched, cursor)| (watched, cursor))
            .chain(self.others.iter().flat_map(|others| others.iter()))
    }

    fn keys(&self) -> impl Iterator<Item = &WatchedKey> {
        self.iter().map(|(watched, _)| watched)
    }

    fn get_key_value(&self, key: &[u8]) -> Option<(&WatchedKey, &Cursor)> {
        match &self.first {
            Some((watched, cursor)) if *watched.0.key == *key => Some((watched, cursor)),
            _ => self.others.as_ref()?.get_key_value(key),
        }
    }

    fn get(&self, key: &[u8]) -> Option<&Cursor> {
        self.get_key_value(key).map(|(_, cursor)| cursor)
    }

    fn contains_key(&self, key: &[u8]) -> bool {
        self.get_key_value(key).is_some()
    }

    fn get_mut(&mut self, key: &[u8]) -> Option<&mut Cursor> {
        match &mut self.first {
            Some((watched, cursor)) if *watched.0.key == *key => Some(cursor),
            _ => self.others.as_mut()?.get_mut(key),
        }
    }

    /// Sets the cursor of `watched`'s key, replacing any it had (and, as a
    /// map does, keeping the entry's key).
    fn insert(&mut self, watched: WatchedKey, cursor: Cursor) {
        match &mut self.first {
            Some((first, kept)) if first.0.key == watched.0.key => *kept = cursor,
            Some(_) => {
                self.others.get_or_insert_default().insert(watched, cursor);
            }
            None => match &mut self.others {
                Some(others) if others.contains_key(&watched.0.key[..]) => {
                    others.insert(watched, cursor);
                }
                _ => self.first = Some((watched, cursor)),
            },
        }
    }

    fn remove_entry(&mut self, key: &[u8]) -> Option<(WatchedKey, Cursor)> {
        match &self.first {
            Some((watched, _)) if *watched.0.key == *key => self.first.take(),
            _ => self.others.as_mut()?.remove_entry(key),
        }
    }

    /// Keeps the cursors `keep` says to, and gives the table's spare room
    /// back.
    fn retain(&mut self, mut keep: impl FnMut(&Cursor) -> bool) {
        if self.first.as_ref().is_some_and(|(_, cursor)| !keep(cursor)) {
            self.first = None;
        }
        if let Some(others) = &mut self.others {
            others.retain(|_, cursor| keep(cursor));
            others.shrink_to_fit();
        }
    }
}

/// Room the queue of events to send of a stream with patterns keeps once
/// empty.
const PENDING_KEPT: usize = 16;

/// What a stream sends before reading its channels again.
#[derive(Debug)]
enum Pending {
    Event(Arc<KeyEvent>),
    /// A key's `sync`, read from the key's state when it is sent, so that
    /// a stream's initial picture is not a copy of every key's value.
    Sync(Arc<KeyWatch>),
    /// A key's `lagged` sync, read from its state when it is sent (the
    /// stream fell behind its pattern's channel).
    Lagged(Arc<KeyWatch>),
}

/// One open stream of events for a set of keys and patterns.
///
/// A stream on one pattern keeps nothing per key once it has read past
/// every state it was told of: a cursor is needed only while the
/// pattern's channel may still hold events older than what the stream
/// synced. When the channel has nothing more to give, every later event is
/// newer, and the cursors of the keys it was told of are dropped (a key
/// that does not exist yet keeps its cursor until its first `sync`). A
/// stream of several patterns keeps its cursors: they tell which of its
/// patterns follow a key, so that it hears of the key once.
pub struct Watcher {
    hub: Arc<Inner>,
    /// The hub's patterns, which the stream's patterns are released to.
    registry: Arc<Patterns>,
    cursors: Cursors,
    /// On a stream of one pattern: cursors of keys it was told of were
    /// added since the stream last dropped them.
    prune: bool,
    /// On a stream of one pattern: its keys the stream may not read,
    /// whose events it must not take for keys it was told of.
    /// Boxed: most streams never hide a key, and every stream holds this.
    #[allow(clippy::box_collection)] // 8 bytes inline rather than 48
    hidden: Option<Box<HashSet<Bytes>>>,
    /// Each key's events, by key.
    events: StreamMap<Bytes, BroadcastStream<Option<Arc<Slot>>>>,
    /// The patterns followed, and their membership changes and their keys'
    /// events by index.
    patterns: Vec<Arc<PatternWatch>>,
    membership: StreamMap<usize, BroadcastStream<Membership>>,
    pattern_events: StreamMap<usize, BroadcastStream<PatternEvent>>,
    /// The number of the last event of each pattern's channel the stream
    /// read: the keys whose last event is later moved since.
    read: Vec<u64>,
    pending: VecDeque<Pending>,
    /// A channel told the hub shuts down (see
    /// [`WatchHub::shutdown`](super::WatchHub::shutdown)).
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
    /// An admitted stream that follows nothing yet, with room for `keys`
    /// named keys and `patterns` patterns; its drop undoes the admission.
    pub(super) fn new(
        hub: Arc<Inner>,
        registry: Arc<Patterns>,
        keys: usize,
        patterns: usize,
        readable: Option<ReadFilter>,
    ) -> Self {
        Self {
            hub,
            registry,
            cursors: Cursors::with_capacity(keys),
            prune: false,
            hidden: None,
            events: StreamMap::with_capacity(keys),
            patterns: Vec::with_capacity(patterns),
            membership: StreamMap::with_capacity(patterns),
            pattern_events: StreamMap::with_capacity(patterns),
            read: Vec::with_capacity(patterns),
            pending: VecDeque::new(),
            shut_down: false,
            readable,
        }
    }

    /// Follows a key the stream names (`key_watch` holds the stream's
    /// watcher reference on it): subscribes to its channel.
    pub(super) fn name(&mut self, key_watch: Arc<KeyWatch>) {
        let (receiver, _, _) = key_watch.subscribe();
        self.events
            .insert(key_watch.key.clone(), BroadcastStream::new(receiver));
        self.cursors.insert(
            WatchedKey(key_watch),
            Cursor {
                delivered: 0,
                named: true,
                patterns: 0,
                announced: true,
            },
        );
    }

    /// Follows `patterns`, on which the hub's registry holds the stream's
    /// references (released when the stream drops); they start with
    /// [`Watcher::start_patterns`].
    pub(super) fn follow_patterns(&mut self, patterns: Vec<Arc<PatternWatch>>) {
        self.patterns = patterns;
    }

    /// The keys the stream follows; before its patterns start, the keys it
    /// named.
    pub(super) fn followed_keys(&self) -> Vec<Arc<KeyWatch>> {
        self.cursors
            .keys()
            .map(|watched| Arc::clone(&watched.0))
            .collect()
    }

    /// The patterns the stream follows.
    pub(super) fn patterns(&self) -> &[Arc<PatternWatch>] {
        &self.patterns
    }

    /// Queues the initial `sync` of each named key that exists, in the
    /// order named, unless it is the very state the client saw
    /// (`last_version`).
    pub(super) fn queue_named_syncs(&mut self, keys: &[Bytes], last_version: Option<&Hlc>) {
        for key in keys {
            let Some((watched, cursor)) = self.cursors.get_key_value(&key[..]) else {
                continue;
            };
            let (snapshot, seq) = watched.0.snapshot();
            let Some(snapshot) = snapshot else { continue };
            let cursor = Cursor {
                delivered: seq,
                ..*cursor
            };
            let key_watch = Arc::clone(&watched.0);
            self.cursors
                .insert(WatchedKey(Arc::clone(&key_watch)), cursor);
            // Only the very state the client saw is skipped: an id the hub
            // never gave this state (an older one, or a newer one from before
            // a store restart) gets the sync.
            let seen = last_version.is_some() && last_version == snapshot.id();
            if !seen {
                self.pending
                    .push_back(Pending::Event(Arc::new(KeyEvent::sync(
                        &key_watch.key,
                        &snapshot,
                        false,
                        false,
                    ))));
            }
        }
    }

    /// Subscribes to each pattern's membership and events, and queues the
    /// `sync` of each of its keys that exists, then its `listed`.
    pub(super) fn start_patterns(&mut self) {
        for index in 0..self.patterns.len() {
            let pattern = Arc::clone(&self.patterns[index]);
            let subscription = pattern.subscribe();
            self.membership
                .insert(index, BroadcastStream::new(subscription.changes));
            self.pattern_events
                .insert(index, BroadcastStream::new(subscription.events));
            self.read.push(subscription.read);
            let mut existing = 0;
            for key_watch in subscription.keys {
                if self.add_to_pattern(index, key_watch) {
                    existing += 1;
                }
            }
            self.pending
                .push_back(Pending::Event(Arc::new(KeyEvent::listed(
                    &pattern.glob,
                    existing,
                ))));
        }
    }

    /// The next event for this watcher; `None` when the gateway shuts down.
    ///
    /// Events this watcher was already told of (by the event or by a sync
    /// from a newer state) are skipped: no duplicates, no going back.
    pub async fn next(&mut self) -> Option<Arc<KeyEvent>> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`Watcher::next`] as a poll, for a stream's body to hold the watcher
    /// itself rather than a future of it besides.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Arc<KeyEvent>>> {
        loop {
            if let Some(pending) = self.pending.pop_front() {
                let event = match pending {
                    Pending::Event(event) => event,
                    Pending::Sync(key_watch) => match self.initial_sync(&key_watch) {
                        Some(event) => event,
                        None => continue,
                    },
                    Pending::Lagged(key_watch) => match self.lagged_sync(&key_watch) {
                        Some(event) => event,
                        None => continue,
                    },
                };
                // A pattern's own events name the pattern, not a key.
                let of_key = !matches!(
                    event.kind,
                    EventKind::Listed { .. } | EventKind::PatternError
                );
                if of_key && !self.may_read(&event.key) {
                    continue;
                }
                self.hub.metrics.events_delivered.inc();
                return Poll::Ready(Some(event));
            }
            // The initial syncs of a large pattern grew the queue: give the
            // room back once they are out. A stream without patterns queues
            // only its initial syncs: it keeps no room at all.
            let kept = if self.patterns.is_empty() {
                0
            } else {
                PENDING_KEPT
            };
            if self.pending.capacity() > kept {
                self.pending.shrink_to(kept);
            }
            if self.shut_down {
                return Poll::Ready(None);
            }
            // In this order: membership changes before the events they
            // precede; an exhausted map (`Ready(None)`) has nothing to give.
            if let Poll::Ready(Some((index, change))) = self.membership.poll_next_unpin(cx) {
                self.follow_change(index, change);
                continue;
            }
            let (key, item, pattern) =
                if let Poll::Ready(Some((index, item))) = self.pattern_events.poll_next_unpin(cx) {
                    match item {
                        Ok(event) => {
                            self.read[index] = event.number;
                            (event.slot.key.clone(), Ok(event.slot), Some(index))
                        }
                        Err(BroadcastStreamRecvError::Lagged(skipped)) => {
                            self.hub.metrics.events_dropped.inc_by(skipped);
                            self.catch_up(index);
                            continue;
                        }
                    }
                } else if let Poll::Ready(Some((key, item))) = self.events.poll_next_unpin(cx) {
                    match item {
                        Ok(Some(slot)) => (key, Ok(slot), None),
                        Ok(None) => {
                            self.shut_down = true;
                            continue;
                        }
                        Err(BroadcastStreamRecvError::Lagged(skipped)) => (key, Err(skipped), None),
                    }
                } else if self.prune {
                    // No channel has an event ready: the stream read every
                    // event sent before now.
                    self.drop_cursors();
                    continue;
                } else {
                    // Every channel will wake this task.
                    return Poll::Pending;
                };
            if !self.may_read(&key) {
                continue;
            }
            // An emptied slot was dropped for the key's byte budget: this
            // watcher is behind, exactly as when the channel overran it.
            let received = match item {
                Ok(slot) => slot.event().map(|event| (event, slot.seq)).ok_or(1),
                Err(skipped) => Err(skipped),
            };
            if let Some(index) = pattern
                && self.single_pattern()
                && !self.cursors.contains_key(&key[..])
            {
                match self.uncursored(index, &key, received) {
                    Some(event) => {
                        self.hub.metrics.events_delivered.inc();
                        return Poll::Ready(Some(event));
                    }
                    None => continue,
                }
            }
            let (event, seq) = match received {
                Ok(received) => received,
                Err(skipped) => {
                    let Some((watched, _)) = self.cursors.get_key_value(&key[..]) else {
                        continue;
                    };
                    self.hub.metrics.events_dropped.inc_by(skipped);
                    let (snapshot, seq) = watched.0.snapshot();
                    let Some(snapshot) = snapshot else { continue };
                    (Arc::new(KeyEvent::sync(&key, &snapshot, false, true)), seq)
                }
            };
            let Some(cursor) = self.cursors.get_mut(&key[..]) else {
                continue;
            };
            if let Some(event) = admit(cursor, event, seq) {
                // A key of a stream of one pattern now told of: its cursor
                // goes once the stream has read past it.
                self.prune |= pattern.is_some() && self.single_pattern();
                self.hub.metrics.events_delivered.inc();
                return Poll::Ready(Some(event));
            }
        }
    }

    /// A key's initial `sync`, from its state now; `None` if the stream no
    /// longer follows it or already has that state.
    fn initial_sync(&mut self, key_watch: &KeyWatch) -> Option<Arc<KeyEvent>> {
        let (snapshot, seq) = key_watch.snapshot();
        let cursor = self.cursors.get_mut(&key_watch.key[..])?;
        let snapshot = snapshot?;
        if seq < cursor.delivered {
            return None;
        }
        cursor.delivered = seq;
        cursor.announced = true;
        Some(Arc::new(KeyEvent::sync(
            &key_watch.key,
            &snapshot,
            false,
            false,
        )))
    }

    /// A key's `lagged` sync, from its state now; `None` if the stream no
    /// longer follows it or already has that state.
    fn lagged_sync(&mut self, key_watch: &KeyWatch) -> Option<Arc<KeyEvent>> {
        let (snapshot, seq) = key_watch.snapshot();
        let cursor = self.cursors.get_mut(&key_watch.key[..])?;
        let sync = KeyEvent::sync(&key_watch.key, &snapshot?, false, true);
        admit(cursor, Arc::new(sync), seq)
    }

    /// Whether the stream follows one pattern (and keeps no cursor for a
    /// key of it it was told of, once it read past its state).
    fn single_pattern(&self) -> bool {
        self.patterns.len() == 1
    }

    /// What the stream of one pattern (at `index`) is told of an event of
    /// `key`, for which it keeps no cursor: the key is hidden from it, not
    /// yet told of (the pattern's `Added` brings its sync), or told of and
    /// read past (the event is newer than anything it was told).
    fn uncursored(
        &mut self,
        index: usize,
        key: &Bytes,
        received: Result<(Arc<KeyEvent>, u64), u64>,
    ) -> Option<Arc<KeyEvent>> {
        if self.is_hidden(key) {
            return None;
        }
        let pattern = Arc::clone(&self.patterns[index]);
        // A key the pattern has not told its streams of: its `Added`
        // brings its sync.
        let key_watch = pattern.followed(key)?;
        // Told of, the `Added` is in the membership channel already: take
        // it first, so that the key's first event is its sync.
        while let Some(Some((index, change))) = self.membership.next().now_or_never() {
            self.follow_change(index, change);
        }
        if let Some(cursor) = self.cursors.get_mut(&key[..]) {
            let (event, seq) = received.ok()?;
            return admit(cursor, event, seq);
        }
        match received {
            Ok((event, _)) => Some(event),
            Err(skipped) => {
                // Behind on this key: a `lagged` sync of its state, and a
                // cursor until the stream reads past it.
                self.hub.metrics.events_dropped.inc_by(skipped);
                self.told_of(index, &key_watch);
                self.pending.push_back(Pending::Lagged(key_watch));
                None
            }
        }
    }

    /// A cursor for a key of the pattern at `index` the stream was told
    /// of and keeps no cursor for: nothing is known to be delivered.
    fn told_of(&mut self, index: usize, key_watch: &Arc<KeyWatch>) {
        self.cursors.insert(
            WatchedKey(Arc::clone(key_watch)),
            Cursor {
                delivered: 0,
                named: false,
                patterns: 1 << index,
                announced: true,
            },
        );
        self.prune = true;
    }

    /// Drops the cursors of the keys a stream of one pattern was told of
    /// and did not name: called when it read every event sent before now,
    /// so every later event of those keys is newer than what it was told.
    fn drop_cursors(&mut self) {
        self.prune = false;
        self.cursors
            .retain(|cursor| cursor.named || !cursor.announced);
    }

    /// After the stream fell behind the channel of the pattern at `index`:
    /// a `lagged` sync of each of its keys that moved since the last event
    /// the stream read, from the key's state when it is sent.
    fn catch_up(&mut self, index: usize) {
        let bit = 1 << index;
        let pattern = Arc::clone(&self.patterns[index]);
        for key_watch in pattern.keys() {
            if key_watch.last_event_in(&pattern.events) <= self.read[index]
                || !self.may_read(&key_watch.key)
            {
                continue;
            }
            match self.cursors.get(&key_watch.key[..]) {
                Some(cursor) if cursor.patterns & bit == 0 => continue,
                Some(_) => {}
                None if self.single_pattern() && !self.is_hidden(&key_watch.key) => {
                    self.told_of(index, &key_watch);
                }
                None => continue,
            }
            self.pending.push_back(Pending::Lagged(key_watch));
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
            Ok(Membership::Removed { key_watch, last }) => {
                self.removed_uncursored(index, &key_watch, last);
                self.remove_from_pattern(index, &key_watch.key);
            }
            Ok(Membership::Refused(event)) => self.pending.push_back(Pending::Event(event)),
            Ok(Membership::Closing) => self.shut_down = true,
            Err(BroadcastStreamRecvError::Lagged(_)) => {
                // Changes were lost: the pattern's membership now is the
                // word. Adding is idempotent; keys it left are dropped.
                let pattern = Arc::clone(&self.patterns[index]);
                let bit = 1 << index;
                let gone: Vec<Bytes> = self
                    .cursors
                    .iter()
                    .filter(|(watched, cursor)| {
                        cursor.patterns & bit != 0 && !pattern.follows(&watched.0.key)
                    })
                    .map(|(watched, _)| watched.0.key.clone())
                    .collect();
                for key in gone {
                    self.remove_from_pattern(index, &key);
                }
                for key_watch in pattern.subscribe().keys {
                    self.add_to_pattern(index, key_watch);
                }
            }
        }
    }

    /// A key the pattern at `index` stopped following, in a stream of one
    /// pattern that keeps no cursor for it (told of it and read past):
    /// its `delete`, if the stream has not read the key's last event yet.
    /// That event, read later, is dropped with the key no longer followed.
    fn removed_uncursored(&mut self, index: usize, key_watch: &KeyWatch, last: u64) {
        let key = &key_watch.key;
        if !self.single_pattern()
            || self.cursors.contains_key(&key[..])
            || self.is_hidden(key)
            || last <= self.read[index]
        {
            return;
        }
        if let (Some(snapshot), _) = key_watch.snapshot()
            && snapshot.value.is_none()
        {
            let id = snapshot.id().cloned();
            let event = KeyEvent::delete(key, snapshot.version, id);
            self.pending.push_back(Pending::Event(Arc::new(event)));
        }
    }

    fn is_hidden(&self, key: &[u8]) -> bool {
        self.hidden
            .as_ref()
            .is_some_and(|hidden| hidden.contains(key))
    }

    fn unhide(&mut self, key: &[u8]) {
        if let Some(hidden) = &mut self.hidden {
            hidden.remove(key);
        }
    }

    /// How long the stream may stay quiet before its keep-alive.
    pub fn keep_alive(&self) -> Duration {
        self.hub.settings.keep_alive
    }

    /// Whether the stream may see `key`.
    fn may_read(&self, key: &[u8]) -> bool {
        self.readable.as_ref().is_none_or(|readable| readable(key))
    }

    /// Follows `key_watch` for the pattern at `index` if the stream may see
    /// it; a key new to the stream that exists gets its `sync` (read when
    /// it is sent). Returns whether it was followed and exists.
    fn add_to_pattern(&mut self, index: usize, key_watch: Arc<KeyWatch>) -> bool {
        if !self.may_read(&key_watch.key) {
            if self.single_pattern() {
                self.hidden
                    .get_or_insert_default()
                    .insert(key_watch.key.clone());
            }
            return false;
        }
        self.unhide(&key_watch.key);
        let bit = 1 << index;
        if let Some(cursor) = self.cursors.get_mut(&key_watch.key[..]) {
            cursor.patterns |= bit;
            let exists = key_watch
                .state()
                .snapshot
                .as_ref()
                .is_some_and(|s| s.value.is_some());
            if !cursor.announced && exists {
                cursor.announced = true;
                self.pending.push_back(Pending::Sync(key_watch));
            }
            return exists;
        }
        // The stream took the pattern's channel before any key's state:
        // what the channel holds up to `seq` is in that state.
        let (snapshot, seq) = key_watch.snapshot();
        let exists = snapshot.is_some_and(|s| s.value.is_some());
        if exists {
            self.pending
                .push_back(Pending::Sync(Arc::clone(&key_watch)));
        }
        self.cursors.insert(
            WatchedKey(key_watch),
            Cursor {
                delivered: seq,
                named: false,
                patterns: bit,
                announced: exists,
            },
        );
        self.prune |= self.single_pattern();
        exists
    }

    /// The pattern at `index` no longer follows `key`; neither does the
    /// stream unless it named it or another of its patterns follows it.
    fn remove_from_pattern(&mut self, index: usize, key: &Bytes) {
        self.unhide(key);
        let Some(cursor) = self.cursors.get_mut(&key[..]) else {
            return;
        };
        cursor.patterns &= !(1 << index);
        if cursor.patterns == 0 && !cursor.named {
            // A key leaves a pattern once it is gone; its `delete` may still
            // sit unread in the channel: a stream told of the key hears of
            // the delete before it leaves.
            if let Some((watched, cursor)) = self.cursors.remove_entry(&key[..])
                && cursor.announced
                && let (Some(snapshot), seq) = watched.0.snapshot()
                && snapshot.value.is_none()
                && seq > cursor.delivered
            {
                let id = snapshot.id().cloned();
                let event = KeyEvent::delete(key, snapshot.version, id);
                self.pending.push_back(Pending::Event(Arc::new(event)));
            }
            self.events.remove(key);
        }
    }
}

/// What the stream is told of `event`, the key's event number `seq`:
/// nothing if it was already told of it or of a newer state, and nothing
/// of a pattern's key it has not heard of until the key exists (then a
/// `sync`).
fn admit(cursor: &mut Cursor, mut event: Arc<KeyEvent>, seq: u64) -> Option<Arc<KeyEvent>> {
    if seq <= cursor.delivered {
        return None;
    }
    if !cursor.announced {
        if event.kind == EventKind::Error || event.value.is_none() {
            return None;
        }
        if !matches!(event.kind, EventKind::Sync { .. }) {
            event = Arc::new(event.as_sync());
        }
        cursor.announced = true;
    }
    cursor.delivered = seq;
    Some(event)
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let hub = &self.hub;
        hub.watchers.fetch_sub(1, Ordering::AcqRel);
        hub.metrics.watchers.dec();
        hub.release(
            self.cursors
                .iter()
                .filter(|(_, cursor)| cursor.named)
                .map(|(watched, _)| &watched.0),
        );
        for pattern in &self.patterns {
            self.registry.unfollow(pattern);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(delivered: u64, announced: bool) -> Cursor {
        Cursor {
            delivered,
            named: false,
            patterns: 1,
            announced,
        }
    }

    fn event(kind: EventKind, value: Option<&'static [u8]>) -> Arc<KeyEvent> {
        Arc::new(KeyEvent::new(
            kind,
            Bytes::from_static(b"k"),
            value.map(|v| Bytes::from_static(v).into()),
            None,
            None,
        ))
    }

    fn watched(key: &[u8]) -> WatchedKey {
        WatchedKey(Arc::new(KeyWatch::new(key, 4, 1024, None)))
    }

    #[test]
    fn cursors_hold_one_per_key_whether_inline_or_in_the_table() {
        let mut cursors = Cursors::with_capacity(1);
        cursors.insert(watched(b"a"), cursor(1, true));
        cursors.insert(watched(b"b"), cursor(2, true));
        cursors.insert(watched(b"a"), cursor(3, true));
        assert_eq!(cursors.len(), 2);
        assert_eq!(cursors.get(b"a").map(|c| c.delivered), Some(3));
        // The inline one gone, a key of the table is still found once.
        assert_eq!(
            cursors.remove_entry(b"a").map(|(_, c)| c.delivered),
            Some(3)
        );
        cursors.insert(watched(b"b"), cursor(4, true));
        assert_eq!(cursors.len(), 1);
        assert_eq!(cursors.get(b"b").map(|c| c.delivered), Some(4));
        cursors.insert(watched(b"c"), cursor(5, false));
        if let Some(c) = cursors.get_mut(b"c") {
            c.delivered = 6;
        }
        let mut seen: Vec<(Vec<u8>, u64)> = cursors
            .iter()
            .map(|(w, c)| (w.0.key.to_vec(), c.delivered))
            .collect();
        seen.sort();
        assert_eq!(seen, [(b"b".to_vec(), 4), (b"c".to_vec(), 6)]);
        cursors.retain(|c| !c.announced);
        assert!(!cursors.contains_key(b"b"));
        assert_eq!(cursors.keys().count(), 1);
        assert!(cursors.contains_key(b"c"));
    }

    #[test]
    fn an_event_older_than_what_a_watcher_was_told_is_skipped() {
        // A lagged watcher skipped to the sync of event 9, then reads an
        // older resync still in its channel: it must not go back to 7.
        let resync = EventKind::Sync {
            resync: true,
            lagged: false,
        };
        let mut lagged = cursor(9, true);
        assert!(admit(&mut lagged, event(resync, Some(b"old")), 7).is_none());
        assert!(admit(&mut lagged, event(EventKind::Set, Some(b"v")), 9).is_none());
        assert!(admit(&mut lagged, event(EventKind::Error, None), 10).is_some());
        assert!(admit(&mut lagged, event(EventKind::Set, Some(b"v")), 11).is_some());
        assert_eq!(lagged.delivered, 11);
    }

    #[test]
    fn a_patterns_key_is_told_of_once_it_exists_and_first_as_a_sync() {
        let mut unheard = cursor(3, false);
        assert!(admit(&mut unheard, event(EventKind::Delete, None), 4).is_none());
        assert!(admit(&mut unheard, event(EventKind::Error, None), 5).is_none());
        let first = admit(&mut unheard, event(EventKind::Set, Some(b"v")), 6).unwrap();
        assert!(matches!(first.kind, EventKind::Sync { .. }));
        let next = admit(&mut unheard, event(EventKind::Set, Some(b"w")), 7).unwrap();
        assert_eq!(next.kind, EventKind::Set);
    }
}
