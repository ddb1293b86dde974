//! One request: its envelope checked the AIO RPC way, run on the store, and
//! its outcome turned into the reply and notifications to publish.

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};

use super::acl::{Access, AccessList};
use super::keyspace::{Envelope, Keyspace, Outcome};
use super::persist::Record;
use crate::mqtt::MAX_PACKET_SIZE;
use crate::protocol::{
    CONTENT_TYPE, PROTOCOL_VERSION, Request, STATUS_OK, StoreError, is_forbidden_response_topic,
    notify_topic, property,
};

/// AIO RPC properties of replies that reject the envelope (not the payload).
pub(super) mod status {
    /// `__stMsg`: why.
    pub const MESSAGE: &str = crate::protocol::property::STATUS_MESSAGE;
    /// `__propName`: which property was wrong.
    pub const PROPERTY_NAME: &str = "__propName";
    /// `__supProtMajVer`: the protocol major versions served.
    pub const SUPPORTED_MAJOR_VERSIONS: &str = "__supProtMajVer";
    /// `__requestProtVer`: the version the request asked for.
    pub const REQUEST_PROTOCOL_VERSION: &str = "__requestProtVer";
    /// Bad request.
    pub const BAD_REQUEST: &str = "400";
    /// Overloaded, try again (what the SDK executors send on clock drift).
    pub const SERVICE_UNAVAILABLE: &str = "503";
    /// Protocol version not supported.
    pub const VERSION_NOT_SUPPORTED: &str = "505";
}

/// One MQTT message to send.
pub(super) struct Message {
    pub(super) topic: String,
    pub(super) payload: Vec<u8>,
    pub(super) properties: PublishProperties,
}

/// Adds an outcome's reply and notifications to the batch's messages.
pub(super) fn collect(
    outcome: Outcome,
    reply: Option<ReplyTo>,
    messages: &mut Vec<Message>,
    records: &mut Vec<Record>,
) {
    if let Some(reply) = reply {
        let mut user_properties = vec![
            (property::STATUS.into(), STATUS_OK.into()),
            (property::PROTOCOL_VERSION.into(), PROTOCOL_VERSION.into()),
        ];
        if let Some(version) = &outcome.version {
            user_properties.push((property::TIMESTAMP.into(), version.to_string()));
        }
        messages.push(Message {
            topic: reply.topic,
            payload: outcome.reply.encode(),
            properties: PublishProperties {
                correlation_data: Some(reply.correlation_data),
                content_type: Some(CONTENT_TYPE.into()),
                message_expiry_interval: reply.message_expiry_interval,
                user_properties,
                ..PublishProperties::default()
            },
        });
    }
    for event in outcome.events {
        messages.push(Message {
            topic: notify_topic(&event.client_id, &event.key),
            payload: event.notification.encode(),
            properties: PublishProperties {
                content_type: Some(CONTENT_TYPE.into()),
                user_properties: vec![
                    (property::TIMESTAMP.into(), event.version.to_string()),
                    (property::PROTOCOL_VERSION.into(), PROTOCOL_VERSION.into()),
                ],
                ..PublishProperties::default()
            },
        });
    }
    records.extend(outcome.records);
}

/// Where a reply goes.
pub(super) struct ReplyTo {
    topic: String,
    correlation_data: Bytes,
    message_expiry_interval: Option<u32>,
}

/// What became of one request.
pub(super) enum Handled {
    /// No usable response topic: logged and dropped.
    Dropped,
    /// The envelope is wrong: answered the AIO RPC way (`__stat` 400 or 505
    /// with `__stMsg`) without running the request.
    Refused(Message),
    /// Run; the outcome goes back to the requester.
    Served(Outcome, ReplyTo),
}

/// What bounds the requests of a batch.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Limits<'a> {
    /// Who may read and write which keys.
    pub(super) acl: Option<&'a AccessList>,
    /// The broker's maximum packet size, if it announced one.
    pub(super) broker_max_packet: Option<u32>,
}

/// Room in a reply packet for everything but the payload: fixed header,
/// packet id, property lengths, content type, message expiry, `__stat`
/// and `__protVer` take under 100 bytes; topic and correlation data are
/// added to it.
const REPLY_OVERHEAD: usize = 128;

