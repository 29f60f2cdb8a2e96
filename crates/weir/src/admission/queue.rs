//! The admission queue of one upstream pool: a concurrency limit, bounded
//! waiting by priority lane with fair share inside each lane, deadlines, and
//! shedding that answers fast instead of letting the app's backlog overflow.
//!
//! A request calls [`AdmissionQueue::acquire`] and gets a [`Permit`] (a guard:
//! dropping it frees the slot and hands it straight to the next waiter) or a
//! [`Shed`] saying why not and when to come back. Waiters are served highest
//! lane first (except that a lane with a guaranteed share, owed a grant,
//! goes ahead: [`Shared::next_lane`]), and within a lane by [`FairQueue`]'s
//! round robin over networks, subnets and addresses.
//!
//! When there is no room to wait (lane at `max_depth`, or the pool at
//! `max_queued`):
//! 1. a pool-wide overflow sheds the newest waiter of the fattest network in
//!    the *lowest non-empty lane below* the arrival (`LowerLaneShed`);
//! 2. otherwise the arrival's own lane sheds the newest waiter of its fattest
//!    network, if the arrival's network has fewer waiting than that one
//!    (`QueueFull` for the victim); a tie or worse sheds the arrival itself.
//!
//! So a flood fills the queue only up to the point where it starts shedding
//! itself, and a higher lane is never refused while a lower lane holds room.
//!
//! One slot class sits outside the traffic limit: health checks
//! ([`AdmissionQueue::try_acquire_health`]) use up to `health_reserve` slots
//! carved out of the app's `workers`, so a check never waits behind traffic
//! and traffic never takes the worker the check needs (incident 1: a check that
//! competed for php-fpm workers turned *busy* into *restarted*). While no
//! check runs and the limit stands at the workers' ceiling, the kept worker
//! is *lent* to one arriving request of a fast shape
//! ([`ShapeCosts::is_fast`]: learned, at most 100 ms unqueued): a check that
//! comes meanwhile waits behind one fast answer at most, and the app gets
//! its last worker's throughput back (a tenth of it with ten workers: in
//! the 2026-09-23 replay with crawlers like people, the difference between
//! people waiting past 2 s and not). The lent slot goes to an arrival, not
//! to a waiter: the fair queue cannot be searched for a fast request, and
//! the slot is one the waiters would not have had. Nor does it go to an
//! arrival that would pass a waiter of a higher lane or of its own network:
//! it keeps fair share (arrivals come as often as a network sends, and one
//! network of a thousand addresses took a sixth of the slots where its
//! share was a fiftieth).
//!
//! Time comes from tokio's clock (`tokio::time::Instant`), which tests pause
//! and advance; nothing here sleeps except a waiter until its own deadline.
//! This module does not pick a server, measure the upstream, or build a
//! response: a [`Shed`] is turned into `503` + `Retry-After` by the one
//! function that maps rejections to responses.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::adaptive::{GradientConfig, GradientConfigError, GradientLimit, LimitState, Sample};
use super::fair::{FairKey, FairQueue, Ticket};
use super::lanes::{Lane, Lanes};
use super::shapes::{Shape, ShapeCosts};
use crate::identity::PrefixKey;

/// Where the traffic limit comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitConfig {
    /// A fixed `max_in_flight`, e.g. the app's workers minus one.
    Fixed(NonZeroUsize),
    /// Learned from latency ([`GradientLimit`]).
    Adaptive(GradientConfig),
}

/// Settings of one pool's [`AdmissionQueue`].
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub lanes: Lanes,
    pub limit: LimitConfig,
    /// The app's real worker count, when known. Traffic never gets more than
    /// `workers - health_reserve` slots, whatever `limit` says.
    pub workers: Option<NonZeroUsize>,
    /// Slots kept for health checks beyond the traffic limit (default 1;
    /// 0 = no reserved slot: [`AdmissionQueue::try_acquire_health`] always
    /// says no and the pool relies on passive signals).
    pub health_reserve: usize,
    /// Most requests waiting in all lanes together.
    pub max_queued: usize,
    /// Bounds of the `Retry-After` given with a [`Shed`].
    pub retry_after_min: Duration,
    pub retry_after_max: Duration,
}

impl QueueConfig {
    /// Standard lanes, a fixed limit, one health slot, room for 2,048 waiters.
    pub fn fixed(max_in_flight: NonZeroUsize) -> QueueConfig {
        QueueConfig {
            lanes: Lanes::standard(),
            limit: LimitConfig::Fixed(max_in_flight),
            workers: None,
            health_reserve: 1,
            max_queued: 2048,
            retry_after_min: Duration::from_secs(1),
            retry_after_max: Duration::from_secs(30),
        }
    }
}

