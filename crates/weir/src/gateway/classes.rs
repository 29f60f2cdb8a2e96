//! Compiling `[classes.NAME]` and their rules: each class's settings,
//! admission lane and coalescing, and its rules validated, then given
//! their state (rate levels their sharded stores, concurrency rules their
//! in-flight tables), carried over from the previous gateway by
//! fingerprint so a reload keeps what unchanged rules counted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use weir_http::body::BodyLimits;

use super::{ByClass, ClassAdmission, Gateway};
use crate::admission::{Coalescer, Lanes};
use crate::config::{ConfigError, KeyPath, LoadedConfig, WhenOver};
use crate::policy::route::ClassSettings;
use crate::policy::rules::{self, KeyKind, RateLevel, Rule, RuleBody};
use weir_limiter::{InflightTable, Quota, RuleFingerprint, RuleStores, StoreConfig};

/// Default `coalesce_max_body_bytes`: a rendered article page.
const COALESCE_MAX_BODY: usize = 1 << 20;
/// Largest `coalesce_max_body_bytes`: every group in flight holds one copy.
const COALESCE_MAX_BODY_LIMIT: usize = 64 << 20;

/// The classes, compiled.
pub(super) struct Classes {
    pub settings: HashMap<String, ClassSettings>,
    pub admission: ByClass<ClassAdmission>,
    pub coalescers: ByClass<Coalescer>,
    pub rules: HashMap<String, Arc<[Rule]>>,
    pub rule_stores: RuleStores,
    pub inflight_tables: HashMap<RuleFingerprint, Arc<InflightTable>>,
    /// The settings of a class the configuration does not name.
    pub default: ClassSettings,
}

pub(super) fn classes(
    loaded: &LoadedConfig,
    previous: Option<&Gateway>,
    errors: &mut Vec<ConfigError>,
) -> Classes {
    let cfg = &loaded.config;
    let root = KeyPath::root();
    let lim = &cfg.limits;
    let mut classes = HashMap::new();
    let mut class_admission = ByClass::default();
    let mut coalescers = ByClass::default();
    let mut rule_defs = Vec::new();
    for (name, c) in &cfg.classes {
        let admission = admission(loaded, name, c, errors);
        if c.coalesce {
            let coalescer = previous
                .and_then(|p| p.coalescers.get(name).cloned())
                .unwrap_or_default();
            coalescers.insert(name.clone(), coalescer);
        }
        class_admission.insert(name.clone(), admission);
        classes.insert(
            name.clone(),
            ClassSettings {
                body: BodyLimits {
                    read_timeout: c.body_read_timeout.map_or(lim.body_read_timeout.0, |d| d.0),
                    min_rate: c.min_body_rate.unwrap_or(lim.min_body_rate),
                    max_bytes: c.max_body_bytes.unwrap_or(lim.max_body_bytes),
                },
                response_timeout: c.response_timeout.map(|d| d.0),
            },
        );
        let at = root.key("classes").key(name).key("rules");
        rule_defs.push((
            name.clone(),
            compile_rules(loaded, &at, name, &c.rules, errors),
        ));
    }
    unique_names(loaded, &rule_defs, errors);
    let (class_rules, rule_stores, inflight_tables) =
        attach_state(loaded, rule_defs, previous, errors);
    Classes {
        settings: classes,
        admission: class_admission,
        coalescers,
        rules: class_rules,
        rule_stores,
        inflight_tables,
        default: ClassSettings {
            body: BodyLimits {
                read_timeout: lim.body_read_timeout.0,
                min_rate: lim.min_body_rate,
                max_bytes: lim.max_body_bytes,
            },
            response_timeout: None,
        },
    }
}

/// A class's admission settings: its lane, queue deadline and coalescing.
fn admission(
    loaded: &LoadedConfig,
    name: &str,
    c: &crate::config::ClassConfig,
    errors: &mut Vec<ConfigError>,
) -> ClassAdmission {
    let root = KeyPath::root();
    let lane = match c.lane.as_deref() {
        None => None,
        Some(l) => match Lanes::standard().by_name(l) {
            Some(lane) => Some(lane),
            None => {
                errors.push(loaded.error_at(
                    &root.key("classes").key(name).key("lane"),
                    format!(
                        "`{l}` is not a lane (verified, visits, newcomers, pass, bots, anonymous, deferred)"
                    ),
                ));
                None
            }
        },
    };
    if c.queue_timeout.is_some_and(|t| t.0.is_zero()) {
        errors.push(loaded.error_at(
            &root.key("classes").key(name).key("queue_timeout"),
            "must be more than 0s",
        ));
    }
    let max_body = c.coalesce_max_body_bytes.unwrap_or(COALESCE_MAX_BODY);
    if max_body > COALESCE_MAX_BODY_LIMIT {
        errors.push(loaded.error_at(
            &root.key("classes").key(name).key("coalesce_max_body_bytes"),
            format!("{max_body} is above the maximum of {COALESCE_MAX_BODY_LIMIT}"),
        ));
    }
    ClassAdmission {
        lane,
        queue_timeout: c.queue_timeout.map(|d| d.0),
        coalesce_max_body: c.coalesce.then_some(max_body),
    }
}

