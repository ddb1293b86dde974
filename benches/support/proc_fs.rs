//! What `/proc` says of processes and of the machine: CPU time, memory
//! and a process's children, read afresh at each call. Pure readers: the
//! processes themselves are started by `procs`.

use std::process::Command;

use anyhow::{Context as _, Result};

/// `pid` and its children (one level: nginx's master and its workers).
pub fn tree(pid: u32) -> Vec<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    std::iter::once(pid)
        .chain(
            children
                .split_whitespace()
                .filter_map(|child| child.parse().ok()),
        )
        .collect()
}

/// The figure of a `<field> <n> kB` line of `/proc/<pid>/status`.
pub fn status_field(pid: u32, field: &str) -> Result<u64> {
    kib_field(&format!("/proc/{pid}/status"), field)
}

/// The figure of a `<field> <n> kB` line of a `/proc` file (`status`,
/// `smaps_rollup`, `meminfo`).
pub fn kib_field(path: &str, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in {path}"))
}

/// utime + stime (fields 14 and 15 of `stat`, counted after the command
/// name, which may itself hold spaces and parentheses).
pub fn cpu_ticks(stat_path: &str) -> Result<u64> {
    let stat =
        std::fs::read_to_string(stat_path).with_context(|| format!("reading {stat_path}"))?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("unexpected {stat_path}"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |index: usize| -> Result<u64> {
        fields
            .get(index)
            .and_then(|field| field.parse().ok())
            .with_context(|| format!("unexpected {stat_path}"))
    };
    // fields[0] is field 3 (state), so utime (14) and stime (15) are 11 and 12.
    Ok(field(11)? + field(12)?)
}

/// The CPU time of process `pid` so far in nanoseconds, user and kernel,
/// summed over its threads (`/proc/<pid>/task/*/schedstat`: precise where
/// `stat` counts 10 ms ticks). A thread that has ended is no longer in it.
pub fn cpu_ns(pid: u32) -> Result<u64> {
    let tasks = format!("/proc/{pid}/task");
    let mut total = 0;
    for task in std::fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))? {
        let path = task?.path().join("schedstat");
        // A thread that just ended has no file any more.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        total += text
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .with_context(|| format!("unexpected {}", path.display()))?;
    }
    Ok(total)
}

/// Busy and total CPU ticks of the whole machine (first line of
/// `/proc/stat`), to tell whether a run had the cores to itself.
pub fn machine_ticks() -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .context("unexpected /proc/stat")?
        .split_whitespace()
        .filter_map(|field| field.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let field = |index: usize| fields.get(index).copied().unwrap_or_default();
    let busy = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
    Ok((busy, busy + field(3) + field(4)))
}

/// Cores busy (all processes) between two [`machine_ticks`] readings.
pub fn busy_cores(before: (u64, u64), after: (u64, u64)) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let total = after.1.saturating_sub(before.1).max(1) as f64;
    after.0.saturating_sub(before.0) as f64 / total * cores
}

/// CPU time of this process (the benchmark client), in clock ticks.
pub fn own_cpu_ticks() -> Result<u64> {
    cpu_ticks("/proc/self/stat")
}

/// [`cpu_ns`] of this process (the benchmark client).
pub fn own_cpu_ns() -> Result<u64> {
    cpu_ns(std::process::id())
}

/// `getconf CLK_TCK` (100 on Linux unless someone rebuilt the kernel).
pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100)
}
