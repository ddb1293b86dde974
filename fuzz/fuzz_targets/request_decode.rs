//! The emulator decodes whatever clients publish: any payload gives a
//! request or one of the service's documented errors, and a decoded
//! request round-trips.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use statestore_gateway::protocol::{Request, StoreError};

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    match Request::decode(&payload) {
        Ok(request) => {
            match &request {
                Request::Scan { pattern, .. } => assert!(!pattern.is_empty()),
                _ => assert!(request.key().is_some_and(|key| !key.is_empty())),
            }
            let again = Request::decode(&Bytes::from(request.encode()));
            assert_eq!(again.as_ref(), Ok(&request));
        }
        Err(error) => assert!(StoreError::KNOWN.contains(&error), "{error:?}"),
    }
});
