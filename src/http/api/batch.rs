//! `POST /batch`: many gets, sets and deletes in one request, each op
//! answered as its one-key request would be.
//!
//! Every op is parsed and checked into the one-key handlers' command
//! ([`KeyCommand`]) before anything is sent: one bad op refuses the whole
//! batch, naming its index, and nothing is applied. The ops then run
//! concurrently, those on one key in the order given, each through the
//! one-key path ([`KeyCommand::send`], [`respond`], [`ApiError::problem`]),
//! so that an op and a single request cannot answer differently. A batch
//! is not atomic: each op has its own outcome. The answer is written as
//! the ops complete, in their order, a value piece by piece, so a batch of
//! reads holds its values once, never their JSON whole.
//!
//! All batches together hold at most half of the pool's in-flight slots
//! (`batch_slots`), so one-key requests always find room; an op that gets
//! no slot, or whose turn on its key comes, after the batch's deadline
//! never leaves the gateway (503).

use std::cell::Cell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::convert::Infallible;
use std::fmt;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures_util::stream::{self, FuturesUnordered};
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::extract::{
    DeclaredLength, Query, checked_key, parse_fencing_token, parse_ttl, read_body,
};
use super::keys::{
    Answer, Joined, KeyCommand, json_into, method_not_allowed, respond, set_condition, value_fields,
};
use crate::access::rules::{Access, Need};
use crate::http::headers::set_common_headers;
use crate::http::problem::{ApiError, Problem};
use crate::http::state::AppState;
use crate::mqtt::{PoolError, RequestOptions};
use crate::protocol::{Hlc, SetOptions};
use crate::store::{RequestError, Versioned};
use crate::trace;

/// The batch route; methods other than POST get 405 with `Allow`.
pub fn routes() -> Router<AppState> {
    Router::new().route("/batch", post(batch).fallback(method_not_allowed))
}

/// `POST /batch` with `{"ops": [...]}`: `200 {"results": [...]}`, one
/// result per op, in order.
async fn batch(
    State(state): State<AppState>,
    access: Access,
    query: Query,
    headers: HeaderMap,
    DeclaredLength(declared): DeclaredLength,
    mut body: Body,
) -> Result<Response, ApiError> {
    // Reading the body, waiting for slots and the turns of ops on one key
    // share one request timeout: no op is sent after it. Each op then has
    // its own, as a single request does, which keeps the whole batch
    // within the backstop.
    let deadline = Instant::now() + state.request_timeout();
    query.accept(&[])?;
    refuse_unless_json(&headers)?;
    let max = state.limits.max_batch_bytes;
    let body = read_body(&mut body, declared, max, state.request_timeout())
        .await
        .map_err(|error| match error {
            ApiError::ValueTooLarge { .. } => ApiError::BatchTooLarge { max },
            other => other,
        })?;
    let ops = parse(&body, &state)?;
    drop(body);
    state.metrics.batch_size.observe(ops.len() as f64);
    let results = run(&state, &access, ops, deadline);
    let mut response = Response::new(Body::from_stream(answer(results)));
    set_common_headers(response.headers_mut(), "application/json");
    Ok(response)
}

/// A batch is JSON; any other body is refused (415) rather than guessed at.
fn refuse_unless_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|text| text.split(';').next().unwrap_or_default().trim());
    match media_type {
        Some(media_type) if media_type.eq_ignore_ascii_case("application/json") => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType(
            "a batch is sent as Content-Type: application/json".into(),
        )),
    }
}

/// The body, `{"ops": [...]}` and nothing else, read with at most `max`
/// ops held: an op past the limit ends the read (413) unparsed, so a
/// refused body costs about its own size whatever its op count.
fn read_ops(body: &[u8], max: usize) -> Result<Vec<serde_json::Value>, ApiError> {
    let exceeded = Cell::new(false);
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let ops = (&mut deserializer)
        .deserialize_map(BatchBody {
            max,
            exceeded: &exceeded,
        })
        .and_then(|ops| deserializer.end().map(|()| ops));
    match ops {
        Ok(ops) => Ok(ops),
        Err(_) if exceeded.get() => Err(ApiError::TooManyOps { max }),
        Err(error) => Err(ApiError::BadBatch(format!(
            "the body is not a batch: {error}"
        ))),
    }
}

