//! Parts of the gateway benchmark: the processes it starts, the load it
//! makes and the figures it keeps.

pub mod cpu;
pub mod direct;
pub mod gateway;
pub mod http;
pub mod locks;
#[allow(dead_code)] // the listing and batch benchmarks' part
pub mod memory;
pub mod proc_fs;
pub mod procs;
pub mod rate;
#[allow(dead_code)] // the listing and batch benchmarks' peer
pub mod sdk;
pub mod stats;
pub mod watchers;
pub mod wrk;

/// The program's arguments, if it was asked to run: `--bench` (from
/// `cargo bench`) or `--smoke`; `None` under plain `cargo test`, which runs
/// benchmark programs too. The flag says whether it is a smoke run.
pub fn requested_args() -> Option<(bool, Vec<String>)> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let smoke = args.iter().any(|arg| arg == "--smoke");
    (smoke || args.iter().any(|arg| arg == "--bench")).then_some((smoke, args))
}

/// Reads the flags of a benchmark whose options are whole numbers and a
/// report file: `--<name> N` for each of `numbers` sets its place, `--report
/// FILE` sets `report`; `--bench` and `--smoke` ([`requested_args`]) pass.
#[allow(dead_code)] // the gateway benchmark reads richer flags of its own
pub fn read_number_flags(
    args: Vec<String>,
    numbers: &mut [(&str, &mut usize)],
    report: &mut Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--bench" | "--smoke" => {}
            "--report" => *report = Some(value("--report")?.into()),
            other => {
                let Some((name, place)) = numbers.iter_mut().find(|(name, _)| *name == other)
                else {
                    let usage: String = numbers
                        .iter()
                        .map(|(name, _)| format!("{name} N, "))
                        .collect();
                    anyhow::bail!("unknown argument {other:?}; use {usage}--report FILE");
                };
                **place = value(name)?.parse().with_context(|| name.to_string())?;
            }
        }
    }
    Ok(())
}

/// A benchmark program's `main`: options from `parse` (`None`: not asked
/// to run, as under plain `cargo test`), then `run` on a multi-threaded
/// runtime; errors are printed with `name` and become the exit status.
pub fn main_with<O>(
    name: &str,
    parse: impl FnOnce() -> anyhow::Result<Option<O>>,
    run: impl AsyncFnOnce(O) -> anyhow::Result<()>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    let options = match parse() {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{name} benchmark: run scripts/bench (or scripts/bench --smoke)");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("{name} benchmark: {error:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{name} benchmark: no runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{name} benchmark failed: {error:#}");
            ExitCode::FAILURE
        }
    }
}
