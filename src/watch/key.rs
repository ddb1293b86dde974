//! One watched key: what the hub knows of it, its registration, and the
//! bounded channels that fan its events out: its own, for the streams that
//! name it (made when the first one does), and the channel of each pattern
//! that follows it, which the pattern's streams share.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, broadcast};

use super::error::WatchError;
use super::event::{EventKind, KeyEvent, Snapshot, WatchedValue, next_id};
use crate::protocol::Hlc;
use crate::store::Versioned;
use crate::trace::TraceContext;

#[derive(Debug, Clone)]
pub(super) enum Registration {
    Pending,
    Registered,
    /// Boxed: rare, and every key holds a `Registration`.
    Failed(Box<WatchError>),
}

#[derive(Debug)]
pub(super) struct KeyState {
    pub(super) watchers: usize,
    pub(super) snapshot: Option<Snapshot>,
    /// Bumped by every applied change, so that a GET racing with a
    /// notification can tell its answer may be stale.
    pub(super) changes: u64,
    /// The sequence number of the last event sent (see [`Slot::seq`]);
    /// the snapshot includes every event up to it.
    pub(super) seq: u64,
    /// The channels of the patterns that follow the key, each with the
    /// number of the key's last event in it.
    pub(super) followers: Vec<(Arc<PatternChannel>, u64)>,
    /// Where its registration with the store stands; a change is told
    /// through the hub's one `Notify` (see [`wait_registered`]), not a
    /// channel per key.
    pub(super) registration: Registration,
    /// The slots still in the key's channel, oldest first, with their
    /// events' weights, and the sum of those weights.
    pub(super) retained: VecDeque<(Arc<Slot>, usize)>,
    pub(super) retained_bytes: usize,
    /// The trace context of the watch request that created the entry,
    /// until the key is registered (boxed: most keys have none).
    pub(super) cause: Option<Box<TraceContext>>,
}

/// One event in a key's channels. A key keeps at most `buffer` slots, and
/// the events in them weigh at most `buffer_bytes`: past that the oldest
/// slots are emptied. A watcher that reaches an empty slot has fallen
/// behind, as when the channel overran it, and skips to a sync.
#[derive(Debug)]
pub(super) struct Slot {
    /// The key, so that a pattern's stream that finds the slot empty knows
    /// which key to sync.
    pub(super) key: Bytes,
    /// The event's place in the key's order: 1 for its first event, one
    /// more for each next. A stream tells what it already has by it.
    pub(super) seq: u64,
    event: Mutex<Option<Arc<KeyEvent>>>,
}

impl Slot {
    pub(super) fn event(&self) -> Option<Arc<KeyEvent>> {
        self.event
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn empty(&self) {
        self.event
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// One event of a pattern's channel: a key's slot, numbered in the
/// channel's order.
#[derive(Debug, Clone)]
pub(super) struct PatternEvent {
    /// 1 for the channel's first event, one more for each next.
    pub(super) number: u64,
    pub(super) slot: Arc<Slot>,
}

/// A pattern's channel of its keys' events, shared by its streams. Its
/// events are numbered in the channel's order, and each key remembers the
/// number of its last one: a stream that fell behind, knowing the last
/// number it read, syncs only the keys that moved since, from their state
/// (it keeps nothing per key to tell).
#[derive(Debug)]
pub(super) struct PatternChannel {
    sender: broadcast::Sender<PatternEvent>,
    /// Events sent so far; numbered and sent under this lock, so that
    /// numbers follow the channel's order.
    sent: Mutex<u64>,
}

impl PatternChannel {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            sender: broadcast::channel(capacity).0,
            sent: Mutex::new(0),
        }
    }

    fn sent(&self) -> MutexGuard<'_, u64> {
        self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A subscription, and the number of the last event it does not get.
    pub(super) fn subscribe(&self) -> (broadcast::Receiver<PatternEvent>, u64) {
        let sent = self.sent();
        (self.sender.subscribe(), *sent)
    }

    /// Sends `slot`; returns its number.
    fn send(&self, slot: Arc<Slot>) -> u64 {
        let mut sent = self.sent();
        *sent += 1;
        let _ = self.sender.send(PatternEvent {
            number: *sent,
            slot,
        });
        *sent
    }
}

/// A watched key by its bytes: the entry of the hub's map of keys, of the
/// reconciler's registered keys and of a stream's cursors, so that each
/// costs a pointer, and the key's bytes are held once, by its
/// [`KeyWatch`].
#[derive(Debug)]
pub(super) struct WatchedKey(pub(super) Arc<KeyWatch>);

impl std::hash::Hash for WatchedKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        <[u8] as std::hash::Hash>::hash(&self.0.key, state);
    }
}

