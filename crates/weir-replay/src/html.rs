//! The HTML report of `weir replay --html`: one self-contained page (no
//! script, no external asset) with the run's totals, a per-minute chart of
//! rejections by rule and of those that looked like people, and each rule's
//! breakdowns by level, user-agent family and prefix.
//!
//! This module formats a finished [`ReplayRun`]; it decides and counts
//! nothing (see `engine`).

use std::collections::BTreeMap;
use std::fmt::Write;

use super::engine::{ReplayRun, RuleReport, minute};
use weir::challenge::page::escape as esc;

const CHART_W: f64 = 880.0;
const CHART_H: f64 = 220.0;
/// Left margin for the axis labels.
const LEFT: f64 = 48.0;
/// One colour per rule, in name order (repeats after eight rules).
const COLORS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac",
];

/// The page for `run`, whose logs were `sources`.
pub fn report(run: &ReplayRun, sources: &[String]) -> String {
    let r = &run.report;
    let mut h = String::with_capacity(16 * 1024);
    h.push_str(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>weir replay</title><style>\
         body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:960px;color:#222}\
         table{border-collapse:collapse;margin:.5em 0 1em}td,th{padding:2px 10px;text-align:left}\
         td.n{text-align:right;font-variant-numeric:tabular-nums}tr:nth-child(even){background:#f4f4f4}\
         .legend span{margin-right:1.2em}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}\
         .note{color:#8a5a00}.grid{display:flex;gap:2em;flex-wrap:wrap}\
         </style></head><body>",
    );
    let _ = write!(
        h,
        "<h1>weir replay</h1><p>{} requests from {} to {} (UTC{}), read from {}.</p>",
        r.records,
        esc(r.first.as_deref().unwrap_or("-")),
        esc(r.last.as_deref().unwrap_or("-")),
        esc(&r.zone),
        esc(&sources.join(", ")),
    );
    let _ = write!(
        h,
        "<table id=\"totals\"><tr><th>admitted</th><td class=\"n\">{}</td></tr>\
         <tr><th>rejected by a rule</th><td class=\"n\">{}</td></tr>\
         <tr><th>no route (404)</th><td class=\"n\">{}</td></tr>\
         <tr><th>target unreadable (400/501)</th><td class=\"n\">{}</td></tr>\
         <tr><th>malformed lines</th><td class=\"n\">{}</td></tr></table>",
        r.admitted, r.rejected, r.no_route, r.invalid, run.malformed
    );
    for n in &r.not_replayed {
        let _ = write!(
            h,
            "<p class=\"note not-replayed\">Not replayed: rule <b>{}</b> ({}).</p>",
            esc(&n.rule),
            esc(n.reason)
        );
    }
    if r.sessions_replayed_as_anonymous {
        h.push_str(
            "<p class=\"note not-replayed\">Not replayed: session verification (there is no \
             app to ask): every request replays as anonymous.</p>",
        );
    }
    h.push_str("<h2>Rejections per minute</h2>");
    h.push_str(&chart(r.first.as_deref(), r.last.as_deref(), &r.rules));
    for (i, (name, rule)) in r.rules.iter().enumerate() {
        rule_section(&mut h, name, rule, COLORS[i % COLORS.len()]);
    }
    h.push_str("</body></html>\n");
    h
}

fn rule_section(h: &mut String, name: &str, r: &RuleReport, color: &str) {
    let people: u64 = r.collateral.values().sum();
    let _ = write!(
        h,
        "<h2 class=\"rule\"><i style=\"color:{color}\">&#9632;</i> rule {}</h2>\
         <p>{} rejected ({} in shadow mode) from {} clients in {} /24s and {} /16s; \
         {} looked like people{}.</p><div class=\"grid\">",
        esc(name),
        r.rejections,
        r.shadow_rejections,
        r.distinct_clients,
        r.distinct_subnets,
        r.distinct_networks,
        people,
        if r.collateral.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                r.collateral
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    table(h, "by level", "level", ranked(&r.by_level));
    table(h, "by user agent", "family", ranked(&r.by_user_agent));
    table(h, "busiest prefixes", "prefix", r.top_subnets.clone());
    h.push_str("</div>");
}

/// Counts largest first, ties by name.
fn ranked(counts: &BTreeMap<&'static str, u64>) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = counts.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

fn table(h: &mut String, title: &str, what: &str, rows: Vec<(String, u64)>) {
    let _ = write!(
        h,
        "<table class=\"breakdown\"><caption>{}</caption><tr><th>{what}</th><th>rejections</th></tr>",
        esc(title)
    );
    for (k, n) in rows {
        let _ = write!(h, "<tr><td>{}</td><td class=\"n\">{n}</td></tr>", esc(&k));
    }
    h.push_str("</table>");
}

/// `YYYY-MM-DDTHH:MM` as a minute number (the zone cancels out: every stamp
/// of a report is in the same one).
fn minute_number(stamp: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339(&format!("{stamp}:00Z")).ok()?;
    let secs = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    Some(secs as i64 / 60)
}

/// The chart's minutes: the first one's number and how many.
struct MinuteAxis {
    first: i64,
    minutes: usize,
}

impl MinuteAxis {
    /// The bar of `stamp`, when it is within the chart.
    fn index(&self, stamp: &str) -> Option<usize> {
        minute_number(stamp)
            .map(|m| m - self.first)
            .filter(|i| (0..self.minutes as i64).contains(i))
            .map(|i| i as usize)
    }

    /// Rejections per minute, of every rule, and of those the people
    /// estimate.
    fn totals(&self, rules: &BTreeMap<String, RuleReport>) -> (Vec<u64>, Vec<u64>) {
        let mut stacks = vec![0u64; self.minutes];
        let mut people = vec![0u64; self.minutes];
        for r in rules.values() {
            for (to, per_minute) in [
                (&mut stacks, &r.per_minute),
                (&mut people, &r.people_per_minute),
            ] {
                for (m, n) in per_minute {
                    if let Some(i) = self.index(m) {
                        to[i] += n;
                    }
                }
            }
        }
        (stacks, people)
    }
}

/// Stacked bars per minute (one colour per rule) and a line of the
/// rejections that looked like people.
fn chart(first: Option<&str>, last: Option<&str>, rules: &BTreeMap<String, RuleReport>) -> String {
    let (Some(first), Some(last)) = (first.and_then(minute_number), last.and_then(minute_number))
    else {
        return "<p>No records.</p>".into();
    };
    let axis = MinuteAxis {
        first,
        minutes: (last - first + 1).clamp(1, 60 * 24 * 31) as usize,
    };
    let (stacks, people) = axis.totals(rules);
    let max = stacks.iter().copied().max().unwrap_or(0).max(1) as f64;
    let scale = Scale {
        max,
        bar: (CHART_W - LEFT) / axis.minutes as f64,
    };
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg id=\"per-minute\" width=\"{CHART_W}\" height=\"{}\" role=\"img\" \
         aria-label=\"rejections per minute\">",
        CHART_H + 20.0
    );
    let _ = write!(
        s,
        "<text x=\"0\" y=\"14\" font-size=\"11\">{max}</text>\
         <text x=\"0\" y=\"{CHART_H}\" font-size=\"11\">0</text>\
         <line x1=\"{LEFT}\" y1=\"{CHART_H}\" x2=\"{CHART_W}\" y2=\"{CHART_H}\" stroke=\"#999\"/>"
    );
    stacked_bars(&mut s, &axis, &scale, rules);
    people_line(&mut s, &people, &scale);
    let _ = write!(
        s,
        "<text x=\"{LEFT}\" y=\"{}\" font-size=\"11\">{}</text>\
         <text x=\"{CHART_W}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{}</text></svg>",
        CHART_H + 16.0,
        esc(&minute(first, 0)),
        CHART_H + 16.0,
        esc(&minute(last, 0)),
    );
    legend(&mut s, rules);
    s
}

/// Where the chart draws: its tallest stack of rejections, and the width of
/// a minute's bar.
struct Scale {
    max: f64,
    bar: f64,
}

impl Scale {
    /// The height on the chart of `n` rejections (0 at its foot).
    fn y(&self, n: f64) -> f64 {
        CHART_H - n / self.max * (CHART_H - 10.0)
    }
}

/// A minute's rejections as a bar, stacked by rule in the rules' order, each
/// part with a tooltip of its minute, rule and count.
fn stacked_bars(
    s: &mut String,
    axis: &MinuteAxis,
    scale: &Scale,
    rules: &BTreeMap<String, RuleReport>,
) {
    let bar = scale.bar;
    let mut base = vec![0u64; axis.minutes];
    for (ri, (name, r)) in rules.iter().enumerate() {
        let color = COLORS[ri % COLORS.len()];
        for (m, n) in &r.per_minute {
            let Some(i) = axis.index(m) else { continue };
            let (lo, hi) = (base[i], base[i] + n);
            base[i] = hi;
            let _ = write!(
                s,
                "<rect class=\"bar\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" \
                 fill=\"{color}\"><title>{} {}: {n}</title></rect>",
                LEFT + i as f64 * bar,
                scale.y(hi as f64),
                (bar - 0.5).max(0.5),
                scale.y(lo as f64) - scale.y(hi as f64),
                esc(m),
                esc(name),
            );
        }
    }
}

/// The dashed line of the rejections per minute that looked like people,
/// unless there were none.
fn people_line(s: &mut String, people: &[u64], scale: &Scale) {
    if people.iter().any(|n| *n > 0) {
        let points: Vec<String> = people
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    "{:.1},{:.1}",
                    LEFT + (i as f64 + 0.5) * scale.bar,
                    scale.y(*n as f64)
                )
            })
            .collect();
        let _ = write!(
            s,
            "<polyline id=\"people\" points=\"{}\" fill=\"none\" stroke=\"#d62728\" \
             stroke-width=\"2\" stroke-dasharray=\"4 2\"/>",
            points.join(" ")
        );
    }
}

/// The chart's legend: a colour per rule, and the people line's.
fn legend(s: &mut String, rules: &BTreeMap<String, RuleReport>) {
    s.push_str("<div class=\"legend\">");
    for (ri, name) in rules.keys().enumerate() {
        let _ = write!(
            s,
            "<span><i style=\"background:{}\"></i>{}</span>",
            COLORS[ri % COLORS.len()],
            esc(name)
        );
    }
    s.push_str(
        "<span><i style=\"background:#d62728\"></i>looked like people (estimate)</span></div>",
    );
}
