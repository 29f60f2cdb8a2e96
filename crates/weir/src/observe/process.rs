//! The standard `process_*` metrics every Prometheus client library exports
//! (CPU seconds, resident and virtual memory, open and maximum file
//! descriptors, threads, start time), read from `/proc/self` at each scrape,
//! so a saturated process shows on the dashboard (incident 4's went unseen
//! for seven hours). Linux only: where `/proc/self/stat` cannot be read, the
//! collector exports nothing rather than zeros that would look like facts.
//!
//! This module does not own weir's own counters (`super::metrics`); it only
//! reads what the kernel keeps.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Reads `/proc/self` when scraped; registered on the unprefixed registry.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of the process's counters.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
    pub start_time_seconds: f64,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl ProcessStats {
    /// The current process's figures, or `None` off Linux (no `/proc`).
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        let page = rustix::param::page_size() as u64;
        let mut stats = parse_stat(&stat, boot_time(&boot)?, ticks, page)?;
        stats.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as u64);
        stats.max_fds = rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, _)| soft);
        Some(stats)
    }
}

/// `/proc/self/stat` (proc(5)): the fields after the command name, which is
/// in parentheses and may itself hold spaces and parentheses.
fn parse_stat(stat: &str, boot_time: u64, ticks: f64, page: u64) -> Option<ProcessStats> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let (utime, stime) = (field(14)?, field(15)?);
    Some(ProcessStats {
        cpu_seconds: (utime + stime) as f64 / ticks,
        threads: field(20)?,
        start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page,
        open_fds: None,
        max_fds: None,
    })
}

/// The boot time (`btime`, Unix seconds) from `/proc/stat`.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A gauge of the process: name, help, unit, and value (`None` where the
/// system does not tell).
type ProcessGauge = (&'static str, &'static str, Option<Unit>, Option<f64>);

/// The process's gauges from its stats: memory, start time, threads and
/// file descriptors.
fn process_gauges(s: &ProcessStats) -> [ProcessGauge; 6] {
    [
        (
            "process_resident_memory",
            "Resident memory size",
            Some(Unit::Bytes),
            Some(s.resident_bytes as f64),
        ),
        (
            "process_virtual_memory",
            "Virtual memory size",
            Some(Unit::Bytes),
            Some(s.virtual_bytes as f64),
        ),
        (
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Some(Unit::Seconds),
            Some(s.start_time_seconds),
        ),
        (
            "process_threads",
            "Operating system threads in the process",
            None,
            Some(s.threads as f64),
        ),
        (
            "process_open_fds",
            "Open file descriptors (connections, upstream sockets, files)",
            None,
            s.open_fds.map(|v| v as f64),
        ),
        (
            "process_max_fds",
            "The soft limit on open file descriptors",
            None,
            s.max_fds.map(|v| v as f64),
        ),
    ]
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let gauges = process_gauges(&s);
        for (name, help, unit, value) in &gauges {
            let Some(value) = *value else { continue };
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(
                name,
                help,
                unit.as_ref(),
                gauge.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_name_with_spaces_and_parentheses() {
        // proc(5)'s layout; the name `we ir) (x` tries to end early.
        let stat = "4242 (we ir) (x) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 50 0 0 20 0 7 0 1000 123456789 300 18446744073709551615";
        let s = parse_stat(stat, 1_700_000_000, 100.0, 4096).expect("parses");
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.threads, 7);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(s.virtual_bytes, 123_456_789);
        assert_eq!(s.resident_bytes, 300 * 4096);
    }

    #[test]
    fn a_truncated_stat_line_is_no_reading() {
        assert_eq!(parse_stat("4242 (weir) S 1 2 3", 0, 100.0, 4096), None);
        assert_eq!(parse_stat("no parentheses", 0, 100.0, 4096), None);
    }

    #[test]
    fn this_process_reads_as_running() {
        let s = ProcessStats::read().expect("/proc is mounted here");
        assert!(s.threads >= 1 && s.resident_bytes > 0, "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert_eq!(boot_time("cpu 1 2\nbtime 17\n"), Some(17));
    }
}
