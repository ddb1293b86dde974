//! Span export: the OpenTelemetry SDK with a batch processor and the OTLP
//! exporter over HTTP/protobuf, configured by the standard `OTEL_*`
//! environment variables and off unless an endpoint is set.
//!
//! Export never holds a request: an ended span goes into a bounded queue
//! (`OTEL_BSP_MAX_QUEUE_SIZE`) with a non-blocking send, and the batch
//! processor's own thread encodes and sends the batches. A full queue drops
//! the span; a failed export drops its batch; both are counted
//! (`trace_spans_dropped_total`, by `reason`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData,
    SpanExporter, SpanProcessor,
};
use prometheus::IntCounterVec;
use thiserror::Error;

use crate::metrics::Metrics;
use crate::settings;

/// The service name when neither `OTEL_SERVICE_NAME` nor a `service.name`
/// in `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const DEFAULT_SERVICE_NAME: &str = settings::OTEL_SERVICE_NAME.default;

const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";

/// The largest collector answer read (its body only says what it refused).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// A setting of span export that cannot work; the process does not start.
#[derive(Debug, Error)]
#[error("{name}: {message}")]
pub struct ExportError {
    /// The environment variable.
    pub name: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl ExportError {
    fn new(name: &'static str, message: impl Into<String>) -> Self {
        Self {
            name,
            message: message.into(),
        }
    }
}

/// The sampler, as `OTEL_TRACES_SAMPLER` (and `OTEL_TRACES_SAMPLER_ARG`) name it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerSetting {
    /// `always_on`
    AlwaysOn,
    /// `always_off`
    AlwaysOff,
    /// `traceidratio` with its ratio
    TraceIdRatio(f64),
    /// `parentbased_always_on` (the default)
    ParentBasedAlwaysOn,
    /// `parentbased_always_off`
    ParentBasedAlwaysOff,
    /// `parentbased_traceidratio` with its ratio
    ParentBasedTraceIdRatio(f64),
}

impl SamplerSetting {
    fn sampler(self) -> Sampler {
        let parent_based = |root: Sampler| Sampler::ParentBased(Box::new(root));
        match self {
            Self::AlwaysOn => Sampler::AlwaysOn,
            Self::AlwaysOff => Sampler::AlwaysOff,
            Self::TraceIdRatio(ratio) => Sampler::TraceIdRatioBased(ratio),
            Self::ParentBasedAlwaysOn => parent_based(Sampler::AlwaysOn),
            Self::ParentBasedAlwaysOff => parent_based(Sampler::AlwaysOff),
            Self::ParentBasedTraceIdRatio(ratio) => parent_based(Sampler::TraceIdRatioBased(ratio)),
        }
    }
}

/// What span export was asked for, read from the `OTEL_*` variables.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSettings {
    /// Where spans go: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` followed by `/v1/traces`.
    pub endpoint: String,
    /// `OTEL_TRACES_SAMPLER`.
    pub sampler: SamplerSetting,
    /// `OTEL_SERVICE_NAME` was not set (nor `service.name` in the resource
    /// attributes): the gateway names itself [`DEFAULT_SERVICE_NAME`].
    pub default_service_name: bool,
    /// `OTEL_BSP_MAX_QUEUE_SIZE` (2048).
    pub max_queue_size: usize,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512, at most the queue size).
    pub max_export_batch_size: usize,
    /// `OTEL_BSP_SCHEDULE_DELAY` (5 s).
    pub schedule_delay: Duration,
    /// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT`
    /// (10 s): how long one export may take.
    pub timeout: Duration,
}

