//! The admin API: `/metrics`, `/livez`, `/readyz`, `/status`, `POST /reload`,
//! and the live page `/ui` (`ui`); who may `POST` is `guard`'s (no other
//! web page, and `[admin] token` when set).
//!
//! It listens on loopback by default, apart from client traffic, so health
//! checks and scrapes never queue behind it. `/livez` says only that weir's
//! own loop answers (never restart weir because an upstream is slow);
//! `/readyz` says whether this instance should receive traffic (not while
//! draining, nor while a new generation's warm-up waits for its pools or
//! Redis to answer: `lifecycle::warmup`) and lists each pool's signal (`ready`, `busy`: saturated or
//! slow, do not restart; `down`: no server answers). Per pool,
//! `/livez/pools/NAME` (503 only when down: for autoheal / a liveness probe
//! of the app) and `/readyz/pools/NAME` (503 when busy or down: for a
//! readiness probe of the app) answer with the pool's status code.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::runtime::{ReloadOutcome, Runtime};

pub mod guard;
pub mod ui;

/// Every admin answer's body: whole documents, or the live page's event
/// stream.
pub type AdminBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// Serves the admin API until `stop` is cancelled.
pub async fn serve(listener: TcpListener, rt: Arc<Runtime>, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => continue,
            },
        };
        let rt = rt.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let rt = rt.clone();
                let stop = stop.clone();
                async move { Ok::<_, Infallible>(route(req, &rt, stop).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(5))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn route(
    req: Request<Incoming>,
    rt: &Arc<Runtime>,
    stop: CancellationToken,
) -> Response<AdminBody> {
    if let Some(refused) = guard_refusal(&req, rt) {
        return refused;
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => metrics(&req, rt),
        (&Method::GET, "/livez") => text(StatusCode::OK, "text/plain", "ok\n".into()),
        (&Method::GET, "/readyz") => readyz(rt),
        (&Method::GET, path) if pool_probe(path).is_some() => pool_probe_answer(path, rt),
        (&Method::GET, "/ui/events") => ui::events(rt, stop),
        (&Method::GET, "/ui/history") => ui::history(rt),
        (&Method::GET, path) if path.starts_with("/ui") => {
            ui::asset(path).unwrap_or_else(not_found)
        }
        (&Method::GET, "/status") => {
            text(StatusCode::OK, "application/json", status(rt).to_string())
        }
        (&Method::POST, "/reload") => reload(rt).await,
        _ => not_found(),
    }
}

/// The answer to a request `admin_guard` refuses (401 with a
/// `WWW-Authenticate` challenge when a token is missing), or `None` when the
/// request may go on.
fn guard_refusal(req: &Request<Incoming>, rt: &Runtime) -> Option<Response<AdminBody>> {
    let Err(refusal) = rt
        .gateway
        .load()
        .admin_guard
        .check(req.method(), req.headers())
    else {
        return None;
    };
    let mut resp = json_response(
        refusal.status(),
        json!({"result": "refused", "reason": refusal.as_str()}),
    );
    if refusal.status() == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"weir admin\""),
        );
    }
    Some(resp)
}

/// `GET /metrics`: refreshes the gauges that are sampled rather than
/// counted (shared-limiter stats, evictions, pool health), then encodes
/// every metric in the format the `Accept` header asks for.
fn metrics(req: &Request<Incoming>, rt: &Runtime) -> Response<AdminBody> {
    rt.export_shared_stats();
    crate::state::export_evictions(rt);
    crate::upstream::checks::export_gauges(
        &rt.gateway.load().pools,
        &rt.metrics,
        std::time::Instant::now(),
    );
    let format = crate::observe::metrics::Exposition::negotiate(
        req.headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    text(
        StatusCode::OK,
        format.content_type(),
        rt.metrics.encode_as(format),
    )
}

/// `GET /readyz`: 503 while draining, while expected limiter state is
/// missing, or while the warm-up waits; 200 otherwise. Either way the body
/// ends with each pool's signal.
fn readyz(rt: &Runtime) -> Response<AdminBody> {
    let pools = pool_lines(rt);
    let warm_up = rt.readiness.phase();
    if rt.tracker.is_draining() {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("draining\n{pools}"),
        )
    } else if rt.state_missing.load(std::sync::atomic::Ordering::Relaxed) {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!(
                "limiter state expected but not restored (state.expect_restored = \"not_ready\")\n{pools}"
            ),
        )
    } else if let Some(reason) = warm_up.not_ready_reason(std::time::Instant::now()) {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("{reason}\n{pools}"),
        )
    } else {
        let note = warm_up.ready_note().map(|n| n + "\n").unwrap_or_default();
        text(
            StatusCode::OK,
            "text/plain",
            format!("ready\n{note}{pools}"),
        )
    }
}

/// `GET /livez/pools/NAME` and `GET /readyz/pools/NAME`: the pool's signal,
/// with the status code of the liveness or readiness view of it (404 for an
/// unknown pool).
fn pool_probe_answer(path: &str, rt: &Runtime) -> Response<AdminBody> {
    let Some((live, name)) = pool_probe(path) else {
        return text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
    };
    let gw = rt.gateway.load();
    match gw.pools.iter().find(|p| &*p.name == name) {
        None => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("no pool named `{name}`\n"),
        ),
        Some(pool) => {
            let signal = pool.signal(std::time::Instant::now());
            let status = if live {
                signal.livez_status()
            } else {
                signal.readyz_status()
            };
            text(status, "text/plain", format!("{}\n", signal.as_str()))
        }
    }
}

