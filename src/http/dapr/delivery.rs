//! Pub/sub delivery to the app, as daprd delivers: the app's
//! subscriptions (declarative files, then `GET /dapr/subscribe` or
//! `ListTopicSubscriptions`), the broker's messages on them through the
//! [`Subscriber`] (a shared subscription per topic, the app id as its
//! group), each posted to the app's route (`POST /<path>`, a CloudEvent)
//! or passed to `OnTopicEvent`, and acknowledged to the broker only once
//! its outcome is final: the app answered SUCCESS or DROP (or 404, or
//! gRPC UNIMPLEMENTED), or the retries were spent and the event went to
//! the subscription's dead letter topic. What each answer means, the
//! event a message becomes and the retry delays are [`crate::dapr::pubsub`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use tokio::sync::mpsc;

use super::app_callback::{app_callback, on_bulk_topic_event};
use super::proto::runtime::v1::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType;
use super::proto::runtime::v1::subscribe_topic_events_response_alpha1::SubscribeTopicEventsResponseType;
use super::proto::runtime::v1::topic_event_bulk_request_entry::Event as BulkEntryEvent;
use super::proto::runtime::v1::topic_event_response::TopicEventResponseStatus;
use super::proto::runtime::v1::{
    SubscribeTopicEventsRequestAlpha1, SubscribeTopicEventsRequestInitialAlpha1,
    SubscribeTopicEventsResponseAlpha1, SubscribeTopicEventsResponseInitialAlpha1,
    TopicEventBulkRequest, TopicEventBulkRequestEntry, TopicEventCeRequest, TopicEventRequest,
};
use crate::dapr::app::AppChannel;
use crate::dapr::pubsub::{
    self, CLOUD_EVENT_CONTENT_TYPE, Event, Outcome, RetryPolicy, Rule, Subscription,
    SubscriptionKind, SubscriptionParts, SubscriptionTable,
};
use crate::dapr::{AppProtocol, pubsub::topic_matches};
use crate::metrics::Metrics;
use crate::mqtt::{BrokerSettings, Received, Subscriber, SubscriberSettings};

/// Unacknowledged events the broker may send the gateway at once (MQTT
/// receive maximum): the in-flight limit of delivery.
pub const DELIVERY_IN_FLIGHT: u16 = 64;
/// How long the broker keeps the subscriber's session while the gateway
/// is away (the AIO SDKs' default): events published meanwhile wait that
/// long.
pub const SESSION_EXPIRY: Duration = Duration::from_secs(3600);

/// What delivery needs besides the app.
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// The broker (the pool's).
    pub broker: BrokerSettings,
    /// The subscriber's client id (`<client id>-sub`).
    pub client_id: String,
    /// The app id: the shared subscriptions' group, and the scope
    /// declarative subscriptions are read for.
    pub app_id: String,
    /// The pub/sub component names (`--dapr-pubsub`): every one the broker.
    pub pubsubs: Vec<String>,
    /// Declarative subscriptions (`--dapr-subscriptions`).
    pub declarative: Option<PathBuf>,
    /// The largest gRPC message either way.
    pub max_message_bytes: usize,
    /// Retries of a failed delivery.
    pub retry: RetryPolicy,
}

/// Delivery's work on one gateway: shared by the per-event tasks.
#[derive(Debug)]
struct Deliverer {
    app: AppChannel,
    metrics: Metrics,
    settings: DeliverySettings,
    subscriptions: Vec<Subscription>,
    subscriber: Subscriber,
}

