//! A fixed-rate HTTP load (wrk2 is not in Debian): a few keep-alive
//! connections, each sending on its own tick, so the gateway's CPU time over
//! the window is its cost at that rate.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::time::MissedTickBehavior;

use super::http::HttpConn;
use super::stats::{Measurement, Percentiles};

/// `rate` GETs of `path` per second for `duration`, spread over
/// `connections`; latency is from each request's send.
pub async fn fixed_rate(
    addr: SocketAddr,
    path: &str,
    rate: u32,
    duration: Duration,
    connections: u32,
) -> Result<Measurement> {
    if rate == 0 || connections == 0 {
        bail!("a fixed-rate load needs a rate and connections");
    }
    let period = Duration::from_secs_f64(f64::from(connections) / f64::from(rate));
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::new();
    for index in 0..connections {
        let path = path.to_owned();
        let mut conn = HttpConn::connect(addr).await?;
        // Spread the connections' ticks over one period.
        let offset = period.mul_f64(f64::from(index) / f64::from(connections));
        workers.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            loop {
                ticks.tick().await;
                if Instant::now() >= deadline {
                    break;
                }
                let sent = Instant::now();
                match conn.request("GET", &path, b"").await {
                    Ok(response) if response.status == 200 => latencies.push(sent.elapsed()),
                    Ok(_) => errors += 1,
                    Err(_) => {
                        errors += 1;
                        conn = HttpConn::connect(addr).await?;
                    }
                }
            }
            anyhow::Ok((latencies, errors))
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (mut samples, failed) = worker.await.context("a load worker panicked")??;
        latencies.append(&mut samples);
        errors += failed;
    }
    Ok(Measurement {
        requests: latencies.len() as u64,
        errors,
        elapsed: started.elapsed(),
        latency: Percentiles::of(&mut latencies),
        cpu_seconds: None,
        peak_rss_kib: None,
    })
}
