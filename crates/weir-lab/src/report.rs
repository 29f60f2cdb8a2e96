//! What a `weir sim` run found: per-variant numbers, check results, and three renderings
//! of them: a side-by-side terminal table, JSON, and a self-contained HTML page (inline
//! SVG, no external assets) with a timeline per cohort and the app's in-flight vs `W`.
//!
//! It only presents numbers the runner measured; it measures nothing itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::cohort::{OUTCOMES, Outcome};
use super::expect::{Check, Subject};
use super::scenario::{CohortKind, GatewayKind};

/// A whole run: every variant, every check.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    pub scenario: String,
    pub description: String,
    pub duration_s: f64,
    pub compression: f64,
    pub story_start: Option<String>,
    pub variants: Vec<VariantReport>,
    pub checks: Vec<CheckResult>,
}

/// One variant's run.
#[derive(Debug, Clone, Serialize)]
pub struct VariantReport {
    pub name: String,
    pub description: String,
    /// What ran as the gateway: weir, or a rival nginx or HAProxy.
    pub gateway: GatewayKind,
    /// `nginx` when a load balancer stood in front of the gateway.
    pub load_balancer: Option<String>,
    pub cohorts: Vec<CohortReport>,
    pub upstream: UpstreamReport,
    /// Rejections by rule: request rules from `weir_rejections_total`, connection refusals
    /// from `weir_connections_refused_total`; per cohort from the access log.
    pub rules: BTreeMap<String, RuleReport>,
    /// The alert replay over weir's metrics (weir variants of a scenario with
    /// `[alerts]`).
    pub alerts: Option<AlertReport>,
    pub generator: GeneratorReport,
    pub timeline: Timeline,
}

impl VariantReport {
    /// What people's requests came to (the cohorts of people and editors).
    pub fn people(&self) -> Tally {
        Tally::of(
            (self.cohorts.iter())
                .filter(|c| matches!(c.kind, CohortKind::Humans | CohortKind::Editors)),
        )
    }
}

/// What a set of cohorts' requests came to, in the demo's words: `served`;
/// `refused` by the gateway on purpose (429, 503 shed, a challenge left
/// unsolved); `failed` (other 5xx, connection errors, timeouts: what a
/// person sees as the site being down).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub sent: u64,
    pub served: u64,
    pub refused: u64,
    pub failed: u64,
}

impl Tally {
    pub fn of<'a>(cohorts: impl Iterator<Item = &'a CohortReport>) -> Tally {
        let mut t = Tally::default();
        for c in cohorts {
            t.sent += c.sent;
            t.served += c.count(Outcome::Served);
            t.refused += c.count(Outcome::Rejected429)
                + c.count(Outcome::Unavailable503)
                + c.count(Outcome::Challenged);
            t.failed += c.count(Outcome::Error5xx)
                + c.count(Outcome::ConnError)
                + c.count(Outcome::Timeout);
        }
        t
    }

    /// `n` as a percentage of what was sent (0 when nothing was).
    pub fn pct(&self, n: u64) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            n as f64 * 100.0 / self.sent as f64
        }
    }
}

/// When alerts fired in the replay of weir's metrics, in story minutes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AlertReport {
    /// Alert name to the story minute (from the run's start) it first fired.
    pub fired_at_min: BTreeMap<String, f64>,
    /// The story minute a person was first turned away, if one was.
    pub first_person_refused_min: Option<f64>,
}

impl AlertReport {
    /// From the replay's firings (story time) and the run time a person was first
    /// refused.
    pub fn new(
        firings: &super::alerts::Firings,
        first_person_refused: Option<std::time::Duration>,
        compression: f64,
    ) -> AlertReport {
        AlertReport {
            fired_at_min: firings
                .iter()
                .map(|(name, at)| (name.clone(), at.as_secs_f64() / 60.0))
                .collect(),
            first_person_refused_min: first_person_refused
                .map(|at| at.as_secs_f64() * compression / 60.0),
        }
    }

