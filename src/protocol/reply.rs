//! Replies to requests, and KEYNOTIFY notifications.

use bytes::Bytes;

use super::resp::{
    Cursor, Frame, MIN_BULK_LEN, bulk_encoded_len, encode_array, put_array_header, put_bulk,
    put_integer,
};
use super::{DecodeError, Request, StoreError};

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
    /// `*1`/`*2`: a page of SCAN; only [`Reply::decode_for`] a SCAN
    /// request gives it.
    Keys(KeyPage),
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
            Self::Keys(page) => page.encode(),
        }
    }

    /// Decodes the reply to `request`: SCAN's with [`ScanReply::decode`],
    /// every other verb's with [`Reply::decode`].
    pub fn decode_for(request: &Request, payload: &Bytes) -> Result<Reply, DecodeError> {
        match request {
            Request::Scan { .. } => Ok(match ScanReply::decode(payload)? {
                ScanReply::Page(page) => Self::Keys(page),
                ScanReply::Error(error) => Self::Error(error),
            }),
            _ => Self::decode(payload),
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
            Frame::Error(text) => Ok(Self::Error(store_error(&text)?)),
            Frame::Array(_) => Err(DecodeError::UnexpectedShape("array in a reply")),
        }
    }
}

/// The store error of an error frame's text (`ERR message`; the document
/// once wrote `ERR: message`).
fn store_error(text: &[u8]) -> Result<StoreError, DecodeError> {
    let text = std::str::from_utf8(text).map_err(|_| DecodeError::NotUtf8)?;
    let message = text
        .strip_prefix("ERR")
        .map(|rest| rest.strip_prefix(':').unwrap_or(rest))
        .map_or(text, |rest| rest.strip_prefix(' ').unwrap_or(rest));
    Ok(StoreError::from_message(message))
}

/// One page of a SCAN listing.
///
/// On the wire: `*1\r\n*n\r\n<n bulk keys>` for the last page, or
/// `*2\r\n*n\r\n<n bulk keys><bulk token>` when more may follow. Pages
/// may be empty while a token still comes back; the listing is complete
/// only when a page comes without one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyPage {
    /// The matching keys of this page (binary-safe, possibly none).
    pub keys: Vec<Bytes>,
    /// Opaque bytes to send back in the next SCAN, exactly as received;
    /// `None` on the last page.
    pub token: Option<Bytes>,
}

impl KeyPage {
    /// Longest `*2\r\n*n\r\n` a page can start with (n has at most 20 digits).
    pub const MAX_HEADER_LEN: usize = 4 + 23;

    /// The payload as the service sends it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        put_array_header(&mut out, if self.token.is_some() { 2 } else { 1 });
        put_array_header(&mut out, self.keys.len());
        for key in &self.keys {
            put_bulk(&mut out, key);
        }
        if let Some(token) = &self.token {
            put_bulk(&mut out, token);
        }
        out
    }

    /// The length of [`KeyPage::encode`]'s payload, at most
    /// [`KeyPage::MAX_HEADER_LEN`] plus the keys' and the token's
    /// [`bulk_encoded_len`]: what a server sizes pages with.
    pub fn encoded_len(&self) -> usize {
        let header = 4
            + 3
            + self
                .keys
                .len()
                .checked_ilog10()
                .map_or(1, |log| log as usize + 1);
        let keys: usize = self
            .keys
            .iter()
            .map(|key| bulk_encoded_len(key.len()))
            .sum();
        header
            + keys
            + self
                .token
                .as_ref()
                .map_or(0, |token| bulk_encoded_len(token.len()))
    }

    /// Decodes a page as the official client does: refuses `*0`, a null
    /// array, a null key, a missing token after `*2`, and trailing bytes.
    /// Nothing is allocated for keys whose bytes have not arrived.
    fn decode(payload: &Bytes) -> Result<KeyPage, DecodeError> {
        let mut cursor = Cursor::new(payload);
        // The shortest element is an empty key array, `*0\r\n`.
        let parts = cursor.array_len(4)?;
        if !(1..=2).contains(&parts) {
            return Err(DecodeError::UnexpectedShape(
                "a SCAN reply has one or two elements",
            ));
        }
        let count = cursor.array_len(MIN_BULK_LEN)?;
        let mut keys = Vec::with_capacity(count);
        for _ in 0..count {
            keys.push(cursor.bulk()?);
        }
        let token = if parts == 2 {
            Some(cursor.bulk()?)
        } else {
            None
        };
        cursor.finish()?;
        Ok(KeyPage { keys, token })
    }
}

/// A reply to SCAN: a page of keys, or the store's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanReply {
    /// `*1` / `*2`: one page.
    Page(KeyPage),
    /// `-ERR message`
    Error(StoreError),
}

