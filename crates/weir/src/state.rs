//! Limiter state across restarts: restore at start, snapshot periodically
//! and at shutdown, and say loudly what happened. The pools' learned
//! admission limits ride along: in an upgrade's hand-off, and in a small
//! file beside the snapshot for a restart or a blue/green switch.
//!
//! Incident 2's replacement web server started every rate limit from zero
//! because its state was written under one path and listed under another; no
//! one noticed. Here the same [`Snapshot`] code writes and reads the file, and
//! every restore is logged and exported (`weir_state_restored_keys`), so a
//! silent zero is visible.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::admission::PoolLimit;
use crate::observe::metrics::ResultLabels;
use crate::runtime::Runtime;
use weir_limiter::{Clock, MonotonicClock, RestoreReport, Snapshot, SnapshotError};

/// What the start-up restore found.
#[derive(Debug)]
pub enum Restored {
    /// No snapshot file is configured.
    NotConfigured,
    /// The file does not exist: a first start (`first_start`, see
    /// [`first_start`]) or state was lost.
    Missing { path: PathBuf, first_start: bool },
    /// The file was read and applied.
    Loaded(RestoreReport),
    /// The file exists but could not be used.
    Unreadable(SnapshotError),
}

impl Restored {
    /// What the restore found, for `/status`: `not_configured`, `missing`,
    /// `loaded` or `unreadable`.
    pub fn label(&self) -> &'static str {
        match self {
            Restored::NotConfigured => "not_configured",
            Restored::Missing { .. } => "missing",
            Restored::Loaded(_) => "loaded",
            Restored::Unreadable(_) => "unreadable",
        }
    }

    /// Keys put back into the stores.
    pub fn keys(&self) -> usize {
        match self {
            Restored::Loaded(r) => r.restored(),
            _ => 0,
        }
    }
}

/// The configured snapshot file, if any.
pub fn snapshot_path(rt: &Runtime) -> Option<PathBuf> {
    rt.gateway
        .load()
        .loaded
        .config
        .state
        .snapshot_file
        .as_ref()
        .map(PathBuf::from)
}

/// Restores limiter state from the snapshot file, logs the outcome and sets
/// `weir_state_restored_keys`.
pub fn restore(rt: &Runtime) -> Restored {
    let Some(path) = snapshot_path(rt) else {
        return Restored::NotConfigured;
    };
    let outcome = if !path.exists() {
        let first_start = first_start(&path);
        if first_start {
            tracing::warn!(
                file = %path.display(),
                "no limiter snapshot yet: limits start from zero. Normal on a first start; \
                 after a restart or a hand-over it means the previous process wrote its state \
                 elsewhere (check that state.snapshot_file is the same path on a shared volume)"
            );
        } else {
            tracing::warn!(file = %path.display(), "no limiter snapshot found: starting with empty limiter state");
        }
        Restored::Missing { path, first_start }
    } else {
        match Snapshot::read_from(&path) {
            Err(e) => {
                tracing::error!(error = %e, "limiter snapshot unreadable: starting with empty limiter state");
                Restored::Unreadable(e)
            }
            Ok(snap) => {
                let gw = rt.gateway.load();
                let report =
                    snap.restore_into(&gw.rule_stores, MonotonicClock.now(), SystemTime::now());
                let changed = report.rules.iter().filter(|r| !r.section_found).count();
                tracing::info!(
                    file = %path.display(),
                    generation = report.generation,
                    age = ?report.elapsed,
                    restored = report.restored(),
                    levels = report.rules.len(),
                    levels_without_state = changed,
                    discarded_sections = report.discarded.len(),
                    "limiter state restored"
                );
                Restored::Loaded(report)
            }
        }
    };
    rt.metrics.state_restored_keys.set(outcome.keys() as i64);
    expect(rt, &outcome);
    outcome
}

