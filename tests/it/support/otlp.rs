//! A real OTLP/HTTP receiver: an HTTP server on a free port that takes
//! `POST /v1/traces` (`application/x-protobuf`), decodes each
//! `ExportTraceServiceRequest` with the OpenTelemetry proto crate and keeps
//! the spans with their resource, as a collector would.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use tokio::net::TcpListener;

/// A span as received, with its resource's attributes.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The resource's attributes, as text.
    pub resource: Vec<(String, String)>,
    /// The span.
    pub span: Span,
}

impl ReceivedSpan {
    /// The value of resource attribute `name`.
    pub fn resource(&self, name: &str) -> Option<&str> {
        self.resource
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The value of span attribute `name`, as text.
    pub fn attribute(&self, name: &str) -> Option<String> {
        self.span
            .attributes
            .iter()
            .find(|attribute| attribute.key == name)
            .map(text)
    }

    /// The trace id, in hex.
    pub fn trace_id(&self) -> String {
        hex::encode(&self.span.trace_id)
    }

    /// The span id, in hex.
    pub fn span_id(&self) -> String {
        hex::encode(&self.span.span_id)
    }

    /// The parent's span id, in hex (empty for a root span).
    pub fn parent_id(&self) -> String {
        hex::encode(&self.span.parent_span_id)
    }
}

fn text(attribute: &KeyValue) -> String {
    match attribute
        .value
        .as_ref()
        .and_then(|value| value.value.as_ref())
    {
        Some(Value::StringValue(text)) => text.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(x)) => x.to_string(),
        other => format!("{other:?}"),
    }
}

type Received = Arc<Mutex<Vec<ReceivedSpan>>>;

/// The receiver; stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    received: Received,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let received = Received::default();
        let router = Router::new()
            .route("/v1/traces", post(export))
            .with_state(received.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            addr,
            received,
            task,
        }
    }

    /// The base URL, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().unwrap().clone()
    }

    /// The spans received once `done` holds for them; panics after `within`.
    pub async fn spans_until(
        &self,
        within: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the spans expected did not arrive; received: {:#?}",
                spans
                    .iter()
                    .map(|s| (&s.span.name, s.trace_id()))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn export(
    State(received): State<Received>,
    body: Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(request) => request,
        Err(_) => {
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "text/plain")],
                b"not an ExportTraceServiceRequest".to_vec(),
            );
        }
    };
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let resource: Vec<(String, String)> = resource_spans
            .resource
            .map(|resource| {
                resource
                    .attributes
                    .iter()
                    .map(|attribute| (attribute.key.clone(), text(attribute)))
                    .collect()
            })
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    resource: resource.clone(),
                    span,
                });
            }
        }
    }
    received.lock().unwrap().extend(spans);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}
