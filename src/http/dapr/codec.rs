//! The codec of Dapr's gRPC service: prost's, with each request checked
//! before prost decodes it. Decoding allocates for every element of a list
//! and entry of a map (a `StateItem` of a hundred bytes and more for two
//! bytes on the wire), so the codec first walks the message's wire format
//! by the protos' field tables (`dapr_shapes.rs`, which build.rs writes
//! from the descriptors), counting the elements of every list and the
//! entries of every map at every depth, and refuses the request
//! (`INVALID_ARGUMENT`) over the limits before anything is held for them.
//! Before that, [`Checked`] reads a message's length off its prefix and
//! refuses one over the size limit (`RESOURCE_EXHAUSTED`, as Dapr does)
//! before its bytes are read.
//!
//! The limits come from the gateway's settings through a task-local set
//! around each call ([`Checked`]): the generated server builds its codec
//! with `Default`, so the codec cannot be handed them.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse as _, Response};
use bytes::{Buf as _, Bytes};
use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt as _};
use http_body_util::BodyExt as _;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;
use tower::{Service, ServiceExt as _};

use super::check::{self, Counted, Refusal};
use crate::http::state::AppState;

/// List elements and map entries a request may carry in all, for each
/// item, key or operation it may have: room for each to carry a few
/// metadata entries.
const ELEMENTS_PER_OP: usize = 8;

/// Deepest nesting walked; the protos nest four deep.
const MAX_DEPTH: usize = 16;

/// gRPC's message prefix: a compression flag and a 4-byte length.
const PREFIX_BYTES: usize = 5;

/// What one call's request message is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Bytes of the message (`--dapr-max-body-size`).
    pub max_message: usize,
    /// Elements of the request's own list: items, keys or operations
    /// (`--max-batch-ops`).
    pub max_list: usize,
    /// List elements and map entries in all, at every depth.
    pub max_elements: usize,
}

impl DecodeLimits {
    /// The limits of the gateway in `state`.
    pub fn of(state: &AppState) -> Self {
        Self {
            max_message: state.limits.dapr_max_body_size,
            max_list: state.limits.max_batch_ops,
            max_elements: state.limits.max_batch_ops.saturating_mul(ELEMENTS_PER_OP),
        }
    }
}

tokio::task_local! {
    /// The limits of the call being served ([`Checked`] sets them).
    static LIMITS: DecodeLimits;
}

/// A message of the protos, as the walk reads it.
#[derive(Debug)]
pub struct Message {
    /// Its full name (`dapr.proto.runtime.v1.SaveStateRequest`).
    pub name: &'static str,
    /// Its fields.
    pub fields: &'static [Field],
}

/// A field of a [`Message`].
#[derive(Debug)]
pub struct Field {
    /// Its number on the wire.
    pub number: u32,
    /// Its name in the protos.
    pub name: &'static str,
    /// Repeated (a map is a repeated entry message).
    pub list: bool,
    /// What it holds.
    pub kind: Kind,
}

/// What a [`Field`] holds, as far as the walk cares.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A number, bool or enum (packed when a list): `fixed` bytes each,
    /// or a varint each when 0.
    Number {
        /// Its width on the wire; 0 for a varint.
        fixed: usize,
    },
    /// A string or bytes.
    Bytes,
    /// A message, walked in turn.
    Message(&'static Message),
}

/// A generated message type with its fields' table.
pub trait Shaped {
    /// The table.
    fn shape() -> &'static Message;
}

/// `google.protobuf.Empty`, which the generated client decodes.
static EMPTY: Message = Message {
    name: "google.protobuf.Empty",
    fields: &[],
};

impl Shaped for () {
    fn shape() -> &'static Message {
        &EMPTY
    }
}

/// The tables and the [`Shaped`] implementations, generated.
mod shapes {
    use crate::http::dapr::codec::{Field, Kind, Message, Shaped};

    include!(concat!(env!("OUT_DIR"), "/dapr_shapes.rs"));
}

/// The generated server's codec: prost's encoder, and [`CheckedDecoder`].
#[derive(Debug)]
pub struct DaprCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for DaprCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for DaprCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Shaped + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder {
            // Outside a call [`Checked`] serves (none is), the defaults.
            limits: LIMITS.try_with(|limits| *limits).unwrap_or(DecodeLimits {
                max_message: crate::settings::DEFAULT_DAPR_MAX_BODY_SIZE,
                max_list: crate::settings::DEFAULT_MAX_BATCH_OPS,
                max_elements: crate::settings::DEFAULT_MAX_BATCH_OPS * ELEMENTS_PER_OP,
            }),
            message: PhantomData,
        }
    }
}

