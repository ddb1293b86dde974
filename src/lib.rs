#![forbid(unsafe_code)]
//! statestore-gateway: the Azure IoT Operations state store over HTTP.
//!
//! - [`protocol`]: the wire protocol (payload codec, topics, HLC, errors).

pub mod protocol;
