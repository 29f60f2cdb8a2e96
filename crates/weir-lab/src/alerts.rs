//! Alert rules replayed over weir's own metrics, on the story's clock: during a weir
//! variant the runner scrapes weir's `/metrics` every `scrape_interval / compression` of
//! run time into a [`MetricsRecorder`]; afterwards [`replay`] writes the series as a
//! `promtool test rules` unit test (Debian's `prometheus` package) over the scenario's
//! rules file and reads from promtool's answer when each alert first fired.
//!
//! The story's clock: one run second stands for `compression` story seconds, so a
//! scrape taken `t` seconds into the run is the story's sample at `t x compression`.
//! The lab keeps *ratios* (demand against the app's capacity), so its per-second rates
//! are the ones a real site of that capacity sees; stretching time alone would divide
//! every `rate()` by the compression and no threshold would mean anything. Counters
//! (and histograms' `_bucket`, `_count`, `_sum`) are therefore multiplied by the
//! compression: `rate()` over a story window then gives the run's per-second rate.
//! Gauges are levels and stay as they are, except a process start time, which is the
//! story's time zero (weir starts just before the run). What the lab cannot stretch
//! is how many events it holds: each of its refusals stands for `compression` of the
//! story's, so a story window shorter than a few run-time gaps between events sees
//! bursts where the story had a steady rate (docs/lab.md says what that means for an
//! alert's timing).
//!
//! A series weir has not exported yet is absent (`_`), as Prometheus would see it: a
//! counter born at its first event shows no increase for that event.
//!
//! Alerts are found by asking promtool, at every evaluation, for no alert at all:
//! each alert that did fire is a failed expectation naming the alert and the time,
//! which is all this module reads of promtool's output. It does not start a
//! Prometheus server, scrape anything itself, or judge the alerts (checks do).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::process::Program;
use super::scenario::AlertReplay;

/// promtool: `promtool test rules`.
pub const PROMTOOL: Program = Program {
    name: "promtool",
    binary: "/usr/bin/promtool",
    env: "WEIR_LAB_PROMTOOL",
    package: "prometheus",
};

/// Labels every replayed series carries, so rules that aggregate `by (instance)` or
/// join `on (instance, job)` see one target.
const TARGET_LABELS: [(&str, &str); 2] = [("instance", "lab"), ("job", "weir")];

/// Why the alerts could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("cannot read the alert rules {path}: {source}")]
    Rules {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} names no alert (no `- alert: NAME` line)")]
    NoAlerts(String),
    #[error(
        "promtool is needed to replay [alerts], but {0} does not exist; install it \
         (apt-get install prometheus, or scripts/install-test-deps.sh) or set WEIR_LAB_PROMTOOL"
    )]
    Missing(String),
    #[error("cannot write or run promtool's test: {0}")]
    Io(#[from] std::io::Error),
    #[error("promtool could not run the replay ({status}):\n{output}")]
    Promtool { status: String, output: String },
}

/// The metric type of a family, as `# TYPE` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Counters, and the cumulative parts of histograms and summaries.
    Cumulative,
    /// Gauges and anything untyped: levels.
    Level,
}

/// One scrape: when (run time since the run's start) and each series' value.
#[derive(Debug, Clone)]
struct Scrape {
    at: Duration,
    values: Vec<(usize, f64)>,
}

/// weir's metrics over a run: every series seen, each scrape's values.
#[derive(Debug, Default, Clone)]
pub struct MetricsRecorder {
    /// Series (`name{labels}` as exposed) by index.
    series: Vec<String>,
    index: HashMap<String, usize>,
    /// Family name (as `# TYPE` names it) to kind.
    kinds: HashMap<String, Kind>,
    scrapes: Vec<Scrape>,
}

