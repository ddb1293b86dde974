//! The official Azure IoT Operations Rust client (`azure_iot_operations_services`
//! 1.5, with its own MQTT session) against the emulator on mosquitto: the
//! proof that the emulator speaks the protocol the real SDKs expect.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::Duration;

use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::leased_lock::{self, lease};
use azure_iot_operations_services::state_store::{
    self, ErrorKind, KeyObservation, Operation, ServiceError, SetCondition, SetOptions,
};

use crate::support::Mosquitto;
use crate::support::emulator::start_emulator;
use crate::support::sdk::{Calls as _, SdkClient, hlc};

const TIMEOUT: Duration = Duration::from_secs(5);

fn service_error(error: &state_store::Error) -> &ServiceError {
    match error.kind() {
        ErrorKind::ServiceError(service) => service,
        other => panic!("not a service error: {other:?}"),
    }
}

async fn next_notification(observation: &mut KeyObservation) -> state_store::KeyNotification {
    tokio::time::timeout(TIMEOUT, observation.recv_notification())
        .await
        .expect("a notification in time")
        .expect("the observation is open")
        .0
}

#[tokio::test]
async fn official_client_sets_gets_deletes_with_conditions() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let sdk = SdkClient::connect(broker.port(), "sdk-basic");
    let client = &sdk.client;
    let key = b"sdk-key".to_vec();

    let set = client.set_ok(&key, b"v1", SetOptions::default()).await;
    assert!(set.response);
    let set_version = set.version.expect("SET returns a version");
    assert_eq!(set_version.node_id, "StateStore");

    let get = client.get_ok(&key).await;
    assert_eq!(get.response, Some(b"v1".to_vec()));
    assert_eq!(get.version.as_ref().map(hlc), Some(hlc(&set_version)));

    let only_if_missing = SetOptions {
        set_condition: SetCondition::OnlyIfDoesNotExist,
        ..SetOptions::default()
    };
    let nx = client.set_ok(&key, b"v2", only_if_missing.clone()).await;
    assert!(!nx.response, "NX on an existing key is not applied");
    let if_equal = SetOptions {
        set_condition: SetCondition::OnlyIfEqualOrDoesNotExist,
        ..SetOptions::default()
    };
    let nex_same = client.set_ok(&key, b"v1", if_equal.clone()).await;
    assert!(nex_same.response, "NEX with the same value is applied");
    let nex_other = client.set_ok(&key, b"v3", if_equal).await;
    assert!(!nex_other.response, "NEX with another value is not applied");

    let vdel = client.vdel_ok(&key, b"nope").await;
    assert_eq!(vdel.response, -1);
    let vdel = client.vdel_ok(&key, b"v1").await;
    assert_eq!(vdel.response, 1);
    assert_eq!(client.del_ok(&key).await.response, 0);
    let get = client.get_ok(&key).await;
    assert_eq!(get.response, None);
    assert!(get.version.is_none());

    let nx = client.set_ok(&key, b"v4", only_if_missing).await;
    assert!(nx.response, "NX on a missing key is applied");
    assert_eq!(client.del_ok(&key).await.response, 1);

    // Binary key, empty value, persistence flag.
    let binary: Vec<u8> = (0..=255).collect();
    let persist = SetOptions {
        persist: true,
        ..SetOptions::default()
    };
    assert!(client.set_ok(&binary, b"", persist).await.response);
    assert_eq!(client.get_ok(&binary).await.response, Some(Vec::new()));
    sdk.close().await;
}

#[tokio::test]
async fn official_client_meets_fencing_tokens() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let sdk = SdkClient::connect(broker.port(), "sdk-fencing");
    let client = &sdk.client;
    let key = b"protected".to_vec();

    let first_token = HybridLogicalClock::new();
    let older = HybridLogicalClock {
        timestamp: first_token.timestamp - Duration::from_secs(5),
        ..first_token.clone()
    };
    let set = client
        .set(
            key.clone(),
            b"1".to_vec(),
            TIMEOUT,
            Some(first_token.clone()),
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set.response);

    let required = client
        .set(
            key.clone(),
            b"2".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(
        service_error(&required),
        ServiceError::MissingFencingToken
    ));
    let stale = client
        .set(
            key.clone(),
            b"2".to_vec(),
            TIMEOUT,
            Some(older.clone()),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(
        service_error(&stale),
        ServiceError::FencingTokenLowerVersion
    ));

    // A newer token (the key's own version) is accepted and now required.
    let newer = set.version.unwrap();
    let set = client
        .set(
            key.clone(),
            b"3".to_vec(),
            TIMEOUT,
            Some(newer.clone()),
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set.response);
    let stale = client
        .set(
            key.clone(),
            b"4".to_vec(),
            TIMEOUT,
            Some(first_token),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(
        service_error(&stale),
        ServiceError::FencingTokenLowerVersion
    ));

    let del = client.del(key.clone(), None, TIMEOUT).await.unwrap_err();
    assert!(matches!(
        service_error(&del),
        ServiceError::MissingFencingToken
    ));
    let vdel = client
        .vdel(key.clone(), b"3".to_vec(), Some(older), TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(
        service_error(&vdel),
        ServiceError::FencingTokenLowerVersion
    ));
    // GET needs no token.
    let get = client.get_ok(&key).await;
    assert_eq!(get.response, Some(b"3".to_vec()));
    let del = client.del(key, Some(newer), TIMEOUT).await.unwrap();
    assert_eq!(del.response, 1);
    sdk.close().await;
}

