//! An nginx process guard: one master (foreground, `master_process on`) and its
//! workers, started from a config body in a fresh temp dir.
//!
//! Owns: the boilerplate every test nginx needs (own pid file, error log,
//! access log and temp paths in the temp dir; `daemon off; master_process on;`
//! so reload works and the master stays our child), OS-chosen loopback ports
//! handed to the config closure, and reload by SIGHUP after `nginx -t`.
//!
//! Does not: support binary upgrade (USR2 needs a daemonized nginx started by
//! absolute path; see MACHINE-NOTES) or know what the config proxies to.
//!
//! ```ignore
//! let nginx = Nginx::builder()
//!     .http(move |addrs| format!("server {{ listen {}; return 200 ok; }}", addrs[0]))
//!     .start()
//!     .await?;
//! let resp = HttpRequest::get("/").send(nginx.addr(0)).await?;
//! ```

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::ports::{find_program, free_addrs, start_on_loopback};
use super::process::{
    ConfigBody, ConfigFn, FixtureError, POLL, START_DEADLINE, ServerProcess, Signal, write_file,
};

/// Builds an [`Nginx`]. `http` and `stream` bodies go inside `http { }` and
/// `stream { }`; each closure gets the pre-allocated listen addresses.
pub struct NginxBuilder {
    ports: usize,
    worker_processes: u32,
    worker_connections: u32,
    main: String,
    http: Option<ConfigBody>,
    stream: Option<ConfigBody>,
}

impl NginxBuilder {
    /// How many listen addresses to allocate (default 1).
    pub fn ports(mut self, n: usize) -> Self {
        self.ports = n;
        self
    }

    /// `worker_processes` (default 1).
    pub fn worker_processes(mut self, n: u32) -> Self {
        self.worker_processes = n;
        self
    }

    /// `worker_connections` in `events {}` (default 1024).
    pub fn worker_connections(mut self, n: u32) -> Self {
        self.worker_connections = n;
        self
    }

    /// Extra main-context directives (e.g. `worker_rlimit_nofile 20000;`).
    pub fn main(mut self, directives: impl Into<String>) -> Self {
        self.main = directives.into();
        self
    }

    /// The body of `http { }`.
    pub fn http(mut self, body: impl ConfigFn) -> Self {
        self.http = Some(Box::new(body));
        self
    }

    /// The body of `stream { }`.
    pub fn stream(mut self, body: impl ConfigFn) -> Self {
        self.stream = Some(Box::new(body));
        self
    }

    /// Starts nginx and waits until every allocated address accepts.
    pub async fn start(self) -> Result<Nginx, FixtureError> {
        let program = find_program("nginx")?;
        let (process, addrs, dir) = start_on_loopback(
            "nginx",
            &["error.log"],
            || free_addrs("nginx", self.ports),
            |dir, addrs| {
                // Workers run as `nobody` when the master is root; they must
                // reach the temp paths inside this dir (tempfile makes it 0700).
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(
                    |source| FixtureError::Setup {
                        server: "nginx".to_owned(),
                        what: "temp dir permissions".to_owned(),
                        source,
                    },
                )?;
                let conf = dir.join("nginx.conf");
                write_file("nginx", &conf, &self.render(dir, addrs))?;
                let error_log = dir.join("error.log");
                let mut command = Command::new(&program);
                command
                    .arg("-p")
                    .arg(dir)
                    .arg("-c")
                    .arg(&conf)
                    // Errors before the config is read go here, not /var/log/nginx.
                    .arg("-e")
                    .arg(&error_log);
                Ok(command)
            },
        )
        .await?;
        Ok(Nginx {
            process,
            addrs,
            conf: dir.path().join("nginx.conf"),
            error_log: dir.path().join("error.log"),
            program,
            builder: self,
            dir,
        })
    }

    fn render(&self, dir: &Path, addrs: &[SocketAddr]) -> String {
        let d = dir.display();
        let mut conf = format!(
            "daemon off;\n\
             master_process on;\n\
             worker_processes {workers};\n\
             pid {d}/nginx.pid;\n\
             error_log {d}/error.log notice;\n\
             {main}\n\
             events {{ worker_connections {conns}; }}\n",
            workers = self.worker_processes,
            conns = self.worker_connections,
            main = self.main,
        );
        if let Some(http) = &self.http {
            conf.push_str(&format!(
                "http {{\n\
                 access_log {d}/access.log;\n\
                 client_body_temp_path {d}/client_body;\n\
                 proxy_temp_path {d}/proxy;\n\
                 fastcgi_temp_path {d}/fastcgi;\n\
                 uwsgi_temp_path {d}/uwsgi;\n\
                 scgi_temp_path {d}/scgi;\n\
                 {body}\n}}\n",
                body = http(addrs)
            ));
        }
        if let Some(stream) = &self.stream {
            conf.push_str(&format!("stream {{\n{}\n}}\n", stream(addrs)));
        }
        conf
    }
}

