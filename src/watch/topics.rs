//! Topics followed over SSE (`GET /subscribe`): one broker subscription
//! per topic filter for the whole gateway, held while any stream follows
//! it, and one shared, bounded channel of the messages of every filter
//! that each stream reads and filters by its own. A stream that falls
//! behind the channel's bound skips the messages it missed and is told how
//! many (memory does not grow with slow streams).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{broadcast, watch};

use crate::mqtt::{Pool, TopicMessage, filter_covers};

/// The topic filters followed, counted by stream. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TopicHub {
    pool: Pool,
    followers: Arc<Mutex<HashMap<String, usize>>>,
    /// `true` once the gateway shuts down: every stream ends.
    closed: watch::Sender<bool>,
}

/// What a stream gets next.
#[derive(Debug)]
pub enum Followed {
    /// A message on one of its filters.
    Message(Arc<TopicMessage>),
    /// It fell behind: this many messages (of any filter) were skipped.
    Lagged(u64),
    /// The gateway shuts down.
    Closed,
}

/// One stream's filters; unfollowed when dropped.
#[derive(Debug)]
pub struct TopicFollow {
    hub: TopicHub,
    filters: Vec<String>,
    messages: broadcast::Receiver<Arc<TopicMessage>>,
    closed: watch::Receiver<bool>,
}

impl TopicHub {
    /// The hub over `pool`'s topic subscriptions.
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            followers: Arc::default(),
            closed: watch::channel(false).0,
        }
    }

    /// Ends every stream (the gateway shuts down).
    pub fn shutdown(&self) {
        self.closed.send_replace(true);
    }

    /// Follows `filters` (valid MQTT filters, checked by the caller): the
    /// first follower of a filter subscribes the pool to it.
    pub fn follow(&self, mut filters: Vec<String>) -> TopicFollow {
        filters.sort();
        filters.dedup();
        // Before subscribing: nothing that arrives after is missed.
        let messages = self.pool.topic_messages();
        let mut followers = self.lock();
        for filter in &filters {
            let count = followers.entry(filter.clone()).or_insert(0);
            *count += 1;
            if *count == 1 {
                self.pool.add_topic_filter(filter);
            }
        }
        drop(followers);
        TopicFollow {
            hub: self.clone(),
            filters,
            messages,
            closed: self.closed.subscribe(),
        }
    }

    /// How many filters the gateway subscribes to for streams now.
    pub fn filters(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl TopicFollow {
    /// The next message on one of the stream's filters.
    pub async fn next(&mut self) -> Followed {
        loop {
            let received = tokio::select! {
                _ = self.closed.wait_for(|closed| *closed) => return Followed::Closed,
                received = self.messages.recv() => received,
            };
            match received {
                Ok(message) => {
                    if self
                        .filters
                        .iter()
                        .any(|filter| filter_covers(filter, &message.topic))
                    {
                        return Followed::Message(message);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    return Followed::Lagged(skipped);
                }
                Err(broadcast::error::RecvError::Closed) => return Followed::Closed,
            }
        }
    }
}

impl Drop for TopicFollow {
    fn drop(&mut self) {
        let mut followers = self.hub.lock();
        for filter in &self.filters {
            if let Some(count) = followers.get_mut(filter) {
                *count -= 1;
                if *count == 0 {
                    followers.remove(filter);
                    self.hub.pool.remove_topic_filter(filter);
                }
            }
        }
    }
}