#[tokio::test]
async fn official_client_observes_sets_deletes_and_expiry_then_unobserves() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let watcher = SdkClient::connect(broker.port(), "sdk-watcher");
    let writer = SdkClient::connect(broker.port(), "sdk-writer");
    let key = b"observed".to_vec();

    let mut observation = watcher
        .client
        .observe(key.clone(), TIMEOUT)
        .await
        .unwrap()
        .response;

    let set = writer
        .client
        .set_ok(&key, b"v1", SetOptions::default())
        .await;
    let notification = next_notification(&mut observation).await;
    assert_eq!(notification.key, key);
    assert_eq!(notification.operation, Operation::Set(b"v1".to_vec()));
    assert_eq!(hlc(&notification.version), hlc(&set.version.unwrap()));

    let del = writer.client.del_ok(&key).await;
    assert_eq!(del.response, 1);
    let notification = next_notification(&mut observation).await;
    assert_eq!(notification.operation, Operation::Del);
    assert_eq!(hlc(&notification.version), hlc(&del.version.unwrap()));

    // Expiry: a SET with PX, then the delete notification without any read.
    let expiring = SetOptions {
        expires: Some(Duration::from_millis(400)),
        ..SetOptions::default()
    };
    let set = writer.client.set_ok(&key, b"short", expiring).await;
    let notification = next_notification(&mut observation).await;
    assert_eq!(notification.operation, Operation::Set(b"short".to_vec()));
    let notification = next_notification(&mut observation).await;
    assert_eq!(notification.operation, Operation::Del);
    assert!(hlc(&notification.version) > hlc(&set.version.unwrap()));
    assert_eq!(writer.client.get_ok(&key).await.response, None);

    let unobserved = watcher
        .client
        .unobserve(key.clone(), TIMEOUT)
        .await
        .unwrap();
    assert!(unobserved.response);
    let again = watcher
        .client
        .unobserve(key.clone(), TIMEOUT)
        .await
        .unwrap();
    assert!(
        !again.response,
        "unobserving twice reports it was not observed"
    );
    // Observing again works after an unobserve.
    let mut observation = watcher
        .client
        .observe(key.clone(), TIMEOUT)
        .await
        .unwrap()
        .response;
    writer
        .client
        .set_ok(&key, b"v2", SetOptions::default())
        .await;
    let notification = next_notification(&mut observation).await;
    assert_eq!(notification.operation, Operation::Set(b"v2".to_vec()));

    watcher.close().await;
    writer.close().await;
}

#[tokio::test]
async fn official_lease_client_acquires_renews_and_releases() {
    let broker = Mosquitto::start().await;
    let _emulator = start_emulator(&broker).await;
    let first = SdkClient::connect(broker.port(), "sdk-holder-1");
    let second = SdkClient::connect(broker.port(), "sdk-holder-2");
    let lease_name = b"the-lease".to_vec();
    let lease1 = lease::Client::new(
        first.client.clone(),
        lease_name.clone(),
        b"holder-1".to_vec(),
    )
    .unwrap();
    let lease2 = lease::Client::new(
        second.client.clone(),
        lease_name.clone(),
        b"holder-2".to_vec(),
    )
    .unwrap();

    let token = lease1
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .unwrap();
    assert_eq!(
        lease2.get_holder(TIMEOUT).await.unwrap(),
        Some(b"holder-1".to_vec())
    );
    let refused = lease2
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .unwrap_err();
    assert!(matches!(
        refused.kind(),
        leased_lock::ErrorKind::LeaseAlreadyHeld
    ));

    // Renewing is acquiring again; the token moves forward.
    let renewed = lease1
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .unwrap();
    assert!(hlc(&renewed) > hlc(&token));

    // The token fences a protected key.
    let protected = b"guarded".to_vec();
    assert!(
        first
            .client
            .set(
                protected.clone(),
                b"by-1".to_vec(),
                TIMEOUT,
                Some(renewed.clone()),
                SetOptions::default(),
            )
            .await
            .unwrap()
            .response
    );
    let stale = second
        .client
        .set(
            protected,
            b"by-2".to_vec(),
            TIMEOUT,
            Some(token),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(
        service_error(&stale),
        ServiceError::FencingTokenLowerVersion
    ));

    lease1.release(TIMEOUT).await.unwrap();
    assert_eq!(lease2.get_holder(TIMEOUT).await.unwrap(), None);

    // Auto-renewal keeps a short lease alive past its expiry.
    let token2 = lease2
        .acquire(
            Duration::from_secs(1),
            TIMEOUT,
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert_eq!(
        lease1.get_holder(TIMEOUT).await.unwrap(),
        Some(b"holder-2".to_vec())
    );
    let current = lease2.current_lease_fencing_token().expect("still held");
    assert!(hlc(&current) > hlc(&token2));
    lease2.release(TIMEOUT).await.unwrap();
    assert_eq!(lease1.get_holder(TIMEOUT).await.unwrap(), None);

    first.close().await;
    second.close().await;
}
