//! Dapr's `AppCallback` gRPC client on the app channel: how the gateway
//! calls a gRPC app (`--dapr-app-protocol grpc`). The client is generated
//! beside the server (`proto`); the channel is [`crate::dapr::app`]'s.

use crate::dapr::app::{AppChannel, GrpcChannel};

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

#[cfg(test)]
mod tests {
    use super::super::proto::runtime::v1::app_callback_server::{AppCallback, AppCallbackServer};
    use super::super::proto::runtime::v1::{
        ListTopicSubscriptionsResponse, TopicEventBulkRequest, TopicEventBulkResponse,
        TopicEventRequest, TopicEventResponse, TopicSubscription,
        topic_event_response::TopicEventResponseStatus,
    };
    use super::*;
    use crate::dapr::{AppProtocol, AppSettings};

    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;
    use std::time::Duration;
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

    /// Serves `App` over h2c on a free port.
    async fn serve_app() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let service = TowerToHyperService::new(AppCallbackServer::new(App));
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
        let port = serve_app().await;
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
}
