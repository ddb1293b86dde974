#![forbid(unsafe_code)]
//! statestore-gateway
