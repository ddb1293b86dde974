//! Locks as the SDKs' `leased_lock` clients keep them, with waiters.
//!
//! A lock is a plain key: its value is the holder's name, acquiring or
//! renewing is `SET name holder NEX PX ttl` (the reply's version is the
//! fencing token), releasing is `VDEL name holder`. HTTP clients and SDK
//! `lease`/`lock` clients therefore contend for the same locks.
//!
//! Waiting for a lock: the waiters of one lock form a line (FIFO) that
//! shares one [`Watcher`](crate::watch::Watcher) of the watch hub, so one
//! KEYNOTIFY registration per lock, re-registered and resynced by the hub
//! after reconnects. Only the waiter at the head of the line tries to
//! acquire; it tries again whenever the hub sees the key free (a delete
//! notification, or a resync that finds it absent). When it acquires or
//! gives up, the next in line becomes the head, so a release costs one
//! SET, not one per waiter. A new request tries once before it queues, so
//! it may win a lock released an instant before.
//!
//! A waiter's future may be dropped at any point (its HTTP client went
//! away): it leaves the line, and if a SET was in flight, which may have
//! acquired the lock for nobody, the lock is released with VDEL.
//!
//! The store's VDEL compares the value only, and every request of one
//! holder writes the same value: a clean-up VDEL sent while a later
//! request of that holder (a client's retry) has its SET out could delete
//! the retry's hold. So the SETs of one holder on one lock, with the
//! clean-up VDEL of an abandoned one, take turns ([`HolderTurns`]): a
//! clean-up always reaches the store before the next SET of that holder.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;
use tokio::sync::{Notify, OwnedMutexGuard, oneshot, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::mqtt::{PoolError, RequestOptions};
use crate::protocol::{Hlc, SetCondition, SetOptions};
use crate::settings;
use crate::store::{RequestError, SetOutcome, StoreClient, VdelOutcome, Versioned};
use crate::trace;
use crate::watch::{EventKind, WatchError, WatchHub};

/// How long a waiter pauses before trying again after the store could not
/// be reached (a reconnect usually takes about a second).
const RETRY_AFTER_TRANSPORT_ERROR: Duration = Duration::from_millis(250);

/// Limits of lock requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockSettings {
    /// The longest `wait` accepted.
    pub max_wait: Duration,
    /// The longest holder name accepted, in bytes.
    pub max_holder_bytes: usize,
}

impl Default for LockSettings {
    fn default() -> Self {
        Self {
            max_wait: settings::DEFAULT_MAX_LOCK_WAIT,
            max_holder_bytes: settings::DEFAULT_MAX_LOCK_HOLDER_BYTES,
        }
    }
}

/// Who holds a lock, and the fencing token of their hold (the key's
/// version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The holder's name (the key's value).
    pub holder: Bytes,
    /// The key's version: the fencing token of the hold.
    pub fencing_token: Option<Hlc>,
}

impl From<Versioned<Bytes>> for Holding {
    fn from(versioned: Versioned<Bytes>) -> Self {
        Self {
            holder: versioned.value,
            fencing_token: versioned.version,
        }
    }
}

/// A request to acquire (or renew) a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire {
    /// The lock's name (its key).
    pub name: Bytes,
    /// Who acquires it.
    pub holder: Bytes,
    /// How long the hold lasts unless renewed, in milliseconds.
    pub ttl_ms: u64,
    /// How long to wait for the lock when someone else holds it; zero:
    /// try once.
    pub wait: Duration,
}

/// What an acquire came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The holder holds the lock; the fencing token of the hold.
    Held(Option<Hlc>),
    /// Someone else holds it (as read after the last try; `None` when it
    /// was released in between).
    Refused(Option<Holding>),
    /// The request waited, and by its turn to try it was no longer allowed
    /// to take the lock (its caller's rules changed).
    NotAllowed,
}

/// What a release came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// The holder held the lock and no longer does.
    Released,
    /// Nobody holds the lock.
    NotHeld,
    /// Someone else holds it (`None`: released in between).
    HeldByAnother(Option<Holding>),
}