/// Why a [`QueueConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueueConfigError {
    #[error("workers = {workers} leaves no slot for traffic after health_reserve = {reserve}")]
    ReserveTakesAllWorkers { workers: usize, reserve: usize },
    #[error("retry_after_min {min:?} exceeds retry_after_max {max:?}")]
    RetryAfterBounds { min: Duration, max: Duration },
    #[error(transparent)]
    Adaptive(#[from] GradientConfigError),
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// No room to wait in the lane or the pool.
    QueueFull,
    /// Waited until its deadline without getting a slot.
    DeadlineExceeded,
    /// Evicted from the queue to make room for a higher lane.
    LowerLaneShed,
}

impl ShedReason {
    /// The `reason` label in logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::DeadlineExceeded => "deadline_exceeded",
            ShedReason::LowerLaneShed => "lower_lane_shed",
        }
    }

    const ALL: [ShedReason; 3] = [
        ShedReason::QueueFull,
        ShedReason::DeadlineExceeded,
        ShedReason::LowerLaneShed,
    ];

    fn slot(self) -> usize {
        self as usize
    }
}

/// A refusal: answer `503` with `Retry-After: retry_after` (whole seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("shed from lane {} ({}) after waiting {waited:?}; retry after {retry_after:?}", lane.index(), reason.as_str())]
pub struct Shed {
    pub reason: ShedReason,
    pub lane: Lane,
    pub retry_after: Duration,
    pub waited: Duration,
}

/// How a request that held a [`Permit`] ended, for the adaptive limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered; `latency` is the upstream time only.
    Answered(Duration),
    /// The upstream was overloaded: timed out, reset, or answered 503.
    Overloaded,
    /// Says nothing about the upstream (client left, rejected early).
    Abandoned,
}

// One per pool, behind the queue's lock: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Limiter {
    Fixed(usize),
    Adaptive(GradientLimit),
}

/// Requests a network must still have waiting in its lane, after one of its
/// own was granted, for that grant to count towards a lower lane's share
/// that yields to proof: a network with a backlog of its own is using more
/// than a turn; people's pages arrive a few at a time.
const BACKLOG: usize = 8;

/// How often waiters held only by the adaptive limit's open bound are
/// looked at again: the bound grows by time at most once a window.
const OPEN_BOUND_LOOK: Duration = Duration::from_millis(250);

impl Limiter {
    /// The limit in force (for an adaptive one, its open bound included).
    fn limit(&self) -> usize {
        match self {
            Limiter::Fixed(n) => *n,
            Limiter::Adaptive(g) => g.allowed(),
        }
    }

    /// The learned limit: for an adaptive one, without its open bound.
    fn learned(&self) -> usize {
        match self {
            Limiter::Fixed(n) => *n,
            Limiter::Adaptive(g) => g.limit(),
        }
    }

    fn open_bound(&self) -> Option<usize> {
        match self {
            Limiter::Fixed(_) => None,
            Limiter::Adaptive(g) => g.open_bound(),
        }
    }

    /// Lets an adaptive limit's open bound grow before a grant decision;
    /// says whether it still holds `in_flight` back, so that someone must
    /// look again when it may grow by time.
    fn grow_open(&mut self, now: Instant, in_flight: usize) -> bool {
        match self {
            Limiter::Fixed(_) => false,
            Limiter::Adaptive(g) => {
                g.grow_open(now.into_std(), in_flight);
                g.held_by_open_bound(in_flight)
            }
        }
    }
}

struct Waiter {
    tx: oneshot::Sender<Result<Permit, Shed>>,
    enqueued: Instant,
    /// A verified session, a pass or a verified crawler; else the request
    /// is in its lane by weir's guess about its cost (see
    /// [`crate::admission::LaneSpec::yields_to_proof`]).
    proven: bool,
    /// Its network's key in the fair queue, to tell after the pop whether
    /// the network still holds a backlog there.
    network: PrefixKey,
}

/// How a request entered the queue.
enum Queued {
    /// A slot was free: admitted without waiting.
    Admitted(Permit),
    /// Waiting for a slot: the answer comes on the channel.
    Waiting(oneshot::Receiver<Result<Permit, Shed>>, super::fair::Ticket),
}

#[derive(Default)]
struct LaneCounters {
    admitted: u64,
    /// Time the admitted waited, summed (an immediate admission adds 0).
    waited: Duration,
    shed: [u64; 3],
    abandoned: u64,
}

struct LaneState {
    queue: FairQueue<Waiter>,
    counters: LaneCounters,
    /// Grants owed to a lane with a [`super::lanes::Share`]: grows by its
    /// share with every grant that goes to a higher lane while it waits,
    /// up to one; a whole grant owed is served ahead of priority.
    deficit: f64,
    /// Recent grants that went to this lane, as a fraction of all grants
    /// (an exponential average, [`GRANT_SHARE_ALPHA`]): how much of the
    /// slots a lane below it can expect to lose to arrivals here while it
    /// waits ([`AdmissionQueue::expected_wait`]).
    grant_share: f64,
}

/// Weight of one grant in the lanes' grant shares: a memory of about a
/// hundred grants.
const GRANT_SHARE_ALPHA: f64 = 0.01;

