//! The RESP3-like framing the state store uses: just the frame types that
//! appear in its requests, replies and notifications.
//!
//! Decoding works on a whole MQTT payload held in [`Bytes`], so bulk strings
//! are slices of the payload, not copies. Every declared length is checked
//! against what arrived before anything is taken, and arrays hold at most
//! [`MAX_ARRAY_LEN`] elements, so hostile input cannot make us allocate.

use bytes::Bytes;

use super::DecodeError;

/// No message of this protocol has more elements (SET NX PX has six),
/// except the array of keys in a SCAN reply, which is read on its own.
pub const MAX_ARRAY_LEN: usize = 16;

/// The shortest bulk string, `$0\r\n\r\n`.
pub const MIN_BULK_LEN: usize = 6;

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `+text\r\n`
    Simple(Bytes),
    /// `-text\r\n` (the text after the `-`)
    Error(Bytes),
    /// `:n\r\n`
    Integer(i64),
    /// `$len\r\nbytes\r\n`
    Bulk(Bytes),
    /// `$-1\r\n`
    Null,
    /// `*n\r\n` followed by n bulk strings (nested arrays are not used here).
    Array(Vec<Bytes>),
}

impl Frame {
    /// Decodes exactly one frame that must fill the whole payload.
    pub fn decode(payload: &Bytes) -> Result<Frame, DecodeError> {
        let mut cursor = Cursor::new(payload);
        let frame = cursor.frame()?;
        cursor.finish()?;
        Ok(frame)
    }
}

/// Reads one payload frame by frame, for messages whose shape [`Frame`]
/// does not cover (a SCAN reply nests an array of keys in an array).
/// Every length is checked against the bytes that arrived before anything
/// is taken or allocated.
#[derive(Debug)]
pub(crate) struct Cursor<'a> {
    payload: &'a Bytes,
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `payload`.
    pub(crate) fn new(payload: &'a Bytes) -> Self {
        Self { payload, pos: 0 }
    }

    /// Fails with [`DecodeError::TrailingBytes`] unless all was read.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes(extra)),
        }
    }

    fn remaining(&self) -> usize {
        self.payload.len() - self.pos
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let byte = *self.payload.get(self.pos).ok_or(DecodeError::Incomplete)?;
        self.pos += 1;
        Ok(byte)
    }

    /// The bytes up to the next CRLF, which is consumed.
    fn line(&mut self) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        let len = self.line_slice()?.len();
        Ok(self.payload.slice(start..start + len))
    }

    /// [`Cursor::line`] borrowed: a length or a count is parsed, not kept,
    /// so it costs no reference count (two atomic operations per key of
    /// a SCAN page).
    fn line_slice(&mut self) -> Result<&'a [u8], DecodeError> {
        let payload: &'a [u8] = self.payload;
        let rest = &payload[self.pos..];
        let end = rest
            .windows(2)
            .position(|pair| pair == b"\r\n")
            .ok_or(DecodeError::Incomplete)?;
        self.pos += end + 2;
        Ok(&rest[..end])
    }

    fn integer(&mut self) -> Result<i64, DecodeError> {
        parse_integer(self.line_slice()?)
    }

    /// `*n\r\n` (the `*` included), refusing `*-1` and a count whose
    /// elements, at `min_item_len` bytes each, cannot have arrived.
    pub(crate) fn array_len(&mut self, min_item_len: usize) -> Result<usize, DecodeError> {
        match self.byte()? {
            b'*' => self.array_len_after_marker(min_item_len),
            other => Err(DecodeError::UnexpectedType(other)),
        }
    }

    fn array_len_after_marker(&mut self, min_item_len: usize) -> Result<usize, DecodeError> {
        let declared = self.integer()?;
        let count = usize::try_from(declared).map_err(|_| DecodeError::InvalidNumber)?;
        if count.saturating_mul(min_item_len) > self.remaining() {
            return Err(DecodeError::LengthExceedsPayload {
                declared: count,
                available: self.remaining(),
            });
        }
        Ok(count)
    }

    /// `$len\r\nbytes\r\n` (the `$` included), refusing the null `$-1`.
    pub(crate) fn bulk(&mut self) -> Result<Bytes, DecodeError> {
        match self.byte()? {
            b'$' => self
                .bulk_body()?
                .ok_or(DecodeError::UnexpectedShape("null bulk string")),
            other => Err(DecodeError::UnexpectedType(other)),
        }
    }

    /// A `$` frame body: `Some(bytes)`, or `None` for `$-1`.
    fn bulk_body(&mut self) -> Result<Option<Bytes>, DecodeError> {
        let declared = self.integer()?;
        if declared == -1 {
            return Ok(None);
        }
        let declared = usize::try_from(declared).map_err(|_| DecodeError::InvalidNumber)?;
        let available = self.remaining();
        if declared > available {
            return Err(DecodeError::LengthExceedsPayload {
                declared,
                available,
            });
        }
        let body = self.payload.slice(self.pos..self.pos + declared);
        self.pos += declared;
        match (self.byte(), self.byte()) {
            (Ok(b'\r'), Ok(b'\n')) => Ok(Some(body)),
            (Err(e), _) | (_, Err(e)) => Err(e),
            _ => Err(DecodeError::MissingTerminator),
        }
    }

    fn frame(&mut self) -> Result<Frame, DecodeError> {
        match self.byte()? {
            b'+' => Ok(Frame::Simple(self.line()?)),
            b'-' => Ok(Frame::Error(self.line()?)),
            b':' => Ok(Frame::Integer(self.integer()?)),
            b'$' => Ok(self.bulk_body()?.map_or(Frame::Null, Frame::Bulk)),
            b'*' => {
                let count = self.array_len_after_marker(MIN_BULK_LEN)?;
                if count > MAX_ARRAY_LEN {
                    return Err(DecodeError::LengthExceedsPayload {
                        declared: count,
                        available: self.remaining(),
                    });
                }
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    items.push(self.bulk().map_err(|error| match error {
                        DecodeError::UnexpectedShape(_) => {
                            DecodeError::UnexpectedShape("null in array")
                        }
                        other => other,
                    })?);
                }
                Ok(Frame::Array(items))
            }
            other => Err(DecodeError::UnexpectedType(other)),
        }
    }
}

