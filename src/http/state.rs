//! What every handler shares ([`AppState`]) and the key API's limits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::access::CallerChecks;
use crate::dapr::app::AppChannel;
use crate::dapr::pubsub::SubscriptionTable;
use crate::dapr::{DaprSettings, DaprStore};
use crate::locks::{LockSettings, Locks};
use crate::metrics::Metrics;
use crate::mqtt::Pool;
use crate::protocol::hlc;
use crate::settings::{self, DEFAULT_MAX_VALUE_BYTES};
use crate::store::StoreClient;
use crate::store::scan_ahead::ScanAhead;
use crate::watch::{TopicHub, WatchHub, WatchSettings};

/// Request size and time limits of the key API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes after percent-decoding (longer: 414).
    pub max_key_bytes: usize,
    /// Largest value when configured (capped by the broker's limit once
    /// known); see [`AppState::value_limit`] (larger: 413).
    pub max_value_bytes: Option<usize>,
    /// Most ops in one batch (more: 413).
    pub max_batch_ops: usize,
    /// Largest batch body, in bytes (larger: 413).
    pub max_batch_bytes: usize,
    /// Largest Dapr request body, and gRPC message either way, in bytes.
    pub dapr_max_body_size: usize,
}

/// The command line's defaults.
impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: settings::DEFAULT_MAX_KEY_BYTES,
            max_value_bytes: None,
            max_batch_ops: settings::DEFAULT_MAX_BATCH_OPS,
            max_batch_bytes: settings::DEFAULT_MAX_BATCH_BYTES,
            dapr_max_body_size: settings::DEFAULT_DAPR_MAX_BODY_SIZE,
        }
    }
}

/// What every handler shares: one `Arc`, since axum clones the state for
/// each extractor of each request.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The contents of [`AppState`].
#[derive(Debug)]
pub struct Shared {
    /// The store, through the broker connections.
    pub store: StoreClient,
    /// SCAN pages read ahead for listings' next requests.
    pub scans_ahead: ScanAhead,
    /// Metric families.
    pub metrics: Metrics,
    /// Request limits.
    pub limits: Limits,
    /// Milliseconds since the epoch; checks fencing tokens (a function so
    /// tests can move time).
    pub clock: fn() -> u64,
    /// Who may call the key API, and what each caller may do.
    pub callers: CallerChecks,
    /// Set once shutdown starts: `/readyz` answers 503 from then on.
    pub draining: AtomicBool,
    /// Key watches shared by every SSE stream.
    pub hub: WatchHub,
    /// Locks and their waiters (who follow keys through `hub`).
    pub locks: Locks,
    /// Dapr's state and lock operations over `store`.
    pub dapr: DaprStore,
    /// The MQTT topics SSE streams follow (`GET /subscribe`).
    pub topics: TopicHub,
    /// The app the gateway calls (`--dapr-app-port`), if any.
    pub app: Option<AppChannel>,
    /// The pub/sub subscriptions delivered to the app.
    pub subscriptions: Arc<SubscriptionTable>,
    /// In-flight slots every batch together may hold: half the pool's,
    /// so that batches never starve one-key requests.
    pub batch_slots: Semaphore,
}

impl AppState {
    /// How long a store request may take (the pool owns it); bounds body
    /// reads too.
    pub fn request_timeout(&self) -> Duration {
        self.store.pool().request_timeout()
    }

    /// The backstop on a whole request: body read plus a slot wait plus the
    /// store round trip, and a second of slack, so nothing hangs even if an
    /// inner timeout fails to fire.
    pub fn backstop(&self) -> Duration {
        let request_timeout = self.request_timeout();
        request_timeout * 2 + settings::slot_wait(request_timeout) + Duration::from_secs(1)
    }

    /// State over a started pool, with the system clock; starts the watch
    /// hub's tasks (so it must run inside a Tokio runtime).
    pub fn new(
        pool: Pool,
        metrics: Metrics,
        limits: Limits,
        callers: CallerChecks,
        watch: WatchSettings,
        locks: LockSettings,
        dapr: DaprSettings,
    ) -> Self {
        let batch_slots = Semaphore::new((pool.capacity() / 2).max(1));
        let topics = TopicHub::new(pool.clone());
        let store = StoreClient::new(pool);
        let hub = WatchHub::start(store.clone(), metrics.clone(), watch);
        let app = dapr
            .app
            .clone()
            .map(|app| AppChannel::new(app, limits.dapr_max_body_size));
        Self(Arc::new(Shared {
            app,
            subscriptions: Arc::default(),
            locks: Locks::new(store.clone(), hub.clone(), metrics.clone(), locks),
            hub,
            dapr: DaprStore::new(store.clone(), dapr),
            topics,
            store,
            scans_ahead: ScanAhead::default(),
            metrics,
            limits,
            clock: hlc::now_ms,
            callers,
            draining: AtomicBool::new(false),
            batch_slots,
        }))
    }

    /// The largest value a PUT may carry right now: the configured limit,
    /// capped by what the broker's packet size allows once known; with
    /// neither, [`DEFAULT_MAX_VALUE_BYTES`].
    pub fn value_limit(&self) -> usize {
        match (
            self.limits.max_value_bytes,
            self.store.pool().max_value_bytes(),
        ) {
            (Some(configured), Some(broker)) => configured.min(broker),
            (Some(limit), None) | (None, Some(limit)) => limit,
            (None, None) => DEFAULT_MAX_VALUE_BYTES,
        }
    }

    /// Whether shutdown has started.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}
