//! Writes conditional on an etag, correct across any number of gateways.
//!
//! The store compares no versions, so a conditional write serializes
//! itself on a lease key per key, and fences its writes with the lease's
//! version (the store keeps the newest fencing token a key was written
//! with and refuses older ones):
//!
//! 1. `SET lease holder NX PX ttl` (waiting while another holds it): the
//!    reply's version is this write's fencing token `T`.
//! 2. `GET key`: its version must be the etag (an absent key never matches).
//! 3. A save first **claims** the key: `SET key <the value read> NEX` with
//!    `__ft=T`. It lands only if the key still holds what was read, and
//!    from then on the store refuses every write fenced with an older
//!    token: a gateway that was paused past its lease between its own
//!    steps 2 and 4 is refused, whatever order the two writes reach the
//!    store in.
//! 4. The write, fenced with `T`: `SET key value` (a save) or
//!    `VDEL key <the value read>` (a delete: it lands only if the value is
//!    still the one read).
//! 5. `VDEL lease holder`, or the lease expires.
//!
//! A store refusal for an older token at 3 or 4 means a newer holder
//! wrote first: the etag no longer matches. Writes without an etag to a
//! key that carries a token take the same lease (without 2 and 3), since
//! the store refuses them without one; with transactions on, every write
//! without an etag does (a `first-write` as a fenced `SET NX`).
//!
//! What fencing cannot cover (documented in docs/dapr.md): the store
//! forgets a deleted key's token, so a save whose gateway was paused past
//! its lease after step 3 lands if another gateway deleted the key with
//! the same etag meanwhile; and a write outside the Dapr API of the very
//! bytes the key holds is not seen as a change.

use bytes::Bytes;

use super::error::DaprError;
use super::lease::{self, Resolve, fenced, is_outdated, lease_key};
use super::settings::DaprSettings;
use crate::protocol::{Hlc, SetCondition, SetOptions};
use crate::store::{RequestError, SetOutcome, StoreClient, VdelOutcome, Versioned};

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
    let fenced = fenced(&token);
    let Some(expected) = expected else {
        // No etag: the write wins; a refusal for an older token means a
        // newer holder's write came after it, which is as good. A
        // `first-write` finds the key present then, as when `NX` fails.
        let only_if_absent = matches!(
            &write,
            Write::Set { options, .. } if options.condition == SetCondition::OnlyIfMissing
        );
        // Whether it landed (an absent key is deleted all the same).
        let landed = match write {
            Write::Set { value, options } => store
                .set(key, value, options, &fenced)
                .await
                .map(|outcome| matches!(outcome, SetOutcome::Applied(_))),
            Write::Delete => store.del(key, Some(token)).await.map(|_| true),
        };
        return match landed {
            Ok(true) => Ok(()),
            Ok(false) => Err(DaprError::EtagMismatch),
            Err(error) if is_outdated(&error) && only_if_absent => Err(DaprError::EtagMismatch),
            Err(error) if is_outdated(&error) => Ok(()),
            Err(error) => Err(error.into()),
        };
    };
    let read = match store.get(key.clone()).await? {
        Some(Versioned {
            value,
            version: Some(version),
        }) if version == expected => value,
        _ => return Err(DaprError::EtagMismatch),
    };
    match write {
        Write::Set { value, options } => {
            let claim = SetOptions {
                condition: SetCondition::OnlyIfMissingOrEqual,
                expires_in_ms: None,
            };
            match fenced_outcome(store.set(key.clone(), read, claim, &fenced).await)? {
                SetOutcome::Applied(_) => {}
                SetOutcome::NotApplied => return Err(DaprError::EtagMismatch),
            }
            fenced_outcome(store.set(key, value, options, &fenced).await)?;
            Ok(())
        }
        Write::Delete => match fenced_outcome(store.vdel(key, read, Some(token)).await)? {
            VdelOutcome::Deleted(_) => Ok(()),
            VdelOutcome::Missing | VdelOutcome::ValueDiffers => Err(DaprError::EtagMismatch),
        },
    }
}

/// A fenced request's result, with a refusal for an older token read as
/// the etag mismatch it is.
fn fenced_outcome<T>(result: Result<T, RequestError>) -> Result<T, DaprError> {
    match result {
        Err(error) if is_outdated(&error) => Err(DaprError::EtagMismatch),
        other => other.map_err(DaprError::from),
    }
}