struct State {
    in_flight: usize,
    health_in_flight: usize,
    /// Fast requests holding the worker kept for health checks (at most
    /// `health_reserve`), outside `in_flight`.
    lent: usize,
    queued: usize,
    lanes: Vec<LaneState>,
    limiter: Limiter,
    /// Exponential average of how long a permit is held, for `Retry-After`.
    hold_secs: Option<f64>,
    /// What the servers can take right now (slow start), if less than the limit.
    capacity: Option<usize>,
    /// A look is due when the adaptive limit's open bound may grow by time
    /// (see [`Shared::wake_for_open_bound`]).
    open_wake_armed: bool,
}

impl State {
    /// Whether a request arriving in `lane` for `key` passes nobody by
    /// taking a slot outside the queue: no waiter in a higher lane, none
    /// of its own network in its lane.
    fn passes_nobody(&self, lane: Lane, key: &FairKey) -> bool {
        let (above, own) = self.lanes.split_at(lane.index());
        above.iter().all(|l| l.queue.is_empty()) && own[0].queue.network_len(&key.network) == 0
    }

    /// Counts one grant to lane `index`.
    fn count_grant(&mut self, index: usize) {
        self.lanes[index].counters.admitted += 1;
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            let to_it = if i == index { 1.0 } else { 0.0 };
            lane.grant_share += GRANT_SHARE_ALPHA * (to_it - lane.grant_share);
        }
    }
}

struct Shared {
    config: QueueConfig,
    /// `workers - health_reserve`, or unbounded.
    ceiling: usize,
    state: Mutex<State>,
    /// What each request shape costs, learned from the answers.
    shapes: ShapeCosts,
}

struct Grant {
    tx: oneshot::Sender<Result<Permit, Shed>>,
    granted: Granted,
}

/// How a slot was granted: what its permit reports when it ends.
#[derive(Debug, Clone, Copy)]
struct Granted {
    lane: Lane,
    waited: Duration,
    /// Requests in flight with this one.
    in_flight: usize,
    /// Whether this one took the limit's last slot (or a waiter's turn):
    /// the app then holds all weir lets it have, and may be queueing, so
    /// the answer's latency is no measure of what its shape costs unqueued.
    at_limit: bool,
    /// It holds the worker kept for health checks, lent to a fast request.
    lent: bool,
}

struct Evicted {
    waiter: Waiter,
    shed: Shed,
}

/// One pool's admission queue. Cheap to clone (shared state).
#[derive(Clone)]
pub struct AdmissionQueue {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AdmissionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.snapshot();
        f.debug_struct("AdmissionQueue")
            .field("limit", &s.limit)
            .field("in_flight", &s.in_flight)
            .field("queued", &s.queued())
            .finish()
    }
}

impl AdmissionQueue {
    pub fn new(config: QueueConfig) -> Result<AdmissionQueue, QueueConfigError> {
        if config.retry_after_min > config.retry_after_max {
            return Err(QueueConfigError::RetryAfterBounds {
                min: config.retry_after_min,
                max: config.retry_after_max,
            });
        }
        let ceiling = match config.workers {
            Some(w) if w.get() <= config.health_reserve => {
                return Err(QueueConfigError::ReserveTakesAllWorkers {
                    workers: w.get(),
                    reserve: config.health_reserve,
                });
            }
            Some(w) => w.get() - config.health_reserve,
            None => usize::MAX,
        };
        let limiter = match &config.limit {
            LimitConfig::Fixed(n) => Limiter::Fixed(n.get()),
            LimitConfig::Adaptive(g) => {
                Limiter::Adaptive(GradientLimit::new(g.clone(), Instant::now().into_std())?)
            }
        };
        let lanes = (0..config.lanes.len())
            .map(|_| LaneState {
                queue: FairQueue::new(),
                counters: LaneCounters::default(),
                deficit: 0.0,
                grant_share: 0.0,
            })
            .collect();
        Ok(AdmissionQueue {
            shared: Arc::new(Shared {
                ceiling,
                state: Mutex::new(State {
                    in_flight: 0,
                    health_in_flight: 0,
                    lent: 0,
                    queued: 0,
                    lanes,
                    limiter,
                    hold_secs: None,
                    capacity: None,
                    open_wake_armed: false,
                }),
                shapes: ShapeCosts::new(),
                config,
            }),
        })
    }

    pub fn lanes(&self) -> &Lanes {
        &self.shared.config.lanes
    }

    /// What this pool's request shapes cost (fed by completed permits that
    /// carry a shape, see [`Permit::learn`]).
    pub fn shapes(&self) -> &ShapeCosts {
        &self.shared.shapes
    }

    /// The default deadline for `lane`: `now` plus the lane's `max_wait`.
    pub fn deadline(&self, lane: Lane, now: Instant) -> Instant {
        now + self.shared.config.lanes.spec(lane).max_wait
    }

    /// The traffic limit in force now (fixed or adaptive, capped by workers).
    pub fn limit(&self) -> usize {
        let st = self.shared.lock();
        self.shared.limit(&st)
    }