/// A decimal integer as RESP writes it: optional `-`, then digits only.
fn parse_integer(text: &[u8]) -> Result<i64, DecodeError> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(DecodeError::InvalidNumber);
    }
    // Accumulated unsigned: i64::MIN's magnitude does not fit an i64.
    let magnitude = digits
        .iter()
        .try_fold(0u64, |acc, d| {
            acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .ok_or(DecodeError::InvalidNumber)?;
    let value = if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    };
    value.ok_or(DecodeError::InvalidNumber)
}

/// Appends `*n\r\n`.
pub fn put_array_header(out: &mut Vec<u8>, len: usize) {
    put_line(out, b'*', itoa::Buffer::new().format(len));
}

/// Appends `$len\r\nbytes\r\n`.
pub fn put_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    put_line(out, b'$', itoa::Buffer::new().format(bytes.len()));
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// How many bytes [`put_bulk`] appends for a body of `len` bytes.
pub fn bulk_encoded_len(len: usize) -> usize {
    let digits = len.checked_ilog10().map_or(1, |log| log as usize + 1);
    1 + digits + 2 + len + 2
}

/// Appends `:n\r\n`.
pub fn put_integer(out: &mut Vec<u8>, n: i64) {
    put_line(out, b':', itoa::Buffer::new().format(n));
}