/// Why a lock request has no outcome.
#[derive(Debug, Clone, Error)]
pub enum LockError {
    /// A store request failed.
    #[error(transparent)]
    Store(#[from] RequestError),
    /// The lock's key could not be followed (registration limits, ...).
    #[error(transparent)]
    Watch(#[from] WatchError),
}

/// The locks of the gateway and their lines of waiters; cheap to clone.
#[derive(Debug, Clone)]
pub struct Locks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: StoreClient,
    hub: WatchHub,
    metrics: Metrics,
    settings: LockSettings,
    lines: Mutex<HashMap<Bytes, Arc<Line>>>,
    tickets: AtomicU64,
    turns: HolderTurns,
}

impl Inner {
    fn lines(&self) -> MutexGuard<'_, HashMap<Bytes, Arc<Line>>> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether a line's key is followed by the hub.
#[derive(Debug, Clone)]
enum Following {
    Starting,
    Active,
    Failed(WatchError),
    /// The hub ended the watch (the gateway shuts down).
    Ended,
}

/// The waiters of one lock.
#[derive(Debug)]
struct Line {
    key: Bytes,
    waiters: Mutex<Waiters>,
    /// Counts the times the hub saw the key free; the head tries again
    /// whenever it moves.
    frees: watch::Sender<u64>,
    following: watch::Sender<Following>,
}

#[derive(Debug, Default)]
struct Waiters {
    /// By ticket, in arrival order; the front is the head.
    queue: VecDeque<(u64, Arc<Notify>)>,
    /// Left by a head that acquired: the `frees` count it saw before its
    /// winning SET. Its successor waits for a newer free before trying.
    handed_over_at: Option<u64>,
    /// The task following the key; aborted when the line empties.
    follower: Option<AbortHandle>,
}

impl Line {
    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Locks {
    /// Locks over `store`, following keys with `hub`.
    pub fn new(
        store: StoreClient,
        hub: WatchHub,
        metrics: Metrics,
        settings: LockSettings,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                hub,
                metrics,
                settings,
                lines: Mutex::new(HashMap::new()),
                tickets: AtomicU64::new(0),
                turns: HolderTurns::default(),
            }),
        }
    }

    /// The limits of lock requests.
    pub fn settings(&self) -> &LockSettings {
        &self.inner.settings
    }

    /// Requests waiting for a lock, over all locks.
    pub fn waiters(&self) -> usize {
        self.inner
            .lines()
            .values()
            .map(|line| line.waiters().queue.len())
            .sum()
    }

    /// Who holds `name`, if anyone.
    pub async fn holder(&self, name: Bytes) -> Result<Option<Holding>, LockError> {
        Ok(self.inner.store.get(name).await?.map(Holding::from))
    }

    /// Releases `name` if `holder` holds it (`VDEL`).
    pub async fn release(&self, name: Bytes, holder: Bytes) -> Result<Released, LockError> {
        let outcome = self.inner.store.vdel(name.clone(), holder, None).await?;
        Ok(match outcome {
            VdelOutcome::Deleted(_) => Released::Released,
            VdelOutcome::Missing => Released::NotHeld,
            VdelOutcome::ValueDiffers => Released::HeldByAnother(self.holder(name).await?),
        })
    }

    /// Acquires or renews a lock, waiting up to `request.wait` while
    /// someone else holds it. A waiter asks `allowed` before each try, so
    /// that a caller whose right to the lock was withdrawn while it waited
    /// does not take it.
    pub async fn acquire(
        &self,
        request: &Acquire,
        allowed: &(dyn Fn() -> bool + Sync),
    ) -> Result<Acquired, LockError> {
        let deadline = Instant::now() + request.wait;
        if let SetOutcome::Applied(token) = self.try_set(request).await? {
            self.acquired(false);
            return Ok(Acquired::Held(token));
        }
        self.inner.metrics.lock_contention.inc();
        if request.wait.is_zero() {
            return self.refused(request).await;
        }
        // With span export, the wait is one span (its SETs under it) that
        // ends with how the wait ended; dropped (the client left):
        // `cancelled`.
        let Some(span) = trace::Span::internal("lock wait") else {
            return self.wait(request, deadline, allowed).await;
        };
        let context = span.context().clone();
        let waited = trace::scope(Some(context), self.wait(request, deadline, allowed)).await;
        match &waited {
            Ok(Acquired::Held(_)) => span.end_with("acquired", None),
            Ok(Acquired::Refused(_)) => span.end_with("timeout", None),
            Ok(Acquired::NotAllowed) => span.end_with("not_allowed", None),
            Err(LockError::Watch(WatchError::ShuttingDown)) => span.end_with("shutting_down", None),
            Err(_) => span.end_with("error", Some("lock_error")),
        }
        waited
    }

