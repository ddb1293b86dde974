//! `GET /subscribe?topic=orders/+&topic=telemetry/#`: the messages on MQTT
//! topics as Server-Sent Events, for dashboards and `curl -N`, from the
//! [`TopicHub`](crate::watch::TopicHub) (one broker subscription per
//! filter, however many streams). Each filter must be granted by the
//! caller's rules (`brokerResources`, method `Subscribe`).
//!
//! The first event, `subscribed`, names the filters followed (`{"topics":
//! [...]}`); the broker's subscription of a filter nobody followed before
//! is made as the stream opens, so a message published at the same moment
//! may miss it. Each message is then an event `message` whose data is
//! JSON: `topic`,
//! `payload` (UTF-8 text as it is, else base64), `encoding` (`utf-8` or
//! `base64`) and `contentType` (the MQTT5 property, or null). A stream that
//! fell behind gets an event `lagged` with the number of messages it
//! missed, then goes on.

use std::convert::Infallible;

use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::stream::{self, StreamExt as _};

use super::extract::{Query, form_decode};
use super::keys::method_not_allowed;
use super::watch::ACCESS_TOKEN_PARAMETER;
use crate::access::rules::{Access, TopicNeed};
use crate::http::problem::ApiError;
use crate::http::state::AppState;
use crate::http::transport::stream_request::SUBSCRIBE_PATH;
use crate::mqtt::{TopicMessage, is_topic_filter};
use crate::watch::{Followed, TopicFollow};

/// The route's path (the stream transport knows its requests by it).
pub const PATH: &str = SUBSCRIBE_PATH;

/// Topic filters one stream may follow.
pub const MAX_TOPICS_PER_STREAM: usize = 64;

/// The route.
pub fn routes() -> Router<AppState> {
    Router::new().route(PATH, get(subscribe).fallback(method_not_allowed))
}

/// The `topic` parameters: at least one, each a valid MQTT filter (`+` is
/// the wildcard, not a space), at most [`MAX_TOPICS_PER_STREAM`]; no other
/// parameter but the API token (`access_token`, read by the HTTP guard).
fn topic_filters(query: &Query) -> Result<Vec<String>, ApiError> {
    let mut filters = Vec::new();
    for (name, value) in query.pairs() {
        if name == ACCESS_TOKEN_PARAMETER {
            continue;
        }
        if name != "topic" {
            return Err(ApiError::BadQuery(format!(
                "unknown query parameter {name:?}: /subscribe takes topic"
            )));
        }
        let filter = String::from_utf8(form_decode(value.as_bytes(), false))
            .map_err(|_| ApiError::BadQuery("a topic is not UTF-8".into()))?;
        if !is_topic_filter(&filter) {
            return Err(ApiError::BadQuery(format!(
                "{filter:?} is not an MQTT topic filter: not empty, '+' and '#' a whole level each, '#' last"
            )));
        }
        filters.push(filter);
    }
    if filters.is_empty() {
        return Err(ApiError::BadQuery(
            "name at least one topic: /subscribe?topic=orders/#".into(),
        ));
    }
    if filters.len() > MAX_TOPICS_PER_STREAM {
        return Err(ApiError::BadQuery(format!(
            "at most {MAX_TOPICS_PER_STREAM} topics per stream"
        )));
    }
    Ok(filters)
}

/// `GET /subscribe?topic=...`.
async fn subscribe(
    State(state): State<AppState>,
    query: Query,
    access: Access,
) -> Result<Response, ApiError> {
    let filters = topic_filters(&query)?;
    for filter in &filters {
        access.require_topic(filter, TopicNeed::Subscribe)?;
    }
    let subscribed = Event::default()
        .event("subscribed")
        .data(serde_json::json!({ "topics": filters }).to_string());
    let follow = state.topics.follow(filters);
    let events = stream::unfold(follow, |mut follow: TopicFollow| async move {
        let event = match follow.next().await {
            Followed::Message(message) => message_event(&message),
            Followed::Lagged(skipped) => Event::default()
                .event("lagged")
                .data(format!("{{\"skipped\":{skipped}}}")),
            Followed::Closed => return None,
        };
        Some((Ok::<_, Infallible>(event), follow))
    });
    let events = stream::once(async { Ok(subscribed) }).chain(events);
    let keep_alive = KeepAlive::new().interval(state.hub.settings().keep_alive);
    Ok(Sse::new(events).keep_alive(keep_alive).into_response())
}

/// A message as its SSE event; its JSON is rendered by the first stream
/// that sends it, so a fan-out serialises a message once.
fn message_event(message: &TopicMessage) -> Event {
    let data = message.rendered.get_or_init(|| {
        let (payload, encoding) = match std::str::from_utf8(&message.payload) {
            Ok(text) => (text.to_owned(), "utf-8"),
            Err(_) => (BASE64.encode(&message.payload), "base64"),
        };
        serde_json::json!({
            "topic": message.topic,
            "payload": payload,
            "encoding": encoding,
            "contentType": message.content_type,
        })
        .to_string()
    });
    Event::default().event("message").data(data)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn binary_payloads_are_base64_and_text_as_it_is() {
        let text = TopicMessage::new(
            "a".into(),
            Bytes::from_static(b"{\"n\":1}"),
            Some("application/json".into()),
        );
        let binary = TopicMessage::new("a".into(), Bytes::from_static(&[0xff, 0]), None);
        // Event's text form is private: compare through Debug.
        assert!(format!("{:?}", message_event(&text)).contains("utf-8"));
        assert!(format!("{:?}", message_event(&binary)).contains("/wA="));
    }

    #[test]
    fn a_message_is_rendered_once_for_every_stream_that_sends_it() {
        let message = TopicMessage::new("t".into(), Bytes::from_static(b"hi"), None);
        assert!(message.rendered.get().is_none());
        let first = format!("{:?}", message_event(&message));
        let rendered = message
            .rendered
            .get()
            .expect("rendered by the first stream");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(rendered).unwrap(),
            serde_json::json!({"topic": "t", "payload": "hi", "encoding": "utf-8", "contentType": null})
        );
        assert_eq!(format!("{:?}", message_event(&message)), first);
    }
}