/// The largest payload a reply to `reply_to` can carry: what the broker
/// accepts, and never more than what this crate's clients accept.
fn reply_limit(broker_max_packet: Option<u32>, reply_to: &ReplyTo) -> usize {
    let max_packet = broker_max_packet.map_or(MAX_PACKET_SIZE, |max| max.min(MAX_PACKET_SIZE));
    usize::try_from(max_packet)
        .unwrap_or(usize::MAX)
        .saturating_sub(REPLY_OVERHEAD + reply_to.topic.len() + reply_to.correlation_data.len())
}

/// Checks one request's envelope and runs it.
pub(super) fn handle_request(
    store: &mut Keyspace,
    limits: &Limits<'_>,
    request: &mut Publish,
    now_ms: u64,
) -> Handled {
    let properties = request.properties.take().unwrap_or_default();
    let Some(topic) = properties.response_topic else {
        tracing::warn!("request without a response topic dropped");
        return Handled::Dropped;
    };
    if is_forbidden_response_topic(&topic) {
        // The real service disconnects such a client; we cannot, so we drop.
        tracing::warn!(%topic, "request naming a forbidden response topic dropped");
        return Handled::Dropped;
    }
    let Some(correlation_data) = properties.correlation_data else {
        return rejection(
            topic,
            None,
            status::BAD_REQUEST,
            &[
                (status::MESSAGE, "Correlation data missing"),
                (status::PROPERTY_NAME, "Correlation Data"),
            ],
        );
    };
    let reply_to = ReplyTo {
        topic,
        correlation_data,
        message_expiry_interval: properties.message_expiry_interval,
    };
    if request.qos != QoS::AtLeastOnce {
        return rejection(
            reply_to.topic,
            Some(reply_to.correlation_data),
            status::BAD_REQUEST,
            &[(
                status::MESSAGE,
                "state store requests must be published at QoS 1",
            )],
        );
    }

    let mut envelope = Envelope {
        reply_limit: Some(reply_limit(limits.broker_max_packet, &reply_to)),
        acl: limits.acl,
        ..Envelope::default()
    };
    let mut client_id = None;
    for (name, value) in &properties.user_properties {
        match name.as_str() {
            property::SOURCE_ID => client_id = Some(value.as_str()),
            property::TIMESTAMP => envelope.timestamp = Some(value.as_str()),
            property::FENCING_TOKEN => envelope.fencing_token = Some(value.as_str()),
            property::PERSISTENCE => envelope.persist = value.eq_ignore_ascii_case("true"),
            property::PROTOCOL_VERSION if !is_supported_version(value) => {
                return rejection(
                    reply_to.topic,
                    Some(reply_to.correlation_data),
                    status::VERSION_NOT_SUPPORTED,
                    &[
                        (status::MESSAGE, "unsupported protocol version"),
                        (status::SUPPORTED_MAJOR_VERSIONS, "1"),
                        (status::REQUEST_PROTOCOL_VERSION, value),
                    ],
                );
            }
            _ => {}
        }
    }
    // Without `__srcId`, the SDKs' response topic `clients/{id}/...` names
    // the client; failing that, KEYNOTIFY registers the empty client id.
    envelope.client_id = client_id
        .or_else(|| client_of_response_topic(&reply_to.topic))
        .unwrap_or_default();

    let outcome = match Request::decode(&request.payload) {
        Err(error) => Outcome::error(error),
        Ok(command) => {
            let access = if command.is_write() {
                Access::Write
            } else {
                Access::Read
            };
            // SCAN has no key: it lists only what the client may read.
            let refused = command
                .key()
                .zip(limits.acl)
                .is_some_and(|(key, acl)| !acl.allows(envelope.client_id, key, access));
            if refused {
                Outcome::error(StoreError::NotAuthorized)
            } else {
                tracing::trace!(
                    verb = command.verb(),
                    client = envelope.client_id,
                    "request"
                );
                store.execute(command, &envelope, now_ms)
            }
        }
    };
    Handled::Served(outcome, reply_to)
}

