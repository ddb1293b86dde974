//! SCAN replies come from the broker: any payload decodes to a page, an
//! error or a decode error without allocating for keys that did not
//! arrive, and a decoded reply encodes to one that decodes the same.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use statestore_gateway::protocol::ScanReply;

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    if let Ok(reply) = ScanReply::decode(&payload) {
        let encoded = reply.encode();
        if let ScanReply::Page(page) = &reply {
            assert_eq!(page.encoded_len(), encoded.len());
            // Lengths may be written with leading zeros, never shorter.
            assert!(encoded.len() <= data.len());
        }
        let again = ScanReply::decode(&Bytes::from(encoded));
        assert_eq!(again.as_ref(), Ok(&reply), "re-encoded {reply:?}");
    }
});
