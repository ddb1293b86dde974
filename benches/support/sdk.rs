//! The official AIO state store client (azure_iot_operations_services) as
//! a benchmark peer, on the same broker and store as the gateway.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_services::state_store;

/// The official client, with its session running in the background.
pub struct Sdk {
    /// The client.
    pub client: state_store::Client,
    exit: azure_iot_operations_mqtt::session::SessionExitHandle,
    session: tokio::task::JoinHandle<()>,
}

impl Sdk {
    /// Connects as `bench-sdk`; returns once a request gets an answer.
    pub async fn connect(port: u16) -> Result<Sdk> {
        let settings = MqttConnectionSettingsBuilder::default()
            .client_id("bench-sdk")
            .hostname("127.0.0.1")
            .tcp_port(port)
            .keep_alive(Duration::from_secs(10))
            .clean_start(true)
            .use_tls(false)
            .build()?;
        let options = SessionOptionsBuilder::default()
            .connection_settings(settings)
            .build()?;
        let session =
            Session::new(options).map_err(|error| anyhow::anyhow!("SDK session: {error:?}"))?;
        let client = state_store::Client::new(
            ApplicationContextBuilder::default().build()?,
            session.create_managed_client(),
            session.create_session_monitor(),
            state_store::ClientOptionsBuilder::default().build()?,
        )?;
        let exit = session.create_exit_handle();
        let session = tokio::spawn(async move {
            let _ = session.run().await;
        });
        let sdk = Sdk {
            client,
            exit,
            session,
        };
        // Connected once a request gets an answer.
        let deadline = Instant::now() + Duration::from_secs(15);
        while sdk
            .client
            .get(b"bench-probe".to_vec(), Duration::from_secs(1))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                bail!("the official client got no answer within 15 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(sdk)
    }

    /// Every key, with `list_keys`.
    pub async fn list_all(&self) -> Result<Vec<Vec<u8>>> {
        let mut pager = self
            .client
            .list_keys(b"*".to_vec(), Duration::from_secs(10))
            .map_err(|error| anyhow::anyhow!("list_keys: {error:?}"))?;
        let mut keys = Vec::new();
        while let Some(page) = pager
            .next()
            .await
            .map_err(|error| anyhow::anyhow!("list_keys page: {error:?}"))?
        {
            keys.extend(page);
        }
        Ok(keys)
    }

    /// Shuts the client and its session down.
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.shutdown()).await;
        if self.exit.try_exit().is_err() {
            self.exit.force_exit();
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), self.session).await;
    }
}
