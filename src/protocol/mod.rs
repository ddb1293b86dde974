//! The state store wire protocol as the official SDK clients speak it:
//! payload codec, topics, MQTT5 user property names, hybrid logical clocks
//! and the store's error strings. `docs/protocol.md` says what the code
//! relies on, and where.

mod command;
mod error;
pub mod glob;
pub mod hlc;
mod reply;
pub mod resp;

pub use command::{Request, SetCondition, SetOptions};
pub use error::{DecodeError, StoreError};
pub use hlc::{Hlc, HlcError, HybridClock, NodeId, Stamp};
pub use reply::{KeyPage, Notification, Reply, ScanReply};

/// The state store's service id, part of every topic.
pub const SERVICE_ID: &str = "FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

/// Where requests are published (QoS 1).
pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// The root of notification topics; response topics may not start with it.
pub const NOTIFY_TOPIC_ROOT: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

/// `__protVer` on every request and reply.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The content type of every request and reply.
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// `__stat` on every reply the service sends; the SDKs reject replies without it.
pub const STATUS_OK: &str = "200";

/// MQTT5 user property names.
pub mod property {
    /// HLC: the sender's clock on requests, the key's version on replies and
    /// notifications.
    pub const TIMESTAMP: &str = "__ts";
    /// HLC fencing token on writes.
    pub const FENCING_TOKEN: &str = "__ft";
    /// The requesting client id.
    pub const SOURCE_ID: &str = "__srcId";
    /// Protocol version, `1.0`.
    pub const PROTOCOL_VERSION: &str = "__protVer";
    /// Reply status, `200`.
    pub const STATUS: &str = "__stat";
    /// The status message the SDKs' executors send with a non-200 `__stat`.
    pub const STATUS_MESSAGE: &str = "__stMsg";
    /// `true` on a SET that should survive a restart.
    pub const PERSISTENCE: &str = "aio-persistence";
    /// Broker hint the SDKs send: the client id.
    pub const PARTITION: &str = "$partition";
    /// Broker hint the SDKs send: empty.
    pub const HIGH_PRIORITY: &str = "$high_priority";
}

/// The response topic the Rust SDK uses for `client_id`.
pub fn response_topic(client_id: &str) -> String {
    format!("clients/{client_id}/services/statestore/v1/{SERVICE_ID}/command/invoke/response")
}

/// Whether the service refuses `topic` as a response topic.
pub fn is_forbidden_response_topic(topic: &str) -> bool {
    topic == REQUEST_TOPIC
        || topic.starts_with(NOTIFY_TOPIC_ROOT)
        || topic.is_empty()
        || topic.contains(['+', '#'])
}

/// The topic on which `client_id` receives notifications for `key`.
pub fn notify_topic(client_id: &str, key: &[u8]) -> String {
    format!(
        "{NOTIFY_TOPIC_ROOT}/{}/command/notify/{}",
        hex::encode_upper(client_id),
        hex::encode_upper(key)
    )
}

/// The filter that receives every notification for `client_id`.
pub fn notify_filter(client_id: &str) -> String {
    format!(
        "{NOTIFY_TOPIC_ROOT}/{}/command/notify/+",
        hex::encode_upper(client_id)
    )
}

/// The key a notification topic is about, for the given client; hex is
/// decoded case-insensitively. `None` if the topic is not one of that
/// client's notification topics.
pub fn notify_topic_key(topic: &str, client_id: &str) -> Option<Vec<u8>> {
    let rest = topic.strip_prefix(NOTIFY_TOPIC_ROOT)?.strip_prefix('/')?;
    let (client_hex, rest) = rest.split_once('/')?;
    let key_hex = rest.strip_prefix("command/notify/")?;
    let client = hex::decode(client_hex).ok()?;
    if client != client_id.as_bytes() {
        return None;
    }
    hex::decode(key_hex).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_topic_matches_the_documents_example() {
        assert_eq!(
            notify_topic("client-id1", b"SOMEKEY"),
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559"
        );
    }

    #[test]
    fn notify_topic_key_decodes_any_case() {
        let topic = notify_topic("gw-0", &[0, 0xab, b'/']);
        assert_eq!(notify_topic_key(&topic, "gw-0"), Some(vec![0, 0xab, b'/']));
        assert_eq!(
            notify_topic_key(
                &topic.to_lowercase().replace(
                    "clients/statestore/v1/fa9ae35f-2f64-47cd-9bff-08e2b32a0fe8",
                    NOTIFY_TOPIC_ROOT
                ),
                "gw-0"
            ),
            Some(vec![0, 0xab, b'/'])
        );
        assert_eq!(notify_topic_key(&topic, "gw-1"), None);
        assert_eq!(
            notify_topic_key("clients/x/command/notify/00", "gw-0"),
            None
        );
        assert_eq!(notify_topic_key(&format!("{topic}Z"), "gw-0"), None);
    }

    #[test]
    fn response_topic_is_the_sdks_and_allowed() {
        assert_eq!(
            response_topic("app"),
            "clients/app/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
        );
        assert!(!is_forbidden_response_topic(&response_topic("app")));
        assert!(is_forbidden_response_topic(REQUEST_TOPIC));
        assert!(is_forbidden_response_topic(&notify_topic("app", b"k")));
        assert!(is_forbidden_response_topic(NOTIFY_TOPIC_ROOT));
    }
}
