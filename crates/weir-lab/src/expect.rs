//! The pass-criteria grammar of `[[expect]]` checks:
//!
//! ```text
//! check   = subject "." metric op number ["%"]
//! subject = COHORT | "upstream" | "generator" | "rules." RULE | "alerts." ALERT
//! op      = "<" | "<=" | ">" | ">=" | "==" | "!="
//! ```
//!
//! Cohort metrics without `_count` are shares of the cohort's requests (0..1, so
//! `humans.served >= 0.99` or `>= 99%`); with `_count` they are counts. `rules.NAME.count`
//! counts rejections by a rule; `rules.NAME.<cohort>` those that hit one cohort,
//! `rules.NAME.unknown` those whose client address belongs to no cohort, and
//! `rules.NAME.people_precision` / `people_recall` how well weir's people signal
//! (`verified`, `pass`, `browsing` in the access log) told people from the rest.
//! `alerts.ALERT.fired` is 1 when the alert fired in the replay of weir's metrics,
//! `fired_at_min` when (story minutes from the run's start) and `fired_after_min` how
//! long after the first refusal of a person. `rules.*` and `alerts.*` exist only for
//! weir variants.
//!
//! This module parses and compares. It does not know where values come from: the report
//! ([`crate::report::VariantReport::metric`]) looks them up.

use std::fmt;

/// Per-request outcome metrics of a cohort; each also exists as `<name>_count`.
pub const COHORT_SHARES: &[&str] = &[
    "served",
    "rejected_429",
    "unavailable_503",
    "error_5xx",
    "conn_error",
    "timeout",
    "challenged",
    "other",
    "unfinished",
    "failed",
    "reached_app",
    "served_2s",
    "challenges_solved",
    "rechallenged",
];
/// Other cohort metrics (counts, milliseconds, and one share of the app).
/// `solved_p95_ms`: from sending a request that met a challenge to its
/// answer after solving (the challenge page, the work or the wait, the
/// answer and the request again). `reached_app_share`: of the requests that
/// reached the app from any cohort, the share that were this cohort's.
pub const COHORT_VALUES: &[&str] = &[
    "sent",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "solved_p95_ms",
    "reached_app_share",
];
/// Metrics of the app behind weir.
pub const UPSTREAM_METRICS: &[&str] = &[
    "workers",
    "max_in_flight",
    "max_queued",
    "served",
    "refused",
    "abandoned",
    "health_checks",
    "health_failures",
    "restarts",
    "demand_samples",
    "busy_under_demand",
];
/// Metrics of the load generator itself.
pub const GENERATOR_METRICS: &[&str] = &["lag_p50_ms", "lag_p99_ms", "lag_max_ms", "late_share"];

/// Rule metrics that are not cohort names: rejections, and how well weir's
/// people signal (`verified`, `pass`, `browsing`) told people from crawlers
/// among them (shares, 1 when there was nothing to tell).
pub const RULE_METRICS: &[&str] = &["count", UNKNOWN_CLIENT, "people_precision", "people_recall"];

/// Metrics of an alert replayed over weir's metrics: whether it fired (0/1), when
/// (story minutes from the run's start) and how long after the first refusal of a
/// person (story minutes; negative when it fired before any).
pub const ALERT_METRICS: &[&str] = &["fired", "fired_at_min", "fired_after_min"];

/// The pseudo-cohort of rejected clients whose address belongs to no cohort (a load
/// balancer weir does not trust): `rules.NAME.unknown`.
pub const UNKNOWN_CLIENT: &str = "unknown";

/// What a check looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Cohort(String),
    Upstream,
    Generator,
    Rule(String),
    Alert(String),
}

impl Subject {
    /// Whether the subject reads weir's own metrics or access log, which a rival
    /// gateway does not have.
    pub fn weir_only(&self) -> bool {
        matches!(self, Subject::Rule(_) | Subject::Alert(_))
    }
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Eq => "==",
            Op::Ne => "!=",
        }
    }

    /// `value op bound`. Equality is to within 1e-9: values are counts or shares.
    pub fn holds(self, value: f64, bound: f64) -> bool {
        let equal = (value - bound).abs() <= 1e-9;
        match self {
            Op::Lt => value < bound && !equal,
            Op::Le => value <= bound || equal,
            Op::Gt => value > bound && !equal,
            Op::Ge => value >= bound || equal,
            Op::Eq => equal,
            Op::Ne => !equal,
        }
    }
}

/// One parsed check.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub subject: Subject,
    pub metric: String,
    pub op: Op,
    pub bound: f64,
    /// The check as written, for reports.
    pub text: String,
}

