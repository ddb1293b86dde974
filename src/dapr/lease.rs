//! A key's lease: the one lock that conditional writes and transactions
//! both take before they touch the key, and the fencing token it gives.
//!
//! The lease key ([`lease_key`]) is set with `NX`; the reply's version is
//! the holder's fencing token, and every write the holder makes is fenced
//! with it ([`fenced`]), so the store refuses the writes of a holder that
//! was paused past its lease once a newer one has written
//! ([`is_outdated`]). Whoever finds the lease held by a transaction
//! resolves it through the [`Resolve`] it is given (the transaction's
//! gateway may be gone); a conditional write holding it is waited for.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::error::DaprError;
use crate::mqtt::RequestOptions;
use crate::protocol::{Hlc, SetCondition, SetOptions, StoreError};
use crate::store::{RequestError, SetOutcome, StoreClient};

use super::keys::prefixed;
use crate::store::reserved::LEASE_PREFIX;

/// The lease key of `key`.
pub(super) fn lease_key(key: &[u8]) -> Bytes {
    prefixed(LEASE_PREFIX, key)
}

/// The first pause of a wait for a busy lease; each pause doubles up to
/// [`LONGEST_PAUSE`].
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(2);
/// The longest pause between two looks at a busy lease.
pub(super) const LONGEST_PAUSE: Duration = Duration::from_millis(50);

/// Resolves whatever transaction holds a lease: true when the lease may
/// now be free (try again at once), false when it is held by a live
/// holder (wait).
pub(super) type Resolve =
    for<'a> fn(&'a StoreClient, &'a Bytes) -> BoxFuture<'a, Result<bool, DaprError>>;

/// Takes the lease `lease` for `holder` (`SET NX`, expiring when given):
/// a holder that `resolve` clears is tried again at once, any other is
/// waited for, up to `wait`. The lease's version is the fencing token.
pub(super) async fn take(
    store: &StoreClient,
    lease: &Bytes,
    holder: &Bytes,
    expires_in_ms: Option<u64>,
    wait: Duration,
    resolve: Resolve,
) -> Result<Hlc, DaprError> {
    let deadline = Instant::now() + wait;
    let options = SetOptions {
        condition: SetCondition::OnlyIfMissing,
        expires_in_ms,
    };
    let mut pause = FIRST_PAUSE;
    loop {
        let set = store
            .set(
                lease.clone(),
                holder.clone(),
                options,
                &RequestOptions::default(),
            )
            .await?;
        match set {
            SetOutcome::Applied(Some(token)) => return Ok(token),
            SetOutcome::Applied(None) => {
                return Err(RequestError::UnexpectedReply {
                    verb: "SET",
                    reply: "+OK without the key's version".to_owned(),
                }
                .into());
            }
            SetOutcome::NotApplied if resolve(store, lease).await? => {}
            SetOutcome::NotApplied if Instant::now() + pause < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
            SetOutcome::NotApplied => return Err(DaprError::LeaseBusy(wait)),
        }
    }
}

/// Releases the lease if `holder` still holds it; false when that failed.
/// A failed release is no error: the lease expires, or is resolved.
pub(super) async fn release(store: &StoreClient, lease: Bytes, holder: Bytes) -> bool {
    match store.vdel(lease, holder, None).await {
        Ok(_) => true,
        Err(error) => {
            tracing::debug!(%error, "releasing a lease failed; it expires or is resolved");
            false
        }
    }
}

/// The options of a write fenced with the lease's token.
pub(super) fn fenced(token: &Hlc) -> RequestOptions {
    RequestOptions {
        fencing_token: Some(token.clone()),
        ..RequestOptions::default()
    }
}

/// The store refused a token older than the key's: a newer holder wrote.
pub(super) fn is_outdated(error: &RequestError) -> bool {
    matches!(
        error,
        RequestError::Refused {
            error: StoreError::FencingTokenLowerVersion,
            ..
        }
    )
}

/// What a refusal of a write of `key` fenced with `token` for an older
/// token means, read from the key: written (or deleted) since the lease
/// was taken, a later write is ordered after this one, which `later` says;
/// otherwise the key carries a token from a writer outside the Dapr API
/// that is ahead of every lease, and nothing can be written yet
/// ([`DaprError::FencedOut`]). Versions and lease tokens come from the
/// store's one clock, so "since" is a comparison.
pub(super) async fn refused_for_token(
    store: &StoreClient,
    key: &Bytes,
    token: &Hlc,
    later: Result<(), DaprError>,
) -> Result<(), DaprError> {
    let written_since = match store.get(key.clone()).await? {
        None => true,
        Some(current) => current
            .version
            .as_ref()
            .is_some_and(|version| version > token),
    };
    if written_since {
        later
    } else {
        Err(DaprError::FencedOut)
    }
}
