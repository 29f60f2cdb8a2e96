//! Log parsing throughput for `weir replay`: lines per second, one core.
//!
//! Generates a combined-format log (default 10 million lines, `WEIR_BENCH_LINES` to change)
//! in a temporary file, with realistic variety (IPv4 and IPv6 clients, expensive and page
//! paths, several user agents, half the lines with a trailing cookie field), then measures
//! in the same run:
//!
//! - `split`: reading lines and checking UTF-8 only: the floor no parser can beat;
//! - `parse`: [`LogReader::for_each_record`] (zero-copy records, file order);
//! - `parse+own`: the same with every record copied to owned strings, what
//!   [`LogReader::ordered`] costs before ordering;
//! - `caddy` and `weir` JSON: 1/10 as many lines each, parsed from memory.
//!
//! Run: `cargo bench --bench replay`. Numbers depend on the machine; compare rows of one run.
//!
//! One run (release, 2-core VM shared with other builds, 10 M lines, 2.4 GB):
//!
//! ```text
//! split      10000000 lines   2422.3 MB  0.865 s  11.56 M lines/s  2800.7 MB/s
//! parse      10000000 lines   2422.3 MB  5.195 s   1.93 M lines/s   466.3 MB/s
//! parse+own  10000000 lines   2422.3 MB  4.931 s   2.03 M lines/s   491.3 MB/s  (10% owned)
//! caddy       1000000 lines    719.2 MB  2.742 s   0.36 M lines/s   262.3 MB/s
//! weir        1000000 lines    432.2 MB  1.555 s   0.64 M lines/s   277.9 MB/s
//! ```

use std::hint::black_box;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::time::Instant;

use weir::lab::replay::{LogReader, ReaderOptions, TrailingField};

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

fn report(name: &str, lines: u64, bytes: u64, started: Instant) {
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{name:<10} {lines:>10} lines {:>8.1} MB  {secs:>7.3} s  {:>6.2} M lines/s  {:>7.1} MB/s",
        bytes as f64 / 1e6,
        lines as f64 / secs / 1e6,
        bytes as f64 / secs / 1e6,
    );
}

fn memory_run(name: &str, text: &str, lines: u64) {
    let started = Instant::now();
    let mut reader = LogReader::new(
        std::io::Cursor::new(text.as_bytes().to_vec()),
        ReaderOptions::default(),
    )
    .expect("in memory");
    let mut statuses = 0u64;
    reader
        .for_each_record(|r| statuses += u64::from(r.status))
        .expect("in memory");
    black_box(statuses);
    assert_eq!(
        reader.stats().records,
        lines,
        "{name}: {:?}",
        reader.stats()
    );
    report(name, lines, text.len() as u64, started);
}

/// Routes and rules for the parse-and-decide row (the MediaWiki example's shape).
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

fn report_row(name: &str, lines: u64, bytes: u64, started: Instant, note: &str) {
    report(name, lines, bytes, started);
    println!("({name}: {note})");
}

fn main() -> std::io::Result<()> {
    let lines: u64 = std::env::var("WEIR_BENCH_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("access.log");
    let started = Instant::now();
    {
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(&file)?);
        for i in 0..lines {
            combined_line(i, &mut out)?;
        }
        out.flush()?;
    }
    let bytes = std::fs::metadata(&file)?.len();
    println!(
        "generated {lines} combined lines ({:.1} MB) in {:.1} s",
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );

    // Baseline: line splitting and UTF-8 validation only.
    let started = Instant::now();
    let mut input = BufReader::with_capacity(256 * 1024, std::fs::File::open(&file)?);
    let mut buf = Vec::with_capacity(4096);
    let mut n = 0u64;
    while {
        buf.clear();
        input.read_until(b'\n', &mut buf)? > 0
    } {
        n += std::str::from_utf8(&buf).map_or(0, |s| s.len() as u64 & 1);
    }
    black_box(n);
    report("split", lines, bytes, started);

    let options = || ReaderOptions {
        trailing: vec![TrailingField::Cookie],
        ..ReaderOptions::default()
    };
    let started = Instant::now();
    let mut reader = LogReader::open(&file, options())?;
    let mut sum = 0u64;
    reader.for_each_record(|r| sum = sum.wrapping_add(r.time.0 as u64 ^ r.bytes))?;
    black_box(sum);
    assert_eq!(reader.stats().records, lines, "{:?}", reader.stats());
    report("parse", lines, bytes, started);

    // Parse and decide: every record through routes and four rule levels,
    // the path `weir replay` takes.
    let loaded = weir::config::load_str(
        DECIDE_CONFIG,
        None,
        &std::collections::HashMap::<String, String>::new(),
    )
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    let gateway = weir::gateway::Gateway::build(loaded, None, 1)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut replay = weir::lab::replay::engine::Replay::new(gateway);
    let started = Instant::now();
    let mut reader = LogReader::open(&file, options())?;
    reader.for_each_record(|r| {
        black_box(replay.decide(&r));
    })?;
    let summary = replay.finish();
    report_row(
        "parse+decide",
        lines,
        bytes,
        started,
        &format!("{} rejected", summary.rejected),
    );

    let owned_lines = lines / 10;
    let started = Instant::now();
    let mut reader = LogReader::open(&file, options())?;
    let mut kept = 0u64;
    let mut seen = 0u64;
    reader.for_each_record(|r| {
        if seen < owned_lines {
            kept += black_box(r.into_owned()).bytes & 1;
        }
        seen += 1;
    })?;
    black_box(kept);
    println!("(parse+own: first {owned_lines} records owned, all parsed)");
    report("parse+own", lines, bytes, started);

    let json_lines = (lines / 10).max(1);
    let caddy: String = (0..json_lines).map(|i| caddy_line(i) + "\n").collect();
    memory_run("caddy", &caddy, json_lines);
    let weir: String = (0..json_lines).map(|i| weir_line(i) + "\n").collect();
    memory_run("weir", &weir, json_lines);
    Ok(())
}
