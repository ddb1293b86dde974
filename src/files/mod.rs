//! Files named by the settings: secret files, read by one rule.

pub mod secret;
