//! Throughput of `weir replay`: log lines per second, one core, per format.
//!
//! Generates logs in a temporary directory: a combined-format log (default 10 million lines,
//! `WEIR_BENCH_LINES` to change) with realistic variety (IPv4 and IPv6 clients, expensive and
//! page paths, several user agents, half the lines with a trailing cookie field), and Caddy and
//! weir JSON logs of `WEIR_BENCH_JSON_LINES` lines each (default a tenth of that: a Caddy line
//! is three times as long). Rows, each with its own peak RSS:
//!
//! - `split`: reading lines and checking UTF-8 only: the floor no parser can beat;
//! - `FORMAT parse`: [`LogReader::for_each_record`] (zero-copy records, file order);
//! - `combined decide`: parse and decide in file order ([`Replay::decide`] per record);
//! - `FORMAT replay`: [`replay_files`], exactly what `weir replay` runs: records put in
//!   log-time order through the reorder window, then decided. This is the number that counts.
//!
//! Every decide and replay row runs the routes and four-level rate rule of the MediaWiki
//! example. `WEIR_BENCH_ROWS=split,parse,decide,replay,caddy,weir` picks rows (default all).
//!
//! Run: `cargo bench --bench replay`. Numbers depend on the machine; compare rows of one run;
//! bench/README.md ("Replay") has a recorded run.

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]

use std::hint::black_box;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use weir_replay::engine::{Replay, replay_files};
use weir_replay::{LogReader, ReaderOptions, TrailingField};

// The allocator `weir replay` runs with (src/main.rs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const AGENTS: [&str; 4] = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0 Safari/537.36",
    "Mozilla/5.0 (compatible; GPTBot/1.2; +https://openai.com/gptbot)",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_0 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
    "python-requests/2.32",
];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

fn client(i: u64) -> String {
    if i.is_multiple_of(10) {
        format!("2001:db8:{:x}::{:x}", (i >> 8) & 0xffff, i & 0xff)
    } else {
        format!(
            "{}.{}.{}.{}",
            20 + (i % 200),
            (i >> 3) & 0xff,
            (i >> 7) & 0xff,
            i & 0xff
        )
    }
}

fn path(i: u64) -> String {
    match i % 5 {
        0 => format!(
            "/w/index.php?title=Page_{}&diff={}&oldid={}",
            i % 9973,
            i + 1,
            i
        ),
        1 => format!(
            "/w/index.php?search=term{}&title=Special%3ASearch",
            i % 1013
        ),
        _ => format!("/wiki/Article_{}", i % 100_003),
    }
}

fn combined_line(i: u64, out: &mut impl Write) -> std::io::Result<()> {
    let secs = i / 300; // 300 requests per second
    let (day, h, m, s) = (
        1 + (secs / 86_400) % 28,
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
    );
    let month = MONTHS[((secs / (86_400 * 28)) % 12) as usize];
    write!(
        out,
        "{} - - [{day:02}/{month}/2026:{h:02}:{m:02}:{s:02} +0900] \"GET {} HTTP/1.1\" {} {} \"https://wiki.example/wiki/Main_Page\" \"{}\"",
        client(i),
        path(i),
        if i.is_multiple_of(17) { 429 } else { 200 },
        1000 + i % 50_000,
        AGENTS[(i % 4) as usize],
    )?;
    if i.is_multiple_of(2) {
        write!(
            out,
            " \"wikisession={:032x}\"",
            i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        )?;
    } else {
        write!(out, " \"-\"")?;
    }
    writeln!(out)
}

