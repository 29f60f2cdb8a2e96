//! What stands in front of the app in a harmlessness run, and the
//! operations an operator performs on it: nothing (the app itself), nginx
//! as the usual reverse proxy, or weir with a listener, a pool and one
//! per-address rule, run as its binary.
//!
//! Owns each front's processes and configuration, each operation (reload,
//! upgrade, stop/start, a restart beside the old process with `reuse_port`,
//! a stop/start on a socket held as systemd holds it, a blue/green switch
//! behind a real nginx), and the check that the per-address limit survived
//! it. Does not send the visitors' traffic ([`super::mix`]) or sum it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use super::mix::Target;
use super::process::{WeirProcess, WeirProcessError};
use crate::nginx;
use crate::process::{ProcessError, ServerProcess};

/// What stands in front of the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FrontKind {
    /// Nothing: visitors reach the app itself.
    Direct,
    /// nginx as a reverse proxy (`limit_req` on the limited path).
    Nginx,
    /// weir with a listener, a pool and one per-address rule.
    Weir,
}

impl FrontKind {
    pub const ALL: [FrontKind; 3] = [FrontKind::Direct, FrontKind::Nginx, FrontKind::Weir];

    /// The front named `name` on the command line.
    pub fn from_name(name: &str) -> Option<FrontKind> {
        FrontKind::ALL.into_iter().find(|f| f.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            FrontKind::Direct => "direct",
            FrontKind::Nginx => "nginx",
            FrontKind::Weir => "weir",
        }
    }
}

/// What the operator does while visitors come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// Nothing.
    Steady,
    /// Reload the configuration (SIGHUP).
    Reload,
    /// Replace the binary in place (`weir upgrade`).
    Upgrade,
    /// Stop, wait for the exit, start (`docker restart`, most scripts).
    Restart,
    /// Stop as a container runtime does (SIGTERM, then SIGKILL once
    /// docker's 10 s grace, [`CONTAINER_GRACE`], is over), then start; weir
    /// drains for 9 s, as `docs/operations.md` says to match it.
    ContainerStop,
    /// With `reuse_port`: start the next process beside, then stop the old.
    ReusePortRestart,
    /// Stop and start on a listening socket held as systemd holds it.
    ActivatedRestart,
    /// Behind nginx: start the other colour, switch nginx to it, stop the old.
    BlueGreen,
    /// Three instances behind nginx, sharing their limits through a real
    /// Redis, restarted one by one: the balancer stops sending to one (as
    /// readiness going false does), it stops and starts, the balancer
    /// sends to it again, then the next.
    RollingRestart,
    /// Not the front's: the app behind it is deployed (every connection
    /// reset, down for a moment, back as before).
    AppRestart,
}

impl Operation {
    pub const ALL: [Operation; 10] = [
        Operation::Steady,
        Operation::AppRestart,
        Operation::Reload,
        Operation::Upgrade,
        Operation::Restart,
        Operation::ContainerStop,
        Operation::ReusePortRestart,
        Operation::ActivatedRestart,
        Operation::BlueGreen,
        Operation::RollingRestart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Operation::Steady => "none",
            Operation::Reload => "reload",
            Operation::Upgrade => "upgrade",
            Operation::Restart => "stop/start",
            Operation::ContainerStop => "stop/start, killed at 10 s",
            Operation::ReusePortRestart => "restart, reuse_port",
            Operation::ActivatedRestart => "restart, socket activation",
            Operation::BlueGreen => "blue/green behind nginx",
            Operation::RollingRestart => "rolling restart of 3 behind nginx",
            Operation::AppRestart => "the app restarted",
        }
    }

    /// Its name on `weir harm`'s command line.
    pub fn key(self) -> &'static str {
        match self {
            Operation::Steady => "none",
            Operation::Reload => "reload",
            Operation::Upgrade => "upgrade",
            Operation::Restart => "restart",
            Operation::ContainerStop => "container_stop",
            Operation::ReusePortRestart => "reuse_port",
            Operation::ActivatedRestart => "activated",
            Operation::BlueGreen => "blue_green",
            Operation::RollingRestart => "rolling",
            Operation::AppRestart => "app_restart",
        }
    }

    /// The operation named `key` on the command line.
    pub fn from_key(key: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.key() == key)
    }

    /// Whether `front` can do it at all (the app itself is never operated
    /// on; nginx has no in-place upgrade in the foreground, and its
    /// restarts here are plain stop/start).
    pub fn applies_to(self, front: FrontKind) -> bool {
        match front {
            FrontKind::Direct => matches!(self, Operation::Steady | Operation::AppRestart),
            FrontKind::Nginx => matches!(
                self,
                Operation::Steady | Operation::Reload | Operation::Restart | Operation::AppRestart
            ),
            FrontKind::Weir => true,
        }
    }
}

