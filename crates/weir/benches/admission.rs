//! Admission benchmarks: the fair queue against a plain FIFO baseline, and the
//! whole `AdmissionQueue` handing slots through 10,000 waiting requests.
//!
//! Run: `cargo bench --bench admission`. The hand-off case runs on one
//! current-thread tokio runtime, so it measures the queue and task wake-ups,
//! not parallelism; numbers are recorded in `docs/admission.md`.

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use weir::admission::{AdmissionQueue, FairKey, FairQueue, Lane, LaneSpec, Lanes, QueueConfig};
use weir::identity::ClientAddr;

const WAITING: usize = 10_000;

/// 10,000 clients: 300 networks, the first one holding a third of them
/// (a crawler /16), the rest a few addresses each.
fn keys() -> Vec<FairKey> {
    (0..WAITING)
        .map(|i| {
            let (a, b, c, d) = if i < WAITING / 3 {
                (10, 1, (i / 250) as u8, (i % 250) as u8)
            } else {
                let j = i - WAITING / 3;
                (
                    11 + (j % 200) as u8,
                    (j / 200 % 250) as u8,
                    0,
                    (j / 50000 + 1) as u8,
                )
            };
            FairKey::of(ClientAddr::new(IpAddr::V4(Ipv4Addr::new(a, b, c, d))))
        })
        .collect()
}

fn fair_queue(c: &mut Criterion) {
    let keys = keys();
    let mut g = c.benchmark_group("backlog_10k");
    g.throughput(Throughput::Elements(1));
    g.bench_function("fair_queue_pop_push", |b| {
        let mut q = FairQueue::new();
        for (i, k) in keys.iter().enumerate() {
            q.push(*k, i);
        }
        b.iter(|| {
            let (_, i) = q.pop().expect("backlogged");
            q.push(keys[i], i);
        });
    });
    g.bench_function("baseline_vecdeque_fifo", |b| {
        let mut q: VecDeque<(FairKey, usize)> = keys.iter().copied().zip(0..).collect();
        b.iter(|| {
            let item = q.pop_front().expect("backlogged");
            q.push_back(std::hint::black_box(item));
        });
    });
    g.bench_function("fair_queue_push_remove", |b| {
        let mut q = FairQueue::new();
        for (i, k) in keys.iter().enumerate() {
            q.push(*k, i);
        }
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 7919) % WAITING;
            let t = q.push(keys[i], i);
            q.remove(t)
        });
    });
    g.finish();
}

fn deep_config(limit: usize) -> QueueConfig {
    let mut cfg = QueueConfig::fixed(NonZeroUsize::new(limit).expect("nonzero"));
    let spec = |name: &str| LaneSpec {
        name: name.into(),
        max_depth: 2 * WAITING,
        max_wait: Duration::from_secs(3600),
        share: weir::admission::Share::ZERO,
        yields_to_proof: false,
    };
    cfg.lanes = Lanes::new(vec![spec("verified"), spec("pass"), spec("anonymous")]).expect("lanes");
    cfg.max_queued = 4 * WAITING;
    cfg
}

fn admission_queue(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let keys = keys();
    let mut g = c.benchmark_group("admission_queue");
    g.throughput(Throughput::Elements(1));
    g.bench_function("acquire_release_uncontended", |b| {
        let q = AdmissionQueue::new(deep_config(8)).expect("queue");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
        b.iter(|| {
            rt.block_on(q.acquire(Lane::PASS, keys[0], deadline))
                .map(drop)
        })
    });
    // Every slot hand-off goes through a queue 10,000 deep: each of 10,000
    // tasks acquires, drops its permit at once, and queues again.
    g.bench_function("handoff_with_10k_waiting", |b| {
        b.iter_custom(|iters| {
            let rounds = (iters as usize).div_ceil(WAITING).max(1);
            let q = AdmissionQueue::new(deep_config(8)).expect("queue");
            let start = Instant::now();
            rt.block_on(async {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
                let tasks: Vec<_> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| {
                        let (q, k) = (q.clone(), *k);
                        let lane = [Lane::VERIFIED, Lane::PASS, Lane::ANONYMOUS][i % 3];
                        tokio::spawn(async move {
                            for _ in 0..rounds {
                                if let Ok(p) = q.acquire(lane, k, deadline).await {
                                    drop(p);
                                }
                                tokio::task::yield_now().await;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    let _ = t.await;
                }
            });
            let per_op = start.elapsed() / (rounds * WAITING) as u32;
            per_op * iters as u32
        })
    });
    g.finish();
}

criterion_group!(benches, fair_queue, admission_queue);
criterion_main!(benches);
