//! Replies to requests, and KEYNOTIFY notifications.

use bytes::Bytes;

use super::resp::{Frame, encode_array, put_bulk, put_integer};
use super::{DecodeError, StoreError};

/// A reply payload.
///
/// What each shape means depends on the request: `Integer(-1)` is "not
/// applied" for SET NX/NEX and a value mismatch for VDEL; `Integer(n)` is
/// the number deleted for DEL/VDEL and `0` for a KEYNOTIFY STOP of nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Ok,
    /// `:n` (also the document's `-1` spelling of `:-1`).
    Integer(i64),
    /// `$len value` from GET.
    Value(Bytes),
    /// `$-1`: GET of a missing key.
    NotFound,
    /// `-ERR message`
    Error(StoreError),
}

impl Reply {
    /// The payload as the service sends it (`:-1`, never the bare `-1`).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Ok => b"+OK\r\n".to_vec(),
            Self::Integer(n) => {
                let mut out = Vec::with_capacity(8);
                put_integer(&mut out, *n);
                out
            }
            Self::Value(value) => {
                let mut out = Vec::with_capacity(value.len() + 16);
                put_bulk(&mut out, value);
                out
            }
            Self::NotFound => b"$-1\r\n".to_vec(),
            Self::Error(error) => format!("-ERR {}\r\n", error.message()).into_bytes(),
        }
    }

    /// Decodes a reply payload.
    pub fn decode(payload: &Bytes) -> Result<Reply, DecodeError> {
        match Frame::decode(payload)? {
            Frame::Simple(text) if text.as_ref() == b"OK" => Ok(Self::Ok),
            Frame::Simple(_) => Err(DecodeError::UnexpectedShape("simple string other than OK")),
            Frame::Integer(n) => Ok(Self::Integer(n)),
            Frame::Bulk(value) => Ok(Self::Value(value)),
            Frame::Null => Ok(Self::NotFound),
            // The published document's spelling of "not applied".
            Frame::Error(text) if text.as_ref() == b"1" => Ok(Self::Integer(-1)),
            Frame::Error(text) => {
                let text = std::str::from_utf8(&text).map_err(|_| DecodeError::NotUtf8)?;
                // `-ERR message`; the document once wrote `-ERR: message`.
                let message = text
                    .strip_prefix("ERR")
                    .map(|rest| rest.strip_prefix(':').unwrap_or(rest))
                    .map_or(text, |rest| rest.strip_prefix(' ').unwrap_or(rest));
                Ok(Self::Error(StoreError::from_message(message)))
            }
            Frame::Array(_) => Err(DecodeError::UnexpectedShape("array in a reply")),
        }
    }
}

/// A KEYNOTIFY notification payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// The key was set to `value`.
    Set {
        /// The new value.
        value: Bytes,
    },
    /// The key was deleted (DEL, VDEL or expiry).
    Delete,
}