    /// Waits for a slot until `deadline`, for a request that proved
    /// nothing (see [`AdmissionQueue::acquire_proven`]). A lane beyond this
    /// pool's lanes is treated as the lowest lane.
    pub async fn acquire(
        &self,
        lane: Lane,
        key: FairKey,
        deadline: Instant,
    ) -> Result<Permit, Shed> {
        self.acquire_proven(lane, key, false, deadline, None).await
    }

    /// Waits for a slot until `deadline`. `proven`: the request holds a
    /// verified session, a pass or a verified crawler's proof; a lane whose
    /// share yields to proof takes its share only from unproven grants.
    /// `shape`: what the request is, if known; a fast one may be lent the
    /// worker kept for health checks (see the module doc).
    pub async fn acquire_proven(
        &self,
        lane: Lane,
        key: FairKey,
        proven: bool,
        deadline: Instant,
        shape: Option<Shape>,
    ) -> Result<Permit, Shed> {
        let shared = &self.shared;
        let lane = shared.config.lanes.clamp(lane);
        let (mut rx, ticket) = match self.enqueue(lane, key, proven, deadline, shape)? {
            Queued::Admitted(permit) => return Ok(permit),
            Queued::Waiting(rx, ticket) => (rx, ticket),
        };

        let mut waiting = Waiting {
            shared,
            lane,
            ticket: Some(ticket),
        };
        let got = tokio::select! {
            biased;
            got = &mut rx => got,
            () = tokio::time::sleep_until(deadline) => {
                let removed = {
                    let mut st = shared.lock();
                    let removed = st.lanes[lane.index()].queue.remove(ticket);
                    removed.map(|w| {
                        st.queued -= 1;
                        let waited = Instant::now().saturating_duration_since(w.enqueued);
                        (w, shared.count_shed(&mut st, lane, ShedReason::DeadlineExceeded, waited))
                    })
                };
                waiting.ticket = None;
                if let Some((_waiter, shed)) = removed {
                    return Err(shed);
                }
                // Granted or evicted just as the deadline fired: the answer is
                // already on its way.
                (&mut rx).await
            }
        };
        waiting.ticket = None;
        // The sender lives in the queue, which lives as long as this future
        // holds `shared`; a closed channel cannot happen, but is not a panic.
        got.unwrap_or(Err(Shed {
            reason: ShedReason::DeadlineExceeded,
            lane,
            retry_after: shared.config.retry_after_min,
            waited: Duration::ZERO,
        }))
    }

    /// Admits at once when a slot is free and no one waits; else makes room
    /// in `lane` (evicting lower lanes' waiters, who are told) and queues,
    /// or sheds.
    fn enqueue(
        &self,
        lane: Lane,
        key: FairKey,
        proven: bool,
        deadline: Instant,
        shape: Option<Shape>,
    ) -> Result<Queued, Shed> {
        let shared = &self.shared;
        let now = Instant::now();
        let mut evicted = Vec::new();
        let queued = {
            let mut st = shared.lock();
            let in_flight = st.in_flight;
            st.limiter.grow_open(now, in_flight);
            if let Some(granted) = shared.grant_at_once(&mut st, lane, &key, shape) {
                drop(st);
                return Ok(Queued::Admitted(Permit::new(shared.clone(), granted, now)));
            }
            let refused = if deadline <= now {
                Err(ShedReason::DeadlineExceeded)
            } else {
                shared.make_room(&mut st, lane, &key, &mut evicted)
            };
            match refused {
                Err(reason) => Err(shared.count_shed(&mut st, lane, reason, Duration::ZERO)),
                Ok(()) => {
                    let (tx, rx) = oneshot::channel();
                    let ticket = st.lanes[lane.index()].queue.push(
                        key,
                        Waiter {
                            tx,
                            enqueued: now,
                            proven,
                            network: key.network,
                        },
                    );
                    st.queued += 1;
                    shared.wake_for_open_bound(&mut st, now);
                    Ok(Queued::Waiting(rx, ticket))
                }
            }
        };
        for e in evicted {
            // The victim may have left already; then there is no one to tell.
            let _ = e.waiter.tx.send(Err(e.shed));
        }
        queued
    }

    /// About how long a request arriving now in `lane` from `key` would wait
    /// for a slot: zero when a slot is free and nobody waits; otherwise the
    /// mean time a slot is held, times the turns ahead of it, over the
    /// limit. The turns ahead are every waiter of a higher lane and, in its
    /// own lane, [`FairQueue::turns_ahead`]: the fresh networks ahead when
    /// its network has nothing queued, else one turn of each network
    /// already waiting per request of its own already queued. Those
    /// own-lane turns are stretched by the arrivals in higher lanes that
    /// will come first meanwhile: at the recent share of grants the higher
    /// lanes took, `h`, the lane gets `1 - h` of the slots. (Without it the
    /// estimate was half the wait or less under a flood, when cheap pages
    /// take most grants: in the 2026-09-23 replay 37% of the challenges
    /// came only after a person had waited out twice the pressure's wait.)
    /// An estimate to choose by (wait, or be asked for proof first), not a
    /// promise.
    pub fn expected_wait(&self, lane: Lane, key: &FairKey) -> Duration {
        let st = self.shared.lock();
        let limit = self.shared.limit(&st);
        if st.queued == 0 && st.in_flight < limit {
            return Duration::ZERO;
        }
        let lane = self.shared.config.lanes.clamp(lane).index();
        let higher: usize = st.lanes[..lane].iter().map(|l| l.queue.len()).sum();
        let higher_share: f64 = st.lanes[..lane].iter().map(|l| l.grant_share).sum();
        let in_lane = st.lanes[lane].queue.turns_ahead(&key.network);
        // At least a twentieth of the slots: the lane's share, if any,
        // and the deadline bound it anyway.
        let own_share = (1.0 - higher_share).max(0.05);
        let turns = higher as f64 + (in_lane + 1) as f64 / own_share;
        let hold = st.hold_secs.unwrap_or(1.0);
        Duration::from_secs_f64(hold * turns / limit as f64)
    }

