//! Prometheus metrics: one registry, typed families, fixed label sets.
//!
//! Labels are bounded: HTTP metrics use the matched route template, never
//! the raw path (an unbounded label set is a memory leak).

use std::sync::Arc;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets in seconds, fine below a millisecond where a sidecar lives.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Every metric the gateway exports; a cheap handle to one shared set.
///
/// Handlers, middleware and the pool each hold one, and axum clones the
/// state for every request: behind one `Arc` that is one reference count,
/// where cloning the families themselves took 15 (a profile at saturation
/// showed 15 % of the gateway's CPU in those clones and drops).
#[derive(Debug, Clone)]
pub struct Metrics(Arc<Families>);

impl std::ops::Deref for Metrics {
    type Target = Families;

    fn deref(&self) -> &Families {
        &self.0
    }
}

/// The metric families, reached through [`Metrics`].
#[derive(Debug)]
pub struct Families {
    registry: Registry,
    /// HTTP requests by route template, method and status.
    pub http_requests: IntCounterVec,
    /// HTTP latency by route template and method.
    pub http_latency: HistogramVec,
    /// Store round trips by op (SET, GET, ...) and outcome (ok, not_found, ...).
    pub store_latency: HistogramVec,
    /// `-ERR` replies and transport failures by kind.
    pub store_errors: IntCounterVec,
    /// Pool members by state (connecting, subscribed, down).
    pub pool_members: IntGaugeVec,
    /// Store requests awaiting a reply.
    pub in_flight: IntGauge,
    /// Reply waiters held by the pool's connections, read at scrape time:
    /// at most `in_flight`, and zero when nothing is in flight (else a leak).
    pub pending_replies: IntGauge,
    /// Pool member reconnects.
    pub reconnects: IntCounter,
    /// Pool member sessions another client with the same client id took
    /// over, by how it showed (`reason_code`, `repeated_close`).
    pub session_takeovers: IntCounterVec,
    /// Pub/sub events whose delivery to the app is over (acknowledged to
    /// the broker), by outcome (`success`, `dropped`, `dead_letter`).
    pub pubsub_events: IntCounterVec,
    /// Open SSE watchers.
    pub watchers: IntGauge,
    /// Keys with a KEYNOTIFY registration.
    pub watched_keys: IntGauge,
    /// Notifications received from the store.
    pub notifications_received: IntCounter,
    /// Events delivered to watchers.
    pub events_delivered: IntCounter,
    /// Events dropped for slow consumers (replaced by a sync).
    pub events_dropped: IntCounter,
    /// Times the gateway's clock, over a minute ahead of the system clock,
    /// fell back to it.
    pub clock_fallbacks: IntCounter,
    /// Resyncs after a reconnect or an overflow.
    pub resyncs: IntCounter,
    /// Locks acquired or renewed, by whether the request waited.
    pub lock_acquisitions: IntCounterVec,
    /// Lock attempts that found the lock held by another.
    pub lock_contention: IntCounter,
    /// Lock requests waiting for a lock.
    pub lock_waiters: IntGauge,
    /// Distinct patterns followed by `/watch?match=` streams.
    pub watch_patterns: IntGauge,
    /// Keys followed because a pattern matches them (counted once per
    /// pattern that follows them).
    pub watch_pattern_keys: IntGauge,
    /// Rescans (SCAN of the whole pattern) of followed patterns.
    pub watch_rescans: IntCounter,
    /// How long those rescans took, registrations of new keys included.
    pub watch_rescan_duration: prometheus::Histogram,
    /// Batch ops by op (get, set, delete) and the status each answered.
    pub batch_ops: IntCounterVec,
    /// Batch op latency by op, from its start to its result.
    pub batch_op_latency: HistogramVec,
    /// Ops per batch (its count: the batches).
    pub batch_size: Histogram,
    /// Requests and batch ops the authorization rules refused, by the
    /// method they needed (never by caller: unbounded).
    pub authz_denials: IntCounterVec,
    /// Rules in force from `--authz-file`.
    pub authz_rules: IntGauge,
    /// Whether the last read of `--authz-file` was applied (1) or kept
    /// the previous rules (0).
    pub authz_reload_ok: IntGauge,
    /// Reads of `--authz-file` that kept the previous rules.
    pub authz_reload_failures: IntCounter,
    /// Key API requests refused by the guard, by reason (`missing`,
    /// `api_token`, or why a JWT was refused: `expired`, `signature`, ...).
    pub auth_failures: IntCounterVec,
    /// JWT key set loads by outcome: `changed` (a new set installed) or
    /// `failed` (the previous set stays).
    pub jwks_updates: IntCounterVec,
    /// Spans that never reached the collector, by reason: `queue_full`
    /// (the export queue was full), `export_failed` (the collector did not
    /// take their batch).
    pub trace_spans_dropped: IntCounterVec,
}