/// Reads `{"ops": [...]}`: its one field, then each op up to `max`;
/// raises `exceeded` when there is one more.
#[derive(Clone, Copy)]
struct BatchBody<'a> {
    max: usize,
    exceeded: &'a Cell<bool>,
}

impl<'de> Visitor<'de> for BatchBody<'_> {
    type Value = Vec<serde_json::Value>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(r#"{"ops": [...]}"#)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut ops = None;
        while let Some(field) = map.next_key::<String>()? {
            if field != "ops" {
                return Err(de::Error::unknown_field(&field, &["ops"]));
            }
            if ops.is_some() {
                return Err(de::Error::duplicate_field("ops"));
            }
            ops = Some(map.next_value_seed(Ops(self))?);
        }
        ops.ok_or_else(|| de::Error::missing_field("ops"))
    }
}

/// The `ops` array of a [`BatchBody`].
struct Ops<'a>(BatchBody<'a>);

impl<'de> DeserializeSeed<'de> for Ops<'_> {
    type Value = Vec<serde_json::Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Ops<'_> {
    type Value = Vec<serde_json::Value>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an array of ops")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let BatchBody { max, exceeded } = self.0;
        let mut ops = Vec::new();
        loop {
            if ops.len() == max {
                // One more op, skipped unread, is one too many.
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    exceeded.set(true);
                    return Err(de::Error::custom("too many ops"));
                }
                return Ok(ops);
            }
            match seq.next_element()? {
                Some(op) => ops.push(op),
                None => return Ok(ops),
            }
        }
    }
}

/// One op as sent: every field any op takes (which op takes which is
/// checked by [`command`]); others are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpFields {
    op: String,
    key: Option<String>,
    key_base64: Option<String>,
    value: Option<String>,
    value_base64: Option<String>,
    ttl: Option<serde_json::Value>,
    if_none_match: Option<bool>,
    nex: Option<bool>,
    persist: Option<bool>,
    fencing_token: Option<String>,
}

impl OpFields {
    /// The optional fields and whether each was given (`null` is not given).
    fn options(&self) -> [(&'static str, bool); 7] {
        [
            ("value", self.value.is_some()),
            ("value_base64", self.value_base64.is_some()),
            ("ttl", self.ttl.is_some()),
            ("if_none_match", self.if_none_match.is_some()),
            ("nex", self.nex.is_some()),
            ("persist", self.persist.is_some()),
            ("fencing_token", self.fencing_token.is_some()),
        ]
    }
}

/// The verb of an op, also its metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Get,
    Set,
    Delete,
}

impl OpKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::Set => "set",
            Self::Delete => "delete",
        }
    }

    /// What the op needs of its key under the rules.
    fn need(self) -> Need {
        match self {
            Self::Get => Need::Read,
            Self::Set | Self::Delete => Need::Write,
        }
    }

    /// The optional fields this op takes: every option of its one-key
    /// request, nothing else.
    fn takes(self) -> &'static [&'static str] {
        match self {
            Self::Get => &[],
            Self::Set => &[
                "value",
                "value_base64",
                "ttl",
                "if_none_match",
                "nex",
                "persist",
                "fencing_token",
            ],
            Self::Delete => &["value", "value_base64", "fencing_token"],
        }
    }
}

/// Every op of the body as a command, or the first op's refusal (with its
/// index); more than `--max-batch-ops` ops is 413.
fn parse(body: &[u8], state: &AppState) -> Result<Vec<(OpKind, KeyCommand)>, ApiError> {
    let ops = read_ops(body, state.limits.max_batch_ops)?;
    let limits = OpLimits {
        max_key_bytes: state.limits.max_key_bytes,
        max_value_bytes: state.value_limit(),
        now_ms: (state.clock)(),
    };
    ops.into_iter()
        .enumerate()
        .map(|(index, op)| {
            serde_json::from_value(op)
                .map_err(|error| ApiError::BadBatch(error.to_string()))
                .and_then(|fields| command(fields, &limits))
                .map_err(|error| ApiError::BatchOp {
                    index,
                    error: Box::new(error),
                })
        })
        .collect()
}

/// What an op is checked against: the one-key requests' limits.
struct OpLimits {
    max_key_bytes: usize,
    max_value_bytes: usize,
    now_ms: u64,
}

