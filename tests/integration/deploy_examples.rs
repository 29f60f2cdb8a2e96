//! The fleet's deploy examples (`examples/fleet/`: Kubernetes, docker
//! compose, the balancer's nginx.conf, one weir.toml) say what weir does:
//! weir accepts their configuration, their ports and probe paths are
//! weir's, their graces leave room for weir's drain, and the names that tie
//! one manifest to another (labels, the Secret, the ConfigMap, Redis) agree.
//!
//! Does not: apply them to a cluster or run docker (neither is here).

use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn fleet(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/fleet")).join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fleet(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// What the examples' weir.toml needs from the environment, set to
/// loopback stand-ins: `weir check` resolves the app and reads the key.
fn stand_in_env() -> HashMap<String, String> {
    HashMap::from([
        ("APP_BACKEND".into(), "127.0.0.1:9".into()),
        ("WEIR_REDIS_URL".into(), "redis://127.0.0.1:1/0".into()),
        (
            "WEIR_CHALLENGE_KEY".into(),
            "a-stand-in-key-of-more-than-32-bytes-for-the-test".into(),
        ),
    ])
}

/// The `${NAME}`s weir.toml reads.
fn env_names(toml: &str) -> Vec<String> {
    toml.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split("${").skip(1))
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.to_string()))
        .collect()
}

/// What the tests compare the manifests with.
struct Weir {
    text: String,
    listen_port: u16,
    admin_port: u16,
    drain: Duration,
    env: Vec<String>,
}

fn weir_toml() -> Weir {
    let text = read("weir.toml");
    let loaded = weir::config::load_str(&text, Some(&fleet("weir.toml")), &stand_in_env())
        .unwrap_or_else(|e| panic!("weir.toml: {e}"));
    let c = &loaded.config;
    let port = |a: &str| a.parse::<SocketAddr>().expect("an ip:port").port();
    assert_eq!(c.listeners.len(), 1, "one listener");
    Weir {
        listen_port: port(&c.listeners[0].address),
        admin_port: port(&c.admin.address),
        drain: c.process.drain_timeout.0,
        env: env_names(&text),
        text,
    }
}

/// `seconds` of a compose duration such as `25s` or `1m30s`.
fn compose_secs(d: &str) -> u64 {
    let (mut total, mut n) = (0, 0);
    for ch in d.chars() {
        match ch {
            '0'..='9' => n = n * 10 + u64::from(ch.to_digit(10).unwrap()),
            'm' => (total, n) = (total + n * 60, 0),
            's' => (total, n) = (total + n, 0),
            _ => panic!("duration {d}"),
        }
    }
    total + n
}