/// Waits for the app, reads its subscriptions, subscribes and delivers
/// until the task is aborted (shutdown): events in flight then stay
/// unacknowledged, and the broker sends them again to the next session.
pub async fn run(
    app: AppChannel,
    settings: DeliverySettings,
    table: Arc<SubscriptionTable>,
    metrics: Metrics,
) {
    app.wait_until_listening().await;
    let subscriptions = subscriptions(&app, &settings).await;
    table.set_delivered(subscriptions.clone());
    if subscriptions.is_empty() {
        tracing::info!("the app subscribes to no topic");
        return;
    }
    let mut filters: Vec<String> = Vec::new();
    for subscription in &subscriptions {
        let filter = format!("$share/{}/{}", settings.app_id, subscription.topic);
        if !filters.contains(&filter) {
            filters.push(filter);
        }
        tracing::info!(
            pubsub = %subscription.pubsub_name,
            topic = %subscription.topic,
            kind = subscription.kind.as_str(),
            dead_letter_topic = subscription.dead_letter_topic.as_deref().unwrap_or(""),
            "subscribed"
        );
    }
    let (subscriber, mut received) = Subscriber::start(SubscriberSettings {
        broker: settings.broker.clone(),
        client_id: settings.client_id.clone(),
        session_expiry: SESSION_EXPIRY,
        receive_maximum: DELIVERY_IN_FLIGHT,
        filters,
    });
    let deliverer = Arc::new(Deliverer {
        app,
        metrics,
        settings,
        subscriptions,
        subscriber,
    });
    // Aborting this task drops the set, which aborts every delivery, and
    // the last reference to the subscriber, which then disconnects.
    let mut tasks = tokio::task::JoinSet::new();
    // Bulk subscriptions: one batcher each, by index.
    let mut batchers: HashMap<usize, mpsc::UnboundedSender<Received>> = HashMap::new();
    while let Some(message) = received.recv().await {
        // Finished tasks are reaped as new ones come: the set holds at
        // most the broker's receive maximum per connection.
        while tasks.try_join_next().is_some() {}
        let bulk = deliverer
            .subscriptions
            .iter()
            .position(|subscription| topic_matches(&subscription.topic, &message.topic))
            .filter(|&at| deliverer.subscriptions[at].bulk.is_some());
        match bulk {
            None => {
                tasks.spawn(deliverer.clone().deliver(message));
            }
            Some(at) => {
                let batcher = batchers.entry(at).or_insert_with(|| {
                    let (batch, batched) = mpsc::unbounded_channel();
                    tasks.spawn(deliverer.clone().batch(at, batched));
                    batch
                });
                let _ = batcher.send(message);
            }
        }
    }
}

/// The declarative subscriptions, then the app's own; only those of the
/// broker's pub/sub names (the others are logged and left out), and one
/// per topic (the first, as daprd keeps the first).
async fn subscriptions(app: &AppChannel, settings: &DeliverySettings) -> Vec<Subscription> {
    let mut all = Vec::new();
    if let Some(path) = &settings.declarative {
        match pubsub::declarative_from_path(path, &settings.app_id) {
            Ok(found) => all.extend(found),
            Err(error) => tracing::error!(%error, "declarative subscriptions not read"),
        }
    }
    match programmatic(app, settings.max_message_bytes).await {
        Ok(found) => all.extend(found),
        Err(error) => tracing::error!(%error, "the app's subscriptions not read"),
    }
    let names = &settings.pubsubs;
    let mut kept: Vec<Subscription> = Vec::new();
    for subscription in all {
        if subscription.rules.is_empty() {
            tracing::warn!(topic = %subscription.topic, "a subscription without routes left out");
        } else if !names.contains(&subscription.pubsub_name) {
            tracing::warn!(pubsub = %subscription.pubsub_name, topic = %subscription.topic, "subscription to an unknown pub/sub left out");
        } else if kept.iter().any(|other| {
            other.pubsub_name == subscription.pubsub_name && other.topic == subscription.topic
        }) {
            tracing::warn!(topic = %subscription.topic, kind = subscription.kind.as_str(), "a second subscription to the same topic left out");
        } else {
            kept.push(subscription);
        }
    }
    kept
}

