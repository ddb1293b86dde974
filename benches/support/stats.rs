//! Latency percentiles and throughput of one measurement.

use std::time::Duration;

/// The middle of `values`, sorted here (the upper middle of an even
/// count); NaN when there are none.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median, lowest and highest of `ratios` (those of paired rounds);
/// `None` when there are none.
pub fn median_low_high(ratios: impl IntoIterator<Item = f64>) -> Option<(f64, f64, f64)> {
    let mut ratios: Vec<f64> = ratios.into_iter().collect();
    let middle = median(&mut ratios);
    Some((middle, *ratios.first()?, *ratios.last()?))
}

/// Latency percentiles, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest.
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of the samples (sorted here).
    pub fn of(samples: &mut [Duration]) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let rank = (q * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1].as_secs_f64() * 1e6
        };
        Percentiles {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
        }
    }

    /// `self - other`, per percentile (the max is left out: one outlier each).
    pub fn minus(&self, other: &Percentiles) -> Percentiles {
        Percentiles {
            p50: self.p50 - other.p50,
            p90: self.p90 - other.p90,
            p99: self.p99 - other.p99,
            p999: self.p999 - other.p999,
            max: f64::NAN,
        }
    }
}

/// What one measurement produced.
#[derive(Debug, Clone, Default)]
pub struct Measurement {
    /// Completed requests.
    pub requests: u64,
    /// Failed requests (errors or unexpected replies).
    pub errors: u64,
    /// Wall time of the measurement.
    pub elapsed: Duration,
    /// Latency of the completed requests.
    pub latency: Percentiles,
    /// CPU seconds the measured server (or, for the direct client, this
    /// process) used during the measurement, when known.
    pub cpu_seconds: Option<f64>,
    /// Highest resident memory of the measured server seen meanwhile, KiB.
    pub peak_rss_kib: Option<u64>,
}

impl Measurement {
    /// Requests per second.
    pub fn rate(&self) -> f64 {
        if self.elapsed.is_zero() {
            return 0.0;
        }
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU microseconds per request, when the CPU time is known.
    pub fn cpu_us_per_request(&self) -> Option<f64> {
        let cpu = self.cpu_seconds?;
        (self.requests > 0).then(|| cpu * 1e6 / self.requests as f64)
    }
}