/// Appends `{kind}{number}\r\n` (itoa: these headers are on every request,
/// and `write!` costs several times as much).
fn put_line(out: &mut Vec<u8>, kind: u8, number: &str) {
    out.push(kind);
    out.extend_from_slice(number.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// An array of bulk strings, encoded.
pub fn encode_array(items: &[&[u8]]) -> Vec<u8> {
    let body: usize = items.iter().map(|item| item.len() + 16).sum();
    let mut out = Vec::with_capacity(8 + body);
    put_array_header(&mut out, items.len());
    for item in items {
        put_bulk(&mut out, item);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> Result<Frame, DecodeError> {
        Frame::decode(&Bytes::copy_from_slice(bytes))
    }

    #[test]
    fn decodes_each_frame_type() {
        assert_eq!(
            decode(b"+OK\r\n"),
            Ok(Frame::Simple(Bytes::from_static(b"OK")))
        );
        assert_eq!(
            decode(b"-ERR syntax error\r\n"),
            Ok(Frame::Error(Bytes::from_static(b"ERR syntax error")))
        );
        assert_eq!(decode(b":-1\r\n"), Ok(Frame::Integer(-1)));
        assert_eq!(
            decode(b":-9223372036854775808\r\n"),
            Ok(Frame::Integer(i64::MIN))
        );
        assert_eq!(
            decode(b":9223372036854775807\r\n"),
            Ok(Frame::Integer(i64::MAX))
        );
        assert_eq!(decode(b"$-1\r\n"), Ok(Frame::Null));
        assert_eq!(decode(b"$0\r\n\r\n"), Ok(Frame::Bulk(Bytes::new())));
        assert_eq!(
            decode(b"$4\r\n\r\n\r\n\r\n"),
            Ok(Frame::Bulk(Bytes::from_static(b"\r\n\r\n")))
        );
        assert_eq!(
            decode(b"*2\r\n$1\r\na\r\n$0\r\n\r\n"),
            Ok(Frame::Array(vec![Bytes::from_static(b"a"), Bytes::new()]))
        );
    }

    #[test]
    fn truncation_is_incomplete() {
        let full = b"*2\r\n$3\r\nGET\r\n$7\r\ntestkey\r\n";
        for cut in 0..full.len() {
            let result = decode(&full[..cut]);
            assert!(
                matches!(
                    result,
                    Err(DecodeError::Incomplete | DecodeError::LengthExceedsPayload { .. })
                ),
                "cut at {cut}: {result:?}"
            );
        }
    }

    #[test]
    fn huge_declared_lengths_are_refused_before_allocating() {
        assert_eq!(
            decode(b"$9223372036854775807\r\nab\r\n"),
            Err(DecodeError::LengthExceedsPayload {
                declared: 9_223_372_036_854_775_807,
                available: 4
            })
        );
        assert!(matches!(
            decode(b"*1000000000\r\n"),
            Err(DecodeError::LengthExceedsPayload { .. })
        ));
        assert_eq!(
            decode(b"$99999999999999999999\r\n"),
            Err(DecodeError::InvalidNumber)
        );
        assert_eq!(decode(b"$-2\r\n"), Err(DecodeError::InvalidNumber));
        assert_eq!(
            decode(b":9223372036854775808\r\n"),
            Err(DecodeError::InvalidNumber)
        );
        assert_eq!(
            decode(b":-9223372036854775809\r\n"),
            Err(DecodeError::InvalidNumber)
        );
        assert_eq!(decode(b"*-1\r\n"), Err(DecodeError::InvalidNumber));
    }

    #[test]
    fn malformed_frames_have_clear_errors() {
        assert_eq!(decode(b""), Err(DecodeError::Incomplete));
        assert_eq!(decode(b"?x\r\n"), Err(DecodeError::UnexpectedType(b'?')));
        assert_eq!(decode(b":1x\r\n"), Err(DecodeError::InvalidNumber));
        assert_eq!(decode(b":\r\n"), Err(DecodeError::InvalidNumber));
        assert_eq!(decode(b"$1\r\nabc"), Err(DecodeError::MissingTerminator));
        assert_eq!(decode(b"+OK\r\nextra"), Err(DecodeError::TrailingBytes(5)));
        assert_eq!(
            decode(b"*1\r\n:1\r\n\r\n\r\n"),
            Err(DecodeError::UnexpectedType(b':'))
        );
        assert_eq!(
            decode(b"*1\r\n$-1\r\n\r\n"),
            Err(DecodeError::UnexpectedShape("null in array"))
        );
    }

    #[test]
    fn encodes_arrays_byte_exact() {
        assert_eq!(
            encode_array(&[b"GET", b"testkey"]),
            b"*2\r\n$3\r\nGET\r\n$7\r\ntestkey\r\n"
        );
        assert_eq!(encode_array(&[b""]), b"*1\r\n$0\r\n\r\n");
    }
}

#[cfg(test)]
pub(crate) mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// Bytes that look like RESP often enough to reach deep into the decoder.
    pub(crate) fn resp_like_bytes() -> impl Strategy<Value = Vec<u8>> {
        let token = prop_oneof![
            Just(b"*".to_vec()),
            Just(b"$".to_vec()),
            Just(b"+".to_vec()),
            Just(b"-".to_vec()),
            Just(b":".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"\r".to_vec()),
            Just(b"-1".to_vec()),
            (0u64..40).prop_map(|n| n.to_string().into_bytes()),
            any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            prop::collection::vec(any::<u8>(), 0..8),
        ];
        prop::collection::vec(token, 0..24).prop_map(|tokens| tokens.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn any_bytes_decode_to_a_frame_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = Frame::decode(&Bytes::from(bytes));
        }

        #[test]
        fn resp_like_bytes_decode_to_a_frame_or_an_error(bytes in resp_like_bytes()) {
            let payload = Bytes::from(bytes);
            if let Ok(Frame::Bulk(body) | Frame::Simple(body) | Frame::Error(body)) = Frame::decode(&payload) {
                // Whatever was taken lies inside the payload.
                prop_assert!(body.len() <= payload.len());
            }
        }

        #[test]
        fn arrays_of_bulk_strings_round_trip(
            items in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..=MAX_ARRAY_LEN)
        ) {
            let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
            let encoded = Bytes::from(encode_array(&refs));
            let expected: Vec<Bytes> = items.into_iter().map(Bytes::from).collect();
            prop_assert_eq!(Frame::decode(&encoded), Ok(Frame::Array(expected)));
        }

        #[test]
        fn integers_round_trip(n in prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>()]) {
            let mut out = Vec::new();
            put_integer(&mut out, n);
            prop_assert_eq!(Frame::decode(&Bytes::from(out)), Ok(Frame::Integer(n)));
        }

        #[test]
        fn bulk_strings_round_trip(body in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut out = Vec::new();
            put_bulk(&mut out, &body);
            prop_assert_eq!(out.len(), bulk_encoded_len(body.len()));
            prop_assert_eq!(Frame::decode(&Bytes::from(out)), Ok(Frame::Bulk(Bytes::from(body))));
        }

        #[test]
        fn every_cut_of_a_valid_array_is_an_error(
            items in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..16), 1..=MAX_ARRAY_LEN),
            cut in any::<prop::sample::Index>(),
        ) {
            let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
            let encoded = encode_array(&refs);
            let cut = cut.index(encoded.len());
            prop_assert!(Frame::decode(&Bytes::copy_from_slice(&encoded[..cut])).is_err());
        }
    }
}
