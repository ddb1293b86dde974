//! What the subcommands' arguments share: the log format and the value
//! parsers (one syntax for every duration and count).

use std::time::Duration;

use clap::ValueEnum;

use crate::settings;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

pub(super) fn parse_any_duration(text: &str) -> Result<Duration, String> {
    settings::parse_duration(text).map_err(|error| error.to_string())
}

pub(super) fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match settings::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be more than zero".into()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

pub(super) fn parse_positive_usize(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(error) => Err(format!("{text:?} is not a whole number: {error}")),
    }
}
