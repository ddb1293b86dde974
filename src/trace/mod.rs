//! W3C Trace Context: the caller's `traceparent` and `tracestate`, carried
//! from the HTTP request to every store request it causes.
//!
//! The HTTP layer parses the headers once ([`TraceContext::from_headers`];
//! a malformed header is ignored, never an error) and runs the request
//! inside [`scope`]; the pool reads the [`current`] context when it builds
//! a request's envelope and adds the MQTT5 user properties
//! [`TRACEPARENT`] and [`TRACESTATE`] (the W3C Trace Context for MQTT
//! draft's names, which cannot collide with the store's `__` properties).
//! Work a request hands to another task (a lock's SET, the watch hub's
//! registration) takes the context along with [`current`] and [`scope`].
//!
//! A request without a `traceparent` runs outside any scope: nothing is
//! allocated and the pool adds nothing.
//!
//! With span export on ([`start_export`]: an `OTEL_EXPORTER_OTLP_*ENDPOINT`
//! is set), the HTTP layer runs a request under its server [`Span`]'s
//! context instead, and the pool gives each store request a client span
//! whose id goes out as the `traceparent`'s parent.

mod context;
mod current;
mod export;
mod span;

pub use context::{TRACEPARENT, TRACESTATE, TraceContext};
pub use current::{current, inherit, scope, with_current};
pub use export::{DEFAULT_SERVICE_NAME, ExportError, ExportSettings, Exporter, SamplerSetting};
pub use span::{Span, exporting};

/// Starts span export when `env` (the process's variables, by name) asks
/// for it; `None` when no endpoint is set. Once per process: the spans of
/// every request go to this exporter.
pub fn start_export(
    env: impl Fn(&str) -> Option<String>,
    metrics: &crate::metrics::Metrics,
) -> Result<Option<Exporter>, ExportError> {
    let Some(settings) = ExportSettings::from_env(env)? else {
        return Ok(None);
    };
    let (exporter, tracer) = Exporter::start(&settings, metrics)?;
    if !span::install(tracer) {
        return Err(ExportError {
            name: "OTEL_EXPORTER_OTLP_ENDPOINT",
            message: "span export was started twice".into(),
        });
    }
    tracing::info!(endpoint = %settings.endpoint, "exporting spans");
    Ok(Some(exporter))
}