/// A reply that refuses the envelope: `__stat` other than 200, no payload.
fn rejection(
    topic: String,
    correlation_data: Option<Bytes>,
    status_code: &str,
    details: &[(&str, &str)],
) -> Handled {
    tracing::debug!(%topic, status = status_code, ?details, "request refused");
    Handled::Refused(rejection_message(
        topic,
        correlation_data,
        status_code,
        details,
    ))
}

/// The message of a [`rejection`].
pub(super) fn rejection_message(
    topic: String,
    correlation_data: Option<Bytes>,
    status_code: &str,
    details: &[(&str, &str)],
) -> Message {
    let mut user_properties = vec![
        (property::STATUS.to_owned(), status_code.to_owned()),
        (
            property::PROTOCOL_VERSION.to_owned(),
            PROTOCOL_VERSION.to_owned(),
        ),
    ];
    user_properties.extend(
        details
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
    );
    Message {
        topic,
        payload: Vec::new(),
        properties: PublishProperties {
            correlation_data,
            user_properties,
            ..PublishProperties::default()
        },
    }
}

fn is_supported_version(version: &str) -> bool {
    let mut parts = version.split('.');
    parts.next() == Some("1")
        && parts.all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

fn client_of_response_topic(topic: &str) -> Option<&str> {
    let rest = topic.strip_prefix("clients/")?;
    let (client, _) = rest.split_once('/')?;
    (!client.is_empty()).then_some(client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulator::{NODE_ID, Quota, WatcherNotice};
    use crate::protocol::{Hlc, REQUEST_TOPIC, Reply, response_topic};

    const NOW: u64 = 1_700_000_000_000;

    fn request(payload: &[u8], qos: QoS, edit: impl FnOnce(&mut PublishProperties)) -> Publish {
        let mut properties = PublishProperties {
            response_topic: Some(response_topic("app")),
            correlation_data: Some(Bytes::from_static(&[7; 16])),
            content_type: Some(CONTENT_TYPE.into()),
            user_properties: vec![
                (property::SOURCE_ID.into(), "app".into()),
                (property::TIMESTAMP.into(), Hlc::new(NOW, "app").to_string()),
                (property::PROTOCOL_VERSION.into(), "1.0".into()),
            ],
            ..PublishProperties::default()
        };
        edit(&mut properties);
        Publish::new(REQUEST_TOPIC, qos, payload.to_vec(), Some(properties))
    }

    fn handle(publish: Publish, acl: Option<&AccessList>) -> Handled {
        let mut store = Keyspace::new(Quota::default(), NOW);
        let mut publish = publish;
        let limits = Limits {
            acl,
            ..Limits::default()
        };
        handle_request(&mut store, &limits, &mut publish, NOW)
    }

    fn refusal(handled: Handled) -> (Option<Bytes>, Vec<(String, String)>) {
        match handled {
            Handled::Refused(message) => (
                message.properties.correlation_data,
                message.properties.user_properties,
            ),
            _ => panic!("not refused"),
        }
    }

    fn status_of(properties: &[(String, String)]) -> &str {
        &properties
            .iter()
            .find(|(name, _)| name == property::STATUS)
            .expect("__stat")
            .1
    }

    const GET: &[u8] = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";

    #[test]
    fn requests_without_a_usable_response_topic_are_dropped() {
        let edits: [fn(&mut PublishProperties); 4] = [
            |p| p.response_topic = None,
            |p| p.response_topic = Some(REQUEST_TOPIC.into()),
            |p| p.response_topic = Some(format!("{}/x", crate::protocol::NOTIFY_TOPIC_ROOT)),
            |p| p.response_topic = Some("replies/#".into()),
        ];
        for edit in edits {
            assert!(matches!(
                handle(request(GET, QoS::AtLeastOnce, edit), None),
                Handled::Dropped
            ));
        }
        let mut store = Keyspace::new(Quota::default(), NOW);
        let mut bare = Publish::new(REQUEST_TOPIC, QoS::AtLeastOnce, GET.to_vec(), None);
        assert!(matches!(
            handle_request(&mut store, &Limits::default(), &mut bare, NOW),
            Handled::Dropped
        ));
    }

    #[test]
    fn missing_correlation_data_and_qos_0_are_refused_with_400() {
        let (correlation, properties) = refusal(handle(
            request(GET, QoS::AtLeastOnce, |p| p.correlation_data = None),
            None,
        ));
        assert_eq!(correlation, None);
        assert_eq!(status_of(&properties), "400");
        let (correlation, properties) =
            refusal(handle(request(GET, QoS::AtMostOnce, |_| {}), None));
        assert_eq!(correlation, Some(Bytes::from_static(&[7; 16])));
        assert_eq!(status_of(&properties), "400");
    }

    #[test]
    fn unsupported_protocol_versions_are_refused_with_505() {
        for version in ["2.0", "x", "1.", ""] {
            let (_, properties) = refusal(handle(
                request(GET, QoS::AtLeastOnce, |p| {
                    p.user_properties[2].1 = version.into();
                }),
                None,
            ));
            assert_eq!(status_of(&properties), "505", "{version:?}");
        }
        for version in ["1.0", "1", "1.5"] {
            let handled = handle(
                request(GET, QoS::AtLeastOnce, |p| {
                    p.user_properties[2].1 = version.into()
                }),
                None,
            );
            assert!(matches!(handled, Handled::Served(..)), "{version:?}");
        }
    }

    #[test]
    fn payload_errors_and_access_refusals_are_served_as_replies() {
        let Handled::Served(outcome, reply_to) =
            handle(request(b"nonsense", QoS::AtLeastOnce, |_| {}), None)
        else {
            panic!("not served");
        };
        assert_eq!(outcome.reply, Reply::Error(StoreError::SyntaxError));
        assert_eq!(reply_to.topic, response_topic("app"));
        let acl = AccessList::from_json(r#"{ "other": { "read": [""] } }"#).unwrap();
        let Handled::Served(outcome, _) =
            handle(request(GET, QoS::AtLeastOnce, |_| {}), Some(&acl))
        else {
            panic!("not served");
        };
        assert_eq!(outcome.reply, Reply::Error(StoreError::NotAuthorized));
    }

    #[test]
    fn the_client_id_comes_from_src_id_then_the_response_topic() {
        assert_eq!(
            client_of_response_topic(&response_topic("gw-1")),
            Some("gw-1")
        );
        assert_eq!(client_of_response_topic("clients//x"), None);
        assert_eq!(client_of_response_topic("replies/gw-1"), None);
        let acl = AccessList::from_json(r#"{ "app": { "read": [""] } }"#).unwrap();
        let without_src_id = request(GET, QoS::AtLeastOnce, |p| {
            p.user_properties
                .retain(|(name, _)| name != property::SOURCE_ID);
        });
        let Handled::Served(outcome, _) = handle(without_src_id, Some(&acl)) else {
            panic!("not served");
        };
        assert_eq!(outcome.reply, Reply::NotFound);
    }

    #[test]
    fn replies_carry_status_version_and_the_key_version() {
        let mut messages = Vec::new();
        let mut records = Vec::new();
        let version = Hlc::new(NOW, NODE_ID);
        let outcome = Outcome {
            reply: Reply::Ok.into(),
            version: Some(version.clone()),
            events: vec![WatcherNotice {
                client_id: "w".into(),
                key: Bytes::from_static(b"k"),
                notification: crate::protocol::Notification::Delete,
                version: version.clone(),
            }],
            records: Vec::new(),
        };
        let reply_to = ReplyTo {
            topic: "r".into(),
            correlation_data: Bytes::from_static(b"c"),
            message_expiry_interval: Some(9),
        };
        collect(outcome, Some(reply_to), &mut messages, &mut records);
        let [reply, notification] = &messages[..] else {
            panic!("two messages");
        };
        assert_eq!(reply.payload, b"+OK\r\n");
        assert_eq!(
            reply.properties.user_properties,
            vec![
                ("__stat".to_owned(), "200".to_owned()),
                ("__protVer".to_owned(), "1.0".to_owned()),
                ("__ts".to_owned(), version.to_string()),
            ]
        );
        assert_eq!(reply.properties.message_expiry_interval, Some(9));
        assert_eq!(notification.topic, notify_topic("w", b"k"));
        assert_eq!(
            notification.payload,
            b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
        );
        assert_eq!(
            notification.properties.user_properties[0].1,
            version.to_string()
        );
    }
}
