//! One watched key: what the hub knows of it, its registration, and the
//! bounded channel that fans its events out to watchers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{broadcast, watch};

use super::error::WatchError;
use super::event::{EventKind, KeyEvent, Snapshot, next_id};
use crate::protocol::Hlc;

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
    /// The slots still in the key's channel, oldest first, with their
    /// events' weights, and the sum of those weights.
    pub(super) retained: VecDeque<(Arc<Slot>, usize)>,
    pub(super) retained_bytes: usize,
}

/// One event in a key's channel. The channel holds at most `buffer`
/// slots, and the events in them weigh at most `buffer_bytes`: past that
/// the oldest slots are emptied. A watcher that reaches an empty slot has
/// fallen behind, as when the channel overran it, and skips to a sync.
#[derive(Debug)]
pub(super) struct Slot(pub(super) Mutex<Option<Arc<KeyEvent>>>);

impl Slot {
    pub(super) fn event(&self) -> Option<Arc<KeyEvent>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn empty(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// The shared state of one watched key.
#[derive(Debug)]
pub(super) struct KeyWatch {
    pub(super) key: Bytes,
    pub(super) state: Mutex<KeyState>,
    pub(super) events: broadcast::Sender<Arc<Slot>>,
    pub(super) registration: watch::Sender<Registration>,
    /// The channel's capacity in events, and the bytes it may hold.
    pub(super) buffer: usize,
    pub(super) buffer_bytes: usize,
}

impl KeyWatch {
    pub(super) fn state(&self) -> MutexGuard<'_, KeyState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a change if it is newer than what the hub knows and tells
    /// the watchers. Returns whether it was applied.
    pub(super) fn apply(
        &self,
        kind: EventKind,
        value: Option<Bytes>,
        version: Option<Hlc>,
    ) -> bool {
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
    pub(super) fn send(&self, state: &mut KeyState, event: KeyEvent) {
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

/// Waits until `key_watch` is registered with the store (or failed to be).
pub(super) async fn wait_registered(
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
