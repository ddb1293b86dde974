//! The `statestore-gateway` binary: parse the command line, turn the
//! subcommand's arguments into its settings, run it.

use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use statestore_gateway::cli::dev::DevArgs;
use statestore_gateway::cli::emulator::EmulatorArgs;
use statestore_gateway::cli::inject::{InjectArgs, InjectorArgs};
use statestore_gateway::cli::parse::LogFormat;
use statestore_gateway::cli::serve::ServeArgs;
use statestore_gateway::cli::{Cli, Command};
use statestore_gateway::emulator::Emulator;
use statestore_gateway::http::{Server, termination_signal};
use statestore_gateway::inject::{manifest, webhook};
use statestore_gateway::metrics::Metrics;
use statestore_gateway::settings::SettingError;
use statestore_gateway::trace::{self, ExportError};

/// jemalloc instead of glibc's malloc: after a burst (10,000 watchers come
/// and go) glibc kept the memory for good; jemalloc, with the settings in
/// `.cargo/config.toml` and its background thread, returns it within
/// seconds.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Exit code for a setting that parsed but cannot be used (clap uses the
/// same for the ones that do not parse).
const EXIT_BAD_SETTING: i32 = 2;

fn main() {
    let cli = Cli::parse();
    let ran = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Emulator(args) => emulator(args),
        Command::Dev(args) => dev(args),
        Command::Inject(args) => inject(args),
        Command::Injector(args) => injector(args),
    };
    if let Err(error) = ran {
        // A setting that cannot be used exits like one that does not parse.
        if let Some(setting) = error.chain().find_map(|e| e.downcast_ref::<SettingError>()) {
            eprintln!("statestore-gateway: {setting}");
            std::process::exit(EXIT_BAD_SETTING);
        }
        if let Some(setting) = error.chain().find_map(|e| e.downcast_ref::<ExportError>()) {
            eprintln!("statestore-gateway: {setting}");
            std::process::exit(EXIT_BAD_SETTING);
        }
        eprintln!("Error: {error:?}");
        std::process::exit(1);
    }
}

/// `serve`: the gateway until SIGTERM/SIGINT, then a graceful drain; exit 0.
fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    let settings = args.settings()?;
    let metrics = Metrics::new();
    // Span export, when the OTEL_* variables ask for it.
    let exporter = trace::start_export(|name| std::env::var(name).ok(), &metrics)?;
    let grace = settings.shutdown_grace;
    // When the shutdown began: the spans still queued may take what is
    // left of its grace period, not the exporter's own longer wait.
    let stopping = std::sync::Arc::new(std::sync::OnceLock::new());
    let served = serve_runtime()?.block_on({
        let stopping = stopping.clone();
        async move {
            let server = Server::start(settings, metrics).await?;
            server
                .run_until(async move {
                    termination_signal().await;
                    let _ = stopping.set(Instant::now());
                })
                .await?;
            anyhow::Ok(())
        }
    });
    // Off the runtime: sends the spans still queued, within the grace.
    if let Some(exporter) = exporter {
        let began = stopping.get().copied().unwrap_or_else(Instant::now);
        exporter.shutdown((began + grace).saturating_duration_since(Instant::now()));
    }
    served
}

/// `emulator`: serve the store until SIGTERM/SIGINT, then disconnect cleanly.
fn emulator(args: EmulatorArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    let config = args.settings()?;
    runtime()?.block_on(async move {
        let mut emulator = Emulator::start(config).await?;
        let stopped = tokio::select! {
            () = termination_signal() => None,
            result = emulator.stopped() => Some(result),
        };
        match stopped {
            None => emulator.shutdown().await?,
            Some(result) => result?,
        }
        anyhow::Ok(())
    })
}

/// `dev`: embedded broker, emulator and gateway until SIGTERM/SIGINT.
fn dev(args: DevArgs) -> anyhow::Result<()> {
    init_tracing(LogFormat::Text);
    let settings = args.settings()?;
    runtime()?.block_on(statestore_gateway::dev::run(settings))?;
    Ok(())
}

/// `inject`: the YAML of a file or stdin, with the sidecar, to stdout.
fn inject(args: InjectArgs) -> anyhow::Result<()> {
    let values = args.sidecar.settings()?;
    let text = match args.file.as_deref() {
        Some(path) if path.as_os_str() != "-" => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        _ => std::io::read_to_string(std::io::stdin()).context("reading standard input")?,
    };
    let out = manifest::inject_yaml(&text, &values)?;
    std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes())
        .context("writing standard output")
}

/// `injector`: the admission webhook until SIGTERM/SIGINT.
fn injector(args: InjectorArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    let values = args.sidecar.settings()?;
    runtime()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        tracing::info!(listen = %args.listen, "admission webhook ready");
        webhook::serve(
            listener,
            args.tls_cert_file,
            args.tls_key_file,
            values,
            termination_signal(),
        )
        .await?;
        Ok(())
    })
}

/// Raises the soft limit on open files to the hard limit, as the Go runtime
/// does. Container runtimes now often start processes at a soft limit of
/// 1,024 (with a hard limit in the hundreds of thousands): the default
/// `--max-watchers` of 10,000 alone needs ten times that.
fn raise_open_file_limit() {
    let before = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(0, |(soft, _)| soft);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(now) if before < now => {
            tracing::info!(from = before, to = now, "raised the open file limit");
        }
        Ok(now) => tracing::debug!(limit = now, "open file limit"),
        Err(error) => tracing::warn!(%error, "cannot raise the open file limit"),
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    raise_open_file_limit();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// `serve`'s runtime: one thread, unless `TOKIO_WORKER_THREADS` is set
/// (then tokio's multi-threaded one with that many workers). On one thread
/// the HTTP task, the pool member's event loop and the reply wake each
/// other without a futex or a context switch: measured (BENCHMARKS.md,
/// "CPU against webdis"), that is less CPU per request at every rate; the
/// cost is a ceiling of one core, which a sidecar is rarely given anyway.
fn serve_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return runtime();
    }
    raise_open_file_limit();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
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