    /// One line: when a person was first refused and when each alert fired.
    pub fn summary(&self) -> String {
        let person = self
            .first_person_refused_min
            .map_or("no person refused".to_string(), |m| {
                format!("a person first refused at story minute {m:.1}")
            });
        let fired: Vec<String> = (self.fired_at_min.iter())
            .map(|(name, at)| format!("{name} at {at:.0}"))
            .collect();
        if fired.is_empty() {
            format!("{person}; no alert fired")
        } else {
            format!(
                "{person}; alerts fired (story minute): {}",
                fired.join(", ")
            )
        }
    }

    /// `fired`, `fired_at_min`, `fired_after_min` of one alert.
    fn metric(&self, alert: &str, metric: &str) -> Option<f64> {
        let at = self.fired_at_min.get(alert).copied();
        match metric {
            "fired" => Some(if at.is_some() { 1.0 } else { 0.0 }),
            "fired_at_min" => at,
            "fired_after_min" => Some(at? - self.first_person_refused_min?),
            _ => None,
        }
    }
}

/// One cohort's outcomes.
#[derive(Debug, Clone, Serialize)]
pub struct CohortReport {
    pub name: String,
    pub kind: CohortKind,
    pub clients: usize,
    pub addresses: usize,
    pub sent: u64,
    /// Count per outcome name (see [`OUTCOMES`]).
    pub outcomes: BTreeMap<String, u64>,
    /// Responses that came from the app (carried `x-app-class`).
    pub reached_app: u64,
    /// This cohort's share of the requests that reached the app from any cohort
    /// (a connection flood's share of the app; health checks not counted).
    pub reached_app_share: f64,
    /// Served within 2 s of the first send (a challenged page: to its final answer).
    pub served_2s: u64,
    /// Requests answered after the client solved a challenge (already
    /// counted in their outcome: a solved challenge then served is served).
    pub challenges_solved: u64,
    /// Challenges met by people who had solved one earlier in their visit
    /// (issue 19: never two challenges in one visit).
    pub rechallenged: u64,
    /// p50/p95 latency of served requests that solved a challenge first: the
    /// extra a person pays (compare with `p50_ms`/`p95_ms`).
    pub challenged_p50_ms: f64,
    pub challenged_p95_ms: f64,
    /// Latency of served requests.
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

impl CohortReport {
    pub fn count(&self, o: Outcome) -> u64 {
        self.outcomes.get(o.as_str()).copied().unwrap_or(0)
    }

    /// Failures from the sender's side: 503, other 5xx, connection errors, timeouts.
    pub fn failed(&self) -> u64 {
        OUTCOMES
            .iter()
            .filter(|o| o.is_failure())
            .map(|o| self.count(*o))
            .sum()
    }

    pub fn share(&self, n: u64) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            n as f64 / self.sent as f64
        }
    }
}

/// The app behind weir, over every instance (autoheal restarts start new ones).
#[derive(Debug, Clone, Default, Serialize)]
pub struct UpstreamReport {
    pub workers: usize,
    pub max_in_flight: usize,
    pub max_queued: usize,
    /// Requests answered by the app (health checks included).
    pub served: u64,
    /// Refused because workers and backlog were full (connection reset).
    pub refused: u64,
    /// Cut without a response (client gone, or the app killed by a restart).
    pub abandoned: u64,
    pub health_checks: u64,
    pub health_failures: u64,
    pub restarts: u64,
    /// Samples (every 50 ms) in which demand exceeded capacity: weir had
    /// requests waiting for the app, or turned some away (429, 503, a
    /// challenge page) since the last sample.
    pub demand_samples: u64,
    /// The app's busy share of its slots (its workers, or weir's admission
    /// limit when lower) in those samples, on average: 1 when no slot stayed
    /// free while anyone waited or was turned away; 1 with no such sample.
    pub busy_under_demand: f64,
}

/// Rejections by one rule.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleReport {
    pub count: u64,
    /// From the access log, by the cohort owning the client address (`unknown`: an
    /// address of no cohort, e.g. the load balancer's when it is not trusted).
    pub by_cohort: BTreeMap<String, u64>,
    /// Of those, rejections of people (the humans and editors cohorts).
    pub people: u64,
    /// Rejections weir flagged as maybe a person (`verified`, `pass`, `browsing`).
    pub flagged: u64,
    /// Flagged rejections that were of people.
    pub flagged_people: u64,
}