    /// What the adaptive limit has learned (`None` for a fixed limit), to
    /// hand to the next process in an upgrade.
    pub fn limit_state(&self) -> Option<LimitState> {
        match &self.shared.lock().limiter {
            Limiter::Adaptive(g) => Some(g.state()),
            Limiter::Fixed(_) => None,
        }
    }

    /// Continues an adaptive limit from the previous process's `state`
    /// (nothing for a fixed limit); waiters get any slots it adds.
    pub fn resume_limit(&self, state: &LimitState) {
        {
            let mut st = self.shared.lock();
            if let Limiter::Adaptive(g) = &mut st.limiter {
                g.resume(state);
            }
        }
        self.shared.grant_and_release(None, 0);
    }

    /// Continues what `previous`, this pool's queue before a reload that
    /// changed its settings, learned about the app: its adaptive limit and
    /// what each request shape costs. (Its waiters and requests in flight
    /// stay with it and finish there.) A reload changes what its
    /// configuration changed, not what weir had learned of the app: a
    /// fresh queue would start the limit open again in front of an app weir
    /// had cut, and forget every expensive shape.
    pub fn continue_from(&self, previous: &AdmissionQueue) {
        self.shared.shapes.continue_from(&previous.shared.shapes);
        if let Some(state) = previous.limit_state() {
            self.resume_limit(&state);
        }
    }

    /// Caps the traffic limit at what the servers can take now (the sum of
    /// their slow-start caps), or lifts the cap with `None`. Raising it
    /// grants waiting requests at once.
    pub fn set_capacity(&self, capacity: Option<usize>) {
        {
            let mut st = self.shared.lock();
            if st.capacity == capacity {
                return;
            }
            st.capacity = capacity;
        }
        self.shared.grant_and_release(None, 0);
    }

    /// A slot for a health check, outside the traffic limit; `None` when
    /// the reserve is in use (a check is still running) or is zero. The
    /// reserve keeps a known worker count's last worker for checks; with
    /// `workers` unknown (a pool nobody configured) there is no last worker
    /// to keep, and checks run as they would without a queue: several
    /// servers, or a warm-up probe beside the periodic check, at once.
    pub fn try_acquire_health(&self) -> Option<HealthPermit> {
        let mut st = self.shared.lock();
        let bounded = self.shared.config.workers.is_some();
        if bounded && st.health_in_flight >= self.shared.config.health_reserve {
            return None;
        }
        st.health_in_flight += 1;
        Some(HealthPermit {
            shared: self.shared.clone(),
        })
    }

