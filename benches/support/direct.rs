//! The baseline: the gateway's own pool (`statestore_gateway::mqtt::Pool`)
//! used directly from this process, without HTTP, against the same broker
//! and emulator. What the gateway adds is its figures minus these.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use statestore_gateway::metrics::Metrics;
use statestore_gateway::mqtt::{BrokerSettings, Pool, PoolSettings, RequestOptions};
use statestore_gateway::protocol::{Reply, Request, SetOptions};

use super::proc_fs::{clock_ticks_per_second, own_cpu_ticks};
use super::stats::{Measurement, Percentiles};

/// A GET or a SET of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `GET /keys/k` / store GET.
    Get,
    /// `PUT /keys/k` / store SET.
    Set,
}

impl Op {
    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "GET",
            Op::Set => "SET",
        }
    }
}

/// A pool like the gateway's: same size and in-flight window as `serve`'s
/// defaults (4 members, 256 in flight each).
pub async fn start_pool(broker_port: u16, pool_size: usize) -> Result<Pool> {
    let mut settings = PoolSettings::new(
        BrokerSettings::new("127.0.0.1", broker_port),
        "bench-direct",
    );
    settings.size = pool_size;
    settings.max_in_flight_per_member = 256;
    settings.slot_wait = Duration::from_secs(1);
    let pool = Pool::start(settings, Metrics::new()).context("starting the direct pool")?;
    let deadline = Instant::now() + Duration::from_secs(15);
    // Ready once every member can carry requests and the emulator answers.
    loop {
        let probe = Request::Get {
            key: Bytes::from_static(b"bench-probe"),
        };
        if pool.is_ready()
            && let Ok(response) = pool
                .request(&probe, &RequestOptions::default(), |response| response)
                .await
            && matches!(response.reply, Reply::NotFound | Reply::Value(_))
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("the direct pool got no answer from the emulator within 15 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the remaining members subscribe too.
    if pool_size > 1 {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(pool)
}

/// The store request for `op` on `key` (SET writes `value`).
pub fn request(op: Op, key: &str, value: &Bytes) -> Request {
    let key = Bytes::copy_from_slice(key.as_bytes());
    match op {
        Op::Get => Request::Get { key },
        Op::Set => Request::Set {
            key,
            value: value.clone(),
            options: SetOptions::default(),
        },
    }
}

/// One request; false when it failed or the reply is not the expected one.
async fn one(pool: &Pool, request: &Request, value_len: usize) -> bool {
    match pool
        .request(request, &RequestOptions::default(), |response| response)
        .await
    {
        Ok(response) => match (request, response.reply) {
            (Request::Set { .. }, Reply::Ok) => true,
            (Request::Get { .. }, Reply::Value(value)) => value.len() == value_len,
            _ => false,
        },
        Err(_) => false,
    }
}

/// `concurrency` requests kept in flight (1: sequential) for `duration`.
pub async fn measure(
    pool: &Pool,
    request: Request,
    value_len: usize,
    concurrency: usize,
    duration: Duration,
) -> Result<Measurement> {
    let request = Arc::new(request);
    let cpu_before = own_cpu_ticks()?;
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let pool = pool.clone();
            let request = request.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(64 * 1024);
                let mut errors = 0u64;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    if one(&pool, &request, value_len).await {
                        latencies.push(sent.elapsed());
                    } else {
                        errors += 1;
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (mut samples, failed) = worker.await.context("a direct worker panicked")?;
        latencies.append(&mut samples);
        errors += failed;
    }
    let elapsed = started.elapsed();
    let cpu_ticks = own_cpu_ticks()? - cpu_before;
    Ok(Measurement {
        requests: latencies.len() as u64,
        errors,
        elapsed,
        latency: Percentiles::of(&mut latencies),
        cpu_seconds: Some(cpu_ticks as f64 / clock_ticks_per_second() as f64),
        peak_rss_kib: None,
    })
}
