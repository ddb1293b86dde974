//! The worker: takes every request that is waiting (a batch), runs them on
//! the [`Keyspace`] under a mutex, makes persisted changes durable with one
//! `fsync` for the whole batch, then publishes replies and notifications and
//! acknowledges the requests.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;
use tokio::sync::{mpsc, watch};

use super::acl::AccessList;
use super::error::EmulatorError;
use super::keyspace::Keyspace;
use super::persist::{Log, Record};
use super::request::{Handled, Limits, collect, handle_request};
use crate::protocol::hlc;

/// Most requests handled (and made durable) together.
const MAX_BATCH: usize = 256;

/// Handles batches of requests and expiries.
pub(super) struct Worker {
    pub(super) client: AsyncClient,
    pub(super) store: Arc<Mutex<Keyspace>>,
    pub(super) acl: Option<AccessList>,
    pub(super) log: Option<Log>,
    /// The broker's maximum packet size from the last CONNACK (0: none).
    pub(super) broker_max_packet: Arc<AtomicU32>,
}

impl Worker {
    fn store(&self) -> MutexGuard<'_, Keyspace> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) async fn run(
        mut self,
        mut requests: mpsc::Receiver<Publish>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), EmulatorError> {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let next_expiry = self.store().next_expiry();
            let expiry = async {
                match next_expiry {
                    Some(at) => {
                        let wait = at.saturating_sub(hlc::now_ms());
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stop.changed() => return Ok(()),
                received = requests.recv_many(&mut batch, MAX_BATCH) => {
                    if received == 0 {
                        return Ok(());
                    }
                    self.handle_batch(&mut batch).await?;
                }
                () = expiry => self.handle_batch(&mut batch).await?,
            }
        }
    }

    /// Runs the requests (and any due expiry), syncs what must be durable,
    /// then publishes and acks.
    async fn handle_batch(&mut self, batch: &mut Vec<Publish>) -> Result<(), EmulatorError> {
        let mut messages = Vec::with_capacity(batch.len() * 2);
        let mut records = Vec::new();
        {
            let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
            let now = hlc::now_ms();
            let expired = store.expire(now);
            collect(expired, None, &mut messages, &mut records);
            let limits = Limits {
                acl: self.acl.as_ref(),
                broker_max_packet: match self.broker_max_packet.load(Ordering::Acquire) {
                    0 => None,
                    max => Some(max),
                },
            };
            for request in batch.iter_mut() {
                match handle_request(&mut store, &limits, request, now) {
                    Handled::Dropped => {}
                    Handled::Refused(message) => messages.push(message),
                    Handled::Served(outcome, reply_to) => {
                        collect(outcome, Some(reply_to), &mut messages, &mut records);
                    }
                }
            }
        }
        if let (Some(log), false) = (&mut self.log, records.is_empty()) {
            let mut encoded = Vec::new();
            for record in &records {
                record.encode(&mut encoded);
            }
            if let Err(error) = log.append(encoded).await {
                tracing::error!(%error, "cannot make changes durable; stopping");
                return Err(error.into());
            }
            if log.needs_compaction() {
                let live = live_records(&self.store.lock().unwrap_or_else(PoisonError::into_inner));
                if let Err(error) = log.compact_async(live).await {
                    tracing::error!(%error, "cannot rewrite the persistence log; stopping");
                    return Err(error.into());
                }
            }
        }
        for message in messages {
            let published = self
                .client
                .publish_with_properties(
                    message.topic,
                    QoS::AtLeastOnce,
                    false,
                    message.payload,
                    message.properties,
                )
                .await;
            // Topics were checked (no wildcards), so only a closed channel fails.
            if published.is_err() {
                return Err(EmulatorError::Stopped("the MQTT client is gone".into()));
            }
        }
        for request in batch.drain(..) {
            if self.client.ack(&request).await.is_err() {
                return Err(EmulatorError::Stopped("the MQTT client is gone".into()));
            }
        }
        Ok(())
    }
}

/// A record for every persisted key: the content of a rewritten log.
pub(super) fn live_records(store: &Keyspace) -> Vec<Record> {
    store
        .persistent_entries()
        .map(|(key, entry)| Record::Set {
            key: key.clone(),
            entry: entry.clone(),
        })
        .collect()
}