/// Whether a missing snapshot looks like a first start: its directory holds
/// no file at all (a weir that ran there leaves its snapshot; a directory
/// with other files in it, a half-written snapshot among them, is state
/// lost). A first start and a volume mounted at the wrong path look the
/// same from here, so this lowers an error to one warning, never to
/// silence; `expect_restored = "not_ready"` treats both as missing.
fn first_start(path: &Path) -> bool {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // The challenge's key lives there too (`state.dir` defaults to this
    // directory): it is no limiter state.
    let key = crate::challenge::keyfile::FILE_NAME;
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.flatten().all(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == key || name.starts_with(&format!(".{key}."))
        }),
        // Not there (or unreadable) yet: nothing has been written there.
        Err(_) => true,
    }
}

/// Applies `state.expect_restored` to what the restore found.
pub fn expect(rt: &Runtime, outcome: &Restored) {
    use crate::config::ExpectRestored;
    let mode = rt.gateway.load().loaded.config.state.expect_restored;
    let missing = matches!(outcome, Restored::Missing { .. } | Restored::Unreadable(_));
    if !missing || mode == ExpectRestored::Off {
        return;
    }
    // A first start has nothing to restore: the warning above says so.
    if let Restored::Missing {
        first_start: true, ..
    } = outcome
        && mode == ExpectRestored::Warn
    {
        return;
    }
    tracing::error!(
        ?mode,
        "expected limiter state from the previous generation and found none: \
         limits start from zero (check that state.snapshot_file is on a shared volume \
         and that the old generation was stopped with SIGTERM)"
    );
    if mode == ExpectRestored::NotReady {
        rt.state_missing
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Counts the live keys the limiter stores evicted since the last export in
/// `weir_limiter_evicted_keys_total` (at each snapshot and each scrape).
pub fn export_evictions(rt: &Runtime) {
    let evicted: u64 = rt
        .gateway
        .load()
        .rule_stores
        .partitions()
        .iter()
        .map(|p| p.store.stats().evicted_live)
        .sum();
    rt.metrics.evictions(evicted);
}

/// Admission limits older than this are not continued at a start: the app
/// may have changed since (a limit cut in a flood an hour ago would hold a
/// healthy app back while it grows again).
const ADMISSION_MAX_AGE: Duration = Duration::from_secs(600);

/// Each pool's learned adaptive admission limit and request shapes (pools
/// with a fixed limit, or none, have nothing to carry).
pub fn capture_admission(rt: &Runtime) -> Vec<PoolLimit> {
    (rt.gateway.load().pools.iter())
        .filter_map(|p| {
            let queue = p.admission.as_ref()?;
            Some(PoolLimit {
                pool: p.name.to_string(),
                state: queue.limit_state()?,
                shapes: Some(queue.shapes().learned()),
            })
        })
        .collect()
}

/// Continues each named pool's adaptive admission limit and request shapes
/// from `limits`, the previous process's: a limit that started open in
/// front of an app the previous process had cut would send it a burst it
/// cannot hold, and shapes learned again from nothing would put a flood's
/// expensive requests back beside people's pages for their first answers.
/// Pools not named (new ones) start as configured.
pub fn resume_admission(rt: &Runtime, limits: &[PoolLimit]) {
    let gateway = rt.gateway.load();
    for l in limits {
        let queue = (gateway.pools.iter())
            .find(|p| *p.name == *l.pool)
            .and_then(|p| p.admission.as_ref());
        if let Some(queue) = queue {
            queue.resume_limit(&l.state);
            if let Some(shapes) = &l.shapes {
                queue.shapes().resume(shapes);
            }
            tracing::info!(
                pool = %l.pool,
                limit = queue.limit(),
                "admission limit continued from the previous process"
            );
        }
    }
}

/// The admission limits' file beside the snapshot:
/// `<snapshot_file>.admission.json`.
fn admission_path(snapshot: &Path) -> PathBuf {
    let mut name = snapshot.as_os_str().to_owned();
    name.push(".admission.json");
    PathBuf::from(name)
}

/// Writes the pools' admission limits beside the snapshot `path` (a new
/// file renamed into place, as the snapshot is).
fn write_admission(rt: &Runtime, path: &Path) -> std::io::Result<()> {
    write_json(&admission_path(path), &capture_admission(rt))
}

/// `value` as JSON in `file`: a new file renamed into place.
fn write_json(file: &Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    let text = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let mut tmp = file.to_path_buf().into_os_string();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)
}

/// How long ago `file` was written, if it exists.
fn age_of(file: &Path) -> Option<Duration> {
    std::fs::metadata(file)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
}

/// At a start without a hand-off: continues the pools' admission limits
/// from the file beside the snapshot `path`, unless it is missing, older
/// than [`ADMISSION_MAX_AGE`] or unreadable (then they start open, as on a
/// first start; said in the log).
pub fn restore_admission(rt: &Runtime, path: &Path) {
    let file = admission_path(path);
    match age_of(&file) {
        None => return,
        Some(age) if age > ADMISSION_MAX_AGE => {
            tracing::info!(file = %file.display(), ?age, "admission limits too old to continue: starting open");
            return;
        }
        Some(_) => {}
    }
    let limits: Vec<PoolLimit> = match std::fs::read(&file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "admission limits unreadable: starting open");
            return;
        }
    };
    resume_admission(rt, &limits);
}