/// Why a front could not be run or operated.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Weir(#[from] WeirProcessError),
    #[error("cannot prepare weir's directory: {0}")]
    Setup(std::io::Error),
}

/// The source address of probe client `k`, which tests the per-address limit.
fn probe_client(k: u32) -> Ipv4Addr {
    Ipv4Addr::new(127, 39, (k / 250) as u8, (k % 250) as u8 + 1)
}
/// The limit on `/limited/`, per address: 5 at once, then one a minute
/// (nginx: `rate=1r/m burst=4`; weir: 5 per 5 minutes). A client that hit
/// it stays limited for a minute: longer than any operation, so a probe
/// after one tells a limit kept from a limit forgotten.
const LIMITED_PATH: &str = "/limited/probe";

/// A running front.
pub struct Front {
    pub kind: FrontKind,
    pub target: Target,
    inner: Inner,
}

enum Inner {
    Direct,
    Nginx(Box<ServerProcess>),
    Weir(Box<WeirFront>),
}

struct WeirFront {
    binary: PathBuf,
    dir: tempfile::TempDir,
    /// The configuration of each colour (one unless blue/green).
    configs: Vec<PathBuf>,
    listens: Vec<SocketAddr>,
    live: usize,
    current: Option<WeirProcess>,
    generation: usize,
    /// The listening socket systemd would hold.
    activated: Option<std::net::TcpListener>,
    /// The load balancer in front, for blue/green.
    balancer: Option<ServerProcess>,
    /// Each generation's start-up to listening.
    starts: Vec<Duration>,
    /// Generations killed at the end of a container's grace.
    killed: u32,
    /// A rolling restart's other instances (colours 1 and 2; `current` is
    /// colour 0).
    fleet: Vec<Option<WeirProcess>>,
    /// The Redis a rolling restart's instances share their limits through,
    /// held for its life only (declared last: it outlives them).
    _redis: Option<ServerProcess>,
}

/// Instances in a rolling restart.
const FLEET: usize = 3;

/// docker's `stop` grace: SIGKILL this long after SIGTERM.
pub const CONTAINER_GRACE: Duration = Duration::from_secs(10);

impl Front {
    /// Starts `kind` in front of `app`, set up for `op`; `weir` is the binary to run.
    pub async fn start(
        kind: FrontKind,
        op: Operation,
        app: SocketAddr,
        weir: &Path,
    ) -> Result<Front, FrontError> {
        match kind {
            FrontKind::Direct => Ok(Front {
                kind,
                target: Target {
                    http1: app,
                    h2: app,
                },
                inner: Inner::Direct,
            }),
            FrontKind::Nginx => {
                let h2 = free_port().map_err(FrontError::Setup)?;
                let server = nginx::start_gateway(&nginx_gateway(h2), app)?;
                Ok(Front {
                    kind,
                    target: Target {
                        http1: server.addr,
                        h2,
                    },
                    inner: Inner::Nginx(Box::new(server)),
                })
            }
            FrontKind::Weir => WeirFront::start(op, app, weir).await,
        }
    }

    /// Performs `op` once; `Ok` once the front serves again.
    pub async fn operate(&mut self, op: Operation) -> Result<(), FrontError> {
        match (&mut self.inner, op) {
            (_, Operation::Steady | Operation::AppRestart) | (Inner::Direct, _) => Ok(()),
            (Inner::Nginx(server), Operation::Reload) => {
                server.signal(rustix::process::Signal::HUP);
                Ok(())
            }
            (Inner::Nginx(server), _) => Ok(server.restart()?),
            (Inner::Weir(w), op) => w.operate(op).await,
        }
    }

    /// Makes probe client `k` (an address of its own for each operation,
    /// so each starts a full minute of being limited) limited: it asks
    /// until refused, at most ten times; false when it never was.
    pub async fn limit_probe(&self, k: u32) -> bool {
        for _ in 0..10 {
            if probe(self.target.http1, k).await == Some(429) {
                return true;
            }
        }
        false
    }

