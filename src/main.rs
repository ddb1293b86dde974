//! The `statestore-gateway` binary: parse the command line, run the subcommand.

use clap::Parser;
use statestore_gateway::config::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(_) => anyhow::bail!("serve is not built yet"),
        Command::Emulator(_) => anyhow::bail!("emulator is not built yet"),
        Command::Dev(_) => anyhow::bail!("dev is not built yet"),
    }
}