/// Decodes a `U` once [`check`] passes it.
#[derive(Debug)]
pub struct CheckedDecoder<U> {
    limits: DecodeLimits,
    message: PhantomData<U>,
}

impl<U: prost::Message + Default + Shaped> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // The message's own buffer, shared: `bytes` fields are slices of it.
        let message = buf.copy_to_bytes(buf.remaining());
        check(&message, U::shape(), self.limits)?;
        U::decode(message).map(Some).map_err(|error| {
            Status::from(Refusal::Malformed(format!(
                "not a {}: {error}",
                U::shape().name
            )))
        })
    }
}

/// Walks `message`, a `shape` on the wire, and refuses it over `limits`:
/// more elements in one of the request's own lists than `max_list`, more
/// list elements and map entries in all than `max_elements`, or wire
/// format that is not a message.
fn check(message: &[u8], shape: &'static Message, limits: DecodeLimits) -> Result<(), Refusal> {
    Walk {
        limits,
        elements: 0,
        top: shape,
    }
    .message(message, shape, 0)
}

/// The request's own list that a field is, by Dapr's name for it.
fn counted(field: &Field) -> Option<Counted> {
    match field.name {
        "states" => Some(Counted::Items),
        "keys" => Some(Counted::Keys),
        "operations" => Some(Counted::Operations),
        // A bulk publish's events, counted as a save's items.
        "entries" => Some(Counted::Items),
        _ => None,
    }
}

struct Walk {
    limits: DecodeLimits,
    elements: usize,
    top: &'static Message,
}

impl Walk {
    fn malformed(&self, what: &str) -> Refusal {
        Refusal::Malformed(format!("not a {}: {what}", self.top.name))
    }

    fn message(
        &mut self,
        mut bytes: &[u8],
        shape: &'static Message,
        depth: usize,
    ) -> Result<(), Refusal> {
        if depth > MAX_DEPTH {
            return Err(self.malformed("nested too deeply"));
        }
        // The elements of each of the request's own lists so far.
        let mut own = vec![0usize; if depth == 0 { shape.fields.len() } else { 0 }];
        while !bytes.is_empty() {
            let key = self.varint(&mut bytes)?;
            let (number, wire) = (key >> 3, key & 7);
            let at = shape
                .fields
                .iter()
                .position(|field| u64::from(field.number) == number);
            let field = at.map(|at| &shape.fields[at]);
            let count = match wire {
                0 => self.varint(&mut bytes).map(|_| 1)?,
                1 => self.take(&mut bytes, 8).map(|_| 1)?,
                5 => self.take(&mut bytes, 4).map(|_| 1)?,
                2 => {
                    let length = self.varint(&mut bytes)?;
                    let length = usize::try_from(length).map_err(|_| self.malformed("length"))?;
                    let payload = self.take(&mut bytes, length)?;
                    match field.map(|field| field.kind) {
                        Some(Kind::Message(inner)) => {
                            self.message(payload, inner, depth + 1)?;
                            1
                        }
                        // Packed numbers.
                        Some(Kind::Number { fixed: 0 }) => {
                            payload.iter().filter(|&&byte| byte < 0x80).count()
                        }
                        Some(Kind::Number { fixed }) => payload.len() / fixed,
                        Some(Kind::Bytes) | None => 1,
                    }
                }
                3 => {
                    self.skip_group(&mut bytes, number, depth + 1)?;
                    1
                }
                _ => return Err(self.malformed("unknown wire type")),
            };
            let Some((at, field)) = at.zip(field).filter(|(_, field)| field.list) else {
                continue;
            };
            if depth == 0
                && let Some(what) = counted(field)
            {
                own[at] += count;
                check::at_most(self.limits.max_list, own[at], what)?;
            }
            self.elements += count;
            if self.elements > self.limits.max_elements {
                return Err(Refusal::TooManyElements(self.limits.max_elements));
            }
        }
        Ok(())
    }

