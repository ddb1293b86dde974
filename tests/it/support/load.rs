//! A steady write load on a gateway's key API: paced writers, each PUTting
//! a fresh key per request and recording how every request ended.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::gateway::{encode, http_client};

/// How one request ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The key written (fresh for every request).
    pub key: Vec<u8>,
    /// The value written.
    pub value: String,
    /// When the request was sent.
    pub started: Instant,
    /// How long until the answer (or the client-side error).
    pub elapsed: Duration,
    /// The HTTP status, or why no response came.
    pub result: Result<u16, String>,
}

/// Writers running until [`WriteLoad::stop`].
#[derive(Debug)]
pub struct WriteLoad {
    stop: watch::Sender<bool>,
    writers: Vec<JoinHandle<Vec<Outcome>>>,
}

impl WriteLoad {
    /// `writers` writers, each sending one PUT every `period` (or as soon
    /// as the previous one is answered, if that takes longer) to
    /// `api`, keys `<prefix>/<writer>/<n>`; each request gives up on the
    /// client side after `client_timeout`.
    pub fn start(
        api: SocketAddr,
        prefix: &str,
        writers: usize,
        period: Duration,
        client_timeout: Duration,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let http = http_client();
        let writers = (0..writers)
            .map(|writer| {
                let http = http.clone();
                let mut stopped = stopped.clone();
                let prefix = prefix.to_owned();
                tokio::spawn(async move {
                    let mut outcomes = Vec::new();
                    // Spread the writers over the period.
                    let offset = period.mul_f64(rand::random::<f64>());
                    tokio::time::sleep(offset).await;
                    for n in 0u64.. {
                        if *stopped.borrow() {
                            break;
                        }
                        let key = format!("{prefix}/{writer}/{n}").into_bytes();
                        let value = format!("value-{writer}-{n}");
                        let url = format!("http://{api}/keys/{}", encode(&key));
                        let started = Instant::now();
                        let result = http
                            .put(url)
                            .body(value.clone())
                            .timeout(client_timeout)
                            .send()
                            .await
                            .map(|response| response.status().as_u16())
                            .map_err(|error| format!("{error:?}"));
                        outcomes.push(Outcome {
                            key,
                            value,
                            started,
                            elapsed: started.elapsed(),
                            result,
                        });
                        let next = tokio::time::Instant::from_std(started + period);
                        tokio::select! {
                            () = tokio::time::sleep_until(next) => {}
                            _ = stopped.wait_for(|stop| *stop) => break,
                        }
                    }
                    outcomes
                })
            })
            .collect();
        Self { stop, writers }
    }

    /// Stops the writers and returns every outcome, in no particular order.
    pub async fn stop(self) -> Vec<Outcome> {
        self.stop.send_replace(true);
        let mut outcomes = Vec::new();
        for writer in self.writers {
            outcomes.extend(writer.await.expect("a writer task"));
        }
        outcomes
    }
}

/// Requests per status (`error` for no response), for assertion messages.
pub fn tally(outcomes: &[Outcome]) -> BTreeMap<String, usize> {
    let mut tally = BTreeMap::new();
    for outcome in outcomes {
        let name = match &outcome.result {
            Ok(status) => status.to_string(),
            Err(_) => "error".to_owned(),
        };
        *tally.entry(name).or_default() += 1;
    }
    tally
}