/// One op as the command its one-key request would send, checked as that
/// request is (same errors, same statuses).
fn command(fields: OpFields, limits: &OpLimits) -> Result<(OpKind, KeyCommand), ApiError> {
    let kind = match fields.op.as_str() {
        "get" => OpKind::Get,
        "set" => OpKind::Set,
        "delete" => OpKind::Delete,
        other => {
            return Err(ApiError::BadBatch(format!(
                "unknown op {:?}: use get, set or delete",
                other.chars().take(32).collect::<String>()
            )));
        }
    };
    if let Some((name, _)) = fields
        .options()
        .into_iter()
        .find(|(name, given)| *given && !kind.takes().contains(name))
    {
        return Err(ApiError::BadBatch(format!(
            "a {} op does not take {name:?}",
            kind.as_str()
        )));
    }
    let key = text_or_base64("key", fields.key, fields.key_base64)?
        .ok_or_else(|| ApiError::BadBatch("an op needs key or key_base64".into()))?;
    let key = checked_key(key, limits.max_key_bytes)?;
    let value = text_or_base64("value", fields.value, fields.value_base64)?;
    if value
        .as_ref()
        .is_some_and(|value| value.len() > limits.max_value_bytes)
    {
        return Err(ApiError::ValueTooLarge {
            max: limits.max_value_bytes,
        });
    }
    let fencing_token = fields
        .fencing_token
        .map(|text| parse_fencing_token(&text, limits.now_ms))
        .transpose()?;
    let command = match kind {
        OpKind::Get => KeyCommand::Get { key },
        OpKind::Set => KeyCommand::Set {
            key,
            value: value
                .ok_or_else(|| ApiError::BadBatch("a set op needs value or value_base64".into()))?,
            options: SetOptions {
                condition: set_condition(
                    fields.if_none_match.unwrap_or(false),
                    fields.nex.unwrap_or(false),
                )?,
                expires_in_ms: fields.ttl.as_ref().map(ttl_ms).transpose()?,
            },
            envelope: RequestOptions {
                fencing_token,
                persist: fields.persist.unwrap_or(false),
                ..RequestOptions::default()
            },
        },
        OpKind::Delete => KeyCommand::Delete {
            key,
            expected: value,
            fencing_token,
        },
    };
    Ok((kind, command))
}

/// A field given as UTF-8 text (`name`) or as base64 (`name_base64`), not both.
fn text_or_base64(
    name: &str,
    text: Option<String>,
    base64: Option<String>,
) -> Result<Option<Bytes>, ApiError> {
    match (text, base64) {
        (Some(_), Some(_)) => Err(ApiError::BadBatch(format!(
            "give {name} or {name}_base64, not both"
        ))),
        (Some(text), None) => Ok(Some(Bytes::from(text))),
        (None, Some(encoded)) => BASE64
            .decode(encoded.as_bytes())
            .map(|bytes| Some(Bytes::from(bytes)))
            .map_err(|error| ApiError::BadBatch(format!("{name}_base64 is not base64: {error}"))),
        (None, None) => Ok(None),
    }
}

/// `ttl` as the query parameter takes it (`"30s"`, `"500ms"`, `"1500"`),
/// or a JSON number of milliseconds.
fn ttl_ms(ttl: &serde_json::Value) -> Result<u64, ApiError> {
    match ttl {
        serde_json::Value::String(text) => parse_ttl(text.as_bytes()),
        serde_json::Value::Number(number) => parse_ttl(number.to_string().as_bytes()),
        other => Err(ApiError::BadTtl(
            other.to_string().chars().take(32).collect(),
        )),
    }
}

/// Runs the ops in a task of their own: those on one key in the order
/// given (a chain), the chains concurrently; each op's index and result as
/// it completes. The ops do not wait for the client to read the answer
/// (an op holds a batch slot until its future runs again); dropping the
/// receiver (the client went away) stops them, as it stops a one-key
/// request.
fn run(
    state: &AppState,
    access: &Access,
    ops: Vec<(OpKind, KeyCommand)>,
    deadline: Instant,
) -> Completed {
    let mut chains: Vec<Vec<(usize, OpKind, KeyCommand)>> = Vec::new();
    let mut chain_of: HashMap<Bytes, usize> = HashMap::with_capacity(ops.len());
    let count = ops.len();
    for (index, (kind, command)) in ops.into_iter().enumerate() {
        match chain_of.entry(command.key().clone()) {
            Entry::Occupied(chain) => chains[*chain.get()].push((index, kind, command)),
            Entry::Vacant(slot) => {
                slot.insert(chains.len());
                chains.push(vec![(index, kind, command)]);
            }
        }
    }
    drop(chain_of);
    let (done, received) = mpsc::unbounded_channel();
    let (state, access) = (state.clone(), access.clone());
    let task = tokio::spawn(trace::inherit(async move {
        let mut running: FuturesUnordered<_> = chains
            .into_iter()
            .map(|chain| {
                let (state, access, done) = (&state, &access, &done);
                async move {
                    for (index, kind, command) in chain {
                        let result = run_op(state, access, kind, command, deadline).await;
                        // The client left: the ops not yet sent are not sent.
                        if done.send((index, result)).is_err() {
                            return;
                        }
                    }
                }
            })
            .collect();
        while running.next().await.is_some() {}
    }));
    Completed {
        received,
        task: task.abort_handle(),
        count,
    }
}

