//! Starting and stopping a weir instance: bind listeners (or take over
//! inherited ones, see `lifecycle`), spawn the accept loops, the connection
//! sweep, the config watcher, upstream health checks and the admin API;
//! drain on request.
//!
//! Used by `weir run` and, in-process, by tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use weir_limiter::Snapshot;

use crate::admin;
use crate::config::{ConfigErrors, Env, LifecycleConfig, LoadedConfig};
use crate::edge::balance::AcceptBalance;
use crate::edge::{Acceptor, ListenerSpec};
use crate::edge::{listener, serve};
use crate::gateway::Gateway;
use crate::lifecycle::warmup::{self, Phase};
use crate::lifecycle::workers::Workers;
use crate::lifecycle::{Inherited, ListeningSocket, SocketRole, drain_plan, upgrade};
use crate::observe::access_log::LogTarget;
use crate::observe::{AccessLog, Metrics};
use crate::proxy::Proxy;
use crate::runtime::Runtime;
use crate::state;

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration:\n{0}")]
    Config(#[from] ConfigErrors),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("state.redis_url / redis_sentinel: {0}")]
    Redis(#[from] weir_limiter::redis::RedisSetupError),
    #[error("cannot open the access log `{target}`: {source}")]
    AccessLog {
        target: String,
        source: std::io::Error,
    },
    #[error("cannot start process.workers' threads: {0}")]
    Workers(std::io::Error),
}

/// A running instance.
pub struct Server {
    pub runtime: Arc<Runtime>,
    /// Bound client listener addresses, in configuration order.
    pub listeners: Vec<SocketAddr>,
    /// The bound admin address, if enabled.
    pub admin: Option<SocketAddr>,
    /// What the start-up restore of limiter state found.
    pub restored: state::Restored,
    /// Listening sockets taken over instead of bound.
    pub inherited_listeners: usize,
    /// The same sockets as `listeners` and `admin`, kept to hand on.
    sockets: Vec<ListeningSocket>,
    stop: CancellationToken,
    /// The client accept loops, joined when a drain begins.
    accepting: Vec<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    /// The worker threads beyond the caller's (stopped when the server is
    /// dropped, after its drain).
    _workers: Workers,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Connections still open at the deadline (closed by force).
    pub forced: usize,
    pub took: Duration,
}

/// Descriptors kept back for upstream connections, logs, snapshots and the
/// admin API when the open-file limit caps client connections.
const FD_RESERVE: u64 = 1024;

/// Between stopping accepting and asking connections to close: a connection
/// accepted just before has its first request in the socket but not yet
/// parsed, and closing it then resets a request the client already sent (an
/// upgrade would show this as a failed request). Idle keep-alive connections
/// keep serving meanwhile.
const FIRST_REQUEST_GRACE: Duration = Duration::from_millis(300);

impl Server {
    /// Builds the gateway and starts serving. Must run inside a tokio runtime.
    pub async fn start(
        loaded: LoadedConfig,
        config_path: Option<PathBuf>,
        env: Box<dyn Env + Send + Sync>,
    ) -> Result<Server, StartError> {
        Server::start_with(loaded, config_path, env, Inherited::default()).await
    }

    /// Like [`Server::start`], but takes over `inherited` sockets (matched to
    /// configured listeners by role and address; the rest are bound) and,
    /// if it carries one, restores limiter state from its snapshot instead
    /// of the snapshot file.
    pub async fn start_with(
        loaded: LoadedConfig,
        config_path: Option<PathBuf>,
        env: Box<dyn Env + Send + Sync>,
        inherited: Inherited,
    ) -> Result<Server, StartError> {
        Server::start_workers(loaded, config_path, env, inherited, 0).await
    }

    /// Like [`Server::start_with`], with `extra_workers` threads beside the
    /// caller's, each accepting on every client listener with a scheduler
    /// of its own ([`Workers`]). Meant for a caller on a single-threaded
    /// scheduler (`weir run`, for `process.workers` above 1).
    pub async fn start_workers(
        loaded: LoadedConfig,
        config_path: Option<PathBuf>,
        env: Box<dyn Env + Send + Sync>,
        mut inherited: Inherited,
        extra_workers: usize,
    ) -> Result<Server, StartError> {
        let gateway = first_gateway(loaded)?;
        let access_log = open_access_log(&gateway)?;
        let (metrics, warm_up_metrics) = metrics_with_warm_up();
        let lifecycle = gateway.loaded.config.lifecycle.clone();
        let specs = gateway.listeners.clone();
        let admin_addr = gateway.admin_address;
        let process = &gateway.loaded.config.process;
        let watch_interval = process.watch_config.then_some(process.watch_interval.0);
        let runtime = Runtime::new(gateway, metrics, access_log, config_path, env);
        runtime.tracker.set_ceiling(connection_ceiling());
        // State first: the first request after a restart must meet the limits
        // the previous process had reached.
        let (restored, watch) = take_up_state(&runtime, &mut inherited);
        state::connect_redis(&runtime)?;
        // Close the warm-up gate before the admin API answers `/readyz`. In
        // an upgrade it must open before the previous process gives up.
        let ready_by = inherited.ready_by;
        let warm_up_started = Instant::now();
        if lifecycle.ready_requires_upstream {
            begin_warm_up(&runtime, &lifecycle, warm_up_started, ready_by);
        }
        let workers = Workers::start(extra_workers).map_err(StartError::Workers)?;
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        let bound = BoundListeners::bind(&specs, admin_addr, &mut inherited)?;
        let listeners = bound.clients.iter().map(|c| c.local).collect();
        let admin = bound.admin.map(|(l, local)| {
            tasks.push(tokio::spawn(admin::serve(l, runtime.clone(), stop.clone())));
            local
        });
        let accepting = spawn_accept_loops(bound.clients, specs, &runtime, &workers, &stop)?;
        let (background, warm_up) =
            spawn_background_tasks(&runtime, watch_interval, watch, warm_up_metrics, &stop);
        tasks.extend(background);
        // Sockets inherited but no longer configured close here; the
        // previous process still holds its copies until it exits.
        drop(inherited);
        if let Phase::Waiting { deadline, .. } = warm_up {
            await_warm_up(&runtime, deadline, ready_by.is_some(), warm_up_started).await;
        }
        Ok(Server {
            runtime,
            listeners,
            admin,
            stop,
            accepting,
            tasks,
            _workers: workers,
            restored,
            inherited_listeners: bound.inherited,
            sockets: bound.sockets,
        })
    }

    /// The listening sockets (client listeners, then admin), to hand to the
    /// next process in an upgrade.
    pub fn sockets(&self) -> &[ListeningSocket] {
        &self.sockets
    }

    /// Finishes the work in flight up to `deadline`, then closes what is
    /// left (see [`Server::drain_unless`]).
    pub async fn drain(self, deadline: Duration, accepting: Accepting) -> DrainReport {
        self.drain_unless(deadline, accepting, std::future::pending())
            .await
    }

    /// Drains: with [`Accepting::WhileEarlierWork`], first keeps accepting
    /// (every connection closing after one request) until the connections
    /// open now have closed, or another process listens beside this one, or
    /// what requests lately took is all the time left
    /// ([`drain_plan::accepting_for`]); then stops accepting, lets in-flight
    /// requests finish up to `deadline`, and closes what is left. Alone on
    /// its sockets, it keeps them open to the end, dropping new handshakes:
    /// a connection attempt waits (its SYN sent again a second later, then
    /// three, then seven) instead of being refused. Cut short when
    /// `stop_now` resolves (a second signal): open connections are closed at
    /// once. The snapshot is written either way.
    ///
    /// Why keep accepting: a plain stop and start (`docker restart`, most
    /// scripts) starts the next process only once this one has exited.
    /// Closing the listener at the signal refused every connection for the
    /// whole drain (uploads take seconds): 700-1,400 refused per restart
    /// at 200 requests a second. Accepting until the earlier work is done
    /// left the next process the tail of what began meanwhile, refused too
    /// (355 and 776 in two of four docker stops), and took in uploads that
    /// docker's kill at 10 s then cut.
    pub async fn drain_unless(
        self,
        deadline: Duration,
        accepting: Accepting,
        stop_now: impl std::future::Future<Output = ()>,
    ) -> DrainReport {
        let started = Instant::now();
        tokio::pin!(stop_now);
        let (mut cut_short, waiting) = match accepting {
            Accepting::WhileEarlierWork => {
                self.accept_a_while(started, deadline, &mut stop_now).await
            }
            Accepting::No => (false, Vec::new()),
        };
        self.stop.cancel();
        // An accept loop may be between `accept` and counting the connection
        // when `stop` is sent: until it has exited, `open() == 0` could end
        // the drain at once and close a connection holding an unread
        // request. They exit at their next poll.
        for task in self.accepting {
            let _ = tokio::time::timeout(ACCEPT_LOOP_EXIT, task).await;
        }
        // The loops took what was queued and dropped their sockets.
        let sockets = kept_to_exit(self.sockets, &waiting);
        // The state as it is now, for a successor starting beside this
        // process (`SO_REUSEPORT`, blue/green): it merges the file when it
        // changes. The final one follows once the last request is done.
        let snapshot = write_snapshot(&self.runtime);
        // (After a drain that kept accepting, every connection was told to
        // close after its first request already.)
        if !cut_short && accepting == Accepting::No && deadline > FIRST_REQUEST_GRACE {
            cut_short = await_first_requests(&self.runtime.tracker, &mut stop_now).await;
        }
        self.runtime.tracker.drain();
        let forced = finish_connections(
            &self.runtime.tracker,
            started,
            deadline,
            cut_short,
            &mut stop_now,
        )
        .await;
        for t in self.tasks {
            t.abort();
        }
        if let Some(first) = snapshot {
            let _ = first.await;
        }
        if let Some(last) = write_snapshot(&self.runtime) {
            let _ = last.await;
        }
        give_back_leases(&self.runtime).await;
        drop(sockets);
        self.runtime.access_log.flush();
        DrainReport {
            forced,
            took: started.elapsed(),
        }
    }

    /// A drain's accepting phase ([`Accepting::WhileEarlierWork`]): serves
    /// the earlier work, then lets handshakes under way settle. Whether a
    /// second signal cut it short, and the indices of the sockets kept
    /// open to the end, dropping new handshakes (alone on them).
    async fn accept_a_while(
        &self,
        started: Instant,
        deadline: Duration,
        stop_now: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> (bool, Vec<usize>) {
        match self.serve_earlier_work(started, deadline, stop_now).await {
            None => (true, Vec::new()),
            // Beside another process the kernel gives the new connections
            // to it as soon as this socket closes; those it queued here
            // until then would be reset, so the handshakes settle first (a
            // SYN dropped meanwhile is sent again a second later, and then
            // finds only the other).
            Some(Company::Beside) => {
                self.settle_handshakes(stop_now).await;
                (false, Vec::new())
            }
            Some(Company::Alone) => (false, self.settle_handshakes(stop_now).await),
        }
    }

    /// The first part of a drain that keeps accepting: every connection is
    /// told to close after the request in hand (new ones after their first),
    /// and this waits until the connections open at the start have closed,
    /// or the deadline, or another process listens on one of the addresses
    /// (a restart beside this one: it takes the new connections). `None`
    /// when `stop_now` cut it short.
    async fn serve_earlier_work(
        &self,
        started: Instant,
        deadline: Duration,
        stop_now: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> Option<Company> {
        let tracker = &self.runtime.tracker;
        let earlier = tracker.next_id();
        tracker.drain();
        let beside = || {
            self.sockets
                .iter()
                .filter(|s| s.role == SocketRole::Client)
                .any(|s| crate::lifecycle::siblings::another_listens(&s.socket))
        };
        // A look asks the kernel for its listeners (microseconds), and
        // runs on this worker's thread: looked at again only after ten
        // times what the last took, in case a kernel answers slowly.
        let look = || {
            let at = Instant::now();
            (beside(), at + (at.elapsed() * 10).max(SIBLING_LOOK))
        };
        let (mut sibling, mut next_look) = look();
        if !sibling {
            tracing::info!(
                connections = tracker.opened_before(earlier),
                "draining: still accepting (each connection closes after one request) until the requests in flight at the signal are done"
            );
        }
        let accept_for = drain_plan::accepting_for(
            deadline,
            &self.runtime.spans,
            started,
            tracker.oldest_request(),
        );
        while !sibling && tracker.opened_before(earlier) > 0 && started.elapsed() < accept_for {
            tokio::select! {
                _ = tokio::time::sleep(EARLIER_WORK_POLL) => {}
                _ = stop_now.as_mut() => return None,
            }
            if Instant::now() >= next_look {
                (sibling, next_look) = look();
            }
        }
        tracing::info!(
            took = ?started.elapsed(),
            another_process_listens = sibling,
            earlier_work_open = tracker.opened_before(earlier),
            left_for_what_was_accepted = ?deadline.saturating_sub(started.elapsed()),
            "draining: stopped accepting"
        );
        Some(if sibling {
            Company::Beside
        } else {
            Company::Alone
        })
    }

    /// The last moments of accepting, on the client sockets this process
    /// closes at exit: new connection attempts are dropped (their SYNs sent
    /// again after a second, to the next process) while the handshakes
    /// under way complete and are accepted. Closing at once reset the
    /// connections the kernel completed after the last accept, requests
    /// sent on them included (one in about twenty runs of the stop/start
    /// harm test at 300 connections a second). Returns the indices of the
    /// sockets that drop new handshakes now.
    async fn settle_handshakes(
        &self,
        stop_now: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> Vec<usize> {
        let mut dropping = Vec::new();
        for (i, s) in self.sockets.iter().enumerate() {
            if s.role != SocketRole::Client || s.held_by_systemd {
                continue;
            }
            match listener::stop_new_handshakes(&s.socket) {
                Ok(()) => dropping.push(i),
                Err(e) => {
                    tracing::warn!(address = %s.configured, error = %e, "draining: could not stop new handshakes; closing the socket may reset some and refuses the rest")
                }
            }
        }
        if !dropping.is_empty() {
            tokio::select! {
                _ = tokio::time::sleep(HANDSHAKE_SETTLE) => {}
                _ = stop_now.as_mut() => {}
            }
        }
        dropping
    }

    /// Closes everything now.
    pub fn abort(&self) {
        self.stop.cancel();
        self.runtime.tracker.drain();
        self.runtime.tracker.abort_all();
    }
}

/// Gives connections accepted just before the drain
/// [`FIRST_REQUEST_GRACE`] to bring their first request; true when a
/// second signal cut it short.
async fn await_first_requests(
    tracker: &crate::edge::ConnTracker,
    stop_now: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> bool {
    if tracker.open() == 0 {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep(FIRST_REQUEST_GRACE) => false,
        _ = stop_now.as_mut() => true,
    }
}

/// The sockets a draining process keeps until it exits: those not for
/// clients (they go with it), and the client sockets at `waiting`, which
/// drop new handshakes: connection attempts wait for the next process
/// instead of being refused, and the kernel queues nothing on them for
/// this process to reset. Any other client socket closes now (beside
/// another process the kernel then gives it the new connections).
/// systemd, or a successor sharing the socket, holds its own copy: that
/// socket stays open and keeps queueing.
fn kept_to_exit(mut sockets: Vec<ListeningSocket>, waiting: &[usize]) -> Vec<ListeningSocket> {
    let mut index = 0;
    sockets.retain(|s| {
        let keep = s.role != SocketRole::Client || waiting.contains(&index);
        index += 1;
        keep
    });
    sockets
}

/// The gateway a process starts with: the host's checks (addresses, files)
/// first, the challenge's key prepared, the configuration's warnings
/// logged.
fn first_gateway(loaded: LoadedConfig) -> Result<Gateway, StartError> {
    let (host, _) = crate::gateway::process::host(&loaded, true);
    if !host.is_empty() {
        return Err(crate::config::ConfigErrors(host).into());
    }
    crate::challenge::keyfile::prepare(&loaded.config);
    let gateway = Gateway::build(loaded, None, 1)?;
    for w in &gateway.warnings {
        tracing::warn!("configuration: {w}");
    }
    Ok(gateway)
}

/// What a starting process takes up from the one before: the limits (handed
/// over, or from the snapshot file), the admission limits, how long
/// requests took; and the watch on the snapshot file, looked at before it
/// is read, so that a later write by the previous process is merged.
fn take_up_state(
    runtime: &Runtime,
    inherited: &mut Inherited,
) -> (state::Restored, Option<state::SnapshotWatch>) {
    let path = state::snapshot_path(runtime);
    let watch = path.as_deref().map(state::SnapshotWatch::new);
    let restored = restore_state(runtime, inherited.snapshot.take());
    if !inherited.admission.is_empty() {
        state::resume_admission(runtime, &inherited.admission);
    } else if let Some(path) = &path {
        state::restore_admission(runtime, path);
    }
    if let Some(path) = &path {
        state::restore_spans(runtime, path);
    }
    runtime.readiness.set_restored(restored.label());
    (restored, watch)
}

/// Longest a stop waits to give leased tokens back to Redis.
const GIVE_BACK_WITHIN: Duration = Duration::from_millis(500);

/// Leased tokens back to the fleet at a stop, not when their TATs pass.
async fn give_back_leases(runtime: &Runtime) {
    if let Some(shared) = runtime.shared_limiter() {
        let _ = tokio::time::timeout(GIVE_BACK_WITHIN, shared.give_back_leases()).await;
    }
}

/// Writes the snapshot (and what goes beside it) on a blocking thread, if
/// one is configured; errors are logged and counted by `state::write`.
fn write_snapshot(
    rt: &Arc<Runtime>,
) -> Option<JoinHandle<Result<usize, weir_limiter::snapshot::SnapshotError>>> {
    let path = state::snapshot_path(rt)?;
    let rt = rt.clone();
    Some(tokio::task::spawn_blocking(move || {
        state::write(&rt, &path)
    }))
}

/// How often the snapshot file is looked at for another process's write: a
/// limit the old generation enforced reaches the new one within this.
const SNAPSHOT_LOOK: Duration = Duration::from_millis(500);

/// The last part of a drain: waits until every connection has closed,
/// or closes those left at the deadline (or at once, `cut_short`, or
/// when `stop_now` resolves). Returns how many were closed by force.
async fn finish_connections(
    tracker: &crate::edge::ConnTracker,
    started: Instant,
    deadline: Duration,
    mut cut_short: bool,
    stop_now: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> usize {
    while tracker.open() > 0 {
        if cut_short || started.elapsed() >= deadline {
            let forced = tracker.open();
            tracker.abort_all();
            // Give aborted tasks a moment to drop their sockets.
            let grace = Instant::now();
            while tracker.open() > 0 && grace.elapsed() < Duration::from_secs(1) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            return forced;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            _ = stop_now.as_mut() => cut_short = true,
        }
    }
    0
}

/// Whether another process listens beside this one as its drain stops
/// accepting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Company {
    Alone,
    Beside,
}

/// Whether a drain goes on accepting for a while (see [`Server::drain_unless`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepting {
    /// Stop at once: another process has the sockets (an upgrade's
    /// successor), or the caller wants none taken.
    No,
    /// Until the work in flight at the start is done, unless another
    /// process listens beside this one.
    WhileEarlierWork,
}

/// How long a drain goes on accepting once new handshakes are stopped: a
/// handshake under way completes within its client's round trip (tens of
/// microseconds on loopback, most clients within 100 ms).
const HANDSHAKE_SETTLE: Duration = Duration::from_millis(100);
/// How often a drain that keeps accepting looks whether its earlier work is
/// done.
const EARLIER_WORK_POLL: Duration = Duration::from_millis(10);
/// How often, at most, it looks for another process listening beside it.
const SIBLING_LOOK: Duration = Duration::from_millis(250);

/// How long a drain waits for the accept loops to see `stop`.
const ACCEPT_LOOP_EXIT: Duration = Duration::from_secs(1);

/// How long a fresh start waits for its first warm-up probe round (a loopback
/// app answers in milliseconds).
const FIRST_ROUND_GRACE: Duration = Duration::from_secs(1);
/// How long past the warm-up deadline an upgrade waits for the gate to open
/// (the probe loop opens it within milliseconds of the deadline).
const SETTLE_SLACK: Duration = Duration::from_millis(250);

/// Client connections this process can hold. Each needs a descriptor; busy
/// ones also hold an upstream connection, which draws from the reserve (idle
/// keep-alive connections, the bulk at any cap, do not).
fn connection_ceiling() -> usize {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024);
    (limit.saturating_sub(FD_RESERVE)).max(64) as usize
}

/// Opens `access_log.target` (a file, a stream or off) for the instance.
fn open_access_log(gateway: &Gateway) -> Result<AccessLog, StartError> {
    let target = gateway.loaded.config.access_log.target.clone();
    AccessLog::start(&LogTarget::parse(&target)).map_err(|source| StartError::AccessLog {
        target: target.clone(),
        source,
    })
}

/// The instance's metrics, with the warm-up probes' counters registered in
/// them; the counters go on to the warm-up task.
fn metrics_with_warm_up() -> (Arc<Metrics>, warmup::WarmUpMetrics) {
    let mut metrics = Metrics::new();
    let warm_up_metrics = warmup::WarmUpMetrics::default();
    warm_up_metrics.register(metrics.weir_registry());
    (Arc::new(metrics), warm_up_metrics)
}

/// Restores limiter state: from the previous process's `snapshot` in an
/// upgrade (counted in `state_restored_keys`), else from the snapshot file.
fn restore_state(runtime: &Runtime, snapshot: Option<Snapshot>) -> state::Restored {
    match snapshot {
        Some(snapshot) => {
            let report = upgrade::restore(runtime, &snapshot);
            runtime
                .metrics
                .state_restored_keys
                .set(report.restored() as i64);
            state::Restored::Loaded(report)
        }
        None => state::restore(runtime),
    }
}

/// Closes the warm-up gate until the awaited pools (and the shared limiter)
/// answer or `lifecycle.ready_upstream_timeout` passes; in an upgrade,
/// `ready_by` bounds it too, so the gate opens before the previous process
/// gives up.
fn begin_warm_up(
    runtime: &Runtime,
    lifecycle: &LifecycleConfig,
    started: Instant,
    ready_by: Option<Instant>,
) {
    let mut deadline = started + lifecycle.ready_upstream_timeout.0;
    if let Some(by) = ready_by.filter(|by| *by < deadline) {
        tracing::info!(
            "warm-up in an upgrade is bounded by three quarters of --upgrade-timeout, \
             shorter than lifecycle.ready_upstream_timeout"
        );
        deadline = by;
    }
    runtime.readiness.begin(warmup::Phase::start(
        started,
        deadline,
        warmup::awaited(&runtime.gateway.load().pools, runtime.shared_limiter()),
    ));
}

/// The listening sockets of a starting instance, bound or taken over from
/// the previous process (or systemd).
struct BoundListeners {
    /// One per configured client listener, in configuration order.
    clients: Vec<ClientListener>,
    /// The admin listener and its bound address, if enabled.
    admin: Option<(tokio::net::TcpListener, SocketAddr)>,
    /// Copies of all of them (client listeners, then admin), kept to hand
    /// on in an upgrade.
    sockets: Vec<ListeningSocket>,
    /// How many were taken over instead of bound.
    inherited: usize,
}

/// A client listener, ready for its accept loops.
struct ClientListener {
    /// Registered with the caller's scheduler.
    listener: tokio::net::TcpListener,
    /// A copy for the extra workers to register with theirs.
    copy: std::net::TcpListener,
    /// The bound address (the configured one if it cannot be read).
    local: SocketAddr,
}

impl BoundListeners {
    /// Binds, or takes over from `inherited`, every client listener in
    /// `specs`, then the admin listener at `admin_addr` if there is one.
    fn bind(
        specs: &[ListenerSpec],
        admin_addr: Option<SocketAddr>,
        inherited: &mut Inherited,
    ) -> Result<BoundListeners, StartError> {
        let mut bound = BoundListeners {
            clients: Vec::with_capacity(specs.len()),
            admin: None,
            sockets: Vec::new(),
            inherited: 0,
        };
        for spec in specs {
            let std_listener =
                bound.open(inherited, SocketRole::Client, spec.address, spec.reuse_port)?;
            let bind_err = |source| StartError::Bind {
                addr: spec.address,
                source,
            };
            let copy = std_listener.try_clone().map_err(bind_err)?;
            let listener = tokio::net::TcpListener::from_std(std_listener).map_err(bind_err)?;
            let local = listener.local_addr().unwrap_or(spec.address);
            bound.clients.push(ClientListener {
                listener,
                copy,
                local,
            });
        }
        if let Some(addr) = admin_addr {
            let std_listener = bound.open(inherited, SocketRole::Admin, addr, false)?;
            let listener = tokio::net::TcpListener::from_std(std_listener)
                .map_err(|source| StartError::Bind { addr, source })?;
            let local = listener.local_addr().unwrap_or(addr);
            bound.admin = Some((listener, local));
        }
        Ok(bound)
    }

    /// The socket for `role` at `addr`: taken over from `inherited` when it
    /// holds one, else bound. A copy is kept in `sockets` to hand on.
    fn open(
        &mut self,
        inherited: &mut Inherited,
        role: SocketRole,
        addr: SocketAddr,
        reuse_port: bool,
    ) -> Result<std::net::TcpListener, StartError> {
        let bind_err = |source| StartError::Bind { addr, source };
        let (std_listener, held_by_systemd) = match inherited.take(role, addr) {
            Some(l) => {
                self.inherited += 1;
                // Non-blocking is a property of the shared socket; set it
                // anyway (systemd may pass blocking sockets).
                l.listener.set_nonblocking(true).map_err(bind_err)?;
                listener::accept_new_handshakes(&l.listener);
                (l.listener, l.tag.is_none())
            }
            None => (listener::bind(addr, reuse_port).map_err(bind_err)?, false),
        };
        self.sockets.push(ListeningSocket {
            role,
            configured: addr,
            socket: std_listener.try_clone().map_err(bind_err)?,
            held_by_systemd,
        });
        Ok(std_listener)
    }
}

/// Spawns the accept loops: for each client listener, one on the caller's
/// scheduler (thread 0) and one on each extra worker thread (1, 2, ...),
/// all serving through one shared [`Acceptor`], which shares the
/// connections out between the threads.
fn spawn_accept_loops(
    clients: Vec<ClientListener>,
    specs: Vec<ListenerSpec>,
    runtime: &Arc<Runtime>,
    workers: &Workers,
    stop: &CancellationToken,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let acceptor = Arc::new(Acceptor {
        tracker: runtime.tracker.clone(),
        metrics: runtime.metrics.clone(),
        service: Proxy::new(runtime.clone()),
        balance: Arc::new(AcceptBalance::new(1 + workers.len(), |thread| {
            runtime.metrics.worker_connections(thread)
        })),
    });
    let edge = runtime.gateway.load().edge;
    let mut accepting = Vec::new();
    for (index, (client, spec)) in clients.into_iter().zip(specs).enumerate() {
        let mut thread = 0;
        let at = serve::Listening {
            thread: 0,
            index,
            spec,
            edge,
        };
        let on_workers = workers.accept_on(&client.copy, |l| {
            thread += 1;
            let at = serve::Listening {
                thread,
                ..at.clone()
            };
            serve::accept_loop(l, at, acceptor.clone(), stop.clone())
        });
        accepting.extend(on_workers.map_err(StartError::Workers)?);
        accepting.push(tokio::spawn(serve::accept_loop(
            client.listener,
            at,
            acceptor.clone(),
            stop.clone(),
        )));
    }
    Ok(accepting)
}

/// Spawns the instance's background tasks: the connection sweep, the
/// scheduler-lag probe, the config
/// watcher (when `watch_interval` is set), upstream upkeep, the warm-up
/// probes (while the gate is closed) and limiter-state upkeep. Returns them
/// with the warm-up phase as it stood when the probes were spawned.
fn spawn_background_tasks(
    runtime: &Arc<Runtime>,
    watch_interval: Option<Duration>,
    watch: Option<state::SnapshotWatch>,
    warm_up_metrics: warmup::WarmUpMetrics,
    stop: &CancellationToken,
) -> (Vec<JoinHandle<()>>, Phase) {
    let mut tasks = vec![tokio::spawn(sweep(runtime.clone(), stop.clone()))];
    // This thread's scheduler lag, for the adaptive limit (each worker
    // thread measures its own).
    let probe_stop = stop.clone();
    tasks.push(tokio::spawn(async move {
        tokio::select! {
            () = probe_stop.cancelled() => {}
            () = crate::admission::lag::probe() => {}
        }
    }));
    if let Some(every) = watch_interval {
        tasks.push(tokio::spawn(watch_config(
            runtime.clone(),
            every,
            stop.clone(),
        )));
    }
    tasks.push(tokio::spawn(maintain_upstreams(
        runtime.clone(),
        stop.clone(),
    )));
    tasks.push(tokio::spawn(record_timeline(runtime.clone(), stop.clone())));
    let warm_up = runtime.readiness.phase();
    if !warm_up.settled() {
        let probes = warmup::WarmUp {
            readiness: runtime.readiness.clone(),
            pools: runtime.gateway.load().pools.to_vec(),
            shared: runtime.shared_limiter_handle(),
            metrics: warm_up_metrics,
        };
        tasks.push(tokio::spawn(warmup::run(probes, stop.clone())));
    }
    tasks.push(tokio::spawn(maintain_state(
        runtime.clone(),
        watch,
        stop.clone(),
    )));
    (tasks, warm_up)
}

/// Holds the start back while the warm-up gate is closed, at most until
/// `deadline`. In an upgrade `Ready` (sent once the start returns) tells the
/// previous process to stop, so it waits for the gate to open. A fresh start
/// returns after the first probe round (a deployment whose app is up is
/// ready at once) and leaves the rest to `/readyz`.
async fn await_warm_up(runtime: &Runtime, deadline: Instant, upgrade: bool, started: Instant) {
    let waited = if upgrade {
        deadline + SETTLE_SLACK
    } else {
        deadline.min(started + FIRST_ROUND_GRACE)
    };
    let phase = runtime
        .readiness
        .wait(
            |p| p.settled() || (!upgrade && matches!(p, Phase::Waiting { probed: true, .. })),
            waited,
        )
        .await;
    if let Some(reason) = phase.not_ready_reason(Instant::now()) {
        tracing::warn!(%reason, "serving before every pool answered");
    }
}

async fn sweep(rt: Arc<Runtime>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let now = Instant::now();
                rt.tracker.sweep(now);
                rt.spans.rotate(now);
            }
        }
    }
}