impl RuleReport {
    /// Share of flagged rejections that were people (1 when none was flagged).
    pub fn people_precision(&self) -> f64 {
        if self.flagged == 0 {
            1.0
        } else {
            self.flagged_people as f64 / self.flagged as f64
        }
    }

    /// Share of people's rejections that were flagged (1 when no person was refused).
    pub fn people_recall(&self) -> f64 {
        if self.people == 0 {
            1.0
        } else {
            self.flagged_people as f64 / self.people as f64
        }
    }
}

/// Whether the load generator kept up.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GeneratorReport {
    /// Sends that waited for their timer (lag is measured on these).
    pub timed_sends: u64,
    pub lag_p50_ms: f64,
    pub lag_p99_ms: f64,
    pub lag_max_ms: f64,
    /// Share of timed sends more than 10 ms late.
    pub late_share: f64,
    /// True when the generator, not weir, limited the load: results understate it.
    pub bottleneck: bool,
}

/// 1 s buckets of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    pub seconds: usize,
    /// Cohort name -> outcome name -> requests sent in each second.
    pub cohorts: BTreeMap<String, BTreeMap<String, Vec<u32>>>,
    /// Most requests holding an app worker, per second.
    pub upstream_in_flight: Vec<u32>,
    /// Most requests waiting in the app's backlog, per second.
    pub upstream_queued: Vec<u32>,
    /// Workers the app had, per second (warm-up).
    pub upstream_workers: Vec<u32>,
    /// Requests the app refused, per second.
    pub upstream_refused: Vec<u32>,
    /// Failed health checks, per second.
    pub health_failures: Vec<u32>,
    /// Seconds in which the app was restarted.
    pub restarts: Vec<usize>,
}

/// One check's result for one variant.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub variant: String,
    pub check: String,
    pub line: Option<usize>,
    pub value: Option<f64>,
    pub passed: bool,
    pub pending: Option<String>,
}

impl CheckResult {
    /// Fails the run: not passed and not pending.
    pub fn fails_run(&self) -> bool {
        !self.passed && self.pending.is_none()
    }
}

impl VariantReport {
    /// The value a check looks at, or `None` when it does not exist in this run.
    pub fn metric(&self, subject: &Subject, metric: &str) -> Option<f64> {
        match subject {
            Subject::Cohort(name) => {
                let c = self.cohorts.iter().find(|c| &c.name == name)?;
                cohort_metric(c, metric)
            }
            Subject::Upstream => {
                let u = &self.upstream;
                Some(match metric {
                    "workers" => u.workers as f64,
                    "max_in_flight" => u.max_in_flight as f64,
                    "max_queued" => u.max_queued as f64,
                    "served" => u.served as f64,
                    "refused" => u.refused as f64,
                    "abandoned" => u.abandoned as f64,
                    "health_checks" => u.health_checks as f64,
                    "health_failures" => u.health_failures as f64,
                    "restarts" => u.restarts as f64,
                    "demand_samples" => u.demand_samples as f64,
                    "busy_under_demand" => u.busy_under_demand,
                    _ => return None,
                })
            }
            Subject::Generator => {
                let g = &self.generator;
                Some(match metric {
                    "lag_p50_ms" => g.lag_p50_ms,
                    "lag_p99_ms" => g.lag_p99_ms,
                    "lag_max_ms" => g.lag_max_ms,
                    "late_share" => g.late_share,
                    _ => return None,
                })
            }
            Subject::Alert(alert) => self.alerts.as_ref()?.metric(alert, metric),
            // A rule that never fired has no entry: it counts 0.
            Subject::Rule(rule) => {
                let r = self.rules.get(rule);
                Some(match metric {
                    "count" => r.map_or(0, |r| r.count) as f64,
                    "people_precision" => r.map_or(1.0, RuleReport::people_precision),
                    "people_recall" => r.map_or(1.0, RuleReport::people_recall),
                    cohort => r
                        .and_then(|r| r.by_cohort.get(cohort))
                        .copied()
                        .unwrap_or(0) as f64,
                })
            }
        }
    }

