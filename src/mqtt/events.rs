//! What the pool's members report: notifications and connection changes.

use std::sync::OnceLock;

use bytes::Bytes;

use crate::protocol::{Hlc, Notification};

/// A KEYNOTIFY notification received by a member.
#[derive(Debug, Clone)]
pub struct KeyNotification {
    /// The member (index) that received it.
    pub member: usize,
    /// The key, from the notification topic.
    pub key: Bytes,
    /// What happened.
    pub notification: Notification,
    /// `__ts`: the key's version after the change (older services omit it).
    pub version: Option<Hlc>,
}

/// A message received on a topic filter the pool subscribes to for
/// callers ([`super::Pool::add_topic_filter`]), shared by every receiver
/// (`Arc`): a fan-out clones no field.
#[derive(Debug)]
pub struct TopicMessage {
    /// Its topic.
    pub topic: String,
    /// Its payload.
    pub payload: Bytes,
    /// Its MQTT5 content type.
    pub content_type: Option<String>,
    /// The message as JSON for its SSE streams, rendered once by the
    /// first stream that sends it and read by the others.
    pub rendered: OnceLock<String>,
}

impl TopicMessage {
    /// A message as received, not yet rendered.
    pub fn new(topic: String, payload: Bytes, content_type: Option<String>) -> Self {
        Self {
            topic,
            payload,
            content_type,
            rendered: OnceLock::new(),
        }
    }
}

/// A member's connection state changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberEvent {
    /// Connected and subscribed (response and notification topics): usable.
    /// After this, KEYNOTIFY registrations held by this member are gone.
    Subscribed {
        /// Member index.
        member: usize,
    },
    /// Disconnected; its requests failed with `ConnectionLost` (not sent)
    /// or `OutcomeUnknown` (may have been sent).
    Down {
        /// Member index.
        member: usize,
    },
}