impl ExportSettings {
    /// The settings from `env` (a variable's value by its name; an empty
    /// value counts as unset, as the specification asks); `None` when no
    /// endpoint is set: export is off.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ExportError> {
        let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let (endpoint_var, endpoint) = match (
            env(TRACES_ENDPOINT),
            env(settings::OTEL_EXPORTER_OTLP_ENDPOINT.env),
        ) {
            (Some(endpoint), _) => (TRACES_ENDPOINT, endpoint.trim().to_owned()),
            (None, Some(base)) => (
                settings::OTEL_EXPORTER_OTLP_ENDPOINT.env,
                format!("{}/v1/traces", base.trim().trim_end_matches('/')),
            ),
            (None, None) => return Ok(None),
        };
        if !endpoint.starts_with("http://") {
            return Err(ExportError::new(
                endpoint_var,
                format!(
                    "{endpoint:?}: only http:// endpoints are supported (a collector beside the gateway, or its in-cluster service)"
                ),
            ));
        }
        for name in [TRACES_PROTOCOL, PROTOCOL] {
            if let Some(protocol) = env(name)
                && protocol.trim() != "http/protobuf"
            {
                return Err(ExportError::new(
                    name,
                    format!("{protocol:?} is not supported; the gateway exports http/protobuf"),
                ));
            }
        }
        let sampler = sampler(
            env(settings::OTEL_TRACES_SAMPLER.env).as_deref(),
            env(settings::OTEL_TRACES_SAMPLER_ARG.env).as_deref(),
        )?;
        let named_in_attributes = env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
            attributes
                .split(',')
                .any(|pair| pair.split('=').next().map(str::trim) == Some("service.name"))
        });
        let number = |name: &'static str, default: u64| -> Result<u64, ExportError> {
            match env(name) {
                None => Ok(default),
                Some(text) => text
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        ExportError::new(name, format!("{text:?} is not a positive integer"))
                    }),
            }
        };
        let max_queue_size =
            usize::try_from(number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?).unwrap_or(usize::MAX);
        let max_export_batch_size = usize::try_from(number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?)
            .unwrap_or(usize::MAX)
            .min(max_queue_size);
        let schedule_delay = Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5_000)?);
        let timeout = match env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
            Some(_) => number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000)?,
            None => number("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?,
        };
        Ok(Some(Self {
            endpoint,
            sampler,
            default_service_name: env(settings::OTEL_SERVICE_NAME.env).is_none()
                && !named_in_attributes,
            max_queue_size,
            max_export_batch_size,
            schedule_delay,
            timeout: Duration::from_millis(timeout),
        }))
    }
}

fn sampler(name: Option<&str>, arg: Option<&str>) -> Result<SamplerSetting, ExportError> {
    let ratio = || -> Result<f64, ExportError> {
        match arg {
            None => Ok(1.0),
            Some(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|ratio| (0.0..=1.0).contains(ratio))
                .ok_or_else(|| {
                    ExportError::new(
                        "OTEL_TRACES_SAMPLER_ARG",
                        format!("{text:?} is not a ratio from 0 to 1"),
                    )
                }),
        }
    };
    let name = name.unwrap_or(settings::OTEL_TRACES_SAMPLER.default);
    Ok(match name.trim() {
        "parentbased_always_on" => SamplerSetting::ParentBasedAlwaysOn,
        "always_on" => SamplerSetting::AlwaysOn,
        "always_off" => SamplerSetting::AlwaysOff,
        "traceidratio" => SamplerSetting::TraceIdRatio(ratio()?),
        "parentbased_always_off" => SamplerSetting::ParentBasedAlwaysOff,
        "parentbased_traceidratio" => SamplerSetting::ParentBasedTraceIdRatio(ratio()?),
        other => {
            return Err(ExportError::new(
                "OTEL_TRACES_SAMPLER",
                format!(
                    "{other:?} is not supported (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)"
                ),
            ));
        }
    })
}

/// Span export while it runs; [`Exporter::shutdown`] sends what is queued.
#[derive(Debug)]
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Starts the batch processor's thread and the exporter. Spans are
    /// exported only through the tracer this returns (see
    /// [`super::install`]).
    pub fn start(
        settings: &ExportSettings,
        metrics: &Metrics,
    ) -> Result<(Self, SdkTracer), ExportError> {
        let client = OtlpHttp::new(settings.timeout)
            .map_err(|error| ExportError::new("OTEL_EXPORTER_OTLP_ENDPOINT", error.to_string()))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(settings.endpoint.clone())
            .with_timeout(settings.timeout)
            .build()
            .map_err(|error| ExportError::new("OTEL_EXPORTER_OTLP_ENDPOINT", error.to_string()))?;
        let queued = Arc::new(AtomicUsize::new(0));
        let dropped = metrics.trace_spans_dropped.clone();
        let batch = BatchSpanProcessor::builder(CountedExporter {
            inner: exporter,
            queued: queued.clone(),
            dropped: dropped.clone(),
        })
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(settings.max_queue_size)
                .with_max_export_batch_size(settings.max_export_batch_size)
                .with_scheduled_delay(settings.schedule_delay)
                .build(),
        )
        .build();
        let processor = BoundedQueue {
            inner: batch,
            queued,
            max: settings.max_queue_size,
            dropped,
        };
        let mut resource = Resource::builder();
        if settings.default_service_name {
            resource = resource.with_service_name(DEFAULT_SERVICE_NAME);
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(settings.sampler.sampler())
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer(DEFAULT_SERVICE_NAME);
        Ok((Self { provider }, tracer))
    }

    /// Exports the spans still queued and stops the processor's thread,
    /// waiting at most `within` (what is left of the shutdown grace
    /// period): a collector that has not answered by then loses them.
    /// Blocks: call it off the runtime's threads.
    pub fn shutdown(self, within: Duration) {
        if let Err(error) = self.provider.shutdown_with_timeout(within) {
            tracing::warn!(%error, "span export did not shut down cleanly");
        }
    }
}