/// Rule names are unique across classes: they label metrics and logs.
fn unique_names(
    loaded: &LoadedConfig,
    rule_defs: &[(String, Vec<RuleDef>)],
    errors: &mut Vec<ConfigError>,
) {
    let root = KeyPath::root();
    let mut names = std::collections::HashSet::new();
    for (_, defs) in rule_defs {
        for d in defs {
            if !names.insert(d.name.clone()) {
                errors.push(loaded.error_at(
                    &root.key("classes"),
                    format!(
                        "rule name `{}` is used twice; rule names must be unique",
                        d.name
                    ),
                ));
            }
        }
    }
}

/// The rules with their state: rate levels get their sharded stores (by
/// fingerprint, the previous gateway's when unchanged), concurrency rules
/// their in-flight tables.
#[allow(clippy::type_complexity)] // the three results go to three Gateway fields
fn attach_state(
    loaded: &LoadedConfig,
    rule_defs: Vec<(String, Vec<RuleDef>)>,
    previous: Option<&Gateway>,
    errors: &mut Vec<ConfigError>,
) -> (
    HashMap<String, Arc<[Rule]>>,
    RuleStores,
    HashMap<RuleFingerprint, Arc<InflightTable>>,
) {
    let rule_stores = build_rule_stores(loaded, &rule_defs, previous, errors);
    let mut inflight_tables = HashMap::new();
    let mut class_rules: HashMap<String, Arc<[Rule]>> = HashMap::new();
    for (class, defs) in rule_defs {
        let compiled: Vec<Rule> = defs
            .into_iter()
            .map(|d| compile_rule(d, &rule_stores, previous, &mut inflight_tables))
            .collect();
        class_rules.insert(class, Arc::from(compiled));
    }
    (class_rules, rule_stores, inflight_tables)
}

/// The sharded stores of every rate level, by fingerprint (the previous
/// gateway's when unchanged); an empty set, with an error, when the
/// configured size cannot be built.
fn build_rule_stores(
    loaded: &LoadedConfig,
    rule_defs: &[(String, Vec<RuleDef>)],
    previous: Option<&Gateway>,
    errors: &mut Vec<ConfigError>,
) -> RuleStores {
    let root = KeyPath::root();
    let cfg = &loaded.config;
    let store_config = StoreConfig::with_max_keys(cfg.rules.max_keys_per_level.max(1024));
    let level_fps: Vec<(RuleFingerprint, StoreConfig)> = rule_defs
        .iter()
        .flat_map(|(_, defs)| defs.iter())
        .flat_map(|d| d.levels.iter().map(|l| (l.fingerprint, store_config)))
        .collect();
    RuleStores::build(&level_fps, previous.map(|p| &p.rule_stores)).unwrap_or_else(|e| {
        errors.push(loaded.error_at(&root.key("rules").key("max_keys_per_level"), e.to_string()));
        RuleStores::default()
    })
}

/// One validated rule with its state attached: a concurrency rule gets its
/// in-flight table (the previous gateway's when unchanged, recorded in
/// `inflight_tables`), a rate rule's levels their stores.
fn compile_rule(
    d: RuleDef,
    rule_stores: &RuleStores,
    previous: Option<&Gateway>,
    inflight_tables: &mut HashMap<RuleFingerprint, Arc<InflightTable>>,
) -> Rule {
    let body = match d.concurrency {
        Some((key, max, fp)) => {
            let table = previous
                .and_then(|p| p.inflight_tables.get(&fp).cloned())
                .unwrap_or_default();
            inflight_tables.insert(fp, table.clone());
            RuleBody::Concurrency {
                key,
                max,
                table,
                fingerprint: fp,
            }
        }
        None => RuleBody::Rate(
            d.levels
                .into_iter()
                .filter_map(|l| {
                    let store = rule_stores.by_fingerprint(l.fingerprint)?.clone();
                    Some(RateLevel {
                        label: weir_limiter::redis::key_label(&d.name, l.key.label()).into(),
                        key: l.key,
                        quota: l.quota,
                        store,
                        fingerprint: l.fingerprint,
                    })
                })
                .collect(),
        ),
    };
    Rule {
        name: Arc::from(d.name.as_str()),
        body,
        exempt_verified: d.exempt.verified,
        exempt_pass: d.exempt.pass,
        exempt_bots: d.exempt.bots,
        defer: d.defer,
        shadow: d.shadow,
        methods: d.methods,
    }
}

