//! Scenario files for `weir sim`: the schema, loading with errors that name the line and
//! key (the same [`ConfigError`] weir's own config uses), and validation.
//!
//! A scenario is one incident in miniature: an app ([`AppConfig`]), one or more gateway
//! configurations to compare (`[weir.<variant>]`: weir, or a rival nginx or HAProxy with
//! `gateway = "nginx"`), traffic cohorts (`[[cohorts]]`), the alert rules to replay over
//! weir's metrics (`[alerts]`) and the checks each variant must pass (`[[expect]]`). See
//! `docs/lab.md` for the format.
//!
//! This module only reads and checks files. It does not start anything (see
//! [`crate::runner`]), and it does not check the embedded weir configs beyond their
//! presence: weir's own loader does that when a variant runs, so its errors stay its own.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use super::addresses::NetworkGroup;
use super::app::AppConfig;
use super::expect::{Check, Subject};
use weir::config::{ConfigDuration, ConfigError, ConfigErrors, KeyPath, TomlLocator, line_of};

/// Longest scenario the lab runs: CI runs every scenario, and a laptop demo must stay short.
pub const MAX_DURATION: Duration = Duration::from_secs(600);
/// Most clients of all cohorts together: each is a socket (or several) in this process.
pub const MAX_CLIENT_CONNECTIONS: usize = 6000;

/// The whole scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    pub scenario: ScenarioMeta,
    #[serde(default)]
    pub app: AppConfig,
    #[serde(default)]
    pub health: HealthConfig,
    #[serde(default)]
    pub topology: TopologyConfig,
    /// weir configurations to compare, by variant name.
    #[serde(default)]
    pub weir: std::collections::BTreeMap<String, WeirVariantConfig>,
    #[serde(default)]
    pub cohorts: Vec<CohortConfig>,
    /// Prometheus alert rules evaluated over weir's metrics after each weir variant.
    #[serde(default)]
    pub alerts: Option<AlertsConfig>,
    #[serde(default)]
    pub expect: Vec<ExpectConfig>,
}

/// `[alerts]`: alert rules replayed with `promtool test rules` over the metrics
/// scraped from weir during each weir variant, on the story's clock (see
/// [`crate::alerts`]).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// The rules file, relative to the scenario file (e.g. `../docs/alerts.yml`).
    pub rules: String,
    /// Prometheus's scrape interval in story time; the lab scrapes weir every
    /// `scrape_interval / compression` of run time (at least 50 ms). Default 1m.
    #[serde(default = "default_scrape_interval")]
    pub scrape_interval: ConfigDuration,
    /// How often rules are evaluated, in story time. Default: the scrape interval.
    #[serde(default)]
    pub evaluation_interval: Option<ConfigDuration>,
}

/// `[scenario]`: name and timing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioMeta {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Wall-clock length of one variant's run (load is generated this long).
    pub duration: ConfigDuration,
    /// How many seconds of the incident one second of the run stands for (e.g. 720: the
    /// run's 40 s tell a 8-hour day). Only labels the timeline: rates, service times and
    /// timeouts in the file are already in run time.
    #[serde(default = "one")]
    pub compression: f64,
    /// Story-time label of the run's start, e.g. `"09:00"`; shown on the timeline.
    #[serde(default)]
    pub story_start: Option<String>,
    /// Seed of every random choice (addresses, arrivals, paths): runs are comparable.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// After `duration`, how long requests already sent may take to finish before they
    /// are counted `unfinished`.
    #[serde(default = "default_grace")]
    pub grace: ConfigDuration,
    /// Write weir's access log to a temp file and count rejections per rule and cohort.
    #[serde(default = "yes")]
    pub access_log: bool,
}

/// `[health]`: a container health check that hits the app directly, like Docker.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Time between two checks (incident 1: 30 s; compress it like the rest).
    #[serde(default = "default_health_interval")]
    pub interval: ConfigDuration,
    /// A check not answered `200` within this counts as failed.
    #[serde(default = "default_health_timeout")]
    pub timeout: ConfigDuration,
    /// Consecutive failures that make the container unhealthy (incident 1: 3).
    #[serde(default = "default_health_failures")]
    pub failures: u32,
    /// Restart the app when unhealthy, cutting every request in it (incident 1's autoheal).
    #[serde(default)]
    pub autoheal: bool,
    /// How long a restart leaves nothing listening.
    #[serde(default = "default_restart_time")]
    pub restart_time: ConfigDuration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            interval: default_health_interval(),
            timeout: default_health_timeout(),
            failures: default_health_failures(),
            autoheal: false,
            restart_time: default_restart_time(),
        }
    }
}

/// `[topology]`: what stands between clients and weir.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TopologyConfig {
    /// `"nginx"`: a real nginx in front of weir adding `X-Forwarded-For` (incident 4),
    /// round-robin over a variant's `instances`.
    #[serde(default)]
    pub load_balancer: Option<LoadBalancer>,
    /// The lab's Redis (`{{redis}}` in a variant's config) is killed `at` this
    /// far into the run and started again, empty, `lasts` later.
    #[serde(default)]
    pub redis_outage: Option<RedisOutage>,
}

/// `[topology] redis_outage`: when the fleet's Redis is down, in run time.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedisOutage {
    pub at: ConfigDuration,
    pub lasts: ConfigDuration,
}

/// A load balancer the lab can start.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LoadBalancer {
    Nginx,
}

/// `[weir.<variant>]`: one gateway configuration, inline or from a file.
///
/// In the text, `{{app}}` is replaced by the app's address and `{{dir}}` by the run's
/// temp dir. weir: listeners should use port 0; without `[admin]` the admin API binds
/// `127.0.0.1:0`; without `[access_log]` the log goes to a temp file the lab reads. A
/// rival (`gateway = "nginx"` or `"haproxy"`) listens on `{{listen}}`, a free loopback
/// address the lab picks.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WeirVariantConfig {
    #[serde(default)]
    pub description: String,
    /// What runs as the gateway: weir (default), or a rival to measure it against.
    #[serde(default)]
    pub gateway: GatewayKind,
    /// The config as text: weir's TOML; for nginx the contents of its `http` block;
    /// for HAProxy everything after its `global` section.
    #[serde(default)]
    pub config: Option<String>,
    /// A weir config file, relative to the scenario file.
    #[serde(default)]
    pub file: Option<String>,
    /// weir instances behind the load balancer (1 to 8, default 1): a fleet,
    /// each with its own state; `{{redis}}` in the config is a Redis the lab
    /// starts for them to share.
    #[serde(default)]
    pub instances: Option<usize>,
}

/// The gateway a variant runs in front of the app.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GatewayKind {
    /// weir itself, started in-process.
    #[default]
    Weir,
    /// A real nginx (`/usr/sbin/nginx` or `$WEIR_LAB_NGINX`), configured by the variant.
    Nginx,
    /// A real HAProxy (`/usr/sbin/haproxy` or `$WEIR_LAB_HAPROXY`), configured by the
    /// variant.
    Haproxy,
}

impl GatewayKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GatewayKind::Weir => "weir",
            GatewayKind::Nginx => "nginx",
            GatewayKind::Haproxy => "haproxy",
        }
    }

    /// A rival's listen placeholder: it must appear in the variant's config.
    pub const LISTEN: &'static str = "{{listen}}";
}

/// What a cohort is.
#[derive(
    Debug, Clone, Copy, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CohortKind {
    /// Anonymous people with browsers: think time, a cookie jar, sometimes the login page.
    Humans,
    /// Logged-in users: `POST /login` once, then every request carries the login cookies.
    Editors,
    /// Many addresses over chosen networks, no JavaScript, a fake or tool user agent.
    Crawlers,
    /// A load test: many connections from a few addresses, as fast as allowed.
    Flood,
    /// Slow uploads: request bodies trickled at a set byte rate.
    Uploads,
}