impl Metrics {
    /// A fresh registry with every family registered.
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("statestore_gateway".into()), None).unwrap_or_default();
        let http_requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "HTTP requests by route, method and status",
            ),
            &["route", "method", "status"],
        );
        let http_latency = HistogramVec::new(
            HistogramOpts::new("http_request_duration_seconds", "HTTP request latency")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["route", "method"],
        );
        let store_latency = HistogramVec::new(
            HistogramOpts::new(
                "store_request_duration_seconds",
                "State store round-trip latency by op and outcome",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["op", "outcome"],
        );
        let store_errors = IntCounterVec::new(
            Opts::new("store_errors_total", "State store errors by kind"),
            &["kind"],
        );
        let pool_members = IntGaugeVec::new(
            Opts::new("pool_members", "MQTT pool members by state"),
            &["state"],
        );
        let lock_acquisitions = IntCounterVec::new(
            Opts::new(
                "lock_acquisitions_total",
                "Locks acquired or renewed, by whether the request waited",
            ),
            &["waited"],
        );
        let batch_ops = IntCounterVec::new(
            Opts::new(
                "batch_ops_total",
                "Batch ops by op and the status each answered",
            ),
            &["op", "status"],
        );
        let batch_op_latency = HistogramVec::new(
            HistogramOpts::new("batch_op_duration_seconds", "Batch op latency by op")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["op"],
        );
        let batch_size = Histogram::with_opts(
            HistogramOpts::new("batch_size", "Ops per batch").buckets(vec![
                1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
            ]),
        );
        let authz_denials = IntCounterVec::new(
            Opts::new(
                "authz_denials_total",
                "Requests and batch ops the authorization rules refused, by the method they needed",
            ),
            &["method"],
        );
        let auth_failures = IntCounterVec::new(
            Opts::new(
                "auth_failures_total",
                "Key API requests refused for their credentials, by reason",
            ),
            &["reason"],
        );
        let jwks_updates = IntCounterVec::new(
            Opts::new(
                "jwks_updates_total",
                "JWT key set loads by outcome (changed, failed)",
            ),
            &["outcome"],
        );
        let families = Families {
            http_requests: http_requests.expect("valid metric"),
            http_latency: http_latency.expect("valid metric"),
            store_latency: store_latency.expect("valid metric"),
            store_errors: store_errors.expect("valid metric"),
            pool_members: pool_members.expect("valid metric"),
            in_flight: gauge(
                "store_requests_in_flight",
                "Store requests awaiting a reply",
            ),
            pending_replies: gauge(
                "store_pending_replies",
                "Reply waiters held by the pool's connections (read at scrape time)",
            ),
            reconnects: counter("pool_reconnects_total", "MQTT pool member reconnects"),
            session_takeovers: session_takeovers(),
            pubsub_events: pubsub_events(),
            watchers: gauge("watchers", "Open SSE watchers"),
            watched_keys: gauge("watched_keys", "Keys with a KEYNOTIFY registration"),
            notifications_received: counter(
                "notifications_received_total",
                "KEYNOTIFY notifications received from the store",
            ),
            events_delivered: counter("watch_events_delivered_total", "SSE events delivered"),
            events_dropped: counter(
                "watch_events_dropped_total",
                "SSE events dropped for slow consumers (replaced by a sync)",
            ),
            clock_fallbacks: counter(
                "clock_fallbacks_total",
                "Times the clock, over a minute ahead of the system clock, fell back to it",
            ),
            resyncs: counter("watch_resyncs_total", "Watch resyncs"),
            lock_acquisitions: lock_acquisitions.expect("valid metric"),
            lock_contention: counter(
                "lock_contention_total",
                "Lock attempts that found the lock held by another",
            ),
            lock_waiters: gauge("lock_waiters", "Lock requests waiting for a lock"),
            watch_patterns: gauge(
                "watch_patterns",
                "Distinct patterns followed by watch streams",
            ),
            watch_pattern_keys: gauge(
                "watch_pattern_keys",
                "Keys followed because a followed pattern matches them",
            ),
            watch_rescans: counter(
                "watch_rescans_total",
                "Rescans (SCAN of the whole pattern) of followed patterns",
            ),
            watch_rescan_duration: prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "watch_rescan_duration_seconds",
                    "Time of one rescan of a followed pattern",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
            )
            .expect("valid metric"),
            batch_ops: batch_ops.expect("valid metric"),
            batch_op_latency: batch_op_latency.expect("valid metric"),
            batch_size: batch_size.expect("valid metric"),
            authz_denials: authz_denials.expect("valid metric"),
            authz_rules: gauge("authz_rules", "Authorization rules in force"),
            authz_reload_ok: gauge(
                "authz_last_reload_success",
                "Whether the last read of the authorization rules file was applied (1) or kept the previous rules (0)",
            ),
            authz_reload_failures: counter(
                "authz_reload_failures_total",
                "Reads of the authorization rules file that kept the previous rules",
            ),
            auth_failures: auth_failures.expect("valid metric"),
            jwks_updates: jwks_updates.expect("valid metric"),
            trace_spans_dropped: trace_spans_dropped(),
            registry,
        };
        families.register_all();
        Self(Arc::new(families))
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut out = Vec::with_capacity(16 * 1024);
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Families {
    fn register_all(&self) {
        let collectors: [Box<dyn prometheus::core::Collector>; 34] = [
            Box::new(self.http_requests.clone()),
            Box::new(self.http_latency.clone()),
            Box::new(self.store_latency.clone()),
            Box::new(self.store_errors.clone()),
            Box::new(self.pool_members.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.pending_replies.clone()),
            Box::new(self.reconnects.clone()),
            Box::new(self.session_takeovers.clone()),
            Box::new(self.pubsub_events.clone()),
            Box::new(self.watchers.clone()),
            Box::new(self.watched_keys.clone()),
            Box::new(self.notifications_received.clone()),
            Box::new(self.events_delivered.clone()),
            Box::new(self.events_dropped.clone()),
            Box::new(self.clock_fallbacks.clone()),
            Box::new(self.resyncs.clone()),
            Box::new(self.lock_acquisitions.clone()),
            Box::new(self.lock_contention.clone()),
            Box::new(self.lock_waiters.clone()),
            Box::new(self.watch_patterns.clone()),
            Box::new(self.watch_pattern_keys.clone()),
            Box::new(self.watch_rescans.clone()),
            Box::new(self.watch_rescan_duration.clone()),
            Box::new(self.batch_ops.clone()),
            Box::new(self.batch_op_latency.clone()),
            Box::new(self.batch_size.clone()),
            Box::new(self.authz_denials.clone()),
            Box::new(self.authz_rules.clone()),
            Box::new(self.authz_reload_ok.clone()),
            Box::new(self.authz_reload_failures.clone()),
            Box::new(self.auth_failures.clone()),
            Box::new(self.jwks_updates.clone()),
            Box::new(self.trace_spans_dropped.clone()),
        ];
        for collector in collectors {
            // Names are distinct constants, so registration cannot collide.
            let _ = self.registry.register(collector);
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("valid metric")
}

/// Spans dropped, with both reasons at zero from the start.
fn trace_spans_dropped() -> IntCounterVec {
    let family = IntCounterVec::new(
        Opts::new(
            "trace_spans_dropped_total",
            "Spans not exported: the export queue was full, or the collector did not take them",
        ),
        &["reason"],
    )
    .expect("valid metric");
    for reason in ["queue_full", "export_failed"] {
        family.with_label_values(&[reason]);
    }
    family
}

/// Pub/sub events by the outcome of their delivery, each at zero from
/// the start.
fn pubsub_events() -> IntCounterVec {
    let family = IntCounterVec::new(
        Opts::new(
            "pubsub_events_total",
            "Pub/sub events whose delivery to the app is over and acknowledged to the broker, by \
             outcome: the app took it (success), dropped it (dropped: DROP, 404, no matching \
             route, expired) or it went to the dead letter topic (dead_letter)",
        ),
        &["outcome"],
    )
    .expect("valid metric");
    for outcome in ["success", "dropped", "dead_letter"] {
        family.with_label_values(&[outcome]);
    }
    family
}

/// Session takeovers, with both ways of noticing one at zero from the
/// start (an alert on the sum needs the series before the first).
fn session_takeovers() -> IntCounterVec {
    let family = IntCounterVec::new(
        Opts::new(
            "pool_session_takeovers_total",
            "MQTT sessions of pool members that another client with the same client id took over, \
             by how it showed: the broker's DISCONNECT 0x8E (reason_code), or connections closed \
             without a reason within seconds of connecting, three or more in a row (repeated_close)",
        ),
        &["detected_by"],
    )
    .expect("valid metric");
    for detected_by in ["reason_code", "repeated_close"] {
        family.with_label_values(&[detected_by]);
    }
    family
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid metric")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_the_prefix() {
        let metrics = Metrics::new();
        metrics
            .http_requests
            .with_label_values(&["/keys/{*key}", "GET", "200"])
            .inc();
        metrics
            .store_latency
            .with_label_values(&["GET", "ok"])
            .observe(0.0002);
        metrics
            .store_errors
            .with_label_values(&["not_authorized"])
            .inc();
        metrics
            .pool_members
            .with_label_values(&["subscribed"])
            .set(4);
        let text = metrics.render();
        for name in [
            "statestore_gateway_http_requests_total{method=\"GET\",route=\"/keys/{*key}\",status=\"200\"} 1",
            "statestore_gateway_store_request_duration_seconds_bucket{op=\"GET\",outcome=\"ok\",le=\"0.00025\"} 1",
            "statestore_gateway_store_errors_total{kind=\"not_authorized\"} 1",
            "statestore_gateway_pool_members{state=\"subscribed\"} 4",
            "statestore_gateway_store_requests_in_flight 0",
            "statestore_gateway_watchers 0",
            "statestore_gateway_watch_resyncs_total 0",
            "statestore_gateway_clock_fallbacks_total 0",
            "statestore_gateway_lock_contention_total 0",
            "statestore_gateway_lock_waiters 0",
            "statestore_gateway_watch_patterns 0",
            "statestore_gateway_watch_pattern_keys 0",
            "statestore_gateway_watch_rescans_total 0",
            "statestore_gateway_watch_rescan_duration_seconds_count 0",
            "statestore_gateway_authz_rules 0",
            "statestore_gateway_authz_last_reload_success 0",
            "statestore_gateway_authz_reload_failures_total 0",
            "statestore_gateway_trace_spans_dropped_total{reason=\"queue_full\"} 0",
            "statestore_gateway_pool_session_takeovers_total{detected_by=\"reason_code\"} 0",
            "statestore_gateway_pool_session_takeovers_total{detected_by=\"repeated_close\"} 0",
            "statestore_gateway_pubsub_events_total{outcome=\"dead_letter\"} 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