/// Why a check does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    #[error("empty check")]
    Empty,
    #[error(
        "no comparison: write `<subject>.<metric> <op> <number>` with op one of < <= > >= == !="
    )]
    NoOperator,
    #[error("{0:?} is not a number")]
    BadNumber(String),
    #[error(
        "{0:?} is not `<subject>.<metric>` (subject: a cohort, upstream, generator, \
         rules.NAME or alerts.NAME)"
    )]
    BadTarget(String),
    #[error("{subject} has no metric {metric:?}; it has: {known}")]
    UnknownMetric {
        subject: String,
        metric: String,
        known: String,
    },
}

impl Check {
    /// Parses one check.
    pub fn parse(text: &str) -> Result<Check, CheckError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(CheckError::Empty);
        }
        // Two-character operators first, so `<=` is not read as `<`.
        const OPS: [(&str, Op); 6] = [
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("==", Op::Eq),
            ("!=", Op::Ne),
            ("<", Op::Lt),
            (">", Op::Gt),
        ];
        let (pos, token, op) = OPS
            .iter()
            .filter_map(|(t, op)| trimmed.find(t).map(|p| (p, *t, *op)))
            .min_by_key(|(p, t, _)| (*p, std::cmp::Reverse(t.len())))
            .ok_or(CheckError::NoOperator)?;
        let target = trimmed[..pos].trim();
        let number = trimmed[pos + token.len()..].trim();
        let bound = parse_number(number)?;
        let (subject, metric) = parse_target(target)?;
        check_metric(&subject, &metric)?;
        Ok(Check {
            subject,
            metric,
            op,
            bound,
            text: trimmed.to_string(),
        })
    }

    /// The cohort this check names, if any (to verify it exists).
    pub fn cohort_name(&self) -> Option<&str> {
        match &self.subject {
            Subject::Cohort(c) => Some(c),
            Subject::Rule(_) if !RULE_METRICS.contains(&self.metric.as_str()) => Some(&self.metric),
            _ => None,
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn parse_number(text: &str) -> Result<f64, CheckError> {
    let (digits, scale) = match text.strip_suffix('%') {
        Some(d) => (d.trim(), 0.01),
        None => (text, 1.0),
    };
    match digits.replace('_', "").parse::<f64>() {
        Ok(v) if v.is_finite() && !digits.is_empty() => Ok(v * scale),
        _ => Err(CheckError::BadNumber(text.to_string())),
    }
}

fn parse_target(target: &str) -> Result<(Subject, String), CheckError> {
    let bad = || CheckError::BadTarget(target.to_string());
    let parts: Vec<&str> = target.split('.').collect();
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    if !parts.iter().all(|p| ok(p)) {
        return Err(bad());
    }
    match parts.as_slice() {
        ["rules", rule, metric] => Ok((Subject::Rule((*rule).into()), (*metric).into())),
        ["rules", ..] => Err(bad()),
        ["alerts", alert, metric] => Ok((Subject::Alert((*alert).into()), (*metric).into())),
        ["alerts", ..] => Err(bad()),
        ["upstream", metric] => Ok((Subject::Upstream, (*metric).into())),
        ["generator", metric] => Ok((Subject::Generator, (*metric).into())),
        [cohort, metric] => Ok((Subject::Cohort((*cohort).into()), (*metric).into())),
        _ => Err(bad()),
    }
}

fn check_metric(subject: &Subject, metric: &str) -> Result<(), CheckError> {
    let (name, known): (String, Vec<String>) = match subject {
        Subject::Cohort(c) => {
            let counts = COHORT_SHARES.iter().map(|m| format!("{m}_count"));
            let all = (COHORT_SHARES.iter().map(|m| m.to_string()))
                .chain(counts)
                .chain(COHORT_VALUES.iter().map(|m| m.to_string()))
                .collect();
            (format!("cohort {c:?}"), all)
        }
        Subject::Upstream => (
            "upstream".into(),
            UPSTREAM_METRICS.iter().map(|m| m.to_string()).collect(),
        ),
        Subject::Generator => (
            "generator".into(),
            GENERATOR_METRICS.iter().map(|m| m.to_string()).collect(),
        ),
        Subject::Alert(a) => (
            format!("alert {a:?}"),
            ALERT_METRICS.iter().map(|m| m.to_string()).collect(),
        ),
        // `rules.NAME.<cohort>` is checked against the cohorts when the scenario loads.
        Subject::Rule(_) => return Ok(()),
    };
    if known.iter().any(|k| k == metric) {
        Ok(())
    } else {
        Err(CheckError::UnknownMetric {
            subject: name,
            metric: metric.into(),
            known: known.join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checks() {
        let c = |s: &str| Check::parse(s).map(|c| (c.subject, c.metric, c.op, c.bound));
        let cohort = |s: &str| Subject::Cohort(s.into());
        #[rustfmt::skip]
        type Parsed = Result<(Subject, String, Op, f64), CheckError>;
        let cases: Vec<(&str, Parsed)> = vec![
            (
                "humans.served >= 0.99",
                Ok((cohort("humans"), "served".into(), Op::Ge, 0.99)),
            ),
            (
                "humans.served>=99%",
                Ok((cohort("humans"), "served".into(), Op::Ge, 0.99)),
            ),
            (
                "  upstream.refused == 0 ",
                Ok((Subject::Upstream, "refused".into(), Op::Eq, 0.0)),
            ),
            (
                "upstream.max_in_flight <= 10",
                Ok((Subject::Upstream, "max_in_flight".into(), Op::Le, 10.0)),
            ),
            (
                "crawlers.reached_app < 0.2",
                Ok((cohort("crawlers"), "reached_app".into(), Op::Lt, 0.2)),
            ),
            (
                "humans.rejected_429_count > 1_000",
                Ok((
                    cohort("humans"),
                    "rejected_429_count".into(),
                    Op::Gt,
                    1000.0,
                )),
            ),
            (
                "rules.client_in_flight.count != 0",
                Ok((
                    Subject::Rule("client_in_flight".into()),
                    "count".into(),
                    Op::Ne,
                    0.0,
                )),
            ),
            (
                "rules.per_ip_cap.flood >= 1",
                Ok((
                    Subject::Rule("per_ip_cap".into()),
                    "flood".into(),
                    Op::Ge,
                    1.0,
                )),
            ),
            (
                "generator.lag_p99_ms < 50",
                Ok((Subject::Generator, "lag_p99_ms".into(), Op::Lt, 50.0)),
            ),
            ("", Err(CheckError::Empty)),
            ("humans.served", Err(CheckError::NoOperator)),
            (
                "humans.served >= lots",
                Err(CheckError::BadNumber("lots".into())),
            ),
            ("humans.served >= ", Err(CheckError::BadNumber("".into()))),
            ("humans.served >= %", Err(CheckError::BadNumber("%".into()))),
            ("humans >= 1", Err(CheckError::BadTarget("humans".into()))),
            ("a.b.c >= 1", Err(CheckError::BadTarget("a.b.c".into()))),
            ("rules.x >= 1", Err(CheckError::BadTarget("rules.x".into()))),
            (
                "alerts.WeirRuleHittingPeople.fired_after_min <= 5",
                Ok((
                    Subject::Alert("WeirRuleHittingPeople".into()),
                    "fired_after_min".into(),
                    Op::Le,
                    5.0,
                )),
            ),
            (
                "alerts.X >= 1",
                Err(CheckError::BadTarget("alerts.X".into())),
            ),
            (
                "humans..served >= 1",
                Err(CheckError::BadTarget("humans..served".into())),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(c(text), want, "{text:?}");
        }
    }

    #[test]
    fn unknown_metrics_list_the_known_ones() {
        let err = Check::parse("upstream.refusd == 0").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("\"refusd\"") && text.contains("refused"),
            "{text}"
        );
        let err = Check::parse("humans.servd >= 1").unwrap_err();
        assert!(err.to_string().contains("served_count"), "{err}");
        let err = Check::parse("alerts.A.fird == 1").unwrap_err();
        assert!(err.to_string().contains("fired_after_min"), "{err}");
    }

    #[test]
    fn comparisons() {
        #[rustfmt::skip]
        let cases = [
            (Op::Lt, 1.0, 2.0, true), (Op::Lt, 2.0, 2.0, false),
            (Op::Le, 2.0, 2.0, true), (Op::Le, 2.1, 2.0, false),
            (Op::Gt, 3.0, 2.0, true), (Op::Gt, 2.0, 2.0, false),
            (Op::Ge, 0.99, 0.99, true), (Op::Ge, 0.98, 0.99, false),
            (Op::Eq, 0.1 + 0.2, 0.3, true), (Op::Eq, 1.0, 0.0, false),
            (Op::Ne, 1.0, 0.0, true), (Op::Ne, 0.0, 0.0, false),
        ];
        for (op, v, b, want) in cases {
            assert_eq!(op.holds(v, b), want, "{v} {} {b}", op.as_str());
        }
    }
}