    /// Whether two handles are the same queue.
    pub fn same_queue(&self, other: &AdmissionQueue) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Counters and gauges for metrics and the admin API.
    pub fn snapshot(&self) -> QueueSnapshot {
        let st = self.shared.lock();
        let limit = self.shared.cap(&st, st.limiter.learned());
        QueueSnapshot {
            limit,
            open_bound: st.limiter.open_bound().filter(|&b| b < limit),
            in_flight: st.in_flight + st.lent,
            health_in_flight: st.health_in_flight,
            lanes: st
                .lanes
                .iter()
                .zip(self.shared.config.lanes.iter())
                .map(|(ls, (lane, spec))| LaneSnapshot {
                    lane,
                    name: spec.name.clone(),
                    queued: ls.queue.len(),
                    networks_queued: ls.queue.networks(),
                    admitted_total: ls.counters.admitted,
                    waited_total: ls.counters.waited,
                    shed_total: ShedReason::ALL.map(|r| (r, ls.counters.shed[r.slot()])),
                    abandoned_total: ls.counters.abandoned,
                })
                .collect(),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves counts that are
        // still usable; refusing all traffic forever would be worse.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the worker kept for health checks may be lent now: the app's
    /// worker count is known, the traffic limit stands at its ceiling (a
    /// limit below it says the app has no worker to spare, or an operator
    /// asked for fewer), every traffic slot is taken, no check is running
    /// and nothing is lent already.
    fn may_lend(&self, st: &State, limit: usize) -> bool {
        self.config.workers.is_some()
            && limit >= self.ceiling
            && st.in_flight >= limit
            && st.health_in_flight == 0
            && st.lent < self.config.health_reserve
    }

    /// Takes a slot at once when one is free and nobody waits, or lends the
    /// worker kept for health checks to a fast request that passes nobody;
    /// `None` when the request must queue.
    #[inline]
    fn grant_at_once(
        &self,
        st: &mut State,
        lane: Lane,
        key: &FairKey,
        shape: Option<Shape>,
    ) -> Option<Granted> {
        let limit = self.limit(st);
        let free = st.queued == 0 && st.in_flight < limit;
        let lent = !free
            && self.may_lend(st, limit)
            && st.passes_nobody(lane, key)
            && shape.is_some_and(|s| self.shapes.is_fast(s));
        if !(free || lent) {
            return None;
        }
        if lent {
            st.lent += 1;
        } else {
            st.in_flight += 1;
        }
        st.count_grant(lane.index());
        let in_flight = st.in_flight + st.lent;
        Some(Granted {
            lane,
            waited: Duration::ZERO,
            in_flight,
            at_limit: in_flight >= limit,
            lent,
        })
    }

    /// The traffic limit in force.
    fn limit(&self, st: &State) -> usize {
        self.cap(st, st.limiter.limit())
    }

    /// `limit` capped by the app's workers and the servers' slow start.
    fn cap(&self, st: &State, limit: usize) -> usize {
        limit
            .min(self.ceiling)
            .min(st.capacity.unwrap_or(usize::MAX))
            .max(1)
    }

    fn retry_after(&self, st: &State) -> Duration {
        let cfg = &self.config;
        let hold = st.hold_secs.unwrap_or(1.0);
        // Time for the queue ahead to drain through `limit` slots.
        let secs = (hold * (st.queued as f64 + 1.0) / self.limit(st) as f64).ceil();
        Duration::from_secs_f64(secs.min(cfg.retry_after_max.as_secs_f64()))
            .clamp(cfg.retry_after_min, cfg.retry_after_max)
    }

    fn count_shed(&self, st: &mut State, lane: Lane, reason: ShedReason, waited: Duration) -> Shed {
        st.lanes[lane.index()].counters.shed[reason.slot()] += 1;
        Shed {
            reason,
            lane,
            retry_after: self.retry_after(st),
            waited,
        }
    }

    /// Makes room for one more waiter in `lane`, shedding at most one other
    /// waiter (see the module docs for the order).
    fn make_room(
        &self,
        st: &mut State,
        lane: Lane,
        key: &FairKey,
        evicted: &mut Vec<Evicted>,
    ) -> Result<(), ShedReason> {
        let spec = self.config.lanes.spec(lane);
        let own = lane.index();
        let pool_full = st.queued >= self.config.max_queued;
        let lower = if pool_full {
            (own + 1..st.lanes.len())
                .rev()
                .find(|&i| !st.lanes[i].queue.is_empty())
        } else {
            None
        };
        let lane_len = st.lanes[own].queue.len();
        let lane_full = lane_len >= spec.max_depth;
        let need_own = lane_full || (pool_full && lower.is_none());
        if !need_own && !pool_full {
            return Ok(());
        }
        let (victim_lane, reason) = if need_own {
            let q = &st.lanes[own].queue;
            let arrival_is_lighter = lane_len > 0 && q.network_len(&key.network) < q.fattest_len();
            if !arrival_is_lighter {
                return Err(ShedReason::QueueFull);
            }
            (own, ShedReason::QueueFull)
        } else {
            match lower {
                Some(i) => (i, ShedReason::LowerLaneShed),
                None => return Err(ShedReason::QueueFull),
            }
        };
        let Some((_, waiter)) = st.lanes[victim_lane].queue.shed_newest_of_fattest() else {
            return Err(ShedReason::QueueFull);
        };
        st.queued -= 1;
        let victim = Lane::from_index(victim_lane);
        let waited = Instant::now().saturating_duration_since(waiter.enqueued);
        let shed = self.count_shed(st, victim, reason, waited);
        evicted.push(Evicted { waiter, shed });
        Ok(())
    }

    /// The lane the next free slot goes to, and whether a share is what
    /// chose it: a lower lane owed a whole grant (deficit round robin
    /// between priority and the shares), else the highest lane with
    /// waiters. Work-conserving either way: `None` only when nobody waits.
    fn next_lane(&self, st: &mut State) -> Option<(usize, bool)> {
        let highest = st.lanes.iter().position(|l| !l.queue.is_empty())?;
        let owed = st
            .lanes
            .iter()
            .enumerate()
            .skip(highest + 1)
            .find(|(_, l)| !l.queue.is_empty() && l.deficit >= 1.0 - 1e-9)
            .map(|(i, _)| i);
        match owed {
            Some(i) => {
                st.lanes[i].deficit = 0.0;
                Some((i, true))
            }
            None => Some((highest, false)),
        }
    }

    /// After a slot went by priority to lane `granted`: every lower lane
    /// with waiters and a share is owed that much more of a grant (a share
    /// `s` is one grant after every `(1 − s) / s` others, so `s` of all).
    /// A lane whose share yields to proof counts only grants that did not
    /// (the request proved who it is, or its network holds no backlog in
    /// its lane; looked up only when such a lane has waiters).
    fn accrue_shares(&self, st: &mut State, granted: usize, waiter: &Waiter) {
        let mut yields = None;
        for (i, (_, spec)) in self.config.lanes.iter().enumerate().skip(granted + 1) {
            if spec.share.is_zero() || st.lanes[i].queue.is_empty() {
                continue;
            }
            if spec.yields_to_proof {
                // A guess (no proof) that keeps a backlog of its own: a
                // network using more than a turn, whom a share may pass.
                let own = &st.lanes[granted].queue;
                let yielded = *yields.get_or_insert_with(|| {
                    waiter.proven || own.network_len(&waiter.network) < BACKLOG
                });
                if yielded {
                    continue;
                }
            }
            let s = spec.share.fraction();
            let per_grant = if s >= 1.0 { 1.0 } else { s / (1.0 - s) };
            // Capped at one grant: a lane banks no credit for a burst later.
            let lane = &mut st.lanes[i];
            lane.deficit = (lane.deficit + per_grant).min(1.0);
        }
    }

    /// Pops waiters into free slots, highest lane first (but for a lane
    /// owed its share, [`Shared::next_lane`]).
    fn take_grants(&self, st: &mut State, now: Instant) -> Vec<Grant> {
        let mut grants = Vec::new();
        let in_flight = st.in_flight;
        st.limiter.grow_open(now, in_flight);
        let limit = self.limit(st);
        while st.in_flight < limit && st.queued > 0 {
            let Some((i, by_share)) = self.next_lane(st) else {
                break;
            };
            let Some((_, waiter)) = st.lanes[i].queue.pop() else {
                break;
            };
            if !by_share {
                self.accrue_shares(st, i, &waiter);
            }
            st.queued -= 1;
            st.in_flight += 1;
            let waited = now.saturating_duration_since(waiter.enqueued);
            st.count_grant(i);
            st.lanes[i].counters.waited += waited;
            grants.push(Grant {
                tx: waiter.tx,
                granted: Granted {
                    lane: Lane::from_index(i),
                    waited,
                    in_flight: st.in_flight,
                    at_limit: true,
                    lent: false,
                },
            });
        }
        grants
    }

    /// Looks again in a while when requests wait only because the adaptive
    /// limit's open bound holds them (see `adaptive::OpenBound`): requests
    /// that do not answer (long polls) grow it by time, and nothing else
    /// would come to grant their waiters.
    fn wake_for_open_bound(self: &Arc<Self>, st: &mut State, now: Instant) {
        if st.open_wake_armed || st.queued == 0 {
            return;
        }
        let in_flight = st.in_flight;
        if !st.limiter.grow_open(now, in_flight) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        st.open_wake_armed = true;
        let shared = self.clone();
        runtime.spawn(async move {
            tokio::time::sleep(OPEN_BOUND_LOOK).await;
            shared.lock().open_wake_armed = false;
            shared.grant_and_release(None, 0);
        });
    }

    fn release(self: &Arc<Self>, done: Released) {
        if done.lent {
            // Outside the traffic limit: no waiter's slot comes free.
            let mut st = self.lock();
            st.lent = st.lent.saturating_sub(1);
            self.record(&mut st, done, Instant::now());
            return;
        }
        self.grant_and_release(Some(done), 1);
    }

    /// Frees `freed` slots, records `done`, and hands free slots to waiters.
    fn grant_and_release(self: &Arc<Self>, done: Option<Released>, freed: usize) {
        let now = Instant::now();
        let mut freed = freed;
        let mut sample = done;
        loop {
            let grants = {
                let mut st = self.lock();
                st.in_flight = st.in_flight.saturating_sub(freed);
                freed = 0;
                if let Some(done) = sample.take() {
                    self.record(&mut st, done, now);
                }
                let grants = self.take_grants(&mut st, now);
                self.wake_for_open_bound(&mut st, now);
                grants
            };
            for g in grants {
                let permit = Permit::new(self.clone(), g.granted, now);
                if let Err(Ok(mut unsent)) = g.tx.send(Ok(permit)) {
                    // The waiter left between being popped and told: take the
                    // slot back here rather than recursing through Drop.
                    unsent.shared = None;
                    freed += 1;
                }
            }
            if freed == 0 {
                return;
            }
        }
    }

    fn record(&self, st: &mut State, done: Released, now: Instant) {
        let held = now.saturating_duration_since(done.granted_at).as_secs_f64();
        st.hold_secs = Some(match st.hold_secs {
            None => held,
            Some(avg) => avg + 0.1 * (held - avg),
        });
        if let Limiter::Adaptive(g) = &mut st.limiter {
            if done.rescaled {
                g.learn_baseline_again(now.into_std());
            }
            // Read where the answer is recorded: the thread that served it.
            let own_lag = super::lag::this_thread();
            let sample = match done.outcome {
                Outcome::Answered(latency) => Sample {
                    latency,
                    started: done.granted_at.into_std(),
                    in_flight: done.in_flight,
                    dropped: false,
                    own_lag,
                },
                Outcome::Overloaded => Sample {
                    latency: Duration::from_secs_f64(held),
                    started: done.granted_at.into_std(),
                    in_flight: done.in_flight,
                    dropped: true,
                    own_lag,
                },
                Outcome::Abandoned => return,
            };
            g.on_sample(now.into_std(), sample);
        }
    }
}

/// Removes a waiter whose future is dropped (client gone) from the queue.
struct Waiting<'a> {
    shared: &'a Arc<Shared>,
    lane: Lane,
    ticket: Option<Ticket>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let removed = {
            let mut st = self.shared.lock();
            let removed = st.lanes[self.lane.index()].queue.remove(ticket);
            if removed.is_some() {
                st.queued -= 1;
                st.lanes[self.lane.index()].counters.abandoned += 1;
            }
            removed
        };
        // Dropped outside the lock: nothing in a Waiter takes it, but keep
        // the rule simple.
        drop(removed);
    }
}