impl MetricsRecorder {
    /// Records one exposition (Prometheus text 0.0.4) taken `at` into the run.
    pub fn record(&mut self, at: Duration, exposition: &str) {
        let mut values = Vec::new();
        for line in exposition.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((family, kind)) = rest.split_once(' ') {
                    let kind = match kind.trim() {
                        "counter" | "histogram" | "summary" => Kind::Cumulative,
                        _ => Kind::Level,
                    };
                    self.kinds.insert(family.to_string(), kind);
                }
                continue;
            }
            let Some((series, value)) = sample(line) else {
                continue;
            };
            let i = match self.index.get(series) {
                Some(i) => *i,
                None => {
                    self.series.push(series.to_string());
                    self.index.insert(series.to_string(), self.series.len() - 1);
                    self.series.len() - 1
                }
            };
            values.push((i, value));
        }
        self.scrapes.push(Scrape { at, values });
    }

    /// Scrapes recorded.
    pub fn scrapes(&self) -> usize {
        self.scrapes.len()
    }

    /// Whether a series is cumulative: a counter, or a histogram's or summary's
    /// `_bucket`, `_count`, `_sum`.
    fn is_cumulative(&self, series: &str) -> bool {
        let name = metric_name(series);
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| self.kinds.contains_key(*f)))
            .unwrap_or(name);
        match self.kinds.get(family) {
            Some(kind) => *kind == Kind::Cumulative,
            None => name.ends_with("_total"),
        }
    }

    /// Each series as promtool's `input_series`: the story's samples every
    /// `step` of run time (`_` before a series existed or where no scrape
    /// landed), counters multiplied by `compression`.
    fn input_series(&self, step: Duration, compression: f64) -> Vec<serde_json::Value> {
        let slots = self.scrapes.last().map_or(0, |s| slot_of(s.at, step) + 1);
        let mut table: Vec<Vec<Option<f64>>> = vec![vec![None; slots]; self.series.len()];
        for scrape in &self.scrapes {
            let slot = slot_of(scrape.at, step);
            for (i, v) in &scrape.values {
                table[*i][slot] = Some(*v);
            }
        }
        (self.series.iter().zip(table))
            .map(|(series, column)| {
                let scale = if self.is_cumulative(series) {
                    compression
                } else {
                    1.0
                };
                let start_time = metric_name(series).ends_with("_start_time_seconds");
                let values: Vec<String> = column
                    .iter()
                    .map(|v| match v {
                        None => "_".to_string(),
                        Some(_) if start_time => "0".to_string(),
                        Some(v) => promtool_number(v * scale),
                    })
                    .collect();
                serde_json::json!({
                    "series": with_target_labels(series),
                    "values": values.join(" "),
                })
            })
            .collect()
    }
}

/// The metric name of a series (`name{labels}`).
fn metric_name(series: &str) -> &str {
    series.split(LABELS_OPEN).next().unwrap_or(series)
}

/// Where a series' labels begin and end (named: brace literals confuse the
/// brace-counting tools that measure functions here).
const LABELS_OPEN: char = '\u{7b}';
const LABELS_CLOSE: char = '\u{7d}';

/// The run-time slot of a scrape taken `at` into the run.
fn slot_of(at: Duration, step: Duration) -> usize {
    (at.as_secs_f64() / step.as_secs_f64().max(1e-9)).round() as usize
}

/// `name{labels} value` of one exposition line (no timestamp: weir writes none).
fn sample(line: &str) -> Option<(&str, f64)> {
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    // The value follows the last space; label values may hold spaces, so the
    // series ends at the closing brace when there is one.
    let end = match line.find(LABELS_OPEN) {
        Some(_) => line.rfind(LABELS_CLOSE)? + 1,
        None => line.find(' ')?,
    };
    let value = line[end..].trim().split(' ').next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((&line[..end], value))
}

fn promtool_number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// The series with the target's labels added (unless it has them).
fn with_target_labels(series: &str) -> String {
    let (name, labels) = match series.split_once(LABELS_OPEN) {
        Some((name, rest)) => (name, rest.trim_end_matches(LABELS_CLOSE)),
        None => (series, ""),
    };
    let mut parts: Vec<String> = Vec::new();
    if !labels.is_empty() {
        parts.push(labels.to_string());
    }
    for (k, v) in TARGET_LABELS {
        if !labels.contains(&format!("{k}=\"")) {
            parts.push(format!("{k}=\"{v}\""));
        }
    }
    format!("{name}{{{}}}", parts.join(","))
}