/// The app's programmatic subscriptions: `GET /dapr/subscribe` (a 404:
/// none) or `ListTopicSubscriptions` (UNIMPLEMENTED: none).
async fn programmatic(
    app: &AppChannel,
    max_message_bytes: usize,
) -> Result<Vec<Subscription>, String> {
    match app.protocol() {
        AppProtocol::Http => {
            let answer = app
                .get("dapr/subscribe")
                .await
                .map_err(|error| error.to_string())?;
            if answer.status == hyper::StatusCode::NOT_FOUND {
                return Ok(Vec::new());
            }
            if !answer.status.is_success() {
                return Err(format!("GET /dapr/subscribe answered {}", answer.status));
            }
            pubsub::programmatic(&answer.body).map_err(|error| error.to_string())
        }
        AppProtocol::Grpc => {
            let mut client = app_callback(app, max_message_bytes);
            let listed =
                match tokio::time::timeout(app.call_timeout(), client.list_topic_subscriptions(()))
                    .await
                {
                    Err(_) => return Err("ListTopicSubscriptions timed out".to_owned()),
                    Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                        return Ok(Vec::new());
                    }
                    Ok(Err(status)) => {
                        return Err(format!("ListTopicSubscriptions failed: {status}"));
                    }
                    Ok(Ok(listed)) => listed.into_inner(),
                };
            listed
                .subscriptions
                .into_iter()
                .map(|subscription| {
                    let routes = subscription.routes.unwrap_or_default();
                    SubscriptionParts {
                        pubsub_name: subscription.pubsub_name,
                        topic: subscription.topic,
                        metadata: subscription.metadata.into_iter().collect(),
                        rules: routes
                            .rules
                            .into_iter()
                            .map(|rule| (rule.r#match, rule.path))
                            .collect(),
                        default_path: routes.default,
                        dead_letter_topic: subscription.dead_letter_topic,
                        bulk: subscription.bulk_subscribe.map(|bulk| {
                            (
                                bulk.enabled,
                                i64::from(bulk.max_messages_count),
                                i64::from(bulk.max_await_duration_ms),
                            )
                        }),
                    }
                    .build(SubscriptionKind::Programmatic)
                    .map(|mut subscription| {
                        // As daprd: a gRPC subscription without routes
                        // gets a default route with an empty path.
                        if subscription.rules.is_empty() {
                            subscription.rules.push(Rule {
                                matcher: None,
                                path: String::new(),
                            });
                        }
                        subscription
                    })
                    .map_err(|error| error.to_string())
                })
                .collect()
        }
    }
}

impl Deliverer {
    /// Delivers one message until its outcome is final, then acknowledges it.
    async fn deliver(self: Arc<Self>, message: Received) {
        let Some(subscription) = self
            .subscriptions
            .iter()
            .find(|subscription| topic_matches(&subscription.topic, &message.topic))
        else {
            // A subscription of an earlier run, still in the session.
            tracing::debug!(topic = %message.topic, "message on a topic nobody subscribes to acknowledged");
            message.ack();
            return;
        };
        let event = pubsub::event_of(
            &message.payload,
            message.properties.content_type.as_deref(),
            &message.topic,
            &subscription.pubsub_name,
            subscription.raw_payload(),
            || format!("{:032x}", rand::random::<u128>()),
        );
        if event.has_expired(SystemTime::now()) {
            tracing::warn!(id = event.id(), topic = %message.topic, "expired event dropped");
            self.dropped(subscription, message).await;
            return;
        }
        let retry = self.settings.retry;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = match subscription.route(&event.cloud_event) {
                Ok(Some(path)) => self.call(subscription, &event, path).await,
                Ok(None) => {
                    tracing::debug!(id = event.id(), topic = %message.topic, "no route matches the event: dropped");
                    self.dropped(subscription, message).await;
                    return;
                }
                Err(error) => {
                    tracing::error!(id = event.id(), topic = %message.topic, %error, "routing rule failed");
                    Outcome::Retry
                }
            };
            match outcome {
                Outcome::Success => {
                    self.finish(message, "success");
                    return;
                }
                Outcome::Drop => {
                    tracing::warn!(id = event.id(), topic = %message.topic, "the app dropped the event");
                    self.dropped(subscription, message).await;
                    return;
                }
                Outcome::Retry if attempt >= retry.max_attempts => {
                    if let Some(topic) = &subscription.dead_letter_topic {
                        self.dead_letter(topic, message, attempt).await;
                        return;
                    }
                    if attempt == retry.max_attempts {
                        tracing::warn!(id = event.id(), topic = %message.topic, attempts = attempt, "the app keeps refusing an event and its subscription has no dead letter topic: trying again, without end");
                    }
                }
                Outcome::Retry => {}
            }
            if message.is_stale() {
                tracing::debug!(id = event.id(), topic = %message.topic, "retry left to the copy the broker sends again");
                return;
            }
            tokio::time::sleep(retry.delay(attempt)).await;
        }
    }

    /// Collects the messages of bulk subscription `at` into calls of at
    /// most its `maxMessagesCount` events, each waiting at most its
    /// `maxAwaitDurationMs` for more, and delivers each call on its own task.
    async fn batch(self: Arc<Self>, at: usize, mut batched: mpsc::UnboundedReceiver<Received>) {
        let Some(bulk) = self.subscriptions[at].bulk else {
            return;
        };
        let mut calls = tokio::task::JoinSet::new();
        while let Some(first) = batched.recv().await {
            while calls.try_join_next().is_some() {}
            let mut messages = vec![first];
            let deadline = tokio::time::Instant::now() + bulk.max_await;
            while messages.len() < bulk.max_messages {
                tokio::select! {
                    message = batched.recv() => match message {
                        Some(message) => messages.push(message),
                        None => break,
                    },
                    () = tokio::time::sleep_until(deadline) => break,
                }
            }
            calls.spawn(self.clone().deliver_bulk(at, messages));
        }
    }

    /// One bulk call per route, as daprd's (`POST /<path>` of the entries
    /// as JSON to an HTTP app, `OnBulkTopicEvent` to a gRPC app), the
    /// app's statuses read per entry (SUCCESS acknowledges, DROP drops,
    /// RETRY or no status retries the entry in the next call after the
    /// backoff; a failed call retries them all). Past the policy's calls, the remaining entries go to the
    /// dead letter topic, if any, else are tried again without end.
    async fn deliver_bulk(self: Arc<Self>, at: usize, messages: Vec<Received>) {
        let subscription = &self.subscriptions[at];
        let retry = self.settings.retry;
        // (entry id, message, event, path)
        let mut pending: Vec<(String, Received, Event, String)> = Vec::new();
        for message in messages {
            let event = pubsub::event_of(
                &message.payload,
                message.properties.content_type.as_deref(),
                &message.topic,
                &subscription.pubsub_name,
                subscription.raw_payload(),
                || format!("{:032x}", rand::random::<u128>()),
            );
            match subscription.route(&event.cloud_event) {
                Ok(Some(path)) if !event.has_expired(SystemTime::now()) => {
                    let path = path.to_owned();
                    pending.push((
                        format!("{:032x}", rand::random::<u128>()),
                        message,
                        event,
                        path,
                    ));
                }
                Ok(_) => self.dropped(subscription, message).await,
                Err(error) => {
                    tracing::error!(topic = %message.topic, %error, "routing rule failed");
                    self.dropped(subscription, message).await;
                }
            }
        }
        let mut attempt = 0;
        while !pending.is_empty() {
            attempt += 1;
            let mut paths: Vec<String> = pending.iter().map(|entry| entry.3.clone()).collect();
            paths.sort();
            paths.dedup();
            let mut outcomes: HashMap<String, Outcome> = HashMap::new();
            for path in paths {
                let entries: Vec<(String, &Event, Option<&bytes::Bytes>)> = pending
                    .iter()
                    .filter(|entry| entry.3 == path)
                    .map(|(id, message, event, _)| {
                        (
                            id.clone(),
                            event,
                            subscription.raw_payload().then_some(&message.payload),
                        )
                    })
                    .collect();
                let outcome = match self.app.protocol() {
                    AppProtocol::Http => self.call_bulk_http(subscription, &path, &entries).await,
                    AppProtocol::Grpc => self.call_bulk_grpc(subscription, &path, &entries).await,
                };
                // An entry without a status retries, as in daprd.
                for (id, ..) in &entries {
                    let known = match &outcome {
                        BulkOutcome::All(outcome) => Some(*outcome),
                        BulkOutcome::Each(each) => each.get(id).copied(),
                    };
                    outcomes.insert(id.clone(), known.unwrap_or(Outcome::Retry));
                }
            }
            let mut again = Vec::new();
            for (id, message, event, path) in pending {
                match outcomes.get(&id).copied().unwrap_or(Outcome::Retry) {
                    Outcome::Success => self.finish(message, "success"),
                    Outcome::Drop => self.dropped(subscription, message).await,
                    Outcome::Retry => again.push((id, message, event, path)),
                }
            }
            // Copies on a lost connection are sent again on the resumed
            // session: the retries are theirs.
            again.retain(|(_, message, ..)| !message.is_stale());
            pending = again;
            if pending.is_empty() {
                return;
            }
            if attempt >= retry.max_attempts
                && let Some(topic) = &subscription.dead_letter_topic
            {
                for (_, message, ..) in pending {
                    self.dead_letter(topic, message, attempt).await;
                }
                return;
            }
            tokio::time::sleep(retry.delay(attempt)).await;
        }
    }

    /// One HTTP bulk call: `POST /<path>` of the entries as daprd's JSON;
    /// a 2xx answer's `statuses` per entry, a 404 drops them all, any
    /// other answer retries them all.
    async fn call_bulk_http(
        &self,
        subscription: &Subscription,
        path: &str,
        entries: &[(String, &Event, Option<&bytes::Bytes>)],
    ) -> BulkOutcome {
        let body = pubsub::http_bulk_body(subscription, entries);
        let headers = pubsub_headers(subscription);
        match self.app.post(path, "application/json", headers, body).await {
            Ok(answer) if answer.status.is_success() => BulkOutcome::Each(
                pubsub::http_bulk_outcomes(&answer.body)
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
            ),
            Ok(answer) if answer.status == hyper::StatusCode::NOT_FOUND => {
                BulkOutcome::All(Outcome::Drop)
            }
            Ok(answer) => {
                tracing::warn!(
                    status = answer.status.as_u16(),
                    path,
                    "the app asks for the bulk events again"
                );
                BulkOutcome::All(Outcome::Retry)
            }
            Err(error) => {
                tracing::warn!(%error, "bulk events not delivered");
                BulkOutcome::All(Outcome::Retry)
            }
        }
    }

    /// One gRPC bulk call, as daprd's: `OnBulkTopicEvent`, else (not
    /// implemented) `OnBulkTopicEventAlpha1`; each entry's status
    /// (SUCCESS, RETRY, DROP; unknown ones retry). Neither implemented:
    /// all acknowledged with a warning, as daprd; any other error retries
    /// them all.
    async fn call_bulk_grpc(
        &self,
        subscription: &Subscription,
        path: &str,
        entries: &[(String, &Event, Option<&bytes::Bytes>)],
    ) -> BulkOutcome {
        let request = topic_event_bulk_request(subscription, path, entries);
        match on_bulk_topic_event(
            &self.app,
            self.settings.max_message_bytes,
            request,
            self.app.call_timeout(),
        )
        .await
        {
            Ok(answer) => BulkOutcome::Each(
                answer
                    .statuses
                    .into_iter()
                    .map(|entry| {
                        let outcome = match TopicEventResponseStatus::try_from(entry.status) {
                            Ok(TopicEventResponseStatus::Success) => Outcome::Success,
                            Ok(TopicEventResponseStatus::Drop) => Outcome::Drop,
                            Ok(TopicEventResponseStatus::Retry) | Err(_) => Outcome::Retry,
                        };
                        (entry.entry_id, outcome)
                    })
                    .collect(),
            ),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::warn!(%status, topic = %subscription.topic, "the app implements neither OnBulkTopicEvent nor OnBulkTopicEventAlpha1: bulk events acknowledged");
                BulkOutcome::All(Outcome::Success)
            }
            Err(status) => {
                tracing::warn!(%status, topic = %subscription.topic, "OnBulkTopicEvent failed");
                BulkOutcome::All(Outcome::Retry)
            }
        }
    }

    /// The outcome is final: acknowledged, and counted.
    fn finish(&self, message: Received, outcome: &str) {
        message.ack();
        self.metrics
            .pubsub_events
            .with_label_values(&[outcome])
            .inc();
    }

    /// The retries are spent: to the dead letter topic, acknowledged once
    /// the broker took it there (tried until it does).
    async fn dead_letter(&self, topic: &str, message: Received, attempts: u32) {
        let mut failures = 0;
        loop {
            match self.publish_dead_letter(topic, &message).await {
                Ok(()) => {
                    tracing::warn!(topic = %message.topic, dead_letter_topic = %topic, attempts, "event sent to the dead letter topic");
                    self.finish(message, "dead_letter");
                    return;
                }
                Err(_) if message.is_stale() => return,
                Err(error) => {
                    failures += 1;
                    tracing::warn!(dead_letter_topic = %topic, %error, "dead letter not sent; trying again");
                    tokio::time::sleep(self.settings.retry.delay(failures)).await;
                }
            }
        }
    }

    /// A dropped event (DROP, 404, no matching route, expired): to the
    /// dead letter topic, if any, once (as daprd, a failure to send it
    /// there does not keep the event), and acknowledged.
    async fn dropped(&self, subscription: &Subscription, message: Received) {
        if let Some(topic) = &subscription.dead_letter_topic
            && let Err(error) = self.publish_dead_letter(topic, &message).await
        {
            tracing::warn!(dead_letter_topic = %topic, %error, "dropped event not sent to the dead letter topic");
        }
        self.finish(message, "dropped");
    }

    /// The message published to the dead letter `topic`.
    async fn publish_dead_letter(&self, topic: &str, message: &Received) -> Result<(), String> {
        publish_dead_letter(&self.subscriber, topic, message, self.app.call_timeout()).await
    }

    /// One call to the app with the event, and what its answer means.
    async fn call(&self, subscription: &Subscription, event: &Event, path: &str) -> Outcome {
        match self.app.protocol() {
            AppProtocol::Http => {
                let mut headers = pubsub_headers(subscription);
                for name in ["traceparent", "tracestate"] {
                    if let Some(value) = event
                        .cloud_event
                        .get(name)
                        .and_then(|value| value.as_str())
                        .and_then(|value| HeaderValue::from_str(value).ok())
                    {
                        headers.insert(HeaderName::from_static(name), value);
                    }
                }
                match self
                    .app
                    .post(path, CLOUD_EVENT_CONTENT_TYPE, headers, event.body.clone())
                    .await
                {
                    Ok(answer) => {
                        let outcome = pubsub::http_outcome(answer.status.as_u16(), &answer.body);
                        if outcome == Outcome::Retry {
                            tracing::warn!(
                                id = event.id(),
                                status = answer.status.as_u16(),
                                path,
                                "the app asks for the event again"
                            );
                        }
                        outcome
                    }
                    Err(error) => {
                        tracing::warn!(id = event.id(), %error, "event not delivered");
                        Outcome::Retry
                    }
                }
            }
            AppProtocol::Grpc => {
                let mut client = app_callback(&self.app, self.settings.max_message_bytes);
                let request = topic_event_request(subscription, event, path);
                match tokio::time::timeout(self.app.call_timeout(), client.on_topic_event(request))
                    .await
                {
                    Err(_) => {
                        tracing::warn!(id = event.id(), "OnTopicEvent timed out");
                        Outcome::Retry
                    }
                    Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                        // daprd acknowledges it, with a warning.
                        tracing::warn!(id = event.id(), %status, "the app does not implement OnTopicEvent: event acknowledged");
                        Outcome::Success
                    }
                    Ok(Err(status)) => {
                        tracing::warn!(id = event.id(), %status, "OnTopicEvent failed");
                        Outcome::Retry
                    }
                    Ok(Ok(answer)) => {
                        match TopicEventResponseStatus::try_from(answer.into_inner().status) {
                            Ok(TopicEventResponseStatus::Success) => Outcome::Success,
                            Ok(TopicEventResponseStatus::Drop) => Outcome::Drop,
                            Ok(TopicEventResponseStatus::Retry) | Err(_) => Outcome::Retry,
                        }
                    }
                }
            }
        }
    }
}