impl CohortKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CohortKind::Humans => "humans",
            CohortKind::Editors => "editors",
            CohortKind::Crawlers => "crawlers",
            CohortKind::Flood => "flood",
            CohortKind::Uploads => "uploads",
        }
    }

    /// Keys only a cohort of this kind may have, beyond [`COMMON_COHORT_KEYS`].
    fn own_keys(self) -> &'static [&'static str] {
        const HUMANS: &[&str] = &[
            "count",
            "login_share",
            "javascript",
            "hash_rate",
            "landing_pages",
        ];
        const EDITORS: &[&str] = &["count"];
        const CRAWLERS: &[&str] = &[
            "concurrency",
            "session_cookie_share",
            "headless_share",
            "refresh_share",
            "among",
            "browser_like",
        ];
        const FLOOD: &[&str] = &["connections", "reconnect_delay"];
        const UPLOADS: &[&str] = &["count", "upload_bytes", "upload_rate"];
        match self {
            CohortKind::Humans => HUMANS,
            CohortKind::Editors => EDITORS,
            CohortKind::Crawlers => CRAWLERS,
            CohortKind::Flood => FLOOD,
            CohortKind::Uploads => UPLOADS,
        }
    }

    /// Whether a cohort of this kind may have `key`; any other is an error naming its line.
    fn is_allowed(self, key: &str) -> bool {
        COMMON_COHORT_KEYS.contains(&key) || self.own_keys().contains(&key)
    }
}

/// Keys every cohort kind may have.
const COMMON_COHORT_KEYS: &[&str] = &[
    "kind",
    "name",
    "addresses",
    "networks",
    "rate",
    "requests",
    "user_agent",
    "timeout",
    "start",
    "stop",
    "phases",
    "host",
    "requests_per_connection",
    "ramp",
];

/// `[[cohorts]]`: one population of clients. Which keys apply depends on `kind`
/// (see `docs/lab.md`); a key that does not apply is an error, not silently ignored.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CohortConfig {
    pub kind: CohortKind,
    /// Name used in reports and checks. Default: the kind (`humans`).
    #[serde(default)]
    pub name: Option<String>,
    /// humans, editors, uploads: number of clients (one connection each).
    #[serde(default)]
    pub count: Option<usize>,
    /// Source addresses. humans/editors/uploads: default `count` (one each; fewer means
    /// carrier NAT). crawlers: one client per address. flood: connections share them.
    #[serde(default)]
    pub addresses: Option<usize>,
    /// How addresses spread over networks. Default: each address in its own /24.
    #[serde(default)]
    pub networks: Vec<NetworkGroup>,
    /// Requests per second per client (per connection for `flood`), Poisson arrivals;
    /// a client waits for its previous answer first, like a person or a polite crawler.
    pub rate: f64,
    /// crawlers: connections per address (default 1).
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// flood: connections in all.
    #[serde(default)]
    pub connections: Option<usize>,
    /// flood: pause after a failed connect before trying again (default 500ms).
    #[serde(default)]
    pub reconnect_delay: Option<ConfigDuration>,
    /// Weighted request mix. Default per kind (see `docs/lab.md`).
    #[serde(default)]
    pub requests: Vec<RequestMix>,
    /// A client closes its connection after this many requests and opens a new one for
    /// the next (a new visit, a new tab). Default: humans and editors 5, others never.
    #[serde(default)]
    pub requests_per_connection: Option<u32>,
    /// Clients start evenly over this long from `start` instead of all at once, as a
    /// load-test tool ramps up. Default 1s for flood, 0 for others.
    #[serde(default)]
    pub ramp: Option<ConfigDuration>,
    /// humans: share of requests that are visits to the login page (the session cookie
    /// it sets is then kept and sent, as a browser does).
    #[serde(default)]
    pub login_share: Option<f64>,
    /// humans: a visit opens with this many requests of the mix's first entry
    /// (an article: people arrive at a page from a search engine or a link,
    /// and read, before they search). Default 0.
    #[serde(default)]
    pub landing_pages: Option<u32>,
    /// humans: whether their browsers run JavaScript (default true). Without it, a
    /// challenge page is answered by following its `<noscript>` refresh after the
    /// wait, as a browser with scripts off does.
    #[serde(default)]
    pub javascript: Option<bool>,
    /// humans: SHA-256 hashes per second their browsers do for the challenge
    /// (a phone: about 50,000). The lab hashes natively, then waits what
    /// the rest would have taken at this rate. Default: native speed.
    #[serde(default)]
    pub hash_rate: Option<f64>,
    /// crawlers: share of addresses that fetch the login page first and then send its
    /// session cookie with every request (incident 1: ~1/5).
    #[serde(default)]
    pub session_cookie_share: Option<f64>,
    /// crawlers: share of addresses that run a headless browser and so solve the
    /// challenge (people always do). Default 0.
    #[serde(default)]
    pub headless_share: Option<f64>,
    /// crawlers: share of addresses that run no JavaScript but follow the
    /// challenge page's no-script refresh after its wait, as Scrapy's
    /// default middleware follows a meta refresh (issue 54). Default 0.
    #[serde(default)]
    pub refresh_share: Option<f64>,
    /// crawlers: a share of the addresses that are other cohorts' own, as a
    /// residential proxy network's exits are people's phones and home
    /// connections (`[{ cohort = "carrier", share = 0.17 }]`: 17% of the
    /// addresses are the carrier's people's). Each named cohort must come
    /// earlier in the file; `networks` places the rest.
    #[serde(default)]
    pub among: Vec<SharedAddresses>,
    /// crawlers: behave like browsers: a browser's `User-Agent` (unless
    /// `user_agent` says otherwise) and navigation headers, cookies kept, and
    /// a page with `title=` in its query reached from that article: the
    /// article first, then the page with the article as `Referer`. They run
    /// no JavaScript unless `headless_share` says so. Default false.
    #[serde(default)]
    pub browser_like: Option<bool>,
    /// `User-Agent` sent. Default per kind: a mobile browser for people, a tool for others.
    #[serde(default)]
    pub user_agent: Option<String>,
    /// `Host` sent. Default `wiki.example.org`.
    #[serde(default)]
    pub host: Option<String>,
    /// A request without a complete answer after this counts as `timeout`. Default 10s.
    #[serde(default)]
    pub timeout: Option<ConfigDuration>,
    /// Fraction of the run at which the cohort starts (default 0).
    #[serde(default)]
    pub start: Option<f64>,
    /// Fraction of the run at which it stops sending (default 1).
    #[serde(default)]
    pub stop: Option<f64>,
    /// Rate changes over the run: from `at` (fraction of the run) the rate is
    /// `factor` times `rate`.
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// uploads: body size in bytes (default 1 MiB).
    #[serde(default)]
    pub upload_bytes: Option<u64>,
    /// uploads: bytes per second the body is sent at (default 64 KiB/s).
    #[serde(default)]
    pub upload_rate: Option<u64>,
}

/// A share of a crawler cohort's addresses that are another cohort's own.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SharedAddresses {
    /// The cohort whose addresses these are (one earlier in the file).
    pub cohort: String,
    /// Share of the crawler cohort's addresses.
    pub share: f64,
}

/// One entry of a weighted request mix. `{n}` in `path` becomes a random number.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RequestMix {
    pub path: String,
    #[serde(default = "one")]
    pub weight: f64,
    #[serde(default = "default_method")]
    pub method: String,
}

/// From `at` (fraction of the run) on, the cohort's rate is `factor` x `rate`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub at: f64,
    pub factor: f64,
}

/// `[[expect]]`: a check one variant (or every variant) must pass.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExpectConfig {
    /// The variant checked; absent means every variant.
    #[serde(default)]
    pub variant: Option<String>,
    /// `<cohort|upstream|generator|rules.NAME>.<metric> <op> <number>`.
    pub check: String,
    /// Why this check cannot pass yet (e.g. `"issue 3"`): it is reported, never fails
    /// the run.
    #[serde(default)]
    pub pending: Option<String>,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_seed() -> u64 {
    2026
}
fn default_grace() -> ConfigDuration {
    ConfigDuration::secs(2)
}
fn default_health_interval() -> ConfigDuration {
    ConfigDuration::secs(1)
}
fn default_health_timeout() -> ConfigDuration {
    ConfigDuration::secs(1)
}
fn default_health_failures() -> u32 {
    3
}
fn default_restart_time() -> ConfigDuration {
    ConfigDuration::secs(2)
}
fn default_method() -> String {
    "GET".into()
}
fn default_scrape_interval() -> ConfigDuration {
    ConfigDuration::secs(60)
}

