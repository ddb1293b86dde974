//! Dev mode: an MQTT5 broker, the state store emulator and the gateway in
//! one process, so `cargo run --release -- dev` is all a laptop needs.
//!
//! The broker (rmqtt) sits behind the cargo feature `embedded-broker`, on by
//! default; the container image is built without it and `dev` then says so.

use crate::cli::dev::DevArgs;

mod banner;
#[cfg(feature = "embedded-broker")]
mod broker;
mod error;
#[cfg(feature = "embedded-broker")]
mod stack;

pub use banner::banner;
#[cfg(feature = "embedded-broker")]
pub use broker::{EmbeddedBroker, MAX_INFLIGHT, MAX_QUEUED_PER_CLIENT};
pub use error::DevError;
#[cfg(feature = "embedded-broker")]
pub use stack::{DevStack, READY_TIMEOUT};

/// Runs dev mode until SIGTERM or Ctrl-C: starts everything, prints where
/// it listens, then stops it all in reverse order.
pub async fn run(args: DevArgs) -> Result<(), DevError> {
    #[cfg(feature = "embedded-broker")]
    {
        let stack = DevStack::start(&args).await?;
        println!("{}", stack.banner());
        stack.run_until(crate::http::termination_signal()).await
    }
    #[cfg(not(feature = "embedded-broker"))]
    {
        let _ = args;
        Err(DevError::NoEmbeddedBroker)
    }
}

#[cfg(all(test, not(feature = "embedded-broker")))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_the_feature_dev_says_it_was_built_without_the_broker() {
        let args = DevArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            broker_listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: None,
        };
        let error = run(args).await.unwrap_err();
        assert!(matches!(error, DevError::NoEmbeddedBroker));
        assert!(error.to_string().contains("embedded-broker"));
    }
}