    /// Whether the probe client is still limited: asked once, a second
    /// after the operation (a limit the old process enforced reaches a
    /// process beside it through the snapshot file within that; asking
    /// more than once would limit it anew).
    pub async fn probe_still_limited(&self, k: u32) -> bool {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A probe that got no answer at all says nothing of the limit.
        for _ in 0..3 {
            match probe(self.target.http1, k).await {
                Some(status) => return status == 429,
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        false
    }

    /// How long each weir generation this front started took from its
    /// spawn to listening (none for other fronts).
    pub fn starts(&self) -> Vec<Duration> {
        match &self.inner {
            Inner::Weir(w) => w.starts.clone(),
            _ => Vec::new(),
        }
    }

    /// How many weir generations had to be killed at the end of their
    /// grace (0 for other fronts).
    pub fn killed(&self) -> u32 {
        match &self.inner {
            Inner::Weir(w) => w.killed,
            _ => 0,
        }
    }

    /// The serving weir generation's process id (none for other fronts).
    pub fn pid(&self) -> Option<u32> {
        match &self.inner {
            Inner::Weir(w) => w.current.as_ref().map(|p| p.pid),
            _ => None,
        }
    }

    /// What weir logged, every generation (empty for others).
    pub fn logs(&self) -> String {
        match &self.inner {
            Inner::Weir(w) => w.logs(),
            Inner::Nginx(n) => n.logs(),
            Inner::Direct => String::new(),
        }
    }

    /// Stops the front and waits for its last process to finish its drain.
    pub async fn stop(self) -> Result<(), FrontError> {
        if let Inner::Weir(mut w) = self.inner {
            let fleet: Vec<WeirProcess> = w.current.take().into_iter().collect();
            for p in fleet.into_iter().chain(w.fleet.drain(..).flatten()) {
                p.stop().exited().await?;
            }
        }
        Ok(())
    }
}

impl Drop for WeirFront {
    fn drop(&mut self) {
        // `WEIR_HARM_KEEP`: keep configurations and logs to look at.
        if std::env::var_os("WEIR_HARM_KEEP").is_some() {
            let dir = std::mem::replace(&mut self.dir, tempfile::TempDir::new().expect("temp dir"));
            let _ = dir.keep();
        }
    }
}

impl WeirFront {
    async fn start(op: Operation, app: SocketAddr, binary: &Path) -> Result<Front, FrontError> {
        let dir = tempfile::tempdir().map_err(FrontError::Setup)?;
        if std::env::var_os("WEIR_HARM_KEEP").is_some() {
            eprintln!("weir harm: weir's files are in {}", dir.path().display());
        }
        let colours = match op {
            Operation::BlueGreen => 2,
            Operation::RollingRestart => FLEET,
            _ => 1,
        };
        let activated = (op == Operation::ActivatedRestart)
            .then(|| std::net::TcpListener::bind("127.0.0.1:0"))
            .transpose()
            .map_err(FrontError::Setup)?;
        let redis = (op == Operation::RollingRestart)
            .then(|| crate::redis::start("a rolling restart's shared limits"))
            .transpose()?;
        let shared = redis.as_ref().map(|r| r.addr);
        let (listens, configs) =
            write_configs(colours, activated.as_ref(), app, dir.path(), op, shared)
                .map_err(FrontError::Setup)?;
        let mut front = WeirFront {
            binary: binary.to_path_buf(),
            dir,
            configs,
            listens,
            live: 0,
            current: None,
            generation: 0,
            activated,
            balancer: None,
            starts: Vec::new(),
            killed: 0,
            fleet: Vec::new(),
            _redis: redis,
        };
        front.current = Some(front.spawn(0).await?);
        if op == Operation::RollingRestart {
            for colour in 1..FLEET {
                let next = front.spawn(colour).await?;
                front.fleet.push(Some(next));
            }
        }
        let target = front.balance(op, app)?;
        Ok(Front {
            kind: FrontKind::Weir,
            target,
            inner: Inner::Weir(Box::new(front)),
        })
    }

    /// Starts the balancer `op` puts in front (blue/green: over the first
    /// colour; a rolling restart: over all), and says where clients go.
    fn balance(&mut self, op: Operation, app: SocketAddr) -> Result<Target, FrontError> {
        let servers = match op {
            Operation::BlueGreen => &self.listens[..1],
            Operation::RollingRestart => &self.listens[..],
            _ => {
                return Ok(Target {
                    http1: self.listens[0],
                    h2: self.listens[0],
                });
            }
        };
        let lb = nginx::start_gateway(
            &balancer(servers, free_port().map_err(FrontError::Setup)?),
            app,
        )?;
        let target = Target {
            http1: lb.addr,
            h2: balancer_h2(&lb),
        };
        self.balancer = Some(lb);
        Ok(target)
    }

    /// The next generation of colour `colour`.
    async fn spawn(&mut self, colour: usize) -> Result<WeirProcess, FrontError> {
        let generation = self.generation;
        self.generation += 1;
        let process = WeirProcess::start(
            &self.binary,
            &self.configs[colour],
            self.dir.path(),
            generation,
            self.activated.as_ref(),
        )
        .await?;
        self.starts.push(process.started_in);
        Ok(process)
    }

    fn logs(&self) -> String {
        let mut logs = String::new();
        for g in 0..self.generation {
            let path = self.dir.path().join(format!("weir.{g}.log"));
            if let Ok(text) = std::fs::read_to_string(path) {
                logs.push_str(&format!("--- generation {g}\n{text}"));
            }
        }
        logs
    }

    async fn operate(&mut self, op: Operation) -> Result<(), FrontError> {
        let current = self
            .current
            .take()
            .expect("a generation runs between operations");
        match op {
            Operation::Steady => self.current = Some(current),
            Operation::Reload => {
                current.signal(rustix::process::Signal::HUP);
                self.current = Some(current);
            }
            Operation::Upgrade => {
                let config = self.configs[self.live].clone();
                let (next, old) = current.upgrade(&self.binary, &config).await?;
                self.current = Some(next);
                old.exited().await?;
            }
            Operation::Restart | Operation::ActivatedRestart => {
                current.stop().exited().await?;
                self.current = Some(self.spawn(self.live).await?);
            }
            Operation::ContainerStop => {
                if current.stop().exited_or_killed(CONTAINER_GRACE).await? {
                    self.killed += 1;
                }
                self.current = Some(self.spawn(self.live).await?);
            }
            Operation::ReusePortRestart => {
                let next = self.spawn(self.live).await?;
                self.current = Some(next);
                current.stop().exited().await?;
            }
            Operation::AppRestart => self.current = Some(current),
            Operation::BlueGreen => {
                let other = 1 - self.live;
                let next = self.spawn(other).await?;
                self.current = Some(next);
                self.live = other;
                self.balance_over(|colour| colour == other)?;
                // The balancer's old worker finishes what it holds, then
                // the old colour drains.
                tokio::time::sleep(Duration::from_millis(500)).await;
                current.stop().exited().await?;
            }
            Operation::RollingRestart => self.roll(current).await?,
        }
        Ok(())
    }

    /// A rolling restart: each instance in turn taken out of the balancer,
    /// stopped, started again, and put back.
    async fn roll(&mut self, current: WeirProcess) -> Result<(), FrontError> {
        let mut fleet: Vec<Option<WeirProcess>> = std::iter::once(Some(current))
            .chain(self.fleet.drain(..))
            .collect();
        for (i, slot) in fleet.iter_mut().enumerate() {
            self.balance_over(|colour| colour != i)?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            if let Some(p) = slot.take() {
                p.stop().exited().await?;
            }
            *slot = Some(self.spawn(i).await?);
            self.balance_over(|_| true)?;
        }
        let mut fleet = fleet.into_iter().flatten();
        self.current = fleet.next();
        self.fleet = fleet.map(Some).collect();
        Ok(())
    }

    /// Points the balancer at the colours `keep` keeps (a rolling restart:
    /// as readiness going false takes an instance out of a Service's
    /// endpoints). nginx's old worker finishes what it holds.
    fn balance_over(&self, keep: impl Fn(usize) -> bool) -> Result<(), FrontError> {
        if let Some(lb) = &self.balancer {
            let servers: Vec<SocketAddr> = (0..self.listens.len())
                .filter(|&c| keep(c))
                .map(|c| self.listens[c])
                .collect();
            let http =
                balancer(&servers, balancer_h2(lb)).replace("{{listen}}", &lb.addr.to_string());
            nginx::reconfigure(lb, &http)?;
        }
        Ok(())
    }
}

/// Each colour's listening address (the activated socket's, or a free
/// port) and configuration file, written in `dir`.
fn write_configs(
    colours: usize,
    activated: Option<&std::net::TcpListener>,
    app: SocketAddr,
    dir: &Path,
    op: Operation,
    redis: Option<SocketAddr>,
) -> std::io::Result<(Vec<SocketAddr>, Vec<PathBuf>)> {
    let mut listens = Vec::new();
    let mut configs = Vec::new();
    for c in 0..colours {
        let listen = match activated {
            Some(s) => s.local_addr()?,
            None => free_port()?,
        };
        let path = dir.join(format!("weir.{c}.toml"));
        let mut text = weir_config(app, listen, dir, op);
        if let Some(redis) = redis {
            text.push_str(&format!("redis_url = \"redis://{redis}/0\"\n"));
        }
        std::fs::write(&path, text)?;
        listens.push(listen);
        configs.push(path);
    }
    Ok((listens, configs))
}

/// weir's configuration in the runs: the defaults, a listener and a pool,
/// plus one per-address rule (on `/limited/`, [`LIMITED_PATH`]) and the snapshot
/// file that carries it across restarts; behind the balancer, its address
/// is trusted to name the client.
fn weir_config(app: SocketAddr, listen: SocketAddr, dir: &Path, op: Operation) -> String {
    let reuse_port = if op == Operation::ReusePortRestart {
        "reuse_port = true\n"
    } else {
        ""
    };
    let process = if op == Operation::ContainerStop {
        "[process]\ndrain_timeout = \"9s\"\n\n"
    } else {
        ""
    };
    let trusted = if matches!(op, Operation::BlueGreen | Operation::RollingRestart) {
        "[identity]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n"
    } else {
        ""
    };
    format!(
        r#"[admin]
address = "127.0.0.1:0"

{process}{trusted}[[listeners]]
address = "{listen}"
{reuse_port}
[pools.app]
servers = ["{app}"]

[[routes]]
pool = "app"
path_prefix = "/limited/"
class = "limited"

[[routes]]
pool = "app"

[[classes.limited.rules]]
name = "per_address"
limits = [{{ per = "ip", rate = 5, window = "5m" }}]

[state]
snapshot_file = "{dir}/state/limiter.snap"
"#,
        dir = dir.display()
    )
}

/// nginx as a reverse proxy in front of the app, as commonly set up: kept-
/// alive upstream connections, WebSockets passed through, bodies of any
/// size, h2c on a second listener, and the same per-address limit.
fn nginx_gateway(h2: SocketAddr) -> String {
    format!(
        r#"    limit_req_zone $binary_remote_addr zone=per_address:10m rate=1r/m;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
    upstream app {{
        server {{{{app}}}};
        keepalive 64;
    }}
    server {{
        listen {{{{listen}}}} backlog=4096;
        listen {h2} http2 backlog=4096;
        client_max_body_size 0;
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 60s;
        }}
        location /limited/ {{
            limit_req zone=per_address burst=4 nodelay;
            limit_req_status 429;
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"#
    )
}

/// nginx as the load balancer in front of weir (blue/green): the client's
/// address in `X-Forwarded-For`, WebSockets passed, bodies streamed.
fn balancer(weir: &[SocketAddr], h2: SocketAddr) -> String {
    let servers: String = weir
        .iter()
        .map(|w| format!("        server {w};\n"))
        .collect();
    format!(
        r#"    map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
    upstream weir {{
{servers}        keepalive 64;
    }}
    server {{
        listen {{{{listen}}}} backlog=4096;
        listen {h2} http2 backlog=4096;
        client_max_body_size 0;
        location / {{
            proxy_pass http://weir;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 60s;
            proxy_request_buffering off;
        }}
    }}
"#
    )
}

/// The balancer's h2c listener, read back from its configuration.
fn balancer_h2(lb: &ServerProcess) -> SocketAddr {
    let conf = std::fs::read_to_string(lb.dir().join("nginx.conf")).unwrap_or_default();
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("listen "))
        .filter(|l| l.contains("http2"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .next()
        .unwrap_or(lb.addr)
}

fn free_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// One request from probe client `k`; its status, or `None` when it got none.
async fn probe(to: SocketAddr, k: u32) -> Option<u16> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket
        .bind(SocketAddr::new(probe_client(k).into(), 0))
        .ok()?;
    let stream = socket.connect(to).await.ok()?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .ok()?;
    tokio::spawn(conn);
    let req = http::Request::get(LIMITED_PATH)
        .header(http::header::HOST, "app.example")
        .body(Empty::new())
        .ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .ok()?
        .ok()?;
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    Some(status)
}