/// How long requests took lately (`lifecycle::drain_plan`), beside the
/// snapshot: `<snapshot_file>.spans.json`.
fn spans_path(snapshot: &Path) -> PathBuf {
    let mut name = snapshot.as_os_str().to_owned();
    name.push(".spans.json");
    PathBuf::from(name)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedSpans {
    seen: u64,
}

fn write_spans(rt: &Runtime, path: &Path) -> std::io::Result<()> {
    let seen = rt.spans.seen();
    write_json(&spans_path(path), &SavedSpans { seen })
}

/// At a start: what an earlier process saw requests take, if it wrote so
/// within [`ADMISSION_MAX_AGE`], so that a process stopped soon after its
/// start still plans its drain for the site's long requests (a missing or
/// unreadable file is no error: the process learns them anew).
pub fn restore_spans(rt: &Runtime, path: &Path) {
    let file = spans_path(path);
    if age_of(&file).is_none_or(|age| age > ADMISSION_MAX_AGE) {
        return;
    }
    match std::fs::read(&file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<SavedSpans>(&b).map_err(|e| e.to_string()))
    {
        Ok(saved) => rt.spans.remember(saved.seen),
        Err(e) => tracing::debug!(file = %file.display(), error = %e, "request spans unreadable"),
    }
}

/// Writes the snapshot now, and the admission limits and request spans
/// beside it; returns the number of keys written.
pub fn write(rt: &Runtime, path: &Path) -> Result<usize, SnapshotError> {
    if let Err(e) = write_admission(rt, path) {
        tracing::warn!(error = %e, "admission limits could not be written beside the snapshot");
    }
    if let Err(e) = write_spans(rt, path) {
        tracing::warn!(error = %e, "request spans could not be written beside the snapshot");
    }
    let gw = rt.gateway.load();
    let generation = rt.generation;
    let snap = Snapshot::capture(
        generation,
        &gw.rule_stores,
        MonotonicClock.now(),
        SystemTime::now(),
    );
    let keys: usize = snap.sections.iter().map(|s| s.entries.len()).sum();
    export_evictions(rt);
    let result = snap.write_to(path);
    let label = if result.is_ok() { "ok" } else { "error" };
    rt.metrics
        .state_snapshots
        .get_or_create(&ResultLabels { result: label })
        .inc();
    match result {
        Ok(()) => {
            rt.metrics.state_snapshot_keys.set(keys as i64);
            tracing::debug!(keys, file = %path.display(), "limiter snapshot written");
            Ok(keys)
        }
        Err(e) => {
            tracing::error!(error = %e, "limiter snapshot could not be written");
            Err(e)
        }
    }
}

/// The snapshot file as last seen, to notice when another process replaces
/// it: the old generation writing its last state after this one started (a
/// restart with `SO_REUSEPORT`, a blue/green switch), or a twin behind the
/// same load balancer. Every write renames a new file into place, so the
/// inode tells one write from the next.
#[derive(Debug, Default)]
pub struct SnapshotWatch {
    seen: Option<(u64, SystemTime)>,
}

impl SnapshotWatch {
    /// Starts from the file as it is now (the one the start-up restore read).
    pub fn new(path: &Path) -> SnapshotWatch {
        SnapshotWatch {
            seen: identity(path),
        }
    }

    /// If the file changed since last seen and another process wrote it,
    /// merges it into the stores (each key keeps the later of its own TAT and
    /// the file's, so the result is at least as strict as either process)
    /// and says what it merged.
    pub fn merge_if_changed(&mut self, rt: &Runtime, path: &Path) -> Option<Merged> {
        let now = identity(path);
        if now.is_none() || now == self.seen {
            return None;
        }
        self.seen = now;
        let snap = match Snapshot::read_from(path) {
            Ok(s) => s,
            Err(e) => {
                // A half-copied file from an operator, say: the next write
                // replaces it. Nothing merged, nothing lost.
                tracing::warn!(error = %e, "limiter snapshot changed but cannot be read: not merged");
                return None;
            }
        };
        if snap.generation == rt.generation {
            return None;
        }
        let gw = rt.gateway.load();
        let report = snap.restore_into(&gw.rule_stores, MonotonicClock.now(), SystemTime::now());
        let merged = report.restored();
        rt.metrics.state_merged_keys.inc_by(merged as u64);
        tracing::info!(
            file = %path.display(),
            from_generation = snap.generation,
            age = ?report.elapsed,
            merged,
            "merged limiter state another weir process wrote"
        );
        Some(Merged {
            keys: merged,
            from_newer: snap.generation > rt.generation,
        })
    }
}

/// What [`SnapshotWatch::merge_if_changed`] took from another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Merged {
    pub keys: usize,
    /// The writer started after this process: a successor announcing
    /// itself, which this process answers with its own state.
    pub from_newer: bool,
}