#[test]
fn weir_accepts_the_fleets_configuration() {
    let w = weir_toml();
    assert!(
        w.drain >= Duration::from_secs(5),
        "a drain that fits uploads"
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &w.text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check", "-c"])
        .arg(file.path())
        .env_clear()
        .envs(stand_in_env())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "weir check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names = w.env.clone();
    names.sort();
    assert_eq!(
        names,
        ["APP_BACKEND", "WEIR_CHALLENGE_KEY", "WEIR_REDIS_URL"],
        "the environment the manifests set"
    );
}

/// The probe paths the manifests name are weir's admin endpoints.
#[tokio::test]
async fn the_probe_paths_are_weirs() {
    let up = crate::support::ordinary::ok_upstream().await;
    let weir = crate::support::Weir::builder()
        .config(crate::support::WeirConfig::new(up.addr()).admin().toml())
        .start()
        .await
        .unwrap();
    for path in ["/livez", "/readyz"] {
        let r = crate::support::HttpRequest::get(path)
            .send(weir.admin())
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{path}");
    }
}

// Only the fields the checks read; the rest of each manifest is ignored.

#[derive(Deserialize)]
struct Head {
    kind: String,
    metadata: Named,
}

#[derive(Deserialize)]
struct Named {
    name: String,
}

#[derive(Deserialize)]
struct ConfigMap {
    data: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Labels {
    #[serde(rename = "matchLabels")]
    match_labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Deployment {
    spec: DeploymentSpec,
}

#[derive(Deserialize)]
struct DeploymentSpec {
    replicas: u32,
    selector: Labels,
    template: PodTemplate,
}

#[derive(Deserialize)]
struct PodTemplate {
    metadata: PodMeta,
    spec: PodSpec,
}

#[derive(Deserialize)]
struct PodMeta {
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    termination_grace_period_seconds: Option<u64>,
    containers: Vec<Container>,
    #[serde(default)]
    volumes: Vec<Volume>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Container {
    name: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    ports: Vec<ContainerPort>,
    readiness_probe: Option<Probe>,
    liveness_probe: Option<Probe>,
    lifecycle: Option<Lifecycle>,
    #[serde(default)]
    volume_mounts: Vec<VolumeMount>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvVar {
    name: String,
    value: Option<String>,
    value_from: Option<EnvFrom>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvFrom {
    secret_key_ref: Option<SecretKeyRef>,
}

#[derive(Deserialize)]
struct SecretKeyRef {
    name: String,
    key: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerPort {
    name: String,
    container_port: u16,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    http_get: HttpGet,
}

#[derive(Deserialize)]
struct HttpGet {
    path: String,
    port: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lifecycle {
    pre_stop: Handler,
}

#[derive(Deserialize)]
struct Handler {
    exec: Exec,
}

#[derive(Deserialize)]
struct Exec {
    command: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeMount {
    name: String,
    mount_path: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Volume {
    name: String,
    config_map: Option<Named>,
}

#[derive(Deserialize)]
struct Budget {
    spec: BudgetSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BudgetSpec {
    min_available: u32,
    selector: Labels,
}

#[derive(Deserialize)]
struct Service {
    spec: ServiceSpec,
}

#[derive(Deserialize)]
struct ServiceSpec {
    selector: BTreeMap<String, String>,
    ports: Vec<ServicePort>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServicePort {
    port: u16,
    target_port: String,
}

/// The manifest's documents by kind and name, as their text.
fn documents(yaml: &str) -> BTreeMap<(String, String), String> {
    let mut docs = BTreeMap::new();
    let mut current = String::new();
    for line in yaml.lines().chain(std::iter::once("---")) {
        if line == "---" {
            if current.lines().any(|l| l.starts_with("kind:")) {
                let head: Head = serde_saphyr::from_str(&current)
                    .unwrap_or_else(|e| panic!("a document of kubernetes.yaml: {e}"));
                docs.insert((head.kind, head.metadata.name), current.clone());
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs
}

fn document<T: serde::de::DeserializeOwned>(
    docs: &BTreeMap<(String, String), String>,
    kind: &str,
    name: &str,
) -> T {
    let text = docs
        .get(&(kind.to_string(), name.to_string()))
        .unwrap_or_else(|| panic!("no {kind} {name} in kubernetes.yaml"));
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
}

fn port_named(c: &Container, name: &str) -> u16 {
    c.ports
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no container port {name}"))
        .container_port
}

/// The file `weir run -c FILE` reads.
fn config_file(args: &[String]) -> String {
    args.windows(2)
        .find(|a| a[0] == "-c")
        .map(|a| a[1].clone())
        .expect("run -c FILE")
}

/// The preStop sleep, in seconds.
fn pre_stop_secs(c: &Container) -> u64 {
    let command = &c
        .lifecycle
        .as_ref()
        .expect("a preStop")
        .pre_stop
        .exec
        .command;
    match command.as_slice() {
        [sleep, secs] if sleep.ends_with("/sleep") => secs.parse().expect("seconds"),
        other => panic!("preStop {other:?} is not a sleep"),
    }
}

#[test]
fn the_kubernetes_fleet_matches_weirs_configuration_and_its_drain() {
    let w = weir_toml();
    let yaml = read("kubernetes.yaml");
    let docs = documents(&yaml);

    // The ConfigMap carries weir.toml as it is (one source for both examples).
    let cm: ConfigMap = document(&docs, "ConfigMap", "weir-fleet");
    assert_eq!(cm.data["weir.toml"], w.text, "the ConfigMap's weir.toml");

    let d: Deployment = document(&docs, "Deployment", "weir");
    let pod = &d.spec.template.spec;
    let c = pod
        .containers
        .iter()
        .find(|c| c.name == "weir")
        .expect("the weir container");
    assert!(d.spec.replicas >= 2, "a fleet");
    assert_eq!(
        d.spec.selector.match_labels,
        d.spec.template.metadata.labels
    );

    // Ports and probes: weir's.
    assert_eq!(port_named(c, "http"), w.listen_port);
    assert_eq!(port_named(c, "admin"), w.admin_port);
    let ready = &c.readiness_probe.as_ref().expect("readiness").http_get;
    let live = &c.liveness_probe.as_ref().expect("liveness").http_get;
    assert_eq!(
        (ready.path.as_str(), ready.port.as_str()),
        ("/readyz", "admin")
    );
    assert_eq!(
        (live.path.as_str(), live.port.as_str()),
        ("/livez", "admin")
    );

    // The grace: preStop's sleep, then weir's whole drain, then a margin.
    let grace = pod.termination_grace_period_seconds.unwrap_or(30);
    let pre_stop = pre_stop_secs(c);
    assert!(
        grace > pre_stop + w.drain.as_secs(),
        "terminationGracePeriodSeconds {grace} leaves no margin after preStop {pre_stop} s and drain_timeout {:?}",
        w.drain
    );

    // The configuration file: the ConfigMap, mounted where `-c` reads it.
    let config_arg = config_file(&c.args);
    let mount = c
        .volume_mounts
        .iter()
        .find(|m| format!("{}/weir.toml", m.mount_path) == config_arg)
        .expect("a mount holding the -c file");
    let volume = pod.volumes.iter().find(|v| v.name == mount.name).unwrap();
    assert_eq!(
        volume.config_map.as_ref().map(|n| n.name.as_str()),
        Some("weir-fleet")
    );

    // Every variable weir.toml reads is set; the key comes from the Secret
    // the header says how to create.
    for name in &w.env {
        assert!(c.env.iter().any(|e| &e.name == name), "{name} is not set");
    }
    let key = c
        .env
        .iter()
        .find(|e| e.name == "WEIR_CHALLENGE_KEY")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|f| f.secret_key_ref.as_ref())
        .expect("the key from a Secret");
    let create = format!(
        "kubectl create secret generic {} --from-literal={}=",
        key.name, key.key
    );
    assert!(yaml.contains(&create), "the header says: {create}");

    // Redis: the Service the URL names, on the port it names.
    let url = c
        .env
        .iter()
        .find(|e| e.name == "WEIR_REDIS_URL")
        .and_then(|e| e.value.clone())
        .expect("WEIR_REDIS_URL");
    let (host, port) = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .and_then(|hp| hp.split_once(':'))
        .expect("redis://host:port");
    let redis: Service = document(&docs, "Service", host);
    assert!(
        redis.spec.ports.iter().any(|p| p.port.to_string() == port),
        "Redis's Service has port {port}"
    );

    // The budget keeps most of the fleet through a drain of nodes.
    let pdb: Budget = document(&docs, "PodDisruptionBudget", "weir");
    assert_eq!(
        pdb.spec.selector.match_labels,
        d.spec.template.metadata.labels
    );
    assert!(pdb.spec.min_available >= 1 && pdb.spec.min_available < d.spec.replicas);

    // The Service sends to the listener only, never to the admin API.
    let svc: Service = document(&docs, "Service", "weir");
    assert_eq!(svc.spec.selector, d.spec.template.metadata.labels);
    assert!(svc.spec.ports.iter().all(|p| p.target_port == "http"));
}

#[derive(Deserialize)]
struct Compose {
    services: BTreeMap<String, ComposeService>,
}

#[derive(Deserialize)]
struct ComposeService {
    #[serde(default)]
    command: Vec<String>,
    deploy: Option<ComposeDeploy>,
    stop_grace_period: Option<String>,
    #[serde(default)]
    environment: BTreeMap<String, String>,
    #[serde(default)]
    volumes: Vec<String>,
    healthcheck: Option<Healthcheck>,
    ports: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct ComposeDeploy {
    replicas: u32,
}

#[derive(Deserialize)]
struct Healthcheck {
    test: Vec<String>,
}

#[test]
fn the_compose_fleet_matches_weirs_configuration_and_its_drain() {
    let w = weir_toml();
    let compose: Compose = serde_saphyr::from_str(&read("compose.yaml")).unwrap();
    let s = &compose.services["weir"];
    assert!(
        s.deploy.as_ref().is_some_and(|d| d.replicas >= 2),
        "a fleet"
    );
    // docker's default grace is 10 s: compose must say more than the drain.
    let grace = compose_secs(s.stop_grace_period.as_deref().unwrap_or("10s"));
    assert!(
        grace > w.drain.as_secs(),
        "stop_grace_period {grace} s within drain_timeout {:?}",
        w.drain
    );
    assert!(s.ports.is_none(), "replicas publish no port of their own");
    let health = s
        .healthcheck
        .as_ref()
        .expect("a healthcheck")
        .test
        .join(" ");
    assert!(
        health.contains(&format!("/dev/tcp/127.0.0.1/{}", w.admin_port))
            && health.contains("/livez"),
        "the healthcheck asks /livez on the admin port: {health}"
    );
    let config_arg = config_file(&s.command);
    assert!(
        s.volumes.contains(&format!("./weir.toml:{config_arg}:ro")),
        "weir.toml mounted at {config_arg}: {:?}",
        s.volumes
    );
    for name in &w.env {
        assert!(s.environment.contains_key(name), "{name} is not set");
    }
    assert!(compose.services.contains_key("redis"));
    assert!(
        s.environment["WEIR_REDIS_URL"].starts_with("redis://redis:6379"),
        "the compose Redis"
    );
    let balancer = &compose.services["balancer"];
    assert!(
        balancer
            .volumes
            .iter()
            .any(|v| v.starts_with("./nginx.conf:")),
        "the balancer's nginx.conf"
    );
    let nginx = read("nginx.conf");
    assert!(
        nginx.contains(&format!("server weir:{} resolve;", w.listen_port)),
        "nginx.conf balances over weir's listener"
    );
}
