//! Integration tests: one binary, real broker, real sockets.
//!
//! One way to start the stack: `Stack::start()` for the defaults,
//! `Stack::builder()` for anything else (broker settings, the emulator's
//! configuration or a scripted store, the gateway's options). Requests on
//! keys go through the typed helpers on `Gateway` (`gw.put`, `gw.get`,
//! `gw.at(key).query(..).header(..).put(..)`, `json`, `problem`, `etag`),
//! the official client's through `support::sdk::Calls`.

// Test helpers may unwrap: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

mod admin;
mod auth;
mod authz;
mod batch;
mod browser;
mod client_ids;
mod dapr;
mod dapr_config;
mod dapr_limits;
mod dapr_outbox;
mod docs;
mod emulator;
mod faults;
mod hostile;
mod inject;
mod jwt;
mod keys;
mod leaks;
mod lease;
mod linearizability;
mod listing;
mod locks;
mod modules;
mod official_client;
mod pattern_watch;
mod pool;
mod pubsub;
mod pubsub_delivery;
mod readme;
mod scan;
mod settings_table;
mod tls;
mod trace;
mod watch;

mod broker {
    use crate::support::Mosquitto;

    #[tokio::test]
    async fn mosquitto_starts_restarts_and_accepts_connections() {
        let mut broker = Mosquitto::start().await;
        assert!(tokio::net::TcpStream::connect(broker.addr).await.is_ok());
        broker.kill();
        assert!(tokio::net::TcpStream::connect(broker.addr).await.is_err());
        broker.restart().await;
        assert!(tokio::net::TcpStream::connect(broker.addr).await.is_ok());
    }
}

mod dev;
