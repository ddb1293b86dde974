//! Files named by the settings: secret files, read by one rule, and files
//! read again when they change.

pub mod reloading;
pub mod secret;