    /// Evaluates one check.
    pub fn evaluate(&self, check: &Check) -> (Option<f64>, bool) {
        let value = self.metric(&check.subject, &check.metric);
        (value, value.is_some_and(|v| check.op.holds(v, check.bound)))
    }
}

fn cohort_metric(c: &CohortReport, metric: &str) -> Option<f64> {
    let (name, as_count) = match metric.strip_suffix("_count") {
        Some(n) => (n, true),
        None => (metric, false),
    };
    let n = match name {
        "failed" => c.failed(),
        "reached_app" => c.reached_app,
        "served_2s" => c.served_2s,
        "challenges_solved" => c.challenges_solved,
        "rechallenged" => c.rechallenged,
        other => match OUTCOMES.iter().find(|o| o.as_str() == other) {
            Some(o) => c.count(*o),
            None => {
                return match metric {
                    "sent" => Some(c.sent as f64),
                    "p50_ms" => Some(c.p50_ms),
                    "p95_ms" => Some(c.p95_ms),
                    "p99_ms" => Some(c.p99_ms),
                    "solved_p95_ms" => Some(c.challenged_p95_ms),
                    "reached_app_share" => Some(c.reached_app_share),
                    _ => None,
                };
            }
        },
    };
    Some(if as_count { n as f64 } else { c.share(n) })
}

/// The `q` quantile (0..1) of sorted microseconds, in milliseconds.
pub fn quantile_ms(sorted_us: &[u32], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() - 1) as f64 * q).round() as usize;
    sorted_us[i.min(sorted_us.len() - 1)] as f64 / 1000.0
}

impl SimReport {
    /// True when no check fails the run (pending ones never do).
    pub fn passed(&self) -> bool {
        !self.checks.iter().any(CheckResult::fails_run)
    }

    /// What keeps `variants` from passing: per variant with no check, or with
    /// a check that fails the run, a line naming it. Empty when they pass.
    pub fn unmet(&self, variants: &[&str]) -> Vec<String> {
        let mut unmet = Vec::new();
        for variant in variants {
            let results = self.checks_of(variant);
            if results.is_empty() {
                unmet.push(format!("{variant}: no checks"));
            } else if results.iter().any(|(_, holds)| !holds) {
                unmet.push(format!("{variant}: {results:?}"));
            }
        }
        unmet
    }

    /// Each check of `variant` and whether it holds (a pending one does).
    pub fn checks_of(&self, variant: &str) -> Vec<(String, bool)> {
        (self.checks.iter())
            .filter(|c| c.variant == variant)
            .map(|c| (c.check.clone(), !c.fails_run()))
            .collect()
    }