/// Why a streaming subscription cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// Its routing, metadata or names do not make a subscription.
    #[error(transparent)]
    Subscription(#[from] pubsub::SubscriptionError),
}

/// A streaming subscription (`SubscribeTopicEventsAlpha1`): its own MQTT
/// connection (`<client id>-stream-<random>`, a session that ends with
/// it: what it had not acknowledged goes to another member of the group),
/// subscribed `$share/<app id>/<topic>`; each event is sent on the stream,
/// and acknowledged to the broker once the app answered SUCCESS or DROP
/// (DROP: to the dead letter topic first, if any) for its id. RETRY sends
/// it again after Dapr's backoff; past the policy's calls, to the dead
/// letter topic if any, else again without end. The subscription is
/// listed in metadata while the stream lasts.
pub fn stream(
    state: &crate::http::state::AppState,
    initial: SubscribeTopicEventsRequestInitialAlpha1,
    mut requests: tonic::Streaming<SubscribeTopicEventsRequestAlpha1>,
) -> Result<
    impl futures_util::Stream<Item = Result<SubscribeTopicEventsResponseAlpha1, tonic::Status>>
    + Send
    + 'static,
    StreamError,
> {
    let subscription = SubscriptionParts {
        pubsub_name: initial.pubsub_name,
        topic: initial.topic,
        metadata: initial.metadata.into_iter().collect(),
        dead_letter_topic: initial.dead_letter_topic.unwrap_or_default(),
        ..SubscriptionParts::default()
    }
    .build(SubscriptionKind::Streaming)?;
    let pool = state.store.pool();
    let app_id = state.dapr.settings().app_id.clone();
    let (subscriber, mut received) = Subscriber::start(SubscriberSettings {
        broker: pool.broker().clone(),
        client_id: format!("{}-stream-{:08x}", pool.client_id(), rand::random::<u32>()),
        session_expiry: Duration::ZERO,
        receive_maximum: DELIVERY_IN_FLIGHT,
        filters: vec![format!("$share/{app_id}/{}", subscription.topic)],
    });
    let table = state.subscriptions.clone();
    table.add(subscription.clone());
    let metrics = state.metrics.clone();
    let (events, stream) = mpsc::channel(usize::from(DELIVERY_IN_FLIGHT));
    tokio::spawn(async move {
        let retry = RetryPolicy::default();
        let listed = subscription.clone();
        // Events sent and not yet answered, by id: the message, the event
        // and its calls so far.
        let mut pending: HashMap<String, (Received, TopicEventRequest, u32)> = HashMap::new();
        let (again, mut retries) = mpsc::unbounded_channel::<String>();
        let initial = SubscribeTopicEventsResponseAlpha1 {
            subscribe_topic_events_response_type: Some(
                SubscribeTopicEventsResponseType::InitialResponse(
                    SubscribeTopicEventsResponseInitialAlpha1 {},
                ),
            ),
        };
        let as_response = |request: TopicEventRequest| SubscribeTopicEventsResponseAlpha1 {
            subscribe_topic_events_response_type: Some(
                SubscribeTopicEventsResponseType::EventMessage(request),
            ),
        };
        if events.send(Ok(initial)).await.is_ok() {
            loop {
                tokio::select! {
                    message = received.recv() => {
                        let Some(message) = message else { break };
                        let event = pubsub::event_of(
                            &message.payload,
                            message.properties.content_type.as_deref(),
                            &message.topic,
                            &subscription.pubsub_name,
                            subscription.raw_payload(),
                            || format!("{:032x}", rand::random::<u128>()),
                        );
                        let request = topic_event_request(&subscription, &event, "");
                        if events.send(Ok(as_response(request.clone()))).await.is_err() {
                            break;
                        }
                        pending.insert(request.id.clone(), (message, request, 1));
                    }
                    Some(id) = retries.recv() => {
                        if let Some((_, request, _)) = pending.get(&id)
                            && events.send(Ok(as_response(request.clone()))).await.is_err()
                        {
                            break;
                        }
                    }
                    answer = requests.message() => {
                        let Ok(Some(answer)) = answer else { break };
                        let Some(SubscribeTopicEventsRequestType::EventProcessed(processed)) =
                            answer.subscribe_topic_events_request_type
                        else {
                            continue;
                        };
                        let status = processed
                            .status
                            .map_or(TopicEventResponseStatus::Success, |status| status.status());
                        let Some((message, request, calls)) = pending.remove(&processed.id) else {
                            continue;
                        };
                        match status {
                            TopicEventResponseStatus::Success => {
                                message.ack();
                                metrics.pubsub_events.with_label_values(&["success"]).inc();
                            }
                            TopicEventResponseStatus::Drop => {
                                if let Some(topic) = &subscription.dead_letter_topic {
                                    let _ = publish_dead_letter(&subscriber, topic, &message, retry.max_interval).await;
                                }
                                message.ack();
                                metrics.pubsub_events.with_label_values(&["dropped"]).inc();
                            }
                            TopicEventResponseStatus::Retry => {
                                if calls >= retry.max_attempts
                                    && let Some(topic) = &subscription.dead_letter_topic
                                    && publish_dead_letter(&subscriber, topic, &message, retry.max_interval).await.is_ok()
                                {
                                    message.ack();
                                    metrics.pubsub_events.with_label_values(&["dead_letter"]).inc();
                                    continue;
                                }
                                let id = request.id.clone();
                                pending.insert(id.clone(), (message, request, calls + 1));
                                let again = again.clone();
                                let delay = retry.delay(calls);
                                tokio::spawn(async move {
                                    tokio::time::sleep(delay).await;
                                    let _ = again.send(id);
                                });
                            }
                        }
                    }
                }
            }
        }
        // Unacknowledged events go back to the broker with the session.
        table.remove(&listed);
        subscriber.shutdown().await;
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(stream))
}

/// The gRPC shape of an event (`OnTopicEvent`, streaming).
fn topic_event_request(
    subscription: &Subscription,
    event: &Event,
    path: &str,
) -> TopicEventRequest {
    let TopicEventCeRequest {
        id,
        source,
        r#type,
        spec_version,
        data_content_type,
        data,
    } = cloud_event_request(event);
    TopicEventRequest {
        id,
        source,
        r#type,
        spec_version,
        data_content_type,
        data,
        topic: subscription.topic.clone(),
        pubsub_name: subscription.pubsub_name.clone(),
        path: path.to_owned(),
    }
}

/// The headers of every call to an HTTP app with events: daprd names the
/// pub/sub in `pubsubname`.
fn pubsub_headers(subscription: &Subscription) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_str(&subscription.pubsub_name) {
        headers.insert(HeaderName::from_static("pubsubname"), value);
    }
    headers
}