    /// Waits in the lock's line until `deadline` for the lock to be free,
    /// and takes it.
    async fn wait(
        &self,
        request: &Acquire,
        deadline: Instant,
        allowed: &(dyn Fn() -> bool + Sync),
    ) -> Result<Acquired, LockError> {
        let mut place = self.join(&request.name);
        // Our turn: we are the head of the line.
        if tokio::time::timeout_at(deadline, place.turn.notified())
            .await
            .is_err()
        {
            return self.refused(request).await;
        }
        let line = Arc::clone(&place.line);
        let mut following = line.following.subscribe();
        let started = tokio::time::timeout_at(
            deadline,
            following.wait_for(|f| !matches!(f, Following::Starting)),
        )
        .await
        .map(|state| state.map(|state| state.clone()));
        match started {
            Err(_) => return self.refused(request).await,
            Ok(Err(_)) | Ok(Ok(Following::Ended)) => return Err(WatchError::ShuttingDown.into()),
            Ok(Ok(Following::Failed(error))) => return Err(error.into()),
            Ok(Ok(Following::Starting | Following::Active)) => {}
        }
        let mut frees = line.frees.subscribe();
        let handed_over_at = line.waiters().handed_over_at.take();
        // The previous head acquired: nothing to try until a free after
        // its winning SET.
        if let Some(seen) = handed_over_at {
            let newer = tokio::time::timeout_at(deadline, frees.wait_for(|n| *n > seen))
                .await
                .map(|newer| newer.map(|_| ()));
            match newer {
                Err(_) => return self.refused(request).await,
                Ok(Err(_)) => return Err(WatchError::ShuttingDown.into()),
                Ok(Ok(_)) => {}
            }
        }
        loop {
            let seen = *frees.borrow_and_update();
            let mut retry_at = None;
            if !allowed() {
                return Ok(Acquired::NotAllowed);
            }
            match self.try_set(request).await {
                Ok(SetOutcome::Applied(token)) => {
                    place.acquired_at = Some(seen);
                    self.acquired(true);
                    return Ok(Acquired::Held(token));
                }
                Ok(SetOutcome::NotApplied) => self.inner.metrics.lock_contention.inc(),
                Err(RequestError::Transport(error)) => {
                    // A reconnect: the hub registers again and resyncs;
                    // meanwhile try again now and then.
                    tracing::debug!(%error, "a lock waiter's SET failed; trying again");
                    retry_at = Some(Instant::now() + RETRY_AFTER_TRANSPORT_ERROR);
                }
                Err(error) => return Err(error.into()),
            }
            let retry = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = frees.changed() => {
                    if changed.is_err() {
                        return Err(WatchError::ShuttingDown.into());
                    }
                }
                _ = ended(&mut following) => {
                    return Err(WatchError::ShuttingDown.into());
                }
                () = retry => {}
                () = tokio::time::sleep_until(deadline) => return self.refused(request).await,
            }
        }
    }

    fn acquired(&self, waited: bool) {
        let label = if waited { "true" } else { "false" };
        self.inner
            .metrics
            .lock_acquisitions
            .with_label_values(&[label])
            .inc();
    }

    /// `SET name holder NEX PX ttl`. The SET runs in its own task, in the
    /// holder's turn on this lock, so that if this future is dropped (the
    /// client went away) while the SET is out, the lock it may have taken
    /// is released after its reply and before the holder's next SET (a
    /// retry's), not raced by a VDEL on another connection.
    async fn try_set(&self, request: &Acquire) -> Result<SetOutcome, RequestError> {
        let (reply, outcome) = oneshot::channel();
        // Sent once the outcome was read: a requester dropped between the
        // reply and reading it never saw a 200 either.
        let (read, was_read) = oneshot::channel::<()>();
        let inner = Arc::clone(&self.inner);
        let (name, holder) = (request.name.clone(), request.holder.clone());
        let options = SetOptions {
            condition: SetCondition::OnlyIfMissingOrEqual,
            expires_in_ms: Some(request.ttl_ms),
        };
        tokio::spawn(trace::inherit(async move {
            let _turn = inner.turns.take(&name, &holder).await;
            if reply.is_closed() {
                // Gone before its SET was sent: nothing to send or undo.
                return;
            }
            let outcome = inner
                .store
                .set(
                    name.clone(),
                    holder.clone(),
                    options,
                    &RequestOptions::default(),
                )
                .await;
            let applied = matches!(outcome, Ok(SetOutcome::Applied(_)));
            let answered = reply.send(outcome).is_ok() && was_read.await.is_ok();
            if applied && !answered {
                abandon(&inner.store, name, holder).await;
            }
        }));
        let outcome = outcome.await;
        let _ = read.send(());
        outcome.unwrap_or(Err(RequestError::Transport(PoolError::ShuttingDown)))
    }

    /// The answer to a request that did not get the lock: who holds it.
    /// Should it be free by now, one more try.
    async fn refused(&self, request: &Acquire) -> Result<Acquired, LockError> {
        if let Some(holding) = self.holder(request.name.clone()).await? {
            return Ok(Acquired::Refused(Some(holding)));
        }
        match self.try_set(request).await? {
            SetOutcome::Applied(token) => {
                self.acquired(!request.wait.is_zero());
                Ok(Acquired::Held(token))
            }
            SetOutcome::NotApplied => {
                Ok(Acquired::Refused(self.holder(request.name.clone()).await?))
            }
        }
    }

    /// Puts a waiter at the end of `name`'s line, starting the line (and
    /// its watch) if it is the first.
    fn join(&self, name: &Bytes) -> Place {
        let ticket = self.inner.tickets.fetch_add(1, Ordering::Relaxed);
        let turn = Arc::new(Notify::new());
        let mut lines = self.inner.lines();
        let line = lines.entry(name.clone()).or_insert_with(|| {
            Arc::new(Line {
                key: name.clone(),
                waiters: Mutex::new(Waiters::default()),
                frees: watch::Sender::new(0),
                following: watch::Sender::new(Following::Starting),
            })
        });
        let line = Arc::clone(line);
        let mut waiters = line.waiters();
        if waiters.follower.is_none() {
            // The line's watch is registered in the first waiter's trace.
            let task = tokio::spawn(trace::inherit(follow(
                self.inner.hub.clone(),
                Arc::clone(&line),
            )));
            waiters.follower = Some(task.abort_handle());
        }
        if waiters.queue.is_empty() {
            // First in line: the head at once.
            turn.notify_one();
        }
        waiters.queue.push_back((ticket, Arc::clone(&turn)));
        drop(waiters);
        drop(lines);
        self.inner.metrics.lock_waiters.inc();
        Place {
            inner: Arc::clone(&self.inner),
            line,
            ticket,
            turn,
            acquired_at: None,
        }
    }
}

