//! Limiter state across restarts: restore at start, snapshot periodically
//! and at shutdown, and say loudly what happened.
//!
//! Incident 2's replacement web server started every rate limit from zero
//! because its state was written under one path and listed under another; no
//! one noticed. Here the same [`Snapshot`] code writes and reads the file, and
//! every restore is logged and exported (`weir_state_restored_keys`), so a
//! silent zero is visible.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

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
    match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
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

/// Writes the snapshot now; returns the number of keys written.
pub fn write(rt: &Runtime, path: &Path) -> Result<usize, SnapshotError> {
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
}

/// Starts the shared (Redis) limiter when `state.redis_url` is set. It never
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
    let redis = match (&cfg.redis_url, &cfg.redis_sentinel) {
        (Some(url), _) => {
            let tls = RedisTls::from_config(cfg.redis_ca_file.as_deref().map(Path::new))?;
            RedisLimiter::with_tls(url, &cfg.redis_prefix, timeouts, &tls)?
        }
        (None, Some(s)) => RedisLimiter::with_sentinel(&s.settings(), &cfg.redis_prefix, timeouts)?,
        (None, None) => return Ok(()),
    };
    tracing::info!(
        url = redis.url(),
        prefix = redis.prefix(),
        "sharing limits through Redis"
    );
    let shared = SharedLimiter::new(
        redis,
        gw.rule_stores.clone(),
        std::sync::Arc::new(MonotonicClock),
    );
    rt.set_shared_limiter(std::sync::Arc::new(shared));
    Ok(())
}