fn caddy_line(i: u64) -> String {
    format!(
        r#"{{"level":"info","ts":{}.{:06},"logger":"http.log.access.log0","msg":"handled request","request":{{"remote_ip":"10.0.0.1","remote_port":"40000","client_ip":"{}","proto":"HTTP/2.0","method":"GET","host":"wiki.example","uri":"{}","headers":{{"User-Agent":["{}"],"Accept":["text/html,application/xhtml+xml"],"Accept-Encoding":["gzip, br"],"Sec-Fetch-Mode":["navigate"],"Cookie":["wikisession={:032x}"]}},"tls":{{"resumed":false,"version":772}}}},"bytes_read":0,"user_id":"","duration":0.0{:05},"size":{},"status":200,"resp_headers":{{"Server":["Caddy"],"Content-Type":["text/html"]}}}}"#,
        1_791_600_000 + i / 300,
        i % 1_000_000,
        client(i),
        path(i),
        AGENTS[(i % 4) as usize],
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        i % 99_999,
        1000 + i % 50_000,
    )
}

fn weir_line(i: u64) -> String {
    format!(
        r#"{{"time":"2026-10-10T04:{:02}:{:02}.{:03}Z","client":"{}","peer":"10.0.0.1","client_source":"x_forwarded_for","method":"GET","host":"wiki.example","path":"{}","proto":"HTTP/1.1","class":"expensive","decision":"admit","rule":null,"pool":"app","upstream":"10.0.1.1:80","status":200,"upstream_status":200,"bytes_in":0,"bytes_out":{},"duration_ms":12.5,"queue_ms":0.1,"upstream_ms":12.1,"error":null}}"#,
        (i / 60_000) % 60,
        (i / 1000) % 60,
        i % 1000,
        client(i),
        path(i),
        1000 + i % 50_000,
    )
}

/// Peak resident memory since the last [`reset_peak`], in MB (Linux; 0 elsewhere).
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Resets the peak-RSS mark to the current RSS (Linux >= 4.0), so each row reports its own peak.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn report(name: &str, lines: u64, bytes: u64, started: Instant, note: &str) {
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{name:<16} {lines:>9} lines {:>7.1} MB {secs:>7.3} s {:>6.2} M lines/s {:>6.1} MB/s  peak RSS {:>6.1} MB  {note}",
        bytes as f64 / 1e6,
        lines as f64 / secs / 1e6,
        bytes as f64 / secs / 1e6,
        peak_rss_mb(),
    );
}

/// Routes and rules for the decide and replay rows (the MediaWiki example's shape).
const DECIDE_CONFIG: &str = r#"
[[listeners]]
address = "127.0.0.1:0"
[pools.wiki]
servers = ["127.0.0.1:9"]
[[routes]]
pool = "wiki"
class = "expensive"
path_prefix = "/w/index.php"
query_keys = ["search", "diff", "oldid", "action"]
[[routes]]
pool = "wiki"
class = "page"
[[classes.expensive.rules]]
name = "anon-expensive"
limits = [
  { per = "ip", rate = 20, window = "10m" },
  { per = "subnet", rate = 100, window = "10m" },
  { per = "network", rate = 400, window = "10m" },
  { per = "site", rate = 20000, window = "10m" },
]
"#;

fn gateway() -> std::io::Result<weir::gateway::Gateway> {
    let loaded = weir::config::load_str(
        DECIDE_CONFIG,
        None,
        &std::collections::HashMap::<String, String>::new(),
    )
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    weir::gateway::Gateway::build(loaded, None, 1).map_err(|e| std::io::Error::other(e.to_string()))
}