/// The lab scrapes weir's metrics at most this often (run time): each scrape renders
/// every series, on the same two cores as the run.
pub const MIN_SCRAPE_EVERY: Duration = Duration::from_millis(50);

/// A loaded, checked scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub file: ScenarioFile,
    /// Variant names in file order.
    pub variants: Vec<Variant>,
    /// Cohorts with names and defaults resolved.
    pub cohorts: Vec<Cohort>,
    /// Parsed checks, in file order.
    pub checks: Vec<Expectation>,
    /// Alert rules to replay over weir's metrics, when `[alerts]` is set.
    pub alerts: Option<AlertReplay>,
    /// The file, when loaded from one.
    pub path: Option<PathBuf>,
}

/// `[alerts]`, resolved: the rules file's path and the two clocks.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertReplay {
    pub rules: PathBuf,
    /// Run time between two scrapes of weir's metrics.
    pub scrape_every: Duration,
    /// The same in story time (the series' interval in the promtool test).
    pub story_interval: Duration,
    /// Story time between two rule evaluations.
    pub evaluation_interval: Duration,
}

/// One variant, its config text read.
#[derive(Debug, Clone)]
pub struct Variant {
    pub name: String,
    pub description: String,
    pub gateway: GatewayKind,
    pub config_text: String,
    /// Where the text came from (for weir's error messages).
    pub config_path: Option<PathBuf>,
    /// weir instances behind the load balancer (1 unless a fleet).
    pub instances: usize,
}

/// Most instances a variant may run.
pub const MAX_INSTANCES: usize = 8;

/// Where a weir config names the lab's Redis.
pub const REDIS_PLACEHOLDER: &str = "{{redis}}";

/// One cohort with every default applied.
#[derive(Debug, Clone)]
pub struct Cohort {
    pub name: String,
    pub kind: CohortKind,
    /// Clients (connections for flood; addresses x concurrency for crawlers).
    pub clients: usize,
    /// Every address, its own (in `networks`) and those `among` other cohorts.
    pub addresses: usize,
    pub networks: Vec<NetworkGroup>,
    /// Addresses shared with earlier cohorts: their names and how many.
    pub among: Vec<(String, usize)>,
    pub browser_like: bool,
    pub rate: f64,
    pub requests: Vec<RequestMix>,
    pub login_share: f64,
    /// humans: requests of the mix's first entry a visit opens with.
    pub landing_pages: u32,
    /// humans: browsers that run the challenge's script (else they follow its refresh).
    pub javascript: bool,
    /// humans: the browser's challenge hashing speed (`None`: native).
    pub hash_rate: Option<f64>,
    pub session_cookie_share: f64,
    pub headless_share: f64,
    /// crawlers: share of addresses that follow the no-script refresh.
    pub refresh_share: f64,
    pub user_agent: String,
    pub host: String,
    pub timeout: Duration,
    pub start: f64,
    pub stop: f64,
    pub phases: Vec<Phase>,
    pub reconnect_delay: Duration,
    pub upload_bytes: u64,
    pub upload_rate: u64,
    /// 0: keep the connection as long as it lasts.
    pub requests_per_connection: u32,
    pub ramp: Duration,
}

impl Cohort {
    /// Rate multiplier at fraction `f` of the run: the last phase at or before `f`.
    pub fn factor_at(&self, f: f64) -> f64 {
        (self.phases.iter())
            .rfind(|p| p.at <= f)
            .map_or(1.0, |p| p.factor)
    }
}

/// One `[[expect]]`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    pub variant: Option<String>,
    pub check: Check,
    pub pending: Option<String>,
    /// 1-based line of the check in the scenario file.
    pub line: Option<usize>,
}

/// Reads and checks a scenario file. Weir configs given by `file` are read relative to it.
pub fn load_scenario_file(path: &Path) -> Result<Scenario, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: Some(path.to_path_buf()),
            line: None,
            key: None,
            message: format!("cannot read the file: {e}"),
        }])
    })?;
    load_scenario_str(&text, Some(path))
}

/// The scenario file as TOML, or its first syntax or schema error (with its line).
fn parse_scenario(text: &str, at: &Locator<'_>) -> Result<ScenarioFile, ConfigErrors> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let message = e
            .message()
            .lines()
            .next()
            .unwrap_or("invalid TOML")
            .to_string();
        ConfigErrors(vec![ConfigError {
            file: at.file.clone(),
            line,
            key: None,
            message,
        }])
    })
}