    /// The side-by-side terminal table and the check list.
    pub fn to_text(&self) -> String {
        let mut t = TextTable::new(&self.variants);
        let _ = writeln!(
            t.out,
            "scenario: {} ({}s per variant)",
            self.scenario, self.duration_s
        );
        t.row("", self.variants.iter().map(|v| v.name.clone()).collect());
        t.row(
            "gateway",
            (self.variants.iter())
                .map(|v| match &v.load_balancer {
                    Some(lb) => format!("{} behind {lb}", v.gateway.as_str()),
                    None => v.gateway.as_str().to_string(),
                })
                .collect(),
        );
        let cohort_names: Vec<String> = (self.variants.first())
            .map(|v| v.cohorts.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        for name in &cohort_names {
            self.cohort_rows(&mut t, name);
        }
        self.upstream_rows(&mut t);
        self.rule_lines(&mut t);
        self.generator_rows(&mut t);
        let mut out = t.out;
        if !self.checks.is_empty() {
            out.push_str("\nchecks:\n");
        }
        for c in &self.checks {
            let verdict = match (c.passed, &c.pending) {
                (true, _) => "pass".to_string(),
                (false, Some(why)) => format!("PENDING ({why})"),
                (false, None) => "FAIL".to_string(),
            };
            let value = c.value.map_or("missing".to_string(), fmt_value);
            let line = c.line.map_or(String::new(), |l| format!(" [line {l}]"));
            let _ = writeln!(
                out,
                "  {verdict:<22} {:<12} {}  (value {value}){line}",
                c.variant, c.check
            );
        }
        out
    }

    /// One cohort's rows: outcomes, latency, challenges.
    fn cohort_rows(&self, t: &mut TextTable, name: &str) {
        let cohorts: Vec<Option<&CohortReport>> = (self.variants.iter())
            .map(|v| v.cohorts.iter().find(|c| c.name == name))
            .collect();
        let cell = |f: &dyn Fn(&CohortReport) -> String| -> Vec<String> {
            cohorts.iter().map(|c| c.map_or("-".into(), f)).collect()
        };
        t.row(&format!("{name}: sent"), cell(&|c| c.sent.to_string()));
        for o in OUTCOMES {
            let any = cohorts.iter().flatten().any(|c| c.count(o) > 0);
            if o == Outcome::Served || any {
                t.row(
                    &format!("  {}", o.as_str()),
                    cell(&|c| pct_count(c, c.count(o))),
                );
            }
        }
        t.row("  served within 2 s", cell(&|c| pct_count(c, c.served_2s)));
        t.row("  reached app", cell(&|c| pct_count(c, c.reached_app)));
        t.row(
            "  share of the app's requests",
            cell(&|c| format!("{:.1}%", c.reached_app_share * 100.0)),
        );
        t.row(
            "  p50/p95/p99 ms",
            cell(&|c| format!("{:.0}/{:.0}/{:.0}", c.p50_ms, c.p95_ms, c.p99_ms)),
        );
        if cohorts.iter().flatten().any(|c| c.challenges_solved > 0) {
            t.row(
                "  solved challenges, p50/p95 ms",
                cell(&|c| {
                    format!(
                        "{} {:.0}/{:.0}",
                        c.challenges_solved, c.challenged_p50_ms, c.challenged_p95_ms
                    )
                }),
            );
            t.row(
                "  challenged again in a visit",
                cell(&|c| c.rechallenged.to_string()),
            );
        }
    }

    /// The app's rows.
    fn upstream_rows(&self, t: &mut TextTable) {
        let up = |f: &dyn Fn(&UpstreamReport) -> String| {
            self.variants.iter().map(|v| f(&v.upstream)).collect()
        };
        t.row(
            "upstream: max in-flight / W",
            up(&|u| format!("{}/{}", u.max_in_flight, u.workers)),
        );
        t.row("  max queued", up(&|u| u.max_queued.to_string()));
        t.row("  served", up(&|u| u.served.to_string()));
        t.row("  refused (backlog full)", up(&|u| u.refused.to_string()));
        t.row("  cut (abandoned)", up(&|u| u.abandoned.to_string()));
        t.row(
            "  health failed / checks",
            up(&|u| format!("{}/{}", u.health_failures, u.health_checks)),
        );
        t.row("  restarts", up(&|u| u.restarts.to_string()));
        t.row(
            "  busy while anyone waited",
            up(&|u| format!("{:.1}%", u.busy_under_demand * 100.0)),
        );
    }

    /// Rejections per rule, who they hit, how well weir's people signal told, and
    /// the alert replay.
    fn rule_lines(&self, t: &mut TextTable) {
        let mut rules: Vec<&String> = self.variants.iter().flat_map(|v| v.rules.keys()).collect();
        rules.sort();
        rules.dedup();
        for rule in rules {
            t.row(
                &format!("rule {rule}"),
                (self.variants.iter())
                    .map(|v| v.rules.get(rule).map_or(0, |r| r.count).to_string())
                    .collect(),
            );
        }
        let out = &mut t.out;
        for v in &self.variants {
            for (rule, r) in v.rules.iter().filter(|(_, r)| !r.by_cohort.is_empty()) {
                let parts: Vec<String> = r
                    .by_cohort
                    .iter()
                    .map(|(c, n)| format!("{c} {n}"))
                    .collect();
                let _ = writeln!(out, "  {}: {rule} hit {}", v.name, parts.join(", "));
                if r.people > 0 || r.flagged > 0 {
                    let _ = writeln!(
                        out,
                        "  {}: {rule} flagged {} as people ({} were): precision {:.2}, recall {:.2}",
                        v.name,
                        r.flagged,
                        r.flagged_people,
                        r.people_precision(),
                        r.people_recall()
                    );
                }
            }
        }
        for v in &self.variants {
            if let Some(a) = &v.alerts {
                let _ = writeln!(out, "  {}: {}", v.name, a.summary());
            }
        }
    }

    /// The generator's lag, and a warning for each variant it limited.
    fn generator_rows(&self, t: &mut TextTable) {
        t.row(
            "generator lag p99 / max ms",
            (self.variants.iter())
                .map(|v| {
                    format!(
                        "{:.1}/{:.0}",
                        v.generator.lag_p99_ms, v.generator.lag_max_ms
                    )
                })
                .collect(),
        );
        for v in &self.variants {
            if v.generator.bottleneck {
                let _ = writeln!(
                    t.out,
                    "WARNING: {}: the load generator fell behind (lag p99 {:.1} ms, {:.1}% of sends \
                     >10 ms late): the machine, not weir, limited the load",
                    v.name,
                    v.generator.lag_p99_ms,
                    v.generator.late_share * 100.0
                );
            }
        }
    }

    /// A self-contained HTML page.
    pub fn to_html(&self) -> String {
        let mut h = String::new();
        self.write_html_head(&mut h);
        // The picture first: what people got under each variant, then each
        // variant's seconds; the numbers after (a 120-line table opening the
        // page hid the charts below the fold).
        h.push_str("<h2>People</h2>");
        h.push_str(&people_bars(&self.variants));
        h.push_str("<div class=\"legend\">");
        for o in OUTCOMES {
            let _ = write!(
                h,
                "<span><i style=\"background:{}\"></i>{}</span>",
                color(o),
                o.as_str()
            );
        }
        h.push_str("</div><div class=\"variants\">");
        for v in &self.variants {
            write_variant_charts(&mut h, v);
        }
        h.push_str("</div><h2>Side by side</h2><pre>");
        h.push_str(&esc(&self.to_text()));
        h.push_str("</pre>");
        self.write_checks_table(&mut h);
        h.push_str("</body></html>\n");
        h
    }

    /// The page's head and style, its title, and what the run stands for.
    fn write_html_head(&self, h: &mut String) {
        let _ = write!(
            h,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>weir sim: {}</title><style>\
             body{{font:14px system-ui,sans-serif;margin:2em;color:#222}}\
             table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}\
             th:first-child,td:first-child{{text-align:left}}.pass{{color:#080}}.fail{{color:#c00;font-weight:bold}}\
             .pending{{color:#a60}}.variants{{display:flex;flex-wrap:wrap;gap:2em}}.variant{{flex:1;min-width:480px}}\
             .legend span{{display:inline-block;margin-right:1em}}.legend i{{display:inline-block;width:10px;height:10px;margin-right:4px}}\
             .warn{{background:#fee;padding:.5em;border:1px solid #c00}}</style></head><body>",
            esc(&self.scenario)
        );
        let _ = write!(
            h,
            "<h1>{}</h1><p>{}</p>",
            esc(&self.scenario),
            esc(&self.description)
        );
        let _ = write!(
            h,
            "<p>{} s per variant; one second here stands for {} s of the incident{}.</p>",
            self.duration_s,
            self.compression,
            self.story_start
                .as_ref()
                .map_or(String::new(), |s| format!(", starting at {}", esc(s)))
        );
    }

    /// The table of checks: each with its variant, value and result.
    fn write_checks_table(&self, h: &mut String) {
        h.push_str("<h2>Checks</h2><table><tr><th>variant</th><th>check</th><th>value</th><th>result</th></tr>");
        for c in &self.checks {
            let (class, text) = match (c.passed, &c.pending) {
                (true, _) => ("pass", "pass".to_string()),
                (false, Some(why)) => ("pending", format!("pending: {why}")),
                (false, None) => ("fail", "FAIL".to_string()),
            };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td></tr>",
                esc(&c.variant),
                esc(&c.check),
                c.value.map_or("missing".into(), fmt_value),
                esc(&text)
            );
        }
        h.push_str("</table>");
    }
}

/// One variant's column of the HTML page: its cohorts' requests a second by
/// outcome, and its app's busy workers.
fn write_variant_charts(h: &mut String, v: &VariantReport) {
    let _ = write!(
        h,
        "<div class=\"variant\"><h2>{}</h2><p>{}</p>",
        esc(&v.name),
        esc(&v.description)
    );
    if v.generator.bottleneck {
        h.push_str(
            "<p class=\"warn\">The load generator fell behind: the machine limited the load.</p>",
        );
    }
    for (name, series) in &v.timeline.cohorts {
        let _ = write!(h, "<h3>{} — requests/s by outcome</h3>", esc(name));
        h.push_str(&stacked_bars(series, v.timeline.seconds));
    }
    let _ = write!(h, "<h3>app: workers busy (max per s) vs W</h3>");
    h.push_str(&upstream_chart(&v.timeline));
    h.push_str("</div>");
}

/// The terminal table: a label column, then one column per variant.
struct TextTable {
    out: String,
    width: usize,
}

impl TextTable {
    fn new(variants: &[VariantReport]) -> TextTable {
        let width = variants
            .iter()
            .map(|v| v.name.len())
            .max()
            .unwrap_or(0)
            .max(14);
        TextTable {
            out: String::new(),
            width,
        }
    }

    fn row(&mut self, label: &str, cells: Vec<String>) {
        let _ = write!(self.out, "{label:<30}");
        for c in cells {
            let _ = write!(self.out, " {c:>width$}", width = self.width);
        }
        self.out.push('\n');
    }
}

fn pct_count(c: &CohortReport, n: u64) -> String {
    format!("{:.1}% ({n})", c.share(n) * 100.0)
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

fn color(o: Outcome) -> &'static str {
    match o {
        Outcome::Served => "#2a9d3a",
        Outcome::Rejected429 => "#f0a020",
        Outcome::Unavailable503 => "#d03030",
        Outcome::Error5xx => "#801010",
        Outcome::ConnError => "#8040a0",
        Outcome::Timeout => "#707070",
        Outcome::Challenged => "#3070d0",
        Outcome::Other => "#b0b0b0",
        Outcome::Unfinished => "#404040",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One horizontal bar per variant: the share of people's requests served,
/// refused and failed, labelled.
fn people_bars(variants: &[VariantReport]) -> String {
    const ROW: f64 = 28.0;
    const LABEL: f64 = 140.0;
    const BAR: f64 = 520.0;
    let height = ROW * variants.len() as f64 + 10.0;
    let mut h = format!(
        "<svg class=\"people\" width=\"{}\" height=\"{height}\" role=\"img\">",
        LABEL + BAR + 20.0
    );
    for (i, v) in variants.iter().enumerate() {
        let t = v.people();
        let y = 5.0 + i as f64 * ROW;
        let _ = write!(
            h,
            "<text x=\"{}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\">{}</text>",
            LABEL - 8.0,
            y + 15.0,
            esc(&v.name)
        );
        let mut x = LABEL;
        let parts = [
            ("served", t.served, color(Outcome::Served)),
            ("refused", t.refused, color(Outcome::Rejected429)),
            ("failed", t.failed, color(Outcome::Error5xx)),
        ];
        for (what, n, fill) in parts {
            let w = t.pct(n) / 100.0 * BAR;
            if w <= 0.0 {
                continue;
            }
            let _ = write!(
                h,
                "<rect class=\"people-bar\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"20\" fill=\"{fill}\"><title>{}: {what} {:.1}% ({n} of {})</title></rect>",
                esc(&v.name),
                t.pct(n),
                t.sent
            );
            x += w;
        }
        let _ = write!(
            h,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#fff\">{:.1}% served</text>",
            LABEL + 6.0,
            y + 14.0,
            t.pct(t.served)
        );
    }
    h.push_str("</svg><p>People's requests (people and editors): served, refused (429, 503, a challenge left unsolved), failed (other 5xx, connection errors, timeouts).</p>");
    h
}

const CHART_W: f64 = 560.0;
const CHART_H: f64 = 160.0;

fn axis(h: &mut String, max: f64, seconds: usize) {
    let _ = write!(
        h,
        "<line x1=\"40\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#999\"/><line x1=\"40\" y1=\"10\" x2=\"40\" y2=\"{b}\" stroke=\"#999\"/>\
         <text x=\"36\" y=\"16\" font-size=\"10\" text-anchor=\"end\">{max:.0}</text>\
         <text x=\"36\" y=\"{b}\" font-size=\"10\" text-anchor=\"end\">0</text>\
         <text x=\"{r}\" y=\"{t}\" font-size=\"10\" text-anchor=\"end\">{seconds} s</text>",
        b = CHART_H + 10.0,
        r = 40.0 + CHART_W,
        t = CHART_H + 24.0,
    );
}

fn stacked_bars(series: &BTreeMap<String, Vec<u32>>, seconds: usize) -> String {
    let totals: Vec<u32> = (0..seconds)
        .map(|s| {
            series
                .values()
                .map(|v| v.get(s).copied().unwrap_or(0))
                .sum()
        })
        .collect();
    let max = totals.iter().copied().max().unwrap_or(0).max(1) as f64;
    let bw = CHART_W / seconds.max(1) as f64;
    let mut h = format!(
        "<svg width=\"{}\" height=\"{}\" role=\"img\">",
        CHART_W + 50.0,
        CHART_H + 30.0
    );
    for s in 0..seconds {
        let mut y = CHART_H + 10.0;
        for o in OUTCOMES {
            let n = series
                .get(o.as_str())
                .and_then(|v| v.get(s))
                .copied()
                .unwrap_or(0);
            if n == 0 {
                continue;
            }
            let hgt = n as f64 / max * CHART_H;
            y -= hgt;
            let _ = write!(
                h,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{hgt:.1}\" fill=\"{}\"><title>{s}s {}: {n}</title></rect>",
                40.0 + s as f64 * bw,
                (bw - 0.5).max(0.5),
                color(o),
                o.as_str()
            );
        }
    }
    axis(&mut h, max, seconds);
    h.push_str("</svg>");
    h
}

fn upstream_chart(t: &Timeline) -> String {
    let seconds = t.seconds.max(1);
    let max = (t
        .upstream_workers
        .iter()
        .chain(&t.upstream_in_flight)
        .chain(&t.upstream_queued))
    .copied()
    .max()
    .unwrap_or(0)
    .max(1) as f64;
    let x = |s: usize| 40.0 + (s as f64 + 0.5) * CHART_W / seconds as f64;
    let y = |v: u32| CHART_H + 10.0 - v as f64 / max * CHART_H;
    let line = |v: &[u32], color: &str, label: &str| {
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(s, n)| format!("{:.1},{:.1}", x(s), y(*n)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"><title>{label}</title></polyline>",
            pts.join(" ")
        )
    };
    let mut h = format!(
        "<svg width=\"{}\" height=\"{}\" role=\"img\">",
        CHART_W + 50.0,
        CHART_H + 30.0
    );
    for s in &t.restarts {
        let _ = write!(
            h,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"10\" y2=\"{1}\" stroke=\"#d03030\" stroke-dasharray=\"3\"><title>restart at {s}s</title></line>",
            x(*s),
            CHART_H + 10.0
        );
    }
    h.push_str(&line(&t.upstream_workers, "#222", "W (workers)"));
    h.push_str(&line(&t.upstream_queued, "#f0a020", "queued (max per s)"));
    h.push_str(&line(
        &t.upstream_in_flight,
        "#3070d0",
        "in flight (max per s)",
    ));
    axis(&mut h, max, seconds);
    h.push_str(
        "</svg><div class=\"legend\"><span><i style=\"background:#222\"></i>W</span>\
                <span><i style=\"background:#3070d0\"></i>in flight</span>\
                <span><i style=\"background:#f0a020\"></i>queued</span>\
                <span><i style=\"background:#d03030\"></i>restart</span></div>",
    );
    h
}
