//! The process's worker threads beyond the one it starts on: with
//! `process.workers = N`, N - 1 more threads, each running a single-threaded
//! tokio scheduler of its own and accepting on every client listener, as
//! nginx's worker processes do. A connection is served start to end by the
//! thread that accepted it.
//!
//! Why not tokio's multi-threaded scheduler: it runs the task woken last
//! first (its LIFO slot) and moves tasks between threads. With two threads
//! and 50 busy connections that gave a p99 nine times nginx's (2 workers)
//! and 0.73x its requests/s (bench/README.md, "Two workers"); one thread had
//! already been moved to the single-threaded scheduler for the same reason.
//!
//! Each thread names its scheduler to weir-http
//! (`scheduler::run_as_scheduler`), so the upstream connections it opens
//! are reused by it alone: their readiness comes from its own I/O driver.
//!
//! Does not: balance connections between threads (`edge::balance` does),
//! or run anything but accept loops and the connections they take: the
//! admin API, health checks, sweeps and reloads stay on the first thread.

use std::io;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The extra worker threads; dropping this stops them (their tasks, the
/// connections they still serve, are dropped with their schedulers).
#[derive(Debug, Default)]
pub struct Workers {
    workers: Vec<Worker>,
}

#[derive(Debug)]
struct Worker {
    handle: Handle,
    /// Dropped: the thread's scheduler stops.
    _stop: oneshot::Sender<()>,
}

impl Workers {
    /// Starts `extra` threads, each with its own scheduler (I/O and timers
    /// enabled), named `weir-worker` like the first.
    pub fn start(extra: usize) -> io::Result<Workers> {
        let mut workers = Vec::with_capacity(extra);
        for index in 1..=extra {
            let scheduler = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = scheduler.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name("weir-worker".into())
                .spawn(move || {
                    weir_http::scheduler::run_as_scheduler(index);
                    scheduler.block_on(async {
                        // Err: the sender was dropped, which is the signal.
                        // Meanwhile the thread's lag is measured for the
                        // adaptive limit.
                        tokio::select! {
                            _ = stopped => {}
                            () = crate::admission::lag::probe() => {}
                        }
                    });
                })?;
            workers.push(Worker {
                handle,
                _stop: stop,
            });
        }
        Ok(Workers { workers })
    }

    /// How many extra threads there are.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether there are none (one thread serves everything).
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Runs `accept(listener)` on every extra thread, each on its own copy
    /// of `listener` registered with that thread's scheduler. The handles
    /// can be awaited from any thread.
    pub fn accept_on<F>(
        &self,
        listener: &std::net::TcpListener,
        mut accept: impl FnMut(tokio::net::TcpListener) -> F,
    ) -> io::Result<Vec<JoinHandle<()>>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut loops = Vec::with_capacity(self.workers.len());
        for worker in &self.workers {
            let copy = listener.try_clone()?;
            // Registered with the worker's I/O driver, not the caller's.
            let copy = {
                let _entered = worker.handle.enter();
                tokio::net::TcpListener::from_std(copy)?
            };
            loops.push(worker.handle.spawn(accept(copy)));
        }
        Ok(loops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Each extra thread accepts on its copy of the listener and serves
    /// what it accepted on its own thread; dropping the workers stops them.
    #[test]
    fn every_worker_accepts_on_the_listener_and_stops_when_dropped() {
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let workers = Workers::start(2).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let loops = workers
            .accept_on(&listener, |l| async move {
                while let Ok((mut s, _)) = l.accept().await {
                    let name = std::thread::current().name().unwrap_or("").to_owned();
                    let _ = s.write_all(name.as_bytes()).await;
                }
            })
            .unwrap();
        assert_eq!(loops.len(), 2);
        first.block_on(async {
            for _ in 0..8 {
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                let mut name = String::new();
                s.read_to_string(&mut name).await.unwrap();
                assert_eq!(name, "weir-worker");
            }
        });
        drop(workers);
        first.block_on(async {
            for l in loops {
                // Cancelled with its scheduler, not left running.
                let ended = tokio::time::timeout(std::time::Duration::from_secs(5), l).await;
                assert!(ended.is_ok_and(|r| r.is_err_and(|e| e.is_cancelled())));
            }
        });
    }
}
