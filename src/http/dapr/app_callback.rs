//! Dapr's `AppCallback` gRPC client on the app channel: how the gateway
//! calls a gRPC app (`--dapr-app-protocol grpc`): bulk pub/sub calls with
//! daprd's fallback to the alpha service, and configuration changes
//! through `OnInvoke`. The client is generated beside the server
//! (`proto`); the channel is [`crate::dapr::app`]'s.

use std::time::Duration;

use crate::dapr::app::{AppChannel, GrpcChannel};
use crate::dapr::configuration::Subscription;

use super::proto::common::v1::{HttpExtension, InvokeRequest, http_extension::Verb};
use super::proto::runtime::v1::{TopicEventBulkRequest, TopicEventBulkResponse};

pub use super::proto::runtime::v1::app_callback_alpha_client::AppCallbackAlphaClient;
pub use super::proto::runtime::v1::app_callback_client::AppCallbackClient;

/// `AppCallback` on `channel`, taking answers up to `max_message_bytes`
/// (daprd's `--max-body-size`); each call's time is the caller's to bound
/// ([`AppChannel::call_timeout`]).
pub fn app_callback(
    channel: &AppChannel,
    max_message_bytes: usize,
) -> AppCallbackClient<GrpcChannel> {
    AppCallbackClient::with_origin(channel.grpc(), channel.origin())
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
}

/// `AppCallbackAlpha` (`OnBulkTopicEventAlpha1`) on `channel`.
pub fn app_callback_alpha(
    channel: &AppChannel,
    max_message_bytes: usize,
) -> AppCallbackAlphaClient<GrpcChannel> {
    AppCallbackAlphaClient::with_origin(channel.grpc(), channel.origin())
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
}

/// A bulk call as daprd makes it: `AppCallback::OnBulkTopicEvent`, and
/// when the app does not implement it (UNIMPLEMENTED),
/// `AppCallbackAlpha::OnBulkTopicEventAlpha1`, each call bounded by
/// `timeout` (DEADLINE_EXCEEDED past it). UNIMPLEMENTED from both comes
/// back as UNIMPLEMENTED: the caller decides what that means.
pub async fn on_bulk_topic_event(
    channel: &AppChannel,
    max_message_bytes: usize,
    request: TopicEventBulkRequest,
    timeout: Duration,
) -> Result<TopicEventBulkResponse, tonic::Status> {
    let timed_out = || tonic::Status::deadline_exceeded(format!("no answer within {timeout:?}"));
    let stable = tokio::time::timeout(
        timeout,
        app_callback(channel, max_message_bytes).on_bulk_topic_event(request.clone()),
    )
    .await
    .map_err(|_| timed_out())?;
    match stable {
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            tracing::debug!(%status, "OnBulkTopicEvent not implemented: trying OnBulkTopicEventAlpha1");
            tokio::time::timeout(
                timeout,
                app_callback_alpha(channel, max_message_bytes).on_bulk_topic_event_alpha1(request),
            )
            .await
            .map_err(|_| timed_out())?
            .map(tonic::Response::into_inner)
        }
        other => other.map(tonic::Response::into_inner),
    }
}