/// Resolves when the hub ended the line's watch (or the line is gone).
async fn ended(following: &mut watch::Receiver<Following>) {
    let _ = following
        .wait_for(|f| matches!(f, Following::Ended))
        .await
        .map(|_| ());
}

/// Follows a line's key with the hub, counting the times it is seen free.
async fn follow(hub: WatchHub, line: Arc<Line>) {
    let mut watcher = loop {
        match hub.watch(vec![line.key.clone()], None).await {
            Ok(watcher) => break watcher,
            // A connection lost under the registration, or a slow store:
            // the waiters keep their places (each until its own deadline)
            // and the line registers again; it is aborted once empty.
            Err(
                error @ (WatchError::Register(RequestError::Transport(_)) | WatchError::Timeout(_)),
            ) => {
                tracing::debug!(%error, "a lock line's registration failed; trying again");
                tokio::time::sleep(RETRY_AFTER_TRANSPORT_ERROR).await;
            }
            Err(error) => {
                line.following.send_replace(Following::Failed(error));
                return;
            }
        }
    };
    line.following.send_replace(Following::Active);
    while let Some(event) = watcher.next().await {
        let free = match event.kind {
            EventKind::Delete => true,
            EventKind::Sync { .. } => event.value.is_none(),
            // Errors are followed by a resync once the hub can follow again.
            // A line's watcher follows no pattern.
            EventKind::Set
            | EventKind::Error
            | EventKind::Listed { .. }
            | EventKind::PatternError => false,
        };
        if free {
            line.frees.send_modify(|count| *count += 1);
        }
    }
    line.following.send_replace(Following::Ended);
}