/// The results of a batch's ops as they complete; aborts the ops when
/// dropped.
struct Completed {
    received: mpsc::UnboundedReceiver<(usize, OpResult)>,
    task: AbortHandle,
    count: usize,
}

impl Drop for Completed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `{"results": [...]}`, each result written in the ops' order as soon as
/// it and those before it are done, a value piece by piece as the client
/// reads it: the answer holds the values of the results done but not yet
/// written and one piece, never a value's JSON and base64 forms whole.
fn answer(completed: Completed) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let results = in_order(completed)
        .enumerate()
        .flat_map(|(index, result)| stream::iter(result_pieces(index, result)));
    let pieces = stream::iter([Bytes::from_static(br#"{"results":["#)])
        .chain(results)
        .chain(stream::iter([Bytes::from_static(b"]}")]));
    Joined::new(pieces).map(Ok)
}

/// The results of `completed` in the ops' order.
fn in_order(completed: Completed) -> impl Stream<Item = OpResult> + Send {
    let done: Vec<Option<OpResult>> = (0..completed.count).map(|_| None).collect();
    stream::unfold(
        (completed, done, 0),
        |(mut completed, mut done, next)| async move {
            while done.get(next)?.is_none() {
                // `None`: the ops' task ended early (it panicked); so does
                // the answer.
                let (index, result) = completed.received.recv().await?;
                done[index] = Some(result);
            }
            let result = done[next].take()?;
            Some((result, (completed, done, next + 1)))
        },
    )
}

/// One result's JSON, `,` before it but for the first: `status`, then
/// `version` (and a get's `value` and `value_base64`) or `problem`.
fn result_pieces(index: usize, result: OpResult) -> impl Iterator<Item = Bytes> + Send {
    let separator = if index == 0 { "" } else { "," };
    let mut head = format!(r#"{separator}{{"status":{}"#, result.status.as_u16()).into_bytes();
    let value = match result.answer {
        Ok(answer) => {
            head.extend_from_slice(br#","version":"#);
            json_into(&mut head, &answer.version().map(Hlc::encode));
            match answer {
                Answer::Value(Versioned { value, .. }) => Some(value),
                _ => None,
            }
        }
        Err(problem) => {
            head.extend_from_slice(br#","problem":"#);
            json_into(&mut head, &problem);
            None
        }
    };
    let value = value
        .into_iter()
        .flat_map(|value| std::iter::once(Bytes::from_static(b",")).chain(value_fields(value)));
    std::iter::once(Bytes::from(head))
        .chain(value)
        .chain(std::iter::once(Bytes::from_static(b"}")))
}

/// One op: allowed to the caller (else 403, as its one-key request), not
/// past the batch's deadline (else 503, not sent), a batch slot (waiting at
/// most until that deadline), then the one-key path. An op sent by the
/// deadline ends within one request timeout after it, so a batch answers
/// within twice the request timeout, inside the backstop.
async fn run_op(
    state: &AppState,
    access: &Access,
    kind: OpKind,
    command: KeyCommand,
    deadline: Instant,
) -> OpResult {
    let started = std::time::Instant::now();
    let answer = match access.require(command.key(), kind.need()) {
        Err(denied) => Err(denied.into()),
        // The ops before it on its key took the batch's time: sending it
        // now could outlast the backstop, and the batch would answer one
        // 504 for all its ops.
        Ok(()) if Instant::now() >= deadline => {
            Err(ApiError::BatchOutOfTime(state.request_timeout()))
        }
        Ok(()) => match tokio::time::timeout_at(deadline, state.batch_slots.acquire()).await {
            Ok(Ok(_slot)) => match command.send(state).await {
                Ok(outcome) => respond(outcome),
                Err(error) => Err(error),
            },
            // No slot in time (the semaphore is never closed): the op never
            // left the gateway, as when the pool's own window is full.
            _ => Err(RequestError::Transport(PoolError::Overloaded).into()),
        },
    };
    let result = match answer {
        Ok(answer) => OpResult {
            status: answer.status(),
            answer: Ok(answer),
        },
        Err(error) => {
            let problem = error.problem();
            OpResult {
                status: StatusCode::from_u16(problem.status)
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                answer: Err(problem),
            }
        }
    };
    let label = kind.as_str();
    state
        .metrics
        .batch_ops
        .with_label_values(&[label, result.status.as_str()])
        .inc();
    state
        .metrics
        .batch_op_latency
        .with_label_values(&[label])
        .observe(started.elapsed().as_secs_f64());
    result
}

/// One op's result: its status, and its version (and value) or its problem.
#[derive(Debug)]
struct OpResult {
    status: StatusCode,
    answer: Result<Answer, Problem>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn limits() -> OpLimits {
        OpLimits {
            max_key_bytes: 8,
            max_value_bytes: 4,
            now_ms: NOW,
        }
    }

    fn op(json: serde_json::Value) -> Result<(OpKind, KeyCommand), ApiError> {
        let fields: OpFields =
            serde_json::from_value(json).map_err(|error| ApiError::BadBatch(error.to_string()))?;
        command(fields, &limits())
    }

    fn status(json: serde_json::Value) -> u16 {
        match op(json) {
            Ok(_) => 0,
            Err(error) => error.problem().status,
        }
    }

    #[test]
    fn ops_become_the_one_key_commands() {
        use serde_json::json;
        let (kind, command) = op(json!({"op": "set", "key_base64": "AP8=", "value": "v",
            "ttl": "30s", "if_none_match": true, "persist": true,
            "fencing_token": "001700000000000:00001:StateStore"}))
        .unwrap();
        assert_eq!(kind, OpKind::Set);
        let KeyCommand::Set {
            key,
            value,
            options,
            envelope,
        } = command
        else {
            panic!("not a set")
        };
        assert_eq!(key.as_ref(), b"\x00\xff");
        assert_eq!(value.as_ref(), b"v");
        assert_eq!(options.expires_in_ms, Some(30_000));
        assert_eq!(
            options.condition,
            crate::protocol::SetCondition::OnlyIfMissing
        );
        assert!(envelope.persist);
        assert!(envelope.fencing_token.is_some());
        let (_, command) = op(json!({"op": "delete", "key": "k", "value_base64": "AAE="})).unwrap();
        assert!(
            matches!(command, KeyCommand::Delete { expected: Some(v), .. } if v.as_ref() == b"\x00\x01")
        );
        let (_, command) = op(json!({"op": "set", "key": "k", "value": "v", "ttl": 1500})).unwrap();
        assert!(
            matches!(command, KeyCommand::Set { options, .. } if options.expires_in_ms == Some(1500))
        );
    }

    #[test]
    fn bad_ops_get_the_one_key_statuses() {
        use serde_json::json;
        for (json, expected) in [
            (json!({"op": "put", "key": "k"}), 400),
            (json!({"op": "get"}), 400),
            (json!({"op": "get", "key": ""}), 400),
            (json!({"op": "get", "key": "123456789"}), 414),
            (json!({"op": "get", "key": "k", "ttl": "1s"}), 400),
            (json!({"op": "get", "key": "k", "colour": 1}), 400),
            (json!({"op": "get", "key": "k", "key_base64": "aw=="}), 400),
            (json!({"op": "get", "key_base64": "***"}), 400),
            (json!({"op": "set", "key": "k"}), 400),
            (json!({"op": "set", "key": "k", "value": "12345"}), 413),
            (
                json!({"op": "set", "key": "k", "value": "v", "ttl": "0"}),
                400,
            ),
            (
                json!({"op": "set", "key": "k", "value": "v", "ttl": true}),
                400,
            ),
            (
                json!({"op": "set", "key": "k", "value": "v", "nex": true, "if_none_match": true}),
                400,
            ),
            (
                json!({"op": "set", "key": "k", "value": "v", "fencing_token": "nope"}),
                400,
            ),
            (
                json!({"op": "set", "key": "k", "value": "v", "fencing_token": "1700000061000:0:x"}),
                400,
            ),
            (json!({"op": "delete", "key": "k", "ttl": "1s"}), 400),
            (json!({"op": "delete", "key": "k", "persist": true}), 400),
            (json!({"op": "delete", "key": "k", "nex": 1}), 400),
        ] {
            assert_eq!(status(json.clone()), expected, "{json}");
        }
    }

    #[test]
    fn a_body_is_ops_and_nothing_else_up_to_the_limit() {
        let ops = |body: &str| read_ops(body.as_bytes(), 2).map(|ops| ops.len());
        assert_eq!(ops(r#"{"ops": []}"#).unwrap(), 0);
        assert_eq!(ops(r#" {"ops": [1, {"op": "get"}]} "#).unwrap(), 2);
        for too_many in [r#"{"ops": [1, 2, 3]}"#, r#"{"ops": [1, 2, 3, "#] {
            assert!(
                matches!(ops(too_many), Err(ApiError::TooManyOps { max: 2 })),
                "{too_many}"
            );
        }
        for bad in [
            "",
            "[]",
            r#"{"ops": {}}"#,
            r#"{}"#,
            r#"{"ops": [], "more": 1}"#,
            r#"{"ops": [], "ops": []}"#,
            r#"{"ops": [1, 2}"#,
            r#"{"ops": []} x"#,
        ] {
            assert!(matches!(ops(bad), Err(ApiError::BadBatch(_))), "{bad}");
        }
    }

    #[test]
    fn a_refused_op_names_its_index() {
        let problem = ApiError::BatchOp {
            index: 3,
            error: Box::new(ApiError::KeyTooLong { len: 9, max: 8 }),
        }
        .problem();
        assert_eq!(problem.status, 414);
        assert_eq!(problem.kind, "/problems/key-too-long");
        assert_eq!(problem.op, Some(3));
        assert!(problem.detail.starts_with("op 3: "), "{}", problem.detail);
    }

    fn result_json(index: usize, result: OpResult) -> serde_json::Value {
        let text: Vec<u8> = result_pieces(index, result).flatten().collect();
        let text = text.strip_prefix(b",").unwrap_or(&text);
        serde_json::from_slice(text).unwrap()
    }

    #[test]
    fn results_carry_version_value_or_problem() {
        let version = Hlc::parse("1:2:S").unwrap();
        let read = OpResult {
            status: StatusCode::OK,
            answer: Ok(Answer::Value(Versioned {
                value: Bytes::from_static(b"\xff"),
                version: Some(version.clone()),
            })),
        };
        let json = result_json(0, read);
        assert_eq!(json["status"], 200);
        assert_eq!(json["version"], version.encode());
        assert!(json["value"].is_null());
        assert_eq!(json["value_base64"], "/w==");
        let missing = OpResult {
            status: StatusCode::NOT_FOUND,
            answer: Err(ApiError::KeyNotFound.problem()),
        };
        let json = result_json(0, missing);
        assert_eq!(json["problem"]["type"], "/problems/key-not-found");
        assert_eq!(json["problem"]["status"], 404);
        assert!(json.get("version").is_none());
    }

    #[tokio::test]
    async fn the_answer_has_the_results_in_the_ops_order_whatever_order_they_complete_in() {
        let (done, received) = mpsc::unbounded_channel();
        let value = "é\"\u{0}".repeat(40_000);
        let results = [
            (
                2,
                StatusCode::OK,
                Answer::Value(Versioned {
                    value: Bytes::from(value.clone()),
                    version: None,
                }),
            ),
            (
                0,
                StatusCode::CREATED,
                Answer::Written(StatusCode::CREATED, None),
            ),
            (1, StatusCode::NO_CONTENT, Answer::Deleted(None)),
        ];
        for (index, status, answer) in results {
            let result = OpResult {
                status,
                answer: Ok(answer),
            };
            done.send((index, result)).unwrap();
        }
        drop(done);
        let completed = Completed {
            received,
            task: tokio::spawn(async {}).abort_handle(),
            count: 3,
        };
        let pieces: Vec<Bytes> = answer(completed).map(Result::unwrap).collect().await;
        let body: Vec<u8> = pieces.concat();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"results": [
                {"status": 201, "version": null},
                {"status": 204, "version": null},
                {"status": 200, "version": null, "value": value,
                 "value_base64": BASE64.encode(&value)},
            ]})
        );
    }
}