/// The event's CloudEvent attributes and data as gRPC carries them.
fn cloud_event_request(event: &Event) -> TopicEventCeRequest {
    TopicEventCeRequest {
        id: event.id().to_owned(),
        source: event.text("source").to_owned(),
        r#type: event.text("type").to_owned(),
        spec_version: event.text("specversion").to_owned(),
        data_content_type: event.text("datacontenttype").to_owned(),
        data: event.data_bytes(),
    }
}

/// What a bulk call's answer means for its entries.
enum BulkOutcome {
    /// The same for every entry.
    All(Outcome),
    /// Per entry id; an entry not named retries.
    Each(HashMap<String, Outcome>),
}

/// The gRPC shape of a bulk call (`OnBulkTopicEvent`), as daprd's: each
/// entry its CloudEvent (as `OnTopicEvent` gets it), or for `rawPayload`
/// the bytes as they arrived.
fn topic_event_bulk_request(
    subscription: &Subscription,
    path: &str,
    entries: &[(String, &Event, Option<&bytes::Bytes>)],
) -> TopicEventBulkRequest {
    TopicEventBulkRequest {
        id: format!("{:032x}", rand::random::<u128>()),
        entries: entries
            .iter()
            .map(|(entry_id, event, raw)| match raw {
                Some(raw) => TopicEventBulkRequestEntry {
                    entry_id: entry_id.clone(),
                    event: Some(BulkEntryEvent::Bytes((*raw).clone())),
                    content_type: "application/octet-stream".to_owned(),
                    metadata: HashMap::new(),
                },
                None => TopicEventBulkRequestEntry {
                    entry_id: entry_id.clone(),
                    event: Some(BulkEntryEvent::CloudEvent(cloud_event_request(event))),
                    content_type: CLOUD_EVENT_CONTENT_TYPE.to_owned(),
                    metadata: HashMap::new(),
                },
            })
            .collect(),
        metadata: HashMap::from([(
            pubsub::BULK_METADATA_PUBSUB.to_owned(),
            subscription.pubsub_name.clone(),
        )]),
        topic: subscription.topic.clone(),
        pubsub_name: subscription.pubsub_name.clone(),
        r#type: pubsub::DEFAULT_BULK_EVENT_TYPE.to_owned(),
        path: path.to_owned(),
    }
}

/// The message as it arrived (payload, content type, user properties),
/// published to `topic` through `subscriber`, within `within`.
async fn publish_dead_letter(
    subscriber: &Subscriber,
    topic: &str,
    message: &Received,
    within: Duration,
) -> Result<(), String> {
    let properties = PublishProperties {
        content_type: message.properties.content_type.clone(),
        user_properties: message.properties.user_properties.clone(),
        ..PublishProperties::default()
    };
    tokio::time::timeout(
        within,
        subscriber.publish(topic, message.payload.clone(), properties),
    )
    .await
    .map_err(|_| "no PUBACK in time".to_owned())?
    .map_err(|error| error.to_string())
}