/// A waiter's place in a line; leaving it (dropping) hands the turn on.
struct Place {
    inner: Arc<Inner>,
    line: Arc<Line>,
    ticket: u64,
    turn: Arc<Notify>,
    /// Set when this waiter acquired: the `frees` count before its SET.
    acquired_at: Option<u64>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.inner.metrics.lock_waiters.dec();
        // Lines, then waiters: the order `join` takes them in.
        let mut lines = self.inner.lines();
        let mut waiters = self.line.waiters();
        let was_head = waiters
            .queue
            .front()
            .is_some_and(|(t, _)| *t == self.ticket);
        waiters.queue.retain(|(ticket, _)| *ticket != self.ticket);
        if waiters.queue.is_empty() {
            if let Some(follower) = waiters.follower.take() {
                // Dropping the task's watcher ends the registration.
                follower.abort();
            }
            drop(waiters);
            if lines
                .get(&self.line.key)
                .is_some_and(|line| Arc::ptr_eq(line, &self.line))
            {
                lines.remove(&self.line.key);
            }
            return;
        }
        if was_head {
            waiters.handed_over_at = self.acquired_at;
            if let Some((_, next)) = waiters.queue.front() {
                next.notify_one();
            }
        }
    }
}

/// Releases a lock taken for a requester that went away.
async fn abandon(store: &StoreClient, name: Bytes, holder: Bytes) {
    match store.vdel(name, holder, None).await {
        Ok(outcome) => tracing::debug!(?outcome, "released a lock whose requester went away"),
        Err(error) => {
            tracing::warn!(%error, "could not release a lock whose requester went away")
        }
    }
}

/// A (lock name, holder) pair and its turn.
type TurnsByPair = HashMap<(Bytes, Bytes), Arc<tokio::sync::Mutex<()>>>;

/// One turn per (lock, holder) pair: the SETs of one holder on one lock,
/// and the release of an abandoned one, reach the store one at a time.
#[derive(Debug, Default)]
struct HolderTurns {
    /// Only pairs with a request taking or waiting for its turn.
    pairs: Mutex<TurnsByPair>,
}

impl HolderTurns {
    fn pairs(&self) -> MutexGuard<'_, TurnsByPair> {
        self.pairs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for `holder`'s turn on `name`; it lasts until the guard drops.
    async fn take<'a>(&'a self, name: &Bytes, holder: &Bytes) -> HolderTurn<'a> {
        let pair = (name.clone(), holder.clone());
        let turn = Arc::clone(self.pairs().entry(pair.clone()).or_default());
        HolderTurn {
            turns: self,
            guard: Some(turn.lock_owned().await),
            pair,
        }
    }
}

/// A holder's turn on a lock; dropping it passes the turn on and forgets
/// the pair when nobody else waits for it.
struct HolderTurn<'a> {
    turns: &'a HolderTurns,
    guard: Option<OwnedMutexGuard<()>>,
    pair: (Bytes, Bytes),
}

impl Drop for HolderTurn<'_> {
    fn drop(&mut self) {
        let mut pairs = self.turns.pairs();
        // The guard holds one reference; without it, the map's is the last
        // one unless someone waits.
        drop(self.guard.take());
        if pairs
            .get(&self.pair)
            .is_some_and(|turn| Arc::strong_count(turn) == 1)
        {
            pairs.remove(&self.pair);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holding_is_the_value_and_its_version() {
        let version = Hlc::new(1_700_000_000_000, "StateStore");
        let holding = Holding::from(Versioned {
            value: Bytes::from_static(b"me"),
            version: Some(version.clone()),
        });
        assert_eq!(holding.holder, Bytes::from_static(b"me"));
        assert_eq!(holding.fencing_token, Some(version));
    }

    #[tokio::test]
    async fn a_holder_waits_for_its_own_turn_only_and_pairs_are_forgotten() {
        let turns = HolderTurns::default();
        let (lock, me, you) = (
            Bytes::from_static(b"lock"),
            Bytes::from_static(b"me"),
            Bytes::from_static(b"you"),
        );
        let mine = turns.take(&lock, &me).await;
        // Another holder's turn does not wait for mine.
        drop(turns.take(&lock, &you).await);
        let next = turns.take(&lock, &me);
        tokio::pin!(next);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), next.as_mut())
                .await
                .is_err()
        );
        drop(mine);
        drop(next.await);
        assert!(turns.pairs().is_empty());
    }

    #[test]
    fn default_limits_are_five_minutes_and_a_kibibyte() {
        let settings = LockSettings::default();
        assert_eq!(settings.max_wait, Duration::from_secs(300));
        assert_eq!(settings.max_holder_bytes, 1024);
    }
}
