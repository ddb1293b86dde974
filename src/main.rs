//! The `statestore-gateway` binary: parse the command line, run the subcommand.

use clap::Parser;
use statestore_gateway::config::{Cli, Command, LogFormat, ServeArgs};
use statestore_gateway::http::{Server, termination_signal};
use statestore_gateway::metrics::Metrics;

/// Exit code for a setting that parsed but cannot be used (clap uses the
/// same for the ones that do not parse).
const EXIT_BAD_SETTING: i32 = 2;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Emulator(_) => anyhow::bail!("emulator is not built yet"),
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
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