/// The alert names in a rules file: its `- alert: NAME` lines. Read by line, not as
/// YAML: promtool itself checks the file when the replay runs.
pub fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| {
            let l = l.trim_start().strip_prefix("- ").unwrap_or(l.trim_start());
            let name = l.strip_prefix("alert:")?.trim();
            let name = name.trim_matches(|c| c == '"' || c == '\'');
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// When each alert first fired, in story time from the run's start; alerts that never
/// fired are absent.
pub type Firings = BTreeMap<String, Duration>;

/// Replays `cfg`'s rules over `recorded` with promtool: the story's series (see the
/// module doc), one expectation of "no alert" per alert per evaluation. The test file
/// is written to `keep` when given (and left there), else to a temp dir.
pub fn replay(
    recorded: &MetricsRecorder,
    cfg: &AlertReplay,
    compression: f64,
    keep: Option<&Path>,
) -> Result<Firings, AlertError> {
    let rules_text = std::fs::read_to_string(&cfg.rules).map_err(|source| AlertError::Rules {
        path: cfg.rules.display().to_string(),
        source,
    })?;
    let alerts = alert_names(&rules_text);
    if alerts.is_empty() {
        return Err(AlertError::NoAlerts(cfg.rules.display().to_string()));
    }
    let binary = PROMTOOL.path();
    if !Path::new(&binary).exists() {
        return Err(AlertError::Missing(binary));
    }
    let series = recorded.input_series(cfg.scrape_every, compression);
    let expectations = no_alert_expectations(recorded, cfg, &alerts);
    let rules = std::fs::canonicalize(&cfg.rules)?;
    // JSON is YAML: serde_json writes the test with correct quoting.
    let test = serde_json::json!({
        "rule_files": [rules.display().to_string()],
        "evaluation_interval": millis(cfg.evaluation_interval),
        "tests": [{
            "interval": millis(cfg.story_interval),
            "input_series": series,
            "alert_rule_test": expectations,
        }],
    });
    let dir = tempfile::tempdir()?;
    let file = keep.map_or_else(|| dir.path().join("replay.yml"), Path::to_path_buf);
    std::fs::write(&file, serde_json::to_string(&test).unwrap_or_default())?;
    let out = Command::new(&binary)
        .arg("test")
        .arg("rules")
        .arg(&file)
        .output()?;
    let output =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let firings = first_firings(&output);
    if !out.status.success() && firings.is_empty() {
        return Err(AlertError::Promtool {
            status: out.status.to_string(),
            output: output.chars().take(4000).collect(),
        });
    }
    Ok(firings)
}

/// One expectation of "no alert" per alert in `alerts` per evaluation, from
/// the first evaluation to the story time of the last scrape.
fn no_alert_expectations(
    recorded: &MetricsRecorder,
    cfg: &AlertReplay,
    alerts: &[String],
) -> Vec<serde_json::Value> {
    let story_end = cfg.story_interval.mul_f64(
        recorded
            .scrapes
            .last()
            .map_or(0, |s| slot_of(s.at, cfg.scrape_every)) as f64,
    );
    let mut expectations = Vec::new();
    let mut t = cfg.evaluation_interval;
    while t <= story_end {
        for alert in alerts {
            expectations.push(serde_json::json!({
                "eval_time": millis(t),
                "alertname": alert,
                "exp_alerts": [],
            }));
        }
        t += cfg.evaluation_interval;
    }
    expectations
}

/// A duration as promtool reads it: whole milliseconds.
fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// From promtool's failures (`alertname: NAME, time: 3h55m,` each), the first time
/// each alert fired.
fn first_firings(output: &str) -> Firings {
    let mut out = Firings::new();
    for line in output.lines() {
        let Some(rest) = line.trim_start().strip_prefix("alertname: ") else {
            continue;
        };
        let Some((name, rest)) = rest.split_once(", time: ") else {
            continue;
        };
        let Some(at) = rest.split(',').next().and_then(promtool_duration) else {
            continue;
        };
        out.entry(name.to_string())
            .and_modify(|t| *t = (*t).min(at))
            .or_insert(at);
    }
    out
}

/// An evaluation time as promtool prints it: Prometheus's own duration format
/// (`3h55m`, `1d2h`, `1w`, `250ms`, `0s`), or Go's (`1h2m3.5s`), which differs only
/// in spelling out zero units and in never using days.
fn promtool_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0s" {
        return Some(Duration::ZERO);
    }
    let mut total = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|i| *i > 0)?;
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "y" => 365.0 * 86_400.0,
            "w" => 7.0 * 86_400.0,
            "d" => 86_400.0,
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lines_split_into_series_and_value() {
        #[rustfmt::skip]
        let cases: &[(&str, Option<(&str, f64)>)] = &[
            ("weir_requests_total{class=\"a b\",status=\"200\"} 12", Some(("weir_requests_total{class=\"a b\",status=\"200\"}", 12.0))),
            ("process_open_fds 31", Some(("process_open_fds", 31.0))),
            ("weir_x_bucket{le=\"+Inf\"} 3", Some(("weir_x_bucket{le=\"+Inf\"}", 3.0))),
            ("weir_gauge -1.5e-3", Some(("weir_gauge", -0.0015))),
            ("weir_inf +Inf", Some(("weir_inf", f64::INFINITY))),
            ("# HELP weir_x help text", None),
            ("", None),
            ("weir_broken{a=\"1\"", None),
            ("weir_novalue{a=\"1\"} x", None),
        ];
        for (line, want) in cases {
            assert_eq!(sample(line), *want, "{line:?}");
        }
    }

    #[test]
    fn durations_read_as_promtool_prints_them() {
        #[rustfmt::skip]
        let cases: &[(&str, Option<f64>)] = &[
            ("0s", Some(0.0)), ("3h55m", Some(14100.0)), ("1d2h", Some(93600.0)),
            ("1w", Some(604800.0)), ("1y", Some(31536000.0)), ("250ms", Some(0.25)),
            ("5m0s", Some(300.0)), ("1h2m3.5s", Some(3723.5)), ("", Some(0.0)),
            ("5x", None), ("m", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                promtool_duration(text).map(|d| d.as_secs_f64()),
                *want,
                "{text:?}"
            );
        }
    }

    #[test]
    fn alert_names_come_from_alert_lines() {
        let rules = "groups:\n  - name: g\n    rules:\n      - alert: First\n        expr: up == 0\n\
                     \x20     - record: not_an_alert\n      - alert: 'Second'\n";
        assert_eq!(alert_names(rules), ["First", "Second"]);
    }

    #[test]
    fn target_labels_are_added_once() {
        assert_eq!(
            with_target_labels("weir_x_total{rule=\"a\"}"),
            "weir_x_total{rule=\"a\",instance=\"lab\",job=\"weir\"}"
        );
        assert_eq!(
            with_target_labels("process_open_fds"),
            "process_open_fds{instance=\"lab\",job=\"weir\"}"
        );
        assert_eq!(
            with_target_labels("x{instance=\"i\"}"),
            "x{instance=\"i\",job=\"weir\"}"
        );
    }

    #[test]
    fn counters_are_stretched_with_the_clock_and_gauges_are_not() {
        let mut rec = MetricsRecorder::default();
        for i in 0..4u32 {
            rec.record(
                Duration::from_millis(100 * u64::from(i)),
                &format!(
                    "# TYPE weir_done_total counter\nweir_done_total {i}\n\
                     # TYPE weir_level gauge\nweir_level {i}\n\
                     # TYPE weir_lat histogram\nweir_lat_bucket{{le=\"1\"}} {i}\n\
                     weir_process_start_time_seconds 1764000000\n"
                ),
            );
        }
        let series = rec.input_series(Duration::from_millis(100), 600.0);
        let values = |name: &str| {
            series
                .iter()
                .find(|s| s["series"].as_str().is_some_and(|t| t.starts_with(name)))
                .map(|s| s["values"].as_str().unwrap_or("").to_string())
        };
        assert_eq!(
            values("weir_done_total").as_deref(),
            Some("0 600 1200 1800")
        );
        assert_eq!(values("weir_level").as_deref(), Some("0 1 2 3"));
        assert_eq!(
            values("weir_lat_bucket").as_deref(),
            Some("0 600 1200 1800")
        );
        assert_eq!(
            values("weir_process_start_time_seconds").as_deref(),
            Some("0 0 0 0")
        );
    }

    /// A series that appears late is absent before, as Prometheus sees it.
    #[test]
    fn series_are_absent_before_they_exist() {
        let mut rec = MetricsRecorder::default();
        rec.record(Duration::ZERO, "a_total 1\n");
        rec.record(Duration::from_millis(200), "a_total 2\nb_total 5\n");
        let series = rec.input_series(Duration::from_millis(100), 1.0);
        let values: Vec<&str> = series.iter().filter_map(|s| s["values"].as_str()).collect();
        assert_eq!(values, ["1 _ 2", "_ _ 5"]);
    }

    #[test]
    fn firings_are_read_from_promtools_failures() {
        let out = "Unit Testing:  /tmp/x.yml\n  FAILED:\n    alertname: A, time: 7m, \n        exp:[], \n        got:[...]\n\
                   \x20   alertname: A, time: 6m, \n    alertname: B, time: 1d1h, \n";
        let f = first_firings(out);
        assert_eq!(f.get("A"), Some(&Duration::from_secs(360)));
        assert_eq!(f.get("B"), Some(&Duration::from_secs(25 * 3600)));
        assert_eq!(f.len(), 2);
    }

    /// The replay with the real promtool: a counter rising 2 per run second at
    /// compression 60 is a story rate of 2/s (not 2/60), so an alert on
    /// `rate > 1` fires after its `for`, and one on `rate > 3` never does.
    #[test]
    fn promtool_replays_rates_on_the_story_clock() {
        if !Path::new(&PROMTOOL.path()).exists() {
            panic!("promtool missing: scripts/install-test-deps.sh installs prometheus");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let rules = dir.path().join("rules.yml");
        std::fs::write(
            &rules,
            "groups:\n  - name: t\n    rules:\n\
             \x20     - alert: Fast\n        expr: rate(weir_done_total[5m]) > 1\n        for: 2m\n\
             \x20     - alert: TooFast\n        expr: rate(weir_done_total[5m]) > 3\n",
        )
        .expect("rules");
        let mut rec = MetricsRecorder::default();
        // One scrape per run second (= 1 story minute); counting starts at 10 s.
        for s in 0..30u64 {
            let done = s.saturating_sub(10) * 2;
            rec.record(
                Duration::from_secs(s),
                &format!("# TYPE weir_done_total counter\nweir_done_total {done}\n"),
            );
        }
        let cfg = AlertReplay {
            rules,
            scrape_every: Duration::from_secs(1),
            story_interval: Duration::from_secs(60),
            evaluation_interval: Duration::from_secs(60),
        };
        let kept = dir.path().join("kept.yml");
        let firings = replay(&rec, &cfg, 60.0, Some(&kept)).expect("replay");
        assert!(kept.is_file(), "the test file is kept when asked");
        // Rising from story minute 10 at 2/s: rate() over 5m (a window still partly
        // flat before) passes 1/s at minute 13 (360 in 300 s), pending 2 minutes:
        // firing at 15.
        assert_eq!(firings.get("Fast"), Some(&Duration::from_secs(15 * 60)));
        assert_eq!(firings.get("TooFast"), None, "{firings:?}");
    }
}