/// `POST /reload`: rebuilds the gateway from its configuration and answers
/// with the outcome (applied, unchanged, or the configuration's errors).
async fn reload(rt: &Arc<Runtime>) -> Response<AdminBody> {
    let rt = rt.clone();
    // Building a gateway reads files and resolves names: off the loop.
    let outcome = tokio::task::spawn_blocking(move || rt.reload(true)).await;
    match outcome {
        Ok(Ok(ReloadOutcome::Applied {
            version,
            restart_needed,
        })) => json_response(
            StatusCode::OK,
            json!({"result": "ok", "version": version, "restart_needed": restart_needed}),
        ),
        Ok(Ok(ReloadOutcome::Unchanged)) => {
            json_response(StatusCode::OK, json!({"result": "unchanged"}))
        }
        Ok(Err(errors)) => json_response(
            StatusCode::BAD_REQUEST,
            json!({
                "result": "invalid",
                "errors": errors.0.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            }),
        ),
        Err(_) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"result": "error"}),
        ),
    }
}

fn not_found() -> Response<AdminBody> {
    text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into())
}

/// `/livez/pools/NAME` → (true, NAME); `/readyz/pools/NAME` → (false, NAME).
fn pool_probe(path: &str) -> Option<(bool, &str)> {
    if let Some(name) = path.strip_prefix("/livez/pools/") {
        return Some((true, name));
    }
    path.strip_prefix("/readyz/pools/").map(|n| (false, n))
}

/// One `pool NAME SIGNAL` line per pool, for `/readyz`.
fn pool_lines(rt: &Runtime) -> String {
    let now = std::time::Instant::now();
    rt.gateway
        .load()
        .pools
        .iter()
        .map(|p| format!("pool {} {}\n", p.name, p.signal(now).as_str()))
        .collect()
}

/// Each pool's signal, admission lanes and servers (in `/status` and the
/// live page).
pub fn pools(gw: &crate::gateway::Gateway) -> Vec<serde_json::Value> {
    gw
        .pools
        .iter()
        .map(|p| {
            let now = std::time::Instant::now();
            let admission = p.admission.as_ref().map(|q| {
                let snap = q.snapshot();
                json!({
                    "limit": snap.limit,
                    "in_flight": snap.in_flight,
                    "health_in_flight": snap.health_in_flight,
                    "lanes": snap.lanes.iter().map(|l| json!({
                        "lane": l.name,
                        "queued": l.queued,
                        "networks_queued": l.networks_queued,
                        "admitted_total": l.admitted_total,
                        "waited_seconds_total": l.waited_total.as_secs_f64(),
                        "shed_total": l.shed_total.iter().map(|(r, n)| (r.as_str(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
                    })).collect::<Vec<_>>(),
                })
            });
            json!({
                "name": &*p.name,
                "in_flight": p.in_flight(),
                "mode": p.mode().as_str(),
                "signal": p.signal(now).as_str(),
                "admission": admission,
                "servers": p.servers.iter().map(|s| {
                    let v = s.view(now);
                    json!({
                        "address": s.addr.to_string(),
                        "in_flight": s.in_flight(),
                        "health": v.state.as_str(),
                        "dead_cause": v.dead_cause.map(|c| format!("{c:?}").to_lowercase()),
                        "latency_ms": v.latency.map(|l| l.as_secs_f64() * 1e3),
                        "slow_start_cap": v.slow_start_cap,
                    })
                }).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// The `/status` document.
pub fn status(rt: &Runtime) -> serde_json::Value {
    let gw = rt.gateway.load();
    let pools = pools(&gw);
    let listeners: Vec<_> = gw
        .listeners
        .iter()
        .map(|l| {
            json!({
                "address": l.address.to_string(),
                "tls": l.tls.is_some(),
                "proxy_protocol": l.proxy_protocol,
                "http2": l.http2,
            })
        })
        .collect();
    json!({
        "config_version": gw.version,
        "config_file": gw.loaded.path.as_ref().map(|p| p.display().to_string()),
        "uptime_seconds": rt.started.elapsed().as_secs(),
        "draining": rt.tracker.is_draining(),
        "listeners": listeners,
        "connections": {
            "open": rt.tracker.open(),
            "max": rt.tracker.limits().max_connections,
            "max_per_ip": rt.tracker.limits().max_per_ip,
        },
        "pools": pools,
        "warm_up": rt.readiness.phase().status(),
        "state": state_status(rt, &gw),
    })
}

/// Where this instance's limiter state came from and whether it is shared:
/// a new generation says here that it enforces the previous one's limits
/// (restored keys, or Redis in use).
fn state_status(rt: &Runtime, gw: &crate::gateway::Gateway) -> serde_json::Value {
    let cfg = &gw.loaded.config.state;
    let shared = rt.shared_limiter().map(|s| {
        let stats = s.stats();
        json!({
            "backend": "redis",
            "prefix": s.redis().prefix(),
            "in_use": !stats.fallback_active,
            "round_trips_ok": stats.redis_ok,
            "round_trips_failed": stats.redis_errors,
        })
    });
    json!({
        "restored": rt.readiness.restored(),
        "restored_keys": rt.metrics.state_restored_keys.get(),
        "snapshot_file": cfg.snapshot_file,
        "shared": shared,
    })
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<AdminBody> {
    let mut r = Response::new(http_body_util::BodyExt::boxed(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

fn json_response(status: StatusCode, v: serde_json::Value) -> Response<AdminBody> {
    text(status, "application/json", v.to_string())
}

/// Binds the admin listener.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    crate::edge::listener::bind(addr, false)
}
