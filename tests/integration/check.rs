//! `weir check` refuses what `weir run` would refuse, names the key, and
//! warns about settings that run but expose or trust too much (issue 18).
//! Each case runs the real binary on a real file. Also `weir --version`
//! and `weir_build_info`, which name the commit and the day of the build.

use std::process::Command;

const BASE: &str = r#"[[listeners]]
address = "127.0.0.1:18080"

[pools.app]
servers = ["127.0.0.1:9000"]
"#;

/// Runs `weir check` on `BASE` + `extra`: exit code and stderr.
fn check(extra: &str) -> (i32, String) {
    weir_on("check", extra)
}

/// Runs `weir SUBCOMMAND -c` on `BASE` + `extra`: exit code and stderr.
fn weir_on(subcommand: &str, extra: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, format!("{BASE}\n{extra}")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([subcommand, "-c"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_refuses_what_run_would_refuse_and_names_the_key() {
    // A directory that cannot be made (its parent is a file).
    let missing_dir = "[state]\nsnapshot_file = \"/etc/hostname/weir/limiter.snap\"\n";
    // (extra config, what stderr must name)
    let cases = [
        (
            "[limits]\nheader_read_timeout = \"0s\"\n",
            "limits.header_read_timeout",
        ),
        ("[limits]\nsend_timeout = \"0s\"\n", "limits.send_timeout"),
        (
            "[[listeners]]\naddress = \"127.0.0.1:18080\"\n",
            "listeners[1].address",
        ),
        ("[admin]\naddress = \"127.0.0.1:18080\"\n", "admin.address"),
        (missing_dir, "state.snapshot_file"),
        (
            "[state]\nredis_url = \"rediss://127.0.0.1:6380/0\"\nredis_ca_file = \"/nonexistent/ca.pem\"\n",
            "state.redis_ca_file",
        ),
        (
            "[state]\nredis_url = \"mysql://127.0.0.1/0\"\n",
            "state.redis_url",
        ),
        (
            "[state]\nredis_url = \"redis://127.0.0.1/0\"\n[state.redis_sentinel]\nmaster = \"weir\"\nnodes = [\"127.0.0.1:26379\"]\n",
            "state.redis_sentinel: give redis_url or redis_sentinel, not both",
        ),
        (
            "[state.redis_sentinel]\nmaster = \"weir\"\nnodes = []\n",
            "state.redis_sentinel.nodes",
        ),
        (
            "[state.redis_sentinel]\nmaster = \"\"\nnodes = [\"127.0.0.1:26379\"]\n",
            "state.redis_sentinel.master",
        ),
        (
            "[state.redis_sentinel]\nmaster = \"weir\"\nnodes = [\"mysql://127.0.0.1:26379\"]\n",
            "state.redis_sentinel.nodes",
        ),
        (
            "[state]\nredis_url = \"redis://127.0.0.1/0\"\nredis_cluster = [\"127.0.0.1:7000\"]\n",
            "state.redis_cluster: give one of redis_url, redis_sentinel and redis_cluster",
        ),
        (
            "[state]\nredis_url = \"redis://127.0.0.1/0\"\nredis_lease = \"1m\"\n",
            "state.redis_lease: at most 5s, not 60s",
        ),
        (
            "[state]\nredis_cluster = []\n",
            "state.redis_cluster: redis cluster nodes are empty",
        ),
        (
            "[state]\nredis_cluster = [\"mysql://127.0.0.1:7000\"]\n",
            "state.redis_cluster",
        ),
        (
            "[identity]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.1.2.3/8\"]\n",
            "identity.trusted_proxies[1]: trusted proxy entry #1",
        ),
        // Verified bots (issue 19 item 4): a key file that is no key file,
        // an empty domain list, a share outside 0..1; each with its line.
        (
            "[[bots.crawlers]]\nname = \"examplebot\"\nkeys_file = \"/etc/hostname\"\n",
            ":9: bots.crawlers[0].keys_file: /etc/hostname: not a JWK or a JWK Set",
        ),
        (
            "[[bots.crawlers]]\nname = \"googlebot\"\nuser_agent = \"Googlebot\"\ndomains = []\n",
            ":10: bots.crawlers[0].domains: is empty",
        ),
        (
            "[pools.app.admission]\nbots_share = 1.5\n",
            ":8: pools.app.admission.bots_share: admission.bots_share = 1.5 is not a share",
        ),
    ];
    for (extra, names) in cases {
        let (code, stderr) = check(extra);
        assert_eq!(code, 2, "{extra}: {stderr}");
        assert!(stderr.contains(names), "{extra}: {stderr} lacks {names}");
    }
}

#[test]
fn check_warns_about_a_public_admin_api_and_trusting_everyone() {
    let (code, stderr) = check(
        "[admin]\naddress = \"0.0.0.0:9901\"\n\n[identity]\ntrusted_proxies = [\"10.0.0.0/8\", \"0.0.0.0/0\"]\n",
    );
    assert_eq!(code, 0, "warnings do not fail the check: {stderr}");
    assert!(
        stderr.contains("warning:")
            && stderr.contains("admin.address")
            && stderr.contains("may reload"),
        "{stderr}"
    );
    assert!(
        stderr.contains("identity.trusted_proxies[1]") && stderr.contains("trusts every address"),
        "{stderr}"
    );
    let (code, stderr) = check("");
    assert_eq!((code, stderr.as_str()), (0, ""), "a plain config is quiet");
    // A snapshot directory weir run would create: a warning, not a refusal.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("new/limiter.snap");
    let (code, stderr) = check(&format!(
        "[state]\nsnapshot_file = \"{}\"\n",
        file.display()
    ));
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("weir run creates it"), "{stderr}");
    assert!(!file.parent().unwrap().exists(), "check changes nothing");
}

/// `weir run` on a config it refuses says each problem once (it had said
/// each three times: the error, its quoted cause, and the cause again).
#[test]
fn run_says_each_problem_of_a_refused_config_once() {
    let extra = "[pools.app.admission]\nmax_in_flight = 10\nworkers = 10\n";
    let (code, stderr) = weir_on("run", extra);
    assert_eq!(code, 2, "{stderr}");
    let problem = "leaves no worker for health checks";
    assert_eq!(stderr.matches(problem).count(), 1, "{stderr}");
    assert!(
        stderr.contains("pools.app.admission.max_in_flight"),
        "{stderr}"
    );
}

#[tokio::test]
async fn run_creates_the_snapshot_directory_check_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state/new/limiter.snap");
    let cfg = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[admin]\naddress = \"127.0.0.1:0\"\n\
         [pools.app]\nservers = [\"127.0.0.1:9\"]\n[state]\nsnapshot_file = \"{}\"\n",
        file.display()
    );
    let weir = crate::support::Weir::builder()
        .config(cfg)
        .start()
        .await
        .unwrap();
    assert!(file.parent().unwrap().is_dir(), "{}", weir.stderr());
    // The snapshot it writes when it starts lands there.
    assert_eventually_async!(file.exists(), "{}", weir.stderr());
}

#[tokio::test]
async fn version_and_build_info_name_the_commit_and_the_day() {
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    // weir 0.1.0 (commit 1a2b3c4d5e6f, built 2026-12-02)
    let (name, rest) = version
        .split_once(" (commit ")
        .unwrap_or_else(|| panic!("{version}"));
    assert_eq!(name, concat!("weir ", env!("CARGO_PKG_VERSION")));
    let (commit, date) = rest.trim_end_matches(')').split_once(", built ").unwrap();
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{version}"
    );
    assert!(
        date.len() == 10 && date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-',
        "{version}"
    );

    let cfg = format!("{BASE}\n[admin]\naddress = \"127.0.0.1:0\"\n")
        .replace("127.0.0.1:18080", "127.0.0.1:0");
    let weir = crate::support::Weir::builder()
        .config(cfg)
        .start()
        .await
        .unwrap();
    let metrics = crate::support::HttpRequest::get("/metrics")
        .send(weir.admin())
        .await
        .unwrap()
        .text();
    let series = format!(
        "weir_build_info{{version=\"{}\",commit=\"{commit}\",build_date=\"{date}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(metrics.contains(&series), "{series} not in\n{metrics}");
}