/// Health checks, silence, slow-start ramps, idle upstream connections
/// past their time and pool gauges, over the pools of whichever gateway is
/// current (so a reload needs no restart of this).
async fn maintain_upstreams(rt: Arc<Runtime>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(crate::upstream::checks::ROUND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let gw = rt.gateway.load_full();
                crate::upstream::checks::round(&gw.pools, &rt.metrics, Instant::now());
            }
        }
    }
}

/// Closes the live page's second every second, with each pool of the
/// current gateway as it is then (`observe::timeline`).
async fn record_timeline(rt: Arc<Runtime>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let samples = pool_samples(&rt.gateway.load());
                let now = crate::observe::timeline::unix_s(std::time::SystemTime::now());
                rt.timeline.close_second(now, &samples);
            }
        }
    }
}

fn pool_samples(gw: &crate::gateway::Gateway) -> Vec<crate::observe::timeline::PoolSample> {
    gw.pools
        .iter()
        .map(|p| {
            let snap = p.admission.as_ref().map(|q| q.snapshot());
            let lanes = snap.as_ref().map_or(&[][..], |s| &s.lanes[..]);
            crate::observe::timeline::PoolSample {
                pool: p.name.clone(),
                in_flight: snap
                    .as_ref()
                    .map_or(u64::from(p.in_flight()), |s| s.in_flight as u64),
                limit: snap.as_ref().map(|s| s.limit as u64),
                queued: lanes.iter().map(|l| l.queued as u64).sum(),
                admitted_total: lanes.iter().map(|l| l.admitted_total).sum(),
                waited_total: lanes.iter().map(|l| l.waited_total).sum(),
            }
        })
        .collect()
}

