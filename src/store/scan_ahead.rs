//! SCAN pages read ahead: as soon as a page names the next one's token,
//! that SCAN starts, so the store works on it while the page before goes
//! out; a listing that stops between two responses parks it here for the
//! request that resumes there.
//!
//! A parked page belongs to one listing (an id its cursors carry): a page
//! read during one listing is never handed to another, so what a listing
//! returns was read after it started. At most [`ScanAhead::LISTINGS`] pages
//! are parked, each for at most [`ScanAhead::KEEP_FOR`]; the oldest go
//! first, and a listing whose page went simply SCANs it again.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{RequestError, StoreClient};
use crate::protocol::KeyPage;

/// One SCAN in flight or done, started ahead of its need; dropping it
/// cancels it.
#[derive(Debug)]
pub struct Ahead(JoinHandle<Result<KeyPage, RequestError>>);

impl Ahead {
    /// Starts `SCAN pattern token` on its own task.
    pub fn start(store: &StoreClient, pattern: Bytes, token: Bytes) -> Ahead {
        let store = store.clone();
        Ahead(tokio::spawn(async move {
            store.scan(pattern, Some(token)).await
        }))
    }

    /// The page, or `None` when its task ended without one (a panic).
    pub async fn page(mut self) -> Option<Result<KeyPage, RequestError>> {
        (&mut self.0).await.ok()
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Pages parked between a listing's responses.
#[derive(Debug, Default)]
pub struct ScanAhead {
    parked: Mutex<VecDeque<Parked>>,
}

#[derive(Debug)]
struct Parked {
    listing: u64,
    pattern: Bytes,
    token: Bytes,
    since: Instant,
    ahead: Ahead,
}

impl ScanAhead {
    /// Most pages parked at once (listings paging at the same time).
    pub const LISTINGS: usize = 16;

    /// How long a parked page waits for its listing's next request.
    pub const KEEP_FOR: Duration = Duration::from_secs(5);

    /// Keeps `ahead`, the page at `token` of `listing` over `pattern`, for
    /// that listing's next request.
    pub fn park(&self, listing: u64, pattern: Bytes, token: Bytes, ahead: Ahead) {
        let mut parked = self.lock();
        let now = Instant::now();
        parked.retain(|page| now.duration_since(page.since) < Self::KEEP_FOR);
        if parked.len() >= Self::LISTINGS {
            parked.pop_front();
        }
        parked.push_back(Parked {
            listing,
            pattern,
            token,
            since: now,
            ahead,
        });
    }

    /// The page parked for `listing` at `token` over `pattern`, if any.
    pub fn take(&self, listing: u64, pattern: &[u8], token: &[u8]) -> Option<Ahead> {
        let mut parked = self.lock();
        let index = parked.iter().position(|page| {
            page.listing == listing && page.token == token && page.pattern == pattern
        })?;
        let page = parked.remove(index)?;
        (page.since.elapsed() < Self::KEEP_FOR).then_some(page.ahead)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Parked>> {
        // The list stays consistent whatever a panicking holder did.
        self.parked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
