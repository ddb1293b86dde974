//! Lease safety through the gateway's HTTP API: clients contend for one
//! lease (`PUT /keys/lock?nex=true&ttl=` acquires and renews, `DELETE
//! /keys/lock?value=<holder>` releases) with random pauses, some longer
//! than the lease. Each holder writes a fenced resource (the `counter`
//! key, `Fencing-Token:` the lease's version). From the versions the store
//! returned we rebuild the lease's history and the resource's, and check:
//! a new holder only ever got the lease after the previous one released it
//! or its TTL ran out, a holder whose lease was taken over gets 409, and
//! the writes the store applied carry strictly increasing fencing tokens.

use std::time::{Duration, Instant};

use rand::Rng as _;
use reqwest::StatusCode;
use statestore_gateway::protocol::Hlc;

use crate::support::gateway::{Gateway, Stack};

/// The lease's TTL.
const TTL: Duration = Duration::from_millis(300);

fn ttl_query() -> String {
    format!("ttl={}ms", TTL.as_millis())
}

/// The version in a response's ETag.
fn version(response: &reqwest::Response) -> Hlc {
    let etag = response.headers()["etag"].to_str().unwrap();
    Hlc::parse(etag.trim_matches('"')).unwrap()
}

/// `PUT lock?nex=true`: acquire, or renew while holding. The lease's new
/// version, or `None` when someone else holds it (412).
async fn acquire(gateway: &Gateway, holder: &str) -> Option<Hlc> {
    let response = gateway
        .http
        .put(format!("{}?nex=true&{}", gateway.key(b"lock"), ttl_query()))
        .body(holder.to_owned())
        .send()
        .await
        .unwrap();
    match response.status() {
        StatusCode::OK => Some(version(&response)),
        StatusCode::PRECONDITION_FAILED => None,
        other => panic!("acquire by {holder}: {other}"),
    }
}

/// `DELETE lock?value=holder`: the release's version, or `None` when the
/// lease is no longer ours (412: someone else's; 404: expired).
async fn release(gateway: &Gateway, holder: &str) -> Option<Hlc> {
    let response = gateway
        .http
        .delete(format!("{}?value={holder}", gateway.key(b"lock")))
        .send()
        .await
        .unwrap();
    match response.status() {
        StatusCode::NO_CONTENT => Some(version(&response)),
        StatusCode::PRECONDITION_FAILED | StatusCode::NOT_FOUND => None,
        other => panic!("release by {holder}: {other}"),
    }
}

/// Writes the fenced resource with `token`: `Ok(version)` when applied,
/// `Err(())` when refused as stale (409).
async fn write_counter(gateway: &Gateway, holder: &str, token: &Hlc) -> Result<Hlc, ()> {
    let response = gateway
        .http
        .put(gateway.key(b"counter"))
        .header("fencing-token", token.to_string())
        .body(format!("{holder} {token}"))
        .send()
        .await
        .unwrap();
    match response.status() {
        StatusCode::OK => Ok(version(&response)),
        StatusCode::CONFLICT => {
            let problem: serde_json::Value =
                serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
            assert_eq!(problem["type"], "/problems/fencing-token-outdated");
            Err(())
        }
        other => panic!("fenced write by {holder}: {other}"),
    }
}

/// What the store told one client.
#[derive(Debug, Default)]
struct History {
    /// Successful acquires and renewals: (holder, the lease's new version).
    lease_sets: Vec<(String, Hlc)>,
    /// Successful releases: (holder, the delete's version).
    releases: Vec<(String, Hlc)>,
    /// Applied writes: (holder, fencing token, the resource's new version).
    writes: Vec<(String, Hlc, Hlc)>,
    /// Writes refused as stale: (holder, fencing token).
    refused: Vec<(String, Hlc)>,
}

