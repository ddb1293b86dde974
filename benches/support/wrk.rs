//! HTTP load with `wrk`: a Lua script sets the method and body and, in
//! `done()`, prints one line with the counts and latency percentiles, which
//! is parsed here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use super::stats::{Measurement, Percentiles};

/// The marker of the result line the script prints.
const RESULT_MARKER: &str = "WRK_RESULT";

/// One wrk run.
#[derive(Debug, Clone)]
pub struct WrkRun {
    /// wrk threads.
    pub threads: usize,
    /// Open connections (each with one request at a time).
    pub connections: usize,
    /// Whole seconds (wrk takes no fractions).
    pub seconds: u64,
    /// `GET` or `PUT`.
    pub method: &'static str,
    /// Bytes of the PUT body (filled with `v`).
    pub body_bytes: usize,
    /// Full URL.
    pub url: String,
}

/// Writes the script for a run into `dir` and returns its path.
fn script(dir: &Path, run: &WrkRun) -> Result<PathBuf> {
    let path = dir.join(format!(
        "wrk-{}-{}-{}.lua",
        run.method, run.body_bytes, run.connections
    ));
    let body = if run.method == "PUT" {
        format!(
            "wrk.body = string.rep(\"v\", {})\nwrk.headers[\"Content-Type\"] = \"application/octet-stream\"\n",
            run.body_bytes
        )
    } else {
        String::new()
    };
    let text = format!(
        r#"wrk.method = "{method}"
{body}
done = function(summary, latency, requests)
  local e = summary.errors
  local function p(q) return math.floor(latency:percentile(q)) end
  io.write(string.format(
    "{RESULT_MARKER} requests=%d duration_us=%d p50=%d p90=%d p99=%d p999=%d max=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, p(50), p(90), p(99), p(99.9), math.floor(latency.max),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"#,
        method = run.method,
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Runs wrk (blocking) and returns its counts and percentiles; errors of
/// any kind (socket errors, non-2xx statuses, timeouts) are counted in
/// `errors`.
pub fn run(wrk: &Path, dir: &Path, run: &WrkRun) -> Result<Measurement> {
    let script = script(dir, run)?;
    let output = Command::new(wrk)
        .arg(format!("-t{}", run.threads))
        .arg(format!("-c{}", run.connections))
        .arg(format!("-d{}s", run.seconds))
        .arg("--timeout")
        .arg("10s")
        .arg("-s")
        .arg(&script)
        .arg(&run.url)
        .output()
        .with_context(|| format!("running {}", wrk.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find(|line| line.starts_with(RESULT_MARKER)) else {
        bail!(
            "wrk printed no result ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let fields: HashMap<&str, f64> = line
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .filter_map(|(name, value)| Some((name, value.parse().ok()?)))
        .collect();
    let get = |name: &str| {
        fields
            .get(name)
            .copied()
            .with_context(|| format!("no {name} in {line:?}"))
    };
    let errors = ["connect", "read", "write", "status", "timeout"]
        .iter()
        .map(|name| get(name))
        .sum::<Result<f64>>()?;
    Ok(Measurement {
        requests: get("requests")? as u64,
        errors: errors as u64,
        elapsed: Duration::from_micros(get("duration_us")? as u64),
        latency: Percentiles {
            p50: get("p50")?,
            p90: get("p90")?,
            p99: get("p99")?,
            p999: get("p999")?,
            max: get("max")?,
        },
        cpu_seconds: None,
        peak_rss_kib: None,
    })
}
