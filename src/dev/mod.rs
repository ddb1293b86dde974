//! Dev mode: an MQTT5 broker, the state store emulator and the gateway in
//! one process, so `cargo run --release -- dev` is all a laptop needs.
//!
//! The broker (rmqtt) sits behind the cargo feature `embedded-broker`, on by
//! default; the container image is built without it and `dev` then says so.
//!
//! - `settings`: [`DevSettings`], what dev mode listens on and where it
//!   keeps its data.
//! - `broker`: the embedded MQTT5 broker.
//! - `stack`: the broker, emulator and gateway, started in order and
//!   stopped in reverse.
//! - `banner`: what `dev` prints once it serves.
//! - `error`: [`DevError`], why dev mode could not start or stopped.

mod banner;
#[cfg(feature = "embedded-broker")]
mod broker;
mod error;
mod settings;
#[cfg(feature = "embedded-broker")]
mod stack;

pub use banner::banner;
#[cfg(feature = "embedded-broker")]
pub use broker::{EmbeddedBroker, MAX_INFLIGHT, MAX_QUEUED_PER_CLIENT};
pub use error::DevError;
pub use settings::DevSettings;
#[cfg(feature = "embedded-broker")]
pub use stack::{DevStack, READY_TIMEOUT};

/// Runs dev mode until SIGTERM or Ctrl-C: starts everything, prints where
/// it listens, then stops it all in reverse order.
pub async fn run(settings: DevSettings) -> Result<(), DevError> {
    #[cfg(feature = "embedded-broker")]
    {
        let stack = DevStack::start(&settings).await?;
        println!("{}", stack.banner());
        stack.run_until(crate::http::termination_signal()).await
    }
    #[cfg(not(feature = "embedded-broker"))]
    {
        let _ = settings;
        Err(DevError::NoEmbeddedBroker)
    }
}

#[cfg(all(test, not(feature = "embedded-broker")))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_the_feature_dev_says_it_was_built_without_the_broker() {
        let settings = DevSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            broker_listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: None,
            dapr: Default::default(),
        };
        let error = run(settings).await.unwrap_err();
        assert!(matches!(error, DevError::NoEmbeddedBroker));
        assert!(error.to_string().contains("embedded-broker"));
    }
}
