//! The lab's own capacity: how many requests per second `weir sim`'s load generator
//! ([`weir_lab::cohort`]) sends on schedule against a fast target.
//!
//! Each step runs a generated scenario through [`run_scenario`], exactly as `weir sim` does:
//! one `humans` cohort (200 clients, each bound to its own 127.x.y.z address, no login)
//! at a total scheduled rate, through weir with no rules to the lab app answering at once
//! (fixed 0 ms service, 512 workers). Loopback only. Rates rise (default 1000, 2000, 4000,
//! 6000, 8000, 10000, 12000, 16000 req/s; `WEIR_SIM_RATES=a,b,...` to change;
//! `WEIR_SIM_SECONDS` per step, default 4) until a step fails; the run stops there, so the
//! whole bench stays under about 45 s.
//!
//! A step *holds* when both:
//! - the generator says it kept up: the same measure `weir sim` uses to warn that "the
//!   load generator fell behind" ([`GeneratorReport::bottleneck`]: scheduling lag p99 over
//!   50 ms or more than 5% of sends over 10 ms late);
//! - requests sent are within tolerance of the schedule: `max(2%, 3σ)` below
//!   `rate × seconds`, σ being the Poisson noise of the arrivals (`1/√(rate × seconds)`:
//!   4.7% at 1000 req/s for 4 s, 2% from 5600 req/s).
//!
//! The failing step's reason says which side gave out: `lag` (the generator's own timers
//! ran late: the generator is the limit) or `short` (timers on time, but clients wait for
//! answers and weir plus the app, sharing the same cores, answered too slowly).
//!
//! CPU: the generator's runtime threads (`weir-lab-load`) are sampled from
//! `/proc/self/task` during the step; the process total (app, weir and generator share
//! one process, each on its own runtime) comes from `/proc/self/stat`. Both in percent of
//! one core over the step's wall time. Linux only.
//!
//! Run: `cargo bench --bench sim_capacity` or `bench/sim-capacity.sh`.

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir_lab::cli::{SimOptions, run_scenario};
use weir_lab::report::GeneratorReport;
use weir_lab::scenario::load_scenario_str;

const CLIENTS: u32 = 200;

fn scenario(rate: f64, seconds: u64) -> String {
    format!(
        r#"[scenario]
name = "sim capacity at {rate} req/s"
duration = "{seconds}s"
grace = "1s"
access_log = false

[app]
workers = 512
backlog = 512
default_service = {{ dist = "fixed", ms = 0 }}

[health]
enabled = false

[weir.plain]
config = """
[[listeners]]
address = "127.0.0.1:0"

[pools.app]
servers = ["{{{{app}}}}"]
"""

[[cohorts]]
name = "load"
kind = "humans"
count = {CLIENTS}
rate = {per_client}
timeout = "5s"
requests = [ {{ path = "/wiki/Page_{{n}}", weight = 1 }} ]
"#,
        per_client = rate / f64::from(CLIENTS),
    )
}

/// Clock ticks per second for `/proc` times.
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// (thread name, utime + stime in ticks) from a `/proc/.../stat` file.
fn stat_times(path: &std::path::Path) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let (open, close) = (text.find('(')?, text.rfind(')')?);
    let name = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 2..].split(' ').collect();
    // After the name: state is field 3 of stat(5), utime 14 and stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

fn process_ticks() -> u64 {
    stat_times(std::path::Path::new("/proc/self/stat")).map_or(0, |(_, t)| t)
}

/// Samples the generator threads' CPU until `stop`; returns ticks per thread id, the last
/// value seen (threads end with their runtime, so they are read while they run).
fn sample_generator(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut seen: HashMap<String, u64> = HashMap::new();
        loop {
            if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
                for task in tasks.flatten() {
                    if let Some((name, ticks)) = stat_times(&task.path().join("stat"))
                        && name.starts_with("weir-lab-load")
                    {
                        seen.insert(task.file_name().to_string_lossy().into_owned(), ticks);
                    }
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        seen.values().sum()
    })
}

struct Step {
    rate: f64,
    achieved: f64,
    shortfall: f64,
    tolerance: f64,
    generator: GeneratorReport,
    generator_cpu: f64,
    process_cpu: f64,
    holds: bool,
}

fn step(rate: f64, seconds: u64, ticks: f64) -> Result<Step, String> {
    let text = scenario(rate, seconds);
    let scenario = load_scenario_str(&text, None).map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_generator(stop.clone());
    let (started, cpu_before) = (Instant::now(), process_ticks());
    let report = run_scenario(&scenario, &SimOptions::default()).map_err(|e| e.to_string())?;
    let wall = started.elapsed().as_secs_f64();
    let process_cpu = (process_ticks() - cpu_before) as f64 / ticks / wall * 100.0;
    stop.store(true, Ordering::Relaxed);
    let generator_ticks = sampler.join().map_err(|_| "sampler panicked")?;
    let variant = report.variants.first().ok_or("no variant ran")?;
    let sent: u64 = variant.cohorts.iter().map(|c| c.sent).sum();
    let scheduled = rate * seconds as f64;
    let achieved = sent as f64 / seconds as f64;
    let shortfall = 1.0 - sent as f64 / scheduled;
    let tolerance = (3.0 / scheduled.sqrt()).max(0.02);
    Ok(Step {
        rate,
        achieved,
        shortfall,
        tolerance,
        holds: !variant.generator.bottleneck && shortfall <= tolerance,
        generator: variant.generator.clone(),
        generator_cpu: generator_ticks as f64 / ticks / wall * 100.0,
        process_cpu,
    })
}

fn main() -> Result<(), String> {
    let rates: Vec<f64> = std::env::var("WEIR_SIM_RATES")
        .unwrap_or_else(|_| "1000,2000,4000,6000,8000,10000,12000,16000".into())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    let seconds: u64 = std::env::var("WEIR_SIM_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let ticks = clock_ticks();
    let started = Instant::now();
    println!(
        "{:>8} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>8} {:>8}  holds (why not)",
        "rate/s", "sent/s", "short %", "tol %", "lag p99", "lag max", "late%", "gen CPU", "all CPU"
    );
    let mut best: Option<Step> = None;
    for rate in rates {
        let s = step(rate, seconds, ticks)?;
        println!(
            "{:>8.0} {:>9.0} {:>9.2} {:>6.2} {:>7.1}ms {:>7.1}ms {:>6.2} {:>7.0}% {:>7.0}%  {}",
            s.rate,
            s.achieved,
            s.shortfall * 100.0,
            s.tolerance * 100.0,
            s.generator.lag_p99_ms,
            s.generator.lag_max_ms,
            s.generator.late_share * 100.0,
            s.generator_cpu,
            s.process_cpu,
            match (s.holds, s.generator.bottleneck) {
                (true, _) => "yes",
                (false, true) => "NO (lag)",
                (false, false) => "NO (short)",
            },
        );
        if !s.holds {
            break;
        }
        best = Some(s);
    }
    match best {
        Some(s) => println!(
            "highest rate held: {:.0} req/s (generator {:.0}% of a core, whole sim {:.0}%); {:.0} s",
            s.rate,
            s.generator_cpu,
            s.process_cpu,
            started.elapsed().as_secs_f64()
        ),
        None => println!("no rate held; {:.0} s", started.elapsed().as_secs_f64()),
    }
    Ok(())
}
