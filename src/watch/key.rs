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
    Failed(WatchError),
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
    /// The channels of the patterns that follow the key.
    pub(super) followers: Vec<broadcast::Sender<Arc<Slot>>>,
    /// Where its registration with the store stands; a change is told
    /// through the hub's one `Notify` (see [`wait_registered`]), not a
    /// channel per key.
    pub(super) registration: Registration,
    /// The slots still in the key's channel, oldest first, with their
    /// events' weights, and the sum of those weights.
    pub(super) retained: VecDeque<(Arc<Slot>, usize)>,
    pub(super) retained_bytes: usize,
    /// The trace context of the watch request that created the entry,
    /// until the key is registered.
    pub(super) cause: Option<TraceContext>,
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

/// The shared state of one watched key.
#[derive(Debug)]
pub(super) struct KeyWatch {
    pub(super) key: Bytes,
    pub(super) state: Mutex<KeyState>,
    /// The key's own channel, for the streams that name it; made when the
    /// first one subscribes (a pattern's streams use the pattern's).
    events: OnceLock<broadcast::Sender<Arc<Slot>>>,
    /// The channel's capacity in events, and the bytes it may hold.
    pub(super) buffer: usize,
    pub(super) buffer_bytes: usize,
}

impl KeyWatch {
    /// A key's entry, not yet registered, with channels of `buffer` events
    /// and `buffer_bytes`.
    pub(super) fn new(
        key: Bytes,
        buffer: usize,
        buffer_bytes: usize,
        cause: Option<TraceContext>,
    ) -> Self {
        Self {
            key,
            state: Mutex::new(KeyState {
                watchers: 0,
                snapshot: None,
                changes: 0,
                seq: 0,
                followers: Vec::new(),
                registration: Registration::Pending,
                retained: VecDeque::new(),
                retained_bytes: 0,
                cause,
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
    pub(super) fn subscribe(&self) -> (broadcast::Receiver<Arc<Slot>>, Option<Snapshot>, u64) {
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
    pub(super) fn add_follower(&self, pattern: &broadcast::Sender<Arc<Slot>>) {
        self.state().followers.push(pattern.clone());
    }

    /// Stops sending the key's events to `pattern`.
    pub(super) fn remove_follower(&self, pattern: &broadcast::Sender<Arc<Slot>>) {
        self.state()
            .followers
            .retain(|follower| !follower.same_channel(pattern));
    }

    /// Applies a change if it is newer than what the hub knows and tells
    /// the watchers. Returns whether it was applied.
    pub(super) fn apply(
        &self,
        kind: EventKind,
        value: Option<Bytes>,
        version: Option<Hlc>,
    ) -> bool {
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
        let current = Snapshot {
            id: next_id(known.id.as_ref(), current.version.as_ref()),
            ..current
        };
        state.snapshot = Some(current.clone());
        state.changes += 1;
        let event = if tell_delete && current.value.is_none() {
            KeyEvent::delete(&self.key, None, current.id)
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
        for follower in &state.followers {
            let _ = follower.send(Arc::clone(&slot));
        }
        if let Some(events) = self.events.get() {
            let _ = events.send(slot);
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
            Registration::Failed(error) => return Err(error.clone()),
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Err(WatchError::Timeout(timeout));
        }
    }
}