/// A running nginx; stopped (TERM, then KILL to its group) and reaped on drop.
pub struct Nginx {
    process: ServerProcess,
    addrs: Vec<SocketAddr>,
    conf: PathBuf,
    error_log: PathBuf,
    program: PathBuf,
    builder: NginxBuilder,
    // Last: the dir must outlive the process that writes into it.
    dir: tempfile::TempDir,
}

impl Nginx {
    pub fn builder() -> NginxBuilder {
        NginxBuilder {
            ports: 1,
            worker_processes: 1,
            worker_connections: 1024,
            main: String::new(),
            http: None,
            stream: None,
        }
    }

    /// The `i`th allocated listen address. Panics if `i` is out of range
    /// (a bug in the test, not an input).
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.addrs[i]
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The master's pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(&self.error_log).unwrap_or_default()
    }

    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    pub fn signal(&self, signal: Signal) -> Result<(), FixtureError> {
        self.process.signal(signal)
    }

    /// The pids of the master's current children (workers, cache helpers).
    pub fn worker_pids(&self) -> Vec<u32> {
        let pid = self.pid();
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// `nginx -s reload`: SIGHUP to the master, then waits until every old
    /// worker has exited and new ones run, so afterwards every request sees
    /// the config file as it is now (during a reload old and new workers both
    /// accept). `limit_req` zones and other shared state survive a reload.
    pub async fn reload(&mut self) -> Result<(), FixtureError> {
        self.process.check_running()?;
        let old = self.worker_pids();
        self.process.signal(Signal::Hup)?;
        let start = std::time::Instant::now();
        loop {
            self.process.check_running()?;
            let now = self.worker_pids();
            if !now.is_empty() && now.iter().all(|p| !old.contains(p)) {
                return Ok(());
            }
            if start.elapsed() >= START_DEADLINE {
                return Err(FixtureError::NotReady {
                    server: "nginx".to_owned(),
                    waited: START_DEADLINE,
                    what: format!("reload: old workers {old:?} still running, now {now:?}"),
                    logs: self.error_log(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Replaces the `http {}` body (same listen addresses), checks the new
    /// config with `nginx -t`, then reloads (see [`Nginx::reload`]). A config
    /// nginx rejects is an error carrying nginx's message, and the old config
    /// stays in force.
    pub async fn reload_http(&mut self, body: impl ConfigFn) -> Result<(), FixtureError> {
        self.builder.http = Some(Box::new(body));
        let previous = std::fs::read_to_string(&self.conf).unwrap_or_default();
        write_file(
            "nginx",
            &self.conf,
            &self.builder.render(self.dir.path(), &self.addrs),
        )?;
        let check = Command::new(&self.program)
            .arg("-t")
            .arg("-q")
            .arg("-p")
            .arg(self.dir.path())
            .arg("-c")
            .arg(&self.conf)
            .arg("-e")
            .arg(&self.error_log)
            .output()
            .map_err(|source| FixtureError::Spawn {
                server: "nginx".to_owned(),
                program: format!("{} -t", self.program.display()),
                source,
            })?;
        if !check.status.success() {
            write_file("nginx", &self.conf, &previous)?;
            return Err(FixtureError::NotReady {
                server: "nginx".to_owned(),
                waited: Duration::ZERO,
                what: "new config rejected by nginx -t".to_owned(),
                logs: String::from_utf8_lossy(&check.stderr).into_owned(),
            });
        }
        self.reload().await
    }
}

/// The body of an `http { }` block for a load balancer: a server on
/// `listen` passing every request to the upstream block `name` (the one
/// server `server`, `keepalive` idle connections kept) over HTTP/1.1
/// keep-alive, with `directives` (more lines for `location /`, may be
/// empty) and the client appended to X-Forwarded-For.
pub fn load_balancer_http(
    listen: SocketAddr,
    name: &str,
    server: SocketAddr,
    keepalive: u32,
    directives: &str,
) -> String {
    format!(
        "upstream {name} {{ server {server}; keepalive {keepalive}; }}\n\
         server {{\n\
             listen {listen};\n\
             location / {{\n\
                 proxy_pass http://{name};\n\
                 proxy_http_version 1.1;\n\
                 proxy_set_header Connection \"\";\n\
                 {directives}\n\
                 proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
             }}\n\
         }}"
    )
}
