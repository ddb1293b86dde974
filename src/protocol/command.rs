//! Requests: what a client publishes to the state store's invoke topic.

use bytes::Bytes;

use super::StoreError;
use super::resp::{Frame, encode_array};

/// The condition of a SET.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetCondition {
    /// Always set.
    #[default]
    Always,
    /// `NX`: only when the key does not exist.
    OnlyIfMissing,
    /// `NEX`: when the key does not exist or already holds exactly this value.
    OnlyIfMissingOrEqual,
}

/// The options of a SET, encoded in the SDKs' order `[NX|NEX] [PX ms]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetOptions {
    /// `NX` / `NEX`.
    pub condition: SetCondition,
    /// `PX`: the key expires this many milliseconds after the SET.
    pub expires_in_ms: Option<u64>,
}

/// A state store request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `SET key value [NX|NEX] [PX ms]`
    Set {
        /// Never empty once decoded.
        key: Bytes,
        /// May be empty.
        value: Bytes,
        /// Condition and expiry.
        options: SetOptions,
    },
    /// `GET key`
    Get {
        /// The key.
        key: Bytes,
    },
    /// `DEL key`
    Del {
        /// The key.
        key: Bytes,
    },
    /// `VDEL key value`: delete only if the key holds `value`.
    VDel {
        /// The key.
        key: Bytes,
        /// The value the key must hold.
        value: Bytes,
    },
    /// `KEYNOTIFY key` or `KEYNOTIFY key STOP`
    KeyNotify {
        /// The key to watch.
        key: Bytes,
        /// `STOP`: remove the registration.
        stop: bool,
    },
    /// `SCAN pattern [token]`: one page of the keys matching a glob; the
    /// reply is a [`KeyPage`](super::KeyPage) (see [`ScanReply`](super::ScanReply)).
    Scan {
        /// The glob; never empty once decoded.
        pattern: Bytes,
        /// The continuation token of the previous page, exactly as received;
        /// `None` for the first page.
        token: Option<Bytes>,
    },
}

impl Request {
    /// The verb, as a metric label and for logs.
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Set { .. } => "SET",
            Self::Get { .. } => "GET",
            Self::Del { .. } => "DEL",
            Self::VDel { .. } => "VDEL",
            Self::KeyNotify { stop: false, .. } => "KEYNOTIFY",
            Self::KeyNotify { stop: true, .. } => "KEYNOTIFY STOP",
            Self::Scan { .. } => "SCAN",
        }
    }

    /// The key the request is about; `None` for SCAN, which is about many.
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            Self::Set { key, .. }
            | Self::Get { key }
            | Self::Del { key }
            | Self::VDel { key, .. }
            | Self::KeyNotify { key, .. } => Some(key),
            Self::Scan { .. } => None,
        }
    }

    /// Whether the request changes the store (what an access list calls write).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Self::Set { .. } | Self::Del { .. } | Self::VDel { .. }
        )
    }

    /// The payload, byte-identical to what the official SDKs send.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Set {
                key,
                value,
                options,
            } => {
                let mut items: Vec<&[u8]> = vec![b"SET", key, value];
                match options.condition {
                    SetCondition::Always => {}
                    SetCondition::OnlyIfMissing => items.push(b"NX"),
                    SetCondition::OnlyIfMissingOrEqual => items.push(b"NEX"),
                }
                let ms;
                if let Some(expiry) = options.expires_in_ms {
                    ms = expiry.to_string();
                    items.push(b"PX");
                    items.push(ms.as_bytes());
                }
                encode_array(&items)
            }
            Self::Get { key } => encode_array(&[b"GET", key]),
            Self::Del { key } => encode_array(&[b"DEL", key]),
            Self::VDel { key, value } => encode_array(&[b"VDEL", key, value]),
            Self::KeyNotify { key, stop: false } => encode_array(&[b"KEYNOTIFY", key]),
            Self::KeyNotify { key, stop: true } => encode_array(&[b"KEYNOTIFY", key, b"STOP"]),
            Self::Scan {
                pattern,
                token: None,
            } => encode_array(&[b"SCAN", pattern]),
            Self::Scan {
                pattern,
                token: Some(token),
            } => encode_array(&[b"SCAN", pattern, token]),
        }
    }

    /// Decodes a request as the service does, failing with the `-ERR` the
    /// service would send: `syntax error` for anything that is not an array
    /// of bulk strings or has bad options, `unknown command`, `wrong number
    /// of arguments`, `the key length is zero`. A SCAN with an empty
    /// pattern is a `syntax error` (the SDKs refuse to send one; the
    /// service documents no string for it).
    ///
    /// Verbs and options must be upper case, as the protocol requires.
    pub fn decode(payload: &Bytes) -> Result<Request, StoreError> {
        let Ok(Frame::Array(items)) = Frame::decode(payload) else {
            return Err(StoreError::SyntaxError);
        };
        let Some((verb, args)) = items.split_first() else {
            return Err(StoreError::SyntaxError);
        };
        let arity = |range: std::ops::RangeInclusive<usize>| {
            if range.contains(&args.len()) {
                Ok(())
            } else {
                Err(StoreError::WrongNumberOfArguments)
            }
        };
        let request = match verb.as_ref() {
            b"SET" => {
                arity(2..=usize::MAX)?;
                Request::Set {
                    key: args[0].clone(),
                    value: args[1].clone(),
                    options: decode_set_options(&args[2..])?,
                }
            }
            b"GET" => {
                arity(1..=1)?;
                Request::Get {
                    key: args[0].clone(),
                }
            }
            b"DEL" => {
                arity(1..=1)?;
                Request::Del {
                    key: args[0].clone(),
                }
            }
            b"VDEL" => {
                arity(2..=2)?;
                Request::VDel {
                    key: args[0].clone(),
                    value: args[1].clone(),
                }
            }
            b"KEYNOTIFY" => {
                arity(1..=2)?;
                let stop = match args.get(1).map(Bytes::as_ref) {
                    None => false,
                    Some(b"STOP") => true,
                    Some(_) => return Err(StoreError::SyntaxError),
                };
                Request::KeyNotify {
                    key: args[0].clone(),
                    stop,
                }
            }
            b"SCAN" => {
                arity(1..=2)?;
                if args[0].is_empty() {
                    return Err(StoreError::SyntaxError);
                }
                Request::Scan {
                    pattern: args[0].clone(),
                    token: args.get(1).cloned(),
                }
            }
            _ => return Err(StoreError::UnknownCommand),
        };
        if request.key().is_some_and(Bytes::is_empty) {
            return Err(StoreError::KeyLengthZero);
        }
        Ok(request)
    }
}

