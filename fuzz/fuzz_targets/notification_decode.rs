//! KEYNOTIFY notifications come from the broker: any payload decodes to a
//! notification or an error, and a decoded one round-trips.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use statestore_gateway::protocol::Notification;

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    if let Ok(notification) = Notification::decode(&payload) {
        let again = Notification::decode(&Bytes::from(notification.encode()));
        assert_eq!(again.as_ref(), Ok(&notification));
    }
});