/// Delivers a configuration subscription's changes to a gRPC app as
/// daprd does through its gRPC app channel: for each changed item,
/// `OnInvoke` of the method `/configuration/{store}/{key}` with the HTTP
/// subscription's JSON (`{"id", "items"}`) as its data, `application/json`,
/// verb POST; a call that fails is logged, not retried (daprd's without a
/// resiliency policy). Until unsubscribed or the gateway shuts down.
pub async fn deliver_configuration(
    mut subscription: Subscription,
    channel: AppChannel,
    store: String,
    max_message_bytes: usize,
) {
    let mut client = app_callback(&channel, max_message_bytes);
    while let Some(items) = subscription.next().await {
        let body = subscription.update_body(&items);
        for name in items.keys() {
            let method = format!("/configuration/{store}/{name}");
            let request = InvokeRequest {
                method: method.clone(),
                data: Some(prost_types::Any {
                    type_url: String::new(),
                    value: body.to_vec(),
                }),
                content_type: "application/json".to_owned(),
                http_extension: Some(HttpExtension {
                    verb: Verb::Post.into(),
                    querystring: String::new(),
                }),
            };
            match tokio::time::timeout(channel.call_timeout(), client.on_invoke(request)).await {
                Ok(Ok(_)) => {}
                Ok(Err(status)) => tracing::warn!(
                    subscription = %subscription.id,
                    %method,
                    %status,
                    "the app refused a configuration update"
                ),
                Err(_) => tracing::warn!(
                    subscription = %subscription.id,
                    %method,
                    "a configuration update got no answer in time"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::runtime::v1::app_callback_alpha_server::{
        AppCallbackAlpha, AppCallbackAlphaServer,
    };
    use super::super::proto::runtime::v1::app_callback_server::{AppCallback, AppCallbackServer};
    use super::super::proto::runtime::v1::{
        ListTopicSubscriptionsResponse, TopicEventBulkRequestEntry, TopicEventBulkResponseEntry,
        TopicEventRequest, TopicEventResponse, TopicSubscription,
        topic_event_response::TopicEventResponseStatus,
    };
    use super::*;
    use crate::dapr::{AppProtocol, AppSettings};

    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;
    use tonic::{Request, Response, Status};

    /// A gRPC app: one subscription, and every event dropped when its
    /// type is `drop`.
    struct App;

    #[tonic::async_trait]
    impl AppCallback for App {
        async fn list_topic_subscriptions(
            &self,
            _: Request<()>,
        ) -> Result<Response<ListTopicSubscriptionsResponse>, Status> {
            Ok(Response::new(ListTopicSubscriptionsResponse {
                subscriptions: vec![TopicSubscription {
                    pubsub_name: "pubsub".into(),
                    topic: "orders".into(),
                    ..TopicSubscription::default()
                }],
            }))
        }

        async fn on_topic_event(
            &self,
            request: Request<TopicEventRequest>,
        ) -> Result<Response<TopicEventResponse>, Status> {
            let status = if request.get_ref().r#type == "drop" {
                TopicEventResponseStatus::Drop
            } else {
                TopicEventResponseStatus::Success
            };
            Ok(Response::new(TopicEventResponse {
                status: status.into(),
            }))
        }

        async fn on_bulk_topic_event(
            &self,
            _: Request<TopicEventBulkRequest>,
        ) -> Result<Response<TopicEventBulkResponse>, Status> {
            Err(Status::unimplemented("no bulk"))
        }
    }

    /// Only the alpha bulk call: each entry's status is named by its id.
    struct Alpha;

    #[tonic::async_trait]
    impl AppCallbackAlpha for Alpha {
        async fn on_bulk_topic_event_alpha1(
            &self,
            request: Request<TopicEventBulkRequest>,
        ) -> Result<Response<TopicEventBulkResponse>, Status> {
            let statuses = request
                .into_inner()
                .entries
                .into_iter()
                .map(|entry| TopicEventBulkResponseEntry {
                    status: if entry.entry_id == "drop" {
                        TopicEventResponseStatus::Drop
                    } else {
                        TopicEventResponseStatus::Success
                    }
                    .into(),
                    entry_id: entry.entry_id,
                })
                .collect();
            Ok(Response::new(TopicEventBulkResponse { statuses }))
        }
    }

    /// Serves `App` (and `Alpha` when `alpha`) over h2c on a free port.
    async fn serve_app(alpha: bool) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut router = axum::Router::new().route_service(
            "/dapr.proto.runtime.v1.AppCallback/{*method}",
            AppCallbackServer::new(App),
        );
        if alpha {
            router = router.route_service(
                "/dapr.proto.runtime.v1.AppCallbackAlpha/{*method}",
                AppCallbackAlphaServer::new(Alpha),
            );
        }
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let service = TowerToHyperService::new(router.clone());
                tokio::spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .http2_only()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_grpc_app_is_called_over_the_app_channel() {
        let port = serve_app(false).await;
        let channel = AppChannel::new(AppSettings::new(port, AppProtocol::Grpc), 1 << 20);
        let mut app = app_callback(&channel, 1 << 20);
        let listed = tokio::time::timeout(Duration::from_secs(5), app.list_topic_subscriptions(()))
            .await
            .unwrap()
            .unwrap()
            .into_inner();
        assert_eq!(listed.subscriptions.len(), 1);
        assert_eq!(listed.subscriptions[0].topic, "orders");
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            app.on_topic_event(TopicEventRequest {
                r#type: "drop".into(),
                ..TopicEventRequest::default()
            }),
        )
        .await
        .unwrap()
        .unwrap()
        .into_inner();
        assert_eq!(answer.status(), TopicEventResponseStatus::Drop);
    }

    fn bulk_request(ids: &[&str]) -> TopicEventBulkRequest {
        TopicEventBulkRequest {
            entries: ids
                .iter()
                .map(|id| TopicEventBulkRequestEntry {
                    entry_id: (*id).to_owned(),
                    ..TopicEventBulkRequestEntry::default()
                })
                .collect(),
            ..TopicEventBulkRequest::default()
        }
    }

    #[tokio::test]
    async fn a_bulk_call_falls_back_to_the_alpha_service_as_daprd_does() {
        let port = serve_app(true).await;
        let channel = AppChannel::new(AppSettings::new(port, AppProtocol::Grpc), 1 << 20);
        let answer = on_bulk_topic_event(
            &channel,
            1 << 20,
            bulk_request(&["keep", "drop"]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let statuses: Vec<(String, TopicEventResponseStatus)> = answer
            .statuses
            .iter()
            .map(|entry| (entry.entry_id.clone(), entry.status()))
            .collect();
        assert_eq!(
            statuses,
            [
                ("keep".to_owned(), TopicEventResponseStatus::Success),
                ("drop".to_owned(), TopicEventResponseStatus::Drop)
            ]
        );
    }

    #[tokio::test]
    async fn a_bulk_call_neither_service_implements_is_unimplemented() {
        let port = serve_app(false).await;
        let channel = AppChannel::new(AppSettings::new(port, AppProtocol::Grpc), 1 << 20);
        let status = on_bulk_topic_event(
            &channel,
            1 << 20,
            bulk_request(&["one"]),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{status}");
    }
}