/// The batch processor, behind a count of the spans it holds: a span over
/// `max` is dropped and counted here (the processor's own drop count is not
/// readable). The count goes down when the exporter takes a batch, after
/// the processor's queue let it go, so the processor's queue never
/// overflows by itself.
#[derive(Debug)]
struct BoundedQueue {
    inner: BatchSpanProcessor,
    queued: Arc<AtomicUsize>,
    max: usize,
    dropped: IntCounterVec,
}

impl SpanProcessor for BoundedQueue {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.dropped.with_label_values(&["queue_full"]).inc();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting the spans of batches it could not deliver.
#[derive(Debug)]
struct CountedExporter {
    inner: opentelemetry_otlp::SpanExporter,
    queued: Arc<AtomicUsize>,
    dropped: IntCounterVec,
}

impl SpanExporter for CountedExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        self.queued.fetch_sub(spans, Ordering::AcqRel);
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            tracing::debug!(%error, spans, "span export failed");
            self.dropped
                .with_label_values(&["export_failed"])
                .inc_by(spans as u64);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter's HTTP client: hyper's (HTTP/1), driven by a runtime of
/// its own on the batch processor's thread, which waits for each export
/// anyway; the gateway's runtime never runs export work.
#[derive(Debug)]
struct OtlpHttp {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: tokio::runtime::Runtime,
    timeout: Duration,
}

impl OtlpHttp {
    fn new(timeout: Duration) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            client,
            runtime,
            timeout,
        })
    }

    async fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let response = self.client.request(request.map(Full::new)).await?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_RESPONSE_BYTES).collect().await?;
        Ok(Response::from_parts(parts, body.to_bytes()))
    }
}

#[async_trait::async_trait]
impl HttpClient for OtlpHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        // Called from the batch processor's thread (outside any Tokio
        // runtime), which blocks on the export.
        self.runtime.block_on(async {
            match tokio::time::timeout(self.timeout, self.send(request)).await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {:?}", self.timeout).into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<ExportSettings>, ExportError> {
        ExportSettings::from_env(|name| {
            vars.iter()
                .find(|(var, _)| *var == name)
                .map(|(_, value)| (*value).to_owned())
        })
    }

    #[test]
    fn export_is_off_without_an_endpoint() {
        assert_eq!(settings(&[]).unwrap(), None);
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
                ("OTEL_TRACES_SAMPLER", "x")
            ])
            .unwrap(),
            None
        );
    }

    #[test]
    fn the_defaults_are_the_specifications() {
        let on = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
            .unwrap()
            .unwrap();
        assert_eq!(on.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(on.sampler, SamplerSetting::ParentBasedAlwaysOn);
        assert!(on.default_service_name);
        assert_eq!(on.max_queue_size, 2048);
        assert_eq!(on.max_export_batch_size, 512);
        assert_eq!(on.schedule_delay, Duration::from_secs(5));
        assert_eq!(on.timeout, Duration::from_secs(10));
        let traces = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://collector:4318/traces",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=test, service.name=gw",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "10"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(traces.endpoint, "http://collector:4318/traces");
        assert!(!traces.default_service_name);
        assert_eq!(
            traces.sampler,
            SamplerSetting::ParentBasedTraceIdRatio(0.25)
        );
        assert_eq!(
            (traces.max_queue_size, traces.max_export_batch_size),
            (10, 10)
        );
    }

    #[test]
    fn unsupported_values_name_their_variable() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        for (bad, name) in [
            (
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            ),
            (
                ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
                "OTEL_TRACES_SAMPLER",
            ),
            (
                ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                ("OTEL_BSP_MAX_QUEUE_SIZE", "many"),
                "OTEL_BSP_MAX_QUEUE_SIZE",
            ),
            (("OTEL_BSP_SCHEDULE_DELAY", "0"), "OTEL_BSP_SCHEDULE_DELAY"),
        ] {
            let sampler = ("OTEL_TRACES_SAMPLER", "traceidratio");
            let error = settings(&[
                endpoint,
                bad,
                if bad.0 == sampler.0 { bad } else { sampler },
            ])
            .unwrap_err();
            assert_eq!(error.name, name, "{bad:?}");
        }
        let https = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")]);
        assert!(https.unwrap_err().message.contains("http://"));
        let https = settings(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c/v1/traces")]);
        assert_eq!(
            https.unwrap_err().name,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        );
    }
}
