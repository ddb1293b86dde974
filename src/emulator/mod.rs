//! The state store emulator: the AIO state store protocol served by an MQTT5
//! client of any broker, so that the gateway and the official SDK clients
//! can be developed and tested without an AIO cluster.
//!
//! Two tasks: the *poll loop* drives the rumqttc event loop and never awaits
//! the client (rumqttc can freeze otherwise); it forwards requests to the
//! *worker*, which takes every request that is waiting (a batch), runs them
//! on the [`Keyspace`] under a mutex, makes persisted changes durable with one
//! `fsync` for the whole batch, then publishes replies and notifications and
//! acknowledges the requests (manual acks: a request is acked once handled).
//!
//! KEYNOTIFY registrations belong to the client id of the request's
//! `__srcId`. The real service drops a client's registrations when it
//! disconnects; an MQTT client cannot see other clients disconnect, so with
//! an external broker **registrations persist until `KEYNOTIFY STOP` or an
//! emulator restart** (a reconnecting SDK client registers again, which is
//! harmless). An embedded broker that does see disconnects calls
//! [`EmulatorHandle::client_disconnected`].
//!
//! SCAN pages are sized to the broker's maximum packet size (from CONNACK)
//! less each reply's topic and properties, so that no reply is too large to
//! publish; see [`Keyspace::scan`] for the rest of its rules.
//!
//! - `config`: [`EmulatorConfig`] and its defaults.
//! - `error`: [`EmulatorError`].
//! - `poll_loop`: the MQTT side: the connection's options and the poll loop.
//! - `worker`: batches of requests: run, made durable, published, acked.
//! - `request`: one request's envelope checked and run, and its outcome
//!   turned into messages.
//! - `keyspace`, `entry`, `acl`, `persist`: the store itself ([`Keyspace`]), its entries,
//!   access lists and the persistence log (key patterns are
//!   `protocol::glob`).

mod acl;
mod config;
mod entry;
mod error;
mod keyspace;
mod persist;
mod poll_loop;
mod request;
mod worker;

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rumqttc::v5::AsyncClient;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use acl::{Access, AccessList, AclError, Grant};
pub use config::{EmulatorConfig, STARTUP_TIMEOUT};
pub use entry::Entry;
pub use error::EmulatorError;
pub use keyspace::{
    Answer, Envelope, KEY_TOO_LONG_TO_LIST, KEY_TOO_LONG_TO_WATCH, Keyspace, MAX_TOPIC_BYTES,
    NODE_ID, Outcome, Quota, ScanLimits, WatcherNotice,
};
pub use persist::{ID_FILE, LOG_FILE, Log, PersistError, Record};

use crate::mqtt::REQUEST_CHANNEL_CAPACITY;
use crate::protocol::{REQUEST_TOPIC, hlc};
use poll_loop::Status;
use worker::{Worker, live_records};

/// How long shutdown waits for the worker to finish its batch.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// A cheap handle on a running emulator's store, for whoever sees clients
/// disconnect (the dev mode's embedded broker).
#[derive(Debug, Clone)]
pub struct EmulatorHandle {
    store: Arc<Mutex<Keyspace>>,
}

impl EmulatorHandle {
    fn store(&self) -> MutexGuard<'_, Keyspace> {
        // The store is consistent between commands, so a poisoned lock is usable.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops every KEYNOTIFY registration of `client_id`, as the real
    /// service does when a client disconnects.
    pub fn client_disconnected(&self, client_id: &str) {
        self.store().client_disconnected(client_id);
    }

    /// Number of keys held.
    pub fn key_count(&self) -> usize {
        self.store().len()
    }

    /// Number of (client, key) KEYNOTIFY registrations.
    pub fn registrations(&self) -> usize {
        self.store().registrations()
    }
}

/// A running emulator.
#[derive(Debug)]
pub struct Emulator {
    client: AsyncClient,
    handle: EmulatorHandle,
    stop: watch::Sender<bool>,
    poll: JoinHandle<()>,
    worker: Option<JoinHandle<Result<(), EmulatorError>>>,
}