struct Released {
    granted_at: Instant,
    in_flight: usize,
    outcome: Outcome,
    lent: bool,
    /// The latencies fed to the limit changed scale with this answer.
    rescaled: bool,
}

/// An admission slot. Dropping it frees the slot and wakes the next waiter;
/// [`Permit::complete`] also reports how the request went.
#[must_use = "dropping a permit frees its slot at once"]
pub struct Permit {
    shared: Option<Arc<Shared>>,
    granted: Granted,
    granted_at: Instant,
    outcome: Outcome,
    shape: Option<Shape>,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("lane", &self.granted.lane)
            .field("waited", &self.granted.waited)
            .finish()
    }
}

impl Permit {
    fn new(shared: Arc<Shared>, granted: Granted, now: Instant) -> Permit {
        Permit {
            shared: Some(shared),
            granted,
            granted_at: now,
            outcome: Outcome::Abandoned,
            shape: None,
        }
    }

    /// Has the answer's latency teach the queue what `shape` costs.
    pub fn learn(&mut self, shape: Shape) {
        self.shape = Some(shape);
    }

    pub fn lane(&self) -> Lane {
        self.granted.lane
    }

    /// Time spent in the queue before the slot was granted (zero if none).
    pub fn waited(&self) -> Duration {
        self.granted.waited
    }

