//! The official Azure IoT Operations state store client
//! (`azure_iot_operations_services` 1.5, with its own MQTT session) as a
//! real peer of the emulator, the dev broker and the gateway's envelope.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::Arc;
use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionExitHandle, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::state_store;
use statestore_gateway::protocol::Hlc;

/// The SDK's clock value as ours, to compare versions.
pub fn hlc(version: &HybridLogicalClock) -> Hlc {
    Hlc::parse(&version.to_string()).unwrap()
}

/// How long closing may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// One SDK client with its session running in the background.
pub struct SdkClient {
    /// The state store client.
    pub client: Arc<state_store::Client>,
    exit: SessionExitHandle,
    session: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for SdkClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdkClient").finish_non_exhaustive()
    }
}

impl SdkClient {
    /// A client `client_id` on the plain-TCP broker at 127.0.0.1:`port`
    /// (clean start, 10 s keep-alive); its session connects in the
    /// background, as the SDK's own samples run it.
    pub fn connect(port: u16, client_id: &str) -> Self {
        let settings = MqttConnectionSettingsBuilder::default()
            .client_id(client_id)
            .hostname("127.0.0.1")
            .tcp_port(port)
            .keep_alive(Duration::from_secs(10))
            .clean_start(true)
            .use_tls(false)
            .build()
            .unwrap();
        let options = SessionOptionsBuilder::default()
            .connection_settings(settings)
            .build()
            .unwrap();
        let session = Session::new(options).unwrap();
        let client = state_store::Client::new(
            ApplicationContextBuilder::default().build().unwrap(),
            session.create_managed_client(),
            session.create_session_monitor(),
            state_store::ClientOptionsBuilder::default()
                .build()
                .unwrap(),
        )
        .unwrap();
        let exit = session.create_exit_handle();
        let session = tokio::spawn(async move {
            let _ = session.run().await;
        });
        Self {
            client: Arc::new(client),
            exit,
            session,
        }
    }

    /// Shuts the client down and ends its session (forcibly if the broker
    /// is gone), each step bounded.
    pub async fn close(self) {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.client.shutdown()).await;
        if self.exit.try_exit().is_err() {
            self.exit.force_exit();
        }
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.session).await;
    }
}

impl std::ops::Deref for SdkClient {
    type Target = state_store::Client;

    fn deref(&self) -> &state_store::Client {
        &self.client
    }
}

/// How long each call of [`Calls`] waits for the store.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The SDK client's calls without a fencing token, bounded by
/// [`CALL_TIMEOUT`] and expected to succeed (a test that expects an error
/// calls the client itself).
pub trait Calls {
    /// `set`.
    fn set_ok(
        &self,
        key: &[u8],
        value: &[u8],
        options: state_store::SetOptions,
    ) -> impl Future<Output = state_store::Response<bool>>;
    /// `get`.
    fn get_ok(&self, key: &[u8]) -> impl Future<Output = state_store::Response<Option<Vec<u8>>>>;
    /// `del`.
    fn del_ok(&self, key: &[u8]) -> impl Future<Output = state_store::Response<i64>>;
    /// `vdel`.
    fn vdel_ok(&self, key: &[u8], value: &[u8])
    -> impl Future<Output = state_store::Response<i64>>;
}

impl Calls for state_store::Client {
    async fn set_ok(
        &self,
        key: &[u8],
        value: &[u8],
        options: state_store::SetOptions,
    ) -> state_store::Response<bool> {
        self.set(key.to_vec(), value.to_vec(), CALL_TIMEOUT, None, options)
            .await
            .unwrap()
    }

    async fn get_ok(&self, key: &[u8]) -> state_store::Response<Option<Vec<u8>>> {
        self.get(key.to_vec(), CALL_TIMEOUT).await.unwrap()
    }

    async fn del_ok(&self, key: &[u8]) -> state_store::Response<i64> {
        self.del(key.to_vec(), None, CALL_TIMEOUT).await.unwrap()
    }

    async fn vdel_ok(&self, key: &[u8], value: &[u8]) -> state_store::Response<i64> {
        self.vdel(key.to_vec(), value.to_vec(), None, CALL_TIMEOUT)
            .await
            .unwrap()
    }
}
