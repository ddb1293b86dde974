//! The gateway's own CPU against webdis' in one run (issue 16): per request
//! at saturation, at a steady fixed rate, and idle. Each figure is one
//! process's utime + stime from `/proc/<pid>/stat`; the store behind each
//! (emulator + mosquitto, redis) is reported beside it, not added in.

use std::fmt::Write as _;
use std::time::Duration;

use super::stats::Measurement;

/// One round: the same four loads on both servers, one after the other.
#[derive(Debug, Clone, Default)]
pub struct CpuRound {
    /// wrk, 2 threads x 64 connections, against the gateway.
    pub gateway_sat: Measurement,
    /// CPU seconds of the emulator and mosquitto meanwhile.
    pub gateway_store_sat: f64,
    /// The fixed-rate load against the gateway.
    pub gateway_fixed: Measurement,
    /// The same wrk run against webdis, when installed.
    pub webdis_sat: Option<Measurement>,
    /// CPU seconds of redis-server meanwhile.
    pub webdis_store_sat: f64,
    /// The fixed-rate load against webdis.
    pub webdis_fixed: Option<Measurement>,
}

/// CPU of each process while nothing is asked of it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Idle {
    /// How long both servers sat idle.
    pub window: Duration,
    /// The gateway's CPU seconds over the window.
    pub gateway: f64,
    /// webdis' CPU seconds over the window, when installed.
    pub webdis: Option<f64>,
    /// One clock tick of `/proc/<pid>/stat`, the resolution of both.
    pub tick: f64,
}

/// Everything the comparison measured.
#[derive(Debug, Clone, Default)]
pub struct CpuComparison {
    /// Value size of the GETs.
    pub value_bytes: usize,
    /// Target rate of the fixed-rate load.
    pub rate: u32,
    /// Connections of the fixed-rate load.
    pub rate_connections: u32,
    /// wrk connections at saturation.
    pub connections: usize,
    /// Idle CPU.
    pub idle: Idle,
    /// The rounds, in order.
    pub rounds: Vec<CpuRound>,
}

/// mCPU (thousandths of a core) of a fixed-rate run.
pub fn mcpu(run: &Measurement) -> Option<f64> {
    let seconds = run.elapsed.as_secs_f64();
    (seconds > 0.0).then(|| run.cpu_seconds.unwrap_or_default() / seconds * 1000.0)
}

/// The median of the values that are there (`None` when none is).
fn median(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut values: Vec<f64> = values.flatten().collect();
    if values.is_empty() {
        return None;
    }
    values.sort_unstable_by(f64::total_cmp);
    let middle = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    })
}

fn figure(value: Option<f64>, decimals: usize) -> String {
    value.map_or("-".into(), |value| format!("{value:.decimals$}"))
}

fn ratio(ours: Option<f64>, theirs: Option<f64>) -> String {
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if theirs > 0.0 => format!("{:.2}", ours / theirs),
        _ => "-".into(),
    }
}

impl CpuRound {
    fn cells(&self) -> [Option<f64>; 10] {
        let store_us = |cpu: f64, run: &Measurement| {
            (run.requests > 0).then(|| cpu * 1e6 / run.requests as f64)
        };
        [
            self.gateway_sat.cpu_us_per_request(),
            self.webdis_sat
                .as_ref()
                .and_then(Measurement::cpu_us_per_request),
            store_us(self.gateway_store_sat, &self.gateway_sat),
            self.webdis_sat
                .as_ref()
                .and_then(|run| store_us(self.webdis_store_sat, run)),
            mcpu(&self.gateway_fixed),
            self.webdis_fixed.as_ref().and_then(mcpu),
            Some(self.gateway_fixed.rate()),
            self.webdis_fixed.as_ref().map(Measurement::rate),
            Some(self.gateway_sat.rate()),
            self.webdis_sat.as_ref().map(Measurement::rate),
        ]
    }
}

impl CpuComparison {
    /// The medians over the rounds, in pairs (gateway, webdis): CPU us per
    /// request at saturation, the store's CPU us per request meanwhile,
    /// mCPU at the fixed rate, the achieved fixed rate, saturated req/s.
    pub fn medians(&self) -> [Option<f64>; 10] {
        let mut out = [None; 10];
        for (column, slot) in out.iter_mut().enumerate() {
            *slot = median(self.rounds.iter().map(|round| round.cells()[column]));
        }
        out
    }

    /// One line for the console.
    pub fn summary(&self) -> String {
        let m = self.medians();
        format!(
            "CPU, median of {} rounds: saturated {} us/req (webdis {}, ratio {}); {} req/s fixed: {} mCPU (webdis {}, ratio {}); idle {} mCPU (webdis {})",
            self.rounds.len(),
            figure(m[0], 1),
            figure(m[1], 1),
            ratio(m[0], m[1]),
            self.rate,
            figure(m[4], 0),
            figure(m[5], 0),
            ratio(m[4], m[5]),
            self.idle_mcpu(Some(self.idle.gateway)),
            self.idle_mcpu(self.idle.webdis),
        )
    }

    /// Idle mCPU; zero ticks reads as "under one tick over the window".
    fn idle_mcpu(&self, cpu: Option<f64>) -> String {
        let window = self.idle.window.as_secs_f64();
        match cpu {
            Some(cpu) if window > 0.0 && cpu > 0.0 => format!("{:.2}", cpu / window * 1000.0),
            Some(_) if window > 0.0 => format!("< {:.2}", self.idle.tick / window * 1000.0),
            _ => "-".into(),
        }
    }

    /// The markdown section of the report.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "### CPU against webdis (GET {} B; each process's own CPU from `/proc/<pid>/stat`)\n",
            self.value_bytes
        );
        let _ = writeln!(
            out,
            "Saturated: wrk, 2 threads x {} connections. Fixed rate: {} req/s over {} keep-alive connections (achieved rate shown). The store's CPU (emulator + mosquitto; redis) is beside it, not included. Rounds run one after the other; the last row is the median.\n",
            self.connections, self.rate, self.rate_connections
        );
        let _ = writeln!(
            out,
            "| Round | gateway CPU us/req, saturated | webdis CPU us/req, saturated | gateway / webdis | store behind: emulator + mosquitto us/req | store behind: redis us/req | gateway mCPU at {rate} req/s | webdis mCPU at {rate} req/s | gateway / webdis | achieved req/s, gateway / webdis | saturated req/s, gateway / webdis |",
            rate = self.rate
        );
        let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        let row = |out: &mut String, name: &str, c: [Option<f64>; 10]| {
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} |",
                figure(c[0], 1),
                figure(c[1], 1),
                ratio(c[0], c[1]),
                figure(c[2], 1),
                figure(c[3], 1),
                figure(c[4], 0),
                figure(c[5], 0),
                ratio(c[4], c[5]),
                figure(c[6], 0),
                figure(c[7], 0),
                figure(c[8], 0),
                figure(c[9], 0),
            );
        };
        for (index, round) in self.rounds.iter().enumerate() {
            row(&mut out, &(index + 1).to_string(), round.cells());
        }
        row(&mut out, "**median**", self.medians());
        let _ = writeln!(
            out,
            "\nIdle over {:.0} s (both started and ready, nothing asked): gateway {} mCPU, webdis {} mCPU.",
            self.idle.window.as_secs_f64(),
            self.idle_mcpu(Some(self.idle.gateway)),
            self.idle_mcpu(self.idle.webdis),
        );
        out
    }
}