    /// Frees the slot, telling the adaptive limit how the request went.
    pub fn complete(mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            // The limit sees the latency as if of a typical shape, so a
            // flood of slow pages is not mistaken for queueing.
            let mut rescaled = false;
            let outcome = match (self.shape, self.outcome) {
                (Some(shape), Outcome::Answered(latency)) => {
                    let at_limit = self.granted.at_limit;
                    let recorded = shared.shapes.record_answer(shape, latency, at_limit);
                    rescaled = recorded.rescaled;
                    Outcome::Answered(recorded.latency)
                }
                (_, outcome) => outcome,
            };
            shared.release(Released {
                granted_at: self.granted_at,
                in_flight: self.granted.in_flight,
                outcome,
                lent: self.granted.lent,
                rescaled,
            });
        }
    }
}

/// A health-check slot from the reserve; dropping it returns the slot.
#[must_use = "dropping a health permit frees its slot at once"]
pub struct HealthPermit {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for HealthPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HealthPermit")
    }
}

impl Drop for HealthPermit {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.health_in_flight = st.health_in_flight.saturating_sub(1);
    }
}

/// A point-in-time view of a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSnapshot {
    /// The learned (or fixed) traffic limit (export as
    /// `weir_admission_limit`).
    pub limit: usize,
    /// While an adaptive limit is open (never cut), how far in flight may
    /// go below it (export as `weir_admission_open_bound`).
    pub open_bound: Option<usize>,
    pub in_flight: usize,
    pub health_in_flight: usize,
    pub lanes: Vec<LaneSnapshot>,
}

impl QueueSnapshot {
    pub fn queued(&self) -> usize {
        self.lanes.iter().map(|l| l.queued).sum()
    }

    /// Requests waiting in lanes that outrank `lane`: what a request of
    /// `lane` waits behind whoever it is.
    pub fn queued_above(&self, lane: Lane) -> usize {
        (self.lanes.iter())
            .filter(|l| l.lane.outranks(lane))
            .map(|l| l.queued)
            .sum()
    }
}

/// One lane's gauges and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSnapshot {
    pub lane: Lane,
    pub name: String,
    pub queued: usize,
    /// Distinct networks (/16, /48) with someone waiting.
    pub networks_queued: usize,
    pub admitted_total: u64,
    /// Time the admitted requests waited, summed: the mean wait over an
    /// interval is its growth over `admitted_total`'s.
    pub waited_total: Duration,
    pub shed_total: [(ShedReason, u64); 3],
    /// Waiters that left before an answer (client hung up).
    pub abandoned_total: u64,
}

#[cfg(test)]
mod tests;