/// `[NX|NEX] [PX ms]` in any order, each at most once.
fn decode_set_options(mut args: &[Bytes]) -> Result<SetOptions, StoreError> {
    let mut options = SetOptions::default();
    let mut condition_seen = false;
    while let Some((option, rest)) = args.split_first() {
        args = rest;
        match option.as_ref() {
            b"NX" | b"NEX" if !condition_seen => {
                condition_seen = true;
                options.condition = if option.as_ref() == b"NX" {
                    SetCondition::OnlyIfMissing
                } else {
                    SetCondition::OnlyIfMissingOrEqual
                };
            }
            b"PX" if options.expires_in_ms.is_none() => {
                let Some((ms, rest)) = args.split_first() else {
                    return Err(StoreError::SyntaxError);
                };
                args = rest;
                let ms = std::str::from_utf8(ms)
                    .ok()
                    .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|text| text.parse::<u64>().ok())
                    .filter(|&ms| ms > 0)
                    .ok_or(StoreError::SyntaxError)?;
                options.expires_in_ms = Some(ms);
            }
            _ => return Err(StoreError::SyntaxError),
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Bytes {
        Bytes::from_static(b"testkey")
    }

    fn value() -> Bytes {
        Bytes::from_static(b"testvalue")
    }

    fn set(condition: SetCondition, expires_in_ms: Option<u64>) -> Request {
        Request::Set {
            key: key(),
            value: value(),
            options: SetOptions {
                condition,
                expires_in_ms,
            },
        }
    }

    /// Every request vector of the wire protocol (docs/protocol.md), asserted both ways.
    fn vectors() -> Vec<(&'static [u8], Request)> {
        vec![
            (
                b"*3\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n",
                set(SetCondition::Always, None),
            ),
            (
                b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n",
                set(SetCondition::OnlyIfMissing, None),
            ),
            (
                b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$3\r\nNEX\r\n",
                set(SetCondition::OnlyIfMissingOrEqual, None),
            ),
            (
                b"*5\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nPX\r\n$2\r\n10\r\n",
                set(SetCondition::Always, Some(10)),
            ),
            (
                b"*6\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n$2\r\nPX\r\n$2\r\n10\r\n",
                set(SetCondition::OnlyIfMissing, Some(10)),
            ),
            (
                b"*2\r\n$3\r\nGET\r\n$7\r\ntestkey\r\n",
                Request::Get { key: key() },
            ),
            (
                b"*2\r\n$3\r\nDEL\r\n$7\r\ntestkey\r\n",
                Request::Del { key: key() },
            ),
            (
                b"*3\r\n$4\r\nVDEL\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n",
                Request::VDel {
                    key: key(),
                    value: value(),
                },
            ),
            (
                b"*2\r\n$9\r\nKEYNOTIFY\r\n$7\r\ntestkey\r\n",
                Request::KeyNotify {
                    key: key(),
                    stop: false,
                },
            ),
            (
                b"*3\r\n$9\r\nKEYNOTIFY\r\n$7\r\ntestkey\r\n$4\r\nSTOP\r\n",
                Request::KeyNotify {
                    key: key(),
                    stop: true,
                },
            ),
            (
                b"*2\r\n$4\r\nSCAN\r\n$4\r\nkey*\r\n",
                Request::Scan {
                    pattern: Bytes::from_static(b"key*"),
                    token: None,
                },
            ),
            // The SDK's own test vector: a binary token sent back verbatim.
            (
                b"*3\r\n$4\r\nSCAN\r\n$4\r\nkey*\r\n$3\r\n\x00\xffx\r\n",
                Request::Scan {
                    pattern: Bytes::from_static(b"key*"),
                    token: Some(Bytes::from_static(b"\x00\xffx")),
                },
            ),
        ]
    }

    #[test]
    fn protocol_vectors_encode_byte_exact() {
        for (bytes, request) in vectors() {
            assert_eq!(
                request.encode(),
                bytes,
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn protocol_vectors_decode() {
        for (bytes, request) in vectors() {
            assert_eq!(Request::decode(&Bytes::from_static(bytes)), Ok(request));
        }
    }

    #[test]
    fn binary_keys_and_values_round_trip() {
        let all_bytes: Vec<u8> = (0..=255).collect();
        let request = Request::Set {
            key: Bytes::from(all_bytes.clone()),
            value: Bytes::from(all_bytes.repeat(3)),
            options: SetOptions::default(),
        };
        assert_eq!(Request::decode(&Bytes::from(request.encode())), Ok(request));
        let empty_value = Request::Set {
            key: key(),
            value: Bytes::new(),
            options: SetOptions::default(),
        };
        assert_eq!(
            empty_value.encode(),
            b"*3\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$0\r\n\r\n"
        );
        assert_eq!(
            Request::decode(&Bytes::from(empty_value.encode())),
            Ok(empty_value)
        );
    }

    #[test]
    fn options_in_other_orders_are_accepted() {
        let payload = encode_array(&[b"SET", b"k", b"v", b"PX", b"5", b"NEX"]);
        assert_eq!(
            Request::decode(&Bytes::from(payload)),
            Ok(Request::Set {
                key: Bytes::from_static(b"k"),
                value: Bytes::from_static(b"v"),
                options: SetOptions {
                    condition: SetCondition::OnlyIfMissingOrEqual,
                    expires_in_ms: Some(5)
                }
            })
        );
    }

    #[test]
    fn bad_requests_get_the_services_errors() {
        let cases: Vec<(Vec<u8>, StoreError)> = vec![
            (b"garbage".to_vec(), StoreError::SyntaxError),
            (b"*0\r\n".to_vec(), StoreError::SyntaxError),
            (b"+OK\r\n".to_vec(), StoreError::SyntaxError),
            (
                b"*2\r\n$3\r\nGET\r\n$7\r\ntestkey".to_vec(),
                StoreError::SyntaxError,
            ),
            (encode_array(&[b"FLUSHALL"]), StoreError::UnknownCommand),
            (encode_array(&[b"get", b"k"]), StoreError::UnknownCommand),
            (encode_array(&[b"GET"]), StoreError::WrongNumberOfArguments),
            (
                encode_array(&[b"GET", b"a", b"b"]),
                StoreError::WrongNumberOfArguments,
            ),
            (
                encode_array(&[b"SET", b"k"]),
                StoreError::WrongNumberOfArguments,
            ),
            (encode_array(&[b"DEL"]), StoreError::WrongNumberOfArguments),
            (
                encode_array(&[b"VDEL", b"k"]),
                StoreError::WrongNumberOfArguments,
            ),
            (
                encode_array(&[b"KEYNOTIFY", b"k", b"STOP", b"x"]),
                StoreError::WrongNumberOfArguments,
            ),
            (
                encode_array(&[b"KEYNOTIFY", b"k", b"GO"]),
                StoreError::SyntaxError,
            ),
            (
                encode_array(&[b"SET", b"k", b"v", b"XX"]),
                StoreError::SyntaxError,
            ),
            (
                encode_array(&[b"SET", b"k", b"v", b"NX", b"NEX"]),
                StoreError::SyntaxError,
            ),
            (
                encode_array(&[b"SET", b"k", b"v", b"PX"]),
                StoreError::SyntaxError,
            ),
            (
                encode_array(&[b"SET", b"k", b"v", b"PX", b"0"]),
                StoreError::SyntaxError,
            ),
            (
                encode_array(&[b"SET", b"k", b"v", b"PX", b"-5"]),
                StoreError::SyntaxError,
            ),
            (
                encode_array(&[b"SET", b"k", b"v", b"PX", b"1", b"PX", b"2"]),
                StoreError::SyntaxError,
            ),
            (
                encode_array(&[b"SET", b"", b"v"]),
                StoreError::KeyLengthZero,
            ),
            (encode_array(&[b"GET", b""]), StoreError::KeyLengthZero),
            (
                encode_array(&[b"KEYNOTIFY", b""]),
                StoreError::KeyLengthZero,
            ),
            (encode_array(&[b"SCAN"]), StoreError::WrongNumberOfArguments),
            (
                encode_array(&[b"SCAN", b"*", b"token", b"more"]),
                StoreError::WrongNumberOfArguments,
            ),
            (encode_array(&[b"SCAN", b""]), StoreError::SyntaxError),
            (encode_array(&[b"SCAN", b"", b"t"]), StoreError::SyntaxError),
            (encode_array(&[b"scan", b"*"]), StoreError::UnknownCommand),
        ];
        for (payload, expected) in cases {
            assert_eq!(
                Request::decode(&Bytes::from(payload.clone())),
                Err(expected),
                "{}",
                String::from_utf8_lossy(&payload)
            );
        }
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use crate::protocol::resp::encode_array;
    use proptest::prelude::*;

    fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
        prop::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
    }

    fn key() -> impl Strategy<Value = Bytes> {
        prop::collection::vec(any::<u8>(), 1..64).prop_map(Bytes::from)
    }

    fn set_options() -> impl Strategy<Value = SetOptions> {
        let condition = prop_oneof![
            Just(SetCondition::Always),
            Just(SetCondition::OnlyIfMissing),
            Just(SetCondition::OnlyIfMissingOrEqual),
        ];
        // PX 0 is not a valid expiry: the decoder refuses it, the gateway never sends it.
        (condition, proptest::option::of(1..=u64::MAX)).prop_map(|(condition, expires_in_ms)| {
            SetOptions {
                condition,
                expires_in_ms,
            }
        })
    }

    pub(crate) fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (key(), bytes(128), set_options()).prop_map(|(key, value, options)| Request::Set {
                key,
                value,
                options
            }),
            key().prop_map(|key| Request::Get { key }),
            key().prop_map(|key| Request::Del { key }),
            (key(), bytes(128)).prop_map(|(key, value)| Request::VDel { key, value }),
            (key(), any::<bool>()).prop_map(|(key, stop)| Request::KeyNotify { key, stop }),
            (key(), proptest::option::of(bytes(64)))
                .prop_map(|(pattern, token)| Request::Scan { pattern, token }),
        ]
    }

    /// Arrays of words a request is made of, in any order and number.
    fn request_like_array() -> impl Strategy<Value = Vec<Vec<u8>>> {
        let word = prop_oneof![
            Just(b"SET".to_vec()),
            Just(b"GET".to_vec()),
            Just(b"DEL".to_vec()),
            Just(b"VDEL".to_vec()),
            Just(b"KEYNOTIFY".to_vec()),
            Just(b"SCAN".to_vec()),
            Just(b"*".to_vec()),
            Just(b"STOP".to_vec()),
            Just(b"NX".to_vec()),
            Just(b"NEX".to_vec()),
            Just(b"PX".to_vec()),
            Just(Vec::new()),
            any::<u64>().prop_map(|n| n.to_string().into_bytes()),
            any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            prop::collection::vec(any::<u8>(), 0..8),
        ];
        prop::collection::vec(word, 0..9)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn requests_round_trip(request in request()) {
            let encoded = Bytes::from(request.encode());
            prop_assert_eq!(Request::decode(&encoded), Ok(request));
        }

        #[test]
        fn any_bytes_decode_to_a_request_or_a_store_error(
            payload in prop::collection::vec(any::<u8>(), 0..256)
        ) {
            match Request::decode(&Bytes::from(payload)) {
                Ok(Request::Scan { pattern, .. }) => prop_assert!(!pattern.is_empty()),
                Ok(request) => prop_assert!(request.key().is_some_and(|key| !key.is_empty())),
                Err(error) => prop_assert!(StoreError::KNOWN.contains(&error), "{error:?}"),
            }
        }

        #[test]
        fn request_like_arrays_decode_canonically(words in request_like_array()) {
            let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
            match Request::decode(&Bytes::from(encode_array(&refs))) {
                // Whatever decodes encodes to something that decodes the same.
                Ok(request) => {
                    let again = Request::decode(&Bytes::from(request.encode()));
                    prop_assert_eq!(again, Ok(request));
                }
                Err(error) => prop_assert!(StoreError::KNOWN.contains(&error), "{error:?}"),
            }
        }
    }
}
