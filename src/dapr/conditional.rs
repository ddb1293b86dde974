//! Writes conditional on an etag, correct across any number of gateways.
//!
//! The store compares no versions, so a conditional write serializes
//! itself on a lease key per key, and fences its writes with the lease's
//! version (the store keeps the newest fencing token a key was written
//! with and refuses older ones):
//!
//! 1. `SET lease holder NX PX ttl` (waiting while another holds it): the
//!    reply's version is this write's fencing token `T`.
//! 2. `GET key`: its version must be the etag (an absent key never
//!    matches); the key's expiry record is read beside it.
//! 3. A save first **claims** the key: `SET key <the value read> NEX
//!    [PX <the time it has left>]` with `__ft=T`. It lands only if the key still holds what was read, and
//!    from then on the store refuses every write fenced with an older
//!    token: a gateway that was paused past its lease between its own
//!    steps 2 and 4 is refused, whatever order the two writes reach the
//!    store in.
//! 4. The write, fenced with `T`: `SET key value` (a save) or
//!    `VDEL key <the value read>` (a delete: it lands only if the value is
//!    still the one read).
//! 5. `VDEL lease holder`, or the lease expires.
//!
//! A refusal for an older token at 3 means a newer holder wrote first
//! (the etag no longer matches), unless the key was not written since the
//! lease was taken: then it carries a token from a writer outside the Dapr
//! API ahead of every lease, and the answer says so
//! ([`DaprError::FencedOut`]; see [`refused_for_token`]). At 4 it means a
//! newer holder wrote after the claim. Writes without an etag to a key
//! that carries a token take the same lease (without 2 and 3), since the
//! store refuses them without one; with transactions on, every write
//! without an etag does (a `first-write` as a fenced `SET NX`).
//!
//! The claim writes the key again, and a write replaces its expiry: it
//! carries the time the key has left when the Dapr API recorded it
//! ([`expiry`]), so a save that fails after its claim leaves the value
//! and its expiry as they were; only the etag (the key's version) changes.
//!
//! What fencing cannot cover (documented in docs/dapr.md): the store
//! forgets a deleted key's token, so a save whose gateway was paused past
//! its lease after step 3 lands if another gateway deleted the key with
//! the same etag meanwhile; and a write outside the Dapr API of the very
//! bytes the key holds is not seen as a change.

use bytes::Bytes;

use super::error::DaprError;
use super::expiry;
use super::lease::{self, Resolve, fenced, is_outdated, lease_key, refused_for_token};
use super::settings::DaprSettings;
use crate::protocol::{Hlc, SetCondition, SetOptions};
use crate::store::{SetOutcome, StoreClient, VdelOutcome, Versioned};

/// What a conditional write does once the etag matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Write {
    /// `SET key value` with these options.
    Set {
        /// The new value.
        value: Bytes,
        /// Its expiry and condition: `Always`, or `OnlyIfMissing` for a
        /// `first-write` without an etag.
        options: SetOptions,
    },
    /// Delete the key.
    Delete,
}

/// Runs `write` on `key` under the key's lease, if `expected` (when given)
/// is the key's version; a transaction holding the lease is resolved by
/// `resolve`.
pub(super) async fn run(
    store: &StoreClient,
    settings: &DaprSettings,
    key: Bytes,
    expected: Option<Hlc>,
    write: Write,
    resolve: Resolve,
) -> Result<(), DaprError> {
    let lease = lease_key(&key);
    let holder = Bytes::from(format!("{:032x}", rand::random::<u128>()));
    let expires_in_ms = u64::try_from(settings.etag_lease.as_millis()).unwrap_or(u64::MAX);
    let token = lease::take(
        store,
        &lease,
        &holder,
        Some(expires_in_ms),
        settings.lease_wait,
        resolve,
    )
    .await?;
    let result = apply(store, key, expected, write, token).await;
    lease::release(store, lease, holder).await;
    result
}

/// Steps 2 to 4 under the lease whose version is `token`.
async fn apply(
    store: &StoreClient,
    key: Bytes,
    expected: Option<Hlc>,
    write: Write,
    token: Hlc,
) -> Result<(), DaprError> {
    let Some(expected) = expected else {
        return unconditional(store, key, write, &token).await;
    };
    let fenced = fenced(&token);
    let (read, recorded) = tokio::join!(store.get(key.clone()), expiry::lookup(store, &key));
    let read = match read? {
        Some(Versioned {
            value,
            version: Some(version),
        }) if version == expected => value,
        _ => return Err(DaprError::EtagMismatch),
    };
    // When the key expires, for the claim to keep it.
    let deadline = recorded?.and_then(|recorded| recorded.deadline_at(&expected));
    let mismatch = Err(DaprError::EtagMismatch);
    match write {
        Write::Set { value, options } => {
            let claim = SetOptions {
                condition: SetCondition::OnlyIfMissingOrEqual,
                expires_in_ms: deadline.map(expiry::time_left),
            };
            let claimed = match store.set(key.clone(), read, claim, &fenced).await {
                Ok(SetOutcome::Applied(version)) => version,
                Ok(SetOutcome::NotApplied) => return mismatch,
                Err(error) if is_outdated(&error) => {
                    return refused_for_token(store, &key, &token, mismatch).await;
                }
                Err(error) => return Err(error.into()),
            };
            match expiry::set_recorded(store, key.clone(), value, options, &fenced).await {
                Ok(_) => Ok(()),
                Err(error) if is_outdated(&error) => mismatch,
                Err(error) => {
                    // The claim stands: the value read, expiring when it
                    // did, under a new version; a later claim keeps it too.
                    if let (Some(deadline), Some(version)) = (deadline, claimed) {
                        expiry::record(store, &key, version, deadline).await;
                    }
                    Err(error.into())
                }
            }
        }
        Write::Delete => match store.vdel(key.clone(), read, Some(token.clone())).await {
            Ok(VdelOutcome::Deleted(_)) => Ok(()),
            Ok(VdelOutcome::Missing | VdelOutcome::ValueDiffers) => mismatch,
            Err(error) if is_outdated(&error) => {
                refused_for_token(store, &key, &token, mismatch).await
            }
            Err(error) => Err(error.into()),
        },
    }
}

/// A write without an etag under the lease whose version is `token`: it
/// wins, unless a `first-write` finds the key present (as when `NX`
/// fails). A refusal for an older token is a later write, ordered after
/// this one, or a key fenced ahead of every lease ([`refused_for_token`]).
async fn unconditional(
    store: &StoreClient,
    key: Bytes,
    write: Write,
    token: &Hlc,
) -> Result<(), DaprError> {
    let written = match write {
        Write::Set { value, options } => {
            let fenced = fenced(token);
            match expiry::set_recorded(store, key.clone(), value, options, &fenced).await {
                Ok(SetOutcome::Applied(_)) => return Ok(()),
                Ok(SetOutcome::NotApplied) => return Err(DaprError::EtagMismatch),
                // A key with a token is present: a first-write fails.
                Err(error)
                    if is_outdated(&error) && options.condition == SetCondition::OnlyIfMissing =>
                {
                    return Err(DaprError::EtagMismatch);
                }
                Err(error) => error,
            }
        }
        Write::Delete => match store.del(key.clone(), Some(token.clone())).await {
            Ok(_) => return Ok(()),
            Err(error) => error,
        },
    };
    if is_outdated(&written) {
        return refused_for_token(store, &key, token, Ok(())).await;
    }
    Err(written.into())
}
