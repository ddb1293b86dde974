//! Dapr's gRPC API called over one HTTP/2 connection with prior
//! knowledge, as the SDKs call it, with messages built by hand when a test
//! needs one no SDK would send (millions of empty items).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use prost::Message as _;

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The service's path prefix.
const SERVICE: &str = "/dapr.proto.runtime.v1.Dapr/";

/// `dapr.proto.common.v1.StateItem`, the fields the tests set.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StateItem {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `SaveStateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SaveStateRequest {
    #[prost(string, tag = "1")]
    pub store_name: String,
    #[prost(message, repeated, tag = "2")]
    pub states: Vec<StateItem>,
}

/// `GetStateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetStateRequest {
    #[prost(string, tag = "1")]
    pub store_name: String,
    #[prost(string, tag = "2")]
    pub key: String,
}

/// `GetStateResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetStateResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    #[prost(string, tag = "2")]
    pub etag: String,
}

/// `GetBulkStateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetBulkStateRequest {
    #[prost(string, tag = "1")]
    pub store_name: String,
    #[prost(string, repeated, tag = "2")]
    pub keys: Vec<String>,
    #[prost(int32, tag = "3")]
    pub parallelism: i32,
}

/// `BulkStateItem`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BulkStateItem {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
    #[prost(string, tag = "3")]
    pub etag: String,
    #[prost(string, tag = "4")]
    pub error: String,
}

/// `GetBulkStateResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetBulkStateResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<BulkStateItem>,
}

/// What a call came to.
#[derive(Debug)]
pub struct Answer {
    /// `grpc-status` (from the trailers, or the headers of a
    /// trailers-only answer).
    pub code: i32,
    /// `grpc-message`, percent-encoded as sent.
    pub message: String,
    /// The answer's message, without its 5-byte prefix (empty if none).
    pub body: Bytes,
    /// The status's details (`grpc-status-details-bin`), decoded.
    pub details: Vec<tonic_types::ErrorDetail>,
}

impl Answer {
    /// Panics unless the call came to `code`; the answer.
    #[track_caller]
    pub fn expect(self, code: i32) -> Self {
        assert_eq!(self.code, code, "grpc-message: {}", self.message);
        self
    }

    /// The answer's message decoded as `M`.
    pub fn decode<M: prost::Message + Default>(&self) -> M {
        M::decode(self.body.clone()).expect("a well-formed answer")
    }
}

/// Status codes the tests name.
pub mod code {
    pub const OK: i32 = 0;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const UNIMPLEMENTED: i32 = 12;
}

/// One HTTP/2 connection to a gateway's API port.
#[derive(Debug)]
pub struct GrpcClient {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    /// Sent as `dapr-api-token`, as the SDKs send it.
    token: Option<String>,
}

/// `message` with gRPC's length prefix (uncompressed).
pub fn frame(message: &[u8]) -> Bytes {
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(message);
    Bytes::from(framed)
}

impl GrpcClient {
    /// [`GrpcClient::connect`], sending the API token with every call.
    pub async fn connect_with_token(addr: SocketAddr, token: &str) -> Self {
        let mut client = Self::connect(addr).await;
        client.token = Some(token.to_owned());
        client
    }

    /// Connects to `addr` (h2c with prior knowledge).
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream = tokio::time::timeout(CALL_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .expect("connecting in time")
            .expect("connecting");
        stream.set_nodelay(true).unwrap();
        let (sender, connection) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                // Room for answers of many megabytes without waiting on the window.
                .initial_stream_window_size(16 << 20)
                .initial_connection_window_size(16 << 20)
                .handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(connection);
        Self {
            sender,
            token: None,
        }
    }

    /// Calls `method` with `message` (unframed).
    pub async fn call(&mut self, method: &str, message: &[u8]) -> Answer {
        self.call_framed(method, frame(message)).await
    }

    /// Calls `method` with `body` as sent: a framed message, or anything.
    pub async fn call_framed(&mut self, method: &str, body: Bytes) -> Answer {
        let mut request = hyper::Request::post(format!("{SERVICE}{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(token) = &self.token {
            request = request.header("dapr-api-token", token);
        }
        let request = request.body(Full::new(body)).unwrap();
        let exchange = async {
            self.sender.ready().await.unwrap();
            let response = self.sender.send_request(request).await.unwrap();
            let headers = response.headers().clone();
            let collected = response.into_body().collect().await.unwrap();
            let trailers = collected.trailers().cloned().unwrap_or_default();
            let field = |name: &str| {
                trailers
                    .get(name)
                    .or_else(|| headers.get(name))
                    .map(|value| value.to_str().unwrap().to_owned())
            };
            let code = field("grpc-status")
                .expect("a grpc-status")
                .parse()
                .unwrap();
            let message = field("grpc-message").unwrap_or_default();
            let status_fields = if trailers.contains_key("grpc-status") {
                &trailers
            } else {
                &headers
            };
            let details = tonic::Status::from_header_map(status_fields)
                .map(|status| {
                    use tonic_types::StatusExt as _;
                    status.get_error_details_vec()
                })
                .unwrap_or_default();
            let body = collected.to_bytes();
            let body = if body.len() >= 5 {
                body.slice(5..)
            } else {
                Bytes::new()
            };
            Answer {
                code,
                message,
                body,
                details,
            }
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| panic!("{method} answered within {CALL_TIMEOUT:?}"))
    }

    /// `SaveState` of `(key, value)` items to `statestore`.
    pub async fn save(&mut self, items: &[(&str, &[u8])]) -> Answer {
        let request = SaveStateRequest {
            store_name: "statestore".into(),
            states: items
                .iter()
                .map(|(key, value)| StateItem {
                    key: (*key).into(),
                    value: value.to_vec(),
                })
                .collect(),
        };
        self.call("SaveState", &request.encode_to_vec()).await
    }

    /// `GetState` of `key` in `statestore`.
    pub async fn get(&mut self, key: &str) -> Answer {
        let request = GetStateRequest {
            store_name: "statestore".into(),
            key: key.into(),
        };
        self.call("GetState", &request.encode_to_vec()).await
    }

    /// `GetBulkState` of `keys` in `statestore`.
    pub async fn get_bulk(&mut self, keys: &[&str]) -> Answer {
        let request = GetBulkStateRequest {
            store_name: "statestore".into(),
            keys: keys.iter().map(|&key| key.to_owned()).collect(),
            parallelism: 0,
        };
        self.call("GetBulkState", &request.encode_to_vec()).await
    }
}