/// Parses and checks scenario text; `path` names it in errors and anchors relative files.
pub fn load_scenario_str(text: &str, path: Option<&Path>) -> Result<Scenario, ConfigErrors> {
    let at = Locator {
        file: path.map(Path::to_path_buf),
        toml: TomlLocator::new(text),
    };
    let file = parse_scenario(text, &at)?;
    let mut errors = Vec::new();
    check_settings(&file, &at, &mut errors);

    let variants = variants(&file, &at, path, &mut errors);
    let cohorts = cohorts(&file, &at, &mut errors);
    let alerts = alert_replay(&file, &at, path, &mut errors);
    let checks = expectations(
        &file,
        &at,
        (&variants, &cohorts),
        alerts.is_some(),
        &mut errors,
    );
    if errors.is_empty() {
        Ok(Scenario {
            file,
            variants,
            cohorts,
            checks,
            alerts,
            path: path.map(Path::to_path_buf),
        })
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Checks the settings that stand alone: `[scenario]`'s timing, `[app]` and `[health]`.
fn check_settings(file: &ScenarioFile, at: &Locator<'_>, errors: &mut Vec<ConfigError>) {
    let root = KeyPath::root();
    let meta = &file.scenario;
    if meta.duration.0.is_zero() || meta.duration.0 > MAX_DURATION {
        errors.push(at.error(
            &root.key("scenario").key("duration"),
            format!(
                "must be more than 0 and at most {}s",
                MAX_DURATION.as_secs()
            ),
        ));
    }
    if !(meta.compression.is_finite() && meta.compression > 0.0) {
        errors.push(at.error(
            &root.key("scenario").key("compression"),
            "must be a number > 0",
        ));
    }
    if let Err(e) = file.app.validate() {
        errors.push(at.error(&root.key("app"), e.to_string()));
    }
    let health = &file.health;
    if health.enabled && (health.interval.0.is_zero() || health.timeout.0.is_zero()) {
        errors.push(at.error(
            &root.key("health"),
            "interval and timeout must be more than 0",
        ));
    }
    if health.enabled && health.failures == 0 {
        errors.push(at.error(&root.key("health").key("failures"), "must be at least 1"));
    }
}

/// The `[[expect]]` checks, each checked against the variants, cohorts and `[alerts]`
/// it names: `rules.*` and `alerts.*` read weir's own metrics and log, so a check that
/// applies to a rival variant is an error, not a silent "missing".
fn expectations(
    file: &ScenarioFile,
    at: &Locator<'_>,
    (variants, cohorts): (&[Variant], &[Cohort]),
    has_alerts: bool,
    errors: &mut Vec<ConfigError>,
) -> Vec<Expectation> {
    let names: BTreeSet<&str> = cohorts.iter().map(|c| c.name.as_str()).collect();
    let mut checks = Vec::new();
    for (i, e) in file.expect.iter().enumerate() {
        let key = KeyPath::root().key("expect").index(i);
        if let Some(v) = &e.variant
            && !variants.iter().any(|x| &x.name == v)
        {
            errors.push(at.error(
                &key.key("variant"),
                format!(
                    "no variant {v:?}; the scenario has {}",
                    variant_list(variants)
                ),
            ));
        }
        let line = at.line(&key.key("check"));
        let check = match Check::parse(&e.check) {
            Ok(check) => check,
            Err(err) => {
                errors.push(at.error(&key.key("check"), format!("{:?}: {err}", e.check)));
                continue;
            }
        };
        for message in check_problems(e, &check, variants, &names, has_alerts) {
            errors.push(at.error(&key.key("check"), message));
        }
        checks.push(Expectation {
            variant: e.variant.clone(),
            check,
            pending: e.pending.clone(),
            line,
        });
    }
    checks
}

/// What is wrong with an `[[expect]]` entry's parsed `check` for the scenario:
/// a cohort it names that is not among `names`, an `alerts.*` check without
/// `[alerts]`, a check of weir's own metrics and log on a rival variant.
fn check_problems(
    e: &ExpectConfig,
    check: &Check,
    variants: &[Variant],
    names: &BTreeSet<&str>,
    has_alerts: bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(cohort) = check.cohort_name()
        && !names.contains(cohort)
    {
        problems.push(format!(
            "{:?}: no cohort named {cohort:?} (cohorts: {})",
            e.check,
            names.iter().copied().collect::<Vec<_>>().join(", ")
        ));
    }
    if matches!(check.subject, Subject::Alert(_)) && !has_alerts {
        problems.push(format!(
            "{:?}: alerts.* checks need an [alerts] table naming the rules file",
            e.check
        ));
    }
    if check.subject.weir_only() {
        let rivals = variants.iter().filter(|v| {
            v.gateway != GatewayKind::Weir && e.variant.as_ref().is_none_or(|n| n == &v.name)
        });
        for v in rivals {
            problems.push(format!(
                "{:?} reads weir's own metrics and log, but variant {:?} runs {} \
                 (set `variant` to a weir variant)",
                e.check,
                v.name,
                v.gateway.as_str()
            ));
        }
    }
    problems
}

/// `[alerts]`, resolved against the scenario's file and compression.
fn alert_replay(
    file: &ScenarioFile,
    at: &Locator<'_>,
    path: Option<&Path>,
    errors: &mut Vec<ConfigError>,
) -> Option<AlertReplay> {
    let a = file.alerts.as_ref()?;
    let key = KeyPath::root().key("alerts");
    // Whether the file exists is checked before a run (crate::cli), not here: the
    // demo loads this scenario from inside the binary, with no docs/ beside it.
    let rules = path
        .and_then(Path::parent)
        .map_or_else(|| PathBuf::from(&a.rules), |dir| dir.join(&a.rules));
    let compression = file.scenario.compression;
    let story_interval = a.scrape_interval.0;
    let scrape_every = Duration::try_from_secs_f64(story_interval.as_secs_f64() / compression)
        .unwrap_or(Duration::ZERO);
    if scrape_every < MIN_SCRAPE_EVERY {
        errors.push(at.error(
            &key.key("scrape_interval"),
            format!(
                "{story_interval:?} of story time is {scrape_every:?} of run time at \
                 compression {compression}; the lab scrapes at most every {MIN_SCRAPE_EVERY:?}"
            ),
        ));
    }
    let evaluation_interval = a.evaluation_interval.map_or(story_interval, |d| d.0);
    if evaluation_interval.is_zero() {
        errors.push(at.error(&key.key("evaluation_interval"), "must be more than 0"));
    }
    Some(AlertReplay {
        rules,
        scrape_every,
        story_interval,
        evaluation_interval,
    })
}

fn variant_list(variants: &[Variant]) -> String {
    let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The `[weir.<variant>]` tables in file order, each with its config text,
/// checked (a rival must listen on the lab's address; a fleet must be able to run).
fn variants(
    file: &ScenarioFile,
    at: &Locator<'_>,
    path: Option<&Path>,
    errors: &mut Vec<ConfigError>,
) -> Vec<Variant> {
    let root = KeyPath::root();
    if file.weir.is_empty() {
        errors.push(at.error(&root, "no [weir.<variant>] table: nothing to run"));
    }
    // File order, not alphabetical: the first variant is usually the incident's own.
    let mut order: Vec<&String> = file.weir.keys().collect();
    let in_file = at.keys_of(&root.key("weir"));
    order.sort_by_key(|k| in_file.iter().position(|f| f == *k).unwrap_or(usize::MAX));
    let mut out = Vec::new();
    for name in order {
        let v = &file.weir[name];
        let key = root.key("weir").key(name);
        let text = variant_config(v, &key, at, path, errors);
        if let Some((config_text, config_path)) = text {
            if v.gateway != GatewayKind::Weir && !config_text.contains(GatewayKind::LISTEN) {
                let field = if v.config.is_some() { "config" } else { "file" };
                errors.push(at.error(
                    &key.key(field),
                    format!(
                        "a {} variant must listen on {} (the lab's free loopback address)",
                        v.gateway.as_str(),
                        GatewayKind::LISTEN
                    ),
                ));
            }
            let instances = v.instances.unwrap_or(1);
            if let Some(problem) = fleet_problem(file, v, instances) {
                errors.push(at.error(&key.key("instances"), problem));
            }
            out.push(Variant {
                name: name.clone(),
                description: v.description.clone(),
                gateway: v.gateway,
                config_text,
                config_path,
                instances,
            });
        }
    }
    out
}

/// A variant's gateway config text, inline or read from its `file` (relative
/// to the scenario's `path`), with the path it was read from; `None` with a
/// problem in `errors` when it has none, both, or an unreadable file.
fn variant_config(
    v: &WeirVariantConfig,
    key: &KeyPath,
    at: &Locator<'_>,
    path: Option<&Path>,
    errors: &mut Vec<ConfigError>,
) -> Option<(String, Option<PathBuf>)> {
    match (&v.config, &v.file) {
        (Some(text), None) => Some((text.clone(), None)),
        (None, Some(rel)) => {
            let full = path
                .and_then(Path::parent)
                .map_or_else(|| PathBuf::from(rel), |dir| dir.join(rel));
            match std::fs::read_to_string(&full) {
                Ok(text) => Some((text, Some(full))),
                Err(e) => {
                    errors.push(at.error(
                        &key.key("file"),
                        format!("cannot read {}: {e}", full.display()),
                    ));
                    None
                }
            }
        }
        _ => {
            errors.push(at.error(key, "needs exactly one of `config` (inline TOML) or `file`"));
            None
        }
    }
}

/// Why a variant's `instances` cannot run, if it cannot.
fn fleet_problem(file: &ScenarioFile, v: &WeirVariantConfig, instances: usize) -> Option<String> {
    if !(1..=MAX_INSTANCES).contains(&instances) {
        return Some(format!("must be 1 to {MAX_INSTANCES}, not {instances}"));
    }
    if instances > 1 && v.gateway != GatewayKind::Weir {
        return Some(format!(
            "only weir runs as a fleet, not {}",
            v.gateway.as_str()
        ));
    }
    if instances > 1 && file.topology.load_balancer.is_none() {
        return Some(
            "a fleet needs a balancer in front: [topology] load_balancer = \"nginx\"".into(),
        );
    }
    None
}

fn cohorts(file: &ScenarioFile, at: &Locator<'_>, errors: &mut Vec<ConfigError>) -> Vec<Cohort> {
    let root = KeyPath::root();
    let mut out: Vec<Cohort> = Vec::new();
    let mut connections = 0usize;
    for (i, c) in file.cohorts.iter().enumerate() {
        let before = errors.len();
        let mut problems = CohortProblems {
            at,
            key: root.key("cohorts").index(i),
            errors: &mut *errors,
        };
        let cohort = cohort(c, &out, &mut problems);
        connections = connections.saturating_add(cohort.clients);
        if errors.len() > before {
            continue;
        }
        out.push(cohort);
    }
    check_lab_capacity(connections, &out, &root.key("cohorts"), at, errors);
    out
}

/// Where the problems of one `[[cohorts]]` entry go: each at its key within
/// the entry, with the line the key is on.
struct CohortProblems<'a, 'l> {
    at: &'a Locator<'l>,
    /// The entry's own key, `cohorts[i]`.
    key: KeyPath,
    errors: &'a mut Vec<ConfigError>,
}

impl CohortProblems<'_, '_> {
    /// Records a problem at `key`.
    fn report(&mut self, key: &KeyPath, message: impl Into<String>) {
        self.errors.push(self.at.error(key, message));
    }

    /// Records a problem at the entry's `field`.
    fn report_field(&mut self, field: &str, message: impl Into<String>) {
        let key = self.key.key(field);
        self.report(&key, message);
    }

    /// A share, `default` when unset; outside 0..=1 is a problem at `field`.
    fn fraction(&mut self, v: Option<f64>, default: f64, field: &str) -> f64 {
        let v = v.unwrap_or(default);
        if !(0.0..=1.0).contains(&v) {
            self.report_field(field, format!("{v} must be between 0 and 1"));
        }
        v
    }

    /// A count a `kind` cohort must set to at least 1 (0 when it is a
    /// problem, reported at `field`, or at the entry when unset).
    fn required(&mut self, kind: CohortKind, v: Option<usize>, field: &str) -> usize {
        match v {
            Some(n) if n > 0 => n,
            Some(_) => {
                self.report_field(field, "must be at least 1");
                0
            }
            None => {
                let message = format!("a `{}` cohort needs `{field}`", kind.as_str());
                self.errors.push(self.at.error(&self.key, message));
                0
            }
        }
    }
}

/// One `[[cohorts]]` entry, checked and with its defaults filled in. Its
/// problems go to `problems` (the cohort is returned anyway, for the count
/// of connections); `accepted` are the entries before it that had none.
fn cohort(c: &CohortConfig, accepted: &[Cohort], problems: &mut CohortProblems<'_, '_>) -> Cohort {
    check_cohort_keys(c, problems);
    let name = cohort_name(c, accepted, problems);
    if !(c.rate.is_finite() && c.rate > 0.0) {
        problems.report_field("rate", format!("{} must be a number > 0", c.rate));
    }
    let (start, stop) = cohort_window(c, problems);
    let login_share = problems.fraction(c.login_share, 0.0, "login_share");
    let session_cookie_share =
        problems.fraction(c.session_cookie_share, 0.0, "session_cookie_share");
    let (headless_share, refresh_share) = crawler_shares(c, problems);
    let browser_like = c.browser_like.unwrap_or(false);
    check_phases(&c.phases, problems);
    let (clients, addresses) = cohort_size(c, problems);
    let among = cohort_among(c, addresses, accepted, problems);
    let own = addresses - among.iter().map(|(_, n)| n).sum::<usize>();
    let networks = cohort_networks(c, own, problems);
    let requests = cohort_requests(c, problems);
    let (timeout, upload_rate) = cohort_timeout_and_upload_rate(c, problems);
    Cohort {
        name,
        kind: c.kind,
        clients,
        addresses,
        networks,
        among,
        browser_like,
        rate: c.rate,
        requests,
        login_share,
        landing_pages: c.landing_pages.unwrap_or(0),
        javascript: c.javascript.unwrap_or(true),
        hash_rate: c.hash_rate.filter(|r| *r > 0.0),
        session_cookie_share,
        headless_share,
        refresh_share,
        user_agent: cohort_user_agent(c, browser_like),
        host: c.host.clone().unwrap_or_else(|| "wiki.example.org".into()),
        timeout,
        start,
        stop,
        phases: c.phases.clone(),
        reconnect_delay: c
            .reconnect_delay
            .map_or(Duration::from_millis(500), |d| d.0),
        upload_bytes: c.upload_bytes.unwrap_or(1 << 20),
        upload_rate,
        requests_per_connection: c.requests_per_connection.unwrap_or(match c.kind {
            CohortKind::Humans | CohortKind::Editors => 5,
            _ => 0,
        }),
        ramp: cohort_ramp(c),
    }
}

/// Reports each key of the entry that its kind of cohort does not take.
fn check_cohort_keys(c: &CohortConfig, problems: &mut CohortProblems<'_, '_>) {
    for k in problems.at.keys_of(&problems.key) {
        if !c.kind.is_allowed(&k) {
            problems.report_field(&k, format!("not a key of a `{}` cohort", c.kind.as_str()));
        }
    }
}

/// When the cohort runs, `(start, stop)` as shares of the run (default the
/// whole run); a stop not after the start is a problem.
fn cohort_window(c: &CohortConfig, problems: &mut CohortProblems<'_, '_>) -> (f64, f64) {
    let start = problems.fraction(c.start, 0.0, "start");
    let stop = problems.fraction(c.stop, 1.0, "stop");
    if start >= stop {
        problems.report_field(
            "stop",
            format!("stop = {stop} is not after start = {start}"),
        );
    }
    (start, stop)
}

/// The shares of crawlers that run a headless browser and that follow a
/// challenge's refresh, `(headless_share, refresh_share)`: together at most 1.
fn crawler_shares(c: &CohortConfig, problems: &mut CohortProblems<'_, '_>) -> (f64, f64) {
    let headless_share = problems.fraction(c.headless_share, 0.0, "headless_share");
    let refresh_share = problems.fraction(c.refresh_share, 0.0, "refresh_share");
    if headless_share + refresh_share > 1.0 {
        problems.report_field(
            "refresh_share",
            format!(
                "headless_share + refresh_share = {} is over 1",
                headless_share + refresh_share
            ),
        );
    }
    (headless_share, refresh_share)
}

/// A request's timeout (default 10 s) and an upload's send rate in bytes a
/// second (default 64 KiB), `(timeout, upload_rate)`: each more than 0.
fn cohort_timeout_and_upload_rate(
    c: &CohortConfig,
    problems: &mut CohortProblems<'_, '_>,
) -> (Duration, u64) {
    let timeout = c.timeout.map_or(Duration::from_secs(10), |d| d.0);
    if timeout.is_zero() {
        problems.report_field("timeout", "must be more than 0");
    }
    let upload_rate = c.upload_rate.unwrap_or(64 * 1024);
    if upload_rate == 0 {
        problems.report_field("upload_rate", "must be more than 0");
    }
    (timeout, upload_rate)
}

/// The cohort's user agent: its own, else the default of its kind (of people
/// for a browser-like crawler).
fn cohort_user_agent(c: &CohortConfig, browser_like: bool) -> String {
    c.user_agent.clone().unwrap_or_else(|| {
        let like = if browser_like {
            CohortKind::Humans
        } else {
            c.kind
        };
        default_user_agent(like).into()
    })
}

/// How long the cohort's clients take to all start: its own `ramp`, else 1 s
/// for a flood and none for the others.
fn cohort_ramp(c: &CohortConfig) -> Duration {
    c.ramp.map_or(
        if c.kind == CohortKind::Flood {
            Duration::from_secs(1)
        } else {
            Duration::ZERO
        },
        |d| d.0,
    )
}

/// The cohort's name (default: its kind), which checks refer to it by: it
/// must be a plain word, not one the checks reserve, and not one of the
/// `accepted` cohorts' names.
fn cohort_name(
    c: &CohortConfig,
    accepted: &[Cohort],
    problems: &mut CohortProblems<'_, '_>,
) -> String {
    let name = c
        .name
        .clone()
        .unwrap_or_else(|| c.kind.as_str().to_string());
    if !valid_name(&name) {
        problems.report_field("name", format!("{name:?}: use letters, digits, `_` or `-`"));
    } else if ["upstream", "rules", "generator"].contains(&name.as_str()) {
        problems.report_field("name", format!("{name:?} is reserved in checks"));
    } else if accepted.iter().any(|o| o.name == name) {
        problems.report_field("name", format!("{name:?} names two cohorts; set `name`"));
    }
    name
}

/// Each phase must start within the run (`at` in 0..=1) with a usable
/// factor, and the phases must come in order.
fn check_phases(phases: &[Phase], problems: &mut CohortProblems<'_, '_>) {
    for (j, p) in phases.iter().enumerate() {
        if !((0.0..=1.0).contains(&p.at) && p.factor.is_finite() && p.factor >= 0.0) {
            let key = problems.key.key("phases").index(j);
            problems.report(
                &key,
                "`at` must be between 0 and 1 and `factor` a number >= 0",
            );
        }
    }
    if phases.windows(2).any(|w| w[0].at > w[1].at) {
        problems.report_field("phases", "phases must be in order of `at`");
    }
}

/// How many client connections the cohort opens and from how many
/// addresses, from the fields its kind sizes itself by: people by `count`
/// (sharing `addresses`), crawlers by `addresses` times `concurrency`,
/// floods by `connections` over `addresses`.
fn cohort_size(c: &CohortConfig, problems: &mut CohortProblems<'_, '_>) -> (usize, usize) {
    match c.kind {
        CohortKind::Humans | CohortKind::Editors | CohortKind::Uploads => {
            let count = problems.required(c.kind, c.count, "count");
            let addresses = c.addresses.unwrap_or(count);
            if addresses == 0 || addresses > count {
                problems.report_field(
                    "addresses",
                    format!("{addresses} must be between 1 and count = {count}"),
                );
            }
            (count, addresses)
        }
        CohortKind::Crawlers => {
            let addresses = problems.required(c.kind, c.addresses, "addresses");
            let per = c.concurrency.unwrap_or(1);
            if per == 0 {
                problems.report_field("concurrency", "must be at least 1");
            }
            (addresses.saturating_mul(per), addresses)
        }
        CohortKind::Flood => {
            let conns = problems.required(c.kind, c.connections, "connections");
            let addresses = problems.required(c.kind, c.addresses, "addresses");
            (conns, addresses)
        }
    }
}

/// How many of the cohort's `addresses` are each earlier cohort's (`among`):
/// a named cohort that exists, shares in 0..=1 summing to at most 1.
fn cohort_among(
    c: &CohortConfig,
    addresses: usize,
    accepted: &[Cohort],
    problems: &mut CohortProblems<'_, '_>,
) -> Vec<(String, usize)> {
    let mut out = Vec::with_capacity(c.among.len());
    let mut left = addresses;
    for (j, shared) in c.among.iter().enumerate() {
        let key = problems.key.key("among").index(j);
        if !accepted.iter().any(|o| o.name == shared.cohort) {
            problems.report(
                &key.key("cohort"),
                format!("{:?} names no cohort before this one", shared.cohort),
            );
        }
        if !(0.0..=1.0).contains(&shared.share) {
            problems.report(&key.key("share"), "must be between 0 and 1");
            continue;
        }
        let n = ((shared.share * addresses as f64).round() as usize).min(left);
        left -= n;
        out.push((shared.cohort.clone(), n));
    }
    let sum: f64 = c.among.iter().map(|a| a.share).sum();
    if sum > 1.0 + 1e-6 {
        problems.report_field("among", format!("shares sum to {sum:.3}, more than 1"));
    }
    out
}

/// The networks the cohort's own `addresses` are drawn from (default: one
/// /24 per address), which must be able to hold them; none when every
/// address is another cohort's (`among`).
fn cohort_networks(
    c: &CohortConfig,
    addresses: usize,
    problems: &mut CohortProblems<'_, '_>,
) -> Vec<NetworkGroup> {
    if addresses == 0 && !c.among.is_empty() {
        if !c.networks.is_empty() {
            problems.report_field("networks", "every address is `among` other cohorts");
        }
        return Vec::new();
    }
    let networks = if c.networks.is_empty() {
        vec![NetworkGroup {
            share: 1.0,
            prefixes: addresses.max(1),
            len: 24,
            within: None,
        }]
    } else {
        c.networks.clone()
    };
    if let Err(e) = super::addresses::check_groups(&networks, addresses) {
        problems.report_field("networks", e.to_string());
    }
    networks
}

/// The cohort's request mix (default: its kind's, [`default_requests`]):
/// absolute paths, HTTP methods, weights >= 0 that do not all sum to 0.
fn cohort_requests(c: &CohortConfig, problems: &mut CohortProblems<'_, '_>) -> Vec<RequestMix> {
    let requests = if c.requests.is_empty() {
        default_requests(c.kind)
    } else {
        c.requests.clone()
    };
    for (j, r) in requests.iter().enumerate() {
        let key = problems.key.key("requests").index(j);
        if !r.path.starts_with('/') {
            problems.report(
                &key.key("path"),
                format!("{:?} must start with '/'", r.path),
            );
        }
        if !(r.weight.is_finite() && r.weight >= 0.0) {
            problems.report(&key.key("weight"), "must be a number >= 0");
        }
        if http::Method::from_bytes(r.method.as_bytes()).is_err() {
            problems.report(
                &key.key("method"),
                format!("{:?} is not an HTTP method", r.method),
            );
        }
    }
    if requests.iter().map(|r| r.weight).sum::<f64>() <= 0.0 {
        problems.report_field("requests", "weights sum to 0");
    }
    requests
}

/// What the lab can run at once, over all the accepted cohorts (problems
/// reported at `key`, the cohorts' array): at most
/// [`MAX_CLIENT_CONNECTIONS`] client connections, and networks that fit in
/// the /16s of 127.0.0.0/8 left for clients.
fn check_lab_capacity(
    connections: usize,
    cohorts: &[Cohort],
    key: &KeyPath,
    at: &Locator<'_>,
    errors: &mut Vec<ConfigError>,
) {
    if connections > MAX_CLIENT_CONNECTIONS {
        errors.push(at.error(
            key,
            format!(
                "{connections} client connections in all; the lab holds at most \
                 {MAX_CLIENT_CONNECTIONS} (each also costs weir a descriptor)"
            ),
        ));
    }
    let used = super::addresses::slash16_needed(cohorts.iter().flat_map(|c| c.networks.iter()));
    if used > super::addresses::SLASH16_AVAILABLE {
        errors.push(at.error(
            key,
            format!(
                "the networks need {used} /16s; 127.0.0.0/8 has {} for clients",
                super::addresses::SLASH16_AVAILABLE
            ),
        ));
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Default request mix per kind: what incident 1's traffic looked like.
fn default_requests(kind: CohortKind) -> Vec<RequestMix> {
    let mix = |path: &str, weight: f64, method: &str| RequestMix {
        path: path.into(),
        weight,
        method: method.into(),
    };
    match kind {
        CohortKind::Humans | CohortKind::Editors => vec![
            mix("/wiki/Page_{n}", 85.0, "GET"),
            mix("/w/index.php?search=term{n}", 5.0, "GET"),
            mix("/w/index.php?title=Page_{n}&diff={n}", 4.0, "GET"),
            mix("/w/index.php?title=Page_{n}&oldid={n}", 3.0, "GET"),
            mix("/w/index.php?title=Page_{n}&action=history", 3.0, "GET"),
        ],
        CohortKind::Crawlers => vec![
            mix("/w/index.php?title=Page_{n}&diff={n}", 40.0, "GET"),
            mix("/w/index.php?title=Page_{n}&oldid={n}", 30.0, "GET"),
            mix("/w/index.php?title=Page_{n}&action=history", 10.0, "GET"),
            mix("/wiki/Page_{n}", 20.0, "GET"),
        ],
        CohortKind::Flood => vec![mix("/api/map?tile={n}", 1.0, "GET")],
        CohortKind::Uploads => vec![mix("/upload", 1.0, "POST")],
    }
}

fn default_user_agent(kind: CohortKind) -> &'static str {
    match kind {
        CohortKind::Humans | CohortKind::Editors | CohortKind::Uploads => {
            "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) \
             Chrome/126.0 Mobile Safari/537.36"
        }
        CohortKind::Crawlers => "Mozilla/5.0 (compatible; ExampleBot/2.1)",
        CohortKind::Flood => "k6/0.49.0 (https://k6.io/)",
    }
}

/// Finds lines of keys in the scenario text, with weir's own locator.
struct Locator<'a> {
    file: Option<PathBuf>,
    toml: TomlLocator<'a>,
}

impl Locator<'_> {
    fn error(&self, key: &KeyPath, message: impl Into<String>) -> ConfigError {
        let key_text = key.to_string();
        ConfigError {
            file: self.file.clone(),
            line: self.line(key),
            key: (!key_text.is_empty()).then_some(key_text),
            message: message.into(),
        }
    }

    /// The line of `key`, or of its deepest parent present in the text.
    fn line(&self, key: &KeyPath) -> Option<usize> {
        self.toml.line(key)
    }

    /// The keys present in the table at `key` (an element of an array of tables).
    fn keys_of(&self, key: &KeyPath) -> Vec<String> {
        self.toml.keys_of(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"[scenario]
name = "t"
duration = "3s"

[weir.only]
config = "[[listeners]]\naddress = \"127.0.0.1:0\"\n"

[[cohorts]]
kind = "humans"
count = 2
rate = 1.0
"#;

    fn errors(text: &str) -> Vec<(Option<usize>, String)> {
        match load_scenario_str(text, Some(Path::new("s.toml"))) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.into_iter().map(|e| (e.line, e.to_string())).collect(),
        }
    }

    #[test]
    fn base_scenario_loads_with_defaults() {
        let s = load_scenario_str(BASE, None).expect("valid");
        assert_eq!(s.variants.len(), 1);
        let c = &s.cohorts[0];
        assert_eq!((c.name.as_str(), c.clients, c.addresses), ("humans", 2, 2));
        assert_eq!(c.requests_per_connection, 5);
        assert_eq!(s.file.app.workers, 10);
        assert!(s.file.health.enabled);
    }

    #[test]
    fn bad_inputs_name_line_and_key() {
        // (text appended to BASE, expected line, text the message contains)
        #[rustfmt::skip]
        let cases: &[(&str, usize, &str)] = &[
            ("[[cohorts]]\nkind = \"robots\"\nrate = 1\n", 13, "robots"),
            ("[[cohorts]]\nkind = \"humans\"\ncount = 1\nrate = 0\n", 15, "cohorts[1].rate"),
            ("[[cohorts]]\nkind = \"humans\"\ncount = 1\nrate = 1\nconnections = 5\n", 16, "not a key of a `humans` cohort"),
            ("[[cohorts]]\nkind = \"crawlers\"\nrate = 1\n", 12, "needs `addresses`"),
            ("[[cohorts]]\nkind = \"flood\"\naddresses = 2\nrate = 1\nconnections = 0\n", 16, "connections: must be at least 1"),
            ("[[cohorts]]\nkind = \"crawlers\"\naddresses = 9\nrate = 1\nnetworks = [{ share = 0.5, prefixes = 1, len = 24 }]\n", 16, "shares sum"),
            ("[[cohorts]]\nkind = \"humans\"\nname = \"humans\"\ncount = 1\nrate = 1\n", 14, "names two cohorts"),
            ("[[cohorts]]\nkind = \"humans\"\nname = \"upstream\"\ncount = 1\nrate = 1\n", 14, "reserved"),
            ("[[cohorts]]\nkind = \"humans\"\nname = \"late\"\ncount = 1\nrate = 1\nstart = 0.5\nstop = 0.4\n", 18, "not after start"),
            ("[[cohorts]]\nkind = \"humans\"\nname = \"p\"\ncount = 1\nrate = 1\nphases = [{ at = 2, factor = 1 }]\n", 17, "cohorts[1].phases[0]"),
            ("[[cohorts]]\nkind = \"humans\"\nname = \"r\"\ncount = 1\nrate = 1\nrequests = [{ path = \"nope\" }]\n", 17, "must start with '/'"),
            ("[[expect]]\ncheck = \"humans.served >=\"\n", 13, "is not a number"),
            ("[[expect]]\ncheck = \"crawlers.served >= 1\"\n", 13, "no cohort named \"crawlers\""),
            ("[[expect]]\nvariant = \"other\"\ncheck = \"humans.served >= 1\"\n", 13, "no variant \"other\""),
            ("[[expect]]\ncheck = \"upstream.nope == 0\"\n", 13, "has no metric"),
            ("[health]\nfailures = 0\n", 13, "health.failures"),
            ("[app]\nworkers = 0\n", 12, "app: invalid app config"),
            ("[topology]\nload_balancer = \"haproxy\"\n", 13, "haproxy"),
            ("[weir.two]\n", 12, "needs exactly one of `config`"),
            ("[weir.three]\nfile = \"does-not-exist.toml\"\n", 13, "cannot read"),
            ("unknown = 1\n", 12, "unknown field"),
            ("[weir.n]\ngateway = \"nginx\"\nconfig = \"server {}\"\n", 14, "must listen on {{listen}}"),
            ("[weir.h]\ngateway = \"haproxy\"\nconfig = \"bind {{listen}}\"\n[[expect]]\ncheck = \"rules.x.count == 0\"\n", 16, "variant \"h\" runs haproxy"),
            ("[weir.h]\ngateway = \"haproxy\"\nconfig = \"bind {{listen}}\"\n[[expect]]\nvariant = \"h\"\ncheck = \"alerts.A.fired == 1\"\n", 17, "need an [alerts] table"),
            ("[weir.s]\ngateway = \"squid\"\n", 13, "squid"),
            ("[[expect]]\ncheck = \"alerts.A.fired == 1\"\n", 13, "need an [alerts] table"),
            ("[alerts]\nrules = \"Cargo.toml\"\nscrape_interval = \"10ms\"\n", 14, "the lab scrapes at most every 50ms"),
            ("[[cohorts]]\nkind = \"humans\"\nname = \"c\"\ncount = 9\nrate = 1\nnetworks = [{ share = 1.0, prefixes = 3, len = 24, within = 28 }]\n", 17, "within = 28 must be between 16 and 24"),
            ("[[cohorts]]\nkind = \"crawlers\"\naddresses = 4\nrate = 1\namong = [{ cohort = \"nobody\", share = 0.5 }]\n", 16, "\"nobody\" names no cohort before this one"),
            ("[[cohorts]]\nkind = \"crawlers\"\naddresses = 4\nrate = 1\namong = [{ cohort = \"humans\", share = 0.7 }, { cohort = \"humans\", share = 0.6 }]\n", 16, "shares sum to 1.300"),
            ("[[cohorts]]\nkind = \"humans\"\nname = \"h2\"\ncount = 1\nrate = 1\nbrowser_like = true\n", 17, "not a key of a `humans` cohort"),
        ];
        for (extra, line, needle) in cases {
            let text = format!("{BASE}{extra}");
            let errs = errors(&text);
            assert!(
                errs.iter()
                    .any(|(l, m)| *l == Some(*line) && m.contains(needle)),
                "{extra:?}: want line {line} with {needle:?}, got {errs:#?}"
            );
            assert!(
                errs.iter().all(|(_, m)| m.starts_with("s.toml:")),
                "{errs:#?}"
            );
        }
    }

    #[test]
    fn rival_variants_and_alerts_load() {
        let text = format!(
            "{BASE}[weir.nginx-best]\ngateway = \"nginx\"\nconfig = \"server {{ listen {{{{listen}}}}; }}\"\n\
             [alerts]\nrules = \"Cargo.toml\"\n\
             [[expect]]\nvariant = \"only\"\ncheck = \"alerts.A.fired == 1\"\n\
             [[expect]]\ncheck = \"humans.served_2s >= 0.99\"\n"
        );
        let s =
            load_scenario_str(&text, Some(Path::new("s.toml"))).unwrap_or_else(|e| panic!("{e}"));
        let kinds: Vec<GatewayKind> = s.variants.iter().map(|v| v.gateway).collect();
        assert_eq!(kinds, [GatewayKind::Weir, GatewayKind::Nginx]);
        let alerts = s.alerts.expect("[alerts]");
        // compression 1: story and run clocks are the same.
        assert_eq!(alerts.scrape_every, Duration::from_secs(60));
        assert_eq!(alerts.evaluation_interval, Duration::from_secs(60));
        assert_eq!(s.checks.len(), 2);
    }

    /// A carrier NAT: 100 people over 16 /24s of one /16 (issue 19), from a file.
    #[test]
    fn a_carrier_cohort_loads_and_packs_into_one_16() {
        let text = format!(
            "{BASE}[[cohorts]]\nkind = \"humans\"\nname = \"carrier\"\ncount = 100\nrate = 0.4\n\
             networks = [{{ share = 1.0, prefixes = 16, len = 24, within = 16 }}]\n"
        );
        let s = load_scenario_str(&text, None).unwrap_or_else(|e| panic!("{e}"));
        let carrier = &s.cohorts[1];
        assert_eq!(carrier.networks[0].within, Some(16));
        let addrs = crate::addresses::AddressSpace::new(s.file.scenario.seed)
            .allocate(&carrier.networks, carrier.addresses)
            .expect("fits");
        let sixteens: BTreeSet<u8> = addrs.iter().map(|a| a.octets()[1]).collect();
        let twenty_fours: BTreeSet<[u8; 2]> = addrs
            .iter()
            .map(|a| [a.octets()[1], a.octets()[2]])
            .collect();
        assert_eq!(
            (addrs.len(), sixteens.len(), twenty_fours.len()),
            (100, 1, 16)
        );
    }

    #[test]
    fn scenario_keys_are_checked() {
        let errs = errors("[scenario]\nname = \"t\"\nduration = \"0s\"\n");
        assert!(
            errs.iter()
                .any(|(l, m)| *l == Some(3) && m.contains("scenario.duration")),
            "{errs:?}"
        );
        assert!(
            errs.iter().any(|(_, m)| m.contains("no [weir.<variant>]")),
            "{errs:?}"
        );
        let errs = errors("[scenario]\nname = \"t\"\nduration = \"soon\"\n");
        assert!(
            errs.iter()
                .any(|(l, m)| *l == Some(3) && m.contains("soon")),
            "{errs:?}"
        );
    }

    #[test]
    fn a_fleet_needs_a_balancer_weir_and_at_most_eight_instances() {
        let fleet = shipped_text("2026-09-23-fleet.toml");
        assert!(load_scenario_str(&fleet, None).is_ok());
        let cases = [
            (
                fleet.replace("load_balancer = \"nginx\"\n", ""),
                "a fleet needs a balancer",
            ),
            (
                fleet.replace("instances = 3", "instances = 9"),
                "must be 1 to 8, not 9",
            ),
            (
                fleet.replace("instances = 3", "instances = 0"),
                "must be 1 to 8, not 0",
            ),
        ];
        for (text, want) in cases {
            let errors = load_scenario_str(&text, None).expect_err(want).to_string();
            assert!(
                errors.contains(want) && errors.contains("instances"),
                "{errors}"
            );
        }
    }

    #[test]
    fn variants_keep_file_order_and_checks_parse() {
        let text = BASE.replace(
            "[weir.only]",
            "[weir.zeta]\nconfig = \"x\"\n[weir.alpha]\nconfig = \"y\"\n[weir.only]",
        ) + "[[expect]]\nvariant = \"alpha\"\ncheck = \"humans.served >= 99%\"\npending = \"issue 3\"\n";
        let s = load_scenario_str(&text, None).expect("valid");
        let names: Vec<&str> = s.variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["zeta", "alpha", "only"]);
        assert_eq!(s.checks[0].check.bound, 0.99);
        assert_eq!(s.checks[0].pending.as_deref(), Some("issue 3"));
        assert_eq!(s.checks[0].line, Some(18));
    }

    /// A scenario shipped in `scenarios/`.
    fn shipped(name: &str) -> Scenario {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("scenarios");
        load_scenario_file(&dir.join(name)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The text of a scenario shipped in `scenarios/`.
    fn shipped_text(name: &str) -> String {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("scenarios");
        std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// Every cohort but the crawlers, as text to compare.
    fn all_but_crawlers(s: &Scenario) -> Vec<String> {
        (s.cohorts.iter())
            .filter(|c| c.kind != CohortKind::Crawlers)
            .map(|c| format!("{c:?}"))
            .collect()
    }

    /// The crawlers-like-people scenario copies the crawler flood's app,
    /// story, configurations and people: only its crawlers differ, so its
    /// numbers compare with the flood's.
    #[test]
    fn crawlers_like_people_differ_from_the_flood_in_their_crawlers_alone() {
        let flood = shipped("2026-09-23-crawler-flood.toml");
        let like = shipped("2026-09-23-crawlers-like-people.toml");
        let debug = |s: &Scenario| format!("{:?} {:?} {:?}", s.file.app, s.file.health, s.alerts);
        assert_eq!(debug(&flood), debug(&like));
        let meta = |s: &Scenario| {
            let m = &s.file.scenario;
            (
                m.duration.0,
                m.compression,
                m.story_start.clone(),
                m.grace.0,
                m.seed,
            )
        };
        assert_eq!(format!("{:?}", meta(&flood)), format!("{:?}", meta(&like)));
        for v in &like.variants {
            let theirs = flood.variants.iter().find(|f| f.name == v.name);
            let theirs = theirs.unwrap_or_else(|| panic!("{} is a flood variant", v.name));
            assert_eq!(theirs.config_text, v.config_text, "{}", v.name);
        }
        assert_eq!(all_but_crawlers(&flood), all_but_crawlers(&like));
        let crawlers = like.cohorts.iter().find(|c| c.kind == CohortKind::Crawlers);
        let crawlers = crawlers.expect("crawlers");
        assert!(crawlers.browser_like && crawlers.headless_share > 0.0);
        assert_eq!(crawlers.among.iter().map(|(_, n)| n).sum::<usize>(), 100);
    }

    /// `copy`, a copy of the crawlers-like-people scenario: the same app,
    /// health, alerts, story, configurations and people; returns both
    /// scenarios' crawler cohorts for the test to compare what differs.
    fn crawlers_of_a_copy_of_like_people(copy: &str) -> (Cohort, Cohort) {
        let like = shipped("2026-09-23-crawlers-like-people.toml");
        let copy = shipped(copy);
        let debug = |s: &Scenario| format!("{:?} {:?} {:?}", s.file.app, s.file.health, s.alerts);
        assert_eq!(debug(&like), debug(&copy));
        let meta = |s: &Scenario| {
            let m = &s.file.scenario;
            let story = (
                m.duration.0,
                m.compression,
                &m.story_start,
                m.grace.0,
                m.seed,
            );
            format!("{story:?}")
        };
        assert_eq!(meta(&like), meta(&copy));
        assert_eq!(like.variants.len(), copy.variants.len());
        for (l, c) in like.variants.iter().zip(&copy.variants) {
            assert_eq!((&l.name, &l.config_text), (&c.name, &c.config_text));
        }
        assert_eq!(all_but_crawlers(&like), all_but_crawlers(&copy));
        let crawlers = |s: &Scenario| {
            let c = s.cohorts.iter().find(|c| c.kind == CohortKind::Crawlers);
            c.expect("crawlers").clone()
        };
        (crawlers(&like), crawlers(&copy))
    }

    /// The crawlers-that-follow-the-refresh scenario (issue 54) copies the
    /// crawlers-like-people scenario but for its crawlers' `refresh_share`.
    #[test]
    fn crawlers_that_follow_the_refresh_differ_in_that_alone() {
        let (l, r) = crawlers_of_a_copy_of_like_people("2026-09-23-crawlers-follow-refresh.toml");
        assert_eq!((l.refresh_share, r.refresh_share), (0.0, 0.9));
        let same = Cohort {
            refresh_share: 0.0,
            ..r
        };
        assert_eq!(format!("{l:?}"), format!("{same:?}"));
    }

    /// The crawlers-that-run-a-browser scenario (issue 55) copies the
    /// crawlers-like-people scenario but for its crawlers' `headless_share`.
    #[test]
    fn crawlers_that_run_a_browser_differ_in_that_alone() {
        let (l, b) = crawlers_of_a_copy_of_like_people("2026-09-23-crawlers-run-a-browser.toml");
        assert_eq!((l.headless_share, b.headless_share), (0.1, 0.5));
        let same = Cohort {
            headless_share: 0.1,
            ..b
        };
        assert_eq!(format!("{l:?}"), format!("{same:?}"));
    }

    /// The alert-timing scenario with crawlers like people copies the alert
    /// scenario but for its crawlers, which are the crawlers-like-people
    /// scenario's (at the alert scenario's rate).
    #[test]
    fn the_alert_scenario_with_crawlers_like_people_differs_in_its_crawlers_alone() {
        let alert = shipped("2026-09-23-alert.toml");
        let like = shipped("2026-09-23-alert-crawlers-like-people.toml");
        let like_flood = shipped("2026-09-23-crawlers-like-people.toml");
        let debug = |s: &Scenario| format!("{:?} {:?} {:?}", s.file.app, s.file.health, s.alerts);
        assert_eq!(debug(&alert), debug(&like));
        assert_eq!(
            alert.file.scenario.duration.0,
            like.file.scenario.duration.0
        );
        assert_eq!(
            alert.file.scenario.compression,
            like.file.scenario.compression
        );
        assert_eq!(alert.variants.len(), like.variants.len());
        for (a, l) in alert.variants.iter().zip(&like.variants) {
            assert_eq!((&a.name, &a.config_text), (&l.name, &l.config_text));
        }
        assert_eq!(all_but_crawlers(&alert), all_but_crawlers(&like));
        let crawlers = |s: &Scenario| {
            let c = s.cohorts.iter().find(|c| c.kind == CohortKind::Crawlers);
            let c = c.expect("crawlers").clone();
            (
                c.browser_like,
                c.headless_share,
                c.among,
                c.addresses,
                c.session_cookie_share,
            )
        };
        assert_eq!(crawlers(&like), crawlers(&like_flood));
    }

    #[test]
    fn shipped_scenarios_load() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("scenarios");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("scenarios/") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                load_scenario_file(&path).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert_eq!(n, 12);
    }
}