impl ScanReply {
    /// The payload as the service sends it.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Page(page) => page.encode(),
            Self::Error(error) => Reply::Error(error.clone()).encode(),
        }
    }

    /// Decodes the reply to a SCAN request (a reply means something only
    /// with its request: decode SCAN replies with this, others with
    /// [`Reply::decode`]).
    pub fn decode(payload: &Bytes) -> Result<ScanReply, DecodeError> {
        match payload.first() {
            Some(b'-') => match Frame::decode(payload)? {
                Frame::Error(text) => Ok(Self::Error(store_error(&text)?)),
                _ => Err(DecodeError::UnexpectedShape("not an error")),
            },
            Some(b'*') => KeyPage::decode(payload).map(Self::Page),
            Some(_) => Err(DecodeError::UnexpectedShape(
                "a SCAN reply is an array or an error",
            )),
            None => Err(DecodeError::Incomplete),
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

    fn page(keys: &[&'static [u8]], token: Option<&'static [u8]>) -> ScanReply {
        ScanReply::Page(KeyPage {
            keys: keys.iter().copied().map(Bytes::from_static).collect(),
            token: token.map(Bytes::from_static),
        })
    }

    /// The SCAN reply vectors of the wire protocol (see docs/protocol.md) and
    /// the SDK's own tests, both ways.
    #[test]
    fn scan_reply_vectors() {
        let vectors: [(&[u8], ScanReply); 5] = [
            (
                b"*1\r\n*2\r\n$4\r\nkey1\r\n$4\r\nkey2\r\n",
                page(&[b"key1", b"key2"], None),
            ),
            (
                b"*2\r\n*0\r\n$3\r\n\x00\xffx\r\n",
                page(&[], Some(b"\x00\xffx")),
            ),
            (
                b"*2\r\n*2\r\n$4\r\nkey1\r\n$4\r\nkey2\r\n$4\r\n1;1;\r\n",
                page(&[b"key1", b"key2"], Some(b"1;1;")),
            ),
            (b"*1\r\n*0\r\n", page(&[], None)),
            (
                b"-ERR syntax error\r\n",
                ScanReply::Error(StoreError::SyntaxError),
            ),
        ];
        for (bytes, reply) in vectors {
            assert_eq!(reply.encode(), bytes, "{}", String::from_utf8_lossy(bytes));
            assert_eq!(ScanReply::decode(&Bytes::from_static(bytes)), Ok(reply));
            if let ScanReply::Page(page) = ScanReply::decode(&Bytes::from_static(bytes)).unwrap() {
                assert_eq!(page.encoded_len(), bytes.len());
            }
        }
    }

    /// Everything the official client's parser refuses, refused here too.
    #[test]
    fn scan_replies_the_sdk_refuses_are_errors() {
        for bad in [
            &b"*0\r\n"[..],
            b"*3\r\n*2\r\n$4\r\nkey1\r\n$4\r\nkey2\r\n$4\r\n1;1;\r\n$5\r\nextra\r\n",
            b"*1\r\n*a\r\n",
            b"*1\r\n$0\r\n\r\n",
            b"*1\r\n*1\r\n$4\r\nkey\r\n",
            b"*2\r\n*0\r\n",
            b"*1\r\n*0\r\ntrailing",
            b"*1\r\n*-1\r\n",
            b"*-1\r\n",
            b"*1\r\n*1\r\n$-1\r\n",
            b"*2\r\n*0\r\n$-1\r\n",
            b"+OK\r\n",
            b"$-1\r\n",
            b"",
        ] {
            assert!(
                ScanReply::decode(&Bytes::copy_from_slice(bad)).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_scan_reply_claiming_millions_of_keys_is_refused_before_allocating() {
        assert_eq!(
            ScanReply::decode(&Bytes::from_static(b"*1\r\n*9999999999\r\n$1\r\na\r\n")),
            Err(DecodeError::LengthExceedsPayload {
                declared: 9_999_999_999,
                available: 7
            })
        );
        assert!(matches!(
            ScanReply::decode(&Bytes::from_static(b"*2\r\n*9223372036854775807\r\n")),
            Err(DecodeError::LengthExceedsPayload { .. })
        ));
        // A page of many keys is fine when they all arrived.
        let keys: Vec<Bytes> = (0..100_000).map(|i| Bytes::from(format!("k{i}"))).collect();
        let many = KeyPage { keys, token: None };
        assert_eq!(
            ScanReply::decode(&Bytes::from(many.encode())),
            Ok(ScanReply::Page(many))
        );
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

    fn scan_reply() -> impl Strategy<Value = ScanReply> {
        let key = prop::collection::vec(any::<u8>(), 0..32).prop_map(Bytes::from);
        let page = (
            prop::collection::vec(key.clone(), 0..40),
            proptest::option::of(key),
        )
            .prop_map(|(keys, token)| ScanReply::Page(KeyPage { keys, token }));
        prop_oneof![
            4 => page,
            1 => prop::sample::select(StoreError::KNOWN.to_vec()).prop_map(ScanReply::Error),
            1 => unknown_message().prop_map(|text| ScanReply::Error(StoreError::Unknown(text))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn scan_replies_round_trip_at_their_encoded_len(reply in scan_reply()) {
            let encoded = reply.encode();
            if let ScanReply::Page(page) = &reply {
                prop_assert_eq!(page.encoded_len(), encoded.len());
                prop_assert!(page.encoded_len() <= KeyPage::MAX_HEADER_LEN
                    + page.keys.iter().map(|k| bulk_encoded_len(k.len())).sum::<usize>()
                    + page.token.as_ref().map_or(0, |t| bulk_encoded_len(t.len())));
            }
            prop_assert_eq!(ScanReply::decode(&Bytes::from(encoded)), Ok(reply));
        }

        #[test]
        fn every_cut_of_a_scan_reply_is_an_error(
            reply in scan_reply(),
            cut in any::<prop::sample::Index>(),
        ) {
            let encoded = reply.encode();
            let cut = cut.index(encoded.len());
            prop_assert!(ScanReply::decode(&Bytes::copy_from_slice(&encoded[..cut])).is_err());
        }

        #[test]
        fn any_bytes_decode_to_a_scan_reply_or_an_error(
            payload in crate::protocol::resp::proptests::resp_like_bytes()
        ) {
            if let Ok(reply) = ScanReply::decode(&Bytes::from(payload)) {
                prop_assert_eq!(ScanReply::decode(&Bytes::from(reply.encode())), Ok(reply));
            }
        }

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