    /// Skips a group (a proto2 form no Dapr message has, skipped as prost
    /// skips an unknown field) up to its end.
    fn skip_group(&self, bytes: &mut &[u8], number: u64, depth: usize) -> Result<(), Refusal> {
        if depth > MAX_DEPTH {
            return Err(self.malformed("nested too deeply"));
        }
        loop {
            if bytes.is_empty() {
                return Err(self.malformed("a group without its end"));
            }
            let key = self.varint(bytes)?;
            match key & 7 {
                0 => self.varint(bytes).map(drop)?,
                1 => self.take(bytes, 8).map(drop)?,
                5 => self.take(bytes, 4).map(drop)?,
                2 => {
                    let length = self.varint(bytes)?;
                    let length = usize::try_from(length).map_err(|_| self.malformed("length"))?;
                    self.take(bytes, length).map(drop)?;
                }
                3 => self.skip_group(bytes, key >> 3, depth + 1)?,
                4 if key >> 3 == number => return Ok(()),
                _ => return Err(self.malformed("a group's end does not match")),
            }
        }
    }

    fn varint(&self, bytes: &mut &[u8]) -> Result<u64, Refusal> {
        let mut value = 0u64;
        for (at, &byte) in bytes.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * at);
            if byte < 0x80 {
                *bytes = &bytes[at + 1..];
                return Ok(value);
            }
        }
        Err(self.malformed("a varint"))
    }

    fn take<'b>(&self, bytes: &mut &'b [u8], length: usize) -> Result<&'b [u8], Refusal> {
        if bytes.len() < length {
            return Err(self.malformed("a field past the message's end"));
        }
        let (taken, rest) = bytes.split_at(length);
        *bytes = rest;
        Ok(taken)
    }
}

/// The served methods: each request's message length read off its prefix
/// and checked before the message is read, then the call served under the
/// gateway's [`DecodeLimits`].
#[derive(Debug, Clone)]
pub struct Checked<S> {
    inner: S,
    limits: DecodeLimits,
}

impl<S> Checked<S> {
    /// `inner` held to `limits`.
    pub fn new(inner: S, limits: DecodeLimits) -> Self {
        Self { inner, limits }
    }
}

impl<S> Service<Request> for Checked<S>
where
    S: Service<Request, Response = axum::http::Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let (inner, limits) = (self.inner.clone(), self.limits);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let (length, body) = message_length(body).await;
            if length.is_some_and(|length| length > limits.max_message) {
                let refusal = Refusal::TooLarge(limits.max_message);
                return Ok(Status::from(refusal).into_http::<Body>().into_response());
            }
            let call = inner.oneshot(Request::from_parts(parts, body));
            let response = LIMITS.scope(limits, call).await?;
            Ok(response.into_response())
        })
    }
}