/// Sweeps expired limiter keys and writes the snapshot periodically; merges
/// the snapshot when another process replaces it.
async fn maintain_state(
    rt: Arc<Runtime>,
    mut watch: Option<state::SnapshotWatch>,
    stop: CancellationToken,
) {
    let every = rt.gateway.load().loaded.config.state.snapshot_interval.0;
    let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut look = tokio::time::interval(SNAPSHOT_LOOK);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A successor announces itself by writing the file as soon as it runs;
    // a predecessor still serving (blue/green, a restart beside it) sees a
    // newer generation's write and answers with its own state at once, so
    // the successor has the limits in force within about a second instead
    // of at the next periodic snapshot.
    if let Some(path) = state::snapshot_path(&rt) {
        let rt = rt.clone();
        let _ = tokio::task::spawn_blocking(move || state::write(&rt, &path)).await;
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = look.tick(), if watch.is_some() => {
                if let (Some(mut w), Some(path)) = (watch.take(), state::snapshot_path(&rt)) {
                    // A stat per tick; the file is read only when replaced.
                    let rt = rt.clone();
                    watch = tokio::task::spawn_blocking(move || {
                        let merged = w.merge_if_changed(&rt, &path);
                        if merged.is_some_and(|m| m.from_newer) {
                            tracing::info!("a newer weir generation shares the snapshot file: handing it this one's limiter state");
                            let _ = state::write(&rt, &path);
                        }
                        w
                    })
                    .await
                    .ok();
                }
            }
            _ = tick.tick() => {
                let rt = rt.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    state::sweep(&rt);
                    if let Some(path) = state::snapshot_path(&rt) {
                        let _ = state::write(&rt, &path);
                    }
                })
                .await;
            }
        }
    }
}

async fn watch_config(rt: Arc<Runtime>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let rt = rt.clone();
                // Errors are logged and counted by reload itself.
                let _ = tokio::task::spawn_blocking(move || rt.reload(false)).await;
            }
        }
    }
}
