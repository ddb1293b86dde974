//! The `statestore-gateway` binary: parse the command line, run the subcommand.

use anyhow::Context as _;
use clap::Parser;
use statestore_gateway::config::{Cli, Command, EmulatorArgs};
use statestore_gateway::emulator::{AccessList, Emulator, EmulatorConfig};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(_) => anyhow::bail!("serve is not built yet"),
        Command::Emulator(args) => {
            init_logging();
            let config = emulator_config(args)?;
            tokio::runtime::Runtime::new()?.block_on(run_emulator(config))
        }
        Command::Dev(_) => anyhow::bail!("dev is not built yet"),
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`); `LOG_FORMAT=json`
/// for one JSON object per line.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("LOG_FORMAT").is_ok_and(|format| format == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn emulator_config(args: EmulatorArgs) -> anyhow::Result<EmulatorConfig> {
    let mut config = EmulatorConfig::new(args.broker.host, args.broker.port);
    config.client_id = args.client_id;
    config.username = args.username;
    if let Some(path) = &args.password_file {
        let password = std::fs::read_to_string(path)
            .with_context(|| format!("reading the password file {}", path.display()))?;
        config.password = Some(password.trim_end_matches(['\r', '\n']).to_owned());
    }
    config.data_dir = args.data_dir;
    config.max_keys = args.max_keys;
    config.max_bytes = args.max_bytes;
    if let Some(path) = &args.acl {
        config.acl = Some(AccessList::load(path)?);
    }
    Ok(config)
}

/// Serves until SIGTERM or Ctrl-C, then disconnects cleanly.
async fn run_emulator(config: EmulatorConfig) -> anyhow::Result<()> {
    let mut emulator = Emulator::start(config).await?;
    let stopped = tokio::select! {
        () = shutdown_signal() => None,
        result = emulator.stopped() => Some(result),
    };
    match stopped {
        None => emulator.shutdown().await?,
        Some(result) => result?,
    }
    Ok(())
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}