/// Inode and modification time of `path`, if it exists.
fn identity(path: &Path) -> Option<(u64, SystemTime)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.ino(), meta.modified().ok()?))
}

/// Sweeps expired keys from every store (keeps memory proportional to live
/// clients between snapshots).
pub fn sweep(rt: &Runtime) {
    let gw = rt.gateway.load();
    let now = MonotonicClock.now();
    for p in gw.rule_stores.partitions() {
        p.store.sweep(now);
    }
    rt.challenge_budget.sweep(now);
}

/// Starts the shared (Redis) limiter when `state.redis_url`,
/// `redis_sentinel` or `redis_cluster` is set. It never
/// blocks: connecting happens in the background, and until Redis answers
/// (or whenever it stops answering) decisions use the local stores.
pub fn connect_redis(rt: &Runtime) -> Result<(), weir_limiter::redis::RedisSetupError> {
    use weir_limiter::redis::{RedisLimiter, RedisTimeouts, RedisTls};
    use weir_limiter::shared::SharedLimiter;
    let gw = rt.gateway.load();
    let cfg = &gw.loaded.config.state;
    let timeouts = RedisTimeouts {
        connect: cfg.redis_connect_timeout.0,
        command: cfg.redis_command_timeout.0,
        ..RedisTimeouts::default()
    };
    let redis = match (&cfg.redis_url, &cfg.redis_sentinel, &cfg.redis_cluster) {
        (Some(url), _, _) => {
            let tls = RedisTls::from_config(cfg.redis_ca_file.as_deref().map(Path::new))?;
            RedisLimiter::with_tls(url, &cfg.redis_prefix, timeouts, &tls)?
        }
        (None, Some(s), _) => {
            RedisLimiter::with_sentinel(&s.settings(), &cfg.redis_prefix, timeouts)?
        }
        (None, None, Some(nodes)) => {
            RedisLimiter::with_cluster(nodes, &cfg.redis_prefix, timeouts)?
        }
        (None, None, None) => return Ok(()),
    };
    tracing::info!(
        url = redis.url(),
        prefix = redis.prefix(),
        "sharing limits through Redis"
    );
    let shared = SharedLimiter::with_lease_period(
        redis,
        gw.rule_stores.clone(),
        std::sync::Arc::new(MonotonicClock),
        cfg.redis_lease.0,
    );
    rt.set_shared_limiter(std::sync::Arc::new(shared));
    Ok(())
}