impl PartialEq for WatchedKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for WatchedKey {}

impl std::borrow::Borrow<[u8]> for WatchedKey {
    fn borrow(&self) -> &[u8] {
        &self.0.key
    }
}

/// The shared state of one watched key.
#[derive(Debug)]
pub(super) struct KeyWatch {
    pub(super) key: Bytes,
    pub(super) state: Mutex<KeyState>,
    /// The key's own channel, for the streams that name it; made when the
    /// first one subscribes (a pattern's streams use the pattern's). `None`
    /// is its last item: the hub shuts down (see [`KeyWatch::close`]).
    events: OnceLock<broadcast::Sender<Option<Arc<Slot>>>>,
    /// The channel's capacity in events, and the bytes it may hold.
    pub(super) buffer: usize,
    pub(super) buffer_bytes: usize,
}

impl KeyWatch {
    /// A key's entry, not yet registered, with channels of `buffer` events
    /// and `buffer_bytes`. The key is copied: the bytes given may be a
    /// slice of a larger buffer (a SCAN page, a request) that the entry
    /// would otherwise keep.
    pub(super) fn new(
        key: &[u8],
        buffer: usize,
        buffer_bytes: usize,
        cause: Option<TraceContext>,
    ) -> Self {
        Self {
            key: Bytes::copy_from_slice(key),
            state: Mutex::new(KeyState {
                watchers: 0,
                snapshot: None,
                changes: 0,
                seq: 0,
                followers: Vec::new(),
                registration: Registration::Pending,
                retained: VecDeque::new(),
                retained_bytes: 0,
                cause: cause.map(Box::new),
            }),
            events: OnceLock::new(),
            buffer,
            buffer_bytes,
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, KeyState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A subscription to the key's own channel, with the snapshot and its
    /// sequence number taken together: every later event is in the channel.
    pub(super) fn subscribe(
        &self,
    ) -> (
        broadcast::Receiver<Option<Arc<Slot>>>,
        Option<Snapshot>,
        u64,
    ) {
        let state = self.state();
        let receiver = self
            .events
            .get_or_init(|| broadcast::channel(self.buffer).0)
            .subscribe();
        (receiver, state.snapshot.clone(), state.seq)
    }

    /// The snapshot and its sequence number.
    pub(super) fn snapshot(&self) -> (Option<Snapshot>, u64) {
        let state = self.state();
        (state.snapshot.clone(), state.seq)
    }

    /// Sends the key's events to `pattern` too, from now on.
    pub(super) fn add_follower(&self, pattern: &Arc<PatternChannel>) {
        self.state().followers.push((Arc::clone(pattern), 0));
    }

    /// Stops sending the key's events to `pattern`.
    pub(super) fn remove_follower(&self, pattern: &Arc<PatternChannel>) {
        self.state()
            .followers
            .retain(|(follower, _)| !Arc::ptr_eq(follower, pattern));
    }

    /// The number of the key's last event in `pattern`'s channel; 0 if
    /// none.
    pub(super) fn last_event_in(&self, pattern: &Arc<PatternChannel>) -> u64 {
        self.state()
            .followers
            .iter()
            .find(|(follower, _)| Arc::ptr_eq(follower, pattern))
            .map_or(0, |(_, last)| *last)
    }

    /// Applies a change if it is newer than what the hub knows and tells
    /// the watchers. Returns whether it was applied.
    pub(super) fn apply(
        &self,
        kind: EventKind,
        value: Option<Bytes>,
        version: Option<Hlc>,
    ) -> bool {
        let value = value.map(WatchedValue::kept);
        let mut state = self.state();
        if let (Some(known), Some(new)) = (
            state.snapshot.as_ref().and_then(|s| s.version.as_ref()),
            version.as_ref(),
        ) && new <= known
        {
            return false;
        }
        let id = next_id(
            state.snapshot.as_ref().and_then(Snapshot::id),
            version.as_ref(),
        );
        state.snapshot = Some(Snapshot::new(value.clone(), version.clone(), id.clone()));
        state.changes += 1;
        // Sent under the lock, so a watcher subscribing under the same lock
        // sees each change either in its snapshot or in its channel.
        self.send(
            &mut state,
            KeyEvent::new(kind, self.key.clone(), value, version, id),
        );
        true
    }

    /// Takes what a GET read as the key's state, if it moved from what the
    /// hub knows. `changes_before`: the key's change count when the GET
    /// was sent. A key found gone is told as a `delete` when `tell_delete`,
    /// else (like any other move) as a resync `sync`. Returns whether it
    /// moved.
    pub(super) fn reread(
        &self,
        read: Option<Versioned<Bytes>>,
        changes_before: u64,
        tell_delete: bool,
    ) -> bool {
        let current = match read {
            Some(Versioned { value, version }) => {
                Snapshot::new(Some(WatchedValue::kept(value)), version.clone(), version)
            }
            None => Snapshot::new(None, None, None),
        };
        let mut state = self.state();
        if state.changes != changes_before {
            // A notification landed while the GET was out. The key was
            // registered before, so every change after it is notified:
            // the notifications are the newer word (a GET answered just
            // before a SET must not look like a store that went back).
            return false;
        }
        let Some(known) = state.snapshot.clone() else {
            state.snapshot = Some(current);
            return false;
        };
        let moved = match (&known.version, &current.version) {
            // Lower than what we saw: the store restarted without its data
            // and counts from an older clock. Its versions are the baseline
            // now, or every later change would look stale.
            (Some(old), Some(new)) => new != old,
            // Absent now: moved if we thought it existed. The delete's
            // version is unknown, so any later change is newer.
            (_, None) => known.value.is_some(),
            (None, Some(_)) => true,
        };
        if !moved {
            return false;
        }
        // Its own id, after every id watchers saw: a watcher resuming from
        // the last SET's id still hears of a delete.
        let id = next_id(known.id(), current.version.as_ref());
        let current = Snapshot::new(current.value, current.version, id);
        state.snapshot = Some(current.clone());
        state.changes += 1;
        let event = if tell_delete && current.value.is_none() {
            KeyEvent::delete(&self.key, None, current.id().cloned())
        } else {
            KeyEvent::sync(&self.key, &current, true, false)
        };
        self.send(&mut state, event);
        true
    }

    /// Tells the watchers, keeping the key's slots within their bytes: the
    /// oldest events are dropped (their slots emptied) first.
    pub(super) fn send(&self, state: &mut KeyState, event: KeyEvent) {
        let weight = event.weight();
        state.seq += 1;
        let slot = Arc::new(Slot {
            key: self.key.clone(),
            seq: state.seq,
            event: Mutex::new(Some(Arc::new(event))),
        });
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
        for (follower, last) in &mut state.followers {
            *last = follower.send(Arc::clone(&slot));
        }
        if let Some(events) = self.events.get() {
            let _ = events.send(Some(slot));
        }
    }

    /// Ends the streams that name the key: the hub shuts down. Told through
    /// the channel they read anyway, so that a stream keeps no shutdown
    /// signal of its own.
    pub(super) fn close(&self) {
        if let Some(events) = self.events.get() {
            let _ = events.send(None);
        }
    }
}

/// Waits until `key_watch` is registered with the store (or failed to be).
/// `registered` is the hub's `Notify`, woken whenever registrations move.
pub(super) async fn wait_registered(
    key_watch: &KeyWatch,
    registered: &Notify,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<(), WatchError> {
    loop {
        let notified = registered.notified();
        let mut notified = std::pin::pin!(notified);
        // Waiting before looking: a change after the look wakes it.
        notified.as_mut().enable();
        match &key_watch.state().registration {
            Registration::Pending => {}
            Registration::Registered => return Ok(()),
            Registration::Failed(error) => return Err(WatchError::clone(error)),
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Err(WatchError::Timeout(timeout));
        }
    }
}
