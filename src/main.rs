//! The `statestore-gateway` binary: parse the command line, run the subcommand.

use anyhow::Context as _;
use clap::Parser;
use statestore_gateway::config::{Cli, Command, EmulatorArgs, LogFormat, ServeArgs};
use statestore_gateway::emulator::{AccessList, Emulator, EmulatorConfig};
use statestore_gateway::http::{Server, termination_signal};
use statestore_gateway::metrics::Metrics;

/// Exit code for a setting that parsed but cannot be used (clap uses the
/// same for the ones that do not parse).
const EXIT_BAD_SETTING: i32 = 2;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Emulator(args) => {
            init_logging();
            let config = emulator_config(args)?;
            tokio::runtime::Runtime::new()?.block_on(run_emulator(config))
        }
        Command::Dev(_) => anyhow::bail!("dev is not built yet"),
    }
}

/// `serve`: the gateway until SIGTERM/SIGINT, then a graceful drain; exit 0.
fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    let settings = match args.settings() {
        Ok(settings) => settings,
        Err(error) => {
            // Nothing has started yet: exiting here leaves nothing behind.
            eprintln!("statestore-gateway: {error}");
            std::process::exit(EXIT_BAD_SETTING);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let server = Server::start(settings, Metrics::new()).await?;
        server.run_until(termination_signal()).await
    })?;
    Ok(())
}

/// Logs to stderr, as text or one JSON object per line; `RUST_LOG` filters
/// (default `info`).
fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rumqttc=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never into a log file or collector.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
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
