//! The spans the gateway exports when span export is on: a server span per
//! HTTP request, a client span per store request, an internal span per
//! lock wait.
//!
//! Without export (the default) [`exporting`] is false and every function
//! here returns `None` at once, so a request costs what propagation alone
//! costs.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use super::context::TraceContext;
use super::current::with_current;

/// The tracer of the exporter, once started.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// The outcome of a span's work (`ok`, `not_found`, `acquired`, ...).
const OUTCOME: &str = "statestore.outcome";

/// Makes `tracer` the one spans are recorded with, for the rest of the
/// process; `false` if another was installed first.
pub(super) fn install(tracer: SdkTracer) -> bool {
    TRACER.set(tracer).is_ok()
}

/// Whether spans are exported.
pub fn exporting() -> bool {
    TRACER.get().is_some()
}

/// A span this gateway records, exported when it ends. Dropped before it
/// ended (its request was abandoned), it ends with outcome `cancelled`.
///
/// One pointer: an `Option<Span>` held across an await (by the HTTP
/// middleware and the pool, for every request) keeps their futures as
/// small as without export.
#[derive(Debug)]
pub struct Span(Box<Recorded>);

#[derive(Debug)]
struct Recorded {
    span: opentelemetry_sdk::trace::Span,
    /// The context the work under this span passes on.
    context: TraceContext,
    ended: bool,
}

impl Span {
    /// The server span of an HTTP request: a child of the caller's span
    /// (`incoming`), or the root of a new trace. `None` when nothing is
    /// exported, or when the sampler drops it (an unsampled caller): then
    /// the caller's context goes on unchanged.
    pub fn server(
        incoming: Option<&TraceContext>,
        method: &str,
        route: Option<&str>,
    ) -> Option<Self> {
        let tracer = TRACER.get()?;
        let parent = incoming.map_or_else(Context::new, parent_of);
        let mut attributes = Vec::with_capacity(3);
        attributes.push(KeyValue::new("http.request.method", method.to_owned()));
        let name = match route {
            Some(route) => {
                attributes.push(KeyValue::new("http.route", route.to_owned()));
                format!("{method} {route}")
            }
            None => method.to_owned(),
        };
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent);
        Self::recorded(span, incoming.and_then(TraceContext::state))
    }

    /// The client span of a store request (`verb`: SET, GET, ...), child
    /// of the current context when that is a span this gateway exports.
    pub fn store(verb: &'static str) -> Option<Self> {
        Self::child(
            verb,
            SpanKind::Client,
            vec![
                KeyValue::new("db.system.name", "azure.iot_operations.state_store"),
                KeyValue::new("db.operation.name", verb),
            ],
        )
    }

    /// An internal span (`lock wait`), child of the current context when
    /// that is a span this gateway exports.
    pub fn internal(name: &'static str) -> Option<Self> {
        Self::child(name, SpanKind::Internal, Vec::new())
    }

    /// A span under the current context, when that is a span this gateway
    /// exports.
    fn child(name: &'static str, kind: SpanKind, attributes: Vec<KeyValue>) -> Option<Self> {
        let tracer = TRACER.get()?;
        let (parent, state) = with_current(|current| {
            current
                .exported()
                .then(|| (parent_of(current), current.state()))
        })??;
        let span = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent);
        Self::recorded(span, state)
    }

    fn recorded(
        span: opentelemetry_sdk::trace::Span,
        state: Option<std::sync::Arc<str>>,
    ) -> Option<Self> {
        if !span.is_recording() {
            return None;
        }
        let own = span.span_context();
        let context = TraceContext::of_span(
            own.trace_id().to_bytes(),
            own.span_id().to_bytes(),
            own.trace_flags().to_u8(),
            state,
        );
        Some(Self(Box::new(Recorded {
            span,
            context,
            ended: false,
        })))
    }

    /// The context the work under this span passes on: this span as the
    /// parent, the caller's trace and `tracestate`.
    pub fn context(&self) -> &TraceContext {
        &self.0.context
    }

    /// The pool member a store request went to (its index and MQTT client
    /// id) and how long it waited for a free slot on one.
    pub fn set_member(&mut self, index: usize, client_id: &str, waited: Duration) {
        self.0.span.set_attributes([
            KeyValue::new("statestore.pool.member", index as i64),
            KeyValue::new("messaging.client.id", client_id.to_owned()),
            KeyValue::new(
                "statestore.pool.wait_us",
                i64::try_from(waited.as_micros()).unwrap_or(i64::MAX),
            ),
        ]);
    }

    /// Ends a server span with the response's status (5xx: an error).
    pub fn end_http(mut self, status: u16) {
        self.0.span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            self.0.span.set_status(Status::error(""));
        }
        self.end();
    }

    /// Ends the span with its work's outcome, and the error's kind when it
    /// failed.
    pub fn end_with(mut self, outcome: &'static str, error: Option<&'static str>) {
        self.0.span.set_attribute(KeyValue::new(OUTCOME, outcome));
        if let Some(kind) = error {
            self.0.span.set_attribute(KeyValue::new("error.type", kind));
            self.0.span.set_status(Status::error(""));
        }
        self.end();
    }

    fn end(&mut self) {
        self.0.ended = true;
        self.0.span.end();
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if !self.0.ended {
            self.0
                .span
                .set_attribute(KeyValue::new(OUTCOME, "cancelled"));
            self.end();
        }
    }
}

/// The OpenTelemetry context whose span is `context`'s parent span.
fn parent_of(context: &TraceContext) -> Context {
    let state = context
        .tracestate()
        .and_then(|state| state.parse::<TraceState>().ok())
        .unwrap_or_default();
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(context.trace_id()),
        SpanId::from_bytes(context.parent_id()),
        TraceFlags::new(context.flags()),
        !context.exported(),
        state,
    ))
}