/// One client until `until`: acquire and write at once; then a few rounds
/// of renew, pause (0 to 1.5 TTL: work that may outlast the lease, a GC
/// pause, a slow disk) and write; then release. Each fencing token (the
/// lease's newest version) is used for one write only.
async fn contend(gateway: &Gateway, holder: String, until: Instant) -> History {
    let mut history = History::default();
    let pause = |max_ms: u64| Duration::from_millis(rand::rng().random_range(0..=max_ms));
    let ttl_ms = u64::try_from(TTL.as_millis()).unwrap();
    while Instant::now() < until {
        let Some(mut token) = acquire(gateway, &holder).await else {
            tokio::time::sleep(pause(ttl_ms / 6)).await;
            continue;
        };
        history.lease_sets.push((holder.clone(), token.clone()));
        let rounds = rand::rng().random_range(0..=3);
        let mut round = 0;
        let holding = loop {
            match write_counter(gateway, &holder, &token).await {
                Ok(version) => history
                    .writes
                    .push((holder.clone(), token.clone(), version)),
                Err(()) => {
                    history.refused.push((holder.clone(), token.clone()));
                    break false;
                }
            }
            if round == rounds {
                break true;
            }
            round += 1;
            match acquire(gateway, &holder).await {
                Some(renewed) => {
                    history.lease_sets.push((holder.clone(), renewed.clone()));
                    token = renewed;
                }
                None => break false,
            }
            tokio::time::sleep(pause(ttl_ms * 3 / 2)).await;
        };
        if holding && let Some(version) = release(gateway, &holder).await {
            history.releases.push((holder.clone(), version));
        }
        tokio::time::sleep(pause(ttl_ms / 6)).await;
    }
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_clients_never_hold_the_lease_together_and_stale_holders_are_fenced_off() {
    let stack = Stack::start().await;
    let gateway = &stack.gateway;
    let until = Instant::now() + Duration::from_secs(8);
    let clients = (0..6).map(|n| contend(gateway, format!("client-{n}"), until));
    let histories = futures_util::future::join_all(clients).await;
    let mut all = History::default();
    for history in histories {
        all.lease_sets.extend(history.lease_sets);
        all.releases.extend(history.releases);
        all.writes.extend(history.writes);
        all.refused.extend(history.refused);
    }
    eprintln!(
        "lease: {} acquires/renewals, {} releases, {} fenced writes applied, {} refused as stale",
        all.lease_sets.len(),
        all.releases.len(),
        all.writes.len(),
        all.refused.len()
    );

    // The lease's history in the store's order (its versions).
    enum Change {
        Set(String),
        Released(String),
    }
    let mut lease: Vec<(Hlc, Change)> = all
        .lease_sets
        .iter()
        .map(|(holder, version)| (version.clone(), Change::Set(holder.clone())))
        .chain(
            all.releases
                .iter()
                .map(|(holder, version)| (version.clone(), Change::Released(holder.clone()))),
        )
        .collect();
    lease.sort_by(|a, b| a.0.cmp(&b.0));
    let ttl_ms = u64::try_from(TTL.as_millis()).unwrap();
    // (holder, store time its lease runs out) while someone holds it.
    let mut current: Option<(String, u64)> = None;
    let mut takeovers = 0;
    for (version, change) in &lease {
        match change {
            Change::Set(holder) => {
                if let Some((previous, expires_at)) = &current
                    && previous != holder
                {
                    assert!(
                        version.wall_ms >= *expires_at,
                        "{holder} got the lease at {version} while {previous} held it until {expires_at}"
                    );
                    takeovers += 1;
                }
                current = Some((holder.clone(), version.wall_ms + ttl_ms));
            }
            Change::Released(holder) => {
                let previous = current.take().map(|(previous, _)| previous);
                assert_eq!(
                    previous.as_deref(),
                    Some(holder.as_str()),
                    "{holder} released at {version} a lease it did not hold"
                );
            }
        }
    }

    // The fenced resource's history in the store's order.
    all.writes.sort_by(|a, b| a.2.cmp(&b.2));
    for pair in all.writes.windows(2) {
        let ((first, older, _), (second, newer, at)) = (&pair[0], &pair[1]);
        assert!(
            newer > older,
            "the store applied {second}'s token {newer} (at {at}) after {first}'s {older}"
        );
    }
    let newest = all.writes.last().map(|(_, token, _)| token.clone());
    for (holder, token) in &all.refused {
        assert!(
            newest.as_ref().is_some_and(|newest| newest > token),
            "{holder}'s token {token} was refused though no newer token was applied"
        );
    }
    // The run exercised what it claims to.
    assert!(takeovers >= 5, "only {takeovers} changes of holder");
    assert!(!all.refused.is_empty(), "no stale holder tried to write");
    assert!(!all.releases.is_empty(), "no lease was released");
}

#[tokio::test]
async fn a_holder_whose_lease_ran_out_gets_409_and_cannot_renew_or_release() {
    let stack = Stack::start().await;
    let gateway = &stack.gateway;
    let old = acquire(gateway, "a").await.expect("a gets the free lease");
    write_counter(gateway, "a", &old).await.expect("a writes");
    assert!(
        acquire(gateway, "b").await.is_none(),
        "b waits while a holds"
    );

    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let new = acquire(gateway, "b")
        .await
        .expect("b gets the expired lease");
    assert!(new > old);
    write_counter(gateway, "b", &new).await.expect("b writes");

    // `a` still believes it holds the lease.
    assert_eq!(write_counter(gateway, "a", &old).await, Err(()));
    assert!(
        acquire(gateway, "a").await.is_none(),
        "a cannot renew b's lease"
    );
    assert!(
        release(gateway, "a").await.is_none(),
        "a cannot release b's lease"
    );
    let value = gateway
        .http
        .get(gateway.key(b"counter"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(value, format!("b {new}"));
    assert!(release(gateway, "b").await.is_some());
    assert!(acquire(gateway, "a").await.is_some(), "free again");
}
