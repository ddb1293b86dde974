//! The hub's two tasks: dispatch routes the pool's notifications to the
//! watched keys; the reconciler keeps the store's registrations equal to the
//! keys that have watchers, and registers and reads every key again when the
//! holder reconnects, when notifications were lost, and periodically.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream;
use tokio::sync::broadcast;

use super::error::WatchError;
use super::event::{EventKind, KeyEvent};
use super::key::{KeyWatch, Registration, WatchedKey};
use super::shared::{Inner, NO_HOLDER};
use crate::mqtt::{KeyNotification, MemberEvent};
use crate::protocol::Notification;
use crate::trace;

/// Routes the pool's notifications to the keys' watchers.
pub(super) async fn dispatch(
    inner: Arc<Inner>,
    mut notifications: broadcast::Receiver<KeyNotification>,
) {
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
        let key_watch = inner
            .keys()
            .get(&notification.key[..])
            .map(|watched| Arc::clone(&watched.0));
        let Some(key_watch) = key_watch else { continue };
        let (kind, value) = match notification.notification {
            Notification::Set { value } => (EventKind::Set, Some(value)),
            Notification::Delete => (EventKind::Delete, None),
        };
        key_watch.apply(kind, value, notification.version);
    }
}

/// Keeps the store's registrations equal to the keys that have watchers.
// A `WatchedKey` is hashed by its key's bytes, which never change.
#[allow(clippy::mutable_key_type)]
pub(super) async fn reconcile(
    inner: Arc<Inner>,
    mut member_events: broadcast::Receiver<MemberEvent>,
) {
    let mut shutdown = inner.shutdown.subscribe();
    // The keys registered on the holder, each with the entry it was
    // registered for (a key whose entry went keeps it until its STOP).
    let mut registered: HashSet<WatchedKey> = HashSet::new();
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
pub(super) const CONCURRENT_REQUESTS: usize = 64;

/// One reconciliation pass. `Err` when some key could not be registered
/// and the pass should be retried.
#[allow(clippy::mutable_key_type)] // see `reconcile`
async fn sync_registrations(
    inner: &Inner,
    holder: usize,
    registered: &mut HashSet<WatchedKey>,
    reread_all: bool,
    tell_watchers: bool,
) -> Result<(), ()> {
    let wanted: Vec<Arc<KeyWatch>> = inner
        .keys()
        .iter()
        .map(|watched| Arc::clone(&watched.0))
        .collect();
    let wanted_keys: HashSet<&[u8]> = wanted.iter().map(|w| &w.key[..]).collect();
    let stale: Vec<Bytes> = registered
        .iter()
        .filter(|watched| !wanted_keys.contains(&watched.0.key[..]))
        .map(|watched| watched.0.key.clone())
        .collect();
    for key in &stale {
        registered.remove(&key[..]);
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
                || !registered.contains(&w.key[..])
                || matches!(w.state().registration, Registration::Pending)
        })
        .collect();
    let results = stream::iter(missing)
        .map(|key_watch| {
            let fresh = !registered.contains(&key_watch.key[..]);
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
                key_watch.state().registration = Registration::Registered;
                registered.replace(WatchedKey(key_watch));
            }
            Err(error) => {
                failed = true;
                let mut state = key_watch.state();
                let first = matches!(state.registration, Registration::Pending);
                if first {
                    // The watcher that is waiting answers with an HTTP error.
                    state.registration = Registration::Failed(Box::new(error));
                } else if tell_watchers {
                    tracing::warn!(%error, "re-registering a watched key failed; retrying");
                    key_watch.send(
                        &mut state,
                        KeyEvent::error(&key_watch.key, error.to_string()),
                    );
                } else {
                    tracing::debug!(%error, "re-registering a watched key failed; retrying");
                }
            }
        }
    }
    // The watch requests waiting on these keys look again.
    inner.registered.notify_waiters();
    if failed { Err(()) } else { Ok(()) }
}

/// Registers the key with the store. Until it succeeds, registering is
/// the work of the watch request that asked for the key first, and runs
/// in that request's trace context.
async fn register(inner: &Inner, holder: usize, key_watch: &KeyWatch) -> Result<(), WatchError> {
    let cause = key_watch.state().cause.as_deref().cloned();
    trace::scope(cause, keynotify_and_get(inner, holder, key_watch)).await?;
    key_watch.state().cause = None;
    Ok(())
}

/// KEYNOTIFY, then GET: no change can fall between the two.
async fn keynotify_and_get(
    inner: &Inner,
    holder: usize,
    key_watch: &KeyWatch,
) -> Result<(), WatchError> {
    let store = inner.store.on_member(holder);
    store.keynotify(key_watch.key.clone()).await?;
    let changes_before = key_watch.state().changes;
    let read = store.get(key_watch.key.clone()).await?;
    if key_watch.reread(read, changes_before, false) {
        inner.metrics.resyncs.inc();
    }
    Ok(())
}