fn write_log(
    path: &Path,
    lines: u64,
    mut line: impl FnMut(u64, &mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<u64> {
    let started = Instant::now();
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    for i in 0..lines {
        line(i, &mut out)?;
    }
    out.flush()?;
    let bytes = std::fs::metadata(path)?.len();
    println!(
        "generated {lines} lines ({:.1} MB) in {:.1} s: {}",
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(bytes)
}

fn parse_row(
    name: &str,
    path: &Path,
    options: ReaderOptions,
    lines: u64,
    bytes: u64,
) -> std::io::Result<()> {
    reset_peak();
    let started = Instant::now();
    let mut reader = LogReader::open(path, options)?;
    let mut sum = 0u64;
    reader.for_each_record(|r| sum = sum.wrapping_add(r.time.0 as u64 ^ r.bytes))?;
    black_box(sum);
    assert_eq!(
        reader.stats().records,
        lines,
        "{name}: {:?}",
        reader.stats()
    );
    report(name, lines, bytes, started, "");
    Ok(())
}

fn replay_row(
    name: &str,
    path: &Path,
    options: ReaderOptions,
    lines: u64,
    bytes: u64,
) -> std::io::Result<()> {
    let gateway = gateway()?;
    reset_peak();
    let started = Instant::now();
    let run = replay_files(gateway, &[path.to_path_buf()], &options, |_, v| {
        black_box(v);
    })?;
    assert_eq!(
        run.report.records, lines,
        "{name}: {} malformed",
        run.malformed
    );
    report(
        name,
        lines,
        bytes,
        started,
        &format!("{} rejected", run.report.rejected),
    );
    Ok(())
}

/// The baseline row: line splitting and UTF-8 validation only.
fn split_row(path: &Path, lines: u64, bytes: u64) -> std::io::Result<()> {
    reset_peak();
    let started = Instant::now();
    let mut input = BufReader::with_capacity(256 * 1024, std::fs::File::open(path)?);
    let mut buf = Vec::with_capacity(4096);
    let mut n = 0u64;
    while {
        buf.clear();
        input.read_until(b'\n', &mut buf)? > 0
    } {
        n += std::str::from_utf8(&buf).map_or(0, |s| s.len() as u64 & 1);
    }
    black_box(n);
    report("split", lines, bytes, started, "");
    Ok(())
}

/// The decide row: in file order, no reordering, so the decision cost alone
/// on top of parsing.
fn decide_row(path: &Path, options: ReaderOptions, lines: u64, bytes: u64) -> std::io::Result<()> {
    let mut replay = Replay::new(gateway()?);
    reset_peak();
    let started = Instant::now();
    let mut reader = LogReader::open(path, options)?;
    reader.for_each_record(|r| {
        black_box(replay.decide(r));
    })?;
    let summary = replay.finish();
    report(
        "combined decide",
        lines,
        bytes,
        started,
        &format!("{} rejected", summary.rejected),
    );
    Ok(())
}

/// A count from the environment variable `name`, else `default`.
fn count_from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> std::io::Result<()> {
    let lines = count_from_env("WEIR_BENCH_LINES", 10_000_000);
    let json_lines = count_from_env("WEIR_BENCH_JSON_LINES", (lines / 10).max(1));
    let rows = std::env::var("WEIR_BENCH_ROWS")
        .unwrap_or_else(|_| "split,parse,decide,replay,caddy,weir".into());
    let row = |name: &str| rows.split(',').any(|r| r.trim() == name);
    let dir = tempfile::tempdir()?;
    let combined_options = || ReaderOptions {
        trailing: vec![TrailingField::Cookie],
        ..ReaderOptions::default()
    };

    if row("split") || row("parse") || row("decide") || row("replay") {
        let file = dir.path().join("access.log");
        let bytes = write_log(&file, lines, combined_line)?;
        if row("split") {
            split_row(&file, lines, bytes)?;
        }
        if row("parse") {
            parse_row("combined parse", &file, combined_options(), lines, bytes)?;
        }
        if row("decide") {
            decide_row(&file, combined_options(), lines, bytes)?;
        }
        if row("replay") {
            replay_row("combined replay", &file, combined_options(), lines, bytes)?;
        }
        std::fs::remove_file(&file)?;
    }
    type LineOf = fn(u64) -> String;
    let json: [(&str, LineOf); 2] = [("caddy", caddy_line), ("weir", weir_line)];
    for (name, line) in json {
        if !row(name) {
            continue;
        }
        let file = dir.path().join(format!("{name}.log"));
        let bytes = write_log(&file, json_lines, |i, out| writeln!(out, "{}", line(i)))?;
        parse_row(
            &format!("{name} parse"),
            &file,
            ReaderOptions::default(),
            json_lines,
            bytes,
        )?;
        replay_row(
            &format!("{name} replay"),
            &file,
            ReaderOptions::default(),
            json_lines,
            bytes,
        )?;
        std::fs::remove_file(&file)?;
    }
    Ok(())
}
