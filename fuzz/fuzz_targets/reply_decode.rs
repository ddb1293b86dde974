//! Replies come from the broker: any payload decodes to a reply or an
//! error, and a decoded reply encodes to one that decodes the same.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use statestore_gateway::protocol::Reply;
use statestore_gateway::protocol::resp::Frame;

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    let _ = Frame::decode(&payload);
    if let Ok(reply) = Reply::decode(&payload) {
        let again = Reply::decode(&Bytes::from(reply.encode()));
        assert_eq!(again.as_ref(), Ok(&reply), "re-encoded {reply:?}");
    }
});