/// The length a gRPC body's first message declares (`None` when the body
/// ends first), and the body as it was.
async fn message_length(mut body: Body) -> (Option<usize>, Body) {
    let mut read: Vec<Bytes> = Vec::new();
    let mut failed = None;
    while read.iter().map(Bytes::len).sum::<usize>() < PREFIX_BYTES {
        match body.frame().await {
            None => break,
            Some(Err(error)) => {
                failed = Some(error);
                break;
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.push(data);
                }
            }
        }
    }
    let prefix: Vec<u8> = read
        .iter()
        .flat_map(|chunk| chunk.iter().copied())
        .take(PREFIX_BYTES)
        .collect();
    let length = <[u8; 4]>::try_from(prefix.get(1..PREFIX_BYTES).unwrap_or_default())
        .ok()
        .and_then(|length| usize::try_from(u32::from_be_bytes(length)).ok());
    let read = stream::iter(read.into_iter().map(Ok));
    let body = match failed {
        Some(error) => Body::from_stream(read.chain(stream::iter([Err(error)]))),
        None => Body::from_stream(read.chain(body.into_data_stream())),
    };
    (length, body)
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::http::dapr::proto::common::v1::StateItem;
    use crate::http::dapr::proto::runtime::v1::{
        ExecuteStateTransactionRequest, GetBulkStateRequest, SaveStateRequest,
        TransactionalStateOperation,
    };

    const SMALL: DecodeLimits = DecodeLimits {
        max_message: 1 << 20,
        max_list: 3,
        max_elements: 8,
    };

    fn items(count: usize, metadata: usize) -> Vec<StateItem> {
        (0..count)
            .map(|n| StateItem {
                key: format!("k{n}"),
                value: Bytes::from_static(b"v"),
                metadata: (0..metadata)
                    .map(|m| (format!("m{m}"), "x".into()))
                    .collect(),
                ..StateItem::default()
            })
            .collect()
    }

    fn save(items: Vec<StateItem>) -> Vec<u8> {
        SaveStateRequest {
            store_name: "statestore".into(),
            states: items,
        }
        .encode_to_vec()
    }

    #[test]
    fn the_requests_own_lists_are_counted_by_their_names() {
        assert_eq!(
            check(&save(items(3, 0)), SaveStateRequest::shape(), SMALL),
            Ok(())
        );
        let bulk = GetBulkStateRequest {
            keys: vec![String::new(); 4],
            ..GetBulkStateRequest::default()
        };
        let transaction = ExecuteStateTransactionRequest {
            operations: vec![TransactionalStateOperation::default(); 4],
            ..ExecuteStateTransactionRequest::default()
        };
        for (message, shape, what) in [
            (save(items(4, 0)), SaveStateRequest::shape(), Counted::Items),
            (
                bulk.encode_to_vec(),
                GetBulkStateRequest::shape(),
                Counted::Keys,
            ),
            (
                transaction.encode_to_vec(),
                ExecuteStateTransactionRequest::shape(),
                Counted::Operations,
            ),
        ] {
            assert_eq!(
                check(&message, shape, SMALL),
                Err(Refusal::TooMany { max: 3, what })
            );
        }
    }

    #[test]
    fn map_entries_at_every_depth_count_toward_the_whole() {
        let shape = SaveStateRequest::shape();
        // Two items and three entries each: eight elements.
        assert_eq!(check(&save(items(2, 3)), shape, SMALL), Ok(()));
        assert_eq!(
            check(&save(items(3, 2)), shape, SMALL),
            Err(Refusal::TooManyElements(8))
        );
        // Inside a transaction's operations too.
        let operations = items(1, 8)
            .into_iter()
            .map(|item| TransactionalStateOperation {
                operation_type: "upsert".into(),
                request: Some(item),
            })
            .collect();
        let transaction = ExecuteStateTransactionRequest {
            operations,
            ..ExecuteStateTransactionRequest::default()
        };
        assert_eq!(
            check(
                &transaction.encode_to_vec(),
                ExecuteStateTransactionRequest::shape(),
                SMALL
            ),
            Err(Refusal::TooManyElements(8))
        );
    }

    #[test]
    fn a_list_counts_its_elements_wherever_they_are_on_the_wire() {
        // Elements of one list interleaved with another field, and
        // unknown fields of every wire type (a group among them), skipped.
        let mut message = save(items(2, 0));
        message.extend_from_slice(&[0x08, 0x96, 0x01]); // field 1 as a varint
        message.extend_from_slice(&[0x9b, 0x06, 0x08, 0x01, 0x9c, 0x06]); // group 99
        message.extend_from_slice(&[0xa5, 0x06, 1, 2, 3, 4]); // fixed32 field 100
        message.extend_from_slice(&save(items(1, 0))[12..]);
        assert_eq!(check(&message, SaveStateRequest::shape(), SMALL), Ok(()));
        message.extend_from_slice(&save(items(1, 0))[12..]);
        assert!(matches!(
            check(&message, SaveStateRequest::shape(), SMALL),
            Err(Refusal::TooMany { .. })
        ));
    }

    #[test]
    fn what_is_not_a_message_is_malformed() {
        let shape = SaveStateRequest::shape();
        for bytes in [
            &[0x12, 0x05, 0x0a][..],       // a field past the end
            &[0x12, 0x02, 0x0a, 0x09][..], // the same, one level down
            &[0xff; 11][..],               // a varint that never ends
            &[0x0f][..],                   // wire type 7
            &[0x0b, 0x10][..],             // a group without its end
        ] {
            assert!(
                matches!(check(bytes, shape, SMALL), Err(Refusal::Malformed(_))),
                "{bytes:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_messages_length_is_read_off_its_prefix_and_the_body_kept_whole() {
        let framed = [&[0u8, 0, 0, 1, 2][..], b"ab", b"c"].concat();
        // The prefix split across chunks.
        let chunks: Vec<Result<Bytes, Infallible>> = vec![
            Ok(Bytes::copy_from_slice(&framed[..2])),
            Ok(Bytes::copy_from_slice(&framed[2..6])),
            Ok(Bytes::copy_from_slice(&framed[6..])),
        ];
        let (length, body) = message_length(Body::from_stream(stream::iter(chunks))).await;
        assert_eq!(length, Some(258));
        assert_eq!(body.collect().await.unwrap().to_bytes(), framed);
        let (length, body) = message_length(Body::from(&b"\0\0"[..])).await;
        assert_eq!(length, None);
        assert_eq!(body.collect().await.unwrap().to_bytes(), &b"\0\0"[..]);
    }
}