impl Emulator {
    /// Replays the persistence log (if any), connects, subscribes to the
    /// request topic, and returns once requests are being served.
    pub async fn start(config: EmulatorConfig) -> Result<Emulator, EmulatorError> {
        let quota = Quota {
            max_keys: config.max_keys,
            max_bytes: config.max_bytes,
        };
        let mut store = Keyspace::new(quota, hlc::now_ms());
        store.set_scan_limits(config.scan_limits);
        let log = match &config.data_dir {
            Some(dir) => Some(open_log(dir, &mut store)?),
            None => None,
        };
        let store = Arc::new(Mutex::new(store));
        let broker_max_packet = Arc::new(AtomicU32::new(0));

        let options = poll_loop::options(&config);
        let (client, eventloop) = AsyncClient::new(options, REQUEST_CHANNEL_CAPACITY);
        let (requests_tx, requests_rx) = mpsc::channel(config.request_queue.max(1));
        let (status_tx, mut status_rx) = watch::channel(Status::Connecting {
            last_error: "none yet".into(),
        });
        let (stop, stop_rx) = watch::channel(false);

        let poll = tokio::spawn(poll_loop::run(
            eventloop,
            client.clone(),
            requests_tx,
            status_tx,
            Arc::clone(&broker_max_packet),
        ));
        let worker = Worker {
            client: client.clone(),
            store: Arc::clone(&store),
            acl: config.acl,
            log,
            broker_max_packet,
        };
        let worker = tokio::spawn(worker.run(requests_rx, stop_rx));
        let emulator = Emulator {
            client,
            handle: EmulatorHandle { store },
            stop,
            poll,
            worker: Some(worker),
        };

        let _ = tokio::time::timeout(
            config.startup_timeout,
            status_rx.wait_for(|status| !matches!(status, Status::Connecting { .. })),
        )
        .await;
        let status = status_rx.borrow().clone();
        match status {
            Status::Serving if !emulator.poll.is_finished() => {
                tracing::info!(
                    broker = %format!("{}:{}", config.broker_host, config.broker_port),
                    client_id = %config.client_id,
                    persistence = ?config.data_dir,
                    "state store emulator serving {REQUEST_TOPIC}"
                );
                Ok(emulator)
            }
            Status::Serving => Err(EmulatorError::Stopped(
                "the connection task ended during start-up".into(),
            )),
            Status::Refused(reason) => Err(EmulatorError::SubscriptionRefused(reason)),
            Status::Connecting { last_error } => Err(EmulatorError::NotServing {
                timeout: config.startup_timeout,
                last_error,
            }),
        }
    }

    /// A handle for reporting disconnects and reading counters.
    pub fn handle(&self) -> EmulatorHandle {
        self.handle.clone()
    }

    /// Drops every KEYNOTIFY registration of `client_id` (see the module
    /// documentation for when this is called).
    pub fn client_disconnected(&self, client_id: &str) {
        self.handle.client_disconnected(client_id);
    }

    /// Resolves if the emulator stops by itself, which only a persistence
    /// failure does (it cannot promise durability any more).
    pub async fn stopped(&mut self) -> Result<(), EmulatorError> {
        match self.worker.as_mut() {
            Some(worker) => {
                let result = worker.await;
                self.worker = None;
                flatten(result)
            }
            None => std::future::pending().await,
        }
    }

    /// Stops serving, disconnects cleanly and closes the log.
    pub async fn shutdown(mut self) -> Result<(), EmulatorError> {
        let _ = self.stop.send(true);
        let result = match self.worker.take() {
            // A worker stuck publishing to a wedged broker must not hold
            // shutdown forever.
            Some(mut worker) => match tokio::time::timeout(SHUTDOWN_TIMEOUT, &mut worker).await {
                Ok(joined) => flatten(joined),
                Err(_) => {
                    worker.abort();
                    tracing::warn!("the emulator's worker did not stop in time; aborted");
                    Ok(())
                }
            },
            None => Ok(()),
        };
        if self.client.try_disconnect().is_ok() {
            // The poll loop ends once it has sent the DISCONNECT.
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.poll).await;
        }
        self.poll.abort();
        tracing::info!("state store emulator stopped");
        result
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.poll.abort();
        if let Some(worker) = &self.worker {
            worker.abort();
        }
    }
}

fn flatten(
    result: Result<Result<(), EmulatorError>, tokio::task::JoinError>,
) -> Result<(), EmulatorError> {
    result.map_err(|error| EmulatorError::Stopped(error.to_string()))?
}

/// Opens the log in `dir`, replays it into `store` and compacts it.
fn open_log(dir: &std::path::Path, store: &mut Keyspace) -> Result<Log, EmulatorError> {
    let (mut log, records) = Log::open(dir)?;
    store.set_id(log.store_id(store.id())?);
    let replayed = records.len();
    let now = hlc::now_ms();
    for record in records {
        match record {
            Record::Set { key, entry } => store.restore(key, entry, now),
            Record::Delete { key } => store.forget(&key),
        }
    }
    let live = live_records(store);
    log.compact(&live)?;
    tracing::info!(
        dir = %dir.display(),
        records = replayed,
        keys = live.len(),
        "replayed the persistence log"
    );
    Ok(log)
}