/// A rule as validated, before its state is attached.
struct RuleDef {
    name: String,
    levels: Vec<LevelDef>,
    concurrency: Option<(KeyKind, u32, RuleFingerprint)>,
    exempt: Exempt,
    defer: bool,
    shadow: bool,
    methods: Vec<http::Method>,
}

struct LevelDef {
    key: KeyKind,
    quota: Quota,
    fingerprint: RuleFingerprint,
}

/// Longest window a rate level may have: a day (state is kept in memory and
/// snapshots; longer windows belong in the application).
const MAX_WINDOW: Duration = Duration::from_secs(86_400);

fn compile_rules(
    loaded: &LoadedConfig,
    at: &KeyPath,
    class: &str,
    defs: &[crate::config::RuleConfig],
    errors: &mut Vec<ConfigError>,
) -> Vec<RuleDef> {
    use crate::config::RuleKind;
    let mut out = Vec::new();
    for (i, d) in defs.iter().enumerate() {
        let at = at.index(i);
        let before = errors.len();
        if d.name.trim().is_empty() {
            errors.push(loaded.error_at(&at.key("name"), "a rule needs a name"));
        }
        let exempt = exemptions(loaded, &at, d, errors);
        let methods = rule_methods(loaded, &at, d, errors);
        let (levels, concurrency) = match d.kind {
            RuleKind::Rate => (rate_levels(loaded, &at, class, d, errors), None),
            RuleKind::Concurrency => (Vec::new(), concurrency_limit(loaded, &at, class, d, errors)),
        };
        if errors.len() == before {
            out.push(RuleDef {
                name: d.name.clone(),
                levels,
                concurrency,
                exempt,
                defer: d.when_over == WhenOver::Defer,
                shadow: d.shadow,
                methods,
            });
        }
    }
    out
}

/// The rule's `methods`, upper-cased and parsed; each one that is not an
/// HTTP method is an error (and left out).
fn rule_methods(
    loaded: &LoadedConfig,
    at: &KeyPath,
    d: &crate::config::RuleConfig,
    errors: &mut Vec<ConfigError>,
) -> Vec<http::Method> {
    let mut methods = Vec::new();
    for (j, m) in d.methods.iter().enumerate() {
        match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
            Ok(m) => methods.push(m),
            Err(_) => errors.push(loaded.error_at(
                &at.key("methods").index(j),
                format!("`{m}` is not an HTTP method"),
            )),
        }
    }
    methods
}

/// Reports a rate rule whose `limits` are empty or too many, or that
/// carries a concurrency rule's `per` or `max`.
fn check_rate_rule_shape(
    loaded: &LoadedConfig,
    at: &KeyPath,
    d: &crate::config::RuleConfig,
    errors: &mut Vec<ConfigError>,
) {
    if d.limits.is_empty() {
        errors.push(loaded.error_at(
            &at.key("limits"),
            "a rate rule needs at least one entry in `limits`",
        ));
    }
    if d.limits.len() > rules::MAX_LEVELS {
        errors.push(loaded.error_at(
            &at.key("limits"),
            format!("at most {} levels per rule", rules::MAX_LEVELS),
        ));
    }
    if d.per.is_some() || d.max.is_some() {
        errors.push(loaded.error_at(
            &at.key("type"),
            "`per` and `max` belong to concurrency rules; rate rules use `limits`",
        ));
    }
}

