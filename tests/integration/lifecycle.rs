//! Reload (valid and invalid) and drain under load.

use std::time::Duration;

use http::Request;

use crate::fixtures::*;

async fn post_reload(weir: &TestWeir) -> (u16, serde_json::Value) {
    let host = weir.admin.to_string();
    let (status, _, doc) = post_admin(weir, &[("host", &host)]).await;
    (status, doc)
}

/// `POST /reload` with these fields: (status, `WWW-Authenticate`, the JSON).
async fn post_admin(
    weir: &TestWeir,
    fields: &[(&str, &str)],
) -> (u16, Option<String>, serde_json::Value) {
    let mut c = H1::local(weir.admin).await;
    let mut req = Request::post("/reload");
    for (k, v) in fields {
        req = req.header(*k, *v);
    }
    let (status, headers, body) = c.send(req.body(full("")).unwrap()).await.unwrap();
    let challenge = headers
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    (
        status.as_u16(),
        challenge,
        serde_json::from_slice(&body).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_changes_need_no_page_and_the_token() {
    let up = Upstream::start().await;
    let base = "[process]\nwatch_config = false\n[access_log]\ntarget = \"off\"\n[admin]\naddress = \"127.0.0.1:0\"\n";
    let weir = TestWeir::start(&format!("{base}{}", config(&[up.addr], ""))).await;
    let own = weir.admin.to_string();
    // The request: a page on evil.example, its name rebound to
    // loopback, posting to the admin API. Refused, and nothing reloaded.
    let (status, _, doc) = post_admin(
        &weir,
        &[("host", "evil.example"), ("origin", "http://evil.example")],
    )
    .await;
    assert_eq!(
        (status, doc["reason"].as_str()),
        (403, Some("foreign_host"))
    );
    let origin = format!("http://{own}");
    let evil: [(&str, &str); 2] = [("host", &own), ("origin", "http://evil.example")];
    let (status, _, doc) = post_admin(&weir, &evil).await;
    assert_eq!(
        (status, doc["reason"].as_str()),
        (403, Some("cross_origin"))
    );
    assert_eq!(weir.server().runtime.gateway.load().version, 1);
    let (status, _, doc) = post_admin(&weir, &[("host", &own), ("origin", &origin)]).await;
    assert_eq!(status, 200, "{doc}");
    // Reads stay open to any name (scrapers).
    let (status, _, _) = get(weir.admin, "/livez", &[("host", "evil.example")]).await;
    assert_eq!(status, 200);

    // A token set by reload applies at once, without a restart.
    let token = "5f0c8a1e9d2b4c6a7e3f";
    let with_token = format!("{base}token = \"{token}\"\n{}", config(&[up.addr], ""));
    std::fs::write(&weir.config_path, &with_token).unwrap();
    let (status, _, doc) = post_admin(&weir, &[("host", &own)]).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["restart_needed"], serde_json::json!([]), "{doc}");
    let (status, challenge, doc) = post_admin(&weir, &[("host", &own)]).await;
    assert_eq!(
        (status, doc["reason"].as_str()),
        (401, Some("token_required"))
    );
    assert_eq!(challenge.as_deref(), Some("Bearer realm=\"weir admin\""));
    let wrong = [
        ("host", own.as_str()),
        ("authorization", "Bearer 5f0c8a1e9d2b4c6a7e3e"),
    ];
    let (status, _, doc) = post_admin(&weir, &wrong).await;
    assert_eq!((status, doc["reason"].as_str()), (401, Some("wrong_token")));
    let bearer = format!("Bearer {token}");
    let (status, _, doc) = post_admin(&weir, &[("host", &own), ("authorization", &bearer)]).await;
    assert_eq!((status, doc["result"].as_str()), (200, Some("ok")), "{doc}");

    // A short token is refused with its key; the running one stays.
    std::fs::write(
        &weir.config_path,
        format!("{base}token = \"\"\n{}", config(&[up.addr], "")),
    )
    .unwrap();
    let (status, _, doc) = post_admin(&weir, &[("host", &own), ("authorization", &bearer)]).await;
    assert_eq!(status, 400, "{doc}");
    assert!(
        doc["errors"][0].as_str().unwrap().contains("admin.token"),
        "{doc}"
    );
    let (status, _, _) = post_admin(&weir, &[("host", &own)]).await;
    assert_eq!(status, 401, "the old token still guards");
}

/// `base` (tables), then [`config`] with the pool of `up` alone.
fn pointed_at(base: &str, up: &Upstream) -> String {
    format!("{base}{}", config(&[up.addr], ""))
}

/// Two upstreams, and weir in front of the first with [`pointed_at`].
async fn two_upstreams_serving_the_first(base: &str) -> (Upstream, Upstream, TestWeir) {
    let a = Upstream::start().await;
    let b = Upstream::start().await;
    let weir = TestWeir::start(&pointed_at(base, &a)).await;
    (a, b, weir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_valid_config_and_refuses_invalid() {
    let base = "[process]\nwatch_config = false\n[admin]\naddress = \"127.0.0.1:0\"\n[access_log]\ntarget = \"off\"\n";
    let (a, b, weir) = two_upstreams_serving_the_first(base).await;
    let (status, _, _) = get(weir.addr, "/", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(a.hits.load(std::sync::atomic::Ordering::Relaxed), 1);

    // Valid: point the pool at b.
    std::fs::write(&weir.config_path, pointed_at(base, &b)).unwrap();
    let (code, doc) = post_reload(&weir).await;
    assert_eq!(code, 200, "{doc}");
    assert_eq!(doc["version"], 2);
    get(weir.addr, "/", &[]).await;
    assert_eq!(b.hits.load(std::sync::atomic::Ordering::Relaxed), 1);

    // Invalid: refused with key and line; the running config stays.
    let broken = format!(
        "{base}{}\n[[routes]]\npool = \"missing\"\n",
        config(&[a.addr], "")
    );
    std::fs::write(&weir.config_path, &broken).unwrap();
    let (code, doc) = post_reload(&weir).await;
    assert_eq!(code, 400, "{doc}");
    let err = doc["errors"][0].as_str().unwrap();
    assert!(
        err.contains("routes[0].pool") && err.contains("missing"),
        "{err}"
    );
    let line = broken
        .lines()
        .position(|l| l.contains("\"missing\""))
        .unwrap()
        + 1;
    assert!(err.contains(&format!("weir.toml:{line}:")), "{err}");
    get(weir.addr, "/", &[]).await;
    assert_eq!(
        b.hits.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "old config still serves"
    );
    let m = weir.metrics().await;
    assert_metric(&m, "weir_reloads_total{result=\"ok\"}", 1.0);
    assert_metric(&m, "weir_reloads_total{result=\"invalid\"}", 1.0);
    assert_metric(&m, "weir_config_version", 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_change_is_picked_up() {
    let base = "[process]\nwatch_interval = \"200ms\"\n[access_log]\ntarget = \"off\"\n";
    let (_a, b, weir) = two_upstreams_serving_the_first(base).await;
    std::fs::write(&weir.config_path, pointed_at(base, &b)).unwrap();
    assert_eventually_async!(
        weir.server().runtime.gateway.load().version >= 2,
        "file change not picked up"
    );
    get(weir.addr, "/", &[]).await;
    assert_eq!(b.hits.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_under_load_loses_no_request() {
    let (_up, mut weir) = weir_in_front("").await;
    let addr = weir.addr;
    let mut inflight = Vec::new();
    for i in 0..50u32 {
        inflight.push(tokio::spawn(async move {
            let src = format!("127.0.10.{}", i % 200 + 1).parse().unwrap();
            get_from(src, addr, &format!("/slow/{}", 300 + i * 10), &[])
                .await
                .0
        }));
    }
    let server = weir.server.take().unwrap();
    assert_eventually_async!(
        server.runtime.gateway.load().pools[0].in_flight() >= 50,
        "the 50 requests are in flight"
    );
    let report = server
        .drain(
            Duration::from_secs(20),
            weir::server::Accepting::WhileEarlierWork,
        )
        .await;
    assert_eq!(report.forced, 0);
    for r in inflight {
        assert_eq!(r.await.unwrap(), 200);
    }
    // After the drain nothing listens.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    // Every drained request is in the access log the moment the drain
    // returns (the process may exit right after).
    let text = std::fs::read_to_string(weir.dir.path().join("access.log")).unwrap();
    let slow = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| {
            v["path"].as_str().is_some_and(|p| p.starts_with("/slow/")) && v["status"] == 200
        })
        .count();
    assert_eq!(slow, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_generation_without_the_expected_state_is_not_ready() {
    let up = Upstream::start().await;
    let state = tempfile::tempdir().unwrap();
    let snap = state.path().join("missing.snap");
    for (mode, want) in [("not_ready", 503), ("warn", 200)] {
        let weir = TestWeir::start(&config(
            &[up.addr],
            &format!(
                "[state]\nsnapshot_file = \"{}\"\nexpect_restored = \"{mode}\"\n",
                snap.display()
            ),
        ))
        .await;
        let (status, _, body) = get(weir.admin, "/readyz", &[]).await;
        assert_eq!(
            status.as_u16(),
            want,
            "{mode}: {}",
            String::from_utf8_lossy(&body)
        );
        // Traffic is still served either way: readiness is the orchestrator's cue.
        assert_eq!(get(weir.addr, "/", &[]).await.0, 200);
    }
}