impl Notification {
    /// The payload as the service sends it (`DELETE`, not the document's `DEL`).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Set { value } => encode_array(&[b"NOTIFY", b"SET", b"VALUE", value]),
            Self::Delete => encode_array(&[b"NOTIFY", b"DELETE"]),
        }
    }

    /// Decodes a notification payload, accepting `DEL` for `DELETE`.
    pub fn decode(payload: &Bytes) -> Result<Notification, DecodeError> {
        let Frame::Array(items) = Frame::decode(payload)? else {
            return Err(DecodeError::UnexpectedShape("notification is not an array"));
        };
        let parts: Vec<&[u8]> = items.iter().map(Bytes::as_ref).collect();
        match parts.as_slice() {
            [b"NOTIFY", b"SET", b"VALUE", _] => Ok(Self::Set {
                value: items[3].clone(),
            }),
            [b"NOTIFY", b"DELETE" | b"DEL"] => Ok(Self::Delete),
            _ => Err(DecodeError::UnexpectedShape(
                "not NOTIFY SET VALUE or NOTIFY DELETE",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &'static [u8]) -> Result<Reply, DecodeError> {
        Reply::decode(&Bytes::from_static(bytes))
    }

    /// Every reply vector of the wire protocol, both ways (the bare `-1` only decodes).
    #[test]
    fn protocol_reply_vectors() {
        let vectors: [(&[u8], Reply); 7] = [
            (b"+OK\r\n", Reply::Ok),
            (b":-1\r\n", Reply::Integer(-1)),
            (b"$-1\r\n", Reply::NotFound),
            (b"$4\r\n1234\r\n", Reply::Value(Bytes::from_static(b"1234"))),
            (b"$0\r\n\r\n", Reply::Value(Bytes::new())),
            (b":1\r\n", Reply::Integer(1)),
            (b":0\r\n", Reply::Integer(0)),
        ];
        for (bytes, reply) in vectors {
            assert_eq!(reply.encode(), bytes);
            assert_eq!(Reply::decode(&Bytes::from_static(bytes)), Ok(reply));
        }
        assert_eq!(decode(b"-1\r\n"), Ok(Reply::Integer(-1)));
    }

    #[test]
    fn every_error_string_round_trips() {
        for error in StoreError::KNOWN {
            let payload = Reply::Error(error.clone()).encode();
            assert_eq!(
                payload,
                format!("-ERR {}\r\n", error.message()).into_bytes()
            );
            assert_eq!(
                Reply::decode(&Bytes::from(payload)),
                Ok(Reply::Error(error))
            );
        }
        assert_eq!(
            decode(b"-ERR syntax error\r\n"),
            Ok(Reply::Error(StoreError::SyntaxError))
        );
        assert_eq!(
            decode(b"-ERR: not authorized\r\n"),
            Ok(Reply::Error(StoreError::NotAuthorized))
        );
        assert_eq!(
            decode(b"-ERR something new\r\n"),
            Ok(Reply::Error(StoreError::Unknown("something new".into())))
        );
        assert_eq!(decode(b"-\xff\r\n"), Err(DecodeError::NotUtf8));
    }

    #[test]
    fn unparsable_replies_are_errors() {
        assert!(decode(b"+QUEUED\r\n").is_err());
        assert!(decode(b"*1\r\n$1\r\na\r\n").is_err());
        assert!(decode(b"OK").is_err());
        assert!(decode(b"$5\r\nab\r\n").is_err());
    }

    #[test]
    fn protocol_notification_vectors() {
        let set: &[u8] = b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n";
        let delete: &[u8] = b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n";
        let set_notification = Notification::Set {
            value: Bytes::from_static(b"abc"),
        };
        assert_eq!(set_notification.encode(), set);
        assert_eq!(Notification::Delete.encode(), delete);
        assert_eq!(
            Notification::decode(&Bytes::from_static(set)),
            Ok(set_notification)
        );
        assert_eq!(
            Notification::decode(&Bytes::from_static(delete)),
            Ok(Notification::Delete)
        );
        assert_eq!(
            Notification::decode(&Bytes::from_static(b"*2\r\n$6\r\nNOTIFY\r\n$3\r\nDEL\r\n")),
            Ok(Notification::Delete)
        );
    }

    #[test]
    fn malformed_notifications_are_errors() {
        for bad in [
            &b"+OK\r\n"[..],
            b"*2\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n",
            b"*3\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n",
            b"*2\r\n$6\r\nnotify\r\n$6\r\nDELETE\r\n",
        ] {
            assert!(Notification::decode(&Bytes::copy_from_slice(bad)).is_err());
        }
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// An error text as the service could send it: one line, not a known one.
    fn unknown_message() -> impl Strategy<Value = String> {
        "[^\r\n]{0,80}".prop_filter("a known message", |text| {
            matches!(StoreError::from_message(text), StoreError::Unknown(_))
        })
    }

    fn reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            Just(Reply::Ok),
            prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>()].prop_map(Reply::Integer),
            prop::collection::vec(any::<u8>(), 0..256).prop_map(|v| Reply::Value(Bytes::from(v))),
            Just(Reply::NotFound),
            prop::sample::select(StoreError::KNOWN.to_vec()).prop_map(Reply::Error),
            unknown_message().prop_map(|text| Reply::Error(StoreError::Unknown(text))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn replies_round_trip(reply in reply()) {
            prop_assert_eq!(Reply::decode(&Bytes::from(reply.encode())), Ok(reply));
        }

        #[test]
        fn any_bytes_decode_to_a_reply_or_an_error(payload in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = Reply::decode(&Bytes::from(payload));
        }

        #[test]
        fn decoded_replies_encode_to_the_same_reply(
            payload in crate::protocol::resp::proptests::resp_like_bytes()
        ) {
            if let Ok(reply) = Reply::decode(&Bytes::from(payload)) {
                prop_assert_eq!(Reply::decode(&Bytes::from(reply.encode())), Ok(reply));
            }
        }

        #[test]
        fn set_notifications_round_trip(value in prop::collection::vec(any::<u8>(), 0..256)) {
            let notification = Notification::Set { value: Bytes::from(value) };
            prop_assert_eq!(
                Notification::decode(&Bytes::from(notification.encode())),
                Ok(notification)
            );
        }

        #[test]
        fn any_bytes_decode_to_a_notification_or_an_error(
            payload in prop::collection::vec(any::<u8>(), 0..256)
        ) {
            let _ = Notification::decode(&Bytes::from(payload));
        }

        #[test]
        fn notification_like_arrays_decode_or_fail(
            words in prop::collection::vec(
                prop_oneof![
                    Just(b"NOTIFY".to_vec()),
                    Just(b"SET".to_vec()),
                    Just(b"VALUE".to_vec()),
                    Just(b"DELETE".to_vec()),
                    Just(b"DEL".to_vec()),
                    prop::collection::vec(any::<u8>(), 0..8),
                ],
                0..6,
            )
        ) {
            let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
            let payload = Bytes::from(encode_array(&refs));
            if let Ok(notification) = Notification::decode(&payload) {
                prop_assert_eq!(
                    Notification::decode(&Bytes::from(notification.encode())),
                    Ok(notification)
                );
            }
        }
    }
}