/// A rate rule's levels from its `limits` (at least one, at most
/// `rules::MAX_LEVELS`, no window over a day), each with the fingerprint
/// that ties its state to this class, rule and quota; a level with an
/// error is reported and left out.
fn rate_levels(
    loaded: &LoadedConfig,
    at: &KeyPath,
    class: &str,
    d: &crate::config::RuleConfig,
    errors: &mut Vec<ConfigError>,
) -> Vec<LevelDef> {
    check_rate_rule_shape(loaded, at, d, errors);
    let mut levels = Vec::new();
    for (j, l) in d.limits.iter().enumerate() {
        let lat = at.key("limits").index(j);
        let key = match KeyKind::parse(&l.per) {
            Ok(k) => k,
            Err(e) => {
                errors.push(loaded.error_at(&lat.key("per"), e));
                continue;
            }
        };
        if l.window.0 > MAX_WINDOW {
            errors.push(loaded.error_at(
                &lat.key("window"),
                format!("{:?} is longer than a day", l.window),
            ));
            continue;
        }
        let burst = l.burst.unwrap_or(l.rate);
        match Quota::new(l.rate, l.window.0, burst) {
            Ok(quota) => levels.push(LevelDef {
                fingerprint: rules::fingerprint(&[
                    class,
                    &d.name,
                    &l.per,
                    &l.rate.to_string(),
                    &l.window.0.as_nanos().to_string(),
                    &burst.to_string(),
                ]),
                key,
                quota,
            }),
            Err(e) => errors.push(loaded.error_at(&lat, e.to_string())),
        }
    }
    levels
}

/// A concurrency rule's key, `max` (at least 1) and fingerprint, from its
/// `per` and `max`; `None` (with the errors reported) when they are missing
/// or invalid.
fn concurrency_limit(
    loaded: &LoadedConfig,
    at: &KeyPath,
    class: &str,
    d: &crate::config::RuleConfig,
    errors: &mut Vec<ConfigError>,
) -> Option<(KeyKind, u32, RuleFingerprint)> {
    if !d.limits.is_empty() {
        errors.push(loaded.error_at(
            &at.key("limits"),
            "concurrency rules use `per` and `max`, not `limits`",
        ));
    }
    match (&d.per, d.max) {
        (Some(per), Some(max)) if max > 0 => match KeyKind::parse(per) {
            Ok(k) => {
                return Some((
                    k,
                    max,
                    rules::fingerprint(&[class, &d.name, per, "concurrency"]),
                ));
            }
            Err(e) => errors.push(loaded.error_at(&at.key("per"), e)),
        },
        (_, Some(0)) => errors.push(loaded.error_at(&at.key("max"), "must be at least 1")),
        _ => errors.push(loaded.error_at(at, "a concurrency rule needs `per` and `max`")),
    }
    None
}

/// What exempts from a rule (`exempt`): `verified` sessions and, when named,
/// a valid challenge `pass`; each only if something could grant it.
/// Also refuses `when_over = "defer"` on a concurrency rule.
fn exemptions(
    loaded: &LoadedConfig,
    at: &KeyPath,
    d: &crate::config::RuleConfig,
    errors: &mut Vec<ConfigError>,
) -> Exempt {
    let mut exempt = Exempt::default();
    for (j, e) in d.exempt.iter().enumerate() {
        let at = at.key("exempt").index(j);
        match e.as_str() {
            "verified" => {
                exempt.verified = true;
                let sessions = &loaded.config.sessions;
                if sessions.signed_cookie.is_none() && sessions.auth_subrequest.is_none() {
                    errors.push(loaded.error_at(
                        &at,
                        "`verified` exempts nobody: no [sessions] method is configured \
                         (sessions.signed_cookie or sessions.auth_subrequest; see docs/sessions.md)",
                    ));
                }
            }
            "verified_bot" => {
                exempt.bots = true;
                if loaded.config.bots.as_ref().is_none_or(|b| b.crawlers.is_empty()) {
                    errors.push(loaded.error_at(
                        &at,
                        "`verified_bot` exempts nobody: no [[bots.crawlers]] are configured \
                         (see docs/admission.md, verified bots)",
                    ));
                }
            }
            "pass" => {
                exempt.pass = true;
                if loaded.config.challenge.as_ref().is_some_and(|c| !c.enabled) {
                    errors.push(loaded.error_at(
                        &at,
                        "`pass` exempts nobody: `challenge.enabled = false` grants no passes \
                         (see docs/challenge.md)",
                    ));
                }
            }
            other => errors.push(loaded.error_at(
                &at,
                format!(
                    "`{other}` cannot exempt: only `verified` sessions, challenge `pass` holders and \
                     `verified_bot` crawlers can (a cookie's name or presence proves nothing; any \
                     visitor can get one)"
                ),
            )),
        }
    }
    if d.when_over == WhenOver::Defer && d.kind == crate::config::RuleKind::Concurrency {
        errors.push(loaded.error_at(
            &at.key("when_over"),
            "a concurrency rule cannot defer: its limit is the slots it holds; use a rate rule",
        ));
    }
    exempt
}

/// Who a rule does not apply to.
#[derive(Debug, Clone, Copy, Default)]
struct Exempt {
    verified: bool,
    pass: bool,
    bots: bool,
}
