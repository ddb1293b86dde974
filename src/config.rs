//! Command-line and environment settings for each subcommand.
//!
//! Every flag has an environment fallback whose name is a constant here, so
//! the Helm chart, the manifests and the README can name them exactly.

use clap::{Args, Parser, Subcommand};

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "statestore-gateway", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP key and watch API over a pool of MQTT5 connections.
    Serve(ServeArgs),
    /// Serve the state store protocol as an MQTT5 client of a broker.
    Emulator(EmulatorArgs),
    /// Embedded broker + emulator + gateway in one process, for laptops.
    Dev(DevArgs),
}

/// Settings of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {}

/// Settings of `emulator`.
#[derive(Debug, Clone, Args)]
pub struct EmulatorArgs {}

/// Settings of `dev`.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {}
